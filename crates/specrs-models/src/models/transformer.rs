//! The decoder every family shares: pre-norm layers of GQA attention with RoPE and a gated MLP
//! (or routed experts, `crate::moe`), run over a ragged batch against paged KV storage. The
//! families' differences are configuration read by `crate::config` (biases, q/k norms, fused
//! projections, partial rotary dims, windows, Gemma's extra norms and per-layer attention,
//! constant scales); see `crate::models`' family files. It returns logits only where asked,
//! plus residual-stream taps for drafters.

use candle_core::{DType, Device, Result, Tensor};

use crate::alibi::AlibiSlopes;
use crate::attention::{AttentionShape, AttentionSinks, fixed_attention, paged_attention};
use crate::batch::ForwardBatch;
use crate::config::{Alibi, Architecture, DecoderConfig, NormPlacement, QueryTemperature};
use crate::error::Result as LoadResult;
use crate::graph::StepInputs;
use crate::kv_cache::PagedKvCache;
use crate::linear::{FusedLinear, Linear, LinearWeight};
use crate::models::deepseek::LatentProjection;
use crate::models::{cohere, stablelm};
use crate::moe::SparseMoe;
use crate::norm::RmsNorm;
use crate::rope::RotaryEmbedding;
use crate::weights::WeightStore;

/// Attention sub-block of one decoder layer.
#[derive(Debug, Clone)]
pub struct SelfAttention {
    projection: Projection,
    o_proj: Linear,
    /// RoPE turns q and k (all but SmolLM3's NoPE layers).
    rotates: bool,
    /// Llama 4's NoPE layers multiply each query by a factor of its position.
    query_temperature: Option<QueryTemperature>,
    shape: AttentionShape,
}

/// Where an attention's queries, keys and values come from.
#[derive(Debug, Clone)]
enum Projection {
    /// Grouped heads from q/k/v projections (one fused weight or three), with optional norms.
    Grouped {
        qkv: FusedLinear,
        q_norm: Option<RmsNorm>,
        k_norm: Option<RmsNorm>,
        /// The q/k norms span all heads (`[q_dim]`, OLMo 2) rather than one head.
        qk_norm_spans_heads: bool,
        /// The per-head q/k norms come after RoPE (HunYuan), not before.
        qk_norm_after_rope: bool,
        /// q, k and v clamped to `±clip` as projected (OLMo 1, MPT), after whole-width q/k
        /// norms (OLMoE).
        clip: Option<f32>,
    },
    /// DeepSeek's multi-head latent attention: every head attends one latent entry per token.
    Latent(Box<LatentProjection>),
}

impl SelfAttention {
    pub fn load(store: &WeightStore, prefix: &str, cfg: &DecoderConfig) -> LoadResult<Self> {
        let (h, nh, nkv, d) = (cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim);
        Self::load_with_input(store, prefix, cfg, h, nh * d, nkv * d, nh, nkv, d)
    }

    /// Loads with an explicit input width (EAGLE-3's midlayer attends over `2H` inputs).
    #[allow(clippy::too_many_arguments)]
    pub fn load_with_input(
        store: &WeightStore,
        prefix: &str,
        cfg: &DecoderConfig,
        in_dim: usize,
        q_dim: usize,
        kv_dim: usize,
        num_heads: usize,
        num_kv_heads: usize,
        head_dim: usize,
    ) -> LoadResult<Self> {
        let scale = cfg.scales.attention.map_or((head_dim as f32).powf(-0.5), |s| s as f32);
        let softcap = cfg.scales.attention_softcap.map(|c| c as f32);
        let sinks = match cfg.attention_sinks {
            true => Some(AttentionSinks::new(&store.tensor(&format!("{prefix}.sinks"), &[num_heads])?)?),
            false => None,
        };
        // A bias added before the score scale is scaled with the scores.
        let alibi = match cfg.alibi {
            Some(Alibi { max_bias, before_scaling }) => {
                let slope_scale = if before_scaling { f64::from(scale) } else { 1.0 };
                Some(AlibiSlopes::geometric(num_heads, max_bias, slope_scale, store.device())?)
            }
            None => None,
        };
        let shape = AttentionShape { num_heads, num_kv_heads, head_dim, scale, softcap, sinks, alibi };
        if let Some(m) = cfg.mla {
            let projection = Projection::Latent(Box::new(LatentProjection::load(store, prefix, cfg, m, in_dim)?));
            let o_proj = store.linear(
                &format!("{prefix}.o_proj"),
                cfg.hidden_size,
                num_heads * m.v_head_dim,
                cfg.attention_output_bias,
            )?;
            return Ok(Self { projection, o_proj, rotates: true, query_temperature: None, shape });
        }
        let bias = cfg.attention_bias;
        // Some Phi-3 GGUF conversions split q, k and v; llama.cpp reads either.
        let fused = cfg.fused_projections
            && (store.contains(&format!("{prefix}.qkv_proj.weight"))
                || !store.contains(&format!("{prefix}.q_proj.weight")));
        let qkv = if fused {
            // One [q + 2·kv, in] weight: q rows, then k, then v.
            let fused = store.linear(&format!("{prefix}.qkv_proj"), q_dim + 2 * kv_dim, in_dim, bias)?;
            FusedLinear::stacked(fused, vec![q_dim, kv_dim, kv_dim])?
        } else {
            let q = store.linear(&format!("{prefix}.q_proj"), q_dim, in_dim, bias)?;
            let k = store.linear(&format!("{prefix}.k_proj"), kv_dim, in_dim, bias)?;
            let v = store.linear(&format!("{prefix}.v_proj"), kv_dim, in_dim, bias)?;
            FusedLinear::new(vec![q, k, v])?
        };
        let o_proj = store.linear(&format!("{prefix}.o_proj"), cfg.hidden_size, q_dim, cfg.attention_output_bias)?;
        let spans = cfg.qk_norm_spans_heads();
        let (q_norm_dim, k_norm_dim) = if spans { (q_dim, kv_dim) } else { (head_dim, head_dim) };
        let (q_name, k_name) = (format!("{prefix}.q_norm"), format!("{prefix}.k_norm"));
        let (q_norm, k_norm) = if cfg.qk_norm_weights_per_head() && cfg.qk_norm {
            let head_norm = |which: &str, heads: usize| match cfg.architecture {
                Architecture::StableLm => stablelm::head_norm(store, prefix, which, heads, cfg),
                _ => cohere::head_norm(store, &format!("{prefix}.{which}_norm.weight"), heads, cfg),
            };
            (Some(head_norm("q", num_heads)?), Some(head_norm("k", num_kv_heads)?))
        } else if cfg.qk_norm || store.contains(&format!("{q_name}.weight")) {
            (Some(load_norm(store, &q_name, q_norm_dim, cfg)?), Some(load_norm(store, &k_name, k_norm_dim, cfg)?))
        } else {
            (None, None)
        };
        let projection = Projection::Grouped {
            qkv,
            q_norm,
            k_norm,
            qk_norm_spans_heads: spans,
            qk_norm_after_rope: cfg.qk_norm_after_rope(),
            clip: cfg.clip_qkv,
        };
        Ok(Self { projection, o_proj, rotates: true, query_temperature: None, shape })
    }

