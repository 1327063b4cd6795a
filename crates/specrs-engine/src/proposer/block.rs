//! The block driver for DFlash, DFlash2 and DSpark drafters: one drafter forward proposes a
//! whole block of tokens.
//!
//! Each step, after the target's tokens are committed:
//! 1. **Materialise.** Every committed position of every row — the last fed token plus the
//!    accepted drafts, or a prefill chunk — projects the target's tapped hidden states into
//!    the drafter's KV at its own position. Rows write from the pre-step length, so whatever
//!    the previous block left at rejected positions is overwritten.
//! 2. **Block.** Each row wanting drafts runs `[anchor, mask × (S − 1)]` at positions
//!    `a .. a + S − 1`, where `a` is the row's last committed token (the bonus or recovered
//!    token, not yet through the target); all rows share one forward. The block's own keys
//!    and values land in slots the engine reserved past the committed tokens
//!    ([`Proposer::draft_lookahead`]) and are rolled back with that reservation.
//! 3. **Head.** The first `K` drafting slots (from slot 1 for DFlash, from the anchor for
//!    DSpark) go through the drafter's head: the target's `lm_head`, DSpark's Markov
//!    correction, DFlash2's selector walk. Tokens are the argmax, or with
//!    `draft_proposal="sampled"` a sample under the request's parameters whose distribution is
//!    kept for rejection sampling. A guided row (structured outputs) chooses each slot among
//!    the tokens its guide allows after the drafts before it, on the host, and its block is cut
//!    after a drafted end or where the guide allows nothing.
//!
//! **Width.** The block runs at its trained width: `K` (`num_speculative_tokens`, resolved by
//! [`resolve_block_width`]) at most the trained width verifies a prefix of the block's
//! proposals; a larger `K` widens the block past what it was trained for, with a warning. The
//! schedule narrows what each step verifies further, as for any proposer.
//!
//! **Zero-draft rows.** When the verify-width schedule verifies nothing at some batch size and
//! the drafter declares `supports_zero_draft_rows`, a step whose drafting rows form such a
//! batch skips the block forward and proposes nothing. Materialisation still runs every step:
//! it is what later blocks attend to, and it is cheap next to a block forward. A wrong guess of
//! the next batch size costs one step without drafts.

use std::sync::Arc;

use candle_core::{Device, Tensor};
use serde_json::Value;
use specrs_core::config::{DraftProposal, SpeculativeMethod};
use specrs_core::sampling::{RngStream, SamplingParams, argmax, processed_probs, sample_inverse_cdf, uniform};
use specrs_core::scheduler::Scheduler;
use specrs_core::structured::{GuideState, TokenGuide};
use specrs_core::width::VerifyWidthSchedule;
use specrs_core::{ConfigError, SpeculativeConfig};
use specrs_models::drafters::block::TargetDims;
use specrs_models::drafters::dflash::dflash_config;
use specrs_models::drafters::dflash2::dflash2_config;
use specrs_models::drafters::dspark::dspark_config;
use specrs_models::drafters::{BlockDraftModel, DraftLogits, SlotSampler, choose_slot_on_host};
use specrs_models::reductions;
use specrs_models::{BatchRow, DecoderConfig, ForwardBatch, PagedKvCache};

use super::confidence::{DraftConfidence, top_probabilities};
use super::{
    DraftProbs, Proposal, ProposeRow, Proposer, StepTaps, TapRequest, allowed_argmax, target_space_distributions,
};
use crate::error::{EngineError, Result};

