//! `DeepseekV3ForCausalLM`: DeepSeek-V3 / R1 and the models built on its layer (Kimi K2, Moonlight,
//! GLM-4.7-Flash's `Glm4MoeLiteForCausalLM`); `DeepseekV2ForCausalLM`: DeepSeek-V2 / V2.5 /
//! V2-Lite. Multi-head latent attention, then dense MLPs in the first `first_k_dense_replace`
//! layers and routed experts after them with a shared expert (`crate::moe`): V3's sigmoid scores
//! with a correction bias steering a group-limited top-k, as GLM-4.5's; V2's softmax top-k within
//! the best groups.
//!
//! Latent attention (`LatentProjection`) compresses each token to a `kv_lora_rank` latent plus
//! one `qk_rope_head_dim` key part shared by every head; `kv_b_proj` expands the normed latent
//! into each head's non-rotated key and its value. Queries come through the `q_lora_rank`
//! bottleneck (`q_a_proj`, `q_a_layernorm`, `q_b_proj`), or one `q_proj`.
//!
//! The expansion is never run: it is absorbed, as vLLM's and SGLang's MLA kernels absorb it.
//! Each token caches one entry `[rope key, latent]` (`kv_lora_rank + qk_rope_head_dim`
//! numbers for every head, in one tensor that serves as keys and values,
//! `PagedKvCache::shared`); each query's non-rotated part is multiplied into latent space by
//! its head's key rows of `kv_b_proj`, so all heads attend the one entry as grouped-query
//! attention with a single KV head, and each head's attended latent goes through its value
//! rows before `o_proj`. Scores keep the expanded head's scale, `(nope + rope)^-0.5`.
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
                table.insert(name.clone(), Alias::rows(name, rows.clone()));
            }
        }
    }
    table
}

/// `kv_b_proj`'s key rows `[nh, nope, latent]` and value rows transposed `[nh, latent, v]`:
/// from the checkpoint's one `[nh · (nope + v), latent]` weight, or from llama.cpp's split
/// `k_b_proj [nh, latent, nope]` and `v_b_proj [nh, v, latent]`.
fn up_projections(store: &WeightStore, prefix: &str, nh: usize, m: &MlaConfig) -> LoadResult<(Tensor, Tensor)> {
    let (latent, nope, v) = (m.kv_lora_rank, m.qk_nope_head_dim, m.v_head_dim);
    let kv_b = format!("{prefix}.kv_b_proj.weight");
    if store.contains(&kv_b) || !store.contains(&format!("{prefix}.k_b_proj.weight")) {
        // [nh · (nope + v), latent] -> per head [nope + v, latent]: key rows, then value rows.
        let kv_b = store.tensor(&kv_b, &[nh * (nope + v), latent])?.reshape((nh, nope + v, latent))?;
        return Ok((kv_b.narrow(1, 0, nope)?.contiguous()?, kv_b.narrow(1, nope, v)?.transpose(1, 2)?.contiguous()?));
    }
    let k_b = store.tensor(&format!("{prefix}.k_b_proj.weight"), &[nh, latent, nope])?;
    let v_b = store.tensor(&format!("{prefix}.v_b_proj.weight"), &[nh, v, latent])?;
    Ok((k_b.transpose(1, 2)?.contiguous()?, v_b.transpose(1, 2)?.contiguous()?))
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

/// The query, key and value projections of multi-head latent attention in its absorbed form:
/// one cached entry per token, attended by every head.
#[derive(Debug, Clone)]
pub struct LatentProjection {
    query: QueryPath,
    kv_a_proj_with_mqa: Linear,
    kv_a_layernorm: RmsNorm,
    /// `kv_b_proj`'s key rows per head, `[nh, nope, latent]`: folded into the queries.
    key_up: Tensor,
    /// `kv_b_proj`'s value rows per head, transposed `[nh, latent, v]`: applied to what each
    /// head attended.
    value_up: Tensor,
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
        let (key_up, value_up) = up_projections(store, prefix, nh, &m)?;
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
            key_up,
            value_up,
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
        let bytes = |t: &Tensor| t.elem_count() * t.dtype().size_in_bytes();
        query + self.kv_a_proj_with_mqa.weight().size_in_bytes() + bytes(&self.key_up) + bytes(&self.value_up)
    }

    /// `x [T, in] -> (q [T, nh, rope + latent], entry [T, 1, rope + latent])`, before RoPE.
    /// The entry is what the cache keeps: the shared key's rope part, then the normed latent.
    /// Each query's non-rotated part is folded through its head's key rows of `kv_b_proj`, so
    /// `q · entry` is the score the expanded head would give.
    pub fn project(&self, x: &Tensor) -> Result<(Tensor, Tensor)> {
        let t = x.dim(0)?;
        let MlaConfig { kv_lora_rank, qk_nope_head_dim: nope, qk_rope_head_dim: rope, .. } = self.dims;
        let q = match &self.query {
            QueryPath::LowRank { q_a_proj, q_a_layernorm, q_b_proj } => {
                q_b_proj.forward(&q_a_layernorm.forward(&q_a_proj.forward(x)?)?)?
            }
            QueryPath::Direct(q_proj) => q_proj.forward(x)?,
        };
        // [T, nh, rope + nope]: the rope part leads (`aliases`).
        let q = q.reshape((t, self.num_heads, rope + nope))?;
        // [nh, T, nope] @ [nh, nope, latent] -> [T, nh, latent].
        let q_latent = q.narrow(2, rope, nope)?.transpose(0, 1)?.contiguous()?.matmul(&self.key_up)?.transpose(0, 1)?;
        let q = Tensor::cat(&[&q.narrow(2, 0, rope)?, &q_latent], 2)?;
        // [T, latent + rope]: the compressed latent, then the key's shared rope part.
        let compressed = self.kv_a_proj_with_mqa.forward(x)?;
        let latent = self.kv_a_layernorm.forward(&compressed.narrow(1, 0, kv_lora_rank)?)?;
        let entry = Tensor::cat(&[&compressed.narrow(1, kv_lora_rank, rope)?, &latent], 1)?.unsqueeze(1)?;
        Ok((q, entry))
    }

    /// `attended [T, nh, rope + latent] -> [T, nh · v]`: each head's attended latent (the
    /// entries' latent dims averaged by its scores) expanded through its value rows.
    pub fn values(&self, attended: &Tensor) -> Result<Tensor> {
        let t = attended.dim(0)?;
        let MlaConfig { kv_lora_rank, qk_rope_head_dim: rope, v_head_dim, .. } = self.dims;
        // [nh, T, latent] @ [nh, latent, v] -> [T, nh · v].
        let latent = attended.narrow(2, rope, kv_lora_rank)?.transpose(0, 1)?.contiguous()?;
        latent.matmul(&self.value_up)?.transpose(0, 1)?.reshape((t, self.num_heads * v_head_dim))
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