    /// Layer `layer`'s attention: without RoPE where `rope_layers` says so (SmolLM3, Cohere 2,
    /// EXAONE 4.0, Llama 4). Llama 4's RoPE layers norm each q and k head after RoPE without
    /// weights; its NoPE layers temper their queries by position instead.
    pub fn load_layer(store: &WeightStore, prefix: &str, cfg: &DecoderConfig, layer: usize) -> LoadResult<Self> {
        let attention = Self::load(store, prefix, cfg)?;
        let rotates = cfg.layer_rotates(layer);
        let attention = if rotates { attention } else { attention.without_rope() };
        let Some(llama4) = cfg.llama4 else { return Ok(attention) };
        if !rotates {
            return Ok(Self { query_temperature: llama4.query_temperature, ..attention });
        }
        let Projection::Grouped { qkv, .. } = attention.projection else {
            return Err(crate::error::ModelError::Unsupported("Llama 4 attention with latent projections".into()));
        };
        let l2_norm = || {
            let ones = Tensor::ones(cfg.head_dim, store.compute_dtype(), store.device())?;
            Ok::<_, candle_core::Error>(RmsNorm::new(ones, cfg.rms_norm_eps))
        };
        let (q_norm, k_norm) = match llama4.qk_l2_norm {
            true => (Some(l2_norm()?), Some(l2_norm()?)),
            false => (None, None),
        };
        let projection = Projection::Grouped {
            qkv,
            q_norm,
            k_norm,
            qk_norm_spans_heads: false,
            qk_norm_after_rope: true,
            clip: None,
        };
        Ok(Self { projection, ..attention })
    }

    /// `q [T, nh, d]` times each token's temperature (Llama 4's NoPE layers), from the
    /// tokens' `positions [T]` (u32).
    fn tempered(&self, q: Tensor, positions: impl FnOnce() -> Result<Tensor>) -> Result<Tensor> {
        let Some(QueryTemperature { floor_scale, attn_scale }) = self.query_temperature else { return Ok(q) };
        // ln(floor((p + 1) / floor_scale) + 1) · attn_scale + 1, in f32: [T] -> [T, 1, 1].
        let p = positions()?.to_dtype(DType::F32)?;
        let factor = (((p + 1.0)? / floor_scale)?.floor()? + 1.0)?.log()?.affine(attn_scale, 1.0)?;
        let factor = factor.reshape((factor.dim(0)?, 1, 1))?.to_dtype(q.dtype())?;
        q.broadcast_mul(&factor)
    }

    /// Bytes of the projection weights.
    pub fn size_in_bytes(&self) -> usize {
        let projection = match &self.projection {
            Projection::Grouped { qkv, .. } => qkv.size_in_bytes(),
            Projection::Latent(latent) => latent.size_in_bytes(),
        };
        projection + self.o_proj.weight().size_in_bytes()
    }

    pub fn shape(&self) -> &AttentionShape {
        &self.shape
    }

    /// The same attention without RoPE: positions reach it only through the causal mask.
    pub fn without_rope(self) -> Self {
        Self { rotates: false, ..self }
    }

