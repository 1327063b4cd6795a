//! `GemmaForCausalLM`: Gemma (2B, 7B), Gemma 1.1, CodeGemma. Llama's pre-norm layer with
//! Gemma's own parts, configured by `DecoderConfig::gemma` and `DecoderConfig::scales`: norms
//! scale by `1 + weight`, the MLP is GeGLU (tanh GELU, whatever `hidden_act` the first configs
//! name, as transformers runs it), embeddings are multiplied by `sqrt(hidden)` in the
//! activations' dtype, and the head is tied. Gemma 2's sandwich norms, windows and soft caps
//! are not Gemma's. GGUF `gemma` files store the norms as their scale and q/k rows as they are.

use crate::config::DecoderConfig;

/// Gemma needs nothing beyond what its configuration reader sets.
pub fn adapt(cfg: DecoderConfig) -> DecoderConfig {
    cfg
}
