//! Attention over the paged KV cache for a ragged batch.
//!
//! On CPU a fused kernel reads keys and values straight from the cache blocks through each
//! row's block table, no gathered copies of the context. The queries of a row that share a kv
//! head (its heads, and a verify row's or prefill chunk's tokens) share every key and value
//! load, while each query keeps its own softmax over only the keys it sees. Elsewhere (CUDA)
//! decode and verify rows attend together in padded batched matmuls
//! (`crate::padded_attention`) and prefill chunks one row at a time in bounded tiles with an
//! online softmax (`crate::tiled_attention`). [`reference_attention`], the device-generic
//! per-row path with whole score matrices, is what both are tested against.

use std::ops::Range;

use candle_core::{CpuStorage, CustomOp3, D, DType, Layout, Result, Shape, Tensor};
use rayon::prelude::*;

use crate::alibi::{AlibiSlopes, with_alibi};
use crate::batch::{AttentionMask, BatchRow, ForwardBatch};

/// Static shape of one attention layer.
#[derive(Debug, Clone)]
pub struct AttentionShape {
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub scale: f32,
    /// Gemma 2's soft cap on the scaled scores, `cap · tanh(score / cap)`, before the mask.
    pub softcap: Option<f32>,
    /// gpt-oss's attention sinks.
    pub sinks: Option<AttentionSinks>,
    /// BLOOM's and Falcon-RW's distance penalty, added to the scaled scores.
    pub alibi: Option<AlibiSlopes>,
}

impl AttentionShape {
    /// Plain scaled dot-product attention (no soft cap, no sinks).
    pub const fn new(num_heads: usize, num_kv_heads: usize, head_dim: usize, scale: f32) -> Self {
        Self { num_heads, num_kv_heads, head_dim, scale, softcap: None, sinks: None, alibi: None }
    }
}

/// gpt-oss's learned sink logit per head: each head's softmax also counts `exp(sink)`, a key
/// that carries no value, so a head can put weight on nothing. Kept on the host for the CPU
/// kernel and as a `[heads]` f32 tensor for the device paths.
#[derive(Debug, Clone)]
pub struct AttentionSinks {
    host: Vec<f32>,
    device: Tensor,
}

impl AttentionSinks {
    /// `sinks [heads]`, any float dtype, on the device the attention runs on.
    pub fn new(sinks: &Tensor) -> Result<Self> {
        let device = sinks.to_dtype(DType::F32)?;
        Ok(Self { host: device.to_device(&candle_core::Device::Cpu)?.to_vec1()?, device })
    }

    pub fn host(&self) -> &[f32] {
        &self.host
    }

    /// Softmax over the last dim of `scores` with each head's sink as one more logit, which
    /// is then dropped: `heads_shape` places the `[heads]` sinks against `scores`' dims (its
    /// last dim 1), broadcast to `scores` but for the last dim.
    pub(crate) fn softmax(&self, scores: &Tensor, heads_shape: &[usize]) -> Result<Tensor> {
        let mut column = scores.dims().to_vec();
        let keys = column.pop().expect("scores have a key dim");
        column.push(1);
        let sinks = self.column(heads_shape, &column)?.to_dtype(scores.dtype())?;
        let probs = candle_nn::ops::softmax_last_dim(&Tensor::cat(&[scores, &sinks], D::Minus1)?)?;
        probs.narrow(D::Minus1, 0, keys)
    }

    /// The sinks placed by `heads_shape` and broadcast to `dims` (f32, contiguous).
    pub(crate) fn column(&self, heads_shape: &[usize], dims: &[usize]) -> Result<Tensor> {
        self.device.reshape(heads_shape)?.broadcast_as(dims)?.contiguous()
    }
}

/// Softmax over the last dim of `scores`, with the sinks when the layer has them.
pub(crate) fn softmax_with_sinks(
    scores: &Tensor,
    sinks: Option<&AttentionSinks>,
    heads_shape: &[usize],
) -> Result<Tensor> {
    match sinks {
        Some(s) => s.softmax(scores, heads_shape),
        None => candle_nn::ops::softmax_last_dim(scores),
    }
}

/// `cap · tanh(scores / cap)` where a cap is set.
pub(crate) fn soft_capped(scores: Tensor, cap: Option<f32>) -> Result<Tensor> {
    match cap {
        Some(cap) => (scores / f64::from(cap))?.tanh()? * f64::from(cap),
        None => Ok(scores),
    }
}

/// `q [T, heads, d]` against the cached keys/values `[slots, kv_heads * d]` of a layer, after
/// this step's keys and values were written. Returns `[T, heads, d]`.
pub fn paged_attention(
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    batch: &ForwardBatch,
    shape: &AttentionShape,
) -> Result<Tensor> {
    if q.device().is_cpu() && q.dtype() == DType::F32 && k_cache.dtype() == DType::F32 {
        let op = CpuPagedAttention { batch, shape };
        q.contiguous()?.apply_op3_no_bwd(k_cache, v_cache, &op)
    } else {
        crate::padded_attention::ragged_attention(q, k_cache, v_cache, batch, shape)
    }
}