    /// Projects, normalises and rotates: `x [T, in] -> (q [T, nh, d], k [T, nkv, d], v [T, nkv, d])`.
    pub fn project(&self, x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<(Tensor, Tensor, Tensor)> {
        let (q, k, v) = match &self.projection {
            Projection::Grouped { qkv, q_norm, k_norm, qk_norm_spans_heads, qk_norm_after_rope: false, clip } => {
                let t = x.dim(0)?;
                let AttentionShape { num_heads, num_kv_heads, head_dim, .. } = self.shape;
                let mut parts = qkv.forward(x)?.into_iter();
                let (mut q, mut k, mut v) = (parts.next().unwrap(), parts.next().unwrap(), parts.next().unwrap());
                let norms = q_norm.as_ref().zip(k_norm.as_ref());
                // OLMo 2 norms [T, q_dim] and [T, kv_dim] whole, before splitting heads.
                if let Some((qn, kn)) = norms.filter(|_| *qk_norm_spans_heads) {
                    q = qn.forward(&q)?;
                    k = kn.forward(&k)?;
                }
                // OLMo's clamp: right after the projections (OLMo 1, MPT), after OLMoE's
                // whole-width q/k norms.
                if let Some(c) = clip {
                    let c = f64::from(*c);
                    (q, k, v) = (q.clamp(-c, c)?, k.clamp(-c, c)?, v.clamp(-c, c)?);
                }
                let mut q = q.reshape((t, num_heads, head_dim))?;
                let mut k = k.reshape((t, num_kv_heads, head_dim))?;
                let v = v.reshape((t, num_kv_heads, head_dim))?;
                if let Some((qn, kn)) = norms.filter(|_| !*qk_norm_spans_heads) {
                    q = qn.forward(&q)?;
                    k = kn.forward(&k)?;
                }
                (q, k, v)
            }
            // HunYuan: rotate, then norm each head.
            Projection::Grouped { qkv, q_norm, k_norm, qk_norm_after_rope: true, .. } => {
                let t = x.dim(0)?;
                let AttentionShape { num_heads, num_kv_heads, head_dim, .. } = self.shape;
                let mut parts = qkv.forward(x)?.into_iter();
                let (q, k, v) = (parts.next().unwrap(), parts.next().unwrap(), parts.next().unwrap());
                let mut q = q.reshape((t, num_heads, head_dim))?;
                let mut k = k.reshape((t, num_kv_heads, head_dim))?;
                if self.rotates {
                    q = RotaryEmbedding::apply(&q, cos, sin)?;
                    k = RotaryEmbedding::apply(&k, cos, sin)?;
                }
                if let Some((qn, kn)) = q_norm.as_ref().zip(k_norm.as_ref()) {
                    q = qn.forward(&q)?;
                    k = kn.forward(&k)?;
                }
                return Ok((q, k, v.reshape((t, num_kv_heads, head_dim))?));
            }
            Projection::Latent(latent) => {
                // The entry serves as key and value (`PagedKvCache::shared` writes keys only).
                let (q, entry) = latent.project(x)?;
                (q, entry.clone(), entry)
            }
        };
        if !self.rotates {
            return Ok((q, k, v));
        }
        let q = RotaryEmbedding::apply(&q, cos, sin)?;
        let k = RotaryEmbedding::apply(&k, cos, sin)?;
        Ok((q, k, v))
    }

    /// `x [T, in] -> [T, hidden]`, writing this step's keys and values to `layer` of `kv`.
    pub fn forward(
        &self,
        x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        kv: &PagedKvCache,
        layer: usize,
        batch: &ForwardBatch,
    ) -> Result<Tensor> {
        let t = x.dim(0)?;
        let (q, k, v) = self.project(x, cos, sin)?;
        let q = self.tempered(q, || Tensor::from_slice(&batch.positions, t, x.device()))?;
        kv.write(layer, &batch.slot_mapping, None, &k, &v)?;
        let (kc, vc) = kv.layer(layer);
        let y = paged_attention(&q, kc, vc, batch, &self.shape)?;
        self.output(&y, t)
    }

    /// `o_proj` over the attended heads `y [T, nh, d]` (latent attention's expanded to values).
    fn output(&self, y: &Tensor, t: usize) -> Result<Tensor> {
        match &self.projection {
            Projection::Latent(latent) => self.o_proj.forward(&latent.values(y)?),
            Projection::Grouped { .. } => {
                self.o_proj.forward(&y.reshape((t, self.shape.num_heads * self.shape.head_dim))?)
            }
        }
    }
}

impl SelfAttention {
    /// [`Self::forward`] on a fixed-shape batch (`crate::graph::StepInputs`): the slots and
    /// the attention metadata are device tensors, so the step never reads host data.
    pub fn forward_fixed(
        &self,
        x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        kv: &PagedKvCache,
        layer: usize,
        inputs: &StepInputs,
    ) -> Result<Tensor> {
        let t = x.dim(0)?;
        let (q, k, v) = self.project(x, cos, sin)?;
        let q = self.tempered(q, || Ok(inputs.positions.clone()))?;
        kv.write(layer, &[], Some(&inputs.slot_mapping), &k, &v)?;
        let (kc, vc) = kv.layer(layer);
        let y = fixed_attention(&q, kc, vc, &inputs.attention, &self.shape)?;
        self.output(&y, t)
    }
}

/// The gate's activation in a gated MLP.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum Activation {
    /// SwiGLU (Llama, Qwen, ...).
    #[default]
    Silu,
    /// GeGLU with the tanh approximation (`gelu_pytorch_tanh`, Gemma).
    GeluTanh,
    /// gpt-oss's experts: `(clamp(up, ±limit) + 1) · g · σ(1.702 g)` with `g = min(gate, limit)`.
    ClampedSwiGlu { limit: f32 },
    /// Arcee's MLP without a gate: `relu(up)²`.
    ReluSquared,
    /// GELU with the exact erf (GPT-NeoX's `gelu`).
    Gelu,
    /// Apertus's MLP without a gate: xIELU, with its layer's learned parameters.
    Xielu(Xielu),
}

impl Activation {
    /// The activation of `cfg`'s dense MLP `mlp_prefix`: over the gate (SwiGLU; Gemma's GeGLU),
    /// or over `up` where the MLP has no gate (Arcee's and Nemotron's `relu²`, StarCoder2's and
    /// Phi's tanh GELU, Apertus's xIELU with the layer's parameters).
    pub fn of_dense_mlp(store: &WeightStore, mlp_prefix: &str, cfg: &DecoderConfig) -> LoadResult<Self> {
        Ok(match cfg.architecture {
            _ if cfg.gemma.is_some() => Self::GeluTanh,
            Architecture::Apertus => Self::Xielu(Xielu::load(store, &format!("{mlp_prefix}.act_fn"))?),
            Architecture::Arcee | Architecture::Nemotron => Self::ReluSquared,
            Architecture::Starcoder2
            | Architecture::Phi
            | Architecture::GptBigCode
            | Architecture::Gpt2
            | Architecture::Bloom => Self::GeluTanh,
            Architecture::GptNeoX | Architecture::Falcon | Architecture::Mpt => Self::Gelu,
            _ => Self::Silu,
        })
    }

    /// Applies the activation alone (an MLP without a gate).
    fn forward(self, x: &Tensor) -> Result<Tensor> {
        match self {
            Self::Silu => candle_nn::ops::silu(x),
            Self::GeluTanh => x.gelu(),
            Self::ReluSquared => x.relu()?.sqr(),
            Self::Gelu => x.gelu_erf(),
            Self::Xielu(xielu) => xielu.forward(x),
            Self::ClampedSwiGlu { .. } => candle_core::bail!("gpt-oss's clamped SwiGLU needs a gate"),
        }
    }
}

/// xIELU (Apertus): `α_p·x² + β·x` for `x > 0`, else `(expm1(min(x, ε)) − x)·α_n + β·x`, with
/// `α_p = softplus(alpha_p)` and `α_n = β + softplus(alpha_n)` from the layer's learned
/// `act_fn.alpha_p` / `act_fn.alpha_n` (llama.cpp: `xielu.*` metadata, one value per layer).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Xielu {
    alpha_p: f64,
    alpha_n: f64,
    beta: f64,
    eps: f64,
}

impl Xielu {
    /// transformers' fixed `beta` and `eps` buffers, for checkpoints saved without them.
    const BETA: f32 = 0.5;
    const EPS: f32 = -1e-6;

