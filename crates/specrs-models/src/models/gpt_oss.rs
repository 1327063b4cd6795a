//! `GptOssForCausalLM`: OpenAI's gpt-oss-20b and gpt-oss-120b. The shared layer with what the
//! config sets (`DecoderConfig::{attention_sinks, attention_output_bias, sliding_layers}`): q,
//! k, v and o projections with biases; a learned sink logit per head (`self_attn.sinks`)
//! counted in every softmax; sliding (`sliding_window`, 128) and full attention alternating,
//! sliding first; YaRN RoPE; and a mixture of experts under `mlp`: a biased `router` whose
//! top-k logits are softmaxed, and experts whose SwiGLU is clamped (`ExpertKind::GptOss`).
//!
//! The released checkpoints store each layer's experts together and in MXFP4
//! (`crate::weights::mxfp4`): `mlp.experts.gate_up_proj_blocks` `[E, 2I, H/32, 16]` bytes
//! with `gate_up_proj_scales` `[E, 2I, H/32]`, rows of gate and up interleaved (gate `2j`,
//! up `2j + 1`), and `down_proj_blocks` / `_scales` `[E, H, I/32, ..]`, each with a
//! `_bias` (`[E, 2I]`, `[E, H]`). Checkpoints transformers saved dequantized keep
//! `mlp.experts.gate_up_proj` `[E, H, 2I]` and `down_proj` `[E, I, H]`, inputs first. Both
//! load here: each expert dequantized on the host, its rows de-interleaved into a stacked
//! `[gate; up]` projection, and placed by the dtype policy (Q8_0 when it is left to spec-rs on
//! the CPU, where f32 would take four times the bytes of the released bf16 model).

use candle_core::quantized::GgmlDType;
use candle_core::{DType, Device, Tensor};

use crate::config::{DecoderConfig, MoeConfig};
use crate::error::{ModelError, Result};
use crate::linear::{FusedLinear, Linear};
use crate::models::transformer::{Activation, Mlp};
use crate::weights::{WeightStore, mxfp4};

/// gpt-oss needs nothing beyond what its configuration reader sets.
pub fn adapt(cfg: DecoderConfig) -> DecoderConfig {
    cfg
}

/// The experts of the mixture at `prefix` (`model.layers.{i}.mlp`), in expert order.
pub fn load_experts(store: &WeightStore, prefix: &str, hidden: usize, moe: &MoeConfig, limit: f32) -> Result<Vec<Mlp>> {
    let (experts, width) = (moe.num_experts, moe.expert_intermediate_size);
    let gate_up = ExpertWeights::open(store, &format!("{prefix}.experts.gate_up_proj"), experts, 2 * width, hidden)?;
    let down = ExpertWeights::open(store, &format!("{prefix}.experts.down_proj"), experts, hidden, width)?;
    let host_f32 = |t: Tensor| -> Result<Tensor> { Ok(t.to_dtype(DType::F32)?.to_device(&Device::Cpu)?) };
    let gate_up_bias = host_f32(store.tensor(&format!("{prefix}.experts.gate_up_proj_bias"), &[experts, 2 * width])?)?;
    let down_bias = host_f32(store.tensor(&format!("{prefix}.experts.down_proj_bias"), &[experts, hidden])?)?;
    // Gate rows are the even ones, up rows the odd ones.
    let even: Vec<u32> = (0..width as u32).map(|j| 2 * j).collect();
    let odd: Vec<u32> = (0..width as u32).map(|j| 2 * j + 1).collect();
    let (even, odd) = (Tensor::new(even.as_slice(), &Device::Cpu)?, Tensor::new(odd.as_slice(), &Device::Cpu)?);
    let bias_on_device =
        |b: Tensor| -> Result<Tensor> { Ok(b.to_dtype(store.compute_dtype())?.to_device(store.device())?) };
    let linear = |w: &Tensor, b: Tensor| -> Result<Linear> {
        let (out, inp) = w.dims2()?;
        Ok(Linear::new(store.place_dense(w, Some(GgmlDType::Q8_0))?, Some(bias_on_device(b)?), out, inp))
    };
    (0..experts)
        .map(|e| {
            let (w, b) = (gate_up.expert(e)?, gate_up_bias.get(e)?);
            let gate = linear(&w.index_select(&even, 0)?, b.index_select(&even, 0)?)?;
            let up = linear(&w.index_select(&odd, 0)?, b.index_select(&odd, 0)?)?;
            let down = linear(&down.expert(e)?, down_bias.get(e)?)?;
            Ok(Mlp::new(FusedLinear::new(vec![gate, up])?, down).with_activation(Activation::ClampedSwiGlu { limit }))
        })
        .collect()
}

