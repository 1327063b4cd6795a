//! `BaichuanForCausalLM` / `BaiChuanForCausalLM`: Baichuan-7B and -13B, Baichuan 2 7B / 13B
//! (Base and Chat). Llama's layer with q, k and v stacked in `self_attn.W_pack` (all q rows,
//! then k, then v; [`aliases`]). The 7B models turn RoPE; the 13B ones add ALiBi in its place
//! (`DecoderConfig::alibi`, BLOOM's slopes). Baichuan 2's `lm_head` is a `NormHead`, each row
//! divided by its L2 norm (`DecoderConfig::lm_head_normalized`).

use super::stacked_qkv_rows;
use crate::config::DecoderConfig;
use crate::weights::{Alias, Aliases};

/// Baichuan needs nothing beyond what its configuration reader sets.
pub fn adapt(cfg: DecoderConfig) -> DecoderConfig {
    cfg
}

/// Where a Baichuan checkpoint keeps each tensor the shared layer names: q, k and v as the
/// first, second and third `hidden` rows of `W_pack`; the rest under Llama's names.
pub fn aliases(cfg: &DecoderConfig) -> Aliases {
    let h = cfg.hidden_size;
    let mut table = Aliases::new();
    for i in 0..cfg.num_hidden_layers {
        let ours = format!("model.layers.{i}.self_attn");
        for (j, proj) in ["q_proj", "k_proj", "v_proj"].into_iter().enumerate() {
            table.insert(
                format!("{ours}.{proj}.weight"),
                Alias::rows(format!("{ours}.W_pack.weight"), stacked_qkv_rows(h, h, j)),
            );
        }
    }
    table
}
