//! `FalconForCausalLM`: Falcon-7B, Falcon-40B/180B (`new_decoder_architecture`) and
//! Falcon2-11B. Attention and MLP side by side (`parallel_attn`; the new layout always), from
//! one LayerNorm with bias (`input_layernorm`) or each from its own (`ln_attn`, `ln_mlp`:
//! `DecoderConfig::parallel_mlp_norm`); q, k and v fused in `self_attention.query_key_value`
//! group by group, each KV group's query heads, then its key head, then its value head (the
//! multi-query 7B is one group; the first per-head layout is a group per head); NeoX RoPE over
//! every head dim; an MLP without a gate, `dense_4h_to_h(gelu(dense_h_to_4h(x)))` with the
//! exact GELU; biases where `bias` says. The configuration reader turns Falcon's keys into the
//! shared ones; the store reads the shared layer's names from Falcon's ([`aliases`]).

use crate::config::DecoderConfig;
use crate::weights::{Alias, Aliases};

/// Falcon needs nothing beyond what its configuration reader sets.
pub fn adapt(cfg: DecoderConfig) -> DecoderConfig {
    cfg
}

/// Rows of `query_key_value` that hold part `j` (0 q, 1 k, 2 v) for `heads` query heads in
/// `kv_heads` groups of head dim `d`: group `g` spans `(heads / kv_heads + 2) · d` rows, its
/// queries first.
fn fused_rows(heads: usize, kv_heads: usize, d: usize, j: usize) -> Vec<u32> {
    let per_group = heads / kv_heads;
    let group_rows = (per_group + 2) * d;
    let (offset, len) = match j {
        0 => (0, per_group * d),
        1 => (per_group * d, d),
        _ => ((per_group + 1) * d, d),
    };
    (0..kv_heads).flat_map(|g| (g * group_rows + offset) as u32..(g * group_rows + offset + len) as u32).collect()
}

/// Where a Falcon checkpoint keeps each tensor the shared layer names: q, k and v as rows of
/// the grouped `query_key_value` (weights and biases alike), the norms under Falcon's names.
pub fn aliases(cfg: &DecoderConfig) -> Aliases {
    let renamed = |source: String| Alias { source, rows: None };
    let (heads, kv_heads, d) = (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim);
    let (attention_norm, mlp_norm) = match (cfg.parallel_residual, cfg.parallel_mlp_norm) {
        (true, true) => ("ln_attn", "ln_mlp"),
        _ => ("input_layernorm", "post_attention_layernorm"),
    };
    let mut table = Aliases::new();
    table.insert("model.embed_tokens.weight".into(), renamed("transformer.word_embeddings.weight".into()));
    for p in ["weight", "bias"] {
        table.insert(format!("model.norm.{p}"), renamed(format!("transformer.ln_f.{p}")));
        for i in 0..cfg.num_hidden_layers {
            let (ours, theirs) = (format!("model.layers.{i}"), format!("transformer.h.{i}"));
            for (j, proj) in ["q_proj", "k_proj", "v_proj"].into_iter().enumerate() {
                table.insert(
                    format!("{ours}.self_attn.{proj}.{p}"),
                    Alias {
                        source: format!("{theirs}.self_attention.query_key_value.{p}"),
                        rows: Some(fused_rows(heads, kv_heads, d, j)),
                    },
                );
            }
            for (own, source) in [
                ("input_layernorm", attention_norm),
                ("post_attention_layernorm", mlp_norm),
                ("self_attn.o_proj", "self_attention.dense"),
                ("mlp.up_proj", "mlp.dense_h_to_4h"),
                ("mlp.down_proj", "mlp.dense_4h_to_h"),
            ] {
                table.insert(format!("{ours}.{own}.{p}"), renamed(format!("{theirs}.{source}.{p}")));
            }
        }
    }
    table
}

#[cfg(test)]
mod tests {
    use super::fused_rows;

    #[test]
    fn grouped_rows_take_each_groups_queries_then_its_key_then_its_value() {
        // 4 query heads in 2 groups of head dim 1: rows q0 q1 k0 v0 | q2 q3 k1 v1.
        assert_eq!(fused_rows(4, 2, 1, 0), [0, 1, 4, 5]);
        assert_eq!(fused_rows(4, 2, 1, 1), [2, 6]);
        assert_eq!(fused_rows(4, 2, 1, 2), [3, 7]);
        // Multi-query: all queries, then the one key, then the one value.
        assert_eq!(fused_rows(3, 1, 2, 1), [6, 7]);
        // A group per head is the per-head q, k, v layout.
        assert_eq!(fused_rows(2, 2, 1, 0), [0, 3]);
    }
}
