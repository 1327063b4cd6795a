//! `Qwen2ForCausalLM` (and `MiMoForCausalLM`, whose decoder is Qwen2's): like Llama with a
//! bias on the q, k and v projections. `Qwen2MoeForCausalLM` (Qwen1.5-MoE, Qwen2-57B-A14B)
//! shares the attention and replaces the MLP by sparse experts plus a shared expert
//! (`crate::moe`, configured by `DecoderConfig::moe`).

use crate::config::DecoderConfig;

pub fn adapt(mut cfg: DecoderConfig) -> DecoderConfig {
    cfg.attention_bias = true;
    cfg
}
