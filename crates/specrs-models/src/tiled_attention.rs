//! Attention of one long row (a prefill chunk, or a row too long to pad) off the CPU, in tiles
//! of bounded size, so a long context never asks for its whole score matrix.
//!
//! The per-row reference ([`crate::attention::reference_attention`]) holds `[heads, queries,
//! keys]` f32 scores and a host-built mask of `queries · keys`: a 2,048-token chunk over a 32k
//! context at 32 heads is 8 GiB. Here the queries are cut into tiles and each query tile walks
//! the keys it can see in key tiles with an online softmax (the running maximum, sum and
//! weighted values of flash attention, as tensor ops): no tile holds more than
//! [`TILE_MAX_SCORES`] scores, key tiles no query of the tile sees are skipped (the upper
//! triangle of a causal chunk, the keys before a sliding window), and the mask of a tile is
//! computed on the device from per-query bounds. Grouped-query heads read their shared key and
//! value head without copies (queries regrouped as `[kv_heads, group · queries, d]`).
//!
//! A row whose scores fit in one tile takes one pass with a plain softmax; the result equals
//! the reference up to summation order.

use candle_core::{D, DType, Device, Result, Tensor};

use crate::alibi::with_alibi;
use crate::attention::{AttentionShape, soft_capped, softmax_with_sinks, visible_keys};
use crate::batch::{BatchRow, ForwardBatch};

/// Score elements (`heads · queries · keys`, f32) one tile may hold: 64 MiB.
pub const TILE_MAX_SCORES: usize = 1 << 24;

/// Keys per tile when a row's scores do not fit in one tile.
pub const KEY_TILE: usize = 2048;

/// Masked fill value: large and finite, so a query tile whose first key tile it cannot see
/// gets weights that the next visible tile's correction factor (`exp(-1e30 - m)` = 0) wipes,
/// rather than NaNs.
const MASKED: f64 = 1e30;

/// How a row is cut: `query_tile` queries against `key_tile` keys at a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TilePlan {
    pub query_tile: usize,
    pub key_tile: usize,
}

impl TilePlan {
    /// The tiles of a row of `queries` queries over `keys` keys at `heads` heads, each tile
    /// holding at most `max_scores` scores (one query tile of one key at the least): the
    /// whole row when it fits, else `KEY_TILE` keys and as many queries as fit beside them.
    pub fn for_row(queries: usize, keys: usize, heads: usize, max_scores: usize) -> Self {
        let (queries, keys, heads) = (queries.max(1), keys.max(1), heads.max(1));
        if heads * queries * keys <= max_scores {
            return Self { query_tile: queries, key_tile: keys };
        }
        let key_tile = keys.min(KEY_TILE).min((max_scores / heads).max(1));
        let query_tile = (max_scores / (heads * key_tile)).clamp(1, queries);
        Self { query_tile, key_tile }
    }
}

/// `q [T, heads, d]` of the row's queries against its visible context in the cache; returns
/// the row's `[query_len, heads, d]`, tiled by [`TilePlan::for_row`] under
/// [`TILE_MAX_SCORES`].
pub fn attend_row_tiled(
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    batch: &ForwardBatch,
    row: &BatchRow,
    shape: &AttentionShape,
) -> Result<Tensor> {
    let plan = TilePlan::for_row(row.query_len, row.context_len, shape.num_heads, TILE_MAX_SCORES);
    attend_row_in_tiles(q, k_cache, v_cache, batch, row, shape, plan)
}

