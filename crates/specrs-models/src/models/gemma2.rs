//! `Gemma2ForCausalLM`: Gemma 2 (2B, 9B, 27B). Gemma 3's layer (`crate::models::gemma3`)
//! without q/k norms, configured by `DecoderConfig::gemma` and `DecoderConfig::scales`: norms
//! scale by `1 + weight` around attention and MLP, the MLP is GeGLU (tanh GELU), embeddings
//! are multiplied by `sqrt(hidden)`, scores scaled by `query_pre_attn_scalar^-0.5`; sliding
//! (`sliding_window`) and full attention alternate, sliding first, under one RoPE; and scores
//! and logits are soft-capped, `cap · tanh(x / cap)` with `attn_logit_softcapping` (50) before
//! the mask and `final_logit_softcapping` (30) on the logits. As with Gemma 3, per-layer
//! windows mean no device-graph capture.
//!
//! GGUF `gemma2` files (llama.cpp's) store the norms as their scale and the caps as
//! `gemma2.attn_logit_softcapping` / `gemma2.final_logit_softcapping`, and leave the layer
//! pattern and the score scale (`head_dim^-0.5`, `hidden / heads` for the 46-layer 27B) to the
//! reader, as llama.cpp does.

use crate::config::DecoderConfig;

/// Gemma 2 needs nothing beyond what its configuration reader sets.
pub fn adapt(cfg: DecoderConfig) -> DecoderConfig {
    cfg
}
