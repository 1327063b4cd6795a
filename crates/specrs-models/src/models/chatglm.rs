//! `ChatGLMModel` / `ChatGLMForConditionalGeneration`: ChatGLM2-6B, ChatGLM3-6B (and their
//! 32k / 128k variants) and GLM-4-9B-Chat as THUDM released them. [`super::glm`]'s layer under
//! THUDM's names: `transformer.embedding.word_embeddings`, `transformer.encoder.layers.{i}`
//! with `self_attention.query_key_value` (all q rows, then the KV groups' k rows, then their v
//! rows, with biases), `self_attention.dense`, `mlp.dense_h_to_4h` (gate rows, then up),
//! `mlp.dense_4h_to_h`, `transformer.encoder.final_layernorm` and `transformer.output_layer`.
//! RoPE turns interleaved pairs over the first half of each head at 10,000 × `rope_ratio`; the
//! rotated q/k rows are read reordered evens first, then odds, as GLM-4's are. llama.cpp's
//! `chatglm` GGUF keeps the same fused rows as `attn_qkv` ([`gguf_aliases`]).

use super::stacked_qkv_rows;
use crate::config::DecoderConfig;
use crate::rope::half_rotation_rows;
use crate::weights::{Alias, Aliases};

/// ChatGLM needs nothing beyond what its configuration reader sets.
pub fn adapt(cfg: DecoderConfig) -> DecoderConfig {
    cfg
}

/// The rows of a fused `[q, k, v]` projection in the order the shared layer reads them: q's
/// and k's rotated rows of every head evens first, then odds; v's as they are.
fn reordered_qkv_rows(cfg: &DecoderConfig) -> Vec<u32> {
    let (d, r) = (cfg.head_dim, cfg.rotary_dim);
    let (q_dim, kv_dim) = (cfg.num_attention_heads * d, cfg.num_key_value_heads * d);
    let k_rows = half_rotation_rows(cfg.num_key_value_heads, d, r).into_iter().map(|x| x + q_dim as u32);
    half_rotation_rows(cfg.num_attention_heads, d, r)
        .into_iter()
        .chain(k_rows)
        .chain(stacked_qkv_rows(q_dim, kv_dim, 2))
        .collect()
}

/// Where a ChatGLM checkpoint keeps each tensor the shared layer names: the fused
/// `qkv_proj` as `query_key_value`'s reordered rows ([`reordered_qkv_rows`]), the gate and up
/// rows as the fused `gate_up_proj`.
pub fn aliases(cfg: &DecoderConfig) -> Aliases {
    let rows = reordered_qkv_rows(cfg);
    let mut table = Aliases::new();
    table.insert("model.embed_tokens.weight".into(), Alias::renamed("transformer.embedding.word_embeddings.weight"));
    table.insert("model.norm.weight".into(), Alias::renamed("transformer.encoder.final_layernorm.weight"));
    table.insert("lm_head.weight".into(), Alias::renamed("transformer.output_layer.weight"));
    for i in 0..cfg.num_hidden_layers {
        let (ours, theirs) = (format!("model.layers.{i}"), format!("transformer.encoder.layers.{i}"));
        for part in ["weight", "bias"] {
            table.insert(
                format!("{ours}.self_attn.qkv_proj.{part}"),
                Alias::rows(format!("{theirs}.self_attention.query_key_value.{part}"), rows.clone()),
            );
        }
        for (own, source) in [
            ("input_layernorm", "input_layernorm"),
            ("post_attention_layernorm", "post_attention_layernorm"),
            ("self_attn.o_proj", "self_attention.dense"),
            ("mlp.gate_up_proj", "mlp.dense_h_to_4h"),
            ("mlp.down_proj", "mlp.dense_4h_to_h"),
        ] {
            table.insert(format!("{ours}.{own}.weight"), Alias::renamed(format!("{theirs}.{source}.weight")));
        }
    }
    table
}

/// llama.cpp's `chatglm` files: each layer's `attn_qkv` (weight and bias) read through its
/// own reordered rows.
pub fn gguf_aliases(cfg: &DecoderConfig) -> Aliases {
    let rows = reordered_qkv_rows(cfg);
    let mut table = Aliases::new();
    for i in 0..cfg.num_hidden_layers {
        for part in ["weight", "bias"] {
            let name = format!("model.layers.{i}.self_attn.qkv_proj.{part}");
            table.insert(name.clone(), Alias::rows(name, rows.clone()));
        }
    }
    table
}