/// Keys visible to query `j` of a row: `[first, last]` in the row's KV index space. A window
/// of `w` keys starts `w - 1` before the query's own key; a chunk of `c` positions at the
/// chunk's first key (Llama 4: a row's key index is its position).
pub(crate) fn visible_keys(
    mask: AttentionMask,
    (window, chunk): (Option<usize>, Option<usize>),
    cached: usize,
    query_len: usize,
    j: usize,
) -> (usize, usize) {
    let last = match mask {
        AttentionMask::Causal => cached + j,
        AttentionMask::BlockNonCausal => cached + query_len - 1,
    };
    let own = cached + j;
    let windowed = window.map_or(0, |w| (own + 1).saturating_sub(w));
    let chunked = chunk.map_or(0, |c| own - own % c);
    (windowed.max(chunked), last)
}

struct CpuPagedAttention<'a> {
    batch: &'a ForwardBatch,
    shape: &'a AttentionShape,
}

/// Query tokens of one row attended together by one work item: each key and value they see is
/// read from the cache once for all of them (a verify row's K + 1 queries, a prefill chunk).
const QUERIES_PER_ITEM: usize = 8;

/// One task of the CPU kernel: the queries `queries` (token indices within row `row`) of the
/// heads sharing kv head `kv_head`.
struct WorkItem {
    row: usize,
    kv_head: usize,
    queries: Range<usize>,
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
        let AttentionShape { num_heads, num_kv_heads, head_dim, .. } = *self.shape;
        let t = q_l.dims()[0];
        let batch = self.batch;
        let items = self.work_items();
        let attend = |item: &WorkItem| -> Vec<f32> {
            // Constant head dims let the inlined loops unroll into registers.
            match head_dim {
                64 => self.attend_item(q, k, v, item, 64),
                128 => self.attend_item(q, k, v, item, 128),
                d => self.attend_item(q, k, v, item, d),
            }
        };
        // Small steps run inline: a thread-pool dispatch costs more than their whole attention.
        let work: usize = batch.rows.iter().map(|r| r.query_len * r.context_len).sum::<usize>() * num_heads * head_dim;
        let outs: Vec<Vec<f32>> =
            if work > 1 << 17 { items.par_iter().map(attend).collect() } else { items.iter().map(attend).collect() };
        // Each item's output is `[queries, group, d]`: the heads of its kv head, contiguous in
        // every token's `[heads, d]`.
        let group_width = num_heads / num_kv_heads * head_dim;
        let mut out = vec![0f32; t * num_heads * head_dim];
        for (item, item_out) in items.iter().zip(&outs) {
            let first_token = batch.rows[item.row].query_start + item.queries.start;
            for (i, token_out) in item_out.chunks_exact(group_width).enumerate() {
                let start = (first_token + i) * num_heads * head_dim + item.kv_head * group_width;
                out[start..start + group_width].copy_from_slice(token_out);
            }
        }
        Ok((CpuStorage::F32(out), Shape::from_dims(&[t, num_heads, head_dim])))
    }
}

/// Keys per block of the value pass: 16 KiB of values at head dim 64, read from the cache into
/// L1 by the block's first query and from L1 by the others.
const VALUE_BLOCK_FLOATS: usize = 4096;

/// Head dims accumulated per register tile when weighting values: 8 AVX2 registers, so each
/// key's FMAs are independent of each other and cover their own latency.
const VALUE_TILE: usize = 64;

