//! Device-graph capture of decode/verify steps, per (batch size, verify width).
//!
//! A decode step of a small batch launches hundreds of short kernels; on a GPU the launches,
//! not the kernels, set its time. A CUDA graph records the step once and replays it with one
//! launch. Replay re-runs the recorded kernels on the recorded buffers, so a capturable step
//! (1) has fixed shapes: `B` rows of exactly `W + 1` query tokens attending to at most `L`
//! keys, the batch padded up to a captured size; (2) reads every step-varying value from
//! persistent device buffers written before replay ([`StepInputs`]), never from a host
//! upload inside the step; (3) keeps nothing allocated inside the graph alive after it.
//!
//! This module holds the device-independent parts, tested on CPU:
//! - [`CapturePlan`]: which `(batch, width)` keys to capture, honouring the architecture's
//!   `supports_device_graph_capture` and the width policy's captured widths (the adaptive
//!   controller captures every candidate width from `adaptive_speculative_min_batch_size` up
//!   and only the widest below it; a narrow choice for a small batch rounds up to a captured
//!   width), and which captured key serves a step;
//! - [`StepInputs`]: the persistent buffers of one key and how a ragged [`ForwardBatch`] is
//!   laid into them; the step itself is `CausalLm::forward_fixed`, built from device ops on
//!   fixed shapes (`attention::fixed_attention`).
//!
//! The capture and replay themselves ([`cuda::StepGraph`], behind the `cuda` feature) use
//! cudarc's stream capture with candle's capture-safety caches. Without a GPU in this
//! project's build machines they compile but have not been run; see docs/CUDA.md.

use std::collections::BTreeSet;

use candle_core::{DType, Device, Result, Tensor};
use specrs_core::width::{AdaptiveWidthController, VerifyWidthSchedule};

use crate::attention::FixedAttention;
use crate::batch::{AttentionMask, ForwardBatch};

/// One captured step shape: `batch` rows verifying `width` drafts each (`width + 1` tokens).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GraphKey {
    pub batch: usize,
    pub width: usize,
}

impl GraphKey {
    /// Query tokens per row.
    pub fn queries(&self) -> usize {
        self.width + 1
    }

    pub fn num_tokens(&self) -> usize {
        self.batch * self.queries()
    }
}

/// Where a pipeline's verify widths come from.
#[derive(Clone, Copy)]
pub enum WidthSource<'a> {
    /// Plain decoding (width 0) or a fixed `K`.
    Fixed(usize),
    /// `num_speculative_tokens_per_batch_size`.
    Schedule(&'a VerifyWidthSchedule),
    /// `adaptive_speculative_widths`.
    Adaptive(&'a AdaptiveWidthController),
}

impl WidthSource<'_> {
    /// The widths a decode step of exactly `batch` rows may verify.
    fn widths_at(&self, batch: usize) -> Vec<usize> {
        match self {
            Self::Fixed(k) => vec![*k],
            Self::Schedule(s) => vec![s.width_for(batch)],
            Self::Adaptive(c) => c.captured_widths(batch),
        }
    }
}

/// The graphs a pipeline captures and how steps map onto them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapturePlan {
    /// Captured keys, sorted by batch then width.
    keys: BTreeSet<GraphKey>,
}

impl CapturePlan {
    /// Plans capture for decode batches up to `max_batch`: batch sizes 1, 2, 4, … (powers of
    /// two) and `max_batch` itself; at each, every width a batch it serves may verify. Empty
    /// when the architecture does not support device-graph capture.
    pub fn new(supports_device_graph_capture: bool, max_batch: usize, widths: WidthSource<'_>) -> Self {
        let mut keys = BTreeSet::new();
        if !supports_device_graph_capture || max_batch == 0 {
            return Self { keys };
        }
        let mut buckets: Vec<usize> =
            std::iter::successors(Some(1usize), |b| b.checked_mul(2)).take_while(|&b| b < max_batch).collect();
        buckets.push(max_batch);
        let mut smallest_served = 1;
        for &bucket in &buckets {
            // A padded graph of `bucket` rows serves batches smallest_served..=bucket.
            for served in smallest_served..=bucket {
                for width in widths.widths_at(served) {
                    keys.insert(GraphKey { batch: bucket, width });
                }
            }
            smallest_served = bucket + 1;
        }
        Self { keys }
    }

    pub fn keys(&self) -> impl Iterator<Item = GraphKey> + '_ {
        self.keys.iter().copied()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The captured key that serves a decode step of `batch` rows verifying `width` drafts:
    /// the smallest captured batch size that fits, at the narrowest captured width that is at
    /// least `width` there. `None` runs the step eagerly.
    pub fn key_for(&self, batch: usize, width: usize) -> Option<GraphKey> {
        let bucket = self.keys.iter().map(|k| k.batch).find(|&b| b >= batch)?;
        self.keys
            .range(GraphKey { batch: bucket, width }..=GraphKey { batch: bucket, width: usize::MAX })
            .next()
            .copied()
    }
}

