//! Drafters: the models that propose draft tokens.
//!
//! Sequential drafters (EAGLE-1, EAGLE-3, MTP) run one token per row per forward: a first
//! forward pairs the target's hidden state at each committed position `t` with the token at
//! `t + 1`, then each further forward feeds the drafter its own output and its last draft.
//! They share [`SequentialDraftModel`]; the engine's sequential driver runs any of them.

pub mod eagle;
pub mod layer;
pub mod mtp;

use std::sync::Arc;

use candle_core::{Result, Tensor};

use crate::batch::ForwardBatch;
use crate::kv_cache::PagedKvCache;

/// Draft logits and, for a reduced draft vocabulary, the map from draft index to target id.
#[derive(Debug, Clone)]
pub struct DraftLogits {
    /// `[rows, draft_vocab]` f32.
    pub logits: Tensor,
    /// `draft index -> target token id`; `None` when the draft vocabulary is the target's.
    pub draft_to_target: Option<Arc<Vec<u32>>>,
}

/// Which target outputs a drafter reads.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DraftInputs {
    /// Hugging Face `hidden_states` indices of the target taps.
    pub taps: Vec<usize>,
    /// The target's final normed hidden state.
    pub final_hidden: bool,
}

pub trait SequentialDraftModel: Send + Sync {
    /// Name for logs, e.g. "EAGLE-3".
    fn name(&self) -> &str;

    fn inputs(&self) -> DraftInputs;

    /// Step-0 hidden inputs for the rows `flat_index [n]` (u32) of the target's outputs:
    /// `[n, hidden]`.
    fn first_hidden(&self, taps: &[Tensor], final_hidden: Option<&Tensor>, flat_index: &Tensor) -> Result<Tensor>;

    /// One drafter forward: `hidden [T, hidden]` paired with `batch.input_ids` (the token after
    /// each hidden state's position). Writes the drafter's keys and values, returns the output
    /// hidden states `[T, hidden]` that feed the next step and the logits at
    /// `batch.logits_indices`.
    fn forward(&self, hidden: &Tensor, batch: &ForwardBatch, kv: &PagedKvCache) -> Result<(Tensor, DraftLogits)>;

    /// A KV cache for the drafter's own layers, sharing the target's block layout.
    fn new_kv_cache(&self, num_blocks: usize, block_size: usize) -> Result<PagedKvCache>;

    /// Bytes of drafter KV per token (memory planning).
    fn kv_bytes_per_token(&self) -> u64;

    /// Drafts per step the checkpoint was trained for, when it says.
    fn trained_width(&self) -> Option<usize> {
        None
    }
}
