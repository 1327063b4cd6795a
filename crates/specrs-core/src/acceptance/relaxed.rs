//! Relaxed acceptance inside reasoning spans (TensorRT-LLM MTP "thinking" mode, MAX §3.4).
//!
//! Reasoning text tolerates near-synonyms, so inside a span a draft is accepted when it is one
//! of the target's `topk` most likely tokens *and* its probability is within `delta` of the
//! top token's: `p(d) >= p(top1) - delta`, with `p` the **untempered** softmax of the raw
//! logits (no temperature, truncation or penalties) and `delta` in linear probability, as in
//! TensorRT-LLM's kernel. A rejected draft is replaced by the top token. The top token itself
//! is always accepted; `topk = 1` or `delta = 0` is strict greedy verification (up to exact
//! ties) and `delta >= 1` accepts anything in the top `topk`.
//!
//! This deliberately gives up losslessness inside the span; outside it the strict rule
//! holds. The bonus position always samples strictly.
//!
//! Metrics: a *relaxed acceptance* is an accepted draft other than the top token, i.e. one
//! that greedy verification would have rejected. It is deterministic (no counterfactual
//! sample is drawn) and is zero whenever the relaxation is a no-op (`topk = 1`).

use super::position::Verdict;
use crate::sampling::{argmax, logsumexp};

/// The relaxed rule's parameters (`relaxed_topk`, `relaxed_delta`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RelaxedRule {
    /// Only the `topk` most likely tokens (ties by lowest id) are candidates; `>= 1`.
    pub topk: usize,
    /// How far below the top token's probability a candidate may fall, in `[0, 1]`.
    pub delta: f64,
}

impl RelaxedRule {
    /// Judges `draft` against one position's raw logits (`[V]`).
    pub(crate) fn verify(&self, logits: &[f32], draft: u32) -> Verdict {
        self.decide(draft, &RelaxedStats::of(logits, draft, self.topk))
    }

    /// The rule on a position's [`RelaxedStats`]: what [`Self::verify`] decides, for callers
    /// that reduced the logits elsewhere (on the device holding them).
    pub(crate) fn decide(&self, draft: u32, stats: &RelaxedStats) -> Verdict {
        if draft == stats.top {
            return Verdict::Accept;
        }
        let reject = Verdict::Reject { recovered: stats.top };
        if self.topk <= 1 || stats.draft_logit.is_nan() || stats.ahead >= self.topk {
            return reject;
        }
        if self.delta >= 1.0 {
            return Verdict::AcceptRelaxed;
        }
        let top_prob = (f64::from(stats.top_logit) - stats.logsumexp).exp();
        let draft_prob = (f64::from(stats.draft_logit) - stats.logsumexp).exp();
        if draft_prob >= top_prob - self.delta { Verdict::AcceptRelaxed } else { reject }
    }
}

/// What the relaxed rule reads of one position's raw logits, for a given draft.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RelaxedStats {
    /// The argmax (ties by lowest id, NaN skipped): the recovered token on rejection.
    pub top: u32,
    /// Tokens ranked ahead of the draft, at least up to `topk` (a larger count decides the
    /// same way).
    pub ahead: usize,
    pub draft_logit: f32,
    pub top_logit: f32,
    /// `log Σ exp(logits)` of the raw row.
    pub logsumexp: f64,
}

impl RelaxedStats {
    /// The statistics of `logits` (`[V]`) for `draft`, counting ranks up to `topk`.
    pub fn of(logits: &[f32], draft: u32, topk: usize) -> Self {
        let top = argmax(logits);
        let draft_logit = logits.get(draft as usize).copied().unwrap_or(f32::NAN);
        Self {
            top,
            ahead: count_ahead(logits, draft, draft_logit, topk),
            draft_logit,
            top_logit: logits.get(top as usize).copied().unwrap_or(f32::NEG_INFINITY),
            logsumexp: f64::from(logsumexp(logits)),
        }
    }
}

/// Tokens ranked ahead of the draft (higher logit, or equal logit and lower id), counted up
/// to `limit` (enough to decide a rank cut of `limit`).
fn count_ahead(logits: &[f32], draft: u32, draft_logit: f32, limit: usize) -> usize {
    let mut ahead = 0usize;
    for (id, &l) in logits.iter().enumerate() {
        if l > draft_logit || (l == draft_logit && (id as u32) < draft) {
            ahead += 1;
            if ahead >= limit {
                break;
            }
        }
    }
    ahead
}

#[cfg(test)]
mod tests {
    use super::*;

    // softmax([ln 5, ln 3, ln 2]) = [0.5, 0.3, 0.2].
    fn logits() -> [f32; 3] {
        [5.0f32.ln(), 3.0f32.ln(), 2.0f32.ln()]
    }

    #[test]
    fn delta_is_linear_probability_below_the_top_token() {
        let rule = |delta| RelaxedRule { topk: 3, delta };
        assert_eq!(rule(0.25).verify(&logits(), 1), Verdict::AcceptRelaxed);
        assert_eq!(rule(0.25).verify(&logits(), 2), Verdict::Reject { recovered: 0 });
        assert_eq!(rule(0.35).verify(&logits(), 2), Verdict::AcceptRelaxed);
        assert_eq!(rule(0.0).verify(&logits(), 0), Verdict::Accept);
    }

    #[test]
    fn rank_cut_applies_before_delta_and_ties_rank_by_id() {
        let one_short = RelaxedRule { topk: 2, delta: 1.0 };
        assert_eq!(one_short.verify(&logits(), 1), Verdict::AcceptRelaxed);
        assert_eq!(one_short.verify(&logits(), 2), Verdict::Reject { recovered: 0 });
        let tied = [1.0f32, 1.0, 1.0];
        assert_eq!(one_short.verify(&tied, 1), Verdict::AcceptRelaxed);
        assert_eq!(one_short.verify(&tied, 2), Verdict::Reject { recovered: 0 });
        // Out-of-range drafts are rejected, not read.
        assert_eq!(one_short.verify(&tied, 9), Verdict::Reject { recovered: 0 });
    }
}