/// The persistent inputs of one captured key: every tensor keeps its shape and its device
/// buffer for the life of the graph, and [`Self::fill`] rewrites their contents in place.
#[derive(Debug, Clone)]
pub struct StepInputs {
    pub key: GraphKey,
    /// `[B · (W + 1)]` u32 token ids, rows back to back.
    pub input_ids: Tensor,
    /// `[B · (W + 1)]` u32 RoPE positions.
    pub positions: Tensor,
    /// `[B · (W + 1)]` u32 KV slot each token's key and value are written to.
    pub slot_mapping: Tensor,
    pub attention: FixedAttention,
    scratch_slot: u32,
}

/// Where a row's fed tokens sit among a [`StepInputs`] layout's logits: row `r`, query `j`
/// is output row `r · (W + 1) + j`.
pub fn fixed_output_row(key: GraphKey, row: usize, query: usize) -> usize {
    row * key.queries() + query
}

impl StepInputs {
    /// Zeroed buffers for `key` with a context capacity of `max_keys` per row. Padding writes
    /// its keys and values to `scratch_slot`, which must belong to no sequence.
    pub fn new(key: GraphKey, max_keys: usize, scratch_slot: u32, device: &Device) -> Result<Self> {
        let t = key.num_tokens();
        let (b, q) = (key.batch, key.queries());
        let zeros = |n: usize| Tensor::zeros(n, DType::U32, device);
        Ok(Self {
            key,
            input_ids: zeros(t)?,
            positions: zeros(t)?,
            slot_mapping: zeros(t)?,
            attention: FixedAttention {
                rows: b,
                queries: q,
                keys: max_keys,
                key_slots: zeros(b * max_keys)?,
                first_key: Tensor::zeros((b, q, 1), DType::U32, device)?,
                last_key: Tensor::zeros((b, q, 1), DType::U32, device)?,
                key_index: Tensor::arange(0u32, max_keys as u32, device)?.reshape((1, 1, max_keys))?,
            },
            scratch_slot,
        })
    }

    /// Whether a batch fits this key: at most `B` causal rows of at most `W + 1` tokens, each
    /// with at most `L` keys.
    pub fn fits(&self, batch: &ForwardBatch) -> bool {
        batch.mask == AttentionMask::Causal
            && batch.rows.len() <= self.key.batch
            && batch.rows.iter().all(|r| r.query_len <= self.key.queries() && r.context_len <= self.attention.keys)
    }

    /// Lays `batch` out in the fixed shape (row `r`'s query `j` at `r · (W + 1) + j`, padding
    /// after) and writes it into the persistent buffers. Runs outside any capture: it uploads.
    pub fn fill(&self, batch: &ForwardBatch) -> Result<()> {
        if !self.fits(batch) {
            candle_core::bail!("StepInputs: the batch does not fit the captured shape {:?}", self.key);
        }
        let (b, q, l) = (self.key.batch, self.key.queries(), self.attention.keys);
        let scratch = self.scratch_slot;
        let mut ids = vec![0u32; b * q];
        let mut positions = vec![0u32; b * q];
        let mut slots = vec![scratch; b * q];
        let mut key_slots = vec![scratch; b * l];
        let mut first = vec![0u32; b * q];
        let mut last = vec![0u32; b * q];
        let bs = batch.block_size;
        for (r, row) in batch.rows.iter().enumerate() {
            let table = batch.row_block_table(row);
            for x in 0..row.context_len {
                key_slots[r * l + x] = table[x / bs] * bs as u32 + (x % bs) as u32;
            }
            for j in 0..row.query_len {
                let (src, dst) = (row.query_start + j, r * q + j);
                ids[dst] = batch.input_ids[src];
                positions[dst] = batch.positions[src];
                slots[dst] = batch.slot_mapping[src];
                let own = row.cached_len() + j;
                first[dst] = batch.sliding_window.map_or(0, |w| (own + 1).saturating_sub(w)) as u32;
                last[dst] = own as u32;
            }
        }
        let write = |dst: &Tensor, src: Vec<u32>| -> Result<()> {
            let src = Tensor::from_vec(src, dst.shape(), dst.device())?;
            dst.slice_set(&src, 0, 0)
        };
        write(&self.input_ids, ids)?;
        write(&self.positions, positions)?;
        write(&self.slot_mapping, slots)?;
        write(&self.attention.key_slots, key_slots)?;
        write(&self.attention.first_key, first)?;
        write(&self.attention.last_key, last)
    }
}

#[cfg(feature = "cuda")]
pub mod cuda;

#[cfg(test)]
mod tests;
