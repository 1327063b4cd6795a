//! Acceptance: which draft tokens a verify step keeps, and which token it emits after them.
//!
//! Vocabulary (vLLM's): **accepted** drafts pass the rule; the **recovered** token replaces the
//! first rejected draft; the **bonus** token follows when every draft is accepted. A row
//! commits `drafts[..num_accepted] ++ [recovered | bonus]`, 1 to `n + 1` tokens.
//!
//! Rules (Modular MAX's `AcceptanceSampler`; precedence synthetic > stochastic > greedy):
//!
//! | rule | row | accept draft `d` at position `i` iff | emitted on reject / bonus |
//! |---|---|---|---|
//! | greedy | every row; and rows with temperature < 1e-5 under stochastic | `d == argmax` | argmax |
//! | stochastic, argmax drafts | sampled rows | `d ==` a sample of the processed target | that sample |
//! | stochastic, sampled drafts | sampled rows | `u · q(d) < p(d)` | residual `max(p - q, 0)` / target sample |
//! | relaxed overlay (argmax drafts) | sampled rows inside a reasoning span | `d` in top-k with `p(d) >= p(top1) - δ` | argmax / target sample |
//! | synthetic | every row | a coin with the calibrated rate | argmax |
//!
//! Argmax and penalties read the history plus the drafts accepted before the position. Every
//! random number comes from a `(step seed, stream, position)` counter whose step seed advances
//! with the committed tokens, so a sequence position always draws the same numbers: results
//! never depend on batch composition, and with argmax drafts (outside relaxed acceptance) a
//! seeded request emits the tokens plain decoding samples at any draft width, as far as the
//! target's logits are the same at every width (bit for bit on the CPU's f32 path). The modules state each rule and why it is exact (or, for relaxed and
//! synthetic, what it gives up).

mod greedy;
mod phase;
mod position;
mod reduced;
mod relaxed;
mod row;
mod sampler;
mod stochastic;
mod synthetic;

pub use phase::ThinkingTokens;
pub use reduced::{ReducedError, ReducedPosition, ReducedRow, Reductions};
pub use relaxed::{RelaxedRule, RelaxedStats};
pub use row::{VerifyError, VerifyOutput, VerifyRow};
pub use sampler::AcceptanceSampler;
pub use synthetic::{SyntheticRule, calibrate_per_position_rate};
