//! `HunYuanDenseV1ForCausalLM`: Tencent's Hunyuan dense models (0.5B-7B Instruct). Llama's layer
//! whose per-head q/k norms (`query_layernorm`, `key_layernorm`, read through the store's
//! aliases as `q_norm` / `k_norm`) come after RoPE rather than before
//! (`DecoderConfig::qk_norm_after_rope`), and RoPE's base raised by NTK-alpha
//! (`rope_scaling.alpha`: `base · alpha^(d / (d - 2))`) as its rotary embedding fixes it at load.

use crate::config::DecoderConfig;
use crate::weights::{Alias, Aliases};

pub fn adapt(cfg: DecoderConfig) -> DecoderConfig {
    cfg
}

/// Where a HunYuan checkpoint keeps the q/k norms the shared layer asks for.
pub fn aliases(cfg: &DecoderConfig) -> Aliases {
    let mut table = Aliases::new();
    for i in 0..cfg.num_hidden_layers {
        let p = format!("model.layers.{i}.self_attn");
        for (ours, theirs) in [("q_norm", "query_layernorm"), ("k_norm", "key_layernorm")] {
            let source = format!("{p}.{theirs}.weight");
            table.insert(format!("{p}.{ours}.weight"), Alias { source, rows: None });
        }
    }
    table
}