impl CpuPagedAttention<'_> {
    /// The step's tasks: each row's queries in chunks of at most [`QUERIES_PER_ITEM`], for
    /// every kv head. A step of fewer (row, kv head) pairs than twice the compute threads (a
    /// single stream verifying drafts) halves its rows' queries, so no thread sits idle.
    fn work_items(&self) -> Vec<WorkItem> {
        let kv_heads = self.shape.num_kv_heads;
        let split = self.batch.rows.len() * kv_heads < 2 * rayon::current_num_threads();
        let mut items = Vec::new();
        for (row, r) in self.batch.rows.iter().enumerate().filter(|(_, r)| r.query_len > 0) {
            let mut chunks = r.query_len.div_ceil(QUERIES_PER_ITEM);
            if split {
                chunks = chunks.max(r.query_len.min(2));
            }
            let per_item = r.query_len.div_ceil(chunks);
            for kv_head in 0..kv_heads {
                for start in (0..r.query_len).step_by(per_item) {
                    items.push(WorkItem { row, kv_head, queries: start..(start + per_item).min(r.query_len) });
                }
            }
        }
        items
    }

    /// Attention of one work item: `[queries, group, d]`, query token-major.
    ///
    /// Every query is computed alone, in an order fixed by its own visible keys (its scores,
    /// its softmax over exactly them, its values accumulated key by key in order), so its
    /// output does not depend on which other queries share the item or the step
    /// (verification stays bit-identical to plain decoding). What the queries share are the
    /// loads: keys and values come from the cache once per item.
    #[inline(always)]
    fn attend_item(&self, q: &[f32], k: &[f32], v: &[f32], item: &WorkItem, d: usize) -> Vec<f32> {
        let AttentionShape { num_heads, num_kv_heads, scale, softcap, .. } = *self.shape;
        let group = num_heads / num_kv_heads;
        let batch = self.batch;
        let row = &batch.rows[item.row];
        let table = batch.row_block_table(row);
        let bs = batch.block_size;
        let visible = |j| visible_keys(batch.mask, batch.key_limits(), row.cached_len(), row.query_len, j);
        // Both ends of the visible range grow with the query, so the item's keys are the
        // first query's first through the last query's last.
        let (first, _) = visible(item.queries.start);
        let (_, last) = visible(item.queries.end - 1);
        let kv_width = num_kv_heads * d;
        // Offsets of this kv head's key/value vectors in the caches, one per key of the item.
        let offsets: Vec<usize> =
            (first..=last).map(|x| (table[x / bs] as usize * bs + x % bs) * kv_width + item.kv_head * d).collect();
        let n_keys = offsets.len();
        // Query `i` is head `i % group` of the kv head at token `start + i / group`; each
        // sees the item's keys `spans[i]` (relative to `first`).
        let (queries, spans): (Vec<&[f32]>, Vec<Range<usize>>) = item
            .queries
            .clone()
            .flat_map(|j| {
                let token = row.query_start + j;
                let (lo, hi) = visible(j);
                (0..group).map(move |h| {
                    (&q[(token * num_heads + item.kv_head * group + h) * d..][..d], lo - first..hi - first + 1)
                })
            })
            .unzip();
        // 1. Scores of every query against every key of the item, `[queries, n_keys]` (a
        //    query's invisible keys are scored and never read).
        let mut probs = vec![0f32; queries.len() * n_keys];
        scores(&queries, k, &offsets, d, scale, &mut probs);
        if let Some(cap) = softcap {
            probs.iter_mut().for_each(|s| *s = cap * (*s / cap).tanh());
        }
        if let Some(alibi) = &self.shape.alibi {
            for (i, (p, span)) in probs.chunks_exact_mut(n_keys).zip(&spans).enumerate() {
                let slope = alibi.host()[item.kv_head * group + i % group];
                let last = span.end - 1;
                for (s, x) in p[span.clone()].iter_mut().zip(span.clone()) {
                    *s -= slope * (last - x) as f32;
                }
            }
        }
        // 2. Softmax numerators over each query's own keys (normalised at the end); a sink
        //    adds `exp(sink)` to its head's denominator, shifted by the same maximum.
        let sinks = self.shape.sinks.as_ref().map(AttentionSinks::host);
        let sums: Vec<f32> = probs
            .chunks_exact_mut(n_keys)
            .zip(&spans)
            .enumerate()
            .map(|(i, (p, span))| {
                let p = &mut p[span.clone()];
                let sink = sinks.map(|s| {
                    let max = p.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                    (s[item.kv_head * group + i % group] - max).exp()
                });
                exp_shifted_by_max(p) + sink.unwrap_or(0.0)
            })
            .collect();
        // 3. Weighted sums of values, a block of keys at a time for every query.
        let mut out = vec![0f32; queries.len() * d];
        let block = (VALUE_BLOCK_FLOATS / d).max(8);
        for block_start in (0..n_keys).step_by(block) {
            let block_keys = block_start..(block_start + block).min(n_keys);
            let mut prefetch = true;
            for ((out_q, probs), span) in out.chunks_exact_mut(d).zip(probs.chunks_exact(n_keys)).zip(&spans) {
                let keys = block_keys.start.max(span.start)..block_keys.end.min(span.end);
                if keys.is_empty() {
                    continue;
                }
                accumulate_values(out_q, &probs[keys.clone()], &offsets[keys.start..], v, prefetch);
                prefetch = false;
            }
        }
        for (out_q, sum) in out.chunks_exact_mut(d).zip(sums) {
            let inv = 1.0 / sum;
            out_q.iter_mut().for_each(|x| *x *= inv);
        }
        out
    }
}

/// `out += Σ_x probs[x] · v[offsets[x]..][..d]`, key by key in order, one register tile of
/// head dims at a time; with `prefetch`, asks for the values eight keys ahead.
#[inline(always)]
fn accumulate_values(out: &mut [f32], probs: &[f32], offsets: &[usize], v: &[f32], prefetch: bool) {
    let d = out.len();
    let mut start = 0;
    while d - start >= VALUE_TILE {
        let mut acc: [f32; VALUE_TILE] = out[start..start + VALUE_TILE].try_into().expect("tile");
        for (x, (&p, &o)) in probs.iter().zip(offsets).enumerate() {
            if prefetch && let Some(&ahead) = offsets.get(x + 8) {
                prefetch_floats(v[ahead + start..].as_ptr(), VALUE_TILE);
            }
            let val: &[f32; VALUE_TILE] = v[o + start..][..VALUE_TILE].try_into().expect("tile");
            for (a, &x) in acc.iter_mut().zip(val) {
                *a = p.mul_add(x, *a);
            }
        }
        out[start..start + VALUE_TILE].copy_from_slice(&acc);
        start += VALUE_TILE;
    }
    let tail = &mut out[start..];
    for (&p, &o) in probs.iter().zip(offsets) {
        for (a, &x) in tail.iter_mut().zip(&v[o + start..o + d]) {
            *a = p.mul_add(x, *a);
        }
    }
}

/// Asks for the cache lines of `len` floats at `p` where the CPU takes prefetch hints.
#[inline(always)]
fn prefetch_floats(p: *const f32, len: usize) {
    #[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma"))]
    x86::prefetch(p, len);
    #[cfg(not(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma")))]
    let _ = (p, len);
}

