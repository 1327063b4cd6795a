//! `Ernie4_5ForCausalLM`: Baidu's ERNIE 4.5 dense model (0.3B). Llama's layer whose RoPE turns
//! interleaved pairs `(2i, 2i + 1)` of the whole head, read through the store's aliases with
//! each q and k head's rows reordered to the rotate-half pairs the shared RoPE turns
//! (`super::interleaved_rope_aliases`, as Cohere's). Released checkpoints carry no biases
//! (`use_bias: false`; a biased one is refused by key).

use crate::config::DecoderConfig;

/// ERNIE 4.5 needs nothing beyond what its configuration reader sets.
pub fn adapt(cfg: DecoderConfig) -> DecoderConfig {
    cfg
}
