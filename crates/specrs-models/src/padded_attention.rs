//! Attention of a ragged step off the CPU, with few kernel launches.
//!
//! Attending row by row costs a dozen kernels per row and layer, so at batch 128 a step's
//! attention alone is tens of thousands of launches. Here the short rows (decode rows and
//! verify rows, at most [`PADDED_MAX_QUERY`] queries) are sorted by context length and
//! padded into groups of a common shape, each group one [`fixed_attention`] call; the long
//! rows (prefill chunks), whose padding would cost more than their launches, attend alone
//! in bounded tiles ([`attend_row_tiled`]), as does a short row with no other to share a
//! group or whose scores alone exceed [`PADDED_MAX_SCORES`]. One gather puts every token's
//! output back in batch order.
//!
//! The layout (key slots, visibility bounds, gather indices) depends only on the batch, so it
//! is built and uploaded once per step and reused by every layer: the last layout is kept per
//! thread with the batch fields it was built from.

use std::cell::RefCell;
use std::rc::Rc;

use candle_core::{DeviceLocation, Result, Tensor};

use crate::attention::{AttentionShape, FixedAttention, fixed_attention, visible_keys};
use crate::batch::{AttentionMask, BatchRow, ForwardBatch};
use crate::tiled_attention::attend_row_tiled;

/// Rows with at most this many queries attend in padded groups; longer rows attend alone.
pub const PADDED_MAX_QUERY: usize = 16;

/// Score elements (`rows · heads · queries · keys`, f32) one padded call may allocate; larger
/// groups are split so long contexts never ask for gigabytes of scores.
pub const PADDED_MAX_SCORES: usize = 1 << 27;

/// `q [T, heads, d]` of a ragged step against the cached keys and values of a layer (this
/// step's already written). Returns `[T, heads, d]`, the same values as
/// [`crate::attention::reference_attention`] up to summation order.
pub fn ragged_attention(
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    batch: &ForwardBatch,
    shape: &AttentionShape,
) -> Result<Tensor> {
    let layout = PaddedLayout::for_step(batch, shape.num_heads, q.device())?;
    let mut outs = Vec::with_capacity(layout.groups.len() + layout.long_rows.len());
    for group in &layout.groups {
        let q_padded = q.index_select(&group.query_index, 0)?;
        outs.push(fixed_attention(&q_padded, k_cache, v_cache, &group.fixed, shape)?);
    }
    for &r in &layout.long_rows {
        outs.push(attend_row_tiled(q, k_cache, v_cache, batch, &batch.rows[r], shape)?);
    }
    let all = if outs.len() == 1 { outs.pop().expect("one output") } else { Tensor::cat(&outs, 0)? };
    if layout.is_identity { all.contiguous() } else { all.index_select(&layout.order, 0) }
}

/// One padded group: `rows` short rows of up to `queries` queries over up to `keys` keys.
struct PaddedGroup {
    fixed: FixedAttention,
    /// `[rows · queries]` u32: the batch token each padded query reads (padding queries
    /// repeat their row's first token; their outputs are dropped).
    query_index: Tensor,
}

/// How one step's attention runs: the padded groups, the long rows, and where each token's
/// output sits in the groups' outputs followed by the long rows' outputs.
struct PaddedLayout {
    groups: Vec<PaddedGroup>,
    /// Indices into `batch.rows` of the rows that attend alone, in output order.
    long_rows: Vec<usize>,
    /// `[T]` u32: token `t`'s position in the concatenated outputs.
    order: Tensor,
    /// The concatenated outputs are already in batch order (`order` is `0..T`).
    is_identity: bool,
}

/// The batch fields a layout is built from: equal keys give equal layouts.
#[derive(PartialEq)]
struct LayoutKey {
    rows: Vec<BatchRow>,
    block_tables: Vec<u32>,
    block_size: usize,
    mask: AttentionMask,
    sliding_window: Option<usize>,
    attention_chunk: Option<usize>,
    num_heads: usize,
    device: DeviceLocation,
}