/// Drafts per step for a block drafter trained to draft `trained` per block.
///
/// Unset, the trained width. An explicit `num_speculative_tokens` below 1 is an error; up to
/// the trained width it verifies a prefix of each block; above it, it is honoured by widening
/// the block beyond its training, with a warning (acceptance past `trained` degrades).
pub fn resolve_block_width(explicit: Option<i64>, trained: usize, drafter: &str) -> Result<usize, ConfigError> {
    match explicit {
        None => Ok(trained),
        Some(k) if k < 1 => Err(ConfigError::field(
            "num_speculative_tokens",
            format!("num_speculative_tokens must be >= 1 for a block drafter, got {k}"),
        )),
        Some(k) => {
            let k = k as usize;
            if k > trained {
                tracing::warn!(
                    "num_speculative_tokens={k} exceeds the {trained} drafts per block the {drafter} checkpoint was \
                     trained for: its blocks are widened to {k} drafting slots, and drafts past {trained} are rarely accepted"
                );
            }
            Ok(k)
        }
    }
}

/// The draft width a block-drafter pipeline runs with, from the speculative config and the
/// target's and draft's Hugging Face configs (MAX's `checkpoint_draft_width`): the trained
/// width read from the draft config, or the explicit `num_speculative_tokens` under
/// [`resolve_block_width`]'s rules. Draft configs are checked in full, so their errors
/// surface before any weight is loaded. A target config without `architectures` (a GGUF
/// target) is replaced by what the draft config says about its target.
pub fn checkpoint_draft_width(spec: &SpeculativeConfig, target_hf: &Value, draft_hf: &Value) -> Result<usize> {
    let method = spec.speculative_method.ok_or_else(|| {
        ConfigError::field("speculative_method", "the draft width of a checkpoint needs a speculative_method")
    })?;
    let dims = match DecoderConfig::from_hf_json(target_hf) {
        Ok(c) => TargetDims::from(&c),
        Err(_) => TargetDims::from_draft_json(draft_hf)?,
    };
    let trained = match method {
        SpeculativeMethod::Dflash => dflash_config(draft_hf, &dims)?.1.trained_width(),
        SpeculativeMethod::Dflash2 => dflash2_config(draft_hf, &dims)?.0.trained_width(),
        SpeculativeMethod::Dspark => dspark_config(draft_hf, &dims)?.block.trained_width(),
        other => {
            return Err(ConfigError::field(
                "speculative_method",
                format!(
                    "'{other}' does not take its width from the draft checkpoint; only dflash, dflash2 and dspark do"
                ),
            )
            .into());
        }
    };
    Ok(resolve_block_width(spec.num_speculative_tokens, trained, method.as_str())?)
}

/// The schedule under which a block driver may skip its forward: the configured verify-width
/// schedule when some batch size verifies nothing, unless mixed prefill+decode steps verify
/// (a mixed step reads drafts at its own width and would find none after a skipped step).
pub fn draft_skip_schedule(
    spec: &SpeculativeConfig,
    num_speculative_tokens: usize,
    max_batch_size: usize,
    mixed_steps_verify: bool,
) -> Result<Option<VerifyWidthSchedule>, ConfigError> {
    let Some(ranges) = &spec.num_speculative_tokens_per_batch_size else { return Ok(None) };
    let schedule = VerifyWidthSchedule::build(ranges, max_batch_size.max(1), num_speculative_tokens)?;
    Ok((schedule.has_zero_width() && !mixed_steps_verify).then_some(schedule))
}

/// The proposal policy of one step: argmax, or sampling with the distribution kept.
struct DraftSampler<'a> {
    proposal: DraftProposal,
    vocab_size: usize,
    params: &'a [&'a SamplingParams],
    seeds: &'a [u64],
    /// Per drafting row, the distributions its drafts were sampled from (`[K · V]`).
    probs: Vec<Option<Vec<f32>>>,
    confidence: DraftConfidence,
    /// Per drafting row: the running top-1 probability of its kept drafts, and the slot its
    /// drafts are cut at. The head drafts the whole block, slots in order, but the row verifies
    /// only up to its cut (a head that chooses without the sampler is never cut).
    chains: Vec<f32>,
    cut_at: Vec<Option<usize>>,
    /// Per drafting row with structured outputs: its guide and its state after the drafts so
    /// far (the slots are chosen in order).
    guides: Vec<Option<(&'a TokenGuide, GuideState)>>,
    /// Choose whole slots where the logits live ([`SlotSampler::choose_slot`]): sampled rows'
    /// distributions then stay there, one `[1, V]` per slot in `device_probs`.
    on_device: bool,
    device_probs: Vec<Vec<Tensor>>,
}