    /// Reads the parameters under `prefix` (`model.layers.{i}.mlp.act_fn`).
    pub fn load(store: &WeightStore, prefix: &str) -> LoadResult<Self> {
        let scalar = |name: &str| store.scalar(&format!("{prefix}.{name}"));
        let optional = |name: &str, default: f32| match store.contains(&format!("{prefix}.{name}")) {
            true => scalar(name),
            false => Ok(default),
        };
        Ok(Self::from_raw(
            scalar("alpha_p")?,
            scalar("alpha_n")?,
            optional("beta", Self::BETA)?,
            optional("eps", Self::EPS)?,
        ))
    }

    /// From the stored (pre-softplus) parameters.
    pub fn from_raw(alpha_p: f32, alpha_n: f32, beta: f32, eps: f32) -> Self {
        let softplus = |v: f64| if v > 20.0 { v } else { v.exp().ln_1p() };
        let beta = f64::from(beta);
        Self {
            alpha_p: softplus(f64::from(alpha_p)),
            alpha_n: beta + softplus(f64::from(alpha_n)),
            beta,
            eps: f64::from(eps),
        }
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let beta_x = (x * self.beta)?;
        // x > 0: α_p·x² + β·x.
        let positive = ((x.sqr()? * self.alpha_p)? + &beta_x)?;
        // x ≤ 0: (e^min(x, ε) − 1 − x)·α_n + β·x.
        let negative = ((((x.minimum(self.eps)?.exp()? - 1.0)? - x)? * self.alpha_n)? + &beta_x)?;
        x.gt(0.0)?.where_cond(&positive, &negative)
    }
}

/// gpt-oss's SwiGLU slope.
const GPT_OSS_ALPHA: f64 = 1.702;

/// Gated MLP: `down(act(gate(x)) * up(x))`, SwiGLU unless told otherwise; or, without a gate,
/// `down(act(up(x)))` (Arcee's `relu²`, StarCoder2's GELU).
#[derive(Debug, Clone)]
pub struct Mlp {
    /// `[gate, up]`, or `[up]` alone for an MLP without a gate.
    gate_up: FusedLinear,
    down_proj: Linear,
    act: Activation,
}

impl Mlp {
    pub fn load(store: &WeightStore, prefix: &str, hidden: usize, intermediate: usize) -> LoadResult<Self> {
        Self::load_biased(store, prefix, hidden, intermediate, false)
    }

    /// A SwiGLU MLP whose three projections have biases when `bias` (Llama's `mlp_bias`).
    pub fn load_biased(
        store: &WeightStore,
        prefix: &str,
        hidden: usize,
        intermediate: usize,
        bias: bool,
    ) -> LoadResult<Self> {
        let gate = store.linear(&format!("{prefix}.gate_proj"), intermediate, hidden, bias)?;
        let up = store.linear(&format!("{prefix}.up_proj"), intermediate, hidden, bias)?;
        Ok(Self {
            gate_up: FusedLinear::new(vec![gate, up])?,
            down_proj: store.linear(&format!("{prefix}.down_proj"), hidden, intermediate, bias)?,
            act: Activation::Silu,
        })
    }

    /// An MLP without a gate: `up_proj`, then `act`, then `down_proj`, both projections biased
    /// when `bias` (Arcee's `relu²`; StarCoder2's `c_fc`, GELU, `c_proj`).
    pub fn load_ungated(
        store: &WeightStore,
        prefix: &str,
        (hidden, intermediate): (usize, usize),
        bias: bool,
        act: Activation,
    ) -> LoadResult<Self> {
        let up = store.linear(&format!("{prefix}.up_proj"), intermediate, hidden, bias)?;
        Ok(Self {
            gate_up: FusedLinear::new(vec![up])?,
            down_proj: store.linear(&format!("{prefix}.down_proj"), hidden, intermediate, bias)?,
            act,
        })
    }

    /// The same MLP with another gate activation.
    pub fn with_activation(self, act: Activation) -> Self {
        Self { act, ..self }
    }

    /// An MLP from its fused gate/up projection (`[2·I, H]`, gate rows first) and down projection.
    pub fn new(gate_up: FusedLinear, down_proj: Linear) -> Self {
        Self { gate_up, down_proj, act: Activation::Silu }
    }

    /// Loads a checkpoint's fused `gate_up_proj` (`[2·I, H]`, gate rows first).
    pub fn load_fused(store: &WeightStore, prefix: &str, hidden: usize, intermediate: usize) -> LoadResult<Self> {
        let gate_up = store.linear(&format!("{prefix}.gate_up_proj"), 2 * intermediate, hidden, false)?;
        Ok(Self {
            gate_up: FusedLinear::stacked(gate_up, vec![intermediate, intermediate])?,
            down_proj: store.linear(&format!("{prefix}.down_proj"), hidden, intermediate, false)?,
            act: Activation::Silu,
        })
    }

    pub fn size_in_bytes(&self) -> usize {
        self.gate_up.size_in_bytes() + self.down_proj.weight().size_in_bytes()
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if self.gate_up.parts() == 1 {
            // No gate: [T, H] -> act(up) [T, I] -> [T, H].
            let up = self.gate_up.forward(x)?.into_iter().next().unwrap();
            return self.down_proj.forward(&self.act.forward(&up)?);
        }
        if let Activation::ClampedSwiGlu { limit } = self.act {
            // [T, H] -> (clamp(up) + 1) · g · sigmoid(1.702 g) [T, I] -> [T, H].
            let mut parts = self.gate_up.forward(x)?.into_iter();
            let (gate, up) = (parts.next().unwrap(), parts.next().unwrap());
            let limit = f64::from(limit);
            let gate = gate.minimum(limit)?;
            let up = up.clamp(-limit, limit)?;
            let glu = (&gate * candle_nn::ops::sigmoid(&(&gate * GPT_OSS_ALPHA)?)?)?;
            return self.down_proj.forward(&((up + 1.0)? * glu)?);
        }
        if self.act == Activation::GeluTanh {
            // [T, H] -> gelu_tanh(gate) · up [T, I] -> [T, H].
            let mut parts = self.gate_up.forward(x)?.into_iter();
            let (gate, up) = (parts.next().unwrap(), parts.next().unwrap());
            return self.down_proj.forward(&(gate.gelu()? * up)?);
        }
        // [T, H] -> [T, 2·I] -> silu(gate) · up [T, I] -> [T, H].
        let hidden = match self.gate_up.forward_stacked(x)? {
            Some(gate_up) => crate::activation::silu_mul(&gate_up, self.down_proj.in_dim())?,
            None => {
                let mut parts = self.gate_up.forward(x)?.into_iter();
                let (gate, up) = (parts.next().unwrap(), parts.next().unwrap());
                (candle_nn::ops::silu(&gate)? * up)?
            }
        };
        self.down_proj.forward(&hidden)
    }
}

