//! `MixtralForCausalLM`: Mixtral 8x7B and 8x22B. Llama's attention (with Mistral's sliding
//! window where the config names one), and in every layer experts in place of the MLP:
//! `block_sparse_moe.gate` routes each token to the top-2 of a softmax over the 8 experts,
//! renormalised, and each expert is a SwiGLU MLP with Mixtral's names (`w1` gate, `w3` up, `w2`
//! down), read through the store's aliases ([`aliases`]). GGUF files keep Mixtral as `llama`
//! with stacked experts, which the GGUF reader recognises by `llama.expert_count`.

use crate::config::DecoderConfig;
use crate::weights::{Alias, Aliases};

pub fn adapt(cfg: DecoderConfig) -> DecoderConfig {
    cfg
}

/// Where a Mixtral checkpoint keeps the router and experts the shared layer asks for.
pub fn aliases(cfg: &DecoderConfig) -> Aliases {
    let experts = cfg.moe.as_ref().map_or(0, |m| m.num_experts);
    let mut table = Aliases::new();
    for i in 0..cfg.num_hidden_layers {
        let (hf, own) = (format!("model.layers.{i}.mlp"), format!("model.layers.{i}.block_sparse_moe"));
        table.insert(format!("{hf}.gate.weight"), Alias::renamed(format!("{own}.gate.weight")));
        for e in 0..experts {
            for (proj, w) in [("gate_proj", "w1"), ("up_proj", "w3"), ("down_proj", "w2")] {
                table.insert(
                    format!("{hf}.experts.{e}.{proj}.weight"),
                    Alias::renamed(format!("{own}.experts.{e}.{w}.weight")),
                );
            }
        }
    }
    table
}
