//! A vectorisable `exp` for the softmax hot loop.
//!
//! `f32::exp` is a libm call per element, which keeps the compiler from vectorising the
//! 49k-element softmax of every verify position; this inlined version (Cephes `expf`: a
//! degree-5 minimax polynomial for `exp(r)` on `|r| <= ln2 / 2`, scaled by `2^n`) compiles to
//! SIMD and stays within ~2 ulp of the exact value.

const LOG2_E: f32 = std::f32::consts::LOG2_E;
/// `ln 2` split so that `n · LN2_HI` is exact for the `n` that occur.
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
/// Cephes `expf` coefficients of `P(r)`, highest degree first.
const EXP_POLY: [f32; 6] = [1.987_569_1e-4, 1.398_199_9e-3, 8.333_452e-3, 4.166_579_6e-2, 1.666_666_5e-1, 0.5];
/// Below this, `exp` underflows the normal range; the result is flushed to 0.
const MIN_INPUT: f32 = -87.0;
/// Above this the result saturates to `+inf`, a little early (f32 `exp` overflows at 88.72)
/// so that `n <= 127`.
const MAX_INPUT: f32 = 88.0;
/// `1.5 · 2^23`: adding it to a small integer-valued float leaves the integer in the low
/// mantissa bits, which turns `n` into exponent bits without a float-to-int conversion (a
/// saturating `as i32` would not vectorise).
const ROUNDING_MAGIC: f32 = 12_582_912.0;
const ROUNDING_MAGIC_BITS: u32 = 0x4B40_0000;

/// `e^x` for `-87 <= x <= 88`; `0` below (including `-inf`) and for NaN, `+inf` above.
#[inline(always)]
pub(crate) fn exp_f32(x: f32) -> f32 {
    let clamped = x.clamp(MIN_INPUT, MAX_INPUT);
    let n = (clamped * LOG2_E + 0.5).floor();
    let r = clamped - n * LN2_HI - n * LN2_LO;
    // exp(r) ≈ 1 + r + r² · P(r), Horner form.
    let p = EXP_POLY.iter().fold(0.0f32, |acc, &c| acc * r + c);
    let exp_r = p * r * r + r + 1.0;
    // 2^n from its biased exponent n + 127, which lies in [1, 254].
    let biased_exponent = (n + 127.0 + ROUNDING_MAGIC).to_bits().wrapping_sub(ROUNDING_MAGIC_BITS);
    let two_to_n = f32::from_bits(biased_exponent << 23);
    let y = exp_r * two_to_n;
    if x > MAX_INPUT {
        f32::INFINITY
    } else if x >= MIN_INPUT {
        y
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_f64_exp_to_a_few_ulp_over_the_softmax_range() {
        let mut worst = 0.0f64;
        for i in 0..=200_000 {
            let x = -87.0 + 87.0 * f64::from(i) / 200_000.0 + 1e-7;
            let x = x as f32;
            let exact = f64::from(x).exp();
            let relative = ((f64::from(exp_f32(x)) - exact) / exact).abs();
            worst = worst.max(relative);
        }
        assert!(worst < 2.5e-7, "worst relative error {worst}");
        assert_eq!(exp_f32(0.0), 1.0);
        for x in [0.5f32, 1.0, 10.0, 87.9, 88.0] {
            assert!(((f64::from(exp_f32(x)) - f64::from(x).exp()) / f64::from(x).exp()).abs() < 2.5e-7);
        }
    }

    #[test]
    fn edges_flush_saturate_and_ignore_nan() {
        assert_eq!(exp_f32(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_f32(-87.5), 0.0);
        assert_eq!(exp_f32(f32::NAN), 0.0);
        assert_eq!(exp_f32(88.01), f32::INFINITY);
        assert_eq!(exp_f32(f32::INFINITY), f32::INFINITY);
    }
}
