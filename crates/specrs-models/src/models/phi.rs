//! `PhiForCausalLM`: Phi-1, Phi-1.5 and Phi-2. Attention and MLP side by side from one
//! LayerNorm with bias (`NormPlacement::Parallel`); biases on q, k, v, the output projection
//! (`dense`), the MLP without a gate (`fc1`, tanh GELU, `fc2`) and `lm_head`; RoPE over the
//! leading `partial_rotary_factor` of each head; optional LayerNorms with bias over each q and
//! k head, one weight shared by the heads (`qk_layernorm`). The store reads the shared layer's
//! names from Phi's ([`aliases`]); llama.cpp's `phi2` files keep q and k rows as they are
//! (NeoX RoPE).

use crate::config::DecoderConfig;
use crate::weights::{Alias, Aliases};

/// Phi needs nothing beyond what its configuration reader sets.
pub fn adapt(cfg: DecoderConfig) -> DecoderConfig {
    cfg
}

/// Where a Phi checkpoint keeps each tensor the shared layer names.
pub fn aliases(cfg: &DecoderConfig) -> Aliases {
    let mut table = Aliases::new();
    for part in ["weight", "bias"] {
        table.insert(format!("model.norm.{part}"), Alias::renamed(format!("model.final_layernorm.{part}")));
        for i in 0..cfg.num_hidden_layers {
            let p = format!("model.layers.{i}");
            for (ours, theirs) in [
                ("self_attn.o_proj", "self_attn.dense"),
                ("self_attn.q_norm", "self_attn.q_layernorm"),
                ("self_attn.k_norm", "self_attn.k_layernorm"),
                ("mlp.up_proj", "mlp.fc1"),
                ("mlp.down_proj", "mlp.fc2"),
            ] {
                table.insert(format!("{p}.{ours}.{part}"), Alias::renamed(format!("{p}.{theirs}.{part}")));
            }
        }
    }
    table
}
