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
//!   fixed shapes (`attention::fixed_attention`);
//! - [`FixedSteps`]: what the engine calls. It holds one [`StepInputs`] per captured key and
//!   runs a decode step on the smallest key that fits, then hands back the step's outputs in
//!   the ragged batch's order, so nothing after the forward knows the step was padded. On
//!   CUDA each key is a captured graph that it replays; elsewhere it runs the same
//!   fixed-shape step eagerly, which is how CPU tests check the padding and the reordering.
//!
//! The capture and replay themselves ([`cuda::StepGraph`], behind the `cuda` feature) use
//! cudarc's stream capture with candle's capture-safety caches; docs/CUDA.md says what has
//! run on a GPU.

use std::collections::{BTreeSet, HashMap};

use candle_core::{DType, Device, Result, Tensor};
use specrs_core::width::{AdaptiveWidthController, VerifyWidthSchedule};

use crate::attention::{FixedAttention, visible_keys};
use crate::batch::{AttentionMask, ForwardBatch};
use crate::kv_cache::PagedKvCache;
use crate::models::{CausalLm, ForwardOutput};

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
                first[dst] = visible_keys(AttentionMask::Causal, batch.key_limits(), row.cached_len(), row.query_len, j)
                    .0 as u32;
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

/// What a step outside the captured shapes falls back to, and why (for logs and tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Uncaptured {
    /// No captured batch size holds this many rows at this width.
    NoKey,
    /// A row feeds more tokens than the key's width, or has more keys than its capacity, or
    /// the batch is not causal.
    DoesNotFit,
    /// The step asks for other hidden states than the steps were built for.
    OtherOutputs,
}

/// One key's step: replayed from a device graph, or run eagerly on the same fixed shapes.
enum FixedStep {
    Eager(StepInputs),
    #[cfg(feature = "cuda")]
    Captured(cuda::StepGraph),
}

impl FixedStep {
    fn inputs(&self) -> &StepInputs {
        match self {
            Self::Eager(inputs) => inputs,
            #[cfg(feature = "cuda")]
            Self::Captured(graph) => graph.inputs(),
        }
    }
}

/// The hidden states every fixed step returns beside its logits (what the drafter reads).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StepOutputs {
    /// Hugging Face `hidden_states` indices, as in [`ForwardBatch::taps`].
    pub taps: Vec<usize>,
    pub want_final_hidden: bool,
}

/// Decode and verify steps on the captured shapes of a [`CapturePlan`].
pub struct FixedSteps {
    plan: CapturePlan,
    steps: HashMap<GraphKey, FixedStep>,
    outputs: StepOutputs,
}

impl std::fmt::Debug for FixedSteps {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FixedSteps").field("plan", &self.plan).field("captured", &self.is_captured()).finish()
    }
}

impl FixedSteps {
    /// Builds every key of `plan` for `model` over `kv`, each with room for `max_keys` keys per
    /// row; padding writes to `scratch_slot`, which no sequence may own. Every step returns
    /// the hidden states of `outputs` beside its logits. With `capture` on a CUDA device (created by
    /// `cuda::graph_ready_device`) each key is warmed up and captured as a device graph, on a
    /// batch of padding rows only; otherwise the keys run eagerly.
    pub fn new(
        model: &CausalLm,
        kv: &PagedKvCache,
        plan: CapturePlan,
        max_keys: usize,
        scratch_slot: u32,
        outputs: StepOutputs,
        capture: bool,
    ) -> Result<Self> {
        let padding_only = ForwardBatch { block_size: kv.block_size(), ..Default::default() };
        let mut steps = HashMap::new();
        for key in plan.keys() {
            let inputs = StepInputs::new(key, max_keys, scratch_slot, model.device())?;
            let step = if capture && model.device().is_cuda() {
                Self::capture(model, kv, inputs, &padding_only, &outputs)?
            } else {
                FixedStep::Eager(inputs)
            };
            steps.insert(key, step);
        }
        Ok(Self { plan, steps, outputs })
    }

    #[cfg(feature = "cuda")]
    fn capture(
        model: &CausalLm,
        kv: &PagedKvCache,
        inputs: StepInputs,
        padding_only: &ForwardBatch,
        outputs: &StepOutputs,
    ) -> Result<FixedStep> {
        inputs.fill(padding_only)?;
        let step = |i: &StepInputs| {
            let out = model.forward_fixed(i, kv, &outputs.taps, outputs.want_final_hidden)?;
            Ok(out.logits.into_iter().chain(out.taps).chain(out.final_hidden).collect())
        };
        Ok(FixedStep::Captured(cuda::StepGraph::capture(model.device(), inputs, step)?))
    }

