//! `Qwen2ForCausalLM` (and `MiMoForCausalLM`, whose decoder is Qwen2's): like Llama with a
//! bias on the q, k and v projections.

use crate::config::DecoderConfig;

pub fn adapt(mut cfg: DecoderConfig) -> DecoderConfig {
    cfg.attention_bias = true;
    cfg
}
