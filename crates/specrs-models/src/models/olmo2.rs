//! `Olmo2ForCausalLM`: AI2's OLMo 2 (1B-32B). Llama's layer with its norms moved after the
//! attention and the MLP (`NormPlacement::Post`: `post_attention_layernorm` over the
//! attention's output, `post_feedforward_layernorm` over the MLP's, nothing before either) and
//! q and k normed across all heads at once, before they are split into heads
//! (`DecoderConfig::qk_norm_spans_heads`: `q_norm [heads · head_dim]`).
//!
//! `Olmo3ForCausalLM` (OLMo 3) is the same layer with three sliding-window layers to each full
//! one (`layer_types`, `sliding_window`), the sliding layers turning with the unscaled RoPE
//! when the full ones' is scaled (`DecoderConfig::sliding_rope_theta`).
//!
//! `OlmoeForCausalLM` (OLMoE) keeps Llama's norm placement and OLMo's whole-width q/k norms,
//! with softmax-routed experts in every layer (`crate::moe`).
//!
//! `Exaone4ForCausalLM` (EXAONE 4.0) is OLMo 2's norm placement with per-head q/k norms; with
//! a window, three sliding layers to each full one, the full ones attending without RoPE
//! (`DecoderConfig::rope_layers`).

use crate::config::DecoderConfig;

/// OLMo 2, OLMo 3, OLMoE and EXAONE 4.0 need nothing beyond what their configuration reader sets.
pub fn adapt(cfg: DecoderConfig) -> DecoderConfig {
    cfg
}
