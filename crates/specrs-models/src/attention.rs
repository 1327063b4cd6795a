//! Attention over the paged KV cache for a ragged batch.
//!
//! On CPU a fused kernel reads keys and values straight from the cache blocks through each
//! row's block table, one query at a time with a softmax over only the keys it sees: no
//! gathered copies of the context and no `[q, k]` score matrix. Elsewhere (CUDA) the
//! device-generic path gathers each row's context and runs batched matmuls; it is also the
//! reference the CPU kernel is tested against.

use candle_core::{CpuStorage, CustomOp3, D, DType, Layout, Result, Shape, Tensor};
use rayon::prelude::*;

use crate::batch::{AttentionMask, ForwardBatch};

/// Static shape of one attention layer.
#[derive(Debug, Clone, Copy)]
pub struct AttentionShape {
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub scale: f32,
}

/// `q [T, heads, d]` against the cached keys/values `[slots, kv_heads * d]` of a layer, after
/// this step's keys and values were written. Returns `[T, heads, d]`.
pub fn paged_attention(
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    batch: &ForwardBatch,
    shape: AttentionShape,
) -> Result<Tensor> {
    if q.device().is_cpu() && q.dtype() == DType::F32 && k_cache.dtype() == DType::F32 {
        let op = CpuPagedAttention { batch, shape };
        q.contiguous()?.apply_op3_no_bwd(k_cache, v_cache, &op)
    } else {
        reference_attention(q, k_cache, v_cache, batch, shape)
    }
}

/// Keys visible to query `j` of a row: `[first, last]` in the row's KV index space.
fn visible_keys(
    mask: AttentionMask,
    window: Option<usize>,
    cached: usize,
    query_len: usize,
    j: usize,
) -> (usize, usize) {
    let last = match mask {
        AttentionMask::Causal => cached + j,
        AttentionMask::BlockNonCausal => cached + query_len - 1,
    };
    let own = cached + j;
    let first = match window {
        Some(w) if own + 1 > w => own + 1 - w,
        _ => 0,
    };
    (first, last)
}

struct CpuPagedAttention<'a> {
    batch: &'a ForwardBatch,
    shape: AttentionShape,
}

impl CustomOp3 for CpuPagedAttention<'_> {
    fn name(&self) -> &'static str {
        "paged-attention"
    }

    fn cpu_fwd(
        &self,
        q: &CpuStorage,
        q_l: &Layout,
        k: &CpuStorage,
        k_l: &Layout,
        v: &CpuStorage,
        v_l: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (CpuStorage::F32(q), CpuStorage::F32(k), CpuStorage::F32(v)) = (q, k, v) else {
            candle_core::bail!("paged-attention: the CPU kernel takes f32 queries and caches");
        };
        let q = &q[q_l.start_offset()..];
        let k = &k[k_l.start_offset()..];
        let v = &v[v_l.start_offset()..];
        let AttentionShape { num_heads, num_kv_heads, head_dim, .. } = self.shape;
        let t = q_l.dims()[0];
        let mut out = vec![0f32; t * num_heads * head_dim];
        let batch = self.batch;
        let token_rows: Vec<(usize, usize)> =
            batch.rows.iter().enumerate().flat_map(|(ri, r)| (0..r.query_len).map(move |j| (ri, j))).collect();
        // Work items are (token, kv head): the heads sharing a kv head are contiguous in the
        // output, so each item owns one chunk of it. Small steps run inline: a thread-pool
        // dispatch costs more than their whole attention.
        let group_width = num_heads / num_kv_heads * head_dim;
        let run = |(item, out_group): (usize, &mut [f32])| {
            let (tok, g) = (item / num_kv_heads, item % num_kv_heads);
            let (ri, j) = token_rows[tok];
            // Constant head dims let the inlined loops unroll into registers.
            match head_dim {
                64 => self.attend_kv_head(q, k, v, ri, j, tok, g, 64, out_group),
                128 => self.attend_kv_head(q, k, v, ri, j, tok, g, 128, out_group),
                d => self.attend_kv_head(q, k, v, ri, j, tok, g, d, out_group),
            }
        };
        let work: usize = batch.rows.iter().map(|r| r.query_len * r.context_len).sum::<usize>() * num_heads * head_dim;
        if work > 1 << 17 {
            out.par_chunks_mut(group_width).enumerate().for_each(run);
        } else {
            out.chunks_mut(group_width).enumerate().for_each(run);
        }
        Ok((CpuStorage::F32(out), Shape::from_dims(&[t, num_heads, head_dim])))
    }
}