/// A layer's feed-forward: a dense SwiGLU MLP, or sparse experts (`crate::moe`).
#[derive(Debug, Clone)]
pub enum FeedForward {
    Dense(Mlp),
    Sparse(Box<SparseMoe>),
}

impl FeedForward {
    pub fn size_in_bytes(&self) -> usize {
        match self {
            Self::Dense(mlp) => mlp.size_in_bytes(),
            Self::Sparse(moe) => moe.size_in_bytes(),
        }
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            Self::Dense(mlp) => mlp.forward(x),
            Self::Sparse(moe) => moe.forward(x),
        }
    }
}

/// One decoder layer, its norms where the family puts them (`NormPlacement`): before
/// attention and MLP (Llama), also after them (Gemma, GLM-4), only after them (OLMo 2), or one
/// before attention and MLP side by side (Cohere).
#[derive(Debug, Clone)]
pub struct DecoderLayer {
    input_layernorm: Option<RmsNorm>,
    self_attn: SelfAttention,
    /// Gemma's and OLMo 2's `post_attention_layernorm`, over the attention's output.
    attention_out_norm: Option<RmsNorm>,
    /// Before the MLP: `post_attention_layernorm` (Llama), `pre_feedforward_layernorm` (Gemma).
    mlp_in_norm: Option<RmsNorm>,
    mlp: FeedForward,
    /// Gemma's `post_feedforward_layernorm`, over the MLP's output.
    mlp_out_norm: Option<RmsNorm>,
    /// Granite's `residual_multiplier` on each branch (1 elsewhere).
    residual_scale: f64,
    /// Attention and MLP read the same normed input and both join the residual (Cohere).
    parallel: bool,
}

impl DecoderLayer {
    /// Loads layer `index` (named `prefix`), sparse where the config's experts say.
    pub fn load(store: &WeightStore, prefix: &str, index: usize, cfg: &DecoderConfig) -> LoadResult<Self> {
        let mlp_prefix = format!("{prefix}.mlp");
        let (h, i) = (cfg.hidden_size, cfg.intermediate_size);
        let placement = cfg.norm_placement();
        let mlp =
            match &cfg.moe {
                Some(moe) if moe.is_sparse_layer(index) => {
                    FeedForward::Sparse(Box::new(SparseMoe::load(store, &mlp_prefix, h, moe)?))
                }
                _ if !cfg.mlp_is_gated() => FeedForward::Dense(Mlp::load_ungated(
                    store,
                    &mlp_prefix,
                    (h, i),
                    cfg.mlp_bias,
                    Activation::of_dense_mlp(store, &mlp_prefix, cfg)?,
                )?),
                _ if cfg.fused_projections => FeedForward::Dense(Mlp::load_fused(store, &mlp_prefix, h, i)?),
                _ => FeedForward::Dense(
                    Mlp::load_biased(store, &mlp_prefix, h, i, cfg.mlp_bias)?
                        .with_activation(Activation::of_dense_mlp(store, &mlp_prefix, cfg)?),
                ),
            };
        let norm = |name: &str| load_norm(store, &format!("{prefix}.{name}"), h, cfg);
        let parallel = placement == NormPlacement::Parallel;
        let (before, after) = match placement {
            NormPlacement::Pre | NormPlacement::Parallel => (true, false),
            NormPlacement::Sandwich => (true, true),
            NormPlacement::Post => (false, true),
        };
        let mlp_in = if after { "pre_feedforward_layernorm" } else { "post_attention_layernorm" };
        Ok(Self {
            input_layernorm: if before { Some(norm("input_layernorm")?) } else { None },
            self_attn: SelfAttention::load_layer(store, &format!("{prefix}.self_attn"), cfg, index)?,
            attention_out_norm: if after { Some(norm("post_attention_layernorm")?) } else { None },
            mlp_in_norm: if before && (!parallel || cfg.parallel_mlp_norm) { Some(norm(mlp_in)?) } else { None },
            mlp,
            mlp_out_norm: if after { Some(norm("post_feedforward_layernorm")?) } else { None },
            residual_scale: cfg.scales.residual,
            parallel,
        })
    }

    pub fn size_in_bytes(&self) -> usize {
        self.self_attn.size_in_bytes() + self.mlp.size_in_bytes()
    }

    /// The residual updates around attention's output `attended` over the normed input
    /// `attention_in`: `x + attended`, then the MLP's, each output normed first where the
    /// layer normalises outputs; or, side by side, `x + attended + mlp(attention_in)`.
    fn finish(&self, x: &Tensor, attention_in: &Tensor, attended: Tensor) -> Result<Tensor> {
        if self.parallel {
            // GPT-NeoX norms the MLP's input apart; Cohere's MLP reads attention's.
            let mlp_in = match &self.mlp_in_norm {
                Some(n) => n.forward(x)?,
                None => attention_in.clone(),
            };
            return (x + attended)? + self.mlp.forward(&mlp_in)?;
        }
        let branch = |h: Tensor, norm: &Option<RmsNorm>| -> Result<Tensor> {
            let h = match norm {
                Some(n) => n.forward(&h)?,
                None => h,
            };
            if self.residual_scale == 1.0 { Ok(h) } else { h.affine(self.residual_scale, 0.0) }
        };
        let x = (x + branch(attended, &self.attention_out_norm)?)?;
        let h = self.mlp.forward(&normed(&self.mlp_in_norm, &x)?)?;
        x + branch(h, &self.mlp_out_norm)?
    }

    pub fn forward(
        &self,
        x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        kv: &PagedKvCache,
        layer: usize,
        batch: &ForwardBatch,
    ) -> Result<Tensor> {
        let attention_in = normed(&self.input_layernorm, x)?;
        let h = self.self_attn.forward(&attention_in, cos, sin, kv, layer, batch)?;
        self.finish(x, &attention_in, h)
    }
}

