//! The backbone every block drafter shares (DFlash, DFlash2, DSpark): a few decoder layers
//! that draft a whole block of tokens in one forward, conditioned on the target's hidden states
//! through "KV injection".
//!
//! **Context.** For each committed position `p` the target's taps (Hugging Face
//! `hidden_states` indices, ascending) are concatenated and projected:
//! `c_p = hidden_norm(fc(concat(taps_p)))`, `fc [H, n_taps·H]` without bias. In *every* layer
//! the context keys and values are `k = RoPE_p(k_norm(k_proj(c_p)))`, `v = v_proj(c_p)` — the
//! layer's own projections applied to `c_p` directly, with no input norm. They are written
//! once into the drafter's paged KV at `p` ("materialise") and stay valid while `p` is
//! committed, so a step only projects the positions it committed.
//!
//! **Block.** A row drafting after anchor position `a` (its last committed token, not yet run
//! through the target) runs slots `[x_a, mask × (S − 1)]` at positions `a .. a + S − 1`, each
//! slot at the position of the token it stands for, embedded with the (shared) target
//! embedding; `mask_token_id` is embedded like any token unless the checkpoint ships its own
//! `mask_embedding [H]`. Each layer is an ordinary pre-norm decoder layer (`input_layernorm`,
//! attention with per-head `q_norm`/`k_norm` when present, `post_attention_layernorm`, SwiGLU
//! MLP) whose queries see the row's context plus the whole block: bidirectionally within the
//! block for full-attention layers, causally and windowed for `sliding_attention` layers
//! (vLLM's `_resolve_layer_attention`). The block's own keys and values are written at the
//! block positions too; they are transient, and the next step's materialisation overwrites
//! the committed ones. The output is `norm(x)`; logits are `lm_head(norm(x))` over the draft
//! vocabulary, mapped to target ids by `d2t` when it is reduced.
//!
//! **Slots.** With `sample_from_anchor = false` (DFlash) slot `j ≥ 1` predicts the token at
//! its own position `a + j`, so a block of `B` drafts `B − 1` tokens; with
//! `sample_from_anchor = true` (DSpark) slot `k` predicts `a + k + 1` and all `B` slots draft.
//!
//! Tap ids are normalised here to `hidden_states` indices: z-lab `dflash_config.
//! target_layer_ids` and DeepSpec `target_layer_ids` name a layer's *output* (index `id + 1`,
//! DeepSpec's `-1` being the embeddings), speculators `aux_hidden_state_layer_ids` are indices
//! already.

use std::path::Path;
use std::sync::Arc;

use candle_core::{D, DType, Device, Result, Tensor};
use serde_json::Value;

use super::dflash2::LayerConvs;
use crate::attention::{AttentionShape, paged_attention};
use crate::batch::{AttentionMask, ForwardBatch};
use crate::config::{Architecture, DecoderConfig};
use crate::error::{ModelError, Result as LoadResult};
use crate::kv_cache::PagedKvCache;
use crate::linear::{FusedLinear, Linear, LinearWeight};
use crate::models::CausalLm;
use crate::models::transformer::{LogitsHead, Mlp};
use crate::norm::RmsNorm;
use crate::rope::{RotaryEmbedding, inverse_frequencies};
use crate::weights::WeightStore;

/// The target dimensions a block drafter's config is checked against. Width and depth are
/// `None` when only the draft config describes the target; their checks then wait for load.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TargetDims {
    pub vocab_size: usize,
    pub hidden_size: Option<usize>,
    pub num_hidden_layers: Option<usize>,
}

impl From<&DecoderConfig> for TargetDims {
    fn from(c: &DecoderConfig) -> Self {
        Self {
            vocab_size: c.vocab_size,
            hidden_size: Some(c.hidden_size),
            num_hidden_layers: Some(c.num_hidden_layers),
        }
    }
}

impl TargetDims {
    /// What a draft config says about its target (for a target without a Hugging Face config,
    /// such as a GGUF file): the vocabulary it drafts over, its `target_hidden_size` and its
    /// `num_target_layers` when given.
    pub fn from_draft_json(json: &Value) -> LoadResult<Self> {
        let layer = json.get("transformer_layer_config").unwrap_or(json);
        let get = |key: &str| json.get(key).or_else(|| layer.get(key)).and_then(Value::as_u64).map(|v| v as usize);
        Ok(Self {
            vocab_size: get("vocab_size")
                .ok_or_else(|| ModelError::config("vocab_size", "missing from the draft config"))?,
            hidden_size: get("target_hidden_size"),
            num_hidden_layers: get("num_target_layers"),
        })
    }
}

