//! Multi-token-prediction heads: one extra decoder layer that fuses the target's final hidden
//! state with the embedding of the next token.
//!
//! - **MiMo** (`MiMoForCausalLM`, inside the target checkpoint): `model.mtp_layers.{i}.*` with
//!   `input_proj [H, 2H]` over **[hidden, embedding]** (hidden first), a Qwen2 decoder layer
//!   (q/k/v bias), `final_layernorm`; the target's `lm_head`.
//! - **speculators `mtp`** (`MTPDraftModel`, a separate checkpoint): `mtp_layers.0.*` with
//!   `input_proj` over **[embedding, hidden]**, the layer type of `transformer_layer_config`.
//! - **DeepSeek-V3** and **GLM-4.5** (`DeepseekV3ForCausalLM`, `Glm4MoeForCausalLM`, inside
//!   the target checkpoint, DeepSeek-V3's layout): `model.layers.{num_hidden_layers}.*` with
//!   `enorm` (embedding), `hnorm` (hidden), `eh_proj` over **[embedding, hidden]**, a decoder
//!   layer of the target's (routed experts; DeepSeek's latent attention), `shared_head.norm`
//!   and `shared_head.head` (the target's head where the checkpoint leaves it out).
//!
//! One step at position `t`: `u = input_proj(concat(...hidden_layernorm(h_t),
//! token_layernorm(embed(x_{t+1}))...))`, `y = layer(u)`, logits `lm_head(final_layernorm(y))`.
//! The next step's hidden state is `final_layernorm(y)` for MiMo and speculators heads and `y`
//! itself for DeepSeek-style heads (as vLLM chains them). `h_t` of the first step is the
//! target's final normed hidden state.

use std::path::Path;

use candle_core::{D, DType, Device, Result, Tensor};
use serde_json::Value;

use super::layer::DraftLayer;
use super::{DraftInputs, DraftLogits, SequentialDraftModel};
use crate::batch::ForwardBatch;
use crate::config::{Architecture, DecoderConfig};
use crate::error::{ModelError, Result as LoadResult};
use crate::kv_cache::PagedKvCache;
use crate::linear::{Linear, LinearWeight};
use crate::models::CausalLm;
use crate::models::transformer::LogitsHead;
use crate::norm::RmsNorm;
use crate::rope::RotaryEmbedding;
use crate::weights::{ModelDType, WeightStore};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MtpFormat {
    /// Heads inside a MiMo target checkpoint; hidden state first in the fusion.
    MiMo,
    /// A speculators `mtp` checkpoint; embedding first.
    Speculators,
    /// DeepSeek-V3-style heads inside a DeepSeek-V3 or GLM-4.5 target checkpoint; embedding
    /// first, the raw layer output chained.
    DeepSeek,
}

/// The tensor names of one format's fusion and head.
struct MtpNames {
    hidden_layernorm: &'static str,
    token_layernorm: &'static str,
    input_proj: &'static str,
    final_layernorm: &'static str,
}

impl MtpFormat {
    fn names(self) -> MtpNames {
        match self {
            Self::MiMo | Self::Speculators => MtpNames {
                hidden_layernorm: "hidden_layernorm",
                token_layernorm: "token_layernorm",
                input_proj: "input_proj",
                final_layernorm: "final_layernorm",
            },
            Self::DeepSeek => MtpNames {
                hidden_layernorm: "hnorm",
                token_layernorm: "enorm",
                input_proj: "eh_proj",
                final_layernorm: "shared_head.norm",
            },
        }
    }
}

#[derive(Debug, Clone)]
pub struct MtpDraft {
    format: MtpFormat,
    layer_cfg: DecoderConfig,
    hidden_layernorm: RmsNorm,
    token_layernorm: RmsNorm,
    input_proj: Linear,
    layer: DraftLayer,
    final_layernorm: RmsNorm,
    embed_tokens: LinearWeight,
    lm_head: LogitsHead,
    rope: RotaryEmbedding,
    device: Device,
    dtype: DType,
    trained_width: Option<usize>,
}