/// Head dims accumulated per register tile when weighting values: 8 AVX2 registers, so each
/// key's FMAs are independent of each other and cover their own latency.
const VALUE_TILE: usize = 64;

impl CpuPagedAttention<'_> {
    /// Attention of query `j` of row `ri` (token `tok` of the batch) for the heads sharing kv
    /// head `g`: `out [group, d]`.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn attend_kv_head(
        &self,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        ri: usize,
        j: usize,
        tok: usize,
        g: usize,
        d: usize,
        out: &mut [f32],
    ) {
        let AttentionShape { num_heads, num_kv_heads, scale, .. } = self.shape;
        let group = num_heads / num_kv_heads;
        let batch = self.batch;
        let row = &batch.rows[ri];
        let table = batch.row_block_table(row);
        let bs = batch.block_size;
        let (first, last) = visible_keys(batch.mask, batch.sliding_window, row.cached_len(), row.query_len, j);
        let kv_width = num_kv_heads * d;
        // Offsets of this kv head's key/value vectors in the caches, one per visible key.
        let offsets: Vec<usize> =
            (first..=last).map(|x| (table[x / bs] as usize * bs + x % bs) * kv_width + g * d).collect();
        let n_keys = offsets.len();
        let mut probs = vec![0f32; n_keys];
        for (hi, out_h) in out.chunks_exact_mut(d).enumerate() {
            let h = g * group + hi;
            let qh = &q[(tok * num_heads + h) * d..][..d];
            // 1. Scores, 2. softmax (normalised at the end).
            let mut max = f32::NEG_INFINITY;
            for (p, &o) in probs.iter_mut().zip(&offsets) {
                *p = dot(qh, &k[o..o + d]) * scale;
                max = max.max(*p);
            }
            let mut sum = 0f32;
            for p in probs.iter_mut() {
                *p = (*p - max).exp();
                sum += *p;
            }
            // 3. Weighted sum of values, one register tile of head dims at a time.
            let mut start = 0;
            while d - start >= VALUE_TILE {
                let mut acc = [0f32; VALUE_TILE];
                for (&p, &o) in probs.iter().zip(&offsets) {
                    let val: &[f32; VALUE_TILE] = v[o + start..][..VALUE_TILE].try_into().expect("tile");
                    for (a, &x) in acc.iter_mut().zip(val) {
                        *a = p.mul_add(x, *a);
                    }
                }
                out_h[start..start + VALUE_TILE].copy_from_slice(&acc);
                start += VALUE_TILE;
            }
            let tail = &mut out_h[start..];
            for (&p, &o) in probs.iter().zip(&offsets) {
                for (a, &x) in tail.iter_mut().zip(&v[o + start..o + d]) {
                    *a = p.mul_add(x, *a);
                }
            }
            let inv = 1.0 / sum;
            out_h.iter_mut().for_each(|x| *x *= inv);
        }
    }
}

/// Dot product. On x86-64-v3 two AVX2 accumulators over 16-value chunks keep consecutive FMAs
/// independent; the portable loop is the fallback and the tail.
#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    #[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma"))]
    let (whole, mut sum) = {
        use std::arch::x86_64::*;
        let whole = a.len() / 16 * 16;
        // SAFETY: every load reads 8 floats at `c` or `c + 8` with `c + 16 <= whole <= len`;
        // AVX2 and FMA are compiled in.
        let sum = unsafe {
            let (mut lo, mut hi) = (_mm256_setzero_ps(), _mm256_setzero_ps());
            for c in (0..whole).step_by(16) {
                let (pa, pb) = (a.as_ptr().add(c), b.as_ptr().add(c));
                lo = _mm256_fmadd_ps(_mm256_loadu_ps(pa), _mm256_loadu_ps(pb), lo);
                hi = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(8)), _mm256_loadu_ps(pb.add(8)), hi);
            }
            let v = _mm256_add_ps(lo, hi);
            let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
            let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
            _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
        };
        (whole, sum)
    };
    #[cfg(not(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma")))]
    let (whole, mut sum) = (0, 0f32);
    for (x, y) in a[whole..].iter().zip(&b[whole..]) {
        sum = x.mul_add(*y, sum);
    }
    sum
}

