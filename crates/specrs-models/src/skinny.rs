//! Skinny f32 matmuls on CPU: `x [m, k] · wᵀ` for `w [n, k]` and small `m` (a decode token,
//! or a token plus its drafts to verify).
//!
//! Decoding is bandwidth-bound: the cost is reading `w` once. General GEMM kernels pack
//! operands and fall back to single-threaded loops at `m = 1`; here each weight row is read
//! once, dotted with every row of `x` (kept hot in L1) using FMA, and the rows of `w` are split
//! across threads. Verifying `K` drafts therefore costs about the same as decoding one token.

use crate::compute::ColumnOutput;
use candle_core::{CpuStorage, DType, Result, Storage, Tensor};
use rayon::prelude::*;

/// Largest `m` served here; wider products go to the general GEMM.
pub const MAX_ROWS: usize = 16;

/// Weight rows per parallel task: large enough to amortise scheduling, small enough to balance.
const ROWS_PER_TASK: usize = 128;

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
    let mut out = vec![0f32; m * n];
    let out_ptr = ColumnOutput { ptr: out.as_mut_ptr(), n };
    (0..n.div_ceil(ROWS_PER_TASK)).into_par_iter().for_each(|task| {
        let cols = task * ROWS_PER_TASK..n.min((task + 1) * ROWS_PER_TASK);
        // SAFETY: `out` is `[m, n]` and outlives the loop; tasks write disjoint columns.
        unsafe { columns(xv, m, k, wv, cols, out_ptr) };
    });
    drop((xs, ws));
    Ok(Some(Tensor::from_vec(out, (m, n), x.device())?))
}

/// `out[i][j] = x_i · w_j` for every row `x_i` of `xs [m, k]` and `j` in `cols`.
///
/// # Safety
/// `out` is `[m, n]` with `cols.end <= n`, and no other thread touches those columns meanwhile.
#[cfg(not(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma")))]
unsafe fn columns(xs: &[f32], m: usize, k: usize, w: &[f32], cols: std::ops::Range<usize>, out: ColumnOutput) {
    for j in cols {
        let w = &w[j * k..(j + 1) * k];
        for (i, x) in xs.chunks_exact(k).enumerate().take(m) {
            // SAFETY: `i < m`, `j < n`, and the caller gives this task column `j`.
            unsafe { *out.ptr.add(i * out.n + j) = x.iter().zip(w).map(|(a, b)| a * b).sum() };
        }
    }
}

/// As the portable version, with AVX2/FMA register tiles: one weight row × up to 4 rows of `x`.
///
/// # Safety
/// As the portable version.
#[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma"))]
unsafe fn columns(xs: &[f32], m: usize, k: usize, w: &[f32], cols: std::ops::Range<usize>, out: ColumnOutput) {
    assert!(xs.len() >= m * k && w.len() >= cols.end * k);
    for j in cols {
        let mut i = 0;
        // SAFETY: weight row `j < cols.end` and rows `i..i + R <= m` of `x` exist (asserted
        // above); the caller gives this task column `j`.
        unsafe {
            while m - i >= 4 {
                tile::<4>(xs, k, w, i, j, out);
                i += 4;
            }
            match m - i {
                1 => tile::<1>(xs, k, w, i, j, out),
                2 => tile::<2>(xs, k, w, i, j, out),
                3 => tile::<3>(xs, k, w, i, j, out),
                _ => {}
            }
        }
    }
}

/// `out[i + r][j] = x_{i + r} · w_j` for `R` rows of `x`: every 8-float load of the weight row
/// feeds `R` FMAs, and two accumulators per row keep `2R` FMA chains in flight.
///
/// # Safety
/// Rows `i..i + R` of `x` and row `j` of `w` exist; `out` has those cells to this task.
#[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma"))]
#[inline(always)]
unsafe fn tile<const R: usize>(xs: &[f32], k: usize, w: &[f32], i: usize, j: usize, out: ColumnOutput) {
    use std::arch::x86_64::*;

    use crate::simd::hsum;
    // SAFETY: every vector load reads 8 floats at offset `o + 8 <= k` of a row of length `k`
    // that the caller guarantees; AVX2 and FMA are compiled in.
    unsafe {
        let x = xs.as_ptr().add(i * k);
        let w = w.as_ptr().add(j * k);
        let mut acc = [[_mm256_setzero_ps(); 2]; R];
        let mut o = 0;
        while o + 16 <= k {
            let (w0, w1) = (_mm256_loadu_ps(w.add(o)), _mm256_loadu_ps(w.add(o + 8)));
            for (r, [a0, a1]) in acc.iter_mut().enumerate() {
                *a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x.add(r * k + o)), w0, *a0);
                *a1 = _mm256_fmadd_ps(_mm256_loadu_ps(x.add(r * k + o + 8)), w1, *a1);
            }
            o += 16;
        }
        if o + 8 <= k {
            let w0 = _mm256_loadu_ps(w.add(o));
            for (r, [a0, _]) in acc.iter_mut().enumerate() {
                *a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x.add(r * k + o)), w0, *a0);
            }
            o += 8;
        }
        for (r, &[a0, a1]) in acc.iter().enumerate() {
            let tail: f32 = (o..k).map(|t| *x.add(r * k + t) * *w.add(t)).sum();
            *out.ptr.add((i + r) * out.n + j) = hsum(_mm256_add_ps(a0, a1)) + tail;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn matches_general_matmul_for_every_row_count_and_odd_k() {
        for (m, k, n) in
            [(1, 576, 700), (3, 576, 300), (4, 37, 5), (5, 1536, 131), (7, 64, 513), (16, 9, 3), (16, 24, 2)]
        {
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