impl DraftSampler<'_> {
    fn is_sampled(&self, row: usize) -> bool {
        self.proposal == DraftProposal::Sampled && !self.params[row].is_greedy()
    }
}

impl SlotSampler for DraftSampler<'_> {
    fn chooses_on_device(&self) -> bool {
        self.on_device
    }

    /// On the device, as [`Self::choose`] chooses on the host: argmax rows through their ids and
    /// top-1 probabilities, sampled rows drawn from their processed distribution (in target-id
    /// space) with their slot's draft-stream uniform.
    fn choose_slot(
        &mut self,
        slot: usize,
        logits: &Tensor,
        draft_to_target: Option<&Arc<Vec<u32>>>,
    ) -> candle_core::Result<Vec<u32>> {
        if !self.on_device {
            return choose_slot_on_host(self, slot, logits, draft_to_target);
        }
        let n = logits.dim(0)?;
        let drawn: Vec<usize> = (0..n).filter(|&i| self.is_sampled(i)).collect();
        let draws: Vec<DeviceDraw<'_>> =
            drawn.iter().map(|&i| DeviceDraw { row: i, params: self.params[i], seed: self.seeds[i], slot }).collect();
        let with_tops = !self.confidence.is_off() && drawn.len() < n;
        let chosen = choose_on_device(logits, draft_to_target, with_tops, &draws, self.vocab_size)?;
        let mut tokens = chosen.argmax;
        if let Some(tops) = &chosen.tops {
            for (i, &top) in tops.iter().enumerate() {
                if !self.is_sampled(i)
                    && self.cut_at[i].is_none()
                    && !self.confidence.keeps_top(&mut self.chains[i], top)
                {
                    self.cut_at[i] = Some(slot);
                }
            }
        }
        if let Some(q) = &chosen.q {
            for (j, (&i, &token)) in drawn.iter().zip(&chosen.samples).enumerate() {
                tokens[i] = token;
                self.device_probs[i].push(q.narrow(0, j, 1)?);
            }
        }
        Ok(tokens)
    }

    fn choose(&mut self, row: usize, slot: usize, logits: &[f32], draft_to_target: Option<&[u32]>) -> u32 {
        let to_target = |i: u32| draft_to_target.map_or(i, |m| m[i as usize]);
        if self.cut_at[row].is_none()
            && let Some((guide, state)) = self.guides[row]
        {
            return self.choose_guided(row, slot, logits, &to_target, guide, state);
        }
        let params = self.params[row];
        if !self.is_sampled(row) {
            let best = argmax(logits);
            // Later slots may depend on this token (DSpark's Markov bias): it is drafted either
            // way, and only the verified prefix is cut.
            if self.cut_at[row].is_none() && !self.confidence.keeps(&mut self.chains[row], logits, best) {
                self.cut_at[row] = Some(slot);
            }
            return to_target(best);
        }
        // The distribution lives in target-id space, where rejection sampling compares it.
        let mut full = vec![f32::NEG_INFINITY; self.vocab_size];
        for (j, &x) in logits.iter().enumerate() {
            full[to_target(j as u32) as usize] = x;
        }
        let q = processed_probs(&full, params, None);
        let token = sample_inverse_cdf(&q, uniform(self.seeds[row], RngStream::Draft, slot as u64));
        self.probs[row].get_or_insert_with(Vec::new).extend_from_slice(&q);
        token
    }
}

