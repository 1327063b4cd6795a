//! `SeedOssForCausalLM`: ByteDance's Seed-OSS-36B. Llama's layer with a bias on q, k and v
//! (`attention_bias`, on by default) and one on `o_proj` only where `attention_out_bias` says;
//! long context from a large RoPE base. Its thinking-budget markers are ordinary tokens.

use crate::config::DecoderConfig;

/// Seed-OSS needs nothing beyond what its configuration reader sets.
pub fn adapt(cfg: DecoderConfig) -> DecoderConfig {
    cfg
}