/// How one drafter layer's block queries see their keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayerAttention {
    /// Block slots see only earlier slots (and the context); otherwise the whole block.
    pub causal: bool,
    /// Keys further than this behind a query are invisible.
    pub sliding_window: Option<usize>,
}

impl LayerAttention {
    fn mask(self) -> AttentionMask {
        if self.causal { AttentionMask::Causal } else { AttentionMask::BlockNonCausal }
    }
}

/// What the backbone needs from a block drafter's config, normalised across formats.
#[derive(Debug, Clone)]
pub struct BlockConfig {
    /// Shape of the drafter's layers (`vocab_size` is the target's).
    pub layer: DecoderConfig,
    /// Hugging Face `hidden_states` indices of the target taps, strictly increasing.
    pub taps: Vec<usize>,
    /// Slots of one block, the anchor included.
    pub block_size: usize,
    pub mask_token_id: u32,
    /// Slot 0 drafts too (DSpark): slot `k` predicts the token after its own position.
    pub samples_from_anchor: bool,
    /// Rows of the draft `lm_head`; below the target vocabulary `d2t` maps them.
    pub draft_vocab_size: usize,
    pub attention: Vec<LayerAttention>,
    /// Factor on the block embeddings (DFlash2 `input_embedding_scale`).
    pub input_embedding_scale: f64,
    /// `speculators_config.proposal_methods[0].speculative_tokens`, when the config says.
    pub speculative_tokens: Option<usize>,
    /// The config key the taps came from, for error messages.
    pub taps_key: &'static str,
}

/// Most slots a block drafter's block may declare.
pub const MAX_BLOCK_SIZE: usize = 1024;

impl BlockConfig {
    /// Drafts one block forward was trained to produce.
    pub fn trained_width(&self) -> usize {
        self.block_size.saturating_sub(usize::from(!self.samples_from_anchor))
    }

    /// The rules every format shares, against the target's dimensions.
    pub fn check(&self, target: &TargetDims) -> LoadResult<()> {
        if self.block_size < 2 {
            return Err(ModelError::config(
                "block_size",
                format!(
                    "a block holds the anchor and at least one draft slot: block_size must be >= 2, got {}",
                    self.block_size
                ),
            ));
        }
        if self.block_size > MAX_BLOCK_SIZE {
            // Refused here, by its own key: the engine would take it as the default
            // num_speculative_tokens and blame that.
            return Err(ModelError::config(
                "block_size",
                format!(
                    "{} slots is past any real block drafter (at most {MAX_BLOCK_SIZE}; published ones use 8 to \
                     16): the draft config is corrupt",
                    self.block_size
                ),
            ));
        }
        if self.taps.is_empty() {
            return Err(ModelError::config(self.taps_key, "must name at least one target layer"));
        }
        if let Some(w) = self.taps.windows(2).find(|w| w[1] <= w[0]) {
            return Err(ModelError::config(
                self.taps_key,
                format!("target layers must be strictly increasing, got {} after {}", w[1], w[0]),
            ));
        }
        let last = *self.taps.last().expect("non-empty");
        if let Some(layers) = target.num_hidden_layers
            && last > layers
        {
            return Err(ModelError::config(
                self.taps_key,
                format!("names hidden state {last}, outside the target's hidden states 0..={layers}"),
            ));
        }
        if self.mask_token_id as usize >= target.vocab_size {
            return Err(ModelError::config(
                "mask_token_id",
                format!("{} is outside the target vocabulary [0, {})", self.mask_token_id, target.vocab_size),
            ));
        }
        if self.draft_vocab_size == 0 || self.draft_vocab_size > target.vocab_size {
            return Err(ModelError::config(
                "draft_vocab_size",
                format!("must be in 1..={}, got {}", target.vocab_size, self.draft_vocab_size),
            ));
        }
        if let Some(h) = target.hidden_size
            && self.layer.hidden_size != h
        {
            return Err(ModelError::config(
                "hidden_size",
                format!(
                    "block drafters share the target's embedding and project its hidden states in place: the draft is {} wide, the target {h}",
                    self.layer.hidden_size
                ),
            ));
        }
        if self.attention.len() != self.layer.num_hidden_layers {
            return Err(ModelError::config(
                "layer_types",
                format!(
                    "names {} layers, the draft has num_hidden_layers = {}",
                    self.attention.len(),
                    self.layer.num_hidden_layers
                ),
            ));
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// Config reading shared by the formats.

/// Reads `config.json` of a draft checkpoint directory.
pub(crate) fn read_config(dir: &Path) -> LoadResult<Value> {
    let path = dir.join("config.json");
    let text = std::fs::read_to_string(&path).map_err(|e| ModelError::file(&path, e.to_string()))?;
    serde_json::from_str(&text).map_err(|e| ModelError::file(&path, format!("invalid JSON: {e}")))
}

pub(crate) fn architecture_name(json: &Value) -> &str {
    json["architectures"][0].as_str().unwrap_or("")
}

/// `json[key]` as a non-negative integer; `None` when absent or null.
pub(crate) fn opt_usize(json: &Value, key: &str, name: &str) -> LoadResult<Option<usize>> {
    match json.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .map(|x| Some(x as usize))
            .ok_or_else(|| ModelError::config(name, format!("must be a non-negative integer, got {v}"))),
    }
}

pub(crate) fn req_usize(json: &Value, key: &str, name: &str) -> LoadResult<usize> {
    opt_usize(json, key, name)?.ok_or_else(|| ModelError::config(name, "missing from the draft config"))
}

pub(crate) fn opt_f64(json: &Value, key: &str, name: &str) -> LoadResult<Option<f64>> {
    match json.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v.as_f64().map(Some).ok_or_else(|| ModelError::config(name, format!("must be a number, got {v}"))),
    }
}

pub(crate) fn opt_bool(json: &Value, key: &str, name: &str) -> LoadResult<Option<bool>> {
    match json.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => {
            v.as_bool().map(Some).ok_or_else(|| ModelError::config(name, format!("must be true or false, got {v}")))
        }
    }
}

