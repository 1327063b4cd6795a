//! Stochastic acceptance: lossless verification of sampled requests.
//!
//! **Argmax proposals: target-sample match** (MAX §3.2, llama.cpp, DFlash). Draw one token
//! from the processed target distribution `p` at each position; accept the draft iff it
//! equals the sample; on a mismatch the sample itself is the recovered token, and at the bonus
//! position the sample is the bonus token. Every emitted token is then literally a target
//! sample, so outputs follow `p` exactly. For a deterministic (one-hot) proposal this is
//! rejection sampling: the draft is accepted with probability `p(d)`, and a rejection yields
//! `p` conditioned on `≠ d`.
//!
//! **Sampled proposals: rejection sampling** (Leviathan et al. 2023, Chen et al. 2023;
//! MAX §3.3). With the draft distribution `q` the draft was drawn from, accept iff
//! `u · q(d) < p(d)` (the division-free `u < p(d) / q(d)`, verdict stream); on rejection draw
//! from the residual `max(p - q, 0)` (residual stream). A position without a distribution
//! (`q(d) = 0`, or no `draft_probs` at all) is verified as a one-hot proposal: `q(d) = 1` and
//! the residual is `p` without `d`, so a rejected draft is never re-emitted. The bonus token
//! is a target sample as above. The emitted token at every position is distributed as `p`.

use super::position::{Position, Scratch, Verdict};
use crate::sampling::{RngStream, SamplingWorkspace, sample_inverse_cdf, uniform};

/// One draw from the processed target distribution at `pos` (target-sample stream): the
/// bonus token of every stochastic row.
pub(crate) fn sample_target(pos: &Position, workspace: &mut SamplingWorkspace) -> u32 {
    let probs = workspace.processed_probs(pos.logits, pos.params, pos.penalties);
    sample_inverse_cdf(probs, uniform(pos.seed, RngStream::TargetSample, pos.counter()))
}

/// Target-sample match for an argmax (deterministic) draft.
pub(crate) fn verify_by_target_sample(pos: &Position, draft: u32, workspace: &mut SamplingWorkspace) -> Verdict {
    let sample = sample_target(pos, workspace);
    if sample == draft { Verdict::Accept } else { Verdict::Reject { recovered: sample } }
}

/// Rejection sampling of `draft` against `draft_probs` (`[V]`, the distribution it was drawn
/// from), or against a one-hot proposal when that is absent or gives the draft no mass.
pub(crate) fn verify_against_draft(
    pos: &Position,
    draft: u32,
    draft_probs: Option<&[f32]>,
    scratch: &mut Scratch,
) -> Verdict {
    let d = draft as usize;
    let p = scratch.workspace.processed_probs(pos.logits, pos.params, pos.penalties);
    let q = draft_probs.filter(|q| q.get(d).is_some_and(|&qd| qd > 0.0));
    if accepts_against_draft(pos.seed, pos.counter(), p[d], q.map(|q| q[d])) {
        return Verdict::Accept;
    }

    let residual = &mut scratch.residual;
    residual.clear();
    match q {
        Some(q) => residual.extend(p.iter().zip(q).map(|(&p, &q)| (p - q).max(0.0))),
        None => {
            residual.extend_from_slice(p);
            residual[d] = 0.0;
        }
    }
    let u = uniform(pos.seed, RngStream::Residual, pos.counter());
    // An empty residual means `p <= q` everywhere, i.e. `p = q` up to rounding, where a
    // rejection had probability ~0: fall back to `p` itself.
    let recovered =
        if residual.iter().any(|&r| r > 0.0) { sample_inverse_cdf(residual, u) } else { sample_inverse_cdf(p, u) };
    Verdict::Reject { recovered }
}

/// The rejection-sampling coin of position `counter`: accept iff `u · q(d) < p(d)` with the
/// verdict-stream uniform `u`; a missing or zero `q(d)` is a one-hot proposal (`q(d) = 1`).
pub(crate) fn accepts_against_draft(seed: u64, counter: u64, p_draft: f32, q_draft: Option<f32>) -> bool {
    let q_draft = q_draft.filter(|&q| q > 0.0).map_or(1.0, f64::from);
    uniform(seed, RngStream::Verdict, counter) * q_draft < f64::from(p_draft)
}
