//! `HunYuanDenseV1ForCausalLM`: Tencent's Hunyuan dense models (0.5B-7B Instruct), and
//! `HunYuanMoEV1ForCausalLM` (Hunyuan-A13B) with the same attention. Llama's layer
//! whose per-head q/k norms (`query_layernorm`, `key_layernorm`, read through the store's
//! aliases as `q_norm` / `k_norm`) come after RoPE rather than before
//! (`DecoderConfig::qk_norm_after_rope`), and RoPE's base raised by NTK-alpha
//! (`rope_scaling.alpha`: `base · alpha^(d / (d - 2))`) as its rotary embedding fixes it at load.
//! A13B's experts are a softmax mixture (`crate::moe`) whose router is `mlp.gate.wg` and whose
//! shared MLP is `mlp.shared_mlp`.

use crate::config::DecoderConfig;
use crate::weights::{Alias, Aliases};

pub fn adapt(cfg: DecoderConfig) -> DecoderConfig {
    cfg
}

/// Where a HunYuan checkpoint keeps the q/k norms, and A13B its router and shared MLP, that the
/// shared layer asks for.
pub fn aliases(cfg: &DecoderConfig) -> Aliases {
    let mut table = Aliases::new();
    let mut rename = |ours: String, source: String| table.insert(ours, Alias::renamed(source));
    for i in 0..cfg.num_hidden_layers {
        let p = format!("model.layers.{i}.self_attn");
        for (ours, theirs) in [("q_norm", "query_layernorm"), ("k_norm", "key_layernorm")] {
            rename(format!("{p}.{ours}.weight"), format!("{p}.{theirs}.weight"));
        }
        if cfg.moe.is_some() {
            let p = format!("model.layers.{i}.mlp");
            rename(format!("{p}.gate.weight"), format!("{p}.gate.wg.weight"));
            for proj in ["gate_proj", "up_proj", "down_proj"] {
                rename(format!("{p}.shared_experts.{proj}.weight"), format!("{p}.shared_mlp.{proj}.weight"));
            }
        }
    }
    table
}
