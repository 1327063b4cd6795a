//! DSpark (DeepSeek, DeepSpec): the block backbone with the anchor as a drafting slot and a
//! low-rank Markov head that corrects each slot's logits by the token drafted before it.
//!
//! Formats:
//! - **DeepSpec** (`architectures: ["Qwen3DSparkModel"]`, e.g.
//!   `deepseek-ai/dspark_qwen3_8b_block7`; `DSparkDraftModel` packagings read the same keys): a
//!   copy of the target's Qwen3 config with the draft `num_hidden_layers`, top-level
//!   `block_size` (7), `target_layer_ids` (output-of-layer ids, `-1` = the embeddings: index
//!   `id + 1`), `mask_token_id`, `markov_rank`, `markov_head_type`, `layer_types`.
//! - **speculators** (`speculators_model_type: "dspark"`, `DSparkSpeculator`): the layer config
//!   in `transformer_layer_config`; `aux_hidden_state_layer_ids` (hidden-state indices, each
//!   ≥ 1), `draft_vocab_size` (with `lm_head [Vd, H]`, `d2t [Vd]` when reduced),
//!   `sample_from_anchor`, `speculators_config.proposal_methods[0].speculative_tokens`.
//!
//! Tensors: the DFlash body (`fc`, `hidden_norm`, `norm`, `layers.{i}.*` with q/k norms),
//! `markov_head.markov_w1.weight [V, r]` (an embedding of the previous *target* token) and
//! `markov_head.markov_w2.weight [Vd, r]`. Copies of the target's `embed_tokens`/`lm_head` are
//! shared with the target; a `confidence_head` (predicted acceptance per slot) is not read:
//! the engine's verify width comes from its width policy, not from per-slot confidence.
//!
//! Block `[x_a, mask × (B − 1)]` at positions `a .. a + B − 1`; with `sample_from_anchor`
//! (the default) slot `k` predicts `a + k + 1`, so all `B` slots draft. Drafting is
//! sequential over the slots on logits only: `logits_k = lm_head(norm(h_k)) +
//! markov_w2 · markov_w1[prev_k]`, `prev_0` the anchor and `prev_k` the token chosen at slot
//! `k − 1`.
//!
//! Config rules (Modular MAX's DSpark parser): `block_size ≥ 2`; `mask_token_id` in the
//! vocabulary; `draft_vocab_size` in `1..=V`; target layers non-empty and strictly increasing
//! (speculators ids ≥ 1); every layer of one type, causal exactly when sliding unless `causal`
//! says otherwise, sliding layers with a positive window; `sliding_window_non_causal`
//! unsupported; a `vanilla` Markov head of positive rank; the default rotary embedding; and a
//! declared `speculative_tokens` equal to the trained width.

use std::path::Path;

use candle_core::{Device, Result, Tensor};
use serde_json::Value;

use super::block::{
    AttentionKeys, BlockBackbone, BlockConfig, TargetDims, architecture_name, layer_config, opt_bool, opt_usize,
    output_of_layer_taps, read_config, req_int_list, req_usize, require_default_rope, speculators_layer_json,
    speculators_tokens,
};
use super::dflash::check_target_hidden_size;
use super::{BlockDraftModel, SlotSampler};
use crate::error::{ModelError, Result as LoadResult};
use crate::linear::{Linear, LinearWeight};
use crate::models::CausalLm;
use crate::weights::{ModelDType, WeightStore};

/// Which DSpark checkpoint flavour.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DSparkFormat {
    DeepSpec,
    Speculators,
}

/// A parsed DSpark config.
#[derive(Debug, Clone)]
pub struct DSparkConfig {
    pub format: DSparkFormat,
    pub block: BlockConfig,
    pub markov_rank: usize,
}

/// The Markov head rules: `vanilla`, positive rank.
fn markov_rank(json: &Value) -> LoadResult<usize> {
    let rank = req_usize(json, "markov_rank", "markov_rank")?;
    if rank == 0 {
        return Err(ModelError::config(
            "markov_rank",
            "DSpark drafts through its Markov head: markov_rank must be > 0 (0 disables the head)",
        ));
    }
    match json.get("markov_head_type").and_then(Value::as_str).unwrap_or("vanilla") {
        "vanilla" => Ok(rank),
        other => Err(ModelError::config(
            "markov_head_type",
            format!("Markov head type '{other}' is not supported; spec-rs runs 'vanilla' heads"),
        )),
    }
}

