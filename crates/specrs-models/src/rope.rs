//! Rotary position embeddings (Hugging Face rotate-half convention) at per-token positions,
//! so rows of a ragged batch each sit at their own offsets. A head may rotate only its leading
//! dims (partial rotary, Phi-4-mini); the tables are as wide as the rotated part.

use candle_core::{DType, Device, Result, Tensor};

use crate::config::RopeScaling;

/// Most cos (and sin) table entries built, positions x frequencies: 4 GiB of f32 each, 16M
/// positions of a 128-dim head (Llama 4 Scout's 10M context fits).
const MAX_TABLE_ENTRIES: usize = 1 << 30;

#[derive(Debug, Clone)]
pub struct RotaryEmbedding {
    /// `[max_positions, rotary_dim / 2]`.
    cos: Tensor,
    sin: Tensor,
    max_positions: usize,
}

/// Inverse frequencies `theta^(-2i/d)` over the `rotary_dim` rotated dims, with the
/// configured scaling applied.
pub fn inverse_frequencies(rotary_dim: usize, theta: f64, scaling: Option<&RopeScaling>) -> Vec<f64> {
    let half = rotary_dim / 2;
    let base: Vec<f64> = (0..half).map(|i| 1.0 / theta.powf(2.0 * i as f64 / rotary_dim as f64)).collect();
    let divided = |factors: &[f32]| -> Vec<f64> {
        base.iter().zip(factors.iter().chain(std::iter::repeat(&1.0))).map(|(f, s)| f / *s as f64).collect()
    };
    match scaling {
        None => base,
        Some(RopeScaling::Linear { factor }) => base.iter().map(|f| f / factor).collect(),
        Some(RopeScaling::FrequencyFactors(factors)) => divided(factors),
        Some(RopeScaling::LongRope { short_factor, long_factor, extended, .. }) => {
            divided(if *extended { long_factor } else { short_factor })
        }
        Some(RopeScaling::Yarn { params, .. }) => {
            // The dim whose frequency turns `rotations` times over the pretrained context.
            let dim_of = |rotations: f64| {
                rotary_dim as f64
                    * (params.original_max_position_embeddings / (rotations * 2.0 * std::f64::consts::PI)).ln()
                    / (2.0 * theta.ln())
            };
            let (mut low, mut high) = (dim_of(params.beta_fast), dim_of(params.beta_slow));
            if params.truncate {
                (low, high) = (low.floor(), high.ceil());
            }
            let (low, high) = (low.max(0.0), high.min(rotary_dim as f64 - 1.0));
            let span = if low == high { 0.001 } else { high - low };
            base.iter()
                .enumerate()
                .map(|(i, &f)| {
                    // 1 keeps the frequency (fast dims), 0 divides it by the factor (slow ones).
                    let keep = 1.0 - ((i as f64 - low) / span).clamp(0.0, 1.0);
                    f / params.factor * (1.0 - keep) + f * keep
                })
                .collect()
        }
        Some(RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position_embeddings }) => {
            let low_wavelen = original_max_position_embeddings / low_freq_factor;
            let high_wavelen = original_max_position_embeddings / high_freq_factor;
            base.iter()
                .map(|&f| {
                    let wavelen = 2.0 * std::f64::consts::PI / f;
                    if wavelen < high_wavelen {
                        f
                    } else if wavelen > low_wavelen {
                        f / factor
                    } else {
                        let smooth = (original_max_position_embeddings / wavelen - low_freq_factor)
                            / (high_freq_factor - low_freq_factor);
                        (1.0 - smooth) * f / factor + smooth * f
                    }
                })
                .collect()
        }
    }
}

