//! RMSNorm and LayerNorm: a LayerNorm is the RMSNorm of its mean-centred input (`centered`)
//! plus its bias where it has one (StarCoder2; Cohere's have none), so one type serves both.

use candle_core::{D, Result, Tensor};

use crate::error::Result as LoadResult;
use crate::weights::WeightStore;

#[derive(Debug, Clone)]
pub struct RmsNorm {
    /// `[dim]`; ones when `head_weights` scales instead.
    weight: Tensor,
    /// `[heads, dim]`: one weight row per head of a `[.., heads, dim]` input (Cohere's q/k
    /// norms).
    head_weights: Option<Tensor>,
    eps: f32,
    /// Subtract the mean first: a LayerNorm.
    centered: bool,
    /// `[dim]`, added last: a LayerNorm's bias.
    bias: Option<Tensor>,
}

impl RmsNorm {
    pub fn new(weight: Tensor, eps: f64) -> Self {
        Self { weight, head_weights: None, eps: eps as f32, centered: false, bias: None }
    }

    /// A norm over the last dim scaled by a different weight row per head: `weights [heads, dim]`.
    pub fn per_head(weights: Tensor, eps: f64) -> Result<Self> {
        let dim = weights.dim(1)?;
        let ones = Tensor::ones(dim, weights.dtype(), weights.device())?;
        Ok(Self { weight: ones, head_weights: Some(weights), eps: eps as f32, centered: false, bias: None })
    }

    /// The same norm over the mean-centred input (`centered`): LayerNorm without bias.
    pub fn centered(self, centered: bool) -> Self {
        Self { centered, ..self }
    }

    /// The same norm with `bias [dim]` added to its output: with `centered`, a LayerNorm.
    pub fn with_bias(self, bias: Option<Tensor>) -> Self {
        Self { bias, ..self }
    }

    pub fn load(store: &WeightStore, name: &str, dim: usize, eps: f64) -> LoadResult<Self> {
        Ok(Self::new(store.tensor(name, &[dim])?, eps))
    }

    /// Gemma's RMSNorm, which scales by `1 + weight`: the stored weight plus one.
    pub fn load_offset(store: &WeightStore, name: &str, dim: usize, eps: f64) -> LoadResult<Self> {
        Ok(Self::new((store.tensor(name, &[dim])? + 1.0)?, eps))
    }

    /// [`Self::load_offset`] when `offset`, else [`Self::load`].
    pub fn load_as(store: &WeightStore, name: &str, dim: usize, eps: f64, offset: bool) -> LoadResult<Self> {
        if offset { Self::load_offset(store, name, dim, eps) } else { Self::load(store, name, dim, eps) }
    }

    pub fn weight(&self) -> &Tensor {
        &self.weight
    }

    /// Normalises over the last dim: `x / rms(x) * weight (+ bias)`, `x` centred first when
    /// `centered`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let x = match self.centered {
            true => x.broadcast_sub(&x.mean_keepdim(D::Minus1)?)?,
            false => x.contiguous()?,
        };
        let normed = candle_nn::ops::rms_norm(&x, &self.weight, self.eps)?;
        let normed = match &self.head_weights {
            Some(w) => normed.broadcast_mul(w)?,
            None => normed,
        };
        match &self.bias {
            Some(b) => normed.broadcast_add(b),
            None => Ok(normed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn a_centered_norm_is_a_layer_norm_with_or_without_bias_and_head_weights_scale_each_head() {
        let x = Tensor::new(&[[1f32, 2.0, 4.0, 9.0], [-3.0, 0.5, 0.5, 2.0]], &Device::Cpu).unwrap();
        let w = Tensor::new(&[1f32, 0.5, 2.0, -1.0], &Device::Cpu).unwrap();
        let got = RmsNorm::new(w.clone(), 1e-5).centered(true).forward(&x).unwrap();
        let want = candle_nn::ops::layer_norm(&x, &w, &w.zeros_like().unwrap(), 1e-5).unwrap();
        assert!(crate::testing::max_abs_diff(&got, &want).unwrap() < 1e-5);
        // With a bias it is the whole LayerNorm.
        let b = Tensor::new(&[0.5f32, -1.0, 0.0, 2.0], &Device::Cpu).unwrap();
        let got = RmsNorm::new(w.clone(), 1e-5).centered(true).with_bias(Some(b.clone())).forward(&x).unwrap();
        let want = candle_nn::ops::layer_norm(&x, &w, &b, 1e-5).unwrap();
        assert!(crate::testing::max_abs_diff(&got, &want).unwrap() < 1e-5);
        // Two heads of two dims, each head scaled by its own row.
        let heads = x.reshape((2, 2, 2)).unwrap();
        let rows = Tensor::new(&[[1f32, 2.0], [3.0, 4.0]], &Device::Cpu).unwrap();
        let got = RmsNorm::per_head(rows.clone(), 1e-5).unwrap().forward(&heads).unwrap();
        for h in 0..2 {
            let alone = RmsNorm::new(rows.get(h).unwrap(), 1e-5).forward(&heads.narrow(1, h, 1).unwrap()).unwrap();
            let diff = crate::testing::max_abs_diff(&got.narrow(1, h, 1).unwrap(), &alone).unwrap();
            assert!(diff < 1e-6, "head {h}: {diff}");
        }
    }
}
