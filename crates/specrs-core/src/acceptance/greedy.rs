//! Greedy acceptance (MAX §3.1): a draft is accepted while it equals the target argmax after
//! penalties; the first mismatch emits that argmax, and a fully accepted row emits the argmax
//! of the bonus position.
//!
//! Every row with temperature below 1e-5 uses this rule under the stochastic rule too, so a
//! greedy request emits the same tokens with and without speculation.

use super::position::{Position, Verdict};
use crate::sampling::SamplingWorkspace;

pub(crate) fn verify(pos: &Position, draft: u32, workspace: &mut SamplingWorkspace) -> Verdict {
    let best = target_argmax(pos, workspace);
    if draft == best { Verdict::Accept } else { Verdict::Reject { recovered: best } }
}

/// The penalised target argmax: the greedy (and synthetic) recovered and bonus token.
pub(crate) fn target_argmax(pos: &Position, workspace: &mut SamplingWorkspace) -> u32 {
    workspace.penalized_argmax(pos.logits, pos.params, pos.penalties)
}