/// One layer's stacked expert weights, as stored: MXFP4 bytes, or dense.
enum ExpertWeights {
    Mxfp4 {
        name: String,
        blocks: Vec<u8>,
        scales: Vec<u8>,
        rows: usize,
        cols: usize,
    },
    /// `[E, out, in]` f32 on the host.
    Dense(Tensor),
}

impl ExpertWeights {
    /// `{name}_blocks` + `{name}_scales` (`[E, out, in/32, 16]`, `[E, out, in/32]`), else the
    /// dequantized `{name}` `[E, in, out]`.
    fn open(store: &WeightStore, name: &str, experts: usize, out: usize, inp: usize) -> Result<Self> {
        let (blocks_name, scales_name) = (format!("{name}_blocks"), format!("{name}_scales"));
        if !store.contains(&blocks_name) {
            let dense = store.tensor(name, &[experts, inp, out])?;
            return Ok(Self::Dense(
                dense.to_dtype(DType::F32)?.to_device(&Device::Cpu)?.transpose(1, 2)?.contiguous()?,
            ));
        }
        if !inp.is_multiple_of(32) {
            return Err(ModelError::config(
                "intermediate_size",
                format!("MXFP4 experts need input widths that are multiples of 32, got {inp}"),
            ));
        }
        let bytes = |tensor: &str, shape: &[usize]| -> Result<Vec<u8>> {
            let t = store.stored_tensor(tensor)?;
            if t.dtype() != DType::U8 || t.dims() != shape {
                return Err(ModelError::ShapeMismatch {
                    name: format!("{tensor} (u8)"),
                    source_desc: format!("{} holding {:?}", store.description(), t.dtype()),
                    expected: shape.to_vec(),
                    got: t.dims().to_vec(),
                });
            }
            Ok(t.flatten_all()?.to_device(&Device::Cpu)?.to_vec1::<u8>()?)
        };
        let groups = inp / 32;
        Ok(Self::Mxfp4 {
            blocks: bytes(&blocks_name, &[experts, out, groups, mxfp4::BLOCK_BYTES])?,
            scales: bytes(&scales_name, &[experts, out, groups])?,
            name: name.to_string(),
            rows: out,
            cols: inp,
        })
    }

    /// Expert `e`'s weight `[out, in]`, f32 on the host.
    fn expert(&self, e: usize) -> Result<Tensor> {
        match self {
            Self::Dense(all) => Ok(all.get(e)?),
            Self::Mxfp4 { name, blocks, scales, rows, cols } => {
                let scale_count = rows * cols / 32;
                let scales = &scales[e * scale_count..(e + 1) * scale_count];
                let blocks = &blocks[e * scale_count * mxfp4::BLOCK_BYTES..(e + 1) * scale_count * mxfp4::BLOCK_BYTES];
                let values = mxfp4::dequantize(blocks, scales)
                    .ok_or_else(|| ModelError::Unsupported(format!("{name}: blocks and scales disagree")))?;
                Ok(Tensor::from_vec(values, (*rows, *cols), &Device::Cpu)?)
            }
        }
    }
}
