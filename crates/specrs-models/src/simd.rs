//! Horizontal reductions of AVX registers and a vector `exp`, shared by the CPU kernels
//! (`attention`, `activation`, `skinny`, `skinny_quant`). One definition keeps the summation
//! order and the rounding, and so the kernels' bits, the same. Also the instruction sets the
//! int8 kernels (`skinny_quant`, `packed_quant`) pick between at run time.

#[cfg(all(target_arch = "x86_64", target_feature = "avx"))]
use std::arch::x86_64::*;

/// Sum of the 8 lanes: `((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7))`.
#[cfg(all(target_arch = "x86_64", target_feature = "avx"))]
#[inline(always)]
pub(crate) fn hsum(v: __m256) -> f32 {
    // SAFETY: AVX is compiled in.
    unsafe {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
    }
}

/// Largest of the 8 lanes.
#[cfg(all(target_arch = "x86_64", target_feature = "avx"))]
#[inline(always)]
pub(crate) fn hmax(v: __m256) -> f32 {
    // SAFETY: AVX is compiled in.
    unsafe {
        let s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let s = _mm_max_ps(s, _mm_movehl_ps(s, s));
        _mm_cvtss_f32(_mm_max_ss(s, _mm_movehdup_ps(s)))
    }
}

/// `e^x` for `x <= 0` to about 1 ulp (Cephes' `expf` polynomial on `x - n ln 2`), and 0
/// below -87.3 (where `e^x` leaves the normal floats) or for `-inf`.
///
/// # Safety
/// The CPU runs AVX2 and FMA.
#[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma"))]
#[inline(always)]
pub(crate) unsafe fn exp_nonpositive(x: __m256) -> __m256 {
    // SAFETY: register-only arithmetic, AVX2 and FMA as the caller guarantees.
    unsafe {
        let underflow = _mm256_cmp_ps::<_CMP_LT_OQ>(x, _mm256_set1_ps(-87.3));
        let x = _mm256_max_ps(x, _mm256_set1_ps(-87.3));
        let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(
            x,
            _mm256_set1_ps(std::f32::consts::LOG2_E),
        ));
        // r = x - n ln 2, with ln 2 split in two so the product is exact.
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693_359_4), x);
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.121_944_4e-4), r);
        let mut poly = _mm256_set1_ps(1.987_569_1e-4);
        for c in [1.398_199_9e-3, 8.333_452e-3, 4.166_579_6e-2, 0.166_666_65, 0.5] {
            poly = _mm256_fmadd_ps(poly, r, _mm256_set1_ps(c));
        }
        let y = _mm256_fmadd_ps(_mm256_mul_ps(poly, r), r, _mm256_add_ps(r, _mm256_set1_ps(1.0)));
        // y · 2^n through the exponent bits; n >= -126 here, so 2^n is a normal float.
        let pow2n = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(
            _mm256_cvtps_epi32(n),
            _mm256_set1_epi32(127),
        )));
        _mm256_andnot_ps(underflow, _mm256_mul_ps(y, pow2n))
    }
}

#[cfg(all(test, target_arch = "x86_64", target_feature = "avx"))]
mod tests {
    use super::*;

    #[test]
    fn reduces_every_lane() {
        let xs = [1.5f32, -2.0, 8.25, 0.0, 3.0, -7.5, 4.0, 0.5];
        // SAFETY: AVX is compiled in; the load reads the 8 floats of `xs`.
        let v = unsafe { _mm256_loadu_ps(xs.as_ptr()) };
        assert_eq!(hsum(v), xs.iter().sum::<f32>());
        assert_eq!(hmax(v), 8.25);
    }
}

/// The int8 dot-product instructions of the quantized CPU kernels.
#[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma", target_feature = "f16c"))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Isa {
    /// `vpmaddubsw`/`vpmaddwd`: always present, the crate is compiled for x86-64-v3.
    Avx2,
    /// `vpdpbusd`. Only [`Isa::detect`] constructs it, after checking the CPU, so holding one
    /// proves the CPU has AVX-512 F/BW/VL and VNNI.
    Avx512Vnni,
}

#[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma", target_feature = "f16c"))]
impl Isa {
    /// The fastest set this CPU runs; called per matmul, so it allocates nothing (`std`
    /// caches the feature detection).
    pub(crate) fn detect() -> Self {
        let vnni = is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vl")
            && is_x86_feature_detected!("avx512vnni");
        if vnni { Self::Avx512Vnni } else { Self::Avx2 }
    }

    /// Every set this CPU runs, slowest first: for tests that compare the kernels.
    #[cfg(test)]
    pub(crate) fn supported() -> Vec<Self> {
        match Self::detect() {
            Self::Avx512Vnni => vec![Self::Avx2, Self::Avx512Vnni],
            Self::Avx2 => vec![Self::Avx2],
        }
    }
}