impl<'a> DraftSampler<'a> {
    /// A guided row's slot, among the tokens its guide allows: the allowed argmax, or a draw
    /// from the draft distribution masked to them (kept for rejection sampling). The block is
    /// cut here where nothing is allowed, and after this slot where it drafts the end. Later
    /// slots of a cut block are still chosen (a head may feed them forward) but never verified.
    fn choose_guided(
        &mut self,
        row: usize,
        slot: usize,
        logits: &[f32],
        to_target: &impl Fn(u32) -> u32,
        guide: &'a TokenGuide,
        state: GuideState,
    ) -> u32 {
        let allowed = guide.allowed(state);
        let token = if self.is_sampled(row) {
            let mut full = vec![f32::NEG_INFINITY; self.vocab_size];
            for (j, &x) in logits.iter().enumerate() {
                full[to_target(j as u32) as usize] = x;
            }
            allowed.mask_logits(&mut full);
            let q = processed_probs(&full, self.params[row], None);
            let none_allowed = full.iter().all(|x| *x == f32::NEG_INFINITY);
            self.probs[row].get_or_insert_with(Vec::new).extend_from_slice(&q);
            (!none_allowed).then(|| sample_inverse_cdf(&q, uniform(self.seeds[row], RngStream::Draft, slot as u64)))
        } else {
            allowed_argmax(logits, &allowed, to_target)
                .filter(|&best| self.confidence.keeps(&mut self.chains[row], logits, best))
                .map(to_target)
        };
        let Some(token) = token else {
            self.cut_at[row] = Some(slot);
            return to_target(argmax(logits));
        };
        let next = guide.advance(state, token);
        self.guides[row] = Some((guide, next));
        if next == GuideState::Dead || guide.is_end_of_sequence(token) {
            self.cut_at[row] = Some(slot + 1);
        }
        token
    }
}

/// One sampled logit row to draw on the device: its parameters, its request's seed, its slot.
struct DeviceDraw<'a> {
    row: usize,
    params: &'a SamplingParams,
    seed: u64,
    slot: usize,
}

/// Logit rows `logits [m, Vd]` chosen where they live, as the host chooses them: each row's
/// argmax in target ids and, when asked, its top-1 probability; the `draws` rows sampled from
/// their processed distribution (kept, `[draws, V]` in target-id space) with the draft-stream
/// uniform of their slot. Only ids and per-row numbers come back.
struct DeviceChoices {
    argmax: Vec<u32>,
    tops: Option<Vec<f32>>,
    samples: Vec<u32>,
    q: Option<Tensor>,
}