thread_local! {
    /// The last step's layout: every layer of a forward pass asks for the same one.
    static LAST_LAYOUT: RefCell<Option<(LayoutKey, Rc<PaddedLayout>)>> = const { RefCell::new(None) };
}

impl PaddedLayout {
    fn for_step(batch: &ForwardBatch, num_heads: usize, device: &candle_core::Device) -> Result<Rc<Self>> {
        let key = LayoutKey {
            rows: batch.rows.clone(),
            block_tables: batch.block_tables.clone(),
            block_size: batch.block_size,
            mask: batch.mask,
            sliding_window: batch.sliding_window,
            attention_chunk: batch.attention_chunk,
            num_heads,
            device: device.location(),
        };
        if let Some(layout) =
            LAST_LAYOUT.with_borrow(|last| last.as_ref().filter(|(k, _)| *k == key).map(|(_, l)| l.clone()))
        {
            return Ok(layout);
        }
        let layout = Rc::new(Self::build(batch, num_heads, device)?);
        LAST_LAYOUT.set(Some((key, layout.clone())));
        Ok(layout)
    }

    fn build(batch: &ForwardBatch, num_heads: usize, device: &candle_core::Device) -> Result<Self> {
        let num_tokens: usize = batch.rows.iter().map(|r| r.query_len).sum();
        // A short row over a context so long that its scores alone pass the cap attends in
        // tiles too: a group always takes its first row, whatever that row's size.
        let paddable = |row: &BatchRow| {
            row.query_len <= PADDED_MAX_QUERY && num_heads * row.query_len * row.context_len <= PADDED_MAX_SCORES
        };
        let (mut short, mut long_rows): (Vec<usize>, Vec<usize>) =
            (0..batch.rows.len()).partition(|&r| paddable(&batch.rows[r]));
        if short.len() == 1 {
            // One short row gains nothing from padding, and alone it takes fewer kernels.
            long_rows.append(&mut short);
            long_rows.sort_unstable();
        }
        // Longest contexts first, so each group pads its keys to rows of similar length.
        short.sort_by_key(|&r| std::cmp::Reverse(batch.rows[r].context_len));
        let mut order = vec![0u32; num_tokens];
        let mut emitted = 0usize;
        let mut groups = Vec::new();
        let mut start = 0;
        while start < short.len() {
            // The first row has the longest context; grow the group while its scores fit.
            let keys = batch.rows[short[start]].context_len;
            let mut queries = 0;
            let mut end = start;
            while end < short.len() {
                let q = queries.max(batch.rows[short[end]].query_len);
                if end > start && (end + 1 - start) * num_heads * q * keys > PADDED_MAX_SCORES {
                    break;
                }
                queries = q;
                end += 1;
            }
            let members = &short[start..end];
            groups.push(Self::group(batch, members, queries, keys, device)?);
            for (i, &r) in members.iter().enumerate() {
                let row = &batch.rows[r];
                for j in 0..row.query_len {
                    order[row.query_start + j] = (emitted + i * queries + j) as u32;
                }
            }
            emitted += members.len() * queries;
            start = end;
        }
        for &r in &long_rows {
            let row = &batch.rows[r];
            for j in 0..row.query_len {
                order[row.query_start + j] = (emitted + j) as u32;
            }
            emitted += row.query_len;
        }
        let is_identity = order.iter().enumerate().all(|(t, &o)| o as usize == t) && emitted == num_tokens;
        Ok(Self { groups, long_rows, order: Tensor::from_vec(order, num_tokens, device)?, is_identity })
    }