/// Every layer of one type: all full attention or all sliding.
fn check_homogeneous(keys: &AttentionKeys) -> LoadResult<()> {
    if let Some(types) = &keys.layer_types
        && types.iter().any(|t| *t != types[0])
    {
        return Err(ModelError::config(
            "layer_types",
            format!("DSpark drafts need every layer of one type (all full or all sliding), got {types:?}"),
        ));
    }
    Ok(())
}

fn deepspec_config(json: &Value, target: &TargetDims) -> LoadResult<BlockConfig> {
    let taps_key = "target_layer_ids";
    let taps = output_of_layer_taps(&req_int_list(json, taps_key, taps_key)?, taps_key)?;
    check_target_hidden_size(json, target)?;
    require_default_rope(json)?;
    let layer = layer_config(json, target)?;
    let keys = AttentionKeys::read(json, json, json.get("dflash_config"))?;
    check_homogeneous(&keys)?;
    Ok(BlockConfig {
        taps,
        block_size: req_usize(json, "block_size", "block_size")?,
        mask_token_id: super::block::mask_token_id(req_usize(json, "mask_token_id", "mask_token_id")?, target)?,
        samples_from_anchor: opt_bool(json, "sample_from_anchor", "sample_from_anchor")?.unwrap_or(true),
        draft_vocab_size: opt_usize(json, "draft_vocab_size", "draft_vocab_size")?.unwrap_or(target.vocab_size),
        attention: keys.resolve(layer.num_hidden_layers, false)?,
        input_embedding_scale: 1.0,
        speculative_tokens: None,
        taps_key,
        layer,
    })
}

fn speculators_config(json: &Value, target: &TargetDims) -> LoadResult<BlockConfig> {
    let layer_json = speculators_layer_json(json)?;
    let taps_key = "aux_hidden_state_layer_ids";
    let taps = req_int_list(json, taps_key, taps_key)?
        .into_iter()
        .map(|id| {
            if id < 1 {
                Err(ModelError::config(
                    taps_key,
                    format!("id {id} is below 1 (id j names the input of target layer j, so the smallest is 1)"),
                ))
            } else {
                Ok(id as usize)
            }
        })
        .collect::<LoadResult<Vec<_>>>()?;
    if opt_bool(json, "sliding_window_non_causal", "sliding_window_non_causal")? == Some(true) {
        return Err(ModelError::config(
            "sliding_window_non_causal",
            "non-causal sliding-window DSpark layers are not supported",
        ));
    }
    check_target_hidden_size(json, target)?;
    require_default_rope(&layer_json)?;
    let layer = layer_config(&layer_json, target)?;
    let keys = AttentionKeys::read(json, &layer_json, json.get("dflash_config"))?;
    check_homogeneous(&keys)?;
    Ok(BlockConfig {
        taps,
        block_size: req_usize(json, "block_size", "block_size")?,
        mask_token_id: super::block::mask_token_id(req_usize(json, "mask_token_id", "mask_token_id")?, target)?,
        samples_from_anchor: opt_bool(json, "sample_from_anchor", "sample_from_anchor")?.unwrap_or(true),
        draft_vocab_size: opt_usize(json, "draft_vocab_size", "draft_vocab_size")?.unwrap_or(target.vocab_size),
        attention: keys.resolve(layer.num_hidden_layers, false)?,
        input_embedding_scale: 1.0,
        speculative_tokens: speculators_tokens(json),
        taps_key,
        layer,
    })
}

