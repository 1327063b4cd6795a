//! SwiGLU's `silu(gate) · up` over the fused gate/up projection's output `[T, 2·I]`.
//!
//! Through candle this is three passes on the step's serial path: silu over the strided `gate`
//! view (a scalar libm `expf` per value), a product with the strided `up` view, and the copy
//! that makes it contiguous for the down projection. On x86-64-v3 CPUs one pass here reads
//! each row once and writes `[T, I]`, eight values at a time with the vector `exp` the
//! attention kernel uses. Every value is computed alone, so a token's result does not depend
//! on the other tokens of the step. Elsewhere (CUDA, other dtypes) candle's ops run.

use candle_core::{CpuStorage, CustomOp1, D, DType, Layout, Result, Shape, Tensor};

/// `silu(gate_up[.., :I]) · gate_up[.., I:]` for `gate_up [T, 2·I]` -> `[T, I]`.
pub fn silu_mul(gate_up: &Tensor, intermediate: usize) -> Result<Tensor> {
    let fused = cfg!(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma"));
    if fused && gate_up.device().is_cpu() && gate_up.dtype() == DType::F32 && gate_up.rank() == 2 {
        let (_, width) = gate_up.dims2()?;
        if width != 2 * intermediate {
            candle_core::bail!("silu_mul: {width} columns, expected 2 x {intermediate}");
        }
        return gate_up.contiguous()?.apply_op1_no_bwd(&SiluMul { intermediate });
    }
    let gate = gate_up.narrow(D::Minus1, 0, intermediate)?;
    let up = gate_up.narrow(D::Minus1, intermediate, intermediate)?;
    candle_nn::ops::silu(&gate)? * up
}

/// Values per parallel task: below this a step's rows run inline (a pool dispatch costs more).
const TASK_VALUES: usize = 1 << 15;

struct SiluMul {
    intermediate: usize,
}

impl CustomOp1 for SiluMul {
    fn name(&self) -> &'static str {
        "silu-mul"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let CpuStorage::F32(xs) = storage else {
            candle_core::bail!("silu-mul: the CPU kernel takes f32");
        };
        let (t, width) = layout.shape().dims2()?;
        let xs = &xs[layout.start_offset()..][..t * width];
        let i = self.intermediate;
        let mut out = vec![0f32; t * i];
        let run = |(row, dst): (usize, &mut [f32])| {
            let src = &xs[row * width..][..width];
            silu_mul_row(&src[..i], &src[i..], dst);
        };
        if t * i > TASK_VALUES {
            use rayon::prelude::*;
            out.par_chunks_mut(i).enumerate().for_each(run);
        } else {
            out.chunks_mut(i).enumerate().for_each(run);
        }
        Ok((CpuStorage::F32(out), Shape::from_dims(&[t, i])))
    }
}

/// `out = silu(gate) · up`, elementwise.
fn silu_mul_row(gate: &[f32], up: &[f32], out: &mut [f32]) {
    #[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma"))]
    // SAFETY: AVX2 and FMA are compiled in.
    unsafe {
        x86::silu_mul_row(gate, up, out)
    }
    #[cfg(not(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma")))]
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        *o = g / (1.0 + (-g).exp()) * u;
    }
}

#[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma"))]
mod x86 {
    use std::arch::x86_64::*;

    use crate::simd::exp_nonpositive;