/// `scores [queries, n]` = `scale · q · k_x` for each query row (`d` values) and the keys at
/// `offsets` (`n` of them) in `k`.
fn scores(queries: &[&[f32]], k: &[f32], offsets: &[usize], d: usize, scale: f32, scores: &mut [f32]) {
    let n = offsets.len();
    assert!(queries.iter().all(|q| q.len() == d) && scores.len() == queries.len() * n);
    assert!(offsets.iter().all(|&o| o + d <= k.len()), "key offsets within the cache");
    #[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma"))]
    if d.is_multiple_of(8) {
        // SAFETY: every offset leaves `d` readable floats in `k` (asserted above), every query
        // holds `d` and `scores` one row of `n` per query; AVX2 and FMA are compiled in.
        unsafe { x86::scores(queries, k, offsets, d, scale, scores) };
        return;
    }
    for (qh, scores) in queries.iter().zip(scores.chunks_exact_mut(n)) {
        for (s, &o) in scores.iter_mut().zip(offsets) {
            *s = dot(qh, &k[o..o + d]) * scale;
        }
    }
}

/// `p = exp(p - max p)` in place; returns `Σ p`.
fn exp_shifted_by_max(p: &mut [f32]) -> f32 {
    #[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma"))]
    // SAFETY: AVX2 and FMA are compiled in.
    return unsafe { x86::exp_shifted_by_max(p) };
    #[cfg(not(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma")))]
    {
        let max = p.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
        let mut sum = 0f32;
        for x in p.iter_mut() {
            *x = (*x - max).exp();
            sum += *x;
        }
        sum
    }
}

#[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma"))]
mod x86 {
    use std::arch::x86_64::*;

    use crate::simd::{exp_nonpositive as exp, hmax, hsum};

    /// See [`super::scores`]. Eight keys at a time per query: one accumulator per key, each
    /// chunk of the query loaded once for the eight, and the eight sums reduced together into
    /// one vector. Each key's lanes are summed in the same pattern whatever its place among
    /// the eight, and a short last group repeats its last key, so a score depends only on its
    /// query and key.
    ///
    /// # Safety
    /// `d % 8 == 0`, every `offsets[x] + d <= k.len()`, every query holds `d` floats and
    /// `scores.len() = queries.len() · offsets.len()`; the CPU runs AVX2 and FMA.
    #[inline(always)]
    pub(super) unsafe fn scores(
        queries: &[&[f32]],
        k: &[f32],
        offsets: &[usize],
        d: usize,
        scale: f32,
        scores: &mut [f32],
    ) {
        let n = offsets.len();
        // SAFETY: forwarded from the caller: every pointer read is a key at a checked offset or
        // a query row, and every store is within `scores` (whole groups) or the local `tail`.
        unsafe {
            let scale = _mm256_set1_ps(scale);
            for x0 in (0..n).step_by(8) {
                let count = (n - x0).min(8);
                let keys: [*const f32; 8] = std::array::from_fn(|i| k.as_ptr().add(offsets[x0 + i.min(count - 1)]));
                // The keys sit in scattered blocks, 256-byte runs the hardware prefetchers do
                // not follow: ask for the next eight while these are dotted.
                for &o in offsets.iter().skip(x0 + 8).take(8) {
                    prefetch(k.as_ptr().add(o), d);
                }
                for (i, qi) in queries.iter().enumerate() {
                    let s = _mm256_mul_ps(dot8(qi.as_ptr(), &keys, d), scale);
                    let dst = scores.as_mut_ptr().add(i * n + x0);
                    if count == 8 {
                        _mm256_storeu_ps(dst, s);
                    } else {
                        let mut tail = [0f32; 8];
                        _mm256_storeu_ps(tail.as_mut_ptr(), s);
                        std::ptr::copy_nonoverlapping(tail.as_ptr(), dst, count);
                    }
                }
            }
        }
    }

    /// Asks for the cache lines of `len` floats at `p` (a hint: never faults).
    #[inline(always)]
    pub(super) fn prefetch(p: *const f32, len: usize) {
        for line in (0..len).step_by(16) {
            // SAFETY: a prefetch is a hint that never faults, whatever the address; SSE is
            // compiled in.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(line).cast()) };
        }
    }

    /// `[q · keys[0], .., q · keys[7]]` over `d` values.
    ///
    /// # Safety
    /// `q` and each key point to `d` readable floats, `d % 8 == 0`; AVX2 and FMA are available.
    #[inline(always)]
    unsafe fn dot8(q: *const f32, keys: &[*const f32; 8], d: usize) -> __m256 {
        // SAFETY: loads at `c < d` of `q` and the keys, as the caller guarantees.
        unsafe {
            let mut acc = [_mm256_setzero_ps(); 8];
            for c in (0..d).step_by(8) {
                let qc = _mm256_loadu_ps(q.add(c));
                for (a, &key) in acc.iter_mut().zip(keys) {
                    *a = _mm256_fmadd_ps(_mm256_loadu_ps(key.add(c)), qc, *a);
                }
            }
            // Lane sums ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)) of the eight
            // accumulators, key i in lane i.
            let t0 = _mm256_hadd_ps(acc[0], acc[1]);
            let t1 = _mm256_hadd_ps(acc[2], acc[3]);
            let t2 = _mm256_hadd_ps(acc[4], acc[5]);
            let t3 = _mm256_hadd_ps(acc[6], acc[7]);
            let u0 = _mm256_hadd_ps(t0, t1);
            let u1 = _mm256_hadd_ps(t2, t3);
            _mm256_add_ps(_mm256_permute2f128_ps::<0x20>(u0, u1), _mm256_permute2f128_ps::<0x31>(u0, u1))
        }
    }

