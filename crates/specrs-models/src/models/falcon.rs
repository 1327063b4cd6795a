//! `FalconForCausalLM`: Falcon-7B, Falcon-40B/180B (`new_decoder_architecture`) and
//! Falcon2-11B. Attention and MLP side by side (`parallel_attn`; the new layout always), from
//! one LayerNorm with bias (`input_layernorm`) or each from its own (`ln_attn`, `ln_mlp`:
//! `DecoderConfig::parallel_mlp_norm`); q, k and v fused in `self_attention.query_key_value`
//! group by group, each KV group's query heads, then its key head, then its value head (the
//! multi-query 7B is one group; the first per-head layout is a group per head); NeoX RoPE over
//! every head dim; an MLP without a gate, `dense_4h_to_h(gelu(dense_h_to_4h(x)))` with the
//! exact GELU; biases where `bias` says. The configuration reader turns Falcon's keys into the
//! shared ones; the store reads the shared layer's names from Falcon's ([`aliases`]).

use super::insert_grouped_qkv;
use crate::config::DecoderConfig;
use crate::weights::{Alias, Aliases};

/// Falcon needs nothing beyond what its configuration reader sets.
pub fn adapt(cfg: DecoderConfig) -> DecoderConfig {
    cfg
}

/// Where a Falcon checkpoint keeps each tensor the shared layer names: q, k and v as rows of
/// the grouped `query_key_value` (weights and biases alike), the norms under Falcon's names.
pub fn aliases(cfg: &DecoderConfig) -> Aliases {
    let shape = (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim);
    let (attention_norm, mlp_norm) = match (cfg.parallel_residual, cfg.parallel_mlp_norm) {
        (true, true) => ("ln_attn", "ln_mlp"),
        _ => ("input_layernorm", "post_attention_layernorm"),
    };
    let mut table = Aliases::new();
    table.insert("model.embed_tokens.weight".into(), Alias::renamed("transformer.word_embeddings.weight"));
    for p in ["weight", "bias"] {
        table.insert(format!("model.norm.{p}"), Alias::renamed(format!("transformer.ln_f.{p}")));
        for i in 0..cfg.num_hidden_layers {
            let (ours, theirs) = (format!("model.layers.{i}"), format!("transformer.h.{i}"));
            insert_grouped_qkv(&mut table, &ours, &format!("{theirs}.self_attention.query_key_value"), p, shape);
            for (own, source) in [
                ("input_layernorm", attention_norm),
                ("post_attention_layernorm", mlp_norm),
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
