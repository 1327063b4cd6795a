//! EAGLE-1 and EAGLE-3 draft heads (Li et al.), from the checkpoint formats in use:
//!
//! - **EAGLE-3, native** (SafeAILab / SpecForge / SGLang: `LlamaForCausalLMEagle3`,
//!   `Eagle3LlamaForCausalLM`, or a one-layer `LlamaForCausalLM` with `draft_vocab_size`):
//!   `fc [H, 3·Ht]`, one `midlayer.*`, `norm`, `lm_head [Vd, H]`, `d2t [Vd]`. Tap ids in
//!   `eagle_config.eagle_aux_hidden_state_layer_ids` name the *output* of a layer.
//! - **EAGLE-3, speculators** (`speculators_model_type: "eagle3"`): the same body under
//!   `layers.0.*`, a nested `transformer_layer_config`, optional `norm_before_residual`,
//!   `norm_before_fc` (`input_norm [3·Ht]`), `fc_norm` (`fc_norm.{0,1,2}`), `norm_output`. Tap
//!   ids in `eagle_aux_hidden_state_layer_ids` are Hugging Face `hidden_states` indices.
//! - **EAGLE-1** (yuhuili: a one-layer `LlamaForCausalLM` without a draft vocabulary):
//!   `fc [H, 2H]` (+ optional bias) over `[embedding, final hidden]`, `layers.0.*` without
//!   `input_layernorm`, no norm, the target's `lm_head`.
//!
//! Every tap id is normalised to a Hugging Face `hidden_states` index at load.
//!
//! One draft step at position `t` pairs a hidden state for `t` with the token at `t + 1`:
//! - EAGLE-3: `g = fc(concat(taps_t))` (or the previous step's output), then
//!   `x = g + attn([input_layernorm(embed(x_{t+1})), hidden_norm(g)])`,
//!   `x = x + mlp(post_attention_layernorm(x))`; logits `lm_head(norm(x))` over the draft
//!   vocabulary, mapped to target ids by `d2t`; `x` (or `norm(x)` with `norm_output`) feeds the
//!   next step. Heads of several layers (`num_hidden_layers > 1`, vLLM's layers `i > 0`)
//!   pass `x` through ordinary pre-norm decoder layers `layers.{i}.*` before the logits.
//! - EAGLE-1: `u = fc(concat(embed(x_{t+1}), f_t))` with `f_t` the target's final normed hidden
//!   state, `x = layer(u)`; logits `target_lm_head(x)`; `x` feeds the next step.

use std::path::Path;
use std::sync::Arc;

use candle_core::{D, DType, Device, Result, Tensor};
use serde_json::Value;

use super::layer::DraftLayer;
use super::{DraftInputs, DraftLogits, SequentialDraftModel};
use crate::batch::ForwardBatch;
use crate::config::{Architecture, DecoderConfig};
use crate::error::{ModelError, Result as LoadResult};
use crate::kv_cache::PagedKvCache;
use crate::linear::{Linear, LinearWeight};
use crate::models::transformer::LogitsHead;
use crate::norm::RmsNorm;
use crate::rope::RotaryEmbedding;
use crate::weights::{ModelDType, WeightStore};

/// Which EAGLE generation and checkpoint flavour.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EagleFormat {
    Eagle1,
    Eagle3Native,
    Eagle3Speculators,
}

/// How EAGLE-3 normalises the tapped features before `fc`.
#[derive(Debug, Clone)]
enum PreFcNorm {
    None,
    /// One RMSNorm over the concatenated taps (`norm_before_fc`).
    Concat(RmsNorm),
    /// One RMSNorm per tap (`fc_norm`).
    PerTap(Vec<RmsNorm>),
}

/// The parsed draft configuration.
#[derive(Debug, Clone)]
pub struct EagleConfig {
    pub format: EagleFormat,
    pub layer: DecoderConfig,
    /// Hugging Face `hidden_states` indices of the target taps (EAGLE-3), ascending.
    pub taps: Vec<usize>,
    pub target_hidden_size: usize,
    pub draft_vocab_size: usize,
    pub norm_before_residual: bool,
    pub norm_output: bool,
    pub speculative_tokens: Option<usize>,
}

fn flatten_speculators(json: &Value) -> Value {
    // The layer's own config is nested; drafter-level keys stay at the top.
    let mut layer = json.get("transformer_layer_config").cloned().unwrap_or(Value::Null);
    if let (Some(obj), Some(top)) = (layer.as_object_mut(), json.as_object()) {
        for key in ["vocab_size", "rms_norm_eps", "rope_theta", "max_position_embeddings"] {
            if !obj.contains_key(key)
                && let Some(v) = top.get(key)
            {
                obj.insert(key.into(), v.clone());
            }
        }
        obj.entry("num_hidden_layers").or_insert(Value::from(1));
    }
    layer
}