    /// See [`super::exp_shifted_by_max`]: max and sum in 8 lanes, `exp` as a polynomial.
    ///
    /// # Safety
    /// The CPU runs AVX2 and FMA.
    #[inline(always)]
    pub(super) unsafe fn exp_shifted_by_max(p: &mut [f32]) -> f32 {
        let whole = p.len() / 8 * 8;
        // SAFETY: vector loads and stores at `i + 8 <= whole <= len`.
        unsafe {
            let mut vmax = _mm256_set1_ps(f32::NEG_INFINITY);
            for i in (0..whole).step_by(8) {
                vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(p.as_ptr().add(i)));
            }
            let max = p[whole..].iter().fold(hmax(vmax), |m, &x| m.max(x));
            let vmax = _mm256_set1_ps(max);
            let mut vsum = _mm256_setzero_ps();
            for i in (0..whole).step_by(8) {
                let e = exp(_mm256_sub_ps(_mm256_loadu_ps(p.as_ptr().add(i)), vmax));
                _mm256_storeu_ps(p.as_mut_ptr().add(i), e);
                vsum = _mm256_add_ps(vsum, e);
            }
            if whole < p.len() {
                let mut tail = [f32::NEG_INFINITY; 8];
                tail[..p.len() - whole].copy_from_slice(&p[whole..]);
                // Lanes past the end hold exp(-inf - max) = 0 and add nothing.
                let e = exp(_mm256_sub_ps(_mm256_loadu_ps(tail.as_ptr()), vmax));
                _mm256_storeu_ps(tail.as_mut_ptr(), e);
                let len = p.len() - whole;
                p[whole..].copy_from_slice(&tail[..len]);
                vsum = _mm256_add_ps(vsum, e);
            }
            hsum(vsum)
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
            crate::simd::hsum(_mm256_add_ps(lo, hi))
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
    shape: &AttentionShape,
) -> Result<Tensor> {
    let outs =
        batch.rows.iter().map(|row| attend_row(q, k_cache, v_cache, batch, row, shape)).collect::<Result<Vec<_>>>()?;
    Tensor::cat(&outs, 0)?.contiguous()
}

/// [`reference_attention`] of one row: its queries `[query_len, heads, d]`.
fn attend_row(
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    batch: &ForwardBatch,
    row: &BatchRow,
    shape: &AttentionShape,
) -> Result<Tensor> {
    let AttentionShape { num_heads, num_kv_heads, head_dim: d, scale, softcap, .. } = *shape;
    let group = num_heads / num_kv_heads;
    let device = q.device();
    let bs = batch.block_size;
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
    let scores = soft_capped((qr.matmul(&k.t()?)? * scale as f64)?.to_dtype(DType::F32)?, softcap)?;
    let bounds: Vec<(usize, usize)> = (0..row.query_len)
        .map(|j| visible_keys(batch.mask, batch.key_limits(), row.cached_len(), row.query_len, j))
        .collect();
    let mut mask = vec![0f32; row.query_len * ctx];
    for (j, &(first, last)) in bounds.iter().enumerate() {
        for x in 0..ctx {
            if x < first || x > last {
                mask[j * ctx + x] = f32::NEG_INFINITY;
            }
        }
    }
    let mask = Tensor::from_vec(mask, (1, row.query_len, ctx), device)?;
    let scores = with_alibi(scores, shape.alibi.as_ref(), &[num_heads, 1, 1], || {
        let distances = bounds.iter().flat_map(|&(_, last)| (0..ctx).map(move |x| x as f32 - last as f32)).collect();
        Tensor::from_vec(distances, (1, row.query_len, ctx), device)
    })?;
    let probs = softmax_with_sinks(&scores.broadcast_add(&mask)?, shape.sinks.as_ref(), &[num_heads, 1, 1])?
        .to_dtype(q.dtype())?;
    // 3. [heads, q_len, d] -> [q_len, heads, d].
    probs.matmul(&v)?.transpose(0, 1)
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
    shape: &AttentionShape,
) -> Result<Tensor> {
    let AttentionShape { num_heads, num_kv_heads, head_dim: d, scale, softcap, .. } = *shape;
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
    let scores = soft_capped(scores, softcap)?.reshape((b, num_kv_heads, group, qn, l))?;
    let scores = with_alibi(scores, shape.alibi.as_ref(), &[1, num_kv_heads, group, 1, 1], || {
        let keys = fixed.key_index.to_dtype(DType::F32)?;
        keys.broadcast_sub(&fixed.last_key.to_dtype(DType::F32)?)?.reshape((b, 1, 1, qn, l))
    })?;
    let visible = fixed
        .key_index
        .broadcast_ge(&fixed.first_key)?
        .mul(&fixed.key_index.broadcast_le(&fixed.last_key)?)?
        .to_dtype(DType::F32)?;
    let additive = ((visible - 1.0)? * MASKED)?.reshape((b, 1, 1, qn, l))?;
    let heads = [1, num_kv_heads, group, 1, 1];
    let probs =
        softmax_with_sinks(&scores.broadcast_add(&additive)?, shape.sinks.as_ref(), &heads)?.to_dtype(q.dtype())?;
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
        let shape = AttentionShape::new(4, 2, 8, 8f32.powf(-0.5));
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

    /// SmolLM2's attention shape (9 heads over 3 kv heads) at head dim `d`.
    fn gqa_shape(d: usize) -> AttentionShape {
        AttentionShape::new(9, 3, d, (d as f32).powf(-0.5))
    }

    /// A one-layer cache of `num_blocks` blocks of 16 slots for `gqa_shape(d)`, every slot
    /// filled: keys spread ×4 (sharper softmaxes), values in [-0.5, 0.5).
    fn filled_cache(d: usize, num_blocks: usize, seed: u64) -> PagedKvCache {
        let cache = PagedKvCache::new(1, num_blocks, 16, 3, d, DType::F32, &Device::Cpu).unwrap();
        let (kc, vc) = cache.layer(0);
        let slots = num_blocks * 16;
        kc.slice_set(&(rand(&[slots, 3 * d], seed) * 4.0).unwrap(), 0, 0).unwrap();
        vc.slice_set(&rand(&[slots, 3 * d], seed + 1), 0, 0).unwrap();
        cache
    }

    /// A step of `rows` laid back to back (their `query_start`s are set here) over a block
    /// table that holds the cache's blocks in reverse order.
    fn step_over_blocks(rows: Vec<BatchRow>, num_blocks: usize) -> ForwardBatch {
        let mut start = 0;
        let rows: Vec<BatchRow> = rows
            .into_iter()
            .map(|r| {
                let r = BatchRow { query_start: start, ..r };
                start += r.query_len;
                r
            })
            .collect();
        ForwardBatch {
            input_ids: vec![0; start],
            positions: vec![0; start],
            rows,
            slot_mapping: vec![0; start],
            block_tables: (0..num_blocks as u32).rev().collect(),
            block_size: 16,
            ..Default::default()
        }
    }

    /// The CPU kernel and the padded path agree with the reference on `shape`; returns the
    /// reference output.
    fn every_path_agrees(q: &Tensor, cache: &PagedKvCache, batch: &ForwardBatch, shape: &AttentionShape) -> Tensor {
        let (kc, vc) = cache.layer(0);
        let slow = reference_attention(q, kc, vc, batch, shape).unwrap();
        let fast = paged_attention(q, kc, vc, batch, shape).unwrap();
        let padded = crate::padded_attention::ragged_attention(q, kc, vc, batch, shape).unwrap();
        for (path, out) in [("CPU kernel", &fast), ("padded", &padded)] {
            let diff = crate::testing::max_abs_diff(out, &slow).unwrap();
            assert!(diff < 1e-5, "{path} {:?}: {diff}", batch.sliding_window);
        }
        slow
    }

    #[test]
    fn cpu_kernel_matches_reference_for_every_mask() {
        for (mask, window) in
            [(AttentionMask::Causal, None), (AttentionMask::Causal, Some(3)), (AttentionMask::BlockNonCausal, None)]
        {
            let (q, cache, batch, shape) = setup(mask, window);
            let (kc, vc) = cache.layer(0);
            let fast = paged_attention(&q, kc, vc, &batch, &shape).unwrap();
            let slow = reference_attention(&q, kc, vc, &batch, &shape).unwrap();
            let diff = crate::testing::max_abs_diff(&fast, &slow).unwrap();
            assert!(diff < 1e-5, "{mask:?} {window:?}: {diff}");
        }
    }

    #[test]
    fn chunked_attention_agrees_on_every_path_and_hides_earlier_chunks() {
        // Chunks of 4: the verify row's queries (keys 5..8) see 4..=own, the prefill row's
        // queries 4 and 5 only themselves and each other.
        let (q, cache, batch, shape) = setup(AttentionMask::Causal, None);
        let chunked = ForwardBatch { attention_chunk: Some(4), ..batch.clone() };
        let slow = every_path_agrees(&q, &cache, &chunked, &shape);
        let (kc, vc) = cache.layer(0);
        let full = reference_attention(&q, kc, vc, &batch, &shape).unwrap();
        // The prefill row's first four queries sit in chunk 0, as under full attention.
        let same = crate::testing::max_abs_diff(&slow.narrow(0, 3, 4).unwrap(), &full.narrow(0, 3, 4).unwrap());
        assert!(same.unwrap() < 1e-6);
        let gap = crate::testing::max_abs_diff(&slow.narrow(0, 7, 2).unwrap(), &full.narrow(0, 7, 2).unwrap());
        assert!(gap.unwrap() > 1e-3, "queries of the second chunk ignore the first");
    }

    #[test]
    fn soft_capped_scores_agree_on_every_path_and_change_the_output() {
        // A cap of 0.3 squeezes scores of up to ~1.5 hard, so a path that skipped it would differ.
        for (mask, window) in [(AttentionMask::Causal, None), (AttentionMask::Causal, Some(3))] {
            let (q, cache, batch, plain) = setup(mask, window);
            let (q, shape) = ((q * 4.0).unwrap(), AttentionShape { softcap: Some(0.3), ..plain.clone() });
            let slow = every_path_agrees(&q, &cache, &batch, &shape);
            let (kc, vc) = cache.layer(0);
            let uncapped = reference_attention(&q, kc, vc, &batch, &plain).unwrap();
            assert!(crate::testing::max_abs_diff(&uncapped, &slow).unwrap() > 1e-2, "the cap changes the output");
        }
    }

    #[test]
    fn attention_sinks_agree_on_every_path_and_only_take_weight_from_the_keys() {
        for (mask, window) in [(AttentionMask::Causal, None), (AttentionMask::Causal, Some(3))] {
            let (q, cache, batch, plain) = setup(mask, window);
            let (kc, vc) = cache.layer(0);
            let with_sinks = |values: [f32; 4]| AttentionShape {
                sinks: Some(AttentionSinks::new(&Tensor::new(&values, &Device::Cpu).unwrap()).unwrap()),
                ..plain.clone()
            };
            let slow = every_path_agrees(&q, &cache, &batch, &with_sinks([0.5, -1.0, 2.0, 0.0]));
            let plain_out = reference_attention(&q, kc, vc, &batch, &plain).unwrap();
            assert!(crate::testing::max_abs_diff(&plain_out, &slow).unwrap() > 1e-2, "the sinks change the output");
            // A sink far below every score takes nothing; far above, it takes everything.
            let silent = paged_attention(&q, kc, vc, &batch, &with_sinks([-1e4; 4])).unwrap();
            assert!(crate::testing::max_abs_diff(&silent, &plain_out).unwrap() < 1e-6);
            let absorbing = paged_attention(&q, kc, vc, &batch, &with_sinks([1e3; 4])).unwrap();
            assert!(absorbing.abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap() < 1e-6);
        }
    }

    #[test]
    fn alibi_agrees_on_every_path_with_blooms_absolute_bias() {
        // BLOOM adds `slope · x` for key `x`; the paths add `slope · (x - last)`. Written out
        // here key by key in BLOOM's form, the outputs must match.
        for (mask, window) in
            [(AttentionMask::Causal, None), (AttentionMask::Causal, Some(3)), (AttentionMask::BlockNonCausal, None)]
        {
            let (q, cache, batch, plain) = setup(mask, window);
            let alibi = AlibiSlopes::geometric(4, 8.0, 4.0, &Device::Cpu).unwrap();
            let shape = AttentionShape { alibi: Some(alibi.clone()), ..plain.clone() };
            let got = every_path_agrees(&q, &cache, &batch, &shape);
            let (kc, vc) = cache.layer(0);
            let (k, v) = (kc.to_vec2::<f32>().unwrap(), vc.to_vec2::<f32>().unwrap());
            let q3 = q.to_vec3::<f32>().unwrap();
            let mut want = vec![0f32; 9 * 4 * 8];
            for row in &batch.rows {
                let table = batch.row_block_table(row);
                let slot = |x: usize| table[x / 4] as usize * 4 + x % 4;
                for j in 0..row.query_len {
                    let (first, last) =
                        visible_keys(batch.mask, batch.key_limits(), row.cached_len(), row.query_len, j);
                    for h in 0..4 {
                        let kv = h / 2;
                        let qv = &q3[row.query_start + j][h];
                        let scores: Vec<f32> = (first..=last)
                            .map(|x| {
                                let key = &k[slot(x)][kv * 8..][..8];
                                let dot: f32 = qv.iter().zip(key).map(|(a, b)| a * b).sum();
                                dot * plain.scale + alibi.host()[h] * x as f32
                            })
                            .collect();
                        let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                        let weights: Vec<f32> = scores.iter().map(|s| (s - max).exp()).collect();
                        let total: f32 = weights.iter().sum();
                        let out = &mut want[((row.query_start + j) * 4 + h) * 8..][..8];
                        for (x, w) in (first..=last).zip(&weights) {
                            for (o, value) in out.iter_mut().zip(&v[slot(x)][kv * 8..][..8]) {
                                *o += w / total * value;
                            }
                        }
                    }
                }
            }
            let want = Tensor::from_vec(want, (9, 4, 8), &Device::Cpu).unwrap();
            assert!(crate::testing::max_abs_diff(&got, &want).unwrap() < 1e-5, "{mask:?} {window:?}");
            let without = reference_attention(&q, kc, vc, &batch, &plain).unwrap();
            assert!(crate::testing::max_abs_diff(&got, &without).unwrap() > 1e-2, "the bias changes the output");
        }
    }

    #[test]
    fn cpu_kernel_matches_reference_at_real_head_dims_and_long_contexts() {
        // The head dims with unrolled register tiles (64, 128) and one with a tail (80), GQA
        // 9 heads over 3 kv heads as in SmolLM2, a decode row and a 4-token verify row over
        // contexts spanning many scattered blocks.
        for d in [64, 80, 128] {
            let shape = gqa_shape(d);
            let cache = filled_cache(d, 40, 4);
            let (kc, vc) = cache.layer(0);
            let row = |query_len, context_len, block_table_start, block_table_len| BatchRow {
                query_start: 0,
                query_len,
                context_len,
                block_table_start,
                block_table_len,
            };
            let batch = step_over_blocks(vec![row(1, 301, 0, 19), row(4, 250, 20, 16)], 40);
            let q = rand(&[5, 9, d], 6);
            let fast = paged_attention(&q, kc, vc, &batch, &shape).unwrap();
            let slow = reference_attention(&q, kc, vc, &batch, &shape).unwrap();
            let diff = crate::testing::max_abs_diff(&fast, &slow).unwrap();
            assert!(diff < 1e-5, "head dim {d}: {diff}");
        }
    }

    #[test]
    fn a_querys_output_does_not_depend_on_the_other_queries_of_the_step() {
        // Lossless verification: the last token of a 4-token verify row must get the same
        // bits as when it is decoded alone (a 1-token row with the same context), at a head dim
        // served by the vector kernel (64), one with a register-tile tail (80) and one the
        // portable path serves (12); the key counts leave short groups of eight.
        for d in [64, 80, 12] {
            let shape = gqa_shape(d);
            let cache = filled_cache(d, 24, 7);
            let (kc, vc) = cache.layer(0);
            let row = |query_len: usize, context_len: usize| BatchRow {
                query_start: 0,
                query_len,
                context_len,
                block_table_start: 0,
                block_table_len: 24,
            };
            let step = |rows: Vec<BatchRow>| step_over_blocks(rows, 24);
            let q = rand(&[5, 9, d], 9);
            for context in [1, 7, 203] {
                // A decode row and a verify row ending at the same position, together.
                let together = step(vec![row(1, context + 3), row(4, context + 3)]);
                let both = paged_attention(&q, kc, vc, &together, &shape).unwrap();
                let alone =
                    paged_attention(&q.narrow(0, 4, 1).unwrap(), kc, vc, &step(vec![row(1, context + 3)]), &shape)
                        .unwrap();
                let verify_last: Vec<f32> = both.get(4).unwrap().flatten_all().unwrap().to_vec1().unwrap();
                let decoded: Vec<f32> = alone.get(0).unwrap().flatten_all().unwrap().to_vec1().unwrap();
                assert!(
                    verify_last.iter().zip(&decoded).all(|(a, b)| a.to_bits() == b.to_bits()),
                    "head dim {d}, context {context}: the verify row's last query differs from decoding it alone"
                );
                let reference = reference_attention(&q, kc, vc, &together, &shape).unwrap();
                let diff = crate::testing::max_abs_diff(&both, &reference).unwrap();
                assert!(diff < 1e-5, "head dim {d}, context {context}: {diff} from the reference");
            }
        }
    }

    #[test]
    fn every_query_of_a_long_row_matches_decoding_it_alone_with_and_without_windows() {
        // A long row (a block drafter's verify, a prefill chunk): each of its queries gets the
        // bits of a 1-token row ending at its position, with and without a sliding window.
        let d = 64;
        let shape = gqa_shape(d);
        let cache = filled_cache(d, 24, 11);
        let (kc, vc) = cache.layer(0);
        let len = 19;
        let q = rand(&[len, 9, d], 12);
        for window in [None, Some(5), Some(40)] {
            let step = |query_len: usize, context_len: usize| {
                let row =
                    BatchRow { query_start: 0, query_len, context_len, block_table_start: 0, block_table_len: 24 };
                ForwardBatch { sliding_window: window, ..step_over_blocks(vec![row], 24) }
            };
            let cached = 150;
            let whole = paged_attention(&q, kc, vc, &step(len, cached + len), &shape).unwrap();
            for j in 0..len {
                let alone =
                    paged_attention(&q.narrow(0, j, 1).unwrap(), kc, vc, &step(1, cached + j + 1), &shape).unwrap();
                let a: Vec<f32> = whole.get(j).unwrap().flatten_all().unwrap().to_vec1().unwrap();
                let b: Vec<f32> = alone.get(0).unwrap().flatten_all().unwrap().to_vec1().unwrap();
                assert!(
                    a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()),
                    "window {window:?}, query {j} of {len}: differs from decoding it alone"
                );
            }
            let reference = reference_attention(&q, kc, vc, &step(len, cached + len), &shape).unwrap();
            let diff = crate::testing::max_abs_diff(&whole, &reference).unwrap();
            assert!(diff < 1e-5, "window {window:?}: {diff} from the reference");
        }
    }