fn choose_on_device(
    logits: &Tensor,
    draft_to_target: Option<&Arc<Vec<u32>>>,
    with_tops: bool,
    draws: &[DeviceDraw<'_>],
    vocab_size: usize,
) -> candle_core::Result<DeviceChoices> {
    let to_target = |i: u32| draft_to_target.map_or(i, |m| m[i as usize]);
    let argmax = reductions::argmax_rows(logits)?.to_vec1::<u32>()?.into_iter().map(to_target).collect();
    let tops = match with_tops {
        true => Some(top_probabilities(logits)?.to_vec1::<f32>()?),
        false => None,
    };
    if draws.is_empty() {
        return Ok(DeviceChoices { argmax, tops, samples: Vec::new(), q: None });
    }
    let rows: Vec<u32> = draws.iter().map(|d| d.row as u32).collect();
    let x = logits.index_select(&Tensor::new(rows.as_slice(), logits.device())?, 0)?;
    let params: Vec<&SamplingParams> = draws.iter().map(|d| d.params).collect();
    let q = target_space_distributions(&x, &params, draft_to_target, vocab_size)?;
    let uniforms: Vec<f64> = draws.iter().map(|d| uniform(d.seed, RngStream::Draft, d.slot as u64)).collect();
    Ok(DeviceChoices { argmax, tops, samples: reductions::sample_rows(&q, &uniforms)?, q: Some(q) })
}

pub struct BlockProposer {
    model: Arc<dyn BlockDraftModel>,
    kv: Option<PagedKvCache>,
    num_speculative_tokens: usize,
    /// Query slots of one block: the trained block, widened when `K` exceeds its width.
    block_slots: usize,
    proposal: DraftProposal,
    skip: Option<VerifyWidthSchedule>,
    confidence: DraftConfidence,
    vocab_size: usize,
    device: Device,
    name: String,
    /// Choose on the drafter's device: all slots at once for heads whose slots are independent
    /// ([`BlockDraftModel::independent_slot_logits`]), slot by slot through
    /// [`SlotSampler::choose_slot`] for the others. Ids and top-1 probabilities come back,
    /// sampled drafts' distributions stay there.
    draws_on_device: bool,
}

impl BlockProposer {
    /// A driver proposing `num_speculative_tokens` drafts per step (see
    /// [`resolve_block_width`]) over a target vocabulary of `vocab_size`.
    pub fn new(
        model: Arc<dyn BlockDraftModel>,
        num_speculative_tokens: usize,
        proposal: DraftProposal,
        vocab_size: usize,
        device: Device,
    ) -> Self {
        let anchor_slot = usize::from(!model.samples_from_anchor());
        let block_slots = model.block_size().max(num_speculative_tokens + anchor_slot);
        let name = model.name().to_string();
        Self {
            model,
            kv: None,
            num_speculative_tokens,
            block_slots,
            proposal,
            skip: None,
            confidence: DraftConfidence::default(),
            vocab_size,
            device,
            name,
            draws_on_device: false,
        }
    }

    /// Chooses the drafts on the drafter's device.
    pub fn with_draws_on_device(mut self, on_device: bool) -> Self {
        self.draws_on_device = on_device;
        self
    }

    /// Verifies each argmax-drafting row's block only up to its first draft whose running top-1
    /// probability falls below the rule's threshold ([`DraftConfidence`]).
    pub fn with_confidence(mut self, confidence: DraftConfidence) -> Self {
        self.confidence = confidence;
        self
    }

    /// Skips the block forward on steps whose drafting batch `schedule` verifies nothing at,
    /// when the drafter supports zero-draft rows (see [`draft_skip_schedule`]).
    pub fn with_draft_skipping(mut self, schedule: VerifyWidthSchedule) -> Self {
        if self.model.supports_zero_draft_rows() && schedule.has_zero_width() {
            self.skip = Some(schedule);
        }
        self
    }

    /// Query slots of each block forward.
    pub fn block_slots(&self) -> usize {
        self.block_slots
    }

    /// Writes the context keys and values of every committed position of every row.
    fn materialize(
        &self,
        rows: &[ProposeRow<'_>],
        taps: &StepTaps<'_>,
        scheduler: &Scheduler,
        kv: &PagedKvCache,
    ) -> Result<()> {
        let blocks = scheduler.kv();
        let (mut flat, mut positions, mut slots) = (Vec::new(), Vec::new(), Vec::new());
        for r in rows.iter().filter(|r| r.num_valid > 0) {
            let span = r.fed_start..r.fed_start + r.num_valid;
            positions.extend(span.clone().map(|p| p as u32));
            slots.extend(blocks.slots(r.seq, span)?);
            flat.extend((r.flat_start..r.flat_start + r.num_valid).map(|i| i as u32));
        }
        if flat.is_empty() {
            return Ok(());
        }
        let flat = Tensor::from_vec(flat.clone(), flat.len(), &self.device)?;
        self.model.materialize(taps.taps, &flat, &positions, &slots, kv)?;
        Ok(())
    }
}

impl Proposer for BlockProposer {
    fn name(&self) -> &str {
        &self.name
    }

    fn num_speculative_tokens(&self) -> usize {
        self.num_speculative_tokens
    }

    /// The block's slots past the anchor (the anchor is the last committed token).
    fn draft_lookahead(&self) -> usize {
        self.block_slots - 1
    }

    fn input_device(&self) -> Option<&Device> {
        Some(&self.device)
    }

    fn tap_request(&self) -> TapRequest {
        let inputs = self.model.inputs();
        TapRequest { taps: inputs.taps, final_hidden: inputs.final_hidden }
    }

    fn kv_bytes_per_token(&self) -> u64 {
        self.model.kv_bytes_per_token()
    }

    fn allocate(&mut self, num_blocks: usize, block_size: usize) -> Result<()> {
        self.kv = Some(self.model.new_kv_cache(num_blocks, block_size)?);
        Ok(())
    }

    fn propose(
        &mut self,
        rows: &[ProposeRow<'_>],
        taps: &StepTaps<'_>,
        scheduler: &Scheduler,
    ) -> Result<Vec<Proposal>> {
        let kv = self.kv.as_ref().ok_or_else(|| EngineError::Internal("drafter KV not allocated".into()))?;
        // 1. Materialise every committed position, drafting or not.
        self.materialize(rows, taps, scheduler, kv)?;
        let drafting: Vec<&ProposeRow<'_>> = rows.iter().filter(|r| r.wants_drafts()).collect();
        let n = drafting.len();
        if n == 0 || self.skip.as_ref().is_some_and(|s| s.width_for(n) == 0) {
            return Ok(vec![Proposal::default(); n]);
        }
        // 2. One block forward: [anchor, mask × (S − 1)] per drafting row.
        let blocks = scheduler.kv();
        let s = self.block_slots;
        let mask = self.model.mask_token_id();
        let mut batch = ForwardBatch { block_size: blocks.block_size(), ..Default::default() };
        for (i, r) in drafting.iter().enumerate() {
            let a = r.tokens.len() - 1;
            batch.input_ids.push(r.tokens[a]);
            batch.input_ids.extend(std::iter::repeat_n(mask, s - 1));
            batch.positions.extend((a..a + s).map(|p| p as u32));
            batch.slot_mapping.extend(blocks.slots(r.seq, a..a + s)?);
            let table = blocks.block_table(r.seq);
            batch.rows.push(BatchRow {
                query_start: i * s,
                query_len: s,
                context_len: a + s,
                block_table_start: batch.block_tables.len(),
                block_table_len: table.len(),
            });
            batch.block_tables.extend_from_slice(table);
        }
        let hidden = self.model.forward_block(&batch, kv)?;
        // 3. The head on each block's first K drafting slots.
        let (k, first) = (self.num_speculative_tokens, usize::from(!self.model.samples_from_anchor()));
        let idx: Vec<u32> = (0..n).flat_map(|i| (i * s + first..i * s + first + k).map(|j| j as u32)).collect();
        let drafting_hidden = hidden.index_select(&Tensor::from_vec(idx, n * k, &self.device)?, 0)?;
        // Guided rows choose their slots on the host, in order, along their guides.
        let guides: Vec<Option<(&TokenGuide, GuideState)>> =
            drafting.iter().map(|r| r.params.guide.as_deref().zip(r.guide_state)).collect();
        let on_device = self.draws_on_device && guides.iter().all(Option::is_none);
        if on_device && let Some(logits) = self.model.independent_slot_logits(&drafting_hidden)? {
            return self.choose_independent_slots(&logits, &drafting, k);
        }
        let anchors: Vec<u32> = drafting.iter().map(|r| r.tokens[r.tokens.len() - 1]).collect();
        let params: Vec<&SamplingParams> = drafting.iter().map(|r| r.params).collect();
        let seeds: Vec<u64> = drafting.iter().map(|r| r.seed).collect();
        let mut sampler = DraftSampler {
            proposal: self.proposal,
            vocab_size: self.vocab_size,
            params: &params,
            seeds: &seeds,
            probs: vec![None; n],
            confidence: self.confidence,
            chains: vec![1.0; n],
            cut_at: vec![None; n],
            guides,
            on_device,
            device_probs: vec![Vec::new(); n],
        };
        let drafts = self.model.head(&drafting_hidden, &anchors, &mut sampler)?;
        // The block is drafted whole; a row that asked for fewer, or whose drafts became
        // unlikely, keeps the first of them.
        let vocab = self.vocab_size;
        drafts
            .into_iter()
            .zip(sampler.probs.into_iter().zip(sampler.device_probs))
            .zip(drafting.iter().zip(sampler.cut_at))
            .map(|((mut drafts, (host, device)), (r, cut_at))| {
                drafts.truncate(r.num_drafts.min(cut_at.unwrap_or(usize::MAX)));
                let probs = match (host, device.is_empty()) {
                    (Some(mut q), _) => {
                        q.truncate(drafts.len() * vocab);
                        Some(DraftProbs::Host(q))
                    }
                    (None, false) if !drafts.is_empty() => {
                        Some(DraftProbs::Device(Tensor::cat(&device[..drafts.len()], 0)?))
                    }
                    (None, _) => None,
                };
                Ok(Proposal { drafts, probs })
            })
            .collect()
    }
}

impl BlockProposer {
    /// The drafts of `drafting` rows from their `k` slots' logits (`[n·k, Vd]`, rows in
    /// order), chosen where the logits live, as [`DraftSampler`] chooses on the host: argmax
    /// slots (cut where the running top-1 probability falls below the confidence threshold),
    /// sampled slots drawn from their processed distribution with the draft-stream uniform of
    /// their slot, the distributions kept on the device in target-id space.
    fn choose_independent_slots(
        &self,
        logits: &DraftLogits,
        drafting: &[&ProposeRow<'_>],
        k: usize,
    ) -> Result<Vec<Proposal>> {
        let sampled = |r: &ProposeRow<'_>| self.proposal == DraftProposal::Sampled && !r.params.is_greedy();
        // Sampled rows: every slot drawn on the device.
        let drawn: Vec<usize> = (0..drafting.len()).filter(|&i| sampled(drafting[i])).collect();
        let draws: Vec<DeviceDraw<'_>> = drawn
            .iter()
            .flat_map(|&i| {
                let r = drafting[i];
                (0..k).map(move |slot| DeviceDraw { row: i * k + slot, params: r.params, seed: r.seed, slot })
            })
            .collect();
        let with_tops = !self.confidence.is_off();
        let chosen =
            choose_on_device(&logits.logits, logits.draft_to_target.as_ref(), with_tops, &draws, self.vocab_size)?;
        (0..drafting.len())
            .map(|i| {
                let r = drafting[i];
                if let (Ok(j), Some(q)) = (drawn.binary_search(&i), &chosen.q) {
                    let n = r.num_drafts.min(k);
                    let drafts = chosen.samples[j * k..j * k + n].to_vec();
                    return Ok(Proposal { drafts, probs: Some(DraftProbs::Device(q.narrow(0, j * k, n)?)) });
                }
                let mut kept = r.num_drafts.min(k);
                if let Some(tops) = &chosen.tops {
                    let mut chain = 1.0;
                    if let Some(cut) = (0..k).find(|&s| !self.confidence.keeps_top(&mut chain, tops[i * k + s])) {
                        kept = kept.min(cut);
                    }
                }
                Ok(Proposal { drafts: chosen.argmax[i * k..i * k + kept].to_vec(), probs: None })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use specrs_core::width::VerifyWidthRange;

    #[test]
    fn width_is_trained_unless_set_and_never_below_one() {
        assert_eq!(resolve_block_width(None, 15, "DFlash"), Ok(15));
        assert_eq!(resolve_block_width(Some(3), 15, "DFlash"), Ok(3));
        assert_eq!(resolve_block_width(Some(20), 15, "DFlash"), Ok(20));
        let e = resolve_block_width(Some(0), 15, "DFlash").unwrap_err();
        assert_eq!(e.field.as_deref(), Some("num_speculative_tokens"));
    }

    #[test]
    fn drafts_are_skipped_only_where_the_schedule_verifies_nothing_and_mixed_steps_do_not() {
        let spec = |ranges: Vec<VerifyWidthRange>| SpeculativeConfig {
            speculative_method: Some(SpeculativeMethod::Dflash),
            num_speculative_tokens_per_batch_size: Some(ranges),
            ..Default::default()
        };
        let zero_at_4 = spec(vec![VerifyWidthRange::new(1, 3, 2), VerifyWidthRange::new(4, 8, 0)]);
        let s = draft_skip_schedule(&zero_at_4, 4, 8, false).unwrap().expect("a zero-width range");
        assert_eq!((s.width_for(2), s.width_for(5)), (2, 0));
        assert!(draft_skip_schedule(&zero_at_4, 4, 8, true).unwrap().is_none());
        assert!(draft_skip_schedule(&spec(vec![VerifyWidthRange::new(1, 8, 2)]), 4, 8, false).unwrap().is_none());
        assert!(draft_skip_schedule(&SpeculativeConfig::default(), 4, 8, false).unwrap().is_none());
    }

    /// Logits over 16 tokens putting probability ~`p` on token 3.
    fn logits_with_top(p: f32) -> Vec<f32> {
        let mut row = vec![0f32; 16];
        row[3] = (p * 15.0 / (1.0 - p)).ln();
        row
    }

    #[test]
    fn argmax_rows_are_cut_at_the_first_slot_below_the_threshold_and_sampled_rows_never() {
        let greedy = SamplingParams::greedy();
        let sampled = SamplingParams { temperature: 1.0, ..SamplingParams::default() };
        let params = [&greedy, &greedy, &sampled];
        let sampler = |on_device| DraftSampler {
            proposal: DraftProposal::Sampled,
            vocab_size: 16,
            params: &params,
            seeds: &[1, 2, 3],
            probs: vec![None; 3],
            confidence: DraftConfidence::new(0.5),
            chains: vec![1.0; 3],
            cut_at: vec![None; 3],
            guides: vec![None; 3],
            on_device,
            device_probs: vec![Vec::new(); 3],
        };
        let (mut host, mut device) = (sampler(false), sampler(true));
        // Row 0: 0.9, 0.9, 0.9 -> products 0.9, 0.81, 0.73: never cut. Row 1: 0.9, 0.5 ->
        // 0.45 < 0.5: cut at slot 1, though slot 2 (0.99) is sure again. Row 2 samples.
        for (slot, tops) in [[0.9, 0.9, 0.3], [0.9, 0.5, 0.3], [0.9, 0.99, 0.3]].into_iter().enumerate() {
            let rows: Vec<Vec<f32>> = tops.into_iter().map(logits_with_top).collect();
            let on_host: Vec<u32> = rows.iter().enumerate().map(|(row, x)| host.choose(row, slot, x, None)).collect();
            assert_eq!(&on_host[..2], &[3, 3], "argmax rows still draft every slot: later slots may depend on it");
            // The same slot chosen whole where the logits live.
            let logits = Tensor::from_vec(rows.concat(), (3, 16), &Device::Cpu).unwrap();
            assert_eq!(device.choose_slot(slot, &logits, None).unwrap(), on_host, "slot {slot}");
        }
        assert_eq!(host.cut_at, vec![None, Some(1), None]);
        assert_eq!(device.cut_at, host.cut_at);
        // The sampled row's distributions stay on the device, one row per slot.
        let kept = Tensor::cat(&device.device_probs[2], 0).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let expected = host.probs[2].as_ref().expect("the sampled row keeps its distributions");
        assert_eq!(kept.len(), expected.len());
        assert!(kept.iter().zip(expected).all(|(a, b)| (a - b).abs() < 1e-6), "{kept:?} vs {expected:?}");
        assert!(device.probs.iter().all(Option::is_none) && device.device_probs[..2].iter().all(Vec::is_empty));
    }
}
