//! `MptForCausalLM`: MPT-7B / 30B (Base, Instruct, Chat, StoryWriter), Replit Code v1. No
//! position embeddings: every layer's attention adds ALiBi's distance bias to its scaled
//! scores, slopes of `alibi_bias_max` (`DecoderConfig::alibi`). Pre-norm layers of LayerNorms
//! without bias (`norm_1`, `norm_2`), q, k and v fused in `attn.Wqkv` (all q rows, then k,
//! then v) and clamped to `±clip_qkv` where the config says, no biases, an MLP without a gate,
//! `ffn.down_proj(gelu(ffn.up_proj(x)))` with the exact GELU; the output head is the embedding
//! ([`aliases`]).

use super::stacked_qkv_rows;
use crate::config::DecoderConfig;
use crate::weights::{Alias, Aliases};

/// MPT needs nothing beyond what its configuration reader sets.
pub fn adapt(cfg: DecoderConfig) -> DecoderConfig {
    cfg
}

/// Where an MPT checkpoint keeps each tensor the shared layer names: q, k and v as the first,
/// second and third `hidden` rows of `Wqkv`.
pub fn aliases(cfg: &DecoderConfig) -> Aliases {
    let h = cfg.hidden_size;
    let mut table = Aliases::new();
    table.insert("model.embed_tokens.weight".into(), Alias::renamed("transformer.wte.weight"));
    table.insert("model.norm.weight".into(), Alias::renamed("transformer.norm_f.weight"));
    for i in 0..cfg.num_hidden_layers {
        let (ours, theirs) = (format!("model.layers.{i}"), format!("transformer.blocks.{i}"));
        for (j, proj) in ["q_proj", "k_proj", "v_proj"].into_iter().enumerate() {
            table.insert(
                format!("{ours}.self_attn.{proj}.weight"),
                Alias::rows(format!("{theirs}.attn.Wqkv.weight"), stacked_qkv_rows(h, h, j)),
            );
        }
        for (own, source) in [
            ("input_layernorm", "norm_1"),
            ("post_attention_layernorm", "norm_2"),
            ("self_attn.o_proj", "attn.out_proj"),
            ("mlp.up_proj", "ffn.up_proj"),
            ("mlp.down_proj", "ffn.down_proj"),
        ] {
            table.insert(format!("{ours}.{own}.weight"), Alias::renamed(format!("{theirs}.{source}.weight")));
        }
    }
    table
}
