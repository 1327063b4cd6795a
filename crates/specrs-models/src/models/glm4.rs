//! `Glm4ForCausalLM`: GLM-4-0414 (GLM-4-9B/32B-0414, GLM-Z1). Llama's layer with q/k/v biases,
//! a fused `gate_up_proj` (gate rows first), RMSNorms around attention and MLP as Gemma places
//! them (`NormPlacement::Sandwich`, plain weights), and RoPE over the first half of each
//! head (`partial_rotary_factor` 0.5) turning interleaved pairs `(2i, 2i + 1)` by frequency
//! `i`, as GLM has always rotated.
//!
//! The store reads the checkpoint through [`aliases`]: GLM's norm names become Gemma's
//! (`post_self_attn_layernorm` over the attention's output, `post_attention_layernorm` before
//! the MLP, `post_mlp_layernorm` after it), and the rotated rows of each q and k head (weights
//! and biases) are reordered evens first, then odds. Scores are dot products over a head's
//! dims, so one reordering of q and k leaves them unchanged, and it turns GLM's interleaved
//! pairs into the rotate-half pairs `(i, i + r/2)` the shared RoPE turns. GGUF files (`glm4`)
//! keep the same rows under llama.cpp's names; `GgufSource` reorders them the same way.

use crate::config::DecoderConfig;
use crate::weights::{Alias, Aliases};

pub fn adapt(cfg: DecoderConfig) -> DecoderConfig {
    cfg
}

/// Where a GLM-4-0414 checkpoint keeps each tensor the shared layer asks for: its rotated q/k
/// rows reordered (`super::interleaved_rope_aliases`) and its norms under Gemma's names.
pub fn aliases(cfg: &DecoderConfig) -> Aliases {
    let mut table = super::interleaved_rope_aliases(cfg);
    for i in 0..cfg.num_hidden_layers {
        let p = format!("model.layers.{i}");
        for (name, source) in [
            ("post_attention_layernorm", "post_self_attn_layernorm"),
            ("pre_feedforward_layernorm", "post_attention_layernorm"),
            ("post_feedforward_layernorm", "post_mlp_layernorm"),
        ] {
            table.insert(format!("{p}.{name}.weight"), Alias::renamed(format!("{p}.{source}.weight")));
        }
    }
    table
}