/// Device-generic attention: per row, gather the visible context from the cache and run
/// `softmax(q kᵀ · scale + mask) v` with batched matmuls.
pub fn reference_attention(
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    batch: &ForwardBatch,
    shape: AttentionShape,
) -> Result<Tensor> {
    let AttentionShape { num_heads, num_kv_heads, head_dim: d, scale } = shape;
    let group = num_heads / num_kv_heads;
    let device = q.device();
    let bs = batch.block_size;
    let mut outs = Vec::with_capacity(batch.rows.len());
    for row in &batch.rows {
        let table = batch.row_block_table(row);
        let ctx = row.context_len;
        let slots: Vec<u32> = (0..ctx).map(|x| table[x / bs] * bs as u32 + (x % bs) as u32).collect();
        let slots = Tensor::from_vec(slots, ctx, device)?;
        // 1. Gather: [ctx, kv_heads * d] -> [kv_heads, ctx, d], repeated to every head.
        let gather = |cache: &Tensor| -> Result<Tensor> {
            let x = cache.index_select(&slots, 0)?.reshape((ctx, num_kv_heads, 1, d))?;
            let x = x.broadcast_as((ctx, num_kv_heads, group, d))?.reshape((ctx, num_heads, d))?;
            x.transpose(0, 1)?.contiguous()?.to_dtype(q.dtype())
        };
        let k = gather(k_cache)?;
        let v = gather(v_cache)?;
        // 2. Scores [heads, q_len, ctx] with the mask as -inf.
        let qr = q.narrow(0, row.query_start, row.query_len)?.transpose(0, 1)?.contiguous()?;
        let scores = (qr.matmul(&k.t()?)? * scale as f64)?.to_dtype(DType::F32)?;
        let mut mask = vec![0f32; row.query_len * ctx];
        for j in 0..row.query_len {
            let (first, last) = visible_keys(batch.mask, batch.sliding_window, row.cached_len(), row.query_len, j);
            for x in 0..ctx {
                if x < first || x > last {
                    mask[j * ctx + x] = f32::NEG_INFINITY;
                }
            }
        }
        let mask = Tensor::from_vec(mask, (1, row.query_len, ctx), device)?;
        let probs = candle_nn::ops::softmax_last_dim(&scores.broadcast_add(&mask)?)?.to_dtype(q.dtype())?;
        // 3. [heads, q_len, d] -> [q_len, heads, d].
        outs.push(probs.matmul(&v)?.transpose(0, 1)?);
    }
    Tensor::cat(&outs, 0)?.contiguous()
}

/// Attention metadata of a fixed-shape batch: `rows` rows of exactly `queries` query tokens,
/// each row attending to at most `keys` keys of its context. Shapes never change, so a step
/// that reads only these tensors can be captured once and replayed with new contents
/// (`crate::graph`). Padding rows and padding queries point at a scratch slot and see only
/// key 0 of it; their outputs are never read.
#[derive(Debug, Clone)]
pub struct FixedAttention {
    pub rows: usize,
    pub queries: usize,
    pub keys: usize,
    /// `[rows · keys]` u32: the KV slot of each row's key `x`.
    pub key_slots: Tensor,
    /// `[rows, queries, 1]` u32: first and last key index visible to each query.
    pub first_key: Tensor,
    pub last_key: Tensor,
    /// `[1, 1, keys]` u32: `0..keys`, kept so no step uploads it.
    pub key_index: Tensor,
}

/// Masked fill value: large and finite, so fully masked (padding) queries stay NaN-free.
const MASKED: f64 = 1e30;

