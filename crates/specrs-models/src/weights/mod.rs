//! Weight loading: safetensors and GGUF checkpoints behind one store addressed by Hugging
//! Face tensor names, with shape checks and the dtype policy applied at load.

mod dtype;
pub mod gguf;
mod gguf_header;
pub mod mxfp4;
pub mod packed_int;
pub mod safetensors;

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, OnceLock};

use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{DType, Device, Tensor};

pub use dtype::{ModelDType, has_fast_cpu_kernel};
pub use gguf::GgufSource;
pub use packed_int::PackedIntFormat;
pub use safetensors::{SafetensorsSource, checkpoint_files};

use crate::error::{ModelError, Result};
use crate::linear::{Linear, LinearWeight};

pub enum WeightSource {
    Safetensors(SafetensorsSource),
    Gguf(GgufSource),
}

/// A tensor a checkpoint stores under another name, or as some rows of another tensor
/// (InternLM2's fused, head-interleaved `wqkv` read as q, k and v), or transposed (GPT-2's
/// Conv1D weights, stored `[in, out]`).
#[derive(Debug, Clone, PartialEq)]
pub struct Alias {
    pub source: String,
    /// Rows of `source` (of its transpose when `transposed`) to gather, in order; all of them
    /// when `None`.
    pub rows: Option<Vec<u32>>,
    /// `source` is a 2-D `[in, out]` weight read as `[out, in]`.
    pub transposed: bool,
}

impl Alias {
    /// `source` under another name.
    pub fn renamed(source: impl Into<String>) -> Self {
        Self { source: source.into(), rows: None, transposed: false }
    }

    /// `rows` of `source`, in order.
    pub fn rows(source: impl Into<String>, rows: Vec<u32>) -> Self {
        Self { source: source.into(), rows: Some(rows), transposed: false }
    }

    /// `source`'s transpose, or `rows` of it.
    pub fn transposed(source: impl Into<String>, rows: Option<Vec<u32>>) -> Self {
        Self { source: source.into(), rows, transposed: true }
    }
}

/// Hugging Face (Llama) names a checkpoint stores otherwise.
pub type Aliases = HashMap<String, Alias>;

/// A checkpoint opened for loading, plus the device and dtype policy to load it with.
pub struct WeightStore {
    source: WeightSource,
    device: Device,
    dtype: ModelDType,
    /// Set once the architecture is known (`models::read_config`).
    aliases: OnceLock<Aliases>,
    /// How a GPTQ or AWQ checkpoint packs its linear layers (`quantization_config`).
    packed_int: OnceLock<PackedIntFormat>,
}

impl WeightStore {
    pub fn new(source: WeightSource, device: Device, dtype: ModelDType) -> Result<Self> {
        dtype.check_device(&device)?;
        Ok(Self { source, device, dtype, aliases: OnceLock::new(), packed_int: OnceLock::new() })
    }

    /// Reads linear layers stored as `qweight` / `qzeros` / `scales` in `format`. Set once.
    pub fn set_packed_int_format(&self, format: PackedIntFormat) -> Result<()> {
        if *self.packed_int.get_or_init(|| format) != format {
            return Err(ModelError::Unsupported("a weight store's packed format cannot change once set".into()));
        }
        Ok(())
    }

