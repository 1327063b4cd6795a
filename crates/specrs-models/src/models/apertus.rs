//! `ApertusForCausalLM`: Swiss AI's Apertus (8B, 70B). Llama's layer (Llama 3's RoPE scaling)
//! with an RMSNorm over each head of q and k before RoPE (Qwen3's), its norms named
//! `attention_layernorm` and `feedforward_layernorm` (read through [`aliases`]), and an MLP
//! without a gate, `down(xielu(up(x)))`, whose xIELU has learned parameters in every layer
//! (`mlp.act_fn.alpha_p` / `alpha_n`, with `beta` and `eps`; `transformer::Xielu`).

use crate::config::DecoderConfig;
use crate::weights::{Alias, Aliases};

/// Apertus needs nothing beyond what its configuration reader sets.
pub fn adapt(cfg: DecoderConfig) -> DecoderConfig {
    cfg
}

/// Where an Apertus checkpoint keeps Llama's pre-norms.
pub fn aliases(cfg: &DecoderConfig) -> Aliases {
    let mut table = Aliases::new();
    for i in 0..cfg.num_hidden_layers {
        let layer = format!("model.layers.{i}");
        for (llama, apertus) in
            [("input_layernorm", "attention_layernorm"), ("post_attention_layernorm", "feedforward_layernorm")]
        {
            table.insert(format!("{layer}.{llama}.weight"), Alias::renamed(format!("{layer}.{apertus}.weight")));
        }
    }
    table
}
