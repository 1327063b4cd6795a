//! DFlash (Chen et al., block-diffusion drafting) in the checkpoint formats in use:
//!
//! - **z-lab native** (`architectures: ["DFlashDraftModel"]`, e.g. `z-lab/Qwen3-8B-DFlash-b16`):
//!   a Qwen3 `config.json` of the draft layers plus `dflash_config: {mask_token_id,
//!   target_layer_ids[, block_size, use_swa, swa_window_size, causal]}`, `block_size` in
//!   `dflash_config` or at the top level, `layer_types`/`sliding_window` for sliding layers.
//!   `target_layer_ids` name a layer's *output*: Hugging Face `hidden_states[id + 1]`.
//!   Tensors `fc [H, n_taps·H]`, `hidden_norm`, `norm`, `layers.{i}.*` (Qwen3 layers with
//!   `q_norm`/`k_norm`); no embedding or `lm_head` of its own.
//! - **speculators** (`speculators_model_type: "dflash"`, `DFlashSpeculator`): the layer config
//!   nested in `transformer_layer_config`; top-level `block_size`, `mask_token_id`,
//!   `aux_hidden_state_layer_ids` (already `hidden_states` indices: z-lab ids + 1),
//!   `draft_vocab_size` (a reduced vocabulary comes with `lm_head [Vd, H]` and `d2t [Vd]`),
//!   `sample_from_anchor` (false), `sliding_window_non_causal`.
//!
//! The forward is [`BlockBackbone`]'s: block `[x_a, mask × (B − 1)]` at positions
//! `a .. a + B − 1`, full-attention layers bidirectional within the block over the injected
//! context, sliding layers causal and windowed. Slot `j ≥ 1` predicts the token at `a + j`
//! (`lm_head(norm(x_j))`), so one forward drafts `B − 1` tokens.

use std::path::Path;

use candle_core::{Device, Result, Tensor};
use serde_json::Value;

use super::block::{
    AttentionKeys, BlockBackbone, BlockConfig, TargetDims, architecture_name, layer_config, opt_bool, opt_usize,
    output_of_layer_taps, read_config, req_int_list, req_usize, speculators_layer_json, speculators_tokens,
};
use super::{BlockDraftModel, DraftLogits, SlotSampler};
use crate::error::{ModelError, Result as LoadResult};
use crate::host::with_f32_slice;
use crate::models::CausalLm;
use crate::weights::{ModelDType, WeightStore};

/// Which DFlash checkpoint flavour.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DFlashFormat {
    ZLab,
    Speculators,
}

/// Rejects a `target_hidden_size` other than the target's: the draft projects the target's
/// hidden states with `fc` and embeds with the target's table, so widths must agree.
pub(crate) fn check_target_hidden_size(json: &Value, target: &TargetDims) -> LoadResult<()> {
    if let (Some(ht), Some(h)) = (opt_usize(json, "target_hidden_size", "target_hidden_size")?, target.hidden_size)
        && ht != h
    {
        return Err(ModelError::config(
            "target_hidden_size",
            format!("the draft was trained on a target of hidden size {ht}, this target has {h}"),
        ));
    }
    Ok(())
}

/// The block config of a z-lab native checkpoint (DFlash and DFlash2 share it).
pub(crate) fn zlab_block_config(json: &Value, target: &TargetDims) -> LoadResult<BlockConfig> {
    let dc = json.get("dflash_config").filter(|v| v.is_object()).ok_or_else(|| {
        ModelError::config(
            "dflash_config",
            "missing from the draft config (it names mask_token_id and target_layer_ids)",
        )
    })?;
    let mask_token_id = match opt_usize(dc, "mask_token_id", "dflash_config.mask_token_id")? {
        Some(m) => m,
        None => opt_usize(json, "mask_token_id", "mask_token_id")?
            .ok_or_else(|| ModelError::config("dflash_config.mask_token_id", "missing from the draft config"))?,
    };
    let taps_key = "dflash_config.target_layer_ids";
    let taps = output_of_layer_taps(&req_int_list(dc, "target_layer_ids", taps_key)?, taps_key)?;
    let block_size = match opt_usize(dc, "block_size", "dflash_config.block_size")? {
        Some(b) => b,
        None => opt_usize(json, "block_size", "block_size")?.ok_or_else(|| {
            ModelError::config(
                "block_size",
                "missing: the draft config sets neither block_size nor dflash_config.block_size",
            )
        })?,
    };
    check_target_hidden_size(json, target)?;
    let layer = layer_config(json, target)?;
    let attention = AttentionKeys::read(json, json, Some(dc))?.resolve(layer.num_hidden_layers, false)?;
    Ok(BlockConfig {
        taps,
        block_size,
        mask_token_id: super::block::mask_token_id(mask_token_id, target)?,
        samples_from_anchor: false,
        draft_vocab_size: target.vocab_size,
        attention,
        input_embedding_scale: 1.0,
        speculative_tokens: None,
        taps_key,
        layer,
    })
}