impl DecoderLayer {
    /// [`Self::forward`] on a fixed-shape batch.
    pub fn forward_fixed(
        &self,
        x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        kv: &PagedKvCache,
        layer: usize,
        inputs: &StepInputs,
    ) -> Result<Tensor> {
        let attention_in = normed(&self.input_layernorm, x)?;
        let h = self.self_attn.forward_fixed(&attention_in, cos, sin, kv, layer, inputs)?;
        self.finish(x, &attention_in, h)
    }
}

/// The norm `{name}.weight` (and `{name}.bias`) over `dim` of `cfg`'s kind: RMSNorm, Gemma's
/// `1 + weight`, or LayerNorm with or without bias.
fn load_norm(store: &WeightStore, name: &str, dim: usize, cfg: &DecoderConfig) -> LoadResult<RmsNorm> {
    let norm = match cfg.norms_weightless() {
        true => RmsNorm::new(Tensor::ones(dim, store.compute_dtype(), store.device())?, cfg.rms_norm_eps),
        false => RmsNorm::load_as(store, &format!("{name}.weight"), dim, cfg.rms_norm_eps, cfg.norms_add_one())?,
    };
    let bias = match cfg.norms_have_bias() {
        true => Some(store.tensor(&format!("{name}.bias"), &[dim])?),
        false => None,
    };
    Ok(norm.centered(cfg.centered_norms()).with_bias(bias))
}

/// `x` through `norm`, or `x` itself where the layer has none there.
fn normed(norm: &Option<RmsNorm>, x: &Tensor) -> Result<Tensor> {
    match norm {
        Some(n) => n.forward(x),
        None => Ok(x.clone()),
    }
}

/// What a forward pass returns.
#[derive(Debug, Clone)]
pub struct ForwardOutput {
    /// `[logits_indices.len(), vocab]` f32, or `None` when no logits were asked for.
    pub logits: Option<Tensor>,
    /// One `[T, hidden]` tensor per requested tap, in request order.
    pub taps: Vec<Tensor>,
    /// `[T, hidden]` final normed hidden states, when asked for.
    pub final_hidden: Option<Tensor>,
}

/// An output head: `lm_head` and what the model does to its logits after it (Phi's bias,
/// Granite's divisor, Gemma 2's soft cap). Drafters that share the target's head share all of
/// it, so their drafts rank and weigh tokens as the target does.
#[derive(Debug, Clone)]
pub struct LogitsHead {
    weight: LinearWeight,
    /// `[vocab]` f32, each row's logit multiplied by it: one over the row's L2 norm where the
    /// head's rows are normalised (Baichuan 2's `NormHead`).
    row_scale: Option<Tensor>,
    /// `[vocab]` f32, added to the logits (Phi).
    bias: Option<Tensor>,
    divisor: f64,
    softcap: Option<f32>,
}

impl LogitsHead {
    /// A bare `lm_head` (a drafter's own).
    pub fn plain(weight: LinearWeight) -> Self {
        Self { weight, row_scale: None, bias: None, divisor: 1.0, softcap: None }
    }

    /// `[vocab]` f32: one over each row's L2 norm of `weight` (`F.normalize`'s, its floor
    /// 1e-12), read once at load (a quantized head is dequantized for it).
    fn inverse_row_norms(weight: &LinearWeight, device: &Device) -> Result<Tensor> {
        let w = weight.dense(device)?.to_dtype(DType::F32)?;
        w.sqr()?.sum(1)?.sqrt()?.maximum(1e-12)?.recip()
    }

    /// `normed [N, hidden] -> logits [N, vocab]` (f32).
    pub fn forward(&self, normed: &Tensor) -> Result<Tensor> {
        let logits = self.weight.matmul_t(normed)?.to_dtype(DType::F32)?;
        let logits = match &self.row_scale {
            Some(s) => logits.broadcast_mul(s)?,
            None => logits,
        };
        let logits = match &self.bias {
            Some(b) => logits.broadcast_add(b)?,
            None => logits,
        };
        let logits = match self.divisor {
            1.0 => logits,
            divisor => logits.affine(1.0 / divisor, 0.0)?,
        };
        crate::attention::soft_capped(logits, self.softcap)
    }

    /// The head over only the vocabulary rows `ids`, dense f32 on `device`, its transforms
    /// kept: the target a reduced-vocabulary draft is trained to rank like.
    pub fn rows(&self, ids: &[u32], device: &Device) -> Result<Self> {
        let index = Tensor::from_slice(ids, ids.len(), device)?;
        let weight = self.weight.dense(device)?.to_dtype(DType::F32)?.index_select(&index, 0)?;
        let select = |t: &Option<Tensor>| t.as_ref().map(|t| t.to_device(device)?.index_select(&index, 0)).transpose();
        Ok(Self {
            weight: LinearWeight::Dense(weight),
            row_scale: select(&self.row_scale)?,
            bias: select(&self.bias)?,
            divisor: self.divisor,
            softcap: self.softcap,
        })
    }

    /// The `[vocab, hidden]` weight, dense f32 on `device`, its rows scaled as the logits are
    /// and divided by the model's logit divisor: a plain head that starts where this one's
    /// scores are before bias and cap.
    pub fn scaled_weight(&self, device: &Device) -> Result<Tensor> {
        let w = self.weight.dense(device)?.to_dtype(DType::F32)?;
        let w = match &self.row_scale {
            Some(s) => w.broadcast_mul(&s.to_device(device)?.unsqueeze(1)?)?,
            None => w,
        };
        w.affine(1.0 / self.divisor, 0.0)
    }
}

/// A Llama-family causal language model.
#[derive(Debug, Clone)]
pub struct CausalLm {
    config: DecoderConfig,
    embed_tokens: LinearWeight,
    layers: Vec<DecoderLayer>,
    norm: RmsNorm,
    head: LogitsHead,
    /// `[max_positions, hidden]` learned positions added to the embeddings (GPT-2,
    /// GPT-BigCode).
    embed_positions: Option<Tensor>,
    /// The LayerNorm over the embeddings (BLOOM).
    embed_norm: Option<RmsNorm>,
    rope: RotaryEmbedding,
    /// Gemma's sliding layers' RoPE (their own base, no scaling).
    local_rope: Option<RotaryEmbedding>,
    device: Device,
    dtype: DType,
}