    /// The padded layout of `members` (indices into `batch.rows`).
    fn group(
        batch: &ForwardBatch,
        members: &[usize],
        queries: usize,
        keys: usize,
        device: &candle_core::Device,
    ) -> Result<PaddedGroup> {
        let rows = members.len();
        let bs = batch.block_size;
        let mut key_slots = Vec::with_capacity(rows * keys);
        let mut first_key = Vec::with_capacity(rows * queries);
        let mut last_key = Vec::with_capacity(rows * queries);
        let mut query_index = Vec::with_capacity(rows * queries);
        for &r in members {
            let row = &batch.rows[r];
            let table = batch.row_block_table(row);
            let slot = |x: usize| table[x / bs] * bs as u32 + (x % bs) as u32;
            // Keys past the row's context read its key 0 (a written, finite slot); the mask
            // hides them.
            key_slots.extend((0..keys).map(|x| if x < row.context_len { slot(x) } else { slot(0) }));
            for j in 0..queries {
                if j < row.query_len {
                    let (first, last) =
                        visible_keys(batch.mask, batch.key_limits(), row.cached_len(), row.query_len, j);
                    first_key.push(first as u32);
                    last_key.push(last as u32);
                    query_index.push((row.query_start + j) as u32);
                } else {
                    first_key.push(0);
                    last_key.push(0);
                    query_index.push(row.query_start as u32);
                }
            }
        }
        let fixed = FixedAttention {
            rows,
            queries,
            keys,
            key_slots: Tensor::from_vec(key_slots, rows * keys, device)?,
            first_key: Tensor::from_vec(first_key, (rows, queries, 1), device)?,
            last_key: Tensor::from_vec(last_key, (rows, queries, 1), device)?,
            key_index: Tensor::arange(0u32, keys as u32, device)?.reshape((1, 1, keys))?,
        };
        Ok(PaddedGroup { fixed, query_index: Tensor::from_vec(query_index, rows * queries, device)? })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::reference_attention;
    use crate::kv_cache::PagedKvCache;
    use candle_core::{DType, Device};

    /// Uniform values in [-0.5, 0.5).
    fn rand(shape: &[usize], seed: u64) -> Tensor {
        crate::testing::random_tensor(shape, 0.5, seed).unwrap()
    }

    const SHAPE: AttentionShape = AttentionShape::new(6, 2, 8, 0.35);

    /// A cache of 80 blocks of 4 slots, every slot filled, and a step over `rows` (query
    /// lengths and context lengths), each row's blocks taken from a shuffled pool.
    fn step(rows: &[(usize, usize)]) -> (PagedKvCache, ForwardBatch, Tensor) {
        let cache = PagedKvCache::new(1, 80, 4, 2, 8, DType::F32, &Device::Cpu).unwrap();
        let (kc, vc) = cache.layer(0);
        kc.slice_set(&(rand(&[320, 16], 1) * 3.0).unwrap(), 0, 0).unwrap();
        vc.slice_set(&rand(&[320, 16], 2), 0, 0).unwrap();
        let mut batch = ForwardBatch { block_size: 4, ..Default::default() };
        let mut pool: Vec<u32> = (0..80).map(|b| (b * 17) % 80).collect();
        let mut query_start = 0;
        for &(query_len, context_len) in rows {
            let blocks = context_len.div_ceil(4);
            batch.rows.push(BatchRow {
                query_start,
                query_len,
                context_len,
                block_table_start: batch.block_tables.len(),
                block_table_len: blocks,
            });
            batch.block_tables.extend(pool.drain(..blocks));
            query_start += query_len;
        }
        batch.input_ids = vec![0; query_start];
        batch.positions = vec![0; query_start];
        batch.slot_mapping = vec![0; query_start];
        let q = rand(&[query_start, 6, 8], 3);
        (cache, batch, q)
    }

    /// Largest difference between the padded attention of a step and the reference's.
    fn gap_to_reference(cache: &PagedKvCache, batch: &ForwardBatch, q: &Tensor) -> f32 {
        let (kc, vc) = cache.layer(0);
        let padded = ragged_attention(q, kc, vc, batch, &SHAPE).unwrap();
        let reference = reference_attention(q, kc, vc, batch, &SHAPE).unwrap();
        assert_eq!(padded.dims(), reference.dims());
        crate::testing::max_abs_diff(&padded, &reference).unwrap()
    }

    #[test]
    fn padded_groups_and_long_rows_give_the_reference_outputs_in_batch_order() {
        // Decode rows, verify rows and a prefill chunk longer than PADDED_MAX_QUERY, with
        // contexts in no order, under every mask.
        let rows = [(1, 9), (4, 30), (20, 22), (1, 3), (3, 17), (1, 31)];
        for (mask, window, chunk) in [
            (AttentionMask::Causal, None, None),
            (AttentionMask::Causal, Some(5), None),
            (AttentionMask::Causal, None, Some(8)),
            (AttentionMask::BlockNonCausal, None, None),
        ] {
            let (cache, batch, q) = step(&rows);
            let batch = ForwardBatch { mask, sliding_window: window, attention_chunk: chunk, ..batch };
            let diff = gap_to_reference(&cache, &batch, &q);
            assert!(diff < 1e-5, "{mask:?} {window:?} {chunk:?}: {diff}");
        }
    }

    #[test]
    fn groups_split_when_their_scores_would_exceed_the_cap() {
        // Eight decode and verify rows at 6 heads fit one group, padded to the widest row and
        // the longest context; with enough heads that no two rows fit under the cap, each
        // row gets a group of its own.
        let rows: Vec<(usize, usize)> = (0..8).map(|i| (1 + i % 3, 20 + 3 * i)).collect();
        let (cache, batch, q) = step(&rows);
        let layout = PaddedLayout::build(&batch, SHAPE.num_heads, &Device::Cpu).unwrap();
        assert_eq!(layout.groups.len(), 1);
        assert!(layout.long_rows.is_empty());
        let fixed = &layout.groups[0].fixed;
        assert_eq!(
            (fixed.rows, fixed.queries, fixed.keys),
            (8, 3, 41),
            "padded to the widest row and the longest context"
        );
        let diff = gap_to_reference(&cache, &batch, &q);
        assert!(diff < 1e-5, "{diff}");
        // Rows whose padded scores exceed the cap go to separate groups, and a row whose own
        // scores exceed it (queries · context > 82 here: rows 5 and 7) attends in tiles.
        let heads = PADDED_MAX_SCORES / (2 * 41) + 1;
        let split = PaddedLayout::build(&batch, heads, &Device::Cpu).unwrap();
        assert_eq!(split.groups.len(), 6);
        assert!(split.groups.iter().all(|g| g.fixed.rows == 1));
        assert!(split.groups.iter().all(|g| heads * g.fixed.queries * g.fixed.keys <= PADDED_MAX_SCORES));
        assert_eq!(split.long_rows, [5, 7]);
    }

    #[test]
    fn a_lone_decode_row_attends_without_padding() {
        let (cache, batch, q) = step(&[(1, 9), (20, 22)]);
        let layout = PaddedLayout::build(&batch, SHAPE.num_heads, &Device::Cpu).unwrap();
        assert!(layout.groups.is_empty());
        assert_eq!(layout.long_rows, [0, 1]);
        assert!(layout.is_identity);
        let diff = gap_to_reference(&cache, &batch, &q);
        assert!(diff < 1e-6, "{diff}");
    }

    #[test]
    fn a_step_reuses_its_layout_across_layers_and_a_new_step_rebuilds_it() {
        let (_cache, batch, _q) = step(&[(1, 9), (2, 12)]);
        let a = PaddedLayout::for_step(&batch, 6, &Device::Cpu).unwrap();
        let b = PaddedLayout::for_step(&batch, 6, &Device::Cpu).unwrap();
        assert!(Rc::ptr_eq(&a, &b), "the second layer reuses the first layer's layout");
        let mut next = batch.clone();
        next.rows[0].context_len += 1; // the next step of the same rows: one key more
        let c = PaddedLayout::for_step(&next, 6, &Device::Cpu).unwrap();
        assert!(!Rc::ptr_eq(&a, &c), "a changed batch gets a new layout");
    }
}
