//! Linear layers over quantized (GGUF) or dense weights, and the fused projections that let
//! one matmul serve q/k/v or gate/up.

use std::borrow::Cow;
use std::sync::Arc;

use candle_core::quantized::{QMatMul, QStorage, QTensor};
use candle_core::{D, DType, Device, Module, Result, Tensor};

use crate::packed_quant::PackedQ;

/// A `[out, in]` weight.
#[derive(Debug, Clone)]
pub enum LinearWeight {
    Quantized(QMatMul),
    /// GGUF blocks repacked for the tiled AVX2 / AVX-512 VNNI kernels ([`crate::packed_quant`]).
    Packed(Arc<PackedQ>),
    Dense(Tensor),
}

impl LinearWeight {
    /// The weight in the layout this CPU multiplies fastest: GGUF Q8_0 / Q4_0 / Q4_1 weights on
    /// an x86-64-v3 build become [`LinearWeight::Packed`]; anything else is returned as is.
    pub fn packed_for_cpu(self) -> Result<Self> {
        if let Self::Quantized(QMatMul::QTensor(q)) = &self
            && let Some(p) = PackedQ::pack(q)?
        {
            return Ok(Self::Packed(Arc::new(p)));
        }
        Ok(self)
    }

    /// Quantized, in the GGUF layout or packed.
    pub fn is_quantized(&self) -> bool {
        matches!(self, Self::Quantized(_) | Self::Packed(_))
    }

    /// `x [T, in] -> [T, out]`.
    pub fn matmul_t(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            Self::Packed(p) => match p.matmul_t(x)? {
                Some(y) => Ok(y),
                // Not f32 on the CPU: through the dequantized weight (no engine path does this).
                None => x.matmul(&p.dequantize()?.to_dtype(x.dtype())?.t()?),
            },
            Self::Quantized(q) => {
                if let QMatMul::QTensor(w) = q
                    && let Some(y) = crate::skinny_quant::matmul_t(x, w)?
                {
                    return Ok(y);
                }
                q.forward(x)
            }
            Self::Dense(w) => match crate::skinny::matmul_t(x, w)? {
                Some(y) => Ok(y),
                None => x.matmul(&w.t()?),
            },
        }
    }

    /// Rows of the weight as an embedding table: `ids [T] -> [T, in]`.
    pub fn embed(&self, ids: &Tensor) -> Result<Tensor> {
        match self {
            Self::Quantized(q) => q.embedding(ids),
            Self::Packed(p) => {
                let flat = ids.flatten_all()?.to_vec1::<u32>()?;
                let mut dims = ids.dims().to_vec();
                dims.push(p.dims().1);
                p.dequantize_rows(&flat)?.reshape(dims)?.to_device(ids.device())
            }
            Self::Dense(w) => w.index_select(ids, 0),
        }
    }

    /// The weight as a dense tensor (tests, training, converters).
    pub fn dense(&self, device: &Device) -> Result<Tensor> {
        match self {
            Self::Quantized(QMatMul::QTensor(q)) => q.dequantize(device),
            Self::Packed(p) => p.dequantize()?.to_device(device),
            Self::Quantized(QMatMul::Tensor(t)) | Self::Quantized(QMatMul::TensorF16(t)) | Self::Dense(t) => {
                t.to_dtype(DType::F32)?.to_device(device)
            }
        }
    }

    /// Bytes the weight occupies on its device.
    pub fn size_in_bytes(&self) -> usize {
        match self {
            Self::Quantized(QMatMul::QTensor(q)) => q.storage_size_in_bytes(),
            Self::Packed(p) => p.size_in_bytes(),
            Self::Quantized(QMatMul::Tensor(t)) | Self::Quantized(QMatMul::TensorF16(t)) | Self::Dense(t) => {
                t.elem_count() * t.dtype().size_in_bytes()
            }
        }
    }

    /// Stacks weights along the output dim, so one matmul computes all of them. `None` when the
    /// parts cannot share one buffer (different quantized formats, or packed parts whose rows
    /// do not fill whole tiles).
    pub fn concat_rows(parts: &[&LinearWeight]) -> Result<Option<LinearWeight>> {
        let qtensors: Option<Vec<&Arc<QTensor>>> = parts
            .iter()
            .map(|p| match p {
                Self::Quantized(QMatMul::QTensor(q)) => Some(q),
                _ => None,
            })
            .collect();
        let packed: Option<Vec<&Arc<PackedQ>>> = parts
            .iter()
            .map(|p| match p {
                Self::Packed(p) => Some(p),
                _ => None,
            })
            .collect();
        if let Some(ps) = packed {
            return Ok(PackedQ::concat_rows(&ps.iter().map(|p| p.as_ref()).collect::<Vec<_>>())
                .map(|p| Self::Packed(Arc::new(p))));
        }
        if let Some(qs) = qtensors {
            let dtype = qs[0].dtype();
            let cols = qs[0].shape().dims()[1];
            if qs.iter().any(|q| q.dtype() != dtype || q.shape().dims()[1] != cols) {
                return Ok(None);
            }
            let device = qs[0].device();
            let mut bytes = Vec::new();
            let mut rows = 0;
            for q in &qs {
                bytes.extend_from_slice(&q.data()?);
                rows += q.shape().dims()[0];
            }
            let storage = QStorage::from_data(Cow::Owned(bytes), &device, dtype)?;
            let q = QTensor::new(storage, (rows, cols))?;
            return Ok(Some(Self::Quantized(QMatMul::from_arc(Arc::new(q))?)));
        }
        let dense: Option<Vec<&Tensor>> = parts
            .iter()
            .map(|p| match p {
                Self::Dense(t) => Some(t),
                _ => None,
            })
            .collect();
        match dense {
            Some(ts) if ts.iter().all(|t| t.dtype() == ts[0].dtype()) => Ok(Some(Self::Dense(Tensor::cat(&ts, 0)?))),
            _ => Ok(None),
        }
    }
}

