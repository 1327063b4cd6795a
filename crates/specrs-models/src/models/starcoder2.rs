//! `Starcoder2ForCausalLM`: StarCoder2 (3B, 7B, 15B). Mistral's layer with a bias on every
//! projection (`use_bias`), LayerNorms with bias (`norm_epsilon`), sliding-window attention,
//! and an MLP without a gate: `c_proj(gelu_tanh(c_fc(x)))`. The store reads the shared
//! layer's `up_proj` / `down_proj` from `c_fc` / `c_proj` ([`aliases`]).

use crate::config::DecoderConfig;
use crate::weights::{Alias, Aliases};

/// StarCoder2 needs nothing beyond what its configuration reader sets.
pub fn adapt(cfg: DecoderConfig) -> DecoderConfig {
    cfg
}

/// Where a StarCoder2 checkpoint keeps the MLP's projections under the shared layer's names.
pub fn aliases(cfg: &DecoderConfig) -> Aliases {
    let mut table = Aliases::new();
    for i in 0..cfg.num_hidden_layers {
        for (ours, theirs) in [("up_proj", "c_fc"), ("down_proj", "c_proj")] {
            for part in ["weight", "bias"] {
                table.insert(
                    format!("model.layers.{i}.mlp.{ours}.{part}"),
                    Alias::renamed(format!("model.layers.{i}.mlp.{theirs}.{part}")),
                );
            }
        }
    }
    table
}
