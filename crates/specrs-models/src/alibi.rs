//! ALiBi (Press et al., "Train Short, Test Long"): no position embeddings; each head adds
//! `slope · (key - query)` to its attention scores, a linear penalty on distance with a
//! geometric series of slopes over the heads. BLOOM, Falcon-RW and MPT use it.
//!
//! Every attention path adds the bias as `slope · (x - last)`, `last` the last key the query
//! sees: a constant shift per query of BLOOM's `slope · x`, so the softmax is the same, while
//! the biases stay at most 0 (no precision lost to large positions).

use candle_core::{DType, Device, Result, Tensor};

/// One slope per attention head, on the host for the CPU kernel and as a `[heads]` f32
/// tensor for the device paths.
#[derive(Debug, Clone)]
pub struct AlibiSlopes {
    host: Vec<f32>,
    device: Tensor,
}

impl AlibiSlopes {
    /// `slopes [heads]` on `device`.
    pub fn new(slopes: Vec<f32>, device: &Device) -> Result<Self> {
        let n = slopes.len();
        Ok(Self { device: Tensor::from_slice(&slopes, n, device)?, host: slopes })
    }

    /// The slopes for `n` heads, each times `scale`: for `p` the largest power of two not
    /// above `n`, `2^(-b·i/p)` for `i = 1..=p`, then for the other `n - p` heads the odd terms
    /// `2^(-b·i/2p)`, `i = 1, 3, 5, …` of the series for `2p`, `b` being `max_bias`. BLOOM's
    /// `build_alibi_tensor` is `b = 8`; MPT's (`alibi_bias_max`, over the next power of two,
    /// its even terms first) and llama.cpp's (`max_alibi_bias`) are the same series. Falcon-RW
    /// adds the bias before scaling the scores: its `scale` is the score scale.
    pub fn geometric(num_heads: usize, max_bias: f64, scale: f64, device: &Device) -> Result<Self> {
        let p = 1usize << num_heads.ilog2();
        let base = |heads: usize| 2f64.powf(-max_bias / heads as f64);
        let slopes = (1..=p)
            .map(|i| base(p).powi(i as i32))
            .chain((1..2 * (num_heads - p)).step_by(2).map(|i| base(2 * p).powi(i as i32)))
            .map(|s| (s * scale) as f32)
            .collect();
        Self::new(slopes, device)
    }

    pub fn host(&self) -> &[f32] {
        &self.host
    }

    /// `scores + slope · distances`: `heads_shape` places the `[heads]` slopes against
    /// `scores`' dims, `distances` (f32, `key - last` per query and key) broadcasts to them.
    pub(crate) fn add_bias(&self, scores: &Tensor, distances: &Tensor, heads_shape: &[usize]) -> Result<Tensor> {
        let bias = self.device.reshape(heads_shape)?.broadcast_mul(&distances.to_dtype(DType::F32)?)?;
        scores.broadcast_add(&bias)
    }
}

/// `scores` with the ALiBi bias where the layer has slopes; `distances` is built only then.
pub(crate) fn with_alibi(
    scores: Tensor,
    alibi: Option<&AlibiSlopes>,
    heads_shape: &[usize],
    distances: impl FnOnce() -> Result<Tensor>,
) -> Result<Tensor> {
    match alibi {
        Some(slopes) => slopes.add_bias(&scores, &distances()?, heads_shape),
        None => Ok(scores),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bloom_slopes_follow_the_geometric_series_and_fill_odd_head_counts_from_the_next_one() {
        let slopes = |n| AlibiSlopes::geometric(n, 8.0, 1.0, &Device::Cpu).unwrap().host().to_vec();
        // 8 heads: 2^-1 .. 2^-8.
        let want: Vec<f32> = (1..=8).map(|i| 0.5f32.powi(i)).collect();
        assert_eq!(slopes(8), want);
        // 12 heads (BLOOM-560m has 16, BLOOM-176B 112): the 8-head series, then 2^-0.5,
        // 2^-1.5, 2^-2.5, 2^-3.5 from the 16-head one.
        let twelve = slopes(12);
        assert_eq!(&twelve[..8], &want[..]);
        for (got, e) in twelve[8..].iter().zip([0.5f64, 1.5, 2.5, 3.5]) {
            assert!((f64::from(*got) - 2f64.powf(-e)).abs() < 1e-7, "{got} vs 2^-{e}");
        }
        assert_eq!(slopes(1), vec![2f32.powi(-8)]);
        let scaled = AlibiSlopes::geometric(4, 8.0, 0.25, &Device::Cpu).unwrap();
        assert_eq!(scaled.host(), &[0.0625, 0.015625, 0.00390625, 0.0009765625]);
    }

    /// MPT's `build_mpt_alibi_tensor` slopes as it computes them: `2^(-b·i/P)` for
    /// `i = 1..=P`, `P` the next power of two, reordered odd-indexed first, cut to `n`.
    fn mpt_slopes(n: usize, max_bias: f64) -> Vec<f64> {
        let p = n.next_power_of_two();
        let all: Vec<f64> = (1..=p).map(|i| 1.0 / 2f64.powf(i as f64 * max_bias / p as f64)).collect();
        if p == n {
            return all;
        }
        all.iter().skip(1).step_by(2).chain(all.iter().step_by(2)).take(n).copied().collect()
    }

    #[test]
    fn mpts_series_over_the_next_power_of_two_is_the_same_as_blooms_for_any_bias() {
        for n in [1, 4, 6, 12, 32, 48, 56, 112] {
            for max_bias in [8.0, 6.0, 12.0] {
                let ours = AlibiSlopes::geometric(n, max_bias, 1.0, &Device::Cpu).unwrap();
                for (h, (got, want)) in ours.host().iter().zip(mpt_slopes(n, max_bias)).enumerate() {
                    assert!(
                        (f64::from(*got) - want).abs() < 1e-7 * want.max(1e-3),
                        "{n} heads, b {max_bias}, head {h}"
                    );
                }
            }
        }
    }
}
