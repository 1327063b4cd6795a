//! `DeepseekV3ForCausalLM`: DeepSeek-V3 / R1 and the models built on its layer (Kimi K2,
//! Moonlight); `DeepseekV2ForCausalLM`: DeepSeek-V2 / V2.5 / V2-Lite. Multi-head latent
//! attention, then dense MLPs in the first `first_k_dense_replace` layers and routed experts
//! after them with a shared expert (`crate::moe`): V3's sigmoid scores with a correction bias
//! steering a group-limited top-k, as GLM-4.5's; V2's softmax top-k within the best groups.
//!
//! Latent attention (`LatentProjection`) compresses each token to a `kv_lora_rank` latent plus
//! one `qk_rope_head_dim` key part shared by every head; `kv_b_proj` expands the normed latent
//! into each head's non-rotated key and its value. Queries come through the `q_lora_rank`
//! bottleneck (`q_a_proj`, `q_a_layernorm`, `q_b_proj`), or one `q_proj`. Here the heads are
//! expanded and attended as ordinary ones: a head is `[rope part, non-rotated part]` wide (the
//! leading dims the shared RoPE turns), its value padded with zeros to that width so every
//! attention path and the paged cache serve it unchanged, and only the value's dims reach
//! `o_proj`. (Caching the latent instead, as vLLM's absorbed kernels do, would store
//! `kv_lora_rank + qk_rope_head_dim` numbers per token rather than `2 · heads · head_dim`.)
//!
//! The store reads the checkpoint through [`aliases`]: each query head's rows are reordered
//! rope part first, and the rope rows of queries and of the shared key from DeepSeek's
//! interleaved pairs to rotate-half pairs (`crate::rope::half_rotation_rows`). A score is a dot
//! product over a head's dims, so one reordering of q and k leaves it unchanged.

use candle_core::{Result, Tensor};

use crate::config::{DecoderConfig, MlaConfig};
use crate::error::Result as LoadResult;
use crate::linear::Linear;
use crate::norm::RmsNorm;
use crate::rope::half_rotation_rows;
use crate::weights::{Alias, Aliases, WeightStore};

/// DeepSeek-V2 and V3 need nothing beyond what their configuration reader sets.
pub fn adapt(cfg: DecoderConfig) -> DecoderConfig {
    cfg
}

/// Rows `offset..offset + rope` as the shared RoPE wants them: rotate-half pairs, from
/// interleaved ones when the checkpoint interleaves.
fn rope_rows(offset: usize, rope: usize, interleaved: bool) -> Vec<u32> {
    let rows: Vec<u32> = if interleaved { half_rotation_rows(1, rope, rope) } else { (0..rope as u32).collect() };
    rows.into_iter().map(|r| r + offset as u32).collect()
}

/// Each query head's rows reordered `[rope part, non-rotated part]`.
fn query_rows(heads: usize, m: &MlaConfig) -> Vec<u32> {
    let d = m.qk_nope_head_dim + m.qk_rope_head_dim;
    (0..heads)
        .flat_map(|h| {
            let base = h * d;
            let nope = (base..base + m.qk_nope_head_dim).map(|r| r as u32);
            rope_rows(base + m.qk_nope_head_dim, m.qk_rope_head_dim, m.rope_interleave).into_iter().chain(nope)
        })
        .collect()
}

/// Where a DeepSeek checkpoint keeps each tensor the latent attention asks for.
pub fn aliases(cfg: &DecoderConfig, layers: usize) -> Aliases {
    let mut table = Aliases::new();
    let Some(m) = cfg.mla else { return table };
    let q_rows = query_rows(cfg.num_attention_heads, &m);
    let kv_a_rows: Vec<u32> =
        (0..m.kv_lora_rank as u32).chain(rope_rows(m.kv_lora_rank, m.qk_rope_head_dim, m.rope_interleave)).collect();
    for i in 0..layers {
        let p = format!("model.layers.{i}.self_attn");
        let q = if m.q_lora_rank.is_some() { "q_b_proj" } else { "q_proj" };
        for (proj, rows) in [(q, &q_rows), ("kv_a_proj_with_mqa", &kv_a_rows)] {
            for part in ["weight", "bias"] {
                let name = format!("{p}.{proj}.{part}");
                table.insert(name.clone(), Alias { source: name, rows: Some(rows.clone()) });
            }
        }
    }
    table
}

/// How a latent attention projects its queries.
#[derive(Debug, Clone)]
enum QueryPath {
    /// `q_b_proj(q_a_layernorm(q_a_proj(x)))`.
    LowRank {
        q_a_proj: Linear,
        q_a_layernorm: RmsNorm,
        q_b_proj: Linear,
    },
    Direct(Linear),
}

/// The query, key and value projections of multi-head latent attention, expanded per head.
#[derive(Debug, Clone)]
pub struct LatentProjection {
    query: QueryPath,
    kv_a_proj_with_mqa: Linear,
    kv_a_layernorm: RmsNorm,
    kv_b_proj: Linear,
    num_heads: usize,
    dims: MlaConfig,
}

