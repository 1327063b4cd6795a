//! The shared vocabulary of the per-position rules.

use crate::sampling::{PenaltyContext, SamplingParams, SamplingWorkspace};

/// Everything a rule may read at one verify (or bonus) position.
pub(crate) struct Position<'a> {
    /// Index within the step; also the counter of every random stream at this position.
    pub index: usize,
    /// `[V]` target logits of this position.
    pub logits: &'a [f32],
    pub params: &'a SamplingParams,
    pub seed: u64,
    /// Occurrence counts including the drafts accepted before this position; `None` when the
    /// request has no penalties.
    pub penalties: Option<&'a PenaltyContext>,
}

impl Position<'_> {
    /// The RNG counter of this position.
    pub fn counter(&self) -> u64 {
        self.index as u64
    }
}

/// A rule's decision on one draft.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    Accept,
    /// Accepted only because of the relaxed thinking rule.
    AcceptRelaxed,
    /// Rejected; `recovered` is emitted in the draft's place and the walk ends.
    Reject {
        recovered: u32,
    },
}

/// Per-call buffers shared by the rows of a batch (each position overwrites what it reads).
#[derive(Debug, Default)]
pub(crate) struct Scratch {
    pub workspace: SamplingWorkspace,
    /// `[V]`: the residual distribution of rejection sampling.
    pub residual: Vec<f32>,
}

impl Scratch {
    pub fn new(vocab_size: usize) -> Self {
        Self { workspace: SamplingWorkspace::new(vocab_size), residual: Vec::with_capacity(vocab_size) }
    }
}