impl CausalLm {
    /// Loads every weight with Hugging Face names from `store`.
    pub fn load(store: &WeightStore, config: DecoderConfig) -> LoadResult<Self> {
        let (h, v) = (config.hidden_size, config.vocab_size);
        let embed_tokens = store.embedding_weight("model.embed_tokens.weight", v, h)?;
        let layers = (0..config.num_hidden_layers)
            .map(|i| DecoderLayer::load(store, &format!("model.layers.{i}"), i, &config))
            .collect::<LoadResult<Vec<_>>>()?;
        let norm = load_norm(store, "model.norm", h, &config)?;
        let lm_head = if config.tie_word_embeddings {
            embed_tokens.clone()
        } else {
            store.linear_weight("lm_head.weight", v, h)?
        };
        let head = LogitsHead {
            row_scale: match config.lm_head_normalized {
                true => Some(LogitsHead::inverse_row_norms(&lm_head, store.device())?),
                false => None,
            },
            weight: lm_head,
            bias: match config.lm_head_bias {
                true => Some(store.tensor("lm_head.bias", &[v])?.to_dtype(DType::F32)?),
                false => None,
            },
            divisor: config.scales.logits_divisor,
            softcap: config.scales.logits_softcap.map(|c| c as f32),
        };
        let dtype = store.compute_dtype();
        let embed_norm = match config.embedding_norm {
            true => Some(load_norm(store, "model.embed_norm", h, &config)?),
            false => None,
        };
        let embed_positions = match config.learned_positions {
            true => Some(
                store.tensor("model.embed_positions.weight", &[config.max_position_embeddings, h])?.to_dtype(dtype)?,
            ),
            false => None,
        };
        let rope = RotaryEmbedding::new(
            config.rotary_dim,
            config.rope_theta,
            config.rope_scaling.as_ref(),
            config.max_position_embeddings,
            dtype,
            store.device(),
        )?;
        // Sliding layers that turn otherwise: Gemma 3's own base, OLMo 3's unscaled RoPE.
        let local_rope = match config.sliding_rope_theta() {
            Some(base) => Some(RotaryEmbedding::new(
                config.rotary_dim,
                base,
                None,
                config.max_position_embeddings,
                dtype,
                store.device(),
            )?),
            None => None,
        };
        Ok(Self {
            config,
            embed_tokens,
            layers,
            norm,
            head,
            embed_positions,
            embed_norm,
            rope,
            local_rope,
            device: store.device().clone(),
            dtype,
        })
    }