#[derive(Debug, Clone)]
pub struct Linear {
    weight: LinearWeight,
    bias: Option<Tensor>,
    out_dim: usize,
    in_dim: usize,
}

impl Linear {
    pub fn new(weight: LinearWeight, bias: Option<Tensor>, out_dim: usize, in_dim: usize) -> Self {
        Self { weight, bias, out_dim, in_dim }
    }

    pub fn weight(&self) -> &LinearWeight {
        &self.weight
    }

    pub fn bias(&self) -> Option<&Tensor> {
        self.bias.as_ref()
    }

    pub fn out_dim(&self) -> usize {
        self.out_dim
    }

    pub fn in_dim(&self) -> usize {
        self.in_dim
    }

    /// `x [T, in] -> [T, out]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = self.weight.matmul_t(x)?;
        match &self.bias {
            Some(b) => y.broadcast_add(b),
            None => Ok(y),
        }
    }
}

/// Several linear layers over the same input computed as one matmul when their weights can
/// be stacked (q/k/v, gate/up), else one matmul each. Outputs come back split, in order.
#[derive(Debug, Clone)]
pub enum FusedLinear {
    Stacked { linear: Linear, splits: Vec<usize> },
    Separate(Vec<Linear>),
}

impl FusedLinear {
    /// A projection a checkpoint already stores fused (Phi-3's `qkv_proj`, `gate_up_proj`),
    /// its output split into `splits` consecutive parts.
    pub fn stacked(linear: Linear, splits: Vec<usize>) -> Result<Self> {
        if splits.iter().sum::<usize>() != linear.out_dim() {
            candle_core::bail!("fused projection of {} rows cannot split into {splits:?}", linear.out_dim());
        }
        Ok(Self::Stacked { linear, splits })
    }

