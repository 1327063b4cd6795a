//! Counter-based random numbers: every uniform is a pure function of `(seed, stream, counter)`.
//!
//! A row's draws therefore never depend on which other rows share its batch, on the order
//! rows are processed in, or on how many draws other positions consumed: the engine passes
//! each row a step seed (`request seed + committed tokens · γ`) and position `p` of the step
//! uses counter `p`, so a sequence position draws the same numbers however steps are cut.
//!
//! The generator is SplitMix64 (Steele, Lea and Flood 2014): `uniform(seed, stream, p)` is the
//! first output of a SplitMix64 generator seeded at `seed + stream + p·γ`, which is how Modular
//! MAX seeds position `p` of a row. Streams are offsets that keep the different uses of one
//! seed independent (MAX's constants; the draft stream is spec-rs's own).

/// SplitMix64's increment, the odd integer closest to 2^64 / φ. Consecutive counters are
/// this far apart in the generator's state space.
pub const GOLDEN_GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// 2^-53: maps the top 53 bits of a `u64` onto `[0, 1)` with every value exactly
/// representable.
const UNIT_53: f64 = 1.0 / (1u64 << 53) as f64;

/// The independent uses of one step seed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RngStream {
    /// Samples from the processed target: target-sample match, bonus tokens, plain decoding.
    TargetSample,
    /// The accept/reject coin of rejection sampling against a draft distribution.
    Verdict,
    /// Samples from the residual distribution after a rejection.
    Residual,
    /// The coins of synthetic (benchmark) acceptance.
    Synthetic,
    /// Proposals of drafters that sample instead of taking their argmax.
    Draft,
}

impl RngStream {
    /// The offset added to the seed. The first four are Modular MAX's; `Draft` departs from
    /// MAX (which reuses the target-sample seeds for the drafter) so the draft's proposal can
    /// never be correlated with the target sample it is compared against.
    pub const fn offset(self) -> u64 {
        match self {
            Self::TargetSample => 0,
            Self::Verdict => 0x94D0_49BB_1331_11EB,
            Self::Residual => 0xBF58_476D_1CE4_E5B9,
            Self::Synthetic => 0xFF51_AFD7_ED55_8CCD,
            Self::Draft => 0xD1B5_4A32_D192_ED03,
        }
    }
}

/// SplitMix64's output function: a bijective mix of 64 bits.
#[inline]
pub const fn splitmix64_mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// 64 random bits for `counter` of `stream` under `seed`.
#[inline]
pub fn random_bits(seed: u64, stream: RngStream, counter: u64) -> u64 {
    let state = seed.wrapping_add(stream.offset()).wrapping_add(counter.wrapping_mul(GOLDEN_GAMMA));
    splitmix64_mix(state.wrapping_add(GOLDEN_GAMMA))
}

/// A uniform in `[0, 1)` with 53 random bits; never returns 1.0.
#[inline]
pub fn uniform(seed: u64, stream: RngStream, counter: u64) -> f64 {
    (random_bits(seed, stream, counter) >> 11) as f64 * UNIT_53
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reference SplitMix64 generator: `state += γ; return mix(state)`.
    fn splitmix64_next(state: &mut u64) -> u64 {
        *state = state.wrapping_add(GOLDEN_GAMMA);
        splitmix64_mix(*state)
    }

    #[test]
    fn matches_the_published_splitmix64_sequence() {
        // First outputs of SplitMix64 seeded with 1234567 (Vigna's reference implementation).
        let mut state = 1_234_567u64;
        let expected = [6_457_827_717_110_365_317u64, 3_203_168_211_198_807_973, 9_817_491_932_198_370_423];
        for e in expected {
            assert_eq!(splitmix64_next(&mut state), e);
        }
        assert_eq!(random_bits(1_234_567, RngStream::TargetSample, 0), expected[0]);
    }

    #[test]
    fn counter_p_is_the_first_output_of_a_generator_seeded_at_seed_plus_p_gamma() {
        let seed = 42u64;
        for p in 0..8u64 {
            let mut state = seed.wrapping_add(RngStream::Verdict.offset()).wrapping_add(p.wrapping_mul(GOLDEN_GAMMA));
            assert_eq!(random_bits(seed, RngStream::Verdict, p), splitmix64_next(&mut state));
        }
    }

    #[test]
    fn uniforms_stay_in_the_half_open_unit_interval_and_look_uniform() {
        let n = 200_000u64;
        let mut sum = 0.0;
        let mut below_tenth = 0u64;
        for c in 0..n {
            let u = uniform(7, RngStream::TargetSample, c);
            assert!((0.0..1.0).contains(&u));
            sum += u;
            below_tenth += u64::from(u < 0.1);
        }
        assert!((sum / n as f64 - 0.5).abs() < 0.005);
        assert!((below_tenth as f64 / n as f64 - 0.1).abs() < 0.005);
        // The largest value the mapping can produce is strictly below one.
        assert!(((u64::MAX >> 11) as f64 * UNIT_53) < 1.0);
    }

    #[test]
    fn streams_and_counters_are_distinct() {
        let streams =
            [RngStream::TargetSample, RngStream::Verdict, RngStream::Residual, RngStream::Synthetic, RngStream::Draft];
        let mut seen = std::collections::HashSet::new();
        for s in streams {
            for c in 0..64 {
                assert!(seen.insert(random_bits(99, s, c)), "{s:?} {c}");
            }
        }
    }
}
