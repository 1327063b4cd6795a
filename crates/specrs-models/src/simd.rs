//! Horizontal reductions of AVX registers, shared by the CPU kernels (`attention`, `skinny`,
//! `skinny_quant`). One definition keeps the summation order, and so the kernels' bits, the same.

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