impl MtpDraft {
    fn load_prefixed(
        store: &WeightStore,
        prefix: &str,
        format: MtpFormat,
        layer_cfg: DecoderConfig,
        target: &CausalLm,
        trained_width: Option<usize>,
    ) -> LoadResult<Self> {
        let h = layer_cfg.hidden_size;
        let eps = layer_cfg.rms_norm_eps;
        let dtype = store.compute_dtype();
        let rope = RotaryEmbedding::new(
            layer_cfg.rotary_dim,
            layer_cfg.rope_theta,
            layer_cfg.rope_scaling.as_ref(),
            layer_cfg.max_position_embeddings,
            dtype,
            store.device(),
        )?;
        let names = format.names();
        let own = |name: &str| store.contains(&format!("{prefix}.{name}.weight"));
        let v = layer_cfg.vocab_size;
        Ok(Self {
            format,
            hidden_layernorm: RmsNorm::load(store, &format!("{prefix}.{}.weight", names.hidden_layernorm), h, eps)?,
            token_layernorm: RmsNorm::load(store, &format!("{prefix}.{}.weight", names.token_layernorm), h, eps)?,
            input_proj: store.linear(&format!("{prefix}.{}", names.input_proj), h, 2 * h, false)?,
            layer: DraftLayer::load(store, prefix, &layer_cfg, h)?,
            final_layernorm: RmsNorm::load(store, &format!("{prefix}.{}.weight", names.final_layernorm), h, eps)?,
            // DeepSeek-style heads may carry their own copies of the embedding and the head.
            embed_tokens: match format {
                MtpFormat::DeepSeek if own("embed_tokens") => {
                    store.embedding_weight(&format!("{prefix}.embed_tokens.weight"), v, h)?
                }
                _ => target.embed_tokens().clone(),
            },
            lm_head: match format {
                MtpFormat::DeepSeek if own("shared_head.head") => {
                    LogitsHead::plain(store.linear_weight(&format!("{prefix}.shared_head.head.weight"), v, h)?)
                }
                _ => target.logits_head().clone(),
            },
            rope,
            device: store.device().clone(),
            dtype,
            layer_cfg,
            trained_width,
        })
    }

    /// The MTP heads stored in a MiMo, DeepSeek-V3 or GLM-4.5 target checkpoint
    /// (`num_nextn_predict_layers >= 1`).
    pub fn load_from_target(store: &WeightStore, target: &CausalLm) -> LoadResult<Self> {
        // DeepSeek-V3's layout (GLM-4.5's too): the first head is the layer after the last
        // decoder layer.
        let deepseek = format!("model.layers.{}", target.config().num_hidden_layers);
        if store.contains(&format!("{deepseek}.eh_proj.weight")) {
            return Self::load_prefixed(
                store,
                &deepseek,
                MtpFormat::DeepSeek,
                target.config().clone(),
                target,
                Some(1),
            );
        }
        let prefix = "model.mtp_layers.0";
        if !store.contains(&format!("{prefix}.input_proj.weight")) {
            return Err(ModelError::MissingTensor {
                name: format!(
                    "{prefix}.input_proj.weight or {deepseek}.eh_proj.weight (the target checkpoint has no MTP heads; use a target with num_nextn_predict_layers >= 1 or pass a speculators mtp draft)"
                ),
                source_desc: store.description().to_string(),
            });
        }
        let mut cfg = target.config().clone();
        cfg.attention_bias = cfg.architecture == Architecture::Qwen2 || cfg.attention_bias;
        Self::load_prefixed(store, prefix, MtpFormat::MiMo, cfg, target, Some(1))
    }

