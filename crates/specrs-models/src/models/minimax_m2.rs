//! `MiniMaxM2ForCausalLM`: MiniMax-M2, M2.1 and M2.5. Llama's pre-norm layer with GQA
//! attention whose q and k are normed across all heads at once (`q_norm [heads · head_dim]`,
//! `k_norm [kv_heads · head_dim]`, OLMo 2's norms) and RoPE over the first `rotary_dim` dims
//! of each head; in every layer experts under Mixtral's names (`block_sparse_moe.gate`,
//! `experts.{e}.w1/w3/w2`), chosen by sigmoid score plus `block_sparse_moe.
//! e_score_correction_bias` and weighted by their renormalised scores: DeepSeek-V3's router in
//! one group (`Router::GroupedSigmoid`). The checkpoints' MTP modules are not read.

use crate::config::DecoderConfig;
use crate::models::mixtral;
use crate::weights::{Alias, Aliases};

pub fn adapt(cfg: DecoderConfig) -> DecoderConfig {
    cfg
}

/// Mixtral's names for the router and experts, and the correction bias beside the router.
pub fn aliases(cfg: &DecoderConfig) -> Aliases {
    let mut table = mixtral::aliases(cfg);
    for i in 0..cfg.num_hidden_layers {
        table.insert(
            format!("model.layers.{i}.mlp.gate.e_score_correction_bias"),
            Alias::renamed(format!("model.layers.{i}.block_sparse_moe.e_score_correction_bias")),
        );
    }
    table
}