/// [`reference_attention`] over a [`FixedAttention`] batch: `q [rows · queries, heads, d]`
/// against each row's first `keys` keys, gathered through `key_slots`. Every op is a device
/// op on fixed shapes (no host data, no per-row loop), so it can run inside a CUDA graph.
/// Grouped-query heads share their key/value head without copies: queries are regrouped as
/// `[rows, kv_heads, group · queries, d]`.
pub fn fixed_attention(
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    fixed: &FixedAttention,
    shape: AttentionShape,
) -> Result<Tensor> {
    let AttentionShape { num_heads, num_kv_heads, head_dim: d, scale } = shape;
    let group = num_heads / num_kv_heads;
    let (b, qn, l) = (fixed.rows, fixed.queries, fixed.keys);
    // 1. Keys and values: [b · l, kv · d] -> [b, kv, l, d].
    let gather = |cache: &Tensor| -> Result<Tensor> {
        cache.index_select(&fixed.key_slots, 0)?.reshape((b, l, num_kv_heads, d))?.transpose(1, 2)?.contiguous()
    };
    let k = gather(k_cache)?.to_dtype(q.dtype())?;
    let v = gather(v_cache)?.to_dtype(q.dtype())?;
    // 2. Queries: [b · qn, heads, d] -> [b, kv, group · qn, d].
    let qg = q.reshape((b, qn, num_kv_heads, group, d))?.permute((0, 2, 3, 1, 4))?.contiguous()?;
    let qg = qg.reshape((b, num_kv_heads, group * qn, d))?;
    // 3. Scores with the visibility mask [b, 1, 1, qn, l], softmax, weighted values.
    let scores = (qg.matmul(&k.t()?.contiguous()?)? * f64::from(scale))?.to_dtype(DType::F32)?;
    let scores = scores.reshape((b, num_kv_heads, group, qn, l))?;
    let visible = fixed
        .key_index
        .broadcast_ge(&fixed.first_key)?
        .mul(&fixed.key_index.broadcast_le(&fixed.last_key)?)?
        .to_dtype(DType::F32)?;
    let additive = ((visible - 1.0)? * MASKED)?.reshape((b, 1, 1, qn, l))?;
    let probs = candle_nn::ops::softmax_last_dim(&scores.broadcast_add(&additive)?)?.to_dtype(q.dtype())?;
    let out = probs.reshape((b, num_kv_heads, group * qn, l))?.matmul(&v)?;
    // 4. [b, kv, group, qn, d] -> [b · qn, heads, d].
    out.reshape((b, num_kv_heads, group, qn, d))?.permute((0, 3, 1, 2, 4))?.reshape((b * qn, num_heads, d))
}

