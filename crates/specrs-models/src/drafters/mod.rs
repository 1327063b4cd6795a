//! Drafters: the models that propose draft tokens.
//!
//! Sequential drafters (EAGLE-1, EAGLE-3, MTP) run one token per row per forward: a first
//! forward pairs the target's hidden state at each committed position `t` with the token at
//! `t + 1`, then each further forward feeds the drafter its own output and its last draft.
//! They share [`SequentialDraftModel`]; the engine's sequential driver runs any of them.
//!
//! Block drafters (DFlash, DFlash2, DSpark) propose a whole block per forward: the target's
//! hidden states of committed positions are projected into the drafter's KV ("materialised"),
//! then one forward over `[anchor, mask × (S − 1)]` yields every draft. They share
//! [`block::BlockBackbone`] and [`BlockDraftModel`]; the engine's block driver runs any of them.

pub mod block;
pub mod dflash;
pub mod dflash2;
pub mod dspark;
pub mod eagle;
pub mod layer;
pub mod mtp;

use std::sync::Arc;

use candle_core::{DType, Result, Tensor};
use specrs_core::config::SpeculativeMethod;

use crate::batch::ForwardBatch;
use crate::kv_cache::PagedKvCache;
use block::BlockBackbone;

/// The method a draft checkpoint was trained for, from its `config.json`: the speculators
/// `speculators_model_type`, else the architecture its trainer writes (a one-layer
/// `LlamaForCausalLM` being an EAGLE head, as MAX and vLLM read it). `None` when the config
/// names no drafter spec-rs runs (a full language model, Medusa, an unknown format).
pub fn trained_method(config: &serde_json::Value) -> Option<SpeculativeMethod> {
    if let Some(kind) = config.get("speculators_model_type") {
        return match kind.as_str()? {
            "eagle3" => Some(SpeculativeMethod::Eagle),
            "dflash" => Some(SpeculativeMethod::Dflash),
            "dspark" => Some(SpeculativeMethod::Dspark),
            "mtp" => Some(SpeculativeMethod::Mtp),
            _ => None,
        };
    }
    let layers = config.get("num_hidden_layers").and_then(serde_json::Value::as_u64);
    // EAGLE-3 heads name a reduced vocabulary (as `EagleConfig` tells them apart).
    let draft_vocab = config.get("draft_vocab_size").is_some() || config.get("truncated_vocab_size").is_some();
    match config.get("architectures")?.get(0)?.as_str()? {
        "LlamaForCausalLMEagle3"
        | "Eagle3LlamaForCausalLM"
        | "Eagle3DraftModel"
        | "Eagle3Speculator"
        | "LlamaForCausalLMEagle" => Some(SpeculativeMethod::Eagle),
        "LlamaForCausalLM" if layers == Some(1) || draft_vocab => Some(SpeculativeMethod::Eagle),
        "DFlashDraftModel" => Some(SpeculativeMethod::Dflash),
        "DFlash2DraftModel" => Some(SpeculativeMethod::Dflash2),
        "Qwen3DSparkModel" | "DSparkDraftModel" => Some(SpeculativeMethod::Dspark),
        _ => None,
    }
}

/// Draft logits and, for a reduced draft vocabulary, the map from draft index to target id.
#[derive(Debug, Clone)]
pub struct DraftLogits {
    /// `[rows, draft_vocab]` f32.
    pub logits: Tensor,
    /// `draft index -> target token id`; `None` when the draft vocabulary is the target's.
    pub draft_to_target: Option<Arc<Vec<u32>>>,
}

/// Which target outputs a drafter reads.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DraftInputs {
    /// Hugging Face `hidden_states` indices of the target taps.
    pub taps: Vec<usize>,
    /// The target's final normed hidden state.
    pub final_hidden: bool,
}

pub trait SequentialDraftModel: Send + Sync {
    /// Name for logs, e.g. "EAGLE-3".
    fn name(&self) -> &str;

    fn inputs(&self) -> DraftInputs;

    /// What the drafter keeps of the target's outputs at the rows `flat_index [n]` (u32):
    /// `[n, D]`, made into step-0 hidden inputs by [`Self::first_hidden`] when fed. A row
    /// that does not draft for a while keeps these, so work only feeding needs belongs there.
    fn first_inputs(&self, taps: &[Tensor], final_hidden: Option<&Tensor>, flat_index: &Tensor) -> Result<Tensor>;

    /// Step-0 hidden inputs `[n, hidden]` from rows of [`Self::first_inputs`].
    fn first_hidden(&self, inputs: &Tensor) -> Result<Tensor> {
        Ok(inputs.clone())
    }