impl EagleConfig {
    /// Parses a draft `config.json` for a target of `target` shape.
    pub fn from_json(json: &Value, target: &DecoderConfig) -> LoadResult<Self> {
        let arch = json["architectures"][0].as_str().unwrap_or("");
        let speculators = json.get("speculators_model_type").and_then(Value::as_str);
        let has_draft_vocab = json.get("draft_vocab_size").is_some() || json.get("truncated_vocab_size").is_some();
        let format = match speculators {
            Some("eagle3") => EagleFormat::Eagle3Speculators,
            Some(other) => {
                return Err(ModelError::config(
                    "speculators_model_type",
                    format!("'{other}' is not an EAGLE draft (expected 'eagle3')"),
                ));
            }
            None => match arch {
                "LlamaForCausalLMEagle3" | "Eagle3LlamaForCausalLM" | "Eagle3DraftModel" | "Eagle3Speculator" => {
                    EagleFormat::Eagle3Native
                }
                "LlamaForCausalLM" | "LlamaForCausalLMEagle" if has_draft_vocab => EagleFormat::Eagle3Native,
                "LlamaForCausalLM" | "LlamaForCausalLMEagle" => EagleFormat::Eagle1,
                other => {
                    return Err(ModelError::UnknownArchitecture {
                        name: other.to_string(),
                        supported: "LlamaForCausalLMEagle3, Eagle3LlamaForCausalLM, speculators eagle3, LlamaForCausalLM (EAGLE-1)"
                            .into(),
                    });
                }
            },
        };
        let layer_json = match format {
            EagleFormat::Eagle3Speculators => flatten_speculators(json),
            _ => json.clone(),
        };
        let family = match layer_json.get("model_type").and_then(Value::as_str) {
            Some("qwen3") => Architecture::Qwen3,
            Some("qwen2") => Architecture::Qwen2,
            _ => Architecture::Llama,
        };
        let mut layer = DecoderConfig::from_hf_json_as(&layer_json, family)?;
        // EAGLE drafts read the target's embedding and vocabulary.
        layer.vocab_size = target.vocab_size;
        if layer_json.get("qkv_bias").and_then(Value::as_bool) == Some(true) {
            layer.attention_bias = true;
        }
        let l = target.num_hidden_layers;
        let default_taps = vec![2.min(l), l / 2, l.saturating_sub(3)];
        let ids = |v: Option<&Value>| -> Option<Vec<i64>> {
            v.and_then(Value::as_array).map(|a| a.iter().filter_map(Value::as_i64).collect())
        };
        let taps = match format {
            EagleFormat::Eagle1 => Vec::new(),
            // Native ids name a layer's output: hidden_states[id + 1].
            EagleFormat::Eagle3Native => {
                ids(json.get("eagle_config").and_then(|c| c.get("eagle_aux_hidden_state_layer_ids")))
                    .map(|v| v.into_iter().map(|i| (i + 1) as usize).collect())
                    .unwrap_or(default_taps)
            }
            // Speculators ids are hidden_states indices already.
            EagleFormat::Eagle3Speculators => ids(json.get("eagle_aux_hidden_state_layer_ids"))
                .map(|v| v.into_iter().map(|i| i as usize).collect())
                .unwrap_or(default_taps),
        };
        let mut taps = taps;
        taps.sort_unstable();
        if let Some(&bad) = taps.iter().find(|&&t| t > l) {
            return Err(ModelError::config(
                "eagle_aux_hidden_state_layer_ids",
                format!("tap {bad} is outside the target's hidden states 0..={l}"),
            ));
        }
        if format != EagleFormat::Eagle1 && taps.len() != 3 {
            return Err(ModelError::config(
                "eagle_aux_hidden_state_layer_ids",
                format!("EAGLE-3 drafts read 3 target layers, the config names {}", taps.len()),
            ));
        }
        let draft_vocab_size = json
            .get("draft_vocab_size")
            .or_else(|| json.get("truncated_vocab_size"))
            .and_then(Value::as_u64)
            .map_or(target.vocab_size, |v| v as usize);
        if draft_vocab_size == 0 || draft_vocab_size > target.vocab_size {
            return Err(ModelError::config(
                "draft_vocab_size",
                format!("must be in 1..={}, got {draft_vocab_size}", target.vocab_size),
            ));
        }
        let target_hidden_size =
            json.get("target_hidden_size").and_then(Value::as_u64).map_or(target.hidden_size, |v| v as usize);
        if target_hidden_size != target.hidden_size {
            return Err(ModelError::config(
                "target_hidden_size",
                format!(
                    "the draft was trained on a target of hidden size {target_hidden_size}, this target has {}",
                    target.hidden_size
                ),
            ));
        }
        let speculative_tokens = json
            .pointer("/speculators_config/proposal_methods/0/speculative_tokens")
            .and_then(Value::as_u64)
            .map(|v| v as usize);
        Ok(Self {
            format,
            layer,
            taps,
            target_hidden_size,
            draft_vocab_size,
            norm_before_residual: json.get("norm_before_residual").and_then(Value::as_bool).unwrap_or(false),
            norm_output: format == EagleFormat::Eagle3Speculators
                && json.get("norm_output").and_then(Value::as_bool).unwrap_or(false),
            speculative_tokens,
        })
    }
}

