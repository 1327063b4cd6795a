//! `OlmoForCausalLM`: OLMo 1 (OLMo-1B, OLMo-7B, OLMo 1.7-7B). Llama's layer whose LayerNorms
//! have neither weight nor bias (`DecoderConfig::norms_weightless`; epsilon fixed at 1e-5), and
//! whose q, k and v are clamped to `±clip_qkv` as projected where the config gives a bound
//! (OLMo 1.7). llama.cpp's `olmo` files permute q and k as Llama's and carry the bound as
//! `attention.clamp_kqv`.

use crate::config::DecoderConfig;

/// OLMo 1 needs nothing beyond what its configuration reader sets.
pub fn adapt(cfg: DecoderConfig) -> DecoderConfig {
    cfg
}