    /// One drafter forward: `hidden [T, hidden]` paired with `batch.input_ids` (the token after
    /// each hidden state's position). Writes the drafter's keys and values, returns the output
    /// hidden states `[T, hidden]` that feed the next step and the logits at
    /// `batch.logits_indices`.
    fn forward(&self, hidden: &Tensor, batch: &ForwardBatch, kv: &PagedKvCache) -> Result<(Tensor, DraftLogits)>;

    /// A KV cache for the drafter's own layers, sharing the target's block layout.
    fn new_kv_cache(&self, num_blocks: usize, block_size: usize) -> Result<PagedKvCache>;

    /// Bytes of drafter KV per token (memory planning).
    fn kv_bytes_per_token(&self) -> u64;

    /// Drafts per step the checkpoint was trained for, when it says.
    fn trained_width(&self) -> Option<usize> {
        None
    }
}

/// Chooses each drafting slot's token from its logits (the driver's proposal policy: argmax,
/// or a sample under the request's parameters with its distribution kept).
pub trait SlotSampler {
    /// `logits [Vd]` of drafting slot `slot` (0-based among the row's drafts) of drafting row
    /// `row`; `draft_to_target` maps draft-vocabulary indices to target ids when the draft
    /// vocabulary is reduced. Returns the chosen target token id.
    fn choose(&mut self, row: usize, slot: usize, logits: &[f32], draft_to_target: Option<&[u32]>) -> u32;

    /// Every row's token of drafting slot `slot` from `logits [n, Vd]` f32, where they live.
    /// Heads that correct slot by slot call this once per slot. The default copies the logits
    /// to the host and asks [`Self::choose`] row by row; a driver whose logits are on a device
    /// overrides it to choose there, so only the `n` ids come back.
    fn choose_slot(
        &mut self,
        slot: usize,
        logits: &Tensor,
        draft_to_target: Option<&Arc<Vec<u32>>>,
    ) -> Result<Vec<u32>> {
        choose_slot_on_host(self, slot, logits, draft_to_target)
    }

    /// Whether the driver chooses where the logits live (then a head that reads its logits
    /// another way, such as DFlash2's candidate lists, reads them there too).
    fn chooses_on_device(&self) -> bool {
        false
    }
}

/// [`SlotSampler::choose_slot`] through host copies: [`SlotSampler::choose`] on each row.
pub fn choose_slot_on_host<S: SlotSampler + ?Sized>(
    sampler: &mut S,
    slot: usize,
    logits: &Tensor,
    draft_to_target: Option<&Arc<Vec<u32>>>,
) -> Result<Vec<u32>> {
    let vd = logits.dim(1)?;
    let map = draft_to_target.map(|m| m.as_slice());
    crate::host::with_f32_slice(logits, |all| {
        all.chunks(vd).enumerate().map(|(row, x)| sampler.choose(row, slot, x, map)).collect()
    })
}

/// A drafter that proposes a block of tokens per forward.
///
/// Per step the driver calls [`materialize`](Self::materialize) on every committed position
/// of every row, then [`forward_block`](Self::forward_block) once over the drafting rows'
/// blocks, then [`head`](Self::head) on the drafting slots.
pub trait BlockDraftModel: Send + Sync {
    /// Name for logs, e.g. "DFlash".
    fn name(&self) -> &str;

    fn backbone(&self) -> &BlockBackbone;

    /// Draft tokens from the drafting slots' hidden states: `hidden [n·W, H]` holds `W`
    /// consecutive slots per row (the first drafting slot first), `anchors [n]` the rows'
    /// anchor tokens. Returns `n` lists of `W` target token ids. Sequential corrections (the
    /// DSpark Markov head, the DFlash2 selector walk) happen here, slot by slot.
    fn head(&self, hidden: &Tensor, anchors: &[u32], sampler: &mut dyn SlotSampler) -> Result<Vec<Vec<u32>>>;

    /// The drafting slots' logits (`hidden [n·W, H]` to `[n·W, Vd]` f32, where they are) when
    /// every slot's token is chosen from its own logits alone, so a driver may choose on the
    /// device instead of through [`Self::head`]. `None` (the default) for heads that correct
    /// slot by slot.
    fn independent_slot_logits(&self, _hidden: &Tensor) -> Result<Option<DraftLogits>> {
        Ok(None)
    }

    /// Which target outputs the drafter reads.
    fn inputs(&self) -> DraftInputs {
        DraftInputs { taps: self.backbone().config().taps.clone(), final_hidden: false }
    }

