//! `Qwen3ForCausalLM`: like Llama with an RMSNorm over each head of q and k before RoPE, and
//! an explicit `head_dim` that need not equal hidden / heads. `Qwen3MoeForCausalLM`
//! (Qwen3-30B-A3B, Qwen3-235B-A22B) shares the attention and replaces the MLP by sparse
//! experts (`crate::moe`, configured by `DecoderConfig::moe`). dots.llm1 (`Dots1ForCausalLM`)
//! shares the attention too, its experts DeepSeek-V3's (leading dense layers, sigmoid routing
//! with a correction bias, shared experts).

use crate::config::DecoderConfig;

pub fn adapt(mut cfg: DecoderConfig) -> DecoderConfig {
    cfg.qk_norm = true;
    cfg
}