    pub fn config(&self) -> &DecoderConfig {
        &self.config
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn rope(&self) -> &RotaryEmbedding {
        &self.rope
    }

    pub fn embed_tokens(&self) -> &LinearWeight {
        &self.embed_tokens
    }

    /// The output head with the model's logit transforms, for drafters that share it.
    pub fn logits_head(&self) -> &LogitsHead {
        &self.head
    }

    /// Bits per weight of the decoder layers' projections (32 for f32, 5 for GGUF Q4_1): the
    /// precision the checkpoint was quantized to, which a tied or kept-precise head would hide.
    pub fn layer_bits_per_weight(&self) -> f64 {
        let c = &self.config;
        let attention = c.attention_params();
        let feed_forward = |layer: usize| match &c.moe {
            Some(moe) if moe.is_sparse_layer(layer) => {
                let shared = moe.shared_expert.as_ref().map_or(0, |s| 3 * s.intermediate_size + usize::from(s.gated));
                c.hidden_size * (moe.num_experts * (3 * moe.expert_intermediate_size + 1) + shared)
            }
            _ if c.mlp_is_gated() => 3 * c.hidden_size * c.intermediate_size,
            _ => 2 * c.hidden_size * c.intermediate_size,
        };
        let params: usize = (0..self.layers.len()).map(|i| attention + feed_forward(i)).sum();
        let bytes: usize = self.layers.iter().map(DecoderLayer::size_in_bytes).sum();
        bytes as f64 * 8.0 / params.max(1) as f64
    }

    /// Bytes of weights on the device (the memory planner subtracts them from its budget).
    pub fn weight_bytes(&self) -> usize {
        let layers: usize = self.layers.iter().map(DecoderLayer::size_in_bytes).sum();
        let head = if self.config.tie_word_embeddings { 0 } else { self.head.weight.size_in_bytes() };
        let positions = self.embed_positions.as_ref().map_or(0, |t| t.elem_count() * t.dtype().size_in_bytes());
        layers + self.embed_tokens.size_in_bytes() + head + positions
    }

    /// A paged KV cache shaped for this model.
    pub fn new_kv_cache(&self, num_blocks: usize, block_size: usize) -> Result<PagedKvCache> {
        PagedKvCache::for_config(
            &self.config,
            self.config.num_hidden_layers,
            num_blocks,
            block_size,
            self.dtype,
            &self.device,
        )
    }

    /// `ids [T] -> [T, hidden]`.
    pub fn embed(&self, ids: &Tensor) -> Result<Tensor> {
        let x = self.embed_tokens.embed(ids)?.to_dtype(self.dtype)?;
        match self.config.scales.embedding {
            1.0 => Ok(x),
            // In the activations' dtype, as Gemma rounds its sqrt(hidden).
            scale => x.broadcast_mul(&Tensor::new(scale as f32, &self.device)?.to_dtype(self.dtype)?),
        }
    }

    /// What the first layer reads, `ids [T] -> [T, hidden]`: the token embeddings plus each
    /// token's learned position row (GPT-2, GPT-BigCode), then normed (BLOOM).
    fn input_embeddings(&self, ids: &Tensor, positions: &Tensor) -> Result<Tensor> {
        let x = self.embed(ids)?;
        let x = match &self.embed_positions {
            Some(table) => (x + table.index_select(positions, 0)?)?,
            None => x,
        };
        match &self.embed_norm {
            Some(norm) => norm.forward(&x),
            None => Ok(x),
        }
    }

    /// Final RMSNorm: `[N, hidden] -> [N, hidden]`.
    pub fn final_norm(&self, x: &Tensor) -> Result<Tensor> {
        self.norm.forward(x)
    }

    /// `normed [N, hidden] -> logits [N, vocab]` (f32).
    pub fn lm_head(&self, normed: &Tensor) -> Result<Tensor> {
        self.head.forward(normed)
    }

    /// A decode/verify step on fixed shapes: every token of `inputs` (padding included) runs
    /// through the model. Returns `[B · (W + 1), vocab]` f32 logits (row `r`'s query `j` at
    /// `graph::fixed_output_row`) and, in the same row order, the hidden-state `taps` (Hugging
    /// Face `hidden_states` indices, as in [`ForwardBatch::taps`]) and the final normed hidden
    /// state when `want_final_hidden`. Built from device ops that read only `inputs`' tensors,
    /// so it can be captured in a device graph and replayed after `StepInputs::fill`.
    pub fn forward_fixed(
        &self,
        inputs: &StepInputs,
        kv: &PagedKvCache,
        taps: &[usize],
        want_final_hidden: bool,
    ) -> Result<ForwardOutput> {
        let num_layers = self.layers.len();
        if let Some(&bad) = taps.iter().find(|&&i| i > num_layers) {
            candle_core::bail!("hidden-state tap {bad} out of range 0..={num_layers}");
        }
        if self.config.layered_window().is_some() || self.config.attention_chunk().is_some() {
            candle_core::bail!("fixed-shape steps take one window and one RoPE for every layer; this model's differ");
        }
        let (cos, sin) = self.rope.tables(&inputs.positions)?;
        // [B · (W + 1)] -> [B · (W + 1), H].
        let mut x = self.input_embeddings(&inputs.input_ids, &inputs.positions)?;
        let mut tapped: Vec<Option<Tensor>> = vec![None; taps.len()];
        let mut record = |index: usize, x: &Tensor| {
            for (slot, &want) in tapped.iter_mut().zip(taps) {
                if want == index {
                    *slot = Some(x.clone());
                }
            }
        };
        for (i, layer) in self.layers.iter().enumerate() {
            record(i, &x);
            x = layer.forward_fixed(&x, &cos, &sin, kv, i, inputs)?;
        }
        let normed = self.norm.forward(&x)?;
        record(num_layers, &normed);
        Ok(ForwardOutput {
            logits: Some(self.lm_head(&normed)?),
            taps: tapped.into_iter().map(|t| t.expect("every tap index was visited")).collect(),
            final_hidden: want_final_hidden.then_some(normed),
        })
    }

    /// Positions RoPE covers; a step may not feed a token at or past it.
    pub fn max_positions(&self) -> usize {
        self.rope.max_positions()
    }

    /// Runs the batch: writes its keys and values, returns what it asks for. A model with a
    /// sliding window attends within it whatever window the batch names.
    pub fn forward(&self, batch: &ForwardBatch, kv: &PagedKvCache) -> Result<ForwardOutput> {
        let windowed;
        let batch = match self.config.uniform_sliding_window() {
            Some(w) if batch.sliding_window != Some(w) && batch.rows.iter().any(|r| r.context_len > w) => {
                windowed = ForwardBatch { sliding_window: Some(w), ..batch.clone() };
                &windowed
            }
            _ => batch,
        };
        batch.validate()?;
        let t = batch.num_tokens();
        let num_layers = self.layers.len();
        if let Some(&bad) = batch.taps.iter().find(|&&i| i > num_layers) {
            candle_core::bail!("hidden-state tap {bad} out of range 0..={num_layers}");
        }
        if let Some(&p) = batch.positions.iter().max()
            && p as usize >= self.rope.max_positions()
        {
            candle_core::bail!("position {p} exceeds the model's {} positions", self.rope.max_positions());
        }
        let ids = Tensor::from_slice(&batch.input_ids, t, &self.device)?;
        let positions = Tensor::from_slice(&batch.positions, t, &self.device)?;
        let (cos, sin) = self.rope.tables(&positions)?;
        // Sliding layers among full ones (Gemma, gpt-oss): the batch with their window, and
        // Gemma 3's their own RoPE.
        let local = match self.config.layered_window() {
            Some(window) => {
                let (cos, sin) = match &self.local_rope {
                    Some(rope) => rope.tables(&positions)?,
                    None => (cos.clone(), sin.clone()),
                };
                Some((cos, sin, ForwardBatch { sliding_window: Some(window), ..batch.clone() }))
            }
            None => None,
        };
        // Llama 4's RoPE layers attend within chunks.
        let chunked = self.config.attention_chunk().map(|c| ForwardBatch { attention_chunk: Some(c), ..batch.clone() });

        // 1. Embed (and add learned positions): [T] -> [T, H].
        let mut x = self.input_embeddings(&ids, &positions)?;
        let mut taps: Vec<Option<Tensor>> = vec![None; batch.taps.len()];
        let mut record = |index: usize, x: &Tensor| {
            for (slot, &want) in taps.iter_mut().zip(&batch.taps) {
                if want == index {
                    *slot = Some(x.clone());
                }
            }
        };
        // 2. Layers; tap i is the residual stream entering layer i.
        for (i, layer) in self.layers.iter().enumerate() {
            record(i, &x);
            x = match &local {
                Some((cos, sin, windowed)) if self.config.layer_sliding_window(i).is_some() => {
                    layer.forward(&x, cos, sin, kv, i, windowed)?
                }
                _ => match &chunked {
                    Some(chunked) if self.config.layer_rotates(i) => layer.forward(&x, &cos, &sin, kv, i, chunked)?,
                    _ => layer.forward(&x, &cos, &sin, kv, i, batch)?,
                },
            };
        }
        // 3. Final norm only where needed: HF's last hidden state, and the logit rows.
        let need_full_norm = batch.want_final_hidden || batch.taps.contains(&num_layers);
        let final_hidden = if need_full_norm { Some(self.norm.forward(&x)?) } else { None };
        if let Some(h) = &final_hidden {
            record(num_layers, h);
        }
        let logits = if batch.logits_indices.is_empty() {
            None
        } else {
            let idx = Tensor::from_slice(&batch.logits_indices, batch.logits_indices.len(), &self.device)?;
            let normed = match &final_hidden {
                Some(h) => h.index_select(&idx, 0)?,
                None => self.norm.forward(&x.index_select(&idx, 0)?)?,
            };
            Some(self.lm_head(&normed)?)
        };
        Ok(ForwardOutput {
            logits,
            taps: taps.into_iter().map(|t| t.expect("every tap index was visited")).collect(),
            final_hidden: if batch.want_final_hidden { final_hidden } else { None },
        })
    }
}