    /// A speculators-format `mtp` draft checkpoint directory.
    pub fn load_speculators(dir: &Path, target: &CausalLm, device: &Device, dtype: ModelDType) -> LoadResult<Self> {
        let cfg_path = dir.join("config.json");
        let text = std::fs::read_to_string(&cfg_path).map_err(|e| ModelError::file(&cfg_path, e.to_string()))?;
        let json: Value =
            serde_json::from_str(&text).map_err(|e| ModelError::file(&cfg_path, format!("invalid JSON: {e}")))?;
        if json.get("speculators_model_type").and_then(Value::as_str) != Some("mtp") {
            return Err(ModelError::config(
                "speculators_model_type",
                "an MTP draft checkpoint needs speculators_model_type 'mtp'",
            ));
        }
        let layer_json = json
            .get("transformer_layer_config")
            .ok_or_else(|| ModelError::config("transformer_layer_config", "missing from the MTP draft config"))?;
        let family = match layer_json.get("model_type").and_then(Value::as_str) {
            Some("qwen3") => Architecture::Qwen3,
            Some("qwen2") => Architecture::Qwen2,
            _ => Architecture::Llama,
        };
        let mut cfg = DecoderConfig::from_hf_json_as(layer_json, family)?;
        cfg.vocab_size = target.config().vocab_size;
        if cfg.hidden_size != target.config().hidden_size {
            return Err(ModelError::config(
                "hidden_size",
                format!("the MTP head is {} wide, the target {}", cfg.hidden_size, target.config().hidden_size),
            ));
        }
        let trained = json
            .pointer("/speculators_config/proposal_methods/0/speculative_tokens")
            .or_else(|| json.get("num_speculative_steps"))
            .and_then(Value::as_u64)
            .map(|v| v as usize);
        let store = WeightStore::open(dir, device.clone(), dtype)?;
        Self::load_prefixed(&store, "mtp_layers.0", MtpFormat::Speculators, cfg, target, trained)
    }
}

impl SequentialDraftModel for MtpDraft {
    fn name(&self) -> &str {
        match self.format {
            MtpFormat::MiMo => "MTP (MiMo)",
            MtpFormat::Speculators => "MTP",
            MtpFormat::DeepSeek => "MTP (DeepSeek-V3 layout)",
        }
    }

    fn inputs(&self) -> DraftInputs {
        DraftInputs { taps: Vec::new(), final_hidden: true }
    }

    fn first_inputs(&self, _taps: &[Tensor], final_hidden: Option<&Tensor>, flat_index: &Tensor) -> Result<Tensor> {
        final_hidden
            .ok_or_else(|| candle_core::Error::msg("MTP needs the target's final hidden states"))?
            .index_select(flat_index, 0)
    }

    fn forward(&self, hidden: &Tensor, batch: &ForwardBatch, kv: &PagedKvCache) -> Result<(Tensor, DraftLogits)> {
        batch.validate()?;
        let ids = Tensor::from_slice(&batch.input_ids, batch.num_tokens(), &self.device)?;
        let emb = self.token_layernorm.forward(&self.embed_tokens.embed(&ids)?.to_dtype(self.dtype)?)?;
        let hid = self.hidden_layernorm.forward(&hidden.to_dtype(self.dtype)?)?;
        // 1. Fuse: MiMo puts the hidden state first, the others the embedding.
        let fused = match self.format {
            MtpFormat::MiMo => Tensor::cat(&[&hid, &emb], D::Minus1)?,
            MtpFormat::Speculators | MtpFormat::DeepSeek => Tensor::cat(&[&emb, &hid], D::Minus1)?,
        };
        let u = self.input_proj.forward(&fused)?;
        // 2. An ordinary pre-norm decoder layer, then the final norm.
        let attn_in = match &self.layer.input_layernorm {
            Some(n) => n.forward(&u)?,
            None => u.clone(),
        };
        let raw = self.layer.forward(&attn_in, &u, &self.rope, kv, batch)?;
        let y = self.final_layernorm.forward(&raw)?;
        // 3. Logits with the head; DeepSeek-style heads chain the un-normed output.
        let logits =
            super::logits_at(&y, &batch.logits_indices, self.layer_cfg.vocab_size, |at| self.lm_head.forward(at))?;
        let next_hidden = if self.format == MtpFormat::DeepSeek { raw } else { y };
        Ok((next_hidden, DraftLogits { logits, draft_to_target: None }))
    }

    fn new_kv_cache(&self, num_blocks: usize, block_size: usize) -> Result<PagedKvCache> {
        PagedKvCache::for_config(&self.layer_cfg, 1, num_blocks, block_size, self.dtype, &self.device)
    }

    fn kv_bytes_per_token(&self) -> u64 {
        DraftLayer::kv_bytes_per_token(&self.layer_cfg, self.dtype.size_in_bytes())
    }

    fn trained_width(&self) -> Option<usize> {
        self.trained_width
    }
}
