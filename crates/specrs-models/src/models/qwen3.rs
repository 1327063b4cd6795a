//! `Qwen3ForCausalLM`: like Llama with an RMSNorm over each head of q and k before RoPE, and
//! an explicit `head_dim` that need not equal hidden / heads.

use crate::config::DecoderConfig;

pub fn adapt(mut cfg: DecoderConfig) -> DecoderConfig {
    cfg.qk_norm = true;
    cfg
}