    #[cfg(not(feature = "cuda"))]
    fn capture(
        _model: &CausalLm,
        _kv: &PagedKvCache,
        _inputs: StepInputs,
        _padding_only: &ForwardBatch,
        _outputs: &StepOutputs,
    ) -> Result<FixedStep> {
        candle_core::bail!("device-graph capture needs a CUDA build (the `cuda` feature)")
    }

    pub fn plan(&self) -> &CapturePlan {
        &self.plan
    }

    /// Whether the steps replay captured device graphs (else they run eagerly).
    pub fn is_captured(&self) -> bool {
        #[cfg(feature = "cuda")]
        return self.steps.values().any(|s| matches!(s, FixedStep::Captured(_)));
        #[cfg(not(feature = "cuda"))]
        false
    }

    /// Runs a decode step whose rows verify at most `width` drafts on the smallest captured
    /// key that holds it. The outputs are in `batch`'s own order, as `CausalLm::forward` would
    /// return them: logits at `batch.logits_indices`, taps and final hidden states per fed
    /// token. `Err(Uncaptured)` leaves the step to the ragged forward.
    pub fn run(
        &self,
        model: &CausalLm,
        kv: &PagedKvCache,
        batch: &ForwardBatch,
        width: usize,
    ) -> Result<std::result::Result<(GraphKey, ForwardOutput), Uncaptured>> {
        if batch.taps != self.outputs.taps || batch.want_final_hidden != self.outputs.want_final_hidden {
            return Ok(Err(Uncaptured::OtherOutputs));
        }
        let Some(key) = self.plan.key_for(batch.rows.len(), width) else { return Ok(Err(Uncaptured::NoKey)) };
        let step = &self.steps[&key];
        // Positions past RoPE's table are the ragged forward's error to report.
        if !step.inputs().fits(batch) || batch.positions.iter().any(|&p| p as usize >= model.max_positions()) {
            return Ok(Err(Uncaptured::DoesNotFit));
        }
        batch.validate()?;
        let fixed = match step {
            FixedStep::Eager(inputs) => {
                inputs.fill(batch)?;
                model.forward_fixed(inputs, kv, &self.outputs.taps, self.outputs.want_final_hidden)?
            }
            #[cfg(feature = "cuda")]
            FixedStep::Captured(graph) => {
                let mut outputs = graph.replay(batch)?.iter().cloned();
                let logits = outputs.next();
                let taps = outputs.by_ref().take(self.outputs.taps.len()).collect();
                ForwardOutput { logits, taps, final_hidden: outputs.next() }
            }
        };
        Ok(Ok((key, ragged_outputs(key, batch, fixed)?)))
    }
}

/// Picks a fixed step's outputs at `batch`'s tokens, in its order.
fn ragged_outputs(key: GraphKey, batch: &ForwardBatch, fixed: ForwardOutput) -> Result<ForwardOutput> {
    // Fixed row of each fed token, indexed by its flat position in the ragged batch.
    let mut fixed_row = vec![0u32; batch.num_tokens()];
    for (r, row) in batch.rows.iter().enumerate() {
        for j in 0..row.query_len {
            fixed_row[row.query_start + j] = fixed_output_row(key, r, j) as u32;
        }
    }
    let device = fixed.logits.as_ref().map_or(&Device::Cpu, |l| l.device()).clone();
    let tokens = Tensor::from_slice(&fixed_row, fixed_row.len(), &device)?;
    let logits = match (&fixed.logits, batch.logits_indices.is_empty()) {
        (Some(all), false) => {
            let rows: Vec<u32> = batch.logits_indices.iter().map(|&i| fixed_row[i as usize]).collect();
            Some(all.index_select(&Tensor::from_slice(&rows, rows.len(), &device)?, 0)?)
        }
        _ => None,
    };
    Ok(ForwardOutput {
        logits,
        taps: fixed.taps.iter().map(|t| t.index_select(&tokens, 0)).collect::<Result<_>>()?,
        final_hidden: fixed.final_hidden.map(|h| h.index_select(&tokens, 0)).transpose()?,
    })
}

#[cfg(feature = "cuda")]
pub mod cuda;

#[cfg(test)]
mod tests;