impl RotaryEmbedding {
    /// Tables for `max_positions` positions over the leading `rotary_dim` dims of a head.
    pub fn new(
        rotary_dim: usize,
        theta: f64,
        scaling: Option<&RopeScaling>,
        max_positions: usize,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        let inv_freq = inverse_frequencies(rotary_dim, theta, scaling);
        let magnitude = scaling.map_or(1.0, RopeScaling::attention_factor);
        let half = rotary_dim / 2;
        // A context past any real model's is a corrupt config: refuse it before the allocation.
        if max_positions.checked_mul(half).is_none_or(|n| n > MAX_TABLE_ENTRIES) {
            candle_core::bail!(
                "RoPE tables for max_position_embeddings = {max_positions} ({half} frequencies each) would \
                 exceed {MAX_TABLE_ENTRIES} entries: the checkpoint's context length is corrupt"
            );
        }
        let mut cos = Vec::with_capacity(max_positions * half);
        let mut sin = Vec::with_capacity(max_positions * half);
        for p in 0..max_positions {
            for f in &inv_freq {
                // Angles in f64: at positions of tens of thousands f32 angles lose digits.
                let angle = p as f64 * f;
                cos.push((magnitude * angle.cos()) as f32);
                sin.push((magnitude * angle.sin()) as f32);
            }
        }
        let cos = Tensor::from_vec(cos, (max_positions, half), device)?.to_dtype(dtype)?;
        let sin = Tensor::from_vec(sin, (max_positions, half), device)?.to_dtype(dtype)?;
        Ok(Self { cos, sin, max_positions })
    }

    pub fn max_positions(&self) -> usize {
        self.max_positions
    }

    /// cos/sin rows of the given positions: `positions [T] (u32) -> ([T, d/2], [T, d/2])`.
    pub fn tables(&self, positions: &Tensor) -> Result<(Tensor, Tensor)> {
        Ok((self.cos.index_select(positions, 0)?, self.sin.index_select(positions, 0)?))
    }

    /// Rotates `x [T, heads, d]` with tables from [`Self::tables`]; with tables narrower than
    /// `d / 2`, only the leading `2 · width` dims of each head turn.
    pub fn apply(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
        let (t, h, d) = x.dims3()?;
        let rotary = 2 * cos.dim(1)?;
        if rotary == d {
            let x = x.contiguous()?.reshape((1, t, h, d))?;
            return candle_nn::rotary_emb::rope_thd(&x, cos, sin)?.reshape((t, h, d));
        }
        // [T, h, rotary] turned, [T, h, d - rotary] passed through.
        let turned = x.narrow(2, 0, rotary)?.contiguous()?.reshape((1, t, h, rotary))?;
        let turned = candle_nn::rotary_emb::rope_thd(&turned, cos, sin)?.reshape((t, h, rotary))?;
        Tensor::cat(&[&turned, &x.narrow(2, rotary, d - rotary)?], 2)
    }
}

