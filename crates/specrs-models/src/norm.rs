//! RMSNorm.

use candle_core::{Result, Tensor};

use crate::error::Result as LoadResult;
use crate::weights::WeightStore;

#[derive(Debug, Clone)]
pub struct RmsNorm {
    weight: Tensor,
    eps: f32,
}

impl RmsNorm {
    pub fn new(weight: Tensor, eps: f64) -> Self {
        Self { weight, eps: eps as f32 }
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

    /// Normalises over the last dim: `x / rms(x) * weight`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        candle_nn::ops::rms_norm(&x.contiguous()?, &self.weight, self.eps)
    }
}
