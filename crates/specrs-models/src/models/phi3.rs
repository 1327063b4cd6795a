//! `Phi3ForCausalLM`: Phi-3 (mini, medium), Phi-3.5-mini, Phi-4 and Phi-4-mini. Llama's
//! layer with its projections stored fused (`qkv_proj`: q, k, v rows; `gate_up_proj`: gate,
//! up rows), LongRoPE on the 128k checkpoints, RoPE over the leading three quarters of each
//! head on Phi-4-mini (`partial_rotary_factor`), and a sliding window (2,047 keys on
//! Phi-3-mini-4k). GGUF checkpoints store the same fused tensors (`attn_qkv`, `ffn_up`) in
//! Hugging Face row order: llama.cpp runs Phi-3 with NeoX-style RoPE, so nothing is permuted.

use crate::config::DecoderConfig;

pub fn adapt(mut cfg: DecoderConfig) -> DecoderConfig {
    cfg.fused_projections = true;
    cfg
}