/// Rows of a `heads × head_dim` q or k projection with each head's first `rotary` rows
/// reordered from interleaved pairs to halves: evens, then odds; the rest in place. Scores are
/// dot products over a head's dims, so one reordering of q and k leaves them unchanged, and it
/// turns interleaved RoPE pairs `(2i, 2i + 1)` (GLM's checkpoints, llama.cpp's permuted Llama
/// rows) into the rotate-half pairs `(i, i + r/2)` this module turns.
pub fn half_rotation_rows(heads: usize, head_dim: usize, rotary: usize) -> Vec<u32> {
    (0..heads)
        .flat_map(|h| {
            let base = h * head_dim;
            let evens = (0..rotary / 2).map(move |i| base + 2 * i);
            let odds = (0..rotary / 2).map(move |i| base + 2 * i + 1);
            evens.chain(odds).chain(base + rotary..base + head_dim).map(|r| r as u32)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_corrupt_context_length_is_refused_before_the_tables_are_allocated() {
        let e = RotaryEmbedding::new(64, 10_000.0, None, 1 << 40, DType::F32, &Device::Cpu).unwrap_err().to_string();
        assert!(e.contains("max_position_embeddings = 1099511627776") && e.contains("corrupt"), "{e}");
        let e = RotaryEmbedding::new(64, 10_000.0, None, usize::MAX, DType::F32, &Device::Cpu).unwrap_err();
        assert!(e.to_string().contains("exceed"), "{e}");
    }

    #[test]
    fn rotation_matches_rotate_half_reference() {
        let dev = Device::Cpu;
        let rope = RotaryEmbedding::new(4, 10_000.0, None, 16, DType::F32, &dev).unwrap();
        let x = Tensor::new(&[[[1f32, 2., 3., 4.]], [[0.5, -1., 2., 0.25]]], &dev).unwrap();
        let pos = Tensor::new(&[3u32, 11], &dev).unwrap();
        let (c, s) = rope.tables(&pos).unwrap();
        let y = RotaryEmbedding::apply(&x, &c, &s).unwrap().to_vec3::<f32>().unwrap();
        let inv = inverse_frequencies(4, 10_000.0, None);
        for (row, p) in [(0usize, 3f64), (1, 11f64)] {
            let xs = x.get(row).unwrap().get(0).unwrap().to_vec1::<f32>().unwrap();
            for i in 0..2 {
                let (c, s) = ((p * inv[i]).cos() as f32, (p * inv[i]).sin() as f32);
                let a = xs[i] * c - xs[i + 2] * s;
                let b = xs[i + 2] * c + xs[i] * s;
                assert!((y[row][0][i] - a).abs() < 1e-5 && (y[row][0][i + 2] - b).abs() < 1e-5);
            }
        }
    }

    /// Transformers' `apply_rotary_pos_emb` on a partial-rotary head, written out: the leading
    /// `rotary` dims rotate half against half, the rest are copied.
    fn reference_rotation(x: &[f32], p: f64, inv: &[f64], magnitude: f64) -> Vec<f32> {
        let half = inv.len();
        let mut y = x.to_vec();
        for i in 0..half {
            let (c, s) = ((magnitude * (p * inv[i]).cos()) as f32, (magnitude * (p * inv[i]).sin()) as f32);
            y[i] = x[i] * c - x[i + half] * s;
            y[i + half] = x[i + half] * c + x[i] * s;
        }
        y
    }

    #[test]
    fn partial_rotary_turns_the_leading_dims_and_copies_the_rest() {
        let dev = Device::Cpu;
        // Head of 8, rotary 6 (Phi-4-mini's 3/4).
        let rope = RotaryEmbedding::new(6, 10_000.0, None, 32, DType::F32, &dev).unwrap();
        let head: Vec<f32> = (0..8).map(|i| 0.3 * i as f32 - 1.0).collect();
        let x = Tensor::from_vec([head.clone(), head.clone()].concat(), (2, 1, 8), &dev).unwrap();
        let (c, s) = rope.tables(&Tensor::new(&[5u32, 17], &dev).unwrap()).unwrap();
        let y = RotaryEmbedding::apply(&x, &c, &s).unwrap().to_vec3::<f32>().unwrap();
        let inv = inverse_frequencies(6, 10_000.0, None);
        for (row, p) in [(0, 5.0), (1, 17.0)] {
            let want = reference_rotation(&head, p, &inv, 1.0);
            assert_eq!(y[row][0][6..], head[6..], "the pass-through dims are copied");
            for (got, want) in y[row][0].iter().zip(&want) {
                assert!((got - want).abs() < 1e-5, "{:?} vs {want:?}", y[row][0]);
            }
        }
    }

    fn long_rope(extended: bool) -> RopeScaling {
        RopeScaling::LongRope {
            short_factor: vec![1.0, 2.0],
            long_factor: vec![4.0, 8.0],
            original_max_position_embeddings: 16,
            attention_factor: 1.25,
            mscales: None,
            extended,
        }
    }

    #[test]
    fn long_rope_divides_by_the_chosen_set_and_scales_the_magnitude() {
        let dev = Device::Cpu;
        let base = inverse_frequencies(4, 10_000.0, None);
        for (extended, divisors) in [(false, [1.0, 2.0]), (true, [4.0, 8.0])] {
            let scaling = long_rope(extended);
            let inv = inverse_frequencies(4, 10_000.0, Some(&scaling));
            assert_eq!(inv, vec![base[0] / divisors[0], base[1] / divisors[1]]);
            let rope = RotaryEmbedding::new(4, 10_000.0, Some(&scaling), 64, DType::F32, &dev).unwrap();
            let x = Tensor::new(&[[[0.5f32, -1., 2., 0.25]]], &dev).unwrap();
            let (c, s) = rope.tables(&Tensor::new(&[40u32], &dev).unwrap()).unwrap();
            let y = RotaryEmbedding::apply(&x, &c, &s).unwrap().to_vec3::<f32>().unwrap();
            let want = reference_rotation(&[0.5, -1., 2., 0.25], 40.0, &inv, 1.25);
            for (got, want) in y[0][0].iter().zip(&want) {
                assert!((got - want).abs() < 1e-5, "extended {extended}: {:?} vs {want:?}", y[0][0]);
            }
        }
    }

    fn yarn(factor: f64, original: f64, truncate: bool, attention_factor: f64) -> RopeScaling {
        let params = crate::config::Yarn {
            factor,
            original_max_position_embeddings: original,
            beta_fast: 32.0,
            beta_slow: 1.0,
            truncate,
        };
        RopeScaling::Yarn { params, attention_factor }
    }

    #[test]
    fn yarn_keeps_fast_dims_divides_slow_ones_and_ramps_between() {
        // Qwen2.5's recommended YaRN: factor 4 over 32,768 pretrained positions, θ = 1e6,
        // 128-dim heads. By hand: the dim turning 32 times is 128·ln(32768 / 64π) / (2·ln 1e6)
        // = 23.6 -> 23, the one turning once 128·ln(32768 / 2π) / (2·ln 1e6) = 39.65 -> 40.
        let base = inverse_frequencies(128, 1e6, None);
        let scaled = inverse_frequencies(128, 1e6, Some(&yarn(4.0, 32768.0, true, 1.0)));
        for i in 0..=23 {
            assert_eq!(scaled[i], base[i], "dim {i} is kept");
        }
        for i in 40..64 {
            assert!((scaled[i] - base[i] / 4.0).abs() < 1e-18, "dim {i} is interpolated");
        }
        // Half way up the ramp (i = 31.5 between 23 and 40 is 0.5): dim 31 keeps 9/17 of its frequency.
        let keep = 1.0 - 8.0 / 17.0;
        assert!((scaled[31] - (base[31] / 4.0 * (1.0 - keep) + base[31] * keep)).abs() < 1e-15);
        // gpt-oss's untruncated range moves the ramp's ends off whole dims.
        let untruncated = inverse_frequencies(128, 1e6, Some(&yarn(4.0, 32768.0, false, 1.0)));
        assert_eq!(untruncated[23], base[23], "23 < 23.6: still before the ramp");
        assert_ne!(untruncated[24], scaled[24], "the ramp starts at 23.6, not 23");
    }

    #[test]
    fn yarn_scales_cos_and_sin_by_its_attention_factor() {
        let dev = Device::Cpu;
        let scaling = yarn(4.0, 16.0, true, 1.5);
        let rope = RotaryEmbedding::new(4, 10_000.0, Some(&scaling), 8, DType::F32, &dev).unwrap();
        let (c, s) = rope.tables(&Tensor::new(&[0u32], &dev).unwrap()).unwrap();
        assert_eq!(c.to_vec2::<f32>().unwrap()[0], vec![1.5, 1.5], "cos 0 times the factor");
        assert_eq!(s.to_vec2::<f32>().unwrap()[0], vec![0.0, 0.0]);
    }

    #[test]
    fn llama3_scaling_keeps_high_and_divides_low_frequencies() {
        let s = RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192.0,
        };
        let base = inverse_frequencies(128, 500_000.0, None);
        let scaled = inverse_frequencies(128, 500_000.0, Some(&s));
        assert_eq!(scaled[0], base[0]);
        assert!((scaled[63] - base[63] / 8.0).abs() < 1e-15);
    }

    #[test]
    fn rotated_rows_go_evens_then_odds_and_the_rest_stay() {
        // Two heads of 6 dims, 4 of them rotated.
        assert_eq!(half_rotation_rows(2, 6, 4), [0, 2, 1, 3, 4, 5, 6, 8, 7, 9, 10, 11]);
    }
}