fn speculators_block_config(json: &Value, target: &TargetDims) -> LoadResult<BlockConfig> {
    let layer_json = speculators_layer_json(json)?;
    let taps_key = "aux_hidden_state_layer_ids";
    let taps = req_int_list(json, taps_key, taps_key)?
        .into_iter()
        .map(|id| {
            usize::try_from(id)
                .map_err(|_| ModelError::config(taps_key, format!("hidden-state index {id} is negative")))
        })
        .collect::<LoadResult<Vec<_>>>()?;
    check_target_hidden_size(json, target)?;
    let layer = layer_config(&layer_json, target)?;
    let non_causal_sliding = opt_bool(json, "sliding_window_non_causal", "sliding_window_non_causal")?.unwrap_or(false);
    let attention = AttentionKeys::read(json, &layer_json, json.get("dflash_config"))?
        .resolve(layer.num_hidden_layers, non_causal_sliding)?;
    Ok(BlockConfig {
        taps,
        block_size: req_usize(json, "block_size", "block_size")?,
        mask_token_id: super::block::mask_token_id(req_usize(json, "mask_token_id", "mask_token_id")?, target)?,
        samples_from_anchor: opt_bool(json, "sample_from_anchor", "sample_from_anchor")?.unwrap_or(false),
        draft_vocab_size: opt_usize(json, "draft_vocab_size", "draft_vocab_size")?.unwrap_or(target.vocab_size),
        attention,
        input_embedding_scale: 1.0,
        speculative_tokens: speculators_tokens(json),
        taps_key,
        layer,
    })
}

/// Parses a DFlash draft `config.json` for a target of `target`'s dimensions.
pub fn dflash_config(json: &Value, target: &TargetDims) -> LoadResult<(DFlashFormat, BlockConfig)> {
    let (format, cfg) = match json.get("speculators_model_type").and_then(Value::as_str) {
        Some("dflash") => (DFlashFormat::Speculators, speculators_block_config(json, target)?),
        Some(other) => {
            return Err(ModelError::config(
                "speculators_model_type",
                format!("'{other}' is not a DFlash draft (expected 'dflash')"),
            ));
        }
        None => match architecture_name(json) {
            "DFlashDraftModel" => (DFlashFormat::ZLab, zlab_block_config(json, target)?),
            other => {
                return Err(ModelError::UnknownArchitecture {
                    name: other.to_string(),
                    supported: "DFlashDraftModel (z-lab), speculators dflash (DFlashSpeculator)".into(),
                });
            }
        },
    };
    cfg.check(target)?;
    Ok((format, cfg))
}

/// A loaded DFlash drafter.
#[derive(Debug, Clone)]
pub struct DFlashDraft {
    backbone: BlockBackbone,
    format: DFlashFormat,
}

impl DFlashDraft {
    /// Loads a draft checkpoint directory for `target`, sharing its embedding and `lm_head`.
    pub fn load(dir: &Path, target: &CausalLm, device: &Device, dtype: ModelDType) -> LoadResult<Self> {
        let json = read_config(dir)?;
        let (format, cfg) = dflash_config(&json, &TargetDims::from(target.config()))?;
        let store = WeightStore::open(dir, device.clone(), dtype)?;
        Self::load_from(&store, format, cfg, target)
    }

    pub fn load_from(
        store: &WeightStore,
        format: DFlashFormat,
        cfg: BlockConfig,
        target: &CausalLm,
    ) -> LoadResult<Self> {
        Ok(Self { backbone: BlockBackbone::load(store, cfg, target, |_| Ok(None))?, format })
    }

    pub fn format(&self) -> DFlashFormat {
        self.format
    }
}

impl BlockDraftModel for DFlashDraft {
    fn name(&self) -> &str {
        "DFlash"
    }

    fn backbone(&self) -> &BlockBackbone {
        &self.backbone
    }

    fn independent_slot_logits(&self, hidden: &Tensor) -> Result<Option<DraftLogits>> {
        Ok(Some(DraftLogits {
            logits: self.backbone.logits(hidden)?,
            draft_to_target: self.backbone.draft_to_target().cloned(),
        }))
    }

    fn head(&self, hidden: &Tensor, anchors: &[u32], sampler: &mut dyn SlotSampler) -> Result<Vec<Vec<u32>>> {
        if anchors.is_empty() {
            return Ok(Vec::new());
        }
        let (n, w) = (anchors.len(), hidden.dim(0)? / anchors.len());
        // [n·W, H] -> [n·W, Vd]; each slot's token independently.
        let logits = self.backbone.logits(hidden)?;
        let vd = logits.dim(1)?;
        let map = self.backbone.draft_to_target().map(|m| m.as_slice());
        with_f32_slice(&logits, |all| {
            (0..n)
                .map(|i| {
                    (0..w)
                        .map(|s| {
                            let row = i * w + s;
                            sampler.choose(i, s, &all[row * vd..(row + 1) * vd], map)
                        })
                        .collect()
                })
                .collect()
        })
    }
}
