//! `Ernie4_5ForCausalLM`: Baidu's ERNIE 4.5 dense model (0.3B), and `Ernie4_5_MoeForCausalLM`
//! (21B-A3B, 300B-A47B). Llama's layer whose RoPE turns interleaved pairs `(2i, 2i + 1)` of the
//! whole head, read through the store's aliases with each q and k head's rows reordered to the
//! rotate-half pairs the shared RoPE turns (`super::interleaved_rope_aliases`, as Cohere's).
//! The MoE models route by softmax plus a correction bias kept in `mlp.moe_statics`
//! (`Router::BiasedSoftmax`) and add their shared experts (`mlp.shared_experts`) ungated.
//! Released checkpoints carry no biases (`use_bias: false`; a biased one is refused by key).

use crate::config::DecoderConfig;
use crate::weights::{Alias, Aliases};

/// ERNIE 4.5 needs nothing beyond what its configuration reader sets.
pub fn adapt(cfg: DecoderConfig) -> DecoderConfig {
    cfg
}

/// The interleaved-RoPE rows, and each sparse layer's correction bias read from `moe_statics`.
pub fn aliases(cfg: &DecoderConfig) -> Aliases {
    let mut table = super::interleaved_rope_aliases(cfg);
    let Some(moe) = &cfg.moe else { return table };
    for i in (0..cfg.num_hidden_layers).filter(|&i| moe.is_sparse_layer(i)) {
        let p = format!("model.layers.{i}.mlp");
        let source = format!("{p}.moe_statics.e_score_correction_bias");
        table.insert(format!("{p}.gate.e_score_correction_bias"), Alias::renamed(source));
    }
    table
}
