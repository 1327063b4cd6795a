//! `GPTNeoXForCausalLM`: Pythia, Dolly v2, RedPajama-INCITE, GPT-NeoX-20B. Attention and MLP
//! side by side (`use_parallel_residual`, on unless off), each reading its own LayerNorm with
//! bias of the residual (`DecoderConfig::parallel_mlp_norm`); q, k and v fused in
//! `attention.query_key_value` head by head (each head's q rows, then its k rows, then its v
//! rows); RoPE over the leading `rotary_pct` of each head at `rotary_emb_base`; biases on every
//! projection; an MLP without a gate, `dense_4h_to_h(gelu(dense_h_to_4h(x)))` with the exact
//! GELU. The store reads the shared layer's names from GPT-NeoX's ([`aliases`]).

use super::insert_grouped_qkv;
use crate::config::DecoderConfig;
use crate::weights::{Alias, Aliases};

/// GPT-NeoX needs nothing beyond what its configuration reader sets.
pub fn adapt(cfg: DecoderConfig) -> DecoderConfig {
    cfg
}

/// Where a GPT-NeoX checkpoint keeps each tensor the shared layer names: q, k and v as rows of
/// the per-head fused `query_key_value` (weights and biases alike).
pub fn aliases(cfg: &DecoderConfig) -> Aliases {
    // A [q, k, v] group per head.
    let shape = (cfg.num_attention_heads, cfg.num_attention_heads, cfg.head_dim);
    let mut table = Aliases::new();
    table.insert("model.embed_tokens.weight".into(), Alias::renamed("gpt_neox.embed_in.weight"));
    table.insert("lm_head.weight".into(), Alias::renamed("embed_out.weight"));
    for p in ["weight", "bias"] {
        table.insert(format!("model.norm.{p}"), Alias::renamed(format!("gpt_neox.final_layer_norm.{p}")));
        for i in 0..cfg.num_hidden_layers {
            let (ours, theirs) = (format!("model.layers.{i}"), format!("gpt_neox.layers.{i}"));
            insert_grouped_qkv(&mut table, &ours, &format!("{theirs}.attention.query_key_value"), p, shape);
            for (own, source) in [
                ("input_layernorm", "input_layernorm"),
                ("post_attention_layernorm", "post_attention_layernorm"),
                ("self_attn.o_proj", "attention.dense"),
                ("mlp.up_proj", "mlp.dense_h_to_4h"),
                ("mlp.down_proj", "mlp.dense_4h_to_h"),
            ] {
                table.insert(format!("{ours}.{own}.{p}"), Alias::renamed(format!("{theirs}.{source}.{p}")));
            }
        }
    }
    table
}