#[derive(Debug, Clone)]
pub struct EagleDraft {
    cfg: EagleConfig,
    fc: Linear,
    pre_fc_norm: PreFcNorm,
    /// EAGLE-3 only: norms of the embedding and hidden halves of the attention input.
    input_layernorm: Option<RmsNorm>,
    hidden_norm: Option<RmsNorm>,
    layer: DraftLayer,
    /// EAGLE-3 heads of several layers: the pre-norm layers after the first.
    extra_layers: Vec<DraftLayer>,
    /// EAGLE-3: `norm` before its own `lm_head`.
    norm: Option<RmsNorm>,
    /// Draft head (EAGLE-3) or the target's (EAGLE-1).
    lm_head: LogitsHead,
    embed_tokens: LinearWeight,
    draft_to_target: Option<Arc<Vec<u32>>>,
    rope: RotaryEmbedding,
    device: Device,
    dtype: DType,
    name: String,
}

/// Refuses the PyTorch pickle releases with the command that converts them.
pub fn check_not_pickle(dir: &Path) -> LoadResult<()> {
    let has_safetensors = std::fs::read_dir(dir)
        .map(|it| it.filter_map(|e| e.ok()).any(|e| e.path().extension().is_some_and(|x| x == "safetensors")))
        .unwrap_or(false);
    if !has_safetensors && dir.join("pytorch_model.bin").is_file() {
        return Err(ModelError::file(
            dir,
            "this draft ships only pytorch_model.bin (a PyTorch pickle, which spec-rs does not execute); convert it once with: \
             python -c \"import torch, safetensors.torch as st; st.save_file({k: v.contiguous() for k, v in torch.load('pytorch_model.bin', map_location='cpu').items()}, 'model.safetensors')\"",
        ));
    }
    Ok(())
}

impl EagleDraft {
    /// Loads a draft checkpoint directory for `target`, sharing its embedding and lm_head.
    pub fn load(dir: &Path, target: &crate::models::CausalLm, device: &Device, dtype: ModelDType) -> LoadResult<Self> {
        check_not_pickle(dir)?;
        let cfg_path = dir.join("config.json");
        let text = std::fs::read_to_string(&cfg_path).map_err(|e| ModelError::file(&cfg_path, e.to_string()))?;
        let json: Value =
            serde_json::from_str(&text).map_err(|e| ModelError::file(&cfg_path, format!("invalid JSON: {e}")))?;
        let cfg = EagleConfig::from_json(&json, target.config())?;
        let store = WeightStore::open(dir, device.clone(), dtype)?;
        Self::load_from(&store, cfg, target)
    }

