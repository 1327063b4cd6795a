//! `LlamaForCausalLM`: Llama 2/3/3.1 (llama3 rope scaling), SmolLM2, TinyLlama, Mistral-style
//! checkpoints without sliding windows. The plain member of the family: no q/k/v bias (unless
//! `attention_bias`), no q/k norm. GGUF Llama checkpoints have their q/k rows un-permuted at
//! load (see `weights::gguf`), so they run the same rotate-half RoPE.

use crate::config::DecoderConfig;

/// Llama needs nothing beyond the shared configuration.
pub fn adapt(cfg: DecoderConfig) -> DecoderConfig {
    cfg
}
