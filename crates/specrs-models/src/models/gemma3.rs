//! `Gemma3ForCausalLM`: Gemma 3's text decoder (1B, and the language model of the larger
//! checkpoints stored on their own). The shared layer with Gemma's changes, all configured by
//! `DecoderConfig::gemma`: every RMSNorm scales by `1 + weight`; a layer normalises its input,
//! its attention's output (`post_attention_layernorm`), the MLP's input
//! (`pre_feedforward_layernorm`) and the MLP's output (`post_feedforward_layernorm`); q and k are
//! normed per head; scores are scaled by `query_pre_attn_scalar^-0.5`; the MLP is GeGLU (tanh
//! GELU); embeddings are multiplied by `sqrt(hidden)`; and five of every six layers
//! (`layer_types`) attend within `sliding_window` keys with RoPE at `rope_local_base_freq`,
//! the others to the whole context with the global RoPE (`rope_theta`, `rope_scaling`).
//! Soft caps on scores and logits (Gemma 2's) apply when a config sets them. Per-layer windows
//! and RoPE mean one fixed-shape step cannot serve every layer, so Gemma 3 declares no
//! device-graph capture.
//!
//! The 4B, 12B and 27B checkpoints are `Gemma3ForConditionalGeneration`: the same decoder in
//! `text_config`, its weights under `language_model.model.*` (or `model.language_model.*` as
//! newer transformers saves them) beside a vision tower. spec-rs runs their text decoder and
//! leaves the vision weights unread (`crate::models::image_text`).
//!
//! GGUF `gemma3` files (llama.cpp's) name the norms `post_attention_norm`, `ffn_norm` and
//! `post_ffw_norm`, store each norm's scale (`1 + weight`) rather than its weight, and leave
//! the layer pattern (five sliding to one global), the local RoPE base (10,000) and the score
//! scale (`head_dim^-0.5`, `hidden / heads` for the 27B) to the reader, as llama.cpp does.

use crate::config::DecoderConfig;

/// Gemma 3 needs nothing beyond what its configuration reader sets.
pub fn adapt(cfg: DecoderConfig) -> DecoderConfig {
    cfg
}
