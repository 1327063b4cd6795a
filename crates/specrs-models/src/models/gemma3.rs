//! `Gemma3ForCausalLM`: Gemma 3's text decoder (1B, and the language model of the larger
//! checkpoints stored on their own). The shared layer with Gemma's changes, all configured by
//! `DecoderConfig::gemma`: every RMSNorm scales by `1 + weight`; a layer normalises its input,
//! its attention's output (`post_attention_layernorm`), the MLP's input
//! (`pre_feedforward_layernorm`) and the MLP's output (`post_feedforward_layernorm`); q and k are
//! normed per head; scores are scaled by `query_pre_attn_scalar^-0.5`; the MLP is GeGLU (tanh
//! GELU); embeddings are multiplied by `sqrt(hidden)`; and five of every six layers
//! (`layer_types`) attend within `sliding_window` keys with RoPE at `rope_local_base_freq`,
//! the others to the whole context with the global RoPE (`rope_theta`, `rope_scaling`).
//! Gemma 2's logit soft-capping is refused by key. Per-layer windows and RoPE mean one
//! fixed-shape step cannot serve every layer, so Gemma 3 declares no device-graph capture.

use crate::config::DecoderConfig;

/// Gemma 3 needs nothing beyond what its configuration reader sets.
pub fn adapt(cfg: DecoderConfig) -> DecoderConfig {
    cfg
}