/// [`attend_row_tiled`] with an explicit plan (tests cut small rows into many tiles).
pub fn attend_row_in_tiles(
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    batch: &ForwardBatch,
    row: &BatchRow,
    shape: &AttentionShape,
    plan: TilePlan,
) -> Result<Tensor> {
    let bounds: Vec<(usize, usize)> = (0..row.query_len)
        .map(|j| visible_keys(batch.mask, batch.key_limits(), row.cached_len(), row.query_len, j))
        .collect();
    let row_q = q.narrow(0, row.query_start, row.query_len)?;
    let context = RowContext::new(k_cache, v_cache, batch, row, q.device())?;
    let mut outs = Vec::with_capacity(row.query_len.div_ceil(plan.query_tile));
    for j0 in (0..row.query_len).step_by(plan.query_tile.max(1)) {
        let j1 = (j0 + plan.query_tile).min(row.query_len);
        let tile_q = row_q.narrow(0, j0, j1 - j0)?;
        outs.push(attend_query_tile(&tile_q, &bounds[j0..j1], &context, shape, plan.key_tile)?);
    }
    if outs.len() == 1 { Ok(outs.pop().expect("one tile")) } else { Tensor::cat(&outs, 0) }
}

/// The key tiles `[start, end)` a query tile walks: from the first key any of its queries sees
/// to the last, `key_tile` at a time.
pub fn key_tiles(bounds: &[(usize, usize)], key_tile: usize) -> Vec<(usize, usize)> {
    let first = bounds.iter().map(|b| b.0).min().unwrap_or(0);
    let end = bounds.iter().map(|b| b.1 + 1).max().unwrap_or(0);
    (first..end).step_by(key_tile.max(1)).map(|x0| (x0, (x0 + key_tile).min(end))).collect()
}

/// A row's KV slots and cache tensors.
struct RowContext<'a> {
    k_cache: &'a Tensor,
    v_cache: &'a Tensor,
    /// The cache slot of each key `x < context_len`.
    slots: Vec<u32>,
    device: &'a Device,
}

impl<'a> RowContext<'a> {
    fn new(
        k_cache: &'a Tensor,
        v_cache: &'a Tensor,
        batch: &ForwardBatch,
        row: &BatchRow,
        device: &'a Device,
    ) -> Result<Self> {
        let bs = batch.block_size;
        let table = batch.row_block_table(row);
        let slots = (0..row.context_len).map(|x| table[x / bs] * bs as u32 + (x % bs) as u32).collect();
        Ok(Self { k_cache, v_cache, slots, device })
    }

    /// Keys and values `[start, end)`: each `[kv_heads, keys, d]` in `dtype`.
    fn gather(&self, (start, end): (usize, usize), kv_heads: usize, dtype: DType) -> Result<(Tensor, Tensor)> {
        let n = end - start;
        let slots = Tensor::from_slice(&self.slots[start..end], n, self.device)?;
        let gather = |cache: &Tensor| -> Result<Tensor> {
            let d = cache.dim(1)? / kv_heads;
            cache.index_select(&slots, 0)?.reshape((n, kv_heads, d))?.transpose(0, 1)?.contiguous()?.to_dtype(dtype)
        };
        Ok((gather(self.k_cache)?, gather(self.v_cache)?))
    }
}