impl LatentProjection {
    /// Loads `{prefix}.*` over inputs `in_dim` wide.
    pub fn load(
        store: &WeightStore,
        prefix: &str,
        cfg: &DecoderConfig,
        m: MlaConfig,
        in_dim: usize,
    ) -> LoadResult<Self> {
        let (nh, eps, bias) = (cfg.num_attention_heads, cfg.rms_norm_eps, cfg.attention_bias);
        let head = m.qk_nope_head_dim + m.qk_rope_head_dim;
        let query = match m.q_lora_rank {
            Some(rank) => QueryPath::LowRank {
                q_a_proj: store.linear(&format!("{prefix}.q_a_proj"), rank, in_dim, bias)?,
                q_a_layernorm: RmsNorm::load(store, &format!("{prefix}.q_a_layernorm.weight"), rank, eps)?,
                q_b_proj: store.linear(&format!("{prefix}.q_b_proj"), nh * head, rank, false)?,
            },
            None => QueryPath::Direct(store.linear(&format!("{prefix}.q_proj"), nh * head, in_dim, bias)?),
        };
        let latent = m.kv_lora_rank;
        Ok(Self {
            query,
            kv_a_proj_with_mqa: store.linear(
                &format!("{prefix}.kv_a_proj_with_mqa"),
                latent + m.qk_rope_head_dim,
                in_dim,
                bias,
            )?,
            kv_a_layernorm: RmsNorm::load(store, &format!("{prefix}.kv_a_layernorm.weight"), latent, eps)?,
            kv_b_proj: store.linear(
                &format!("{prefix}.kv_b_proj"),
                nh * (m.qk_nope_head_dim + m.v_head_dim),
                latent,
                false,
            )?,
            num_heads: nh,
            dims: m,
        })
    }

    pub fn size_in_bytes(&self) -> usize {
        let query = match &self.query {
            QueryPath::LowRank { q_a_proj, q_b_proj, .. } => {
                q_a_proj.weight().size_in_bytes() + q_b_proj.weight().size_in_bytes()
            }
            QueryPath::Direct(q) => q.weight().size_in_bytes(),
        };
        query + self.kv_a_proj_with_mqa.weight().size_in_bytes() + self.kv_b_proj.weight().size_in_bytes()
    }

    /// `x [T, in] -> (q [T, nh, d], k [T, nh, d], v [T, nh, d])`, before RoPE: heads laid out
    /// `[rope part, non-rotated part]`, each value zero-padded from `v_head_dim` to `d`.
    pub fn project(&self, x: &Tensor) -> Result<(Tensor, Tensor, Tensor)> {
        let t = x.dim(0)?;
        let MlaConfig { kv_lora_rank, qk_nope_head_dim: nope, qk_rope_head_dim: rope, v_head_dim, .. } = self.dims;
        let (nh, d) = (self.num_heads, nope + rope);
        let q = match &self.query {
            QueryPath::LowRank { q_a_proj, q_a_layernorm, q_b_proj } => {
                q_b_proj.forward(&q_a_layernorm.forward(&q_a_proj.forward(x)?)?)?
            }
            QueryPath::Direct(q_proj) => q_proj.forward(x)?,
        };
        let q = q.reshape((t, nh, d))?;
        // [T, latent + rope]: the compressed latent, then the key's shared rope part.
        let compressed = self.kv_a_proj_with_mqa.forward(x)?;
        let latent = self.kv_a_layernorm.forward(&compressed.narrow(1, 0, kv_lora_rank)?)?;
        let k_rope = compressed.narrow(1, kv_lora_rank, rope)?.unsqueeze(1)?.broadcast_as((t, nh, rope))?;
        // [T, nh, nope + v]: each head's non-rotated key, then its value.
        let kv = self.kv_b_proj.forward(&latent)?.reshape((t, nh, nope + v_head_dim))?;
        let k = Tensor::cat(&[&k_rope, &kv.narrow(2, 0, nope)?], 2)?;
        let v = kv.narrow(2, nope, v_head_dim)?.pad_with_zeros(2, 0, d - v_head_dim)?;
        Ok((q, k, v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_heads_lead_with_their_rope_rows_in_rotate_half_order() {
        let m = MlaConfig {
            q_lora_rank: None,
            kv_lora_rank: 3,
            qk_nope_head_dim: 2,
            qk_rope_head_dim: 4,
            v_head_dim: 2,
            rope_interleave: true,
        };
        // Head 0 rows: nope 0, 1; rope 2..6 interleaved -> 2, 4, 3, 5. Head 1 is shifted by 6.
        assert_eq!(query_rows(2, &m), [2, 4, 3, 5, 0, 1, 8, 10, 9, 11, 6, 7]);
        assert_eq!(query_rows(1, &MlaConfig { rope_interleave: false, ..m }), [2, 3, 4, 5, 0, 1]);
    }
}