    /// Slots of the trained block, the anchor included.
    fn block_size(&self) -> usize {
        self.backbone().config().block_size
    }

    fn mask_token_id(&self) -> u32 {
        self.backbone().config().mask_token_id
    }

    /// Slot 0 (the anchor) drafts too: slot `k` predicts the token after its own position.
    fn samples_from_anchor(&self) -> bool {
        self.backbone().config().samples_from_anchor
    }

    /// Drafts one block was trained to produce: `block_size − (0 if samples_from_anchor else 1)`.
    fn trained_width(&self) -> usize {
        self.backbone().config().trained_width()
    }

    /// Whether the driver may skip the block forward on steps whose schedule verifies
    /// nothing. Block drafters keep no state besides the materialised context (written every
    /// step regardless), so any of them can.
    fn supports_zero_draft_rows(&self) -> bool {
        true
    }

    /// Writes the context keys and values of committed positions: rows `flat_index [n]` (u32)
    /// of the target's `taps`, at `positions [n]`, into KV `slots [n]`.
    fn materialize(
        &self,
        taps: &[Tensor],
        flat_index: &Tensor,
        positions: &[u32],
        slots: &[u32],
        kv: &PagedKvCache,
    ) -> Result<()> {
        self.backbone().materialize(taps, flat_index, positions, slots, kv)
    }

    /// One forward over `batch`, whose rows are blocks `[anchor, mask × (S − 1)]` at the
    /// positions they stand for; returns every slot's final normed hidden state `[T, H]`.
    fn forward_block(&self, batch: &ForwardBatch, kv: &PagedKvCache) -> Result<Tensor> {
        self.backbone().forward(batch, kv)
    }

    /// A KV cache for the drafter's layers, sharing the target's block layout.
    fn new_kv_cache(&self, num_blocks: usize, block_size: usize) -> Result<PagedKvCache> {
        self.backbone().new_kv_cache(num_blocks, block_size)
    }

    /// Bytes of drafter KV per token (memory planning).
    fn kv_bytes_per_token(&self) -> u64 {
        self.backbone().kv_bytes_per_token()
    }
}

/// Logits `[n, vocab]` (f32) of the rows `indices` of a drafter's output `out [T, H]`, through
/// `head`. A forward that only feeds positions (a catch-up, or rows riding along while no row
/// drafts) asks for none: its empty result is made on the host, because CUDA cannot allocate
/// a zero-sized buffer (`index_select` with an empty index fails there).
pub(crate) fn logits_at(
    out: &Tensor,
    indices: &[u32],
    vocab: usize,
    head: impl FnOnce(&Tensor) -> Result<Tensor>,
) -> Result<Tensor> {
    if indices.is_empty() {
        return Tensor::zeros((0, vocab), DType::F32, &candle_core::Device::Cpu);
    }
    let idx = Tensor::from_slice(indices, indices.len(), out.device())?;
    head(&out.index_select(&idx, 0)?)?.to_dtype(DType::F32)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_draft_config_names_the_method_it_was_trained_for() {
        let cases = [
            (json!({"speculators_model_type": "eagle3", "architectures": ["Eagle3Speculator"]}), Some("eagle")),
            (json!({"speculators_model_type": "dflash"}), Some("dflash")),
            (json!({"speculators_model_type": "dspark"}), Some("dspark")),
            (json!({"speculators_model_type": "mtp", "architectures": ["MTPDraftModel"]}), Some("mtp")),
            (json!({"speculators_model_type": "peagle"}), None),
            (json!({"architectures": ["LlamaForCausalLMEagle3"]}), Some("eagle")),
            (json!({"architectures": ["Eagle3LlamaForCausalLM"]}), Some("eagle")),
            // EAGLE-1 heads and EAGLE-3 ones with a draft vocabulary: one Llama layer.
            (json!({"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 1}), Some("eagle")),
            (json!({"architectures": ["LlamaForCausalLM"], "draft_vocab_size": 32000}), Some("eagle")),
            (json!({"architectures": ["DFlashDraftModel"], "num_hidden_layers": 5}), Some("dflash")),
            (json!({"architectures": ["DFlash2DraftModel"]}), Some("dflash2")),
            (json!({"architectures": ["Qwen3DSparkModel"]}), Some("dspark")),
            // A language model is not a drafter spec-rs runs (vLLM's draft_model method).
            (json!({"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 30}), None),
            (json!({"architectures": ["MedusaModel"], "medusa_num_heads": 4}), None),
            (json!({}), None),
        ];
        for (config, want) in cases {
            assert_eq!(trained_method(&config).map(|m| m.as_str()), want, "{config}");
        }
    }
}