/// `json[key]` as a non-empty list of integers.
pub(crate) fn req_int_list(json: &Value, key: &str, name: &str) -> LoadResult<Vec<i64>> {
    let list = json
        .get(key)
        .and_then(Value::as_array)
        .ok_or_else(|| ModelError::config(name, "missing from the draft config (a list of target layer ids)"))?;
    list.iter()
        .map(|v| v.as_i64().ok_or_else(|| ModelError::config(name, format!("must hold integers, got {v}"))))
        .collect()
}

/// Output-of-layer ids (`-1` = the embeddings) to `hidden_states` indices (`id + 1`).
pub(crate) fn output_of_layer_taps(ids: &[i64], name: &str) -> LoadResult<Vec<usize>> {
    ids.iter()
        .map(|&id| {
            if id < -1 {
                Err(ModelError::config(name, format!("layer id {id} is below -1 (-1 names the embeddings)")))
            } else {
                Ok((id + 1) as usize)
            }
        })
        .collect()
}

/// The nested layer config of a speculators checkpoint, with the drafter-level keys it
/// inherits from the top level.
pub(crate) fn speculators_layer_json(json: &Value) -> LoadResult<Value> {
    let mut layer = json
        .get("transformer_layer_config")
        .filter(|v| v.is_object())
        .cloned()
        .ok_or_else(|| ModelError::config("transformer_layer_config", "missing from the speculators config"))?;
    if let (Some(obj), Some(top)) = (layer.as_object_mut(), json.as_object()) {
        for key in ["vocab_size", "rms_norm_eps", "rope_theta", "max_position_embeddings"] {
            if !obj.contains_key(key)
                && let Some(v) = top.get(key)
            {
                obj.insert(key.into(), v.clone());
            }
        }
    }
    Ok(layer)
}

/// `speculators_config.proposal_methods[0].speculative_tokens`.
pub(crate) fn speculators_tokens(json: &Value) -> Option<usize> {
    json.pointer("/speculators_config/proposal_methods/0/speculative_tokens")
        .and_then(Value::as_u64)
        .map(|v| v as usize)
}

/// The decoder shape of the draft layers. Block drafters are Qwen3-style unless the config
/// says otherwise; whether q/k norms exist is decided by the tensors at load.
pub(crate) fn layer_config(layer_json: &Value, target: &TargetDims) -> LoadResult<DecoderConfig> {
    let family = match layer_json.get("model_type").and_then(Value::as_str) {
        Some("llama") => Architecture::Llama,
        Some("qwen2") => Architecture::Qwen2,
        _ => Architecture::Qwen3,
    };
    // Block drafters embed and draft over the target's vocabulary.
    let mut json = layer_json.clone();
    json["vocab_size"] = Value::from(target.vocab_size);
    let mut cfg = DecoderConfig::from_hf_json_as(&json, family)?;
    // Qwen2's default q/k/v bias does not carry over to drafters: only an explicit key does.
    cfg.attention_bias = json.get("attention_bias").and_then(Value::as_bool).unwrap_or(false);
    Ok(cfg)
}

