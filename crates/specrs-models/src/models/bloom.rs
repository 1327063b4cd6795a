//! `BloomForCausalLM`: BLOOM (560m to 176B), BLOOMZ. No position embeddings: every layer's
//! attention adds ALiBi's distance bias to its scaled scores (`DecoderConfig::alibi`). The
//! embeddings pass a LayerNorm (`word_embeddings_layernorm`, `DecoderConfig::embedding_norm`)
//! before the first layer; each layer is pre-norm with LayerNorms with bias, q, k and v fused
//! in `self_attention.query_key_value` head by head (each head's q rows, then its k rows, then
//! its v rows), biases on every projection, and an MLP without a gate,
//! `dense_4h_to_h(gelu_tanh(dense_h_to_4h(x)))`; the output head is the embedding. Names sit
//! under `transformer.` or, as BigScience saved the base model, without it ([`aliases`]).

use super::insert_grouped_qkv;
use crate::config::DecoderConfig;
use crate::weights::{Alias, Aliases, WeightStore};

/// BLOOM needs nothing beyond what its configuration reader sets.
pub fn adapt(cfg: DecoderConfig) -> DecoderConfig {
    cfg
}

/// Where a BLOOM checkpoint keeps each tensor the shared layer names: q, k and v as rows of
/// the per-head fused `query_key_value` (weights and biases alike).
pub fn aliases(store: &WeightStore, cfg: &DecoderConfig) -> Aliases {
    let root = if store.contains("word_embeddings.weight") { "" } else { "transformer." };
    // A [q, k, v] group per head.
    let shape = (cfg.num_attention_heads, cfg.num_attention_heads, cfg.head_dim);
    let mut table = Aliases::new();
    table.insert("model.embed_tokens.weight".into(), Alias::renamed(format!("{root}word_embeddings.weight")));
    for p in ["weight", "bias"] {
        table.insert(format!("model.embed_norm.{p}"), Alias::renamed(format!("{root}word_embeddings_layernorm.{p}")));
        table.insert(format!("model.norm.{p}"), Alias::renamed(format!("{root}ln_f.{p}")));
        for i in 0..cfg.num_hidden_layers {
            let (ours, theirs) = (format!("model.layers.{i}"), format!("{root}h.{i}"));
            insert_grouped_qkv(&mut table, &ours, &format!("{theirs}.self_attention.query_key_value"), p, shape);
            for (own, source) in [
                ("input_layernorm", "input_layernorm"),
                ("post_attention_layernorm", "post_attention_layernorm"),
                ("self_attn.o_proj", "self_attention.dense"),
                ("mlp.up_proj", "mlp.dense_h_to_4h"),
                ("mlp.down_proj", "mlp.dense_4h_to_h"),
            ] {
                table.insert(format!("{ours}.{own}.{p}"), Alias::renamed(format!("{theirs}.{source}.{p}")));
            }
        }
    }
    table
}
