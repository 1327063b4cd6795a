//! Skinny f32 matmuls on CPU: `x [m, k] · wᵀ` for `w [n, k]` and small `m` (a decode token,
//! or a token plus its drafts to verify).
//!
//! Decoding is bandwidth-bound: the cost is reading `w` once. General GEMM kernels pack
//! operands and fall back to single-threaded loops at `m = 1`; here each weight row is read
//! once, dotted with every row of `x` (kept hot in L1) using FMA, and the rows of `w` are split
//! across threads. Verifying `K` drafts therefore costs about the same as decoding one token.

use candle_core::{CpuStorage, DType, Result, Storage, Tensor};
use rayon::prelude::*;

/// Largest `m` served here; wider products go to the general GEMM.
pub const MAX_ROWS: usize = 16;

/// Weight rows per parallel task: large enough to amortise scheduling, small enough to balance.
const ROWS_PER_TASK: usize = 256;

/// `x [m, k] · w[n, k]ᵀ -> [m, n]`, or `None` when the operands do not suit the kernel.
pub fn matmul_t(x: &Tensor, w: &Tensor) -> Result<Option<Tensor>> {
    if !x.device().is_cpu() || x.dtype() != DType::F32 || w.dtype() != DType::F32 || !w.is_contiguous() {
        return Ok(None);
    }
    let (m, k) = x.dims2()?;
    let (n, k2) = w.dims2()?;
    if m == 0 || m > MAX_ROWS || k != k2 {
        return Ok(None);
    }
    let x = x.contiguous()?;
    let (xs, xl) = x.storage_and_layout();
    let (ws, wl) = w.storage_and_layout();
    let (Storage::Cpu(CpuStorage::F32(xv)), Storage::Cpu(CpuStorage::F32(wv))) = (&*xs, &*ws) else {
        return Ok(None);
    };
    let xv = &xv[xl.start_offset()..xl.start_offset() + m * k];
    let wv = &wv[wl.start_offset()..wl.start_offset() + n * k];
    // Output transposed ([n, m]) so each task writes one contiguous range.
    let mut out_t = vec![0f32; n * m];
    out_t.par_chunks_mut(ROWS_PER_TASK * m).enumerate().for_each(|(task, chunk)| {
        let first = task * ROWS_PER_TASK;
        for (j, dst) in chunk.chunks_mut(m).enumerate() {
            let row = &wv[(first + j) * k..(first + j + 1) * k];
            dots(xv, row, k, dst);
        }
    });
    drop((xs, ws));
    let out = if m == 1 {
        Tensor::from_vec(out_t, (1, n), x.device())?
    } else {
        Tensor::from_vec(out_t, (n, m), x.device())?.t()?.contiguous()?
    };
    Ok(Some(out))
}

/// `dst[i] = x_i · w` for every row `x_i` of `xs [m, k]`.
#[inline]
fn dots(xs: &[f32], w: &[f32], k: usize, dst: &mut [f32]) {
    #[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma"))]
    {
        // SAFETY: the target features are enabled at compile time; slices are bounds-checked
        // by construction (k divides both, tails handled below).
        unsafe { dots_avx2(xs, w, k, dst) }
    }
    #[cfg(not(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma")))]
    {
        for (i, d) in dst.iter_mut().enumerate() {
            let x = &xs[i * k..(i + 1) * k];
            *d = x.iter().zip(w).map(|(a, b)| a * b).sum();
        }
    }
}

#[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma"))]
#[target_feature(enable = "avx2,fma")]
unsafe fn dots_avx2(xs: &[f32], w: &[f32], k: usize, dst: &mut [f32]) {
    // SAFETY: every load reads 8 floats at offset o + 8 <= blocks * 8 <= k of a row of length k.
    unsafe {
        use std::arch::x86_64::*;
        let m = dst.len();
        let blocks = k / 8;
        let mut i = 0;
        // Four rows of x at a time: one load of w feeds four FMAs.
        while i + 4 <= m {
            let (x0, x1, x2, x3) = (&xs[i * k..], &xs[(i + 1) * k..], &xs[(i + 2) * k..], &xs[(i + 3) * k..]);
            let (mut a0, mut a1, mut a2, mut a3) =
                (_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps());
            for b in 0..blocks {
                let o = b * 8;
                let wv = _mm256_loadu_ps(w.as_ptr().add(o));
                a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x0.as_ptr().add(o)), wv, a0);
                a1 = _mm256_fmadd_ps(_mm256_loadu_ps(x1.as_ptr().add(o)), wv, a1);
                a2 = _mm256_fmadd_ps(_mm256_loadu_ps(x2.as_ptr().add(o)), wv, a2);
                a3 = _mm256_fmadd_ps(_mm256_loadu_ps(x3.as_ptr().add(o)), wv, a3);
            }
            for (r, acc) in [a0, a1, a2, a3].into_iter().enumerate() {
                let x = &xs[(i + r) * k..(i + r + 1) * k];
                let tail: f32 = (blocks * 8..k).map(|t| x[t] * w[t]).sum();
                dst[i + r] = hsum(acc) + tail;
            }
            i += 4;
        }
        while i < m {
            let x = &xs[i * k..(i + 1) * k];
            let (mut a0, mut a1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
            let mut b = 0;
            while b + 2 <= blocks {
                let o = b * 8;
                a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x.as_ptr().add(o)), _mm256_loadu_ps(w.as_ptr().add(o)), a0);
                a1 =
                    _mm256_fmadd_ps(_mm256_loadu_ps(x.as_ptr().add(o + 8)), _mm256_loadu_ps(w.as_ptr().add(o + 8)), a1);
                b += 2;
            }
            if b < blocks {
                let o = b * 8;
                a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x.as_ptr().add(o)), _mm256_loadu_ps(w.as_ptr().add(o)), a0);
            }
            let tail: f32 = (blocks * 8..k).map(|t| x[t] * w[t]).sum();
            dst[i] = hsum(_mm256_add_ps(a0, a1)) + tail;
            i += 1;
        }
    }
}

#[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma"))]
#[inline]
#[target_feature(enable = "avx2,fma")]
fn hsum(v: std::arch::x86_64::__m256) -> f32 {
    {
        use std::arch::x86_64::*;
        let lo = _mm256_castps256_ps128(v);
        let hi = _mm256_extractf128_ps(v, 1);
        let s = _mm_add_ps(lo, hi);
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
        _mm_cvtss_f32(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn matches_general_matmul_for_every_row_count_and_odd_k() {
        for (m, k, n) in [(1, 576, 700), (3, 576, 300), (4, 37, 5), (7, 64, 513), (16, 9, 3)] {
            let x = Tensor::randn(0f32, 1.0, (m, k), &Device::Cpu).unwrap();
            let w = Tensor::randn(0f32, 1.0, (n, k), &Device::Cpu).unwrap();
            let fast = matmul_t(&x, &w).unwrap().unwrap();
            let slow = x.matmul(&w.t().unwrap()).unwrap();
            let diff = (fast - slow).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
            assert!(diff < 1e-3, "m={m} k={k} n={n}: {diff}");
        }
    }

    #[test]
    fn declines_shapes_it_does_not_serve() {
        let x = Tensor::zeros((17, 8), DType::F32, &Device::Cpu).unwrap();
        let w = Tensor::zeros((4, 8), DType::F32, &Device::Cpu).unwrap();
        assert!(matmul_t(&x, &w).unwrap().is_none());
    }
}
