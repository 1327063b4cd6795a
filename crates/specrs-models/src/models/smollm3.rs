//! `SmolLM3ForCausalLM`: Hugging Face's SmolLM3-3B. Llama's layer, with the layers
//! `no_rope_layers` marks 0 (every fourth by default, `no_rope_layer_interval`) attending
//! without RoPE (`DecoderConfig::rope_layers`): their queries and keys carry no positions, which
//! reach them through the causal mask and the layers below.

use crate::config::DecoderConfig;

/// SmolLM3 needs nothing beyond what its configuration reader sets.
pub fn adapt(cfg: DecoderConfig) -> DecoderConfig {
    cfg
}