    pub fn new(parts: Vec<Linear>) -> Result<Self> {
        let weights: Vec<&LinearWeight> = parts.iter().map(Linear::weight).collect();
        let in_dim = parts[0].in_dim();
        if parts.iter().any(|p| p.in_dim() != in_dim) {
            return Ok(Self::Separate(parts));
        }
        let Some(stacked) = LinearWeight::concat_rows(&weights)? else {
            return Ok(Self::Separate(parts));
        };
        let splits: Vec<usize> = parts.iter().map(Linear::out_dim).collect();
        let bias = if parts.iter().any(|p| p.bias().is_some()) {
            let device = stacked_device(&stacked);
            let biases = parts
                .iter()
                .map(|p| match p.bias() {
                    Some(b) => Ok(b.clone()),
                    None => Tensor::zeros(p.out_dim(), DType::F32, &device),
                })
                .collect::<Result<Vec<_>>>()?;
            Some(Tensor::cat(&biases, 0)?)
        } else {
            None
        };
        let out_dim = splits.iter().sum();
        Ok(Self::Stacked { linear: Linear::new(stacked, bias, out_dim, in_dim), splits })
    }

    /// How many outputs [`Self::forward`] returns.
    pub fn parts(&self) -> usize {
        match self {
            Self::Stacked { splits, .. } => splits.len(),
            Self::Separate(parts) => parts.len(),
        }
    }

    pub fn size_in_bytes(&self) -> usize {
        match self {
            Self::Stacked { linear, .. } => linear.weight().size_in_bytes(),
            Self::Separate(parts) => parts.iter().map(|p| p.weight().size_in_bytes()).sum(),
        }
    }

    /// `x [T, in] -> [T, out_0 + out_1 + ...]` when the parts share one stacked weight; `None`
    /// when they are separate.
    pub fn forward_stacked(&self, x: &Tensor) -> Result<Option<Tensor>> {
        match self {
            Self::Stacked { linear, .. } => linear.forward(x).map(Some),
            Self::Separate(_) => Ok(None),
        }
    }

    /// `x [T, in] -> [[T, out_0], [T, out_1], ...]`.
    pub fn forward(&self, x: &Tensor) -> Result<Vec<Tensor>> {
        match self {
            Self::Separate(parts) => parts.iter().map(|p| p.forward(x)).collect(),
            Self::Stacked { linear, splits } => {
                let y = linear.forward(x)?;
                let mut out = Vec::with_capacity(splits.len());
                let mut offset = 0;
                for &n in splits {
                    out.push(y.narrow(D::Minus1, offset, n)?);
                    offset += n;
                }
                Ok(out)
            }
        }
    }
}