/// One query tile `tile_q [n, heads, d]` with each query's visible `[first, last]` keys:
/// returns `[n, heads, d]`.
fn attend_query_tile(
    tile_q: &Tensor,
    bounds: &[(usize, usize)],
    context: &RowContext,
    shape: &AttentionShape,
    key_tile: usize,
) -> Result<Tensor> {
    let AttentionShape { num_heads, num_kv_heads: kv, head_dim: d, scale, softcap, .. } = *shape;
    let group = num_heads / kv;
    let n = bounds.len();
    let device = context.device;
    // [n, heads, d] -> [kv, group · n, d]: the queries of a kv head's group side by side.
    let qg = tile_q.reshape((n, kv, group, d))?.permute((1, 2, 0, 3))?.contiguous()?.reshape((kv, group * n, d))?;
    let mut device_bounds: Option<(Tensor, Tensor)> = None;
    let tiles = key_tiles(bounds, key_tile);
    let single = tiles.len() == 1;
    // The online softmax state, per (kv, group, query): running max, sum and weighted values.
    let mut state: Option<(Tensor, Tensor, Tensor)> = None;
    for &(x0, x1) in &tiles {
        let (k, v) = context.gather((x0, x1), kv, tile_q.dtype())?;
        // 1. Scores [kv, group, n, keys] with the tile's visibility mask.
        let scores = (qg.matmul(&k.t()?)? * f64::from(scale))?.to_dtype(DType::F32)?;
        let scores = soft_capped(scores, softcap)?.reshape((kv, group, n, x1 - x0))?;
        let scores = with_alibi(scores, shape.alibi.as_ref(), &[kv, group, 1, 1], || {
            let keys =
                Tensor::arange(x0 as u32, x1 as u32, device)?.to_dtype(DType::F32)?.reshape((1, 1, 1, x1 - x0))?;
            let lasts: Vec<f32> = bounds.iter().map(|b| b.1 as f32).collect();
            keys.broadcast_sub(&Tensor::from_vec(lasts, (1, 1, n, 1), device)?)
        })?;
        let scores = scores.broadcast_add(&tile_mask(bounds, (x0, x1), device, &mut device_bounds)?)?;
        // [kv, group, n, keys] · [kv, keys, d] -> [kv, group, n, d], in the queries' dtype.
        let weighted = |p: &Tensor| -> Result<Tensor> {
            p.to_dtype(tile_q.dtype())?.reshape((kv, group * n, x1 - x0))?.matmul(&v)?.reshape((kv, group, n, d))
        };
        if single {
            let probs = softmax_with_sinks(&scores, shape.sinks.as_ref(), &[kv, group, 1, 1])?;
            return finish(&weighted(&probs)?, tile_q.dtype(), n, num_heads, d);
        }
        // Across tiles the weighted values accumulate in f32.
        let weighted = |p: &Tensor| weighted(p)?.to_dtype(DType::F32);
        // 2. Online softmax: rescale what the earlier tiles summed to this tile's maximum.
        let tile_max = scores.max_keepdim(D::Minus1)?;
        state = Some(match state.take() {
            None => {
                let p = scores.broadcast_sub(&tile_max)?.exp()?;
                (tile_max, p.sum_keepdim(D::Minus1)?, weighted(&p)?)
            }
            Some((max, sum, acc)) => {
                let new_max = max.maximum(&tile_max)?;
                let correction = (max - &new_max)?.exp()?;
                let p = scores.broadcast_sub(&new_max)?.exp()?;
                let sum = ((sum * &correction)? + p.sum_keepdim(D::Minus1)?)?;
                let acc = (acc.broadcast_mul(&correction)? + weighted(&p)?)?;
                (new_max, sum, acc)
            }
        });
    }
    let (max, sum, acc) = state.expect("every query sees at least its own key");
    // 3. A sink counts once more in the denominator, at the shared maximum.
    let (sum, acc) = match &shape.sinks {
        Some(sinks) => {
            let sink = sinks.column(&[kv, group, 1, 1], max.dims())?;
            let new_max = max.maximum(&sink)?;
            let correction = (max - &new_max)?.exp()?;
            (((sum * &correction)? + (sink - new_max)?.exp()?)?, acc.broadcast_mul(&correction)?)
        }
        None => (sum, acc),
    };
    finish(&acc.broadcast_div(&sum)?, tile_q.dtype(), n, num_heads, d)
}

/// Mask elements of a tile built on the host and uploaded whole (one copy instead of a chain
/// of small kernels, which at batch 1 cost more than the copy); larger tiles build theirs on
/// the device.
const HOST_MASK_MAX: usize = 1 << 16;