    /// See [`super::silu_mul_row`]. With `e = exp(-|g|)` (never overflows), the sigmoid is
    /// `1 / (1 + e)` for `g >= 0` and `e / (1 + e)` below; a short last chunk is padded with
    /// zeros and goes through the same lanes.
    ///
    /// # Safety
    /// The CPU runs AVX2 and FMA.
    #[inline(always)]
    pub(super) unsafe fn silu_mul_row(gate: &[f32], up: &[f32], out: &mut [f32]) {
        let n = out.len();
        assert!(gate.len() == n && up.len() == n);
        // SAFETY: register arithmetic and loads/stores of 8 floats at `c + 8 <= n` or in the
        // local 8-float buffers.
        unsafe {
            let chunk = |g: __m256, u: __m256| {
                let e = exp_nonpositive(_mm256_or_ps(g, _mm256_set1_ps(-0.0)));
                let one = _mm256_set1_ps(1.0);
                // blendv picks `e` in the lanes whose sign bit is set (g < 0, and -0.0).
                let sigmoid = _mm256_div_ps(_mm256_blendv_ps(one, e, g), _mm256_add_ps(one, e));
                _mm256_mul_ps(_mm256_mul_ps(g, sigmoid), u)
            };
            let whole = n / 8 * 8;
            for c in (0..whole).step_by(8) {
                let y = chunk(_mm256_loadu_ps(gate.as_ptr().add(c)), _mm256_loadu_ps(up.as_ptr().add(c)));
                _mm256_storeu_ps(out.as_mut_ptr().add(c), y);
            }
            if whole < n {
                let (mut g, mut u, mut y) = ([0f32; 8], [0f32; 8], [0f32; 8]);
                g[..n - whole].copy_from_slice(&gate[whole..]);
                u[..n - whole].copy_from_slice(&up[whole..]);
                _mm256_storeu_ps(y.as_mut_ptr(), chunk(_mm256_loadu_ps(g.as_ptr()), _mm256_loadu_ps(u.as_ptr())));
                out[whole..].copy_from_slice(&y[..n - whole]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use candle_core::{Device, Tensor};

    use super::*;

    /// `[t, 2·i]` values spanning where the sigmoid saturates both ways, zero and negative zero.
    fn gate_up(t: usize, i: usize) -> Tensor {
        let v: Vec<f32> = (0..t * 2 * i)
            .map(|x| match x % 97 {
                0 => 0.0,
                1 => -0.0,
                r => (r as f32 - 48.0) * 0.37 * if x % 2 == 0 { 1.0 } else { 2.5 },
            })
            .collect();
        Tensor::from_vec(v, (t, 2 * i), &Device::Cpu).unwrap()
    }

    #[test]
    fn matches_silu_times_up_in_f64() {
        // Widths with and without a short last chunk of eight, and a parallel size.
        for (t, i) in [(1, 1536), (3, 13), (40, 1000)] {
            let x = gate_up(t, i);
            let got: Vec<Vec<f32>> = silu_mul(&x, i).unwrap().to_vec2().unwrap();
            let rows: Vec<Vec<f32>> = x.to_vec2().unwrap();
            for (r, (got, row)) in got.iter().zip(&rows).enumerate() {
                for c in 0..i {
                    let (g, u) = (f64::from(row[c]), f64::from(row[i + c]));
                    let want = g / (1.0 + (-g).exp()) * u;
                    let err = (f64::from(got[c]) - want).abs();
                    assert!(err <= 4e-7 * want.abs() + 1e-30, "[{r}, {c}] of {t}x{i}: {} vs {want}", got[c]);
                }
            }
        }
    }

    #[test]
    fn a_rows_result_does_not_depend_on_the_other_rows() {
        let x = gate_up(40, 1000);
        let all: Vec<Vec<f32>> = silu_mul(&x, 1000).unwrap().to_vec2().unwrap();
        for r in [0, 17, 39] {
            let alone: Vec<Vec<f32>> = silu_mul(&x.narrow(0, r, 1).unwrap(), 1000).unwrap().to_vec2().unwrap();
            assert!(alone[0].iter().zip(&all[r]).all(|(a, b)| a.to_bits() == b.to_bits()), "row {r}");
        }
    }

    #[test]
    fn rejects_a_width_that_is_not_twice_the_intermediate_size() {
        let e = silu_mul(&gate_up(2, 8), 7).unwrap_err().to_string();
        assert!(e.contains("16 columns, expected 2 x 7"), "{e}");
    }
}
