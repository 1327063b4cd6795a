//! Synthetic acceptance (MAX §3.5): a benchmarking mode that fixes the acceptance rate so
//! system cost can be measured independently of draft quality.
//!
//! The configured rate `r` is the *mean joint acceptance* over the `K` draft positions,
//! `(1/K) · Σ_{i=1..K} P(first i drafts accepted)`. Each position is accepted independently
//! with probability `a` (synthetic stream) and the walk stops at the first rejection, so
//! `P(first i accepted) = a^i`; `a` solves `(1/K) · Σ a^i = r` by bisection. Recovered and
//! bonus tokens are the target argmax: the emitted text is not a faithful decode.

use super::position::{Position, Verdict};
use crate::sampling::{RngStream, uniform};

/// Bisection tolerance on the per-position rate.
const CALIBRATION_TOLERANCE: f64 = 1e-9;

/// The per-position acceptance probability `a ∈ [0, 1]` with `(1/K) · Σ_{i=1..K} a^i =
/// mean_joint_rate`, found by bisection on `[0, 1]` to 1e-9 (returning the upper bound, as
/// MAX does). Rates `<= 0` (or NaN) give 0 and rates `>= 1` give 1; `K = 0` is treated as 1.
pub fn calibrate_per_position_rate(mean_joint_rate: f64, num_draft_steps: usize) -> f64 {
    if mean_joint_rate.is_nan() || mean_joint_rate <= 0.0 {
        return 0.0;
    }
    if mean_joint_rate >= 1.0 {
        return 1.0;
    }
    let k = num_draft_steps.max(1);
    let mean_joint = |a: f64| (1..=k).map(|i| a.powi(i as i32)).sum::<f64>() / k as f64;
    let (mut lo, mut hi) = (0.0f64, 1.0f64);
    while hi - lo > CALIBRATION_TOLERANCE {
        let mid = 0.5 * (lo + hi);
        if mean_joint(mid) < mean_joint_rate {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    hi
}

/// The calibrated synthetic rule.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SyntheticRule {
    /// The configured mean joint acceptance rate.
    pub mean_joint_rate: f64,
    /// The calibrated per-position acceptance probability.
    pub per_position_rate: f64,
}

impl SyntheticRule {
    pub fn new(mean_joint_rate: f64, num_draft_steps: usize) -> Self {
        Self { mean_joint_rate, per_position_rate: calibrate_per_position_rate(mean_joint_rate, num_draft_steps) }
    }

    /// Flips the position's coin; on rejection `recovered` (the target argmax) is emitted.
    pub(crate) fn verify(&self, pos: &Position, recovered: impl FnOnce() -> u32) -> Verdict {
        if self.coin_accepts(pos.seed, pos.counter()) {
            Verdict::Accept
        } else {
            Verdict::Reject { recovered: recovered() }
        }
    }

    /// The coin of position `counter` of a row seeded with `seed`.
    pub(crate) fn coin_accepts(&self, seed: u64, counter: u64) -> bool {
        uniform(seed, RngStream::Synthetic, counter) < self.per_position_rate
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calibration_solves_the_mean_joint_equation() {
        for k in [1usize, 2, 3, 5, 8] {
            for rate in [0.05, 0.3, 0.5, 0.7, 0.9, 0.99] {
                let a = calibrate_per_position_rate(rate, k);
                let achieved = (1..=k).map(|i| a.powi(i as i32)).sum::<f64>() / k as f64;
                assert!((achieved - rate).abs() < 1e-8, "k={k} rate={rate} a={a}");
                assert!(achieved >= rate, "the upper bound is returned");
            }
        }
        // One draft position: the per-position rate is the rate itself.
        assert!((calibrate_per_position_rate(0.7, 1) - 0.7).abs() < 1e-9);
    }

    #[test]
    fn out_of_range_rates_clamp() {
        assert_eq!(calibrate_per_position_rate(0.0, 3), 0.0);
        assert_eq!(calibrate_per_position_rate(-1.0, 3), 0.0);
        assert_eq!(calibrate_per_position_rate(f64::NAN, 3), 0.0);
        assert_eq!(calibrate_per_position_rate(1.0, 3), 1.0);
        assert_eq!(calibrate_per_position_rate(2.0, 3), 1.0);
    }
}