/// Checks the output of attention is finite (debug aid for kernels).
pub fn all_finite(t: &Tensor) -> Result<bool> {
    let s = t.to_dtype(DType::F32)?.flatten_all()?;
    let bad = s.ne(&s)?.to_dtype(DType::F32)?.sum_all()?.to_scalar::<f32>()?;
    Ok(bad == 0.0 && s.abs()?.max(D::Minus1)?.to_scalar::<f32>()?.is_finite())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::BatchRow;
    use crate::kv_cache::PagedKvCache;
    use candle_core::Device;

    fn rand(shape: &[usize], seed: u64) -> Tensor {
        let n: usize = shape.iter().product();
        let mut s = seed;
        let v: Vec<f32> = (0..n)
            .map(|_| {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((s >> 33) as f32 / (1u64 << 31) as f32) - 0.5
            })
            .collect();
        Tensor::from_vec(v, shape, &Device::Cpu).unwrap()
    }

    /// Two rows with scattered blocks: a 3-token verify row over 5 cached keys and a 6-token
    /// prefill row, GQA 4 heads over 2 kv heads.
    fn setup(mask: AttentionMask, window: Option<usize>) -> (Tensor, PagedKvCache, ForwardBatch, AttentionShape) {
        let shape = AttentionShape { num_heads: 4, num_kv_heads: 2, head_dim: 8, scale: 8f32.powf(-0.5) };
        let cache = PagedKvCache::new(1, 8, 4, 2, 8, DType::F32, &Device::Cpu).unwrap();
        let (kc, vc) = cache.layer(0);
        kc.slice_set(&rand(&[32, 16], 1), 0, 0).unwrap();
        vc.slice_set(&rand(&[32, 16], 2), 0, 0).unwrap();
        let batch = ForwardBatch {
            input_ids: vec![0; 9],
            positions: vec![0; 9],
            rows: vec![
                BatchRow { query_start: 0, query_len: 3, context_len: 8, block_table_start: 0, block_table_len: 2 },
                BatchRow { query_start: 3, query_len: 6, context_len: 6, block_table_start: 2, block_table_len: 2 },
            ],
            slot_mapping: vec![0; 9],
            block_tables: vec![6, 1, 3, 7],
            block_size: 4,
            mask,
            sliding_window: window,
            ..Default::default()
        };
        (rand(&[9, 4, 8], 3), cache, batch, shape)
    }

    #[test]
    fn cpu_kernel_matches_reference_for_every_mask() {
        for (mask, window) in
            [(AttentionMask::Causal, None), (AttentionMask::Causal, Some(3)), (AttentionMask::BlockNonCausal, None)]
        {
            let (q, cache, batch, shape) = setup(mask, window);
            let (kc, vc) = cache.layer(0);
            let fast = paged_attention(&q, kc, vc, &batch, shape).unwrap();
            let slow = reference_attention(&q, kc, vc, &batch, shape).unwrap();
            let diff = (fast - slow).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
            assert!(diff < 1e-5, "{mask:?} {window:?}: {diff}");
        }
    }

    #[test]
    fn cpu_kernel_matches_reference_at_real_head_dims_and_long_contexts() {
        // The head dims with unrolled register tiles (64, 128) and one with a tail (80), GQA
        // 9 heads over 3 kv heads as in SmolLM2, a decode row and a 4-token verify row over
        // contexts spanning many scattered blocks.
        for d in [64, 80, 128] {
            let shape = AttentionShape { num_heads: 9, num_kv_heads: 3, head_dim: d, scale: (d as f32).powf(-0.5) };
            let (block_size, num_blocks) = (16, 40);
            let cache = PagedKvCache::new(1, num_blocks, block_size, 3, d, DType::F32, &Device::Cpu).unwrap();
            let (kc, vc) = cache.layer(0);
            let slots = num_blocks * block_size;
            kc.slice_set(&(rand(&[slots, 3 * d], 4) * 4.0).unwrap(), 0, 0).unwrap();
            vc.slice_set(&rand(&[slots, 3 * d], 5), 0, 0).unwrap();
            let block_tables: Vec<u32> = (0..num_blocks as u32).rev().collect();
            let batch = ForwardBatch {
                input_ids: vec![0; 5],
                positions: vec![0; 5],
                rows: vec![
                    BatchRow {
                        query_start: 0,
                        query_len: 1,
                        context_len: 301,
                        block_table_start: 0,
                        block_table_len: 19,
                    },
                    BatchRow {
                        query_start: 1,
                        query_len: 4,
                        context_len: 250,
                        block_table_start: 20,
                        block_table_len: 16,
                    },
                ],
                slot_mapping: vec![0; 5],
                block_tables,
                block_size,
                ..Default::default()
            };
            let q = rand(&[5, 9, d], 6);
            let fast = paged_attention(&q, kc, vc, &batch, shape).unwrap();
            let slow = reference_attention(&q, kc, vc, &batch, shape).unwrap();
            let diff = (fast - slow).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
            assert!(diff < 1e-5, "head dim {d}: {diff}");
        }
    }

    #[test]
    fn causal_first_prefill_token_sees_only_itself() {
        let (q, cache, batch, shape) = setup(AttentionMask::Causal, None);
        let (kc, vc) = cache.layer(0);
        let out = paged_attention(&q, kc, vc, &batch, shape).unwrap();
        // Row 1, token 0: its only key is slot 12 (block 3, offset 0): output = that value.
        let v = vc.get(12).unwrap().reshape((2, 8)).unwrap();
        let got = out.get(3).unwrap();
        for h in 0..4 {
            let diff = (got.get(h).unwrap() - v.get(h / 2).unwrap()).unwrap().abs().unwrap().max_all().unwrap();
            assert!(diff.to_scalar::<f32>().unwrap() < 1e-6);
        }
    }
}
