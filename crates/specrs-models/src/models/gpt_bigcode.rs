//! `GPTBigCodeForCausalLM`: StarCoder / StarCoderBase, SantaCoder, WizardCoder, OctoCoder.
//! GPT-2's block without its Conv1D: learned absolute positions (`wpe`) added to the token
//! embeddings and no RoPE (`DecoderConfig::learned_positions`); LayerNorms with bias before
//! attention (`ln_1`) and MLP (`ln_2`), one after the other; multi-query attention with q, k and
//! v fused in `attn.c_attn` (all queries, then the key head, then the value head), or without
//! `multi_query` a `[q, k, v]` group per head; biases everywhere; an MLP without a gate,
//! `c_proj(gelu_tanh(c_fc(x)))`. The configuration reader turns GPT-2's keys into the shared
//! ones; the store reads the shared layer's names from GPT-BigCode's ([`aliases`]).

use super::insert_grouped_qkv;
use crate::config::DecoderConfig;
use crate::weights::{Alias, Aliases};

/// GPT-BigCode needs nothing beyond what its configuration reader sets.
pub fn adapt(cfg: DecoderConfig) -> DecoderConfig {
    cfg
}

/// Where a GPT-BigCode checkpoint keeps each tensor the shared layer names: q, k and v as rows
/// of `c_attn` (weights and biases alike), the positions as `wpe`.
pub fn aliases(cfg: &DecoderConfig) -> Aliases {
    let shape = (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim);
    let mut table = Aliases::new();
    table.insert("model.embed_tokens.weight".into(), Alias::renamed("transformer.wte.weight"));
    table.insert("model.embed_positions.weight".into(), Alias::renamed("transformer.wpe.weight"));
    for p in ["weight", "bias"] {
        table.insert(format!("model.norm.{p}"), Alias::renamed(format!("transformer.ln_f.{p}")));
        for i in 0..cfg.num_hidden_layers {
            let (ours, theirs) = (format!("model.layers.{i}"), format!("transformer.h.{i}"));
            insert_grouped_qkv(&mut table, &ours, &format!("{theirs}.attn.c_attn"), p, shape);
            for (own, source) in [
                ("input_layernorm", "ln_1"),
                ("post_attention_layernorm", "ln_2"),
                ("self_attn.o_proj", "attn.c_proj"),
                ("mlp.up_proj", "mlp.c_fc"),
                ("mlp.down_proj", "mlp.c_proj"),
            ] {
                table.insert(format!("{ours}.{own}.{p}"), Alias::renamed(format!("{theirs}.{source}.{p}")));
            }
        }
    }
    table
}