    /// The prefix of a linear weight `name` (`{prefix}.weight`) a packed checkpoint stores as
    /// `{prefix}.qweight`, with the format.
    fn packed_layer<'a>(&self, s: &SafetensorsSource, name: &'a str) -> Option<(PackedIntFormat, &'a str)> {
        let format = *self.packed_int.get()?;
        let prefix = name.strip_suffix(".weight")?;
        s.contains(&format!("{prefix}.qweight")).then_some((format, prefix))
    }

    /// A packed layer's weight `[out, in]` in f32 on the host.
    fn dequantize_packed(
        &self,
        s: &SafetensorsSource,
        format: PackedIntFormat,
        prefix: &str,
        (out, inputs): (usize, usize),
    ) -> Result<Tensor> {
        format.check_layer(prefix, out, inputs)?;
        let [qweight_shape, qzeros_shape, scales_shape] = format.shapes(out, inputs);
        let part = |name: &str, shape: [usize; 2]| -> Result<Tensor> {
            let name = format!("{prefix}.{name}");
            let t = s.load_raw(&name, &Device::Cpu)?;
            self.check_shape(&name, t.dims(), &shape)?;
            Ok(t)
        };
        let ints = |t: Tensor| -> Result<Vec<i32>> { Ok(t.to_dtype(DType::I32)?.flatten_all()?.to_vec1::<i32>()?) };
        let qweight = ints(part("qweight", qweight_shape)?)?;
        let qzeros = ints(part("qzeros", qzeros_shape)?)?;
        let scales = part("scales", scales_shape)?.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
        let g_idx_name = format!("{prefix}.g_idx");
        let g_idx = match matches!(format, PackedIntFormat::Gptq { .. }) && s.contains(&g_idx_name) {
            true => {
                let t = s.load_raw(&g_idx_name, &Device::Cpu)?;
                self.check_shape(&g_idx_name, t.dims(), &[inputs])?;
                Some(ints(t)?)
            }
            false => None,
        };
        let w = format.dequantize((out, inputs), &qweight, &qzeros, &scales, g_idx.as_deref())?;
        Ok(Tensor::from_vec(w, (out, inputs), &Device::Cpu)?)
    }

    /// Reads the names in `aliases` from where the checkpoint keeps them. Set once; a second
    /// call with the same table is a no-op.
    pub fn set_aliases(&self, aliases: Aliases) -> Result<()> {
        let kept = self.aliases.get_or_init(|| aliases.clone());
        if *kept != aliases {
            return Err(ModelError::Unsupported("a weight store's aliases cannot change once set".into()));
        }
        Ok(())
    }

    fn alias(&self, name: &str) -> Option<&Alias> {
        self.aliases.get().and_then(|a| a.get(name))
    }

    /// A safetensors tensor by name, through the aliases (rows gathered on `device`).
    fn load_safetensors(&self, s: &SafetensorsSource, name: &str, device: &Device) -> Result<Tensor> {
        match self.alias(name) {
            None => s.load_raw(name, device),
            Some(Alias { source, rows, transposed }) => {
                let t = s.load_raw(source, device)?;
                let t = if *transposed { t.t()?.contiguous()? } else { t };
                match rows {
                    Some(rows) => Ok(t.index_select(&Tensor::from_slice(rows, rows.len(), device)?, 0)?),
                    None => Ok(t),
                }
            }
        }
    }

    /// The stored shape of a safetensors tensor, through the aliases.
    fn safetensors_shape(&self, s: &SafetensorsSource, name: &str) -> Option<Vec<usize>> {
        match self.alias(name) {
            None => s.shape(name),
            Some(Alias { source, rows, transposed }) => {
                let mut shape = s.shape(source)?;
                if *transposed {
                    shape.reverse();
                }
                if let Some(rows) = rows {
                    shape[0] = rows.len();
                }
                Some(shape)
            }
        }
    }

    /// Opens a GGUF file, a safetensors file or a checkpoint directory.
    pub fn open(path: &Path, device: Device, dtype: ModelDType) -> Result<Self> {
        if !path.exists() {
            return Err(ModelError::file(path, "no such file or directory"));
        }
        let source = if path.extension().is_some_and(|e| e == "gguf") {
            WeightSource::Gguf(GgufSource::open(path)?)
        } else {
            let files = checkpoint_files(path)?;
            WeightSource::Safetensors(SafetensorsSource::open(&files, path.display().to_string())?)
        };
        Self::new(source, device, dtype)
    }

    pub fn source(&self) -> &WeightSource {
        &self.source
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    pub fn dtype(&self) -> ModelDType {
        self.dtype
    }

    /// Dtype of activations and dense weights: f32 on CPU, the dense dtype on CUDA.
    pub fn compute_dtype(&self) -> DType {
        match self.dtype.dense() {
            Some(d) if !self.device.is_cpu() => d,
            _ if !self.device.is_cpu() && self.dtype == ModelDType::Auto => DType::BF16,
            _ => DType::F32,
        }
    }

    pub fn description(&self) -> &str {
        match &self.source {
            WeightSource::Safetensors(s) => s.description(),
            WeightSource::Gguf(g) => g.description(),
        }
    }

    pub fn contains(&self, name: &str) -> bool {
        match &self.source {
            WeightSource::Safetensors(s) if self.packed_layer(s, name).is_some() => true,
            WeightSource::Safetensors(s) => s.contains(self.alias(name).map_or(name, |a| a.source.as_str())),
            WeightSource::Gguf(g) => g.contains(self.alias(name).map_or(name, |a| a.source.as_str())),
        }
    }

    /// A GGUF tensor by Hugging Face name, through the aliases (rows gathered on the host).
    fn load_gguf(&self, g: &GgufSource, name: &str) -> Result<QTensor> {
        match self.alias(name) {
            None => g.load_qtensor(name, &Device::Cpu),
            // Only safetensors checkpoints store weights transposed (llama.cpp's converter turns
            // GPT-2's Conv1D weights).
            Some(Alias { transposed: true, source, .. }) => Err(ModelError::Unsupported(format!(
                "'{source}' is read transposed, which only a safetensors checkpoint asks for"
            ))),
            Some(Alias { source, rows: None, .. }) => g.load_qtensor(source, &Device::Cpu),
            Some(Alias { source, rows: Some(rows), .. }) => {
                gguf::gather_rows(&g.load_qtensor(source, &Device::Cpu)?, rows)
            }
        }
    }

    fn check_shape(&self, name: &str, got: &[usize], expected: &[usize]) -> Result<()> {
        if got != expected {
            return Err(ModelError::ShapeMismatch {
                name: name.to_string(),
                source_desc: self.description().to_string(),
                expected: expected.to_vec(),
                got: got.to_vec(),
            });
        }
        Ok(())
    }

    /// A dense tensor in the compute dtype (norm weights, biases, small drafter tensors).
    pub fn tensor(&self, name: &str, shape: &[usize]) -> Result<Tensor> {
        let t = self.tensor_any_shape(name)?;
        self.check_shape(name, t.dims(), shape)?;
        Ok(t)
    }

    /// A dense tensor without a shape check (the caller validates it).
    pub fn tensor_any_shape(&self, name: &str) -> Result<Tensor> {
        let dtype = self.compute_dtype();
        match &self.source {
            WeightSource::Safetensors(s) => {
                let raw = self.load_safetensors(s, name, &self.device)?;
                Ok(self.require_float(name, raw)?.to_dtype(dtype)?)
            }
            WeightSource::Gguf(g) => Ok(self.load_gguf(g, name)?.dequantize(&self.device)?.to_dtype(dtype)?),
        }
    }

    /// A tensor in the dtype it is stored in (gpt-oss's MXFP4 bytes); GGUF tensors dequantized.
    pub fn stored_tensor(&self, name: &str) -> Result<Tensor> {
        match &self.source {
            WeightSource::Safetensors(s) => self.load_safetensors(s, name, &self.device),
            WeightSource::Gguf(g) => Ok(self.load_gguf(g, name)?.dequantize(&self.device)?),
        }
    }

    /// Integer weights where floats belong would be cast to numbers that mean nothing, and the
    /// model would load and generate garbage.
    fn require_float(&self, name: &str, t: Tensor) -> Result<Tensor> {
        if t.dtype().is_float() {
            return Ok(t);
        }
        Err(ModelError::NotFloat {
            name: name.to_string(),
            source_desc: self.description().to_string(),
            got: format!("{:?}", t.dtype()).to_lowercase(),
        })
    }

    /// A learned scalar (Apertus's `act_fn.alpha_p`): a one-value tensor of a safetensors
    /// checkpoint, or the value llama.cpp's converter moved into the GGUF metadata.
    pub fn scalar(&self, name: &str) -> Result<f32> {
        match &self.source {
            WeightSource::Gguf(g) => g.scalar(name),
            WeightSource::Safetensors(_) => {
                let t = self.tensor_any_shape(name)?.flatten_all()?.to_dtype(DType::F32)?;
                match t.dims1()? {
                    1 => Ok(t.to_vec1::<f32>()?[0]),
                    n => Err(ModelError::ShapeMismatch {
                        name: name.to_string(),
                        source_desc: self.description().to_string(),
                        expected: vec![1],
                        got: vec![n],
                    }),
                }
            }
        }
    }

    /// An integer tensor as stored (e.g. EAGLE-3 `d2t` offsets), converted to i64.
    pub fn int_tensor(&self, name: &str, shape: &[usize]) -> Result<Tensor> {
        let t = self.stored_tensor(name)?;
        self.check_shape(name, t.dims(), shape)?;
        Ok(t.to_dtype(DType::I64)?)
    }

    /// The weight of a linear layer `[out, in]`, quantized or dense per the dtype policy;
    /// quantized weights come packed for the CPU's kernels where it has them.
    pub fn linear_weight(&self, name: &str, out_dim: usize, in_dim: usize) -> Result<LinearWeight> {
        let expected = [out_dim, in_dim];
        match &self.source {
            WeightSource::Gguf(g) => {
                let q = self.load_gguf(g, name)?;
                self.check_shape(name, q.shape().dims(), &expected)?;
                self.place_quantized(name, q)
            }
            WeightSource::Safetensors(s) => {
                // GPTQ / AWQ: read back to floats, kept at 8 bits on the CPU unless the dtype
                // says otherwise (f32 would take eight times the packed size).
                if let Some((format, prefix)) = self.packed_layer(s, name) {
                    let w = self.dequantize_packed(s, format, prefix, (out_dim, in_dim))?;
                    return self.place_dense(&w, Some(GgmlDType::Q8_0));
                }
                if let Some(shape) = self.safetensors_shape(s, name) {
                    self.check_shape(name, &shape, &expected)?;
                }
                let w = self.require_float(name, self.load_safetensors(s, name, &Device::Cpu)?)?;
                self.place_dense(&w, None)
            }
        }
    }

    /// Applies the dtype policy to a dense weight `[out, in]` on the host: quantized to the
    /// asked dtype, else `auto` when the dtype is left to spec-rs on the CPU (gpt-oss's MXFP4
    /// experts, which f32 would quadruple), else dense in the compute dtype.
    pub fn place_dense(&self, w: &Tensor, auto: Option<GgmlDType>) -> Result<LinearWeight> {
        let auto = auto.filter(|_| self.dtype == ModelDType::Auto && self.device.is_cpu());
        match self.dtype.ggml().or(auto) {
            Some(target) => {
                let q = quantize_or_fallback(&w.to_dtype(DType::F32)?, target)?;
                Ok(LinearWeight::Quantized(QMatMul::from_arc(Arc::new(move_qtensor(q, &self.device)?))?)
                    .packed_for_cpu()?)
            }
            None => Ok(LinearWeight::Dense(w.to_dtype(self.compute_dtype())?.to_device(&self.device)?)),
        }
    }

    /// Applies the dtype policy to a tensor read from a GGUF file.
    fn place_quantized(&self, name: &str, q: QTensor) -> Result<LinearWeight> {
        let stored = q.dtype();
        let target = match self.dtype {
            ModelDType::Auto if self.device.is_cpu() => {
                if has_fast_cpu_kernel(stored) || matches!(stored, GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16) {
                    None
                } else {
                    Some(GgmlDType::Q8_0)
                }
            }
            ModelDType::Auto => None,
            other => match other.ggml() {
                Some(t) if t == stored => None,
                Some(t) => Some(t),
                None => {
                    // A float dtype was asked for: dequantize.
                    let dense = q.dequantize(&Device::Cpu)?.to_dtype(self.compute_dtype())?.to_device(&self.device)?;
                    return Ok(LinearWeight::Dense(dense));
                }
            },
        };
        let q = match target {
            Some(t) => {
                tracing::debug!("requantizing {name} from {stored:?} to {t:?}");
                quantize_or_fallback(&q.dequantize(&Device::Cpu)?, t)?
            }
            None => q,
        };
        // On x86-64-v3 CPUs the blocks are repacked for the tiled kernels (same bytes, same
        // values; see `packed_quant`).
        Ok(LinearWeight::Quantized(QMatMul::from_arc(Arc::new(move_qtensor(q, &self.device)?))?).packed_for_cpu()?)
    }

    /// A linear layer with an optional bias `[out]`.
    pub fn linear(&self, prefix: &str, out_dim: usize, in_dim: usize, bias: bool) -> Result<Linear> {
        let weight = self.linear_weight(&format!("{prefix}.weight"), out_dim, in_dim)?;
        let bias = if bias { Some(self.tensor(&format!("{prefix}.bias"), &[out_dim])?) } else { None };
        Ok(Linear::new(weight, bias, out_dim, in_dim))
    }

    /// The token embedding table `[vocab, hidden]`, kept quantized when the linear layers are.
    pub fn embedding_weight(&self, name: &str, vocab: usize, hidden: usize) -> Result<LinearWeight> {
        self.linear_weight(name, vocab, hidden)
    }
}