    pub fn load_from(store: &WeightStore, cfg: EagleConfig, target: &crate::models::CausalLm) -> LoadResult<Self> {
        let h = cfg.layer.hidden_size;
        let ht = cfg.target_hidden_size;
        let eps = cfg.layer.rms_norm_eps;
        let prefix = match cfg.format {
            EagleFormat::Eagle3Native if store.contains("midlayer.self_attn.q_proj.weight") => "midlayer",
            _ => "layers.0",
        };
        let (fc, pre_fc_norm, input_layernorm, hidden_norm, layer, norm, lm_head, draft_to_target, name) = match cfg
            .format
        {
            EagleFormat::Eagle1 => {
                let bias = store.contains("fc.bias");
                let fc = store.linear("fc", h, 2 * h, bias)?;
                let layer = DraftLayer::load(store, prefix, &cfg.layer, h)?;
                (fc, PreFcNorm::None, None, None, layer, None, target.logits_head().clone(), None, "EAGLE-1")
            }
            EagleFormat::Eagle3Native | EagleFormat::Eagle3Speculators => {
                let fc = store.linear("fc", h, 3 * ht, false)?;
                let pre_fc_norm = if store.contains("input_norm.weight") {
                    PreFcNorm::Concat(RmsNorm::load(store, "input_norm.weight", 3 * ht, eps)?)
                } else if store.contains("fc_norm.0.weight") {
                    PreFcNorm::PerTap(
                        (0..3)
                            .map(|i| RmsNorm::load(store, &format!("fc_norm.{i}.weight"), ht, eps))
                            .collect::<LoadResult<_>>()?,
                    )
                } else {
                    PreFcNorm::None
                };
                let input_layernorm = RmsNorm::load(store, &format!("{prefix}.input_layernorm.weight"), h, eps)?;
                let hidden_norm = RmsNorm::load(store, &format!("{prefix}.hidden_norm.weight"), h, eps)?;
                let mut layer = DraftLayer::load(store, prefix, &cfg.layer, 2 * h)?;
                // The midlayer's input_layernorm applies to the embedding half only.
                layer.input_layernorm = None;
                let norm = RmsNorm::load(store, "norm.weight", h, eps)?;
                let lm_head = LogitsHead::plain(store.linear_weight("lm_head.weight", cfg.draft_vocab_size, h)?);
                let d2t = if cfg.draft_vocab_size < target.config().vocab_size {
                    let d2t =
                        store.int_tensor("d2t", &[cfg.draft_vocab_size])?.to_device(&Device::Cpu)?.to_vec1::<i64>()?;
                    Some(Arc::new(super::block::draft_to_target_ids(&d2t, target.config().vocab_size)?))
                } else {
                    None
                };
                (fc, pre_fc_norm, Some(input_layernorm), Some(hidden_norm), layer, Some(norm), lm_head, d2t, "EAGLE-3")
            }
        };
        let num_layers = cfg.layer.num_hidden_layers.max(1);
        if num_layers > 1 && (cfg.format == EagleFormat::Eagle1 || prefix == "midlayer") {
            return Err(ModelError::config(
                "num_hidden_layers",
                format!(
                    "{num_layers} layers: spec-rs reads EAGLE-3 heads of several layers under `layers.{{i}}` \
                     (speculators and vLLM naming); this checkpoint is {name} with its first layer under `{prefix}`"
                ),
            ));
        }
        let extra_layers = (1..num_layers)
            .map(|i| {
                let prefix = format!("layers.{i}");
                let layer = DraftLayer::load(store, &prefix, &cfg.layer, h)?;
                if layer.input_layernorm.is_none() {
                    return Err(ModelError::config(
                        "num_hidden_layers",
                        format!("layer {i} of {num_layers} has no {prefix}.input_layernorm.weight"),
                    ));
                }
                Ok(layer)
            })
            .collect::<LoadResult<Vec<_>>>()?;
        let embed_tokens = if h != target.config().hidden_size {
            store.embedding_weight("embed_tokens.weight", target.config().vocab_size, h)?
        } else {
            target.embed_tokens().clone()
        };
        let dtype = store.compute_dtype();
        let rope = RotaryEmbedding::new(
            cfg.layer.rotary_dim,
            cfg.layer.rope_theta,
            cfg.layer.rope_scaling.as_ref(),
            cfg.layer.max_position_embeddings.max(target.config().max_position_embeddings),
            dtype,
            store.device(),
        )?;
        Ok(Self {
            fc,
            pre_fc_norm,
            input_layernorm,
            hidden_norm,
            layer,
            extra_layers,
            norm,
            lm_head,
            embed_tokens,
            draft_to_target,
            rope,
            device: store.device().clone(),
            dtype,
            name: name.to_string(),
            cfg,
        })
    }

    pub fn config(&self) -> &EagleConfig {
        &self.cfg
    }
}

impl SequentialDraftModel for EagleDraft {
    fn name(&self) -> &str {
        &self.name
    }

    fn inputs(&self) -> DraftInputs {
        match self.cfg.format {
            EagleFormat::Eagle1 => DraftInputs { taps: Vec::new(), final_hidden: true },
            _ => DraftInputs { taps: self.cfg.taps.clone(), final_hidden: false },
        }
    }

