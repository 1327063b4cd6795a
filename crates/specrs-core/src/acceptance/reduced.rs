//! Acceptance from per-position reductions instead of whole logit rows.
//!
//! When the logits live on a GPU, copying `(n + 1) · V` floats per row to the host costs more
//! than the verify step's arithmetic. Every rule reads only a handful of numbers per position,
//! though: the argmax, one target sample, the draft's probabilities, one residual sample, or
//! the relaxed rule's rank statistics. Each of them is fixed before the walk starts, because
//! position `i` is only reached when `drafts[..i]` were all accepted, so whatever the walk
//! would carry into it (the reasoning phase) is known in advance. A device computes these
//! reductions for every position ([`ReducedPosition`]) and the walk here applies the same
//! rules, through the same functions, as the walk over slices.
//!
//! Penalties are the exception: they transform the logits by the history, so rows with
//! penalties keep the slice path. [`AcceptanceSampler::reductions_for`] says what a row needs.

use super::relaxed::RelaxedStats;
use crate::sampling::SamplingParams;

/// Everything the acceptance rules read at one position, reduced from its `[V]` logits.
///
/// Which fields must be set depends on the row's rule ([`Reductions`]); a missing one is a
/// [`ReducedError`].
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct ReducedPosition {
    /// The argmax of the raw logits (ties by lowest id, NaN skipped).
    pub argmax: u32,
    /// A draw from the processed target distribution with the position's target-sample
    /// uniform (`uniform(seed, TargetSample, index)`).
    pub target_sample: Option<u32>,
    /// `p(draft)` under the processed target distribution.
    pub draft_p: Option<f32>,
    /// `q(draft)` under the draft distribution; `None` (or 0) verifies a one-hot proposal.
    pub draft_q: Option<f32>,
    /// A draw from the rejection residual with the position's residual uniform: from
    /// `max(p - q, 0)` when `q(draft) > 0`, else from `p` without the draft; from `p` when
    /// the residual has no mass.
    pub residual_sample: Option<u32>,
    /// The relaxed rule's statistics of the raw logits for the draft.
    pub relaxed: Option<RelaxedStats>,
}

/// What the walk of a row will read at its positions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Reductions {
    /// Target samples at every position (target-sample match, and every stochastic bonus).
    pub target_sample: bool,
    /// `p(draft)`, `q(draft)` and residual samples at draft positions (rejection sampling).
    pub rejection: bool,
    /// Relaxed statistics at draft positions, with this `topk`.
    pub relaxed_topk: Option<usize>,
}

/// One row's verify step in reduced form.
#[derive(Debug, Clone, Copy)]
pub struct ReducedRow<'a> {
    /// `[n]` draft tokens.
    pub drafts: &'a [u32],
    /// `[n + 1]` reductions; the last is the bonus position.
    pub positions: &'a [ReducedPosition],
    pub params: &'a SamplingParams,
    pub seed: u64,
    pub in_thinking: bool,
}

/// A reduced row the walk cannot use: a bug in the caller.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReducedError {
    #[error("{num_drafts} drafts need {} reduced positions, got {got}", num_drafts + 1)]
    Positions { got: usize, num_drafts: usize },
    #[error("rows with penalties or a logit bias verify on the logits themselves, not on reductions")]
    Penalties,
    #[error("position {position} lacks the {what} its rule reads")]
    Missing { position: usize, what: &'static str },
}

impl<'a> ReducedRow<'a> {
    pub(crate) fn check(&self) -> Result<(), ReducedError> {
        if self.positions.len() != self.drafts.len() + 1 {
            return Err(ReducedError::Positions { got: self.positions.len(), num_drafts: self.drafts.len() });
        }
        if self.params.adjusts_logits() {
            return Err(ReducedError::Penalties);
        }
        Ok(())
    }
}

pub(crate) fn need<T>(value: Option<T>, position: usize, what: &'static str) -> Result<T, ReducedError> {
    value.ok_or(ReducedError::Missing { position, what })
}

impl ReducedPosition {
    /// The reductions of one position computed from its logits on the host: the reference
    /// that device reductions are tested against. `logits` is `[V]`; `draft_q` is the draft
    /// distribution `[V]` of the position, if any; `index` is the position within its row.
    pub fn from_logits(
        logits: &[f32],
        params: &SamplingParams,
        seed: u64,
        index: usize,
        draft: Option<u32>,
        draft_q: Option<&[f32]>,
        wants: Reductions,
    ) -> Self {
        use crate::sampling::{RngStream, argmax, processed_probs, sample_inverse_cdf, uniform};
        let counter = index as u64;
        let mut out = Self { argmax: argmax(logits), ..Default::default() };
        let needs_p = wants.target_sample || (wants.rejection && draft.is_some());
        let p = needs_p.then(|| processed_probs(logits, params, None));
        if wants.target_sample {
            let p = p.as_deref().expect("computed above");
            out.target_sample = Some(sample_inverse_cdf(p, uniform(seed, RngStream::TargetSample, counter)));
        }
        if let (true, Some(d), Some(p)) = (wants.rejection, draft, p.as_deref()) {
            let d = d as usize;
            let q = draft_q.filter(|q| q.get(d).is_some_and(|&qd| qd > 0.0));
            out.draft_p = Some(p[d]);
            out.draft_q = q.map(|q| q[d]);
            let residual: Vec<f32> = match q {
                Some(q) => p.iter().zip(q).map(|(&p, &q)| (p - q).max(0.0)).collect(),
                None => p.iter().enumerate().map(|(i, &p)| if i == d { 0.0 } else { p }).collect(),
            };
            let u = uniform(seed, RngStream::Residual, counter);
            let weights = if residual.iter().any(|&r| r > 0.0) { residual.as_slice() } else { p };
            out.residual_sample = Some(sample_inverse_cdf(weights, u));
        }
        if let (Some(topk), Some(d)) = (wants.relaxed_topk, draft) {
            out.relaxed = Some(RelaxedStats::of(logits, d, topk));
        }
        out
    }
}
