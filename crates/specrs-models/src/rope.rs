//! Rotary position embeddings (Hugging Face rotate-half convention) at per-token positions,
//! so rows of a ragged batch each sit at their own offsets.

use candle_core::{DType, Device, Result, Tensor};

use crate::config::RopeScaling;

#[derive(Debug, Clone)]
pub struct RotaryEmbedding {
    /// `[max_positions, head_dim / 2]`.
    cos: Tensor,
    sin: Tensor,
    max_positions: usize,
}

/// Inverse frequencies `theta^(-2i/d)` with the configured scaling applied.
pub fn inverse_frequencies(head_dim: usize, theta: f64, scaling: Option<&RopeScaling>) -> Vec<f64> {
    let half = head_dim / 2;
    let base: Vec<f64> = (0..half).map(|i| 1.0 / theta.powf(2.0 * i as f64 / head_dim as f64)).collect();
    match scaling {
        None => base,
        Some(RopeScaling::Linear { factor }) => base.iter().map(|f| f / factor).collect(),
        Some(RopeScaling::FrequencyFactors(factors)) => {
            base.iter().zip(factors.iter().chain(std::iter::repeat(&1.0))).map(|(f, s)| f / *s as f64).collect()
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
    pub fn new(
        head_dim: usize,
        theta: f64,
        scaling: Option<&RopeScaling>,
        max_positions: usize,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        let inv_freq = inverse_frequencies(head_dim, theta, scaling);
        let half = head_dim / 2;
        let mut cos = Vec::with_capacity(max_positions * half);
        let mut sin = Vec::with_capacity(max_positions * half);
        for p in 0..max_positions {
            for f in &inv_freq {
                // Angles in f64: at positions of tens of thousands f32 angles lose digits.
                let angle = p as f64 * f;
                cos.push(angle.cos() as f32);
                sin.push(angle.sin() as f32);
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

    /// Rotates `x [T, heads, d]` with tables from [`Self::tables`].
    pub fn apply(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
        let (t, h, d) = x.dims3()?;
        let x = x.contiguous()?.reshape((1, t, h, d))?;
        candle_nn::rotary_emb::rope_thd(&x, cos, sin)?.reshape((t, h, d))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
