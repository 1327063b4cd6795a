//! `GlmForCausalLM`: GLM-4-9B-Chat-HF, GLM-4-9B-HF, GLM-Edge. GLM-4-0414's layer (q/k/v
//! biases, a fused `gate_up_proj` with the gate rows first, RoPE over the first half of each
//! head turning interleaved pairs) with Llama's pre-norms (`input_layernorm`,
//! `post_attention_layernorm`). The rotated q/k rows are read reordered as GLM-4-0414's
//! ([`super::interleaved_rope_aliases`]).

use crate::config::DecoderConfig;
use crate::weights::Aliases;

/// GLM needs nothing beyond what its configuration reader sets.
pub fn adapt(cfg: DecoderConfig) -> DecoderConfig {
    cfg
}

/// The rotated rows of each q and k head (weights and biases), evens first, then odds.
pub fn aliases(cfg: &DecoderConfig) -> Aliases {
    super::interleaved_rope_aliases(cfg)
}