/// Everything that decides each layer's masking, gathered from wherever a format keeps it.
pub(crate) struct AttentionKeys {
    /// `layer_types` (`"full_attention"` / `"sliding_attention"` per layer).
    pub layer_types: Option<Vec<String>>,
    /// `dflash_config.use_swa`: every layer slides.
    pub use_swa: bool,
    /// `dflash_config.swa_window_size`, else the top-level `sliding_window`.
    pub window: Option<usize>,
    /// `is_causal` / `dflash_config.causal` / `causal`: overrides every layer's causality.
    pub causal: Option<bool>,
}

impl AttentionKeys {
    /// Reads the keys from a draft config's top level, its layer config (the same object
    /// outside the speculators format) and an optional `dflash_config` section.
    pub fn read(top: &Value, layer_json: &Value, dflash_config: Option<&Value>) -> LoadResult<Self> {
        let layer_types = match layer_json.get("layer_types") {
            None | Some(Value::Null) => None,
            Some(Value::Array(a)) => Some(
                a.iter()
                    .map(|v| {
                        v.as_str().map(str::to_string).ok_or_else(|| {
                            ModelError::config("layer_types", format!("must hold layer type names, got {v}"))
                        })
                    })
                    .collect::<LoadResult<Vec<_>>>()?,
            ),
            Some(v) => return Err(ModelError::config("layer_types", format!("must be a list, got {v}"))),
        };
        let empty = Value::Null;
        let dc = dflash_config.unwrap_or(&empty);
        let window = opt_usize(dc, "swa_window_size", "dflash_config.swa_window_size")?.or(opt_usize(
            layer_json,
            "sliding_window",
            "sliding_window",
        )?);
        let causal = opt_bool(top, "is_causal", "is_causal")?
            .or(opt_bool(dc, "causal", "dflash_config.causal")?)
            .or(opt_bool(top, "causal", "causal")?)
            .or(opt_bool(layer_json, "causal", "causal")?);
        Ok(Self {
            layer_types,
            use_swa: opt_bool(dc, "use_swa", "dflash_config.use_swa")?.unwrap_or(false),
            window,
            causal,
        })
    }

    /// Per-layer masking with vLLM's rules: a layer slides when `layer_types` says so (or
    /// every layer with `use_swa` when none does); sliding layers are causal and full ones
    /// bidirectional unless `causal` overrides; `non_causal_sliding` (speculators
    /// `sliding_window_non_causal`) keeps sliding layers bidirectional.
    pub fn resolve(&self, num_layers: usize, non_causal_sliding: bool) -> LoadResult<Vec<LayerAttention>> {
        const SLIDING: &str = "sliding_attention";
        if let Some(types) = &self.layer_types {
            if types.len() != num_layers {
                return Err(ModelError::config(
                    "layer_types",
                    format!("names {} layers, the draft has num_hidden_layers = {num_layers}", types.len()),
                ));
            }
            if let Some(bad) = types.iter().find(|t| *t != SLIDING && *t != "full_attention") {
                return Err(ModelError::config(
                    "layer_types",
                    format!("unknown layer type '{bad}' (expected full_attention or sliding_attention)"),
                ));
            }
        }
        let any_sliding = self.layer_types.as_ref().is_some_and(|t| t.iter().any(|x| x == SLIDING));
        (0..num_layers)
            .map(|i| {
                let listed_sliding = self.layer_types.as_ref().is_some_and(|t| t[i] == SLIDING);
                let sliding = if self.layer_types.is_none() || (self.use_swa && !any_sliding) {
                    self.use_swa
                } else {
                    listed_sliding
                };
                let sliding_window = if sliding {
                    match self.window {
                        Some(w) if w > 0 => Some(w),
                        _ => {
                            return Err(ModelError::config(
                                "sliding_window",
                                "sliding-window layers need a positive window (dflash_config.swa_window_size or sliding_window)",
                            ));
                        }
                    }
                } else {
                    None
                };
                let causal = self.causal.unwrap_or(listed_sliding && !non_causal_sliding);
                Ok(LayerAttention { causal, sliding_window })
            })
            .collect()
    }
}

