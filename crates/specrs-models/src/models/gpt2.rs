//! `GPT2LMHeadModel`: GPT-2 (small, medium, large, XL) and DistilGPT2. GPT-BigCode's block
//! (learned absolute positions and no RoPE, LayerNorms with bias before attention and MLP,
//! biases everywhere, a tanh-GELU MLP without a gate) with a KV head per query head and every
//! projection a Conv1D, stored `[in, out]`: `attn.c_attn` (q, k and v side by side along its
//! columns), `attn.c_proj`, `mlp.c_fc`, `mlp.c_proj`. The store reads them transposed
//! ([`aliases`]), under `transformer.` or, as the first checkpoints saved them from the base
//! model, without it.

use super::stacked_qkv_rows;
use crate::config::DecoderConfig;
use crate::weights::{Alias, Aliases, WeightStore};

/// GPT-2 needs nothing beyond what its configuration reader sets.
pub fn adapt(cfg: DecoderConfig) -> DecoderConfig {
    cfg
}

/// Where a GPT-2 checkpoint keeps each tensor the shared layer names: the Conv1D weights
/// transposed, q, k and v as the first, second and third `hidden` rows of `c_attn`'s
/// transpose (its bias alike).
pub fn aliases(store: &WeightStore, cfg: &DecoderConfig) -> Aliases {
    let root = if store.contains("wte.weight") { "" } else { "transformer." };
    let h = cfg.hidden_size;
    let mut table = Aliases::new();
    table.insert("model.embed_tokens.weight".into(), Alias::renamed(format!("{root}wte.weight")));
    table.insert("model.embed_positions.weight".into(), Alias::renamed(format!("{root}wpe.weight")));
    for p in ["weight", "bias"] {
        table.insert(format!("model.norm.{p}"), Alias::renamed(format!("{root}ln_f.{p}")));
    }
    for i in 0..cfg.num_hidden_layers {
        let (ours, theirs) = (format!("model.layers.{i}"), format!("{root}h.{i}"));
        for (j, proj) in ["q_proj", "k_proj", "v_proj"].into_iter().enumerate() {
            let rows = stacked_qkv_rows(h, h, j);
            let source = format!("{theirs}.attn.c_attn");
            table.insert(
                format!("{ours}.self_attn.{proj}.weight"),
                Alias::transposed(format!("{source}.weight"), Some(rows.clone())),
            );
            table.insert(format!("{ours}.self_attn.{proj}.bias"), Alias::rows(format!("{source}.bias"), rows));
        }
        for (own, source) in
            [("self_attn.o_proj", "attn.c_proj"), ("mlp.up_proj", "mlp.c_fc"), ("mlp.down_proj", "mlp.c_proj")]
        {
            table.insert(format!("{ours}.{own}.weight"), Alias::transposed(format!("{theirs}.{source}.weight"), None));
            table.insert(format!("{ours}.{own}.bias"), Alias::renamed(format!("{theirs}.{source}.bias")));
        }
        for p in ["weight", "bias"] {
            table.insert(format!("{ours}.input_layernorm.{p}"), Alias::renamed(format!("{theirs}.ln_1.{p}")));
            table.insert(format!("{ours}.post_attention_layernorm.{p}"), Alias::renamed(format!("{theirs}.ln_2.{p}")));
        }
    }
    table
}