/// The additive mask `[1, 1, n, keys]` of key tile `[x0, x1)` for queries seeing `bounds`:
/// 0 where visible, `-MASKED` elsewhere. `device_bounds` caches the bounds uploaded for the
/// device-built masks of a query tile.
fn tile_mask(
    bounds: &[(usize, usize)],
    (x0, x1): (usize, usize),
    device: &Device,
    device_bounds: &mut Option<(Tensor, Tensor)>,
) -> Result<Tensor> {
    let (n, keys) = (bounds.len(), x1 - x0);
    if n * keys <= HOST_MASK_MAX {
        let mask: Vec<f32> = bounds
            .iter()
            .flat_map(|&(first, last)| {
                (x0..x1).map(move |x| if (first..=last).contains(&x) { 0.0 } else { -MASKED as f32 })
            })
            .collect();
        return Tensor::from_vec(mask, (1, 1, n, keys), device);
    }
    if device_bounds.is_none() {
        let firsts: Vec<u32> = bounds.iter().map(|b| b.0 as u32).collect();
        let lasts: Vec<u32> = bounds.iter().map(|b| b.1 as u32).collect();
        *device_bounds =
            Some((Tensor::from_vec(firsts, (1, 1, n, 1), device)?, Tensor::from_vec(lasts, (1, 1, n, 1), device)?));
    }
    let (first, last) = device_bounds.as_ref().expect("just set");
    let index = Tensor::arange(x0 as u32, x1 as u32, device)?.reshape((1, 1, 1, keys))?;
    let visible = index.broadcast_ge(first)?.mul(&index.broadcast_le(last)?)?.to_dtype(DType::F32)?;
    (visible - 1.0)? * MASKED
}