    fn first_inputs(&self, taps: &[Tensor], final_hidden: Option<&Tensor>, flat_index: &Tensor) -> Result<Tensor> {
        match self.cfg.format {
            // EAGLE-1 fuses inside `forward`: the final hidden state goes in as is.
            EagleFormat::Eagle1 => final_hidden
                .ok_or_else(|| candle_core::Error::msg("EAGLE-1 needs the target's final hidden states"))?
                .index_select(flat_index, 0),
            // [n, Ht] × 3, low | mid | high -> [n, 3·Ht]; the norm and fc wait for feeding.
            _ => {
                let picked = taps.iter().map(|t| t.index_select(flat_index, 0)).collect::<Result<Vec<_>>>()?;
                Tensor::cat(&picked, D::Minus1)
            }
        }
    }

    fn first_hidden(&self, inputs: &Tensor) -> Result<Tensor> {
        if self.cfg.format == EagleFormat::Eagle1 {
            return Ok(inputs.clone());
        }
        // [n, 3·Ht] -> (pre-fc norm) -> fc -> [n, H].
        let normed = match &self.pre_fc_norm {
            PreFcNorm::None => inputs.clone(),
            PreFcNorm::Concat(n) => n.forward(inputs)?,
            PreFcNorm::PerTap(ns) => {
                let ht = self.cfg.target_hidden_size;
                let parts = ns
                    .iter()
                    .enumerate()
                    .map(|(i, n)| n.forward(&inputs.narrow(D::Minus1, i * ht, ht)?))
                    .collect::<Result<Vec<_>>>()?;
                Tensor::cat(&parts, D::Minus1)?
            }
        };
        self.fc.forward(&normed.to_dtype(self.dtype)?)
    }

    fn forward(&self, hidden: &Tensor, batch: &ForwardBatch, kv: &PagedKvCache) -> Result<(Tensor, DraftLogits)> {
        batch.validate()?;
        let t = batch.num_tokens();
        let ids = Tensor::from_slice(&batch.input_ids, t, &self.device)?;
        let emb = self.embed_tokens.embed(&ids)?.to_dtype(self.dtype)?;
        let hidden = hidden.to_dtype(self.dtype)?;
        let out = match self.cfg.format {
            EagleFormat::Eagle1 => {
                // 1. Fuse, embedding first: [T, 2H] -> [T, H].
                let u = self.fc.forward(&Tensor::cat(&[&emb, &hidden], D::Minus1)?)?;
                // 2. One layer without input_layernorm.
                self.layer.forward(&u, &u, &self.rope, kv, batch)?
            }
            _ => {
                let hn = self.hidden_norm.as_ref().expect("EAGLE-3 has hidden_norm").forward(&hidden)?;
                let en = self.input_layernorm.as_ref().expect("EAGLE-3 has input_layernorm").forward(&emb)?;
                // 1. Attention over [embedding | hidden], 2H wide; residual = the hidden state.
                let attn_in = Tensor::cat(&[&en, &hn], D::Minus1)?;
                let residual = if self.cfg.norm_before_residual { &hn } else { &hidden };
                let mut x = self.layer.forward(&attn_in, residual, &self.rope, kv, batch)?;
                // 2. Further layers, pre-norm, each with its own keys.
                for (i, layer) in self.extra_layers.iter().enumerate() {
                    let normed = layer.input_layernorm.as_ref().expect("checked at load").forward(&x)?;
                    x = layer.forward_at(&normed, &x, &self.rope, kv, i + 1, batch)?;
                }
                x
            }
        };
        // 3. Logits where asked.
        let logits = super::logits_at(&out, &batch.logits_indices, self.cfg.draft_vocab_size, |at| match &self.norm {
            Some(n) => self.lm_head.forward(&n.forward(at)?),
            None => self.lm_head.forward(at),
        })?;
        let next = match (&self.norm, self.cfg.norm_output) {
            (Some(n), true) => n.forward(&out)?,
            _ => out,
        };
        Ok((next, DraftLogits { logits, draft_to_target: self.draft_to_target.clone() }))
    }

    fn new_kv_cache(&self, num_blocks: usize, block_size: usize) -> Result<PagedKvCache> {
        PagedKvCache::new(
            1 + self.extra_layers.len(),
            num_blocks,
            block_size,
            self.cfg.layer.num_key_value_heads,
            self.cfg.layer.head_dim,
            self.dtype,
            &self.device,
        )
    }

    fn kv_bytes_per_token(&self) -> u64 {
        (1 + self.extra_layers.len()) as u64
            * DraftLayer::kv_bytes_per_token(&self.cfg.layer, self.dtype.size_in_bytes())
    }

    fn trained_width(&self) -> Option<usize> {
        self.cfg.speculative_tokens
    }
}
