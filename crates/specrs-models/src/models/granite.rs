//! `GraniteForCausalLM`: IBM Granite 3.0-3.3. Llama's layer with four constants from the
//! config (`DecoderConfig::scales`): embeddings times `embedding_multiplier`, each residual
//! branch times `residual_multiplier` before it is added, scores scaled by
//! `attention_multiplier` instead of `head_dim^-0.5`, and logits divided by `logits_scaling`.
//! Granite's tool calls are read by the `granite` parser.

use crate::config::DecoderConfig;

/// Granite needs nothing beyond what its configuration reader sets.
pub fn adapt(cfg: DecoderConfig) -> DecoderConfig {
    cfg
}