/// `[kv, group, n, d]` -> `[n, heads, d]` in `dtype`.
fn finish(out: &Tensor, dtype: DType, n: usize, heads: usize, d: usize) -> Result<Tensor> {
    out.permute((2, 0, 1, 3))?.contiguous()?.reshape((n, heads, d))?.to_dtype(dtype)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alibi::AlibiSlopes;
    use crate::attention::{AttentionSinks, reference_attention};
    use crate::batch::AttentionMask;
    use crate::kv_cache::PagedKvCache;

    const SHAPE: AttentionShape = AttentionShape::new(6, 2, 8, 0.35);

    /// The device the tiles run on: `SPECRS_TEST_DEVICE=cuda` runs them on GPU 0 (CUDA builds,
    /// the `gpu-check` subset); the reference always runs on the CPU.
    fn device() -> Device {
        match std::env::var("SPECRS_TEST_DEVICE").as_deref() {
            Ok("cuda") => Device::new_cuda(0).expect("SPECRS_TEST_DEVICE=cuda needs a CUDA build and a GPU"),
            _ => Device::Cpu,
        }
    }

    /// A cache of 64 blocks of 4 slots, every slot filled (keys spread ×3 for sharp softmaxes),
    /// one row of `query_len` queries over `context_len` keys through a scattered block table,
    /// and its queries.
    fn long_row(query_len: usize, context_len: usize) -> (PagedKvCache, ForwardBatch, Tensor) {
        let cache = PagedKvCache::new(1, 64, 4, 2, 8, DType::F32, &Device::Cpu).unwrap();
        let (kc, vc) = cache.layer(0);
        kc.slice_set(&(crate::testing::random_tensor(&[256, 16], 0.5, 1).unwrap() * 3.0).unwrap(), 0, 0).unwrap();
        vc.slice_set(&crate::testing::random_tensor(&[256, 16], 0.5, 2).unwrap(), 0, 0).unwrap();
        let blocks = context_len.div_ceil(4);
        let batch = ForwardBatch {
            input_ids: vec![0; query_len],
            positions: vec![0; query_len],
            slot_mapping: vec![0; query_len],
            rows: vec![BatchRow {
                query_start: 0,
                query_len,
                context_len,
                block_table_start: 0,
                block_table_len: blocks,
            }],
            block_tables: (0..blocks as u32).map(|b| (b * 23) % 64).collect(),
            block_size: 4,
            ..Default::default()
        };
        let q = crate::testing::random_tensor(&[query_len, 6, 8], 0.5, 3).unwrap();
        (cache, batch, q)
    }

    #[test]
    fn tiles_of_every_size_give_the_reference_under_every_mask() {
        // A 37-token chunk over 50 cached keys: one tile, tiles that split queries only, keys
        // only, both, and single keys; causal, sliding windows shorter and longer than a key
        // tile, and a block drafter's non-causal block; with Gemma 2's score soft cap,
        // gpt-oss's sinks and BLOOM's ALiBi too.
        let (cache, batch, q) = long_row(37, 87);
        let (kc, vc) = cache.layer(0);
        let row = batch.rows[0].clone();
        let dev = device();
        let (kc_dev, vc_dev, q_dev) =
            (kc.to_device(&dev).unwrap(), vc.to_device(&dev).unwrap(), q.to_device(&dev).unwrap());
        for (mask, window, chunk) in [
            (AttentionMask::Causal, None, None),
            (AttentionMask::Causal, Some(5), None),
            (AttentionMask::Causal, Some(30), None),
            (AttentionMask::Causal, None, Some(16)),
            (AttentionMask::BlockNonCausal, None, None),
        ] {
            let batch = ForwardBatch { mask, sliding_window: window, attention_chunk: chunk, ..batch.clone() };
            let sinks = AttentionSinks::new(&Tensor::new(&[0.5f32, -1.0, 2.0, 0.0, 1.0, -0.5], &dev).unwrap()).unwrap();
            let (capped, sunk) =
                (AttentionShape { softcap: Some(0.5), ..SHAPE }, AttentionShape { sinks: Some(sinks), ..SHAPE });
            let alibi = AttentionShape { alibi: Some(AlibiSlopes::geometric(6, 8.0, 1.0, &dev).unwrap()), ..SHAPE };
            for shape in [SHAPE, capped, sunk, alibi] {
                let reference = reference_attention(&q, kc, vc, &batch, &shape).unwrap();
                for (query_tile, key_tile) in [(37, 87), (5, 87), (37, 9), (4, 7), (1, 1), (16, 64)] {
                    let plan = TilePlan { query_tile, key_tile };
                    let tiled = attend_row_in_tiles(&q_dev, &kc_dev, &vc_dev, &batch, &row, &shape, plan).unwrap();
                    let diff =
                        crate::testing::max_abs_diff(&tiled.to_device(&Device::Cpu).unwrap(), &reference).unwrap();
                    let what = (shape.softcap, shape.sinks.is_some(), shape.alibi.is_some());
                    assert!(
                        diff < 1e-5,
                        "{mask:?} {window:?} {chunk:?} (cap, sinks, alibi) {what:?} tiles {query_tile}x{key_tile}: {diff}"
                    );
                }
            }
        }
    }

    #[test]
    fn half_precision_tiles_track_the_f32_reference() {
        // f16 (and bf16 on CUDA; candle's CPU matmul has no bf16) queries and cache: scores
        // and weighted values accumulate in f32 across tiles.
        let dev = device();
        let (cache, batch, q) = long_row(37, 87);
        let (kc, vc) = cache.layer(0);
        let reference = reference_attention(&q, kc, vc, &batch, &SHAPE).unwrap();
        let dtypes: &[DType] = if dev.is_cpu() { &[DType::F16] } else { &[DType::BF16, DType::F16] };
        for &dtype in dtypes {
            let on_dev = |t: &Tensor| t.to_device(&dev).unwrap().to_dtype(dtype).unwrap();
            let plan = TilePlan { query_tile: 5, key_tile: 16 };
            let tiled =
                attend_row_in_tiles(&on_dev(&q), &on_dev(kc), &on_dev(vc), &batch, &batch.rows[0], &SHAPE, plan)
                    .unwrap();
            let tiled = tiled.to_dtype(DType::F32).unwrap().to_device(&Device::Cpu).unwrap();
            let diff = crate::testing::max_abs_diff(&tiled, &reference).unwrap();
            assert!(diff < 5e-3, "{dtype:?}: {diff}");
        }
    }

    #[test]
    fn masks_built_on_the_host_and_on_the_device_agree() {
        // Causal queries under a window, tiles small enough for the host and too large for it.
        let bounds: Vec<(usize, usize)> =
            (0..300).map(|j| visible_keys(AttentionMask::Causal, (Some(150), None), 200, 300, j)).collect();
        let dev = device();
        for tile in [(0, 250), (180, 420), (0, 500)] {
            let host = tile_mask(&bounds[..8], tile, &Device::Cpu, &mut None).unwrap();
            assert!(8 * (tile.1 - tile.0) <= HOST_MASK_MAX);
            let mut cached = None;
            let on_device = tile_mask(&bounds, tile, &dev, &mut cached).unwrap();
            assert!(300 * (tile.1 - tile.0) > HOST_MASK_MAX, "{tile:?} must take the device path");
            assert!(cached.is_some());
            let narrowed = on_device.narrow(2, 0, 8).unwrap().to_device(&Device::Cpu).unwrap();
            assert_eq!(crate::testing::max_abs_diff(&host, &narrowed).unwrap(), 0.0, "{tile:?}");
        }
    }

    #[test]
    fn a_row_in_a_batch_reads_its_own_queries_and_blocks() {
        // The second row of a step: its queries start at the first row's end.
        let (cache, mut batch, q) = long_row(12, 40);
        let (kc, vc) = cache.layer(0);
        batch.rows.insert(
            0,
            BatchRow { query_start: 0, query_len: 3, context_len: 9, block_table_start: 0, block_table_len: 3 },
        );
        batch.rows[1].query_start = 3;
        let q = Tensor::cat(&[&crate::testing::random_tensor(&[3, 6, 8], 0.5, 9).unwrap(), &q], 0).unwrap();
        let reference = reference_attention(&q, kc, vc, &batch, &SHAPE).unwrap().narrow(0, 3, 12).unwrap();
        let plan = TilePlan { query_tile: 5, key_tile: 6 };
        let tiled = attend_row_in_tiles(&q, kc, vc, &batch, &batch.rows[1], &SHAPE, plan).unwrap();
        let diff = crate::testing::max_abs_diff(&tiled, &reference).unwrap();
        assert!(diff < 1e-5, "{diff}");
    }

    #[test]
    fn plans_hold_at_most_the_cap_and_keep_rows_that_fit_whole() {
        // A 2,048-token chunk over a 32k context at 32 heads would be 2^31 scores whole.
        let plan = TilePlan::for_row(2048, 32_768, 32, TILE_MAX_SCORES);
        assert!(32 * plan.query_tile * plan.key_tile <= TILE_MAX_SCORES, "{plan:?}");
        assert_eq!(plan, TilePlan { query_tile: 256, key_tile: KEY_TILE });
        // Small rows are one tile; a decode row over a long context splits only its keys.
        assert_eq!(TilePlan::for_row(20, 300, 9, TILE_MAX_SCORES), TilePlan { query_tile: 20, key_tile: 300 });
        let decode = TilePlan::for_row(1, 4_000_000, 32, TILE_MAX_SCORES);
        assert_eq!(decode, TilePlan { query_tile: 1, key_tile: KEY_TILE });
        // More heads than the cap allows beside one key still make progress, a key at a time.
        assert_eq!(TilePlan::for_row(3, 10, 64, 16), TilePlan { query_tile: 1, key_tile: 1 });
    }

    #[test]
    fn key_tiles_skip_what_no_query_of_the_tile_sees() {
        // Queries 40..44 of a causal chunk under a 6-key window see keys 35..=44 only.
        let bounds: Vec<(usize, usize)> =
            (40..44).map(|own| visible_keys(AttentionMask::Causal, (Some(6), None), 0, 100, own)).collect();
        assert_eq!(bounds.first(), Some(&(35, 40)));
        assert_eq!(key_tiles(&bounds, 4), vec![(35, 39), (39, 43), (43, 44)]);
        // Without a window a causal query tile stops at its last query's own key.
        let causal: Vec<(usize, usize)> =
            (0..3).map(|j| visible_keys(AttentionMask::Causal, (None, None), 10, 8, j)).collect();
        assert_eq!(key_tiles(&causal, 8), vec![(0, 8), (8, 13)]);
        // Llama 4's chunks of 16: queries at 30..34 see their chunk's keys from 16, then from 32;
        // a window narrower than the chunk's start binds instead.
        let chunked: Vec<(usize, usize)> =
            (0..4).map(|j| visible_keys(AttentionMask::Causal, (None, Some(16)), 30, 4, j)).collect();
        assert_eq!(chunked, vec![(16, 30), (16, 31), (32, 32), (32, 33)]);
        assert_eq!(visible_keys(AttentionMask::Causal, (Some(4), Some(16)), 30, 4, 0), (27, 30));
    }
}