/// Quantizes to `target`, falling back to Q8_0 (block 32) when the row length is not a
/// multiple of the target's block (K-quants need multiples of 256).
fn quantize_or_fallback(w: &Tensor, target: GgmlDType) -> Result<QTensor> {
    let cols = *w.dims().last().unwrap_or(&0);
    let target = if cols.is_multiple_of(target.block_size()) {
        target
    } else if cols.is_multiple_of(GgmlDType::Q8_0.block_size()) {
        GgmlDType::Q8_0
    } else {
        GgmlDType::F32
    };
    // candle quantizes a tensor's storage from its start: a slice of a stacked tensor (one
    // expert of a mixture) is copied out first.
    Ok(QTensor::quantize(&w.to_device(&Device::Cpu)?.to_dtype(DType::F32)?.force_contiguous()?, target)?)
}

fn move_qtensor(q: QTensor, device: &Device) -> Result<QTensor> {
    if device.is_cpu() {
        return Ok(q);
    }
    let data = q.data()?;
    let storage = candle_core::quantized::QStorage::from_data(std::borrow::Cow::Borrowed(&data), device, q.dtype())?;
    Ok(QTensor::new(storage, q.shape().clone())?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slice_of_a_stacked_tensor_quantizes_as_its_own_values() {
        // One expert of three: its values sit at an offset in the stacked storage.
        let stacked = crate::testing::random_tensor(&[3, 4, 64], 1.0, 5).unwrap();
        let second = stacked.get(1).unwrap();
        let q = quantize_or_fallback(&second, GgmlDType::Q8_0).unwrap().dequantize(&Device::Cpu).unwrap();
        let diff = crate::testing::max_abs_diff(&q, &second).unwrap();
        assert!(diff < 2e-2, "expert 1 quantized to other values: {diff}");
    }

    #[test]
    fn integer_tensors_in_float_slots_are_refused_by_name() {
        use crate::config::Architecture;
        use crate::testing::{self, TinyShape};
        let shape =
            TinyShape { vocab: 40, hidden: 32, layers: 1, heads: 4, kv_heads: 2, head_dim: 8, intermediate: 48 };
        let cfg = testing::target_config(Architecture::Llama, &shape, false);
        // A norm weight (read by `tensor`) and a projection (read by `linear_weight`).
        for (name, dtype) in [("model.norm.weight", DType::I64), ("model.layers.0.self_attn.q_proj.weight", DType::U8)]
        {
            let mut tensors = testing::random_target(Architecture::Llama, &shape, false, 3).unwrap();
            let t = tensors[name].to_dtype(dtype).unwrap();
            tensors.insert(name.to_string(), t);
            let dir = tempfile::tempdir().unwrap();
            testing::write_checkpoint(dir.path(), &cfg, &tensors).unwrap();
            let err = crate::models::load_causal_lm(dir.path(), &Device::Cpu, ModelDType::F32).err().unwrap();
            let text = err.to_string();
            assert!(matches!(err, ModelError::NotFloat { .. }), "{name}: {text}");
            let stored = format!("{dtype:?}").to_lowercase();
            assert!(text.contains(name) && text.contains(&stored), "{name}: {text}");
        }
    }
}