/// Parses a DSpark draft `config.json` for a target of `target`'s dimensions.
pub fn dspark_config(json: &Value, target: &TargetDims) -> LoadResult<DSparkConfig> {
    let (format, block) = match json.get("speculators_model_type").and_then(Value::as_str) {
        Some("dspark") => (DSparkFormat::Speculators, speculators_config(json, target)?),
        Some(other) => {
            return Err(ModelError::config(
                "speculators_model_type",
                format!("'{other}' is not a DSpark draft (expected 'dspark')"),
            ));
        }
        None => match architecture_name(json) {
            "Qwen3DSparkModel" | "DSparkDraftModel" => (DSparkFormat::DeepSpec, deepspec_config(json, target)?),
            other => {
                return Err(ModelError::UnknownArchitecture {
                    name: other.to_string(),
                    supported: "Qwen3DSparkModel, DSparkDraftModel (DeepSpec), speculators dspark (DSparkSpeculator)"
                        .into(),
                });
            }
        },
    };
    block.check(target)?;
    let markov_rank = markov_rank(json)?;
    if let Some(k) = block.speculative_tokens
        && k != block.trained_width()
    {
        return Err(ModelError::config(
            "speculators_config.proposal_methods[0].speculative_tokens",
            format!(
                "is {k}, but a block of {} slots {} drafts {} tokens",
                block.block_size,
                if block.samples_from_anchor { "sampling from its anchor" } else { "after its anchor" },
                block.trained_width()
            ),
        ));
    }
    Ok(DSparkConfig { format, block, markov_rank })
}

/// A loaded DSpark drafter.
#[derive(Debug, Clone)]
pub struct DSparkDraft {
    backbone: BlockBackbone,
    /// `[V, r]`, indexed by the previous target token.
    markov_w1: LinearWeight,
    /// `r -> Vd`.
    markov_w2: Linear,
    format: DSparkFormat,
}

impl DSparkDraft {
    /// Loads a draft checkpoint directory for `target`, sharing its embedding and `lm_head`.
    pub fn load(dir: &Path, target: &CausalLm, device: &Device, dtype: ModelDType) -> LoadResult<Self> {
        let json = read_config(dir)?;
        let cfg = dspark_config(&json, &TargetDims::from(target.config()))?;
        let store = WeightStore::open(dir, device.clone(), dtype)?;
        Self::load_from(&store, cfg, target)
    }

    pub fn load_from(store: &WeightStore, cfg: DSparkConfig, target: &CausalLm) -> LoadResult<Self> {
        let (v, vd, r) = (target.config().vocab_size, cfg.block.draft_vocab_size, cfg.markov_rank);
        Ok(Self {
            markov_w1: store.embedding_weight("markov_head.markov_w1.weight", v, r)?,
            markov_w2: store.linear("markov_head.markov_w2", vd, r, false)?,
            backbone: BlockBackbone::load(store, cfg.block, target, |_| Ok(None))?,
            format: cfg.format,
        })
    }

    pub fn format(&self) -> DSparkFormat {
        self.format
    }
}

impl BlockDraftModel for DSparkDraft {
    fn name(&self) -> &str {
        "DSpark"
    }

    fn backbone(&self) -> &BlockBackbone {
        &self.backbone
    }

    fn head(&self, hidden: &Tensor, anchors: &[u32], sampler: &mut dyn SlotSampler) -> Result<Vec<Vec<u32>>> {
        if anchors.is_empty() {
            return Ok(Vec::new());
        }
        let (n, w) = (anchors.len(), hidden.dim(0)? / anchors.len());
        let device = self.backbone.device();
        // 1. Base logits of every drafting slot at once: [n·W, H] -> [n, W, Vd].
        let base = self.backbone.logits(hidden)?;
        let vd = base.dim(1)?;
        let base = base.reshape((n, w, vd))?;
        let map = self.backbone.draft_to_target();
        // 2. Slot by slot: the Markov bias of the previous token, then the choice.
        let mut previous = anchors.to_vec();
        let mut drafts = vec![Vec::with_capacity(w); n];
        for slot in 0..w {
            let ids = Tensor::from_slice(&previous, n, device)?;
            // [n] -> [n, r] -> [n, Vd].
            let latent = self.markov_w1.embed(&ids)?.to_dtype(self.backbone.dtype())?;
            let bias = self.markov_w2.forward(&latent)?.to_dtype(candle_core::DType::F32)?;
            let logits = (base.narrow(1, slot, 1)?.squeeze(1)? + bias)?;
            previous = sampler.choose_slot(slot, &logits, map)?;
            for (draft, &token) in drafts.iter_mut().zip(&previous) {
                draft.push(token);
            }
        }
        Ok(drafts)
    }
}