    #[test]
    fn softmax_numerators_match_the_standard_exp() {
        // Lengths with and without a short last group of eight, scores spread over the range
        // where exp underflows.
        for len in [1, 8, 13, 100] {
            let scores: Vec<f32> = (0..len).map(|i| (i as f32 * 7.3) % 120.0 - 100.0).collect();
            let max = scores.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
            let want: Vec<f64> = scores.iter().map(|&x| f64::from(x - max).exp()).collect();
            let mut got = scores.clone();
            let sum = exp_shifted_by_max(&mut got);
            for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
                assert!((f64::from(g) - w).abs() <= 2e-7 * w + 1e-37, "len {len}, [{i}]: {g} vs {w}");
            }
            let want_sum: f64 = want.iter().sum();
            assert!((f64::from(sum) - want_sum).abs() <= 1e-6 * want_sum, "len {len}: sum {sum} vs {want_sum}");
        }
    }

    #[test]
    fn causal_first_prefill_token_sees_only_itself() {
        let (q, cache, batch, shape) = setup(AttentionMask::Causal, None);
        let (kc, vc) = cache.layer(0);
        let out = paged_attention(&q, kc, vc, &batch, &shape).unwrap();
        // Row 1, token 0: its only key is slot 12 (block 3, offset 0): output = that value.
        let v = vc.get(12).unwrap().reshape((2, 8)).unwrap();
        let got = out.get(3).unwrap();
        for h in 0..4 {
            let diff = (got.get(h).unwrap() - v.get(h / 2).unwrap()).unwrap().abs().unwrap().max_all().unwrap();
            assert!(diff.to_scalar::<f32>().unwrap() < 1e-6);
        }
    }
}
