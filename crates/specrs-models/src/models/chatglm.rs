//! `ChatGLMModel` / `ChatGLMForConditionalGeneration`: ChatGLM2-6B, ChatGLM3-6B (and their
//! 32k / 128k variants) and GLM-4-9B-Chat as THUDM released them. [`super::glm`]'s layer under
//! THUDM's names: `transformer.embedding.word_embeddings`, `transformer.encoder.layers.{i}`
//! with `self_attention.query_key_value` (all q rows, then the KV groups' k rows, then their v
//! rows, with biases), `self_attention.dense`, `mlp.dense_h_to_4h` (gate rows, then up),
//! `mlp.dense_4h_to_h`, `transformer.encoder.final_layernorm` and `transformer.output_layer`.
//! RoPE turns interleaved pairs over the first half of each head at 10,000 × `rope_ratio`; the
//! rotated q/k rows are read reordered evens first, then odds, as GLM-4's are.

use crate::config::DecoderConfig;
use crate::rope::half_rotation_rows;
use crate::weights::{Alias, Aliases};

/// ChatGLM needs nothing beyond what its configuration reader sets.
pub fn adapt(cfg: DecoderConfig) -> DecoderConfig {
    cfg
}

/// Where a ChatGLM checkpoint keeps each tensor the shared layer names: q, k and v as rows of
/// `query_key_value` (q's and k's rotated rows reordered for the shared RoPE), the gate and
/// up rows as the fused `gate_up_proj`.
pub fn aliases(cfg: &DecoderConfig) -> Aliases {
    let (d, r) = (cfg.head_dim, cfg.rotary_dim);
    let (q_dim, kv_dim) = (cfg.num_attention_heads * d, cfg.num_key_value_heads * d);
    let offset = |rows: Vec<u32>, by: usize| rows.into_iter().map(|x| x + by as u32).collect::<Vec<u32>>();
    let q_rows = half_rotation_rows(cfg.num_attention_heads, d, r);
    let k_rows = offset(half_rotation_rows(cfg.num_key_value_heads, d, r), q_dim);
    let v_rows: Vec<u32> = ((q_dim + kv_dim) as u32..(q_dim + 2 * kv_dim) as u32).collect();
    let mut table = Aliases::new();
    table.insert("model.embed_tokens.weight".into(), Alias::renamed("transformer.embedding.word_embeddings.weight"));
    table.insert("model.norm.weight".into(), Alias::renamed("transformer.encoder.final_layernorm.weight"));
    table.insert("lm_head.weight".into(), Alias::renamed("transformer.output_layer.weight"));
    for i in 0..cfg.num_hidden_layers {
        let (ours, theirs) = (format!("model.layers.{i}"), format!("transformer.encoder.layers.{i}"));
        for part in ["weight", "bias"] {
            for (proj, rows) in [("q_proj", &q_rows), ("k_proj", &k_rows), ("v_proj", &v_rows)] {
                table.insert(
                    format!("{ours}.self_attn.{proj}.{part}"),
                    Alias::rows(format!("{theirs}.self_attention.query_key_value.{part}"), rows.clone()),
                );
            }
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