fn stacked_device(w: &LinearWeight) -> Device {
    match w {
        LinearWeight::Quantized(QMatMul::QTensor(q)) => q.device(),
        LinearWeight::Packed(_) => Device::Cpu,
        LinearWeight::Quantized(QMatMul::Tensor(t))
        | LinearWeight::Quantized(QMatMul::TensorF16(t))
        | LinearWeight::Dense(t) => t.device().clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::quantized::GgmlDType;

    fn dense(rows: usize, cols: usize, seed: f32) -> Tensor {
        let v: Vec<f32> = (0..rows * cols).map(|i| ((i as f32 + seed) * 0.37).sin()).collect();
        Tensor::from_vec(v, (rows, cols), &Device::Cpu).unwrap()
    }

    #[test]
    fn fused_dense_matches_separate() {
        let a = Linear::new(LinearWeight::Dense(dense(4, 8, 0.0)), None, 4, 8);
        let b = Linear::new(
            LinearWeight::Dense(dense(2, 8, 1.0)),
            Some(Tensor::ones(2, DType::F32, &Device::Cpu).unwrap()),
            2,
            8,
        );
        let x = dense(3, 8, 2.0);
        let fused = FusedLinear::new(vec![a.clone(), b.clone()]).unwrap();
        assert!(matches!(fused, FusedLinear::Stacked { .. }));
        let outs = fused.forward(&x).unwrap();
        for (o, l) in outs.iter().zip([a, b]) {
            let diff =
                (o - l.forward(&x).unwrap()).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
            assert!(diff < 1e-6);
        }
    }

    #[test]
    fn fused_quantized_matches_separate() {
        let q = |t: Tensor| {
            LinearWeight::Quantized(QMatMul::from_qtensor(QTensor::quantize(&t, GgmlDType::Q8_0).unwrap()).unwrap())
        };
        let a = Linear::new(q(dense(4, 64, 0.0)), None, 4, 64);
        let b = Linear::new(q(dense(8, 64, 3.0)), None, 8, 64);
        let x = dense(2, 64, 5.0);
        let fused = FusedLinear::new(vec![a.clone(), b.clone()]).unwrap();
        assert!(matches!(fused, FusedLinear::Stacked { .. }));
        let outs = fused.forward(&x).unwrap();
        for (o, l) in outs.iter().zip([a, b]) {
            let diff =
                (o - l.forward(&x).unwrap()).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
            assert!(diff < 1e-5, "{diff}");
        }
    }

    #[test]
    fn packed_weights_stack_embed_and_multiply_like_their_gguf_blocks() {
        let gguf = |rows: usize, seed: f32| {
            LinearWeight::Quantized(
                QMatMul::from_qtensor(QTensor::quantize(&dense(rows, 64, seed), GgmlDType::Q4_1).unwrap()).unwrap(),
            )
        };
        let packed = gguf(48, 0.0).packed_for_cpu().unwrap();
        if !crate::packed_quant::cpu_supported() {
            assert!(matches!(packed, LinearWeight::Quantized(_)), "kept as stored where the kernels do not run");
            return;
        }
        assert!(matches!(packed, LinearWeight::Packed(_)) && packed.is_quantized());
        let stored = gguf(48, 0.0);
        let max_diff = |a: &Tensor, b: &Tensor| -> f32 {
            (a - b).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap()
        };
        // Same values: dense copies and embedding rows are equal bit for bit.
        assert_eq!(max_diff(&packed.dense(&Device::Cpu).unwrap(), &stored.dense(&Device::Cpu).unwrap()), 0.0);
        let ids = Tensor::new(&[[47u32, 0], [16, 5]], &Device::Cpu).unwrap();
        let (pe, se) = (packed.embed(&ids).unwrap(), stored.embed(&ids).unwrap());
        assert_eq!(pe.dims(), &[2, 2, 64]);
        assert_eq!(max_diff(&pe, &se), 0.0);
        let x = dense(3, 64, 7.0);
        assert!(max_diff(&packed.matmul_t(&x).unwrap(), &stored.matmul_t(&x).unwrap()) < 1e-4);
        // Parts of whole tiles stack into one packed weight; a part that ends mid-tile does not.
        let a = Linear::new(gguf(32, 1.0).packed_for_cpu().unwrap(), None, 32, 64);
        let b = Linear::new(gguf(16, 2.0).packed_for_cpu().unwrap(), None, 16, 64);
        let fused = FusedLinear::new(vec![a.clone(), b.clone()]).unwrap();
        assert!(
            matches!(&fused, FusedLinear::Stacked { linear, .. } if matches!(linear.weight(), LinearWeight::Packed(_)))
        );
        for (o, l) in fused.forward(&x).unwrap().iter().zip([a, b]) {
            assert_eq!(max_diff(o, &l.forward(&x).unwrap()), 0.0, "stacking tiles changes no bit");
        }
        let ragged = Linear::new(gguf(20, 3.0).packed_for_cpu().unwrap(), None, 20, 64);
        let whole = Linear::new(gguf(16, 4.0).packed_for_cpu().unwrap(), None, 16, 64);
        assert!(matches!(FusedLinear::new(vec![ragged, whole]).unwrap(), FusedLinear::Separate(_)));
    }
}