/// `rope_scaling` must be absent or the default type (DSpark allows nothing else).
pub(crate) fn require_default_rope(layer_json: &Value) -> LoadResult<()> {
    match layer_json.get("rope_scaling") {
        None | Some(Value::Null) => Ok(()),
        Some(rs) => {
            let kind = rs.get("rope_type").or_else(|| rs.get("type")).and_then(Value::as_str).unwrap_or("default");
            if kind == "default" {
                Ok(())
            } else {
                Err(ModelError::config(
                    "rope_scaling",
                    format!("DSpark drafts use the default rotary embedding; rope type '{kind}' is not supported"),
                ))
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Modules.

/// RoPE at arbitrary positions: cos/sin computed per position rather than read from a table,
/// so a block may reach past the position limit of either config.
#[derive(Debug, Clone)]
struct PositionRope {
    inv_freq: Vec<f64>,
    dtype: DType,
    device: Device,
}

impl PositionRope {
    fn new(cfg: &DecoderConfig, dtype: DType, device: &Device) -> Self {
        Self {
            inv_freq: inverse_frequencies(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling.as_ref()),
            dtype,
            device: device.clone(),
        }
    }

    /// `positions [T] -> (cos [T, d/2], sin [T, d/2])`.
    fn tables(&self, positions: &[u32]) -> Result<(Tensor, Tensor)> {
        let half = self.inv_freq.len();
        let mut cos = Vec::with_capacity(positions.len() * half);
        let mut sin = Vec::with_capacity(positions.len() * half);
        for &p in positions {
            for f in &self.inv_freq {
                let angle = p as f64 * f;
                cos.push(angle.cos() as f32);
                sin.push(angle.sin() as f32);
            }
        }
        let shape = (positions.len(), half);
        Ok((
            Tensor::from_vec(cos, shape, &self.device)?.to_dtype(self.dtype)?,
            Tensor::from_vec(sin, shape, &self.device)?.to_dtype(self.dtype)?,
        ))
    }
}

/// Attention of a block layer: block queries over injected context keys plus block keys.
#[derive(Debug, Clone)]
struct BlockAttention {
    qkv: FusedLinear,
    /// `k_proj` and `v_proj` again, for the context features.
    kv: FusedLinear,
    o_proj: Linear,
    q_norm: Option<RmsNorm>,
    k_norm: Option<RmsNorm>,
    shape: AttentionShape,
}

impl BlockAttention {
    fn load(store: &WeightStore, prefix: &str, cfg: &DecoderConfig) -> LoadResult<Self> {
        let (h, nh, nkv, d) = (cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim);
        let bias = cfg.attention_bias;
        let q = store.linear(&format!("{prefix}.q_proj"), nh * d, h, bias)?;
        let k = store.linear(&format!("{prefix}.k_proj"), nkv * d, h, bias)?;
        let v = store.linear(&format!("{prefix}.v_proj"), nkv * d, h, bias)?;
        // vLLM's DFlash attention carries an o_proj bias exactly when the checkpoint does.
        let o_bias = store.contains(&format!("{prefix}.o_proj.bias"));
        let o_proj = store.linear(&format!("{prefix}.o_proj"), h, nh * d, o_bias)?;
        let (q_norm, k_norm) = if store.contains(&format!("{prefix}.q_norm.weight")) {
            (
                Some(RmsNorm::load(store, &format!("{prefix}.q_norm.weight"), d, cfg.rms_norm_eps)?),
                Some(RmsNorm::load(store, &format!("{prefix}.k_norm.weight"), d, cfg.rms_norm_eps)?),
            )
        } else {
            (None, None)
        };
        Ok(Self {
            qkv: FusedLinear::new(vec![q, k.clone(), v.clone()])?,
            kv: FusedLinear::new(vec![k, v])?,
            o_proj,
            q_norm,
            k_norm,
            shape: AttentionShape::new(nh, nkv, d, (d as f32).powf(-0.5)),
        })
    }

    /// `k [T, nkv·d] -> k_norm -> RoPE`, `[T, nkv, d]`.
    fn keys(&self, k: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
        let mut k = k.reshape((k.dim(0)?, self.shape.num_kv_heads, self.shape.head_dim))?;
        if let Some(n) = &self.k_norm {
            k = n.forward(&k)?;
        }
        RotaryEmbedding::apply(&k, cos, sin)
    }

    /// Context features `c [n, H]` -> their keys and values at the context positions.
    fn context_kv(&self, c: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<(Tensor, Tensor)> {
        let mut parts = self.kv.forward(c)?.into_iter();
        let (k, v) = (parts.next().expect("k"), parts.next().expect("v"));
        let v = v.reshape((c.dim(0)?, self.shape.num_kv_heads, self.shape.head_dim))?;
        Ok((self.keys(&k, cos, sin)?, v))
    }

    /// Block hidden states `x [T, H]` (already normed) -> `[T, H]`, writing the block's keys
    /// and values at `batch.slot_mapping`.
    fn forward(
        &self,
        x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        kv: &PagedKvCache,
        layer: usize,
        batch: &ForwardBatch,
    ) -> Result<Tensor> {
        let t = x.dim(0)?;
        let AttentionShape { num_heads, num_kv_heads, head_dim, .. } = self.shape;
        let mut parts = self.qkv.forward(x)?.into_iter();
        let (q, k, v) = (parts.next().expect("q"), parts.next().expect("k"), parts.next().expect("v"));
        let mut q = q.reshape((t, num_heads, head_dim))?;
        if let Some(n) = &self.q_norm {
            q = n.forward(&q)?;
        }
        let q = RotaryEmbedding::apply(&q, cos, sin)?;
        let k = self.keys(&k, cos, sin)?;
        let v = v.reshape((t, num_kv_heads, head_dim))?;
        kv.write(layer, &batch.slot_mapping, None, &k, &v)?;
        let (kc, vc) = kv.layer(layer);
        let y = paged_attention(&q, kc, vc, batch, &self.shape)?;
        self.o_proj.forward(&y.reshape((t, num_heads * head_dim))?)
    }
}

/// One drafter layer, with DFlash2's convolutions around attention and MLP when present.
#[derive(Debug, Clone)]
struct BlockLayer {
    input_layernorm: RmsNorm,
    self_attn: BlockAttention,
    post_attention_layernorm: RmsNorm,
    mlp: Mlp,
    attention: LayerAttention,
    convs: Option<LayerConvs>,
}

impl BlockLayer {
    #[allow(clippy::too_many_arguments)]
    fn forward(
        &self,
        x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        kv: &PagedKvCache,
        layer: usize,
        batch: &ForwardBatch,
        slot_masks: &[Tensor],
    ) -> Result<Tensor> {
        // 1. Attention sub-block: x + attn(input_layernorm(x)) (DFlash2 convolves around attn).
        let h = self.input_layernorm.forward(x)?;
        let h = match &self.convs {
            None => self.self_attn.forward(&h, cos, sin, kv, layer, batch)?,
            Some(c) => {
                let (h, coefficients) = c.attention.prepare(&h, slot_masks)?;
                let h = self.self_attn.forward(&h, cos, sin, kv, layer, batch)?;
                c.attention.finish(&h, &coefficients, slot_masks)?
            }
        };
        let x = (x + h)?;
        // 2. MLP sub-block.
        let h = self.post_attention_layernorm.forward(&x)?;
        let h = match &self.convs {
            None => self.mlp.forward(&h)?,
            Some(c) => {
                let (h, coefficients) = c.mlp.prepare(&h, slot_masks)?;
                c.mlp.finish(&self.mlp.forward(&h)?, &coefficients, slot_masks)?
            }
        };
        x + h
    }
}

/// The loaded backbone: context projection, layers, final norm, embedding and head.
#[derive(Debug, Clone)]
pub struct BlockBackbone {
    cfg: BlockConfig,
    fc: Linear,
    hidden_norm: RmsNorm,
    layers: Vec<BlockLayer>,
    norm: RmsNorm,
    embed_tokens: LinearWeight,
    /// A dedicated `[H]` embedding for `mask_token_id` (MiMo-style checkpoints).
    mask_embedding: Option<Tensor>,
    lm_head: LogitsHead,
    draft_to_target: Option<Arc<Vec<u32>>>,
    rope: PositionRope,
    device: Device,
    dtype: DType,
}

impl BlockBackbone {
    /// Loads the backbone tensors; `convs(i)` loads layer `i`'s DFlash2 convolutions (or none).
    ///
    /// The embedding is the target's, and so is `lm_head` unless the draft vocabulary is
    /// reduced (then the checkpoint's `lm_head [Vd, H]` and `d2t [Vd]`). DeepSpec and
    /// speculators checkpoints also carry `embed_tokens`/`lm_head` tensors, but as frozen copies
    /// of the target's (vLLM shares the target's too); sharing saves their size.
    pub fn load(
        store: &WeightStore,
        cfg: BlockConfig,
        target: &CausalLm,
        convs: impl Fn(usize) -> LoadResult<Option<LayerConvs>>,
    ) -> LoadResult<Self> {
        let tcfg = target.config();
        cfg.check(&TargetDims::from(tcfg))?;
        let (h, eps) = (cfg.layer.hidden_size, cfg.layer.rms_norm_eps);
        let fc = store.linear("fc", h, cfg.taps.len() * tcfg.hidden_size, false)?;
        let hidden_norm = RmsNorm::load(store, "hidden_norm.weight", h, eps)?;
        let layers = (0..cfg.layer.num_hidden_layers)
            .map(|i| {
                let p = format!("layers.{i}");
                Ok(BlockLayer {
                    input_layernorm: RmsNorm::load(store, &format!("{p}.input_layernorm.weight"), h, eps)?,
                    self_attn: BlockAttention::load(store, &format!("{p}.self_attn"), &cfg.layer)?,
                    post_attention_layernorm: RmsNorm::load(
                        store,
                        &format!("{p}.post_attention_layernorm.weight"),
                        h,
                        eps,
                    )?,
                    mlp: Mlp::load(store, &format!("{p}.mlp"), h, cfg.layer.intermediate_size)?,
                    attention: cfg.attention[i],
                    convs: convs(i)?,
                })
            })
            .collect::<LoadResult<Vec<_>>>()?;
        let norm = RmsNorm::load(store, "norm.weight", h, eps)?;
        let vocab = tcfg.vocab_size;
        let embed_tokens = target.embed_tokens().clone();
        let mask_embedding =
            if store.contains("mask_embedding") { Some(store.tensor("mask_embedding", &[h])?) } else { None };
        let lm_head = if cfg.draft_vocab_size == vocab {
            target.logits_head().clone()
        } else {
            LogitsHead::plain(store.linear_weight("lm_head.weight", cfg.draft_vocab_size, h)?)
        };
        let draft_to_target = if cfg.draft_vocab_size < vocab {
            let d2t = store.int_tensor("d2t", &[cfg.draft_vocab_size])?.to_device(&Device::Cpu)?.to_vec1::<i64>()?;
            Some(Arc::new(draft_to_target_ids(&d2t, vocab)?))
        } else {
            None
        };
        let dtype = store.compute_dtype();
        Ok(Self {
            rope: PositionRope::new(&cfg.layer, dtype, store.device()),
            cfg,
            fc,
            hidden_norm,
            layers,
            norm,
            embed_tokens,
            mask_embedding,
            lm_head,
            draft_to_target,
            device: store.device().clone(),
            dtype,
        })
    }

    pub fn config(&self) -> &BlockConfig {
        &self.cfg
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn draft_to_target(&self) -> Option<&Arc<Vec<u32>>> {
        self.draft_to_target.as_ref()
    }

    /// Writes the context keys and values of committed positions: rows `flat_index [n]` (u32)
    /// of the target's `taps` (each `[T, Ht]`) sit at `positions [n]`, stored at `slots [n]`.
    pub fn materialize(
        &self,
        taps: &[Tensor],
        flat_index: &Tensor,
        positions: &[u32],
        slots: &[u32],
        kv: &PagedKvCache,
    ) -> Result<()> {
        if taps.len() != self.cfg.taps.len() {
            candle_core::bail!("block drafter reads {} target taps, got {}", self.cfg.taps.len(), taps.len());
        }
        // [n, Ht] × taps -> [n, taps·Ht] -> fc -> hidden_norm -> c [n, H].
        let picked = taps.iter().map(|t| t.index_select(flat_index, 0)).collect::<Result<Vec<_>>>()?;
        let c = self.hidden_norm.forward(&self.fc.forward(&Tensor::cat(&picked, D::Minus1)?.to_dtype(self.dtype)?)?)?;
        let (cos, sin) = self.rope.tables(positions)?;
        for (i, layer) in self.layers.iter().enumerate() {
            let (k, v) = layer.self_attn.context_kv(&c, &cos, &sin)?;
            kv.write(i, slots, None, &k, &v)?;
        }
        Ok(())
    }

    /// `ids [T] -> [T, H]`: the target's embedding (the mask embedding where the checkpoint
    /// ships one), times `input_embedding_scale`.
    fn embed(&self, input_ids: &[u32]) -> Result<Tensor> {
        let ids = Tensor::from_slice(input_ids, input_ids.len(), &self.device)?;
        let mut x = self.embed_tokens.embed(&ids)?.to_dtype(self.dtype)?;
        if let Some(m) = &self.mask_embedding {
            let is_mask: Vec<f32> = input_ids.iter().map(|&t| f32::from(t == self.cfg.mask_token_id)).collect();
            let is_mask = Tensor::from_vec(is_mask, (input_ids.len(), 1), &self.device)?.to_dtype(self.dtype)?;
            let keep = (1.0 - &is_mask)?;
            x = (x.broadcast_mul(&keep)? + is_mask.broadcast_mul(&m.unsqueeze(0)?)?)?;
        }
        if self.cfg.input_embedding_scale != 1.0 {
            x = (x * self.cfg.input_embedding_scale)?;
        }
        Ok(x)
    }

    /// One block forward over `batch` (rows of block slots at their positions, context
    /// materialised): writes the block's keys and values, returns `norm(x)` `[T, H]`.
    pub fn forward(&self, batch: &ForwardBatch, kv: &PagedKvCache) -> Result<Tensor> {
        batch.validate()?;
        let mut x = self.embed(&batch.input_ids)?;
        let (cos, sin) = self.rope.tables(&batch.positions)?;
        let slot_masks =
            if self.layers.iter().any(|l| l.convs.is_some()) { self.slot_masks(batch)? } else { Vec::new() };
        // Each layer masks per its type; rows and slots are shared.
        let mut variants: Vec<(LayerAttention, ForwardBatch)> = Vec::new();
        for (i, layer) in self.layers.iter().enumerate() {
            let at = layer.attention;
            let b = match variants.iter().position(|(a, _)| *a == at) {
                Some(j) => j,
                None => {
                    let b = ForwardBatch { mask: at.mask(), sliding_window: at.sliding_window, ..batch.clone() };
                    variants.push((at, b));
                    variants.len() - 1
                }
            };
            x = layer.forward(&x, &cos, &sin, kv, i, &variants[b].1, &slot_masks)?;
        }
        self.norm.forward(&x)
    }

    /// `slot_masks[j] [T, 1, 1]`: 1 where the token has at least `j` slots of its own block
    /// before it. Index 0 is unused; DFlash2's convolutions are causal within a block.
    fn slot_masks(&self, batch: &ForwardBatch) -> Result<Vec<Tensor>> {
        let taps = self.layers.iter().filter_map(|l| l.convs.as_ref()).map(LayerConvs::taps).max().unwrap_or(1);
        let slot: Vec<usize> = batch.rows.iter().flat_map(|r| 0..r.query_len).collect();
        (0..taps)
            .map(|j| {
                let m: Vec<f32> = slot.iter().map(|&s| f32::from(s >= j)).collect();
                Tensor::from_vec(m, (slot.len(), 1, 1), &self.device)?.to_dtype(self.dtype)
            })
            .collect()
    }

    /// `hidden [n, H]` (already normed) -> draft-vocabulary logits `[n, Vd]` (f32).
    pub fn logits(&self, hidden: &Tensor) -> Result<Tensor> {
        self.lm_head.forward(hidden)
    }

    /// A KV cache for the drafter's layers, sharing the target's block layout.
    pub fn new_kv_cache(&self, num_blocks: usize, block_size: usize) -> Result<PagedKvCache> {
        PagedKvCache::new(
            self.layers.len(),
            num_blocks,
            block_size,
            self.cfg.layer.num_key_value_heads,
            self.cfg.layer.head_dim,
            self.dtype,
            &self.device,
        )
    }

    pub fn kv_bytes_per_token(&self) -> u64 {
        let c = &self.cfg.layer;
        (2 * self.layers.len() * c.num_key_value_heads * c.head_dim * self.dtype.size_in_bytes()) as u64
    }
}

/// The mask token's id as a token id, refused past u32 rather than wrapped into the vocabulary
/// (the config's validation checks it lies inside the target's).
pub(crate) fn mask_token_id(id: usize, target: &TargetDims) -> LoadResult<u32> {
    u32::try_from(id).map_err(|_| {
        ModelError::config("mask_token_id", format!("{id} is outside the target vocabulary [0, {})", target.vocab_size))
    })
}

/// The target id of each draft token from `d2t` (the offsets speculators checkpoints store:
/// target id = draft id + `d2t[draft id]`), each checked to lie in the target's vocabulary
/// before it is narrowed, so an id past u32 cannot wrap into it.
pub(crate) fn draft_to_target_ids(d2t: &[i64], target_vocab: usize) -> LoadResult<Vec<u32>> {
    d2t.iter()
        .enumerate()
        .map(|(i, &offset)| {
            let id = (i as i64).saturating_add(offset);
            u32::try_from(id).ok().filter(|&t| (t as usize) < target_vocab).ok_or_else(|| {
                ModelError::config(
                    "d2t",
                    format!("maps draft token {i} to target id {id}, outside the vocabulary of {target_vocab}"),
                )
            })
        })
        .collect()
}

#[cfg(test)]
mod d2t_tests {
    use super::*;

    #[test]
    fn d2t_offsets_map_into_the_target_vocabulary_or_are_refused_unwrapped() {
        assert_eq!(draft_to_target_ids(&[0, 1, 5], 10).unwrap(), vec![0, 2, 7]);
        for (d2t, bad_id) in [(vec![0, 9], "10"), (vec![-1], "-1"), (vec![(1i64 << 32) + 3], "4294967299")] {
            let e = draft_to_target_ids(&d2t, 10).unwrap_err().to_string();
            assert!(e.contains("d2t") && e.contains(&format!("target id {bad_id}")), "{e}");
        }
    }
}
