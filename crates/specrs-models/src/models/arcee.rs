//! `ArceeForCausalLM`: Arcee's AFM-4.5B. Llama's layer whose MLP has no gate: `up_proj`, then
//! `relu(·)²` (`hidden_act: relu2`), then `down_proj` (`Mlp::load_ungated`); YaRN as Llama's
//! configs give it.

use crate::config::DecoderConfig;

/// Arcee needs nothing beyond what its configuration reader sets.
pub fn adapt(cfg: DecoderConfig) -> DecoderConfig {
    cfg
}
