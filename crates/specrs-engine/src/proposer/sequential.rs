//! The sequential driver for EAGLE-1, EAGLE-3 and MTP drafters.
//!
//! After each step, the drafter first catches up on every position the target committed:
//! position `p` pairs the target's hidden state at `p` with the committed token at `p + 1`,
//! writing the drafter's KV there (a prefill chunk, or the last fed token plus the accepted
//! drafts). The last of those pairs yields the first draft. Each further draft feeds the
//! drafter its own output and its previous draft one position on. Those chained positions
//! are speculative; the next step's committed pairs overwrite them.
//!
//! A row that does not draft this step (the adaptive controller planned a plain step, or the
//! row is mid-prefill) is not caught up: its drafter inputs are kept and fed, in one batch,
//! the next time it drafts. Under load, where plain steps win, the drafter then costs almost
//! nothing, and a row that finishes without drafting again is never caught up at all. Rows
//! prompt lookup drafted for (`catch_up_now`) are the exception when other rows draft: they
//! ride along in the step's forward, a few positions there costing less than a catch-up
//! forward of their own next step. A row
//! keeps at most `MAX_DEFERRED_POSITIONS`; past that it is fed at once, so no catch-up feeds
//! the drafter a query longer than a prefill chunk (attention off the CPU holds its scores).
//! With prefix caching, prompt chunks and finishing rows at most a step behind are fed at once
//! (`feed_now`): a block is cached only once the drafter's KV there is final, and shared
//! prompts and finished conversations are what later requests reuse.
//!
//! With `draft_confidence_threshold`, a row drafting the argmax leaves the chain at its first
//! draft whose running top-1 probability falls below the threshold ([`DraftConfidence`]), and
//! a row leaves it once it has the drafts it asked for: later chain forwards carry only the
//! rows still drafting.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use candle_core::{Device, Tensor};
use specrs_core::config::DraftProposal;
use specrs_core::kv_blocks::SeqId;
use specrs_core::sampling::{RngStream, SamplingParams, argmax, processed_probs, sample_inverse_cdf, uniform};
use specrs_core::scheduler::Scheduler;
use specrs_core::structured::GuideState;
use specrs_models::drafters::{DraftLogits, SequentialDraftModel};
use specrs_models::host::with_f32_slice;
use specrs_models::reductions;
use specrs_models::{BatchRow, ForwardBatch, PagedKvCache};

use super::confidence::{DraftConfidence, top_probabilities};
use super::{
    DraftProbs, Proposal, ProposeRow, Proposer, StepTaps, TapRequest, allowed_argmax, target_space_distributions,
};
use crate::error::{EngineError, Result};

pub struct SequentialProposer {
    model: Arc<dyn SequentialDraftModel>,
    kv: Option<PagedKvCache>,
    num_speculative_tokens: usize,
    proposal: DraftProposal,
    vocab_size: usize,
    device: Device,
    name: String,
    /// Committed positions of rows that have not drafted since, by sequence.
    deferred: HashMap<SeqId, Deferred>,
    /// Time spent feeding deferred positions since the last [`Proposer::take_catch_up_time`].
    catch_up_time: Duration,
    /// Where an argmax-drafting row's chain stops short (`draft_confidence_threshold`).
    confidence: DraftConfidence,
    /// Sampled drafts are drawn where the drafter's logits live and their distributions stay
    /// there ([`DraftProbs::Device`]); otherwise the logits come to the host.
    draws_on_device: bool,
}

/// Committed positions a row that does not draft may keep unfed.
const MAX_DEFERRED_POSITIONS: usize = 512;

/// Drafter inputs (`first_inputs` rows) of a row's committed positions `start..start + len`,
/// not yet fed to the drafter: one `[n, hidden]` piece per step, joined only when fed (joining
/// every step would copy everything kept so far, every step).
struct Deferred {
    start: usize,
    len: usize,
    pieces: Vec<Tensor>,
}

impl Deferred {
    fn end(&self) -> usize {
        self.start + self.len
    }
}

impl SequentialProposer {
    pub fn new(
        model: Arc<dyn SequentialDraftModel>,
        num_speculative_tokens: usize,
        proposal: DraftProposal,
        vocab_size: usize,
        device: Device,
    ) -> Self {
        let name = model.name().to_string();
        Self {
            model,
            kv: None,
            num_speculative_tokens,
            proposal,
            vocab_size,
            device,
            name,
            deferred: HashMap::new(),
            catch_up_time: Duration::ZERO,
            confidence: DraftConfidence::default(),
            draws_on_device: false,
        }
    }

    /// Draws sampled drafts on the drafter's device (`specrs_models::reductions`): only the
    /// draft ids cross to the host, and the distributions stay for verification there.
    pub fn with_draws_on_device(mut self, on_device: bool) -> Self {
        self.draws_on_device = on_device;
        self
    }

    /// Stops each argmax-drafting row's chain at its first draft whose running top-1 probability falls
    /// below the rule's threshold ([`DraftConfidence`]).
    pub fn with_confidence(mut self, confidence: DraftConfidence) -> Self {
        self.confidence = confidence;
        self
    }
}

/// A row that drafts this step, and where its last hidden state sits.
struct Drafting<'a> {
    index: usize,
    seq: SeqId,
    /// Position the next chained draft is fed at.
    position: usize,
    hidden_row: usize,
    /// Drafts the row asked for (the chain runs to the largest).
    wanted: usize,
    drafts: Vec<u32>,
    /// The sampled drafts' distributions: `[drafts · V]` drawn on the host, or `[1, V]` per
    /// draft drawn on the device.
    probs: Option<Vec<f32>>,
    device_probs: Vec<Tensor>,
    params: &'a SamplingParams,
    seed: u64,
    /// Product of the drafter's top-1 probabilities of the drafts so far (argmax-drafting rows).
    chain_probability: f32,
    /// The chain stopped early for this row: its next draft was too unlikely to be accepted,
    /// or its guide allows nothing the drafter can propose, or it drafted the end.
    stopped: bool,
    /// A guided row's place in its guide after its output and the drafts so far: its drafts
    /// are chosen among the tokens the guide allows there, as the target's will be.
    guide_state: Option<GuideState>,
}

impl Drafting<'_> {
    fn needs_more(&self) -> bool {
        !self.stopped && self.drafts.len() < self.wanted
    }

    /// Takes a draft, moving a guided row along its guide; a guided chain ends with the end
    /// of sequence (nothing follows it).
    fn push_draft(&mut self, token: u32) {
        self.drafts.push(token);
        if let (Some(guide), Some(state)) = (self.params.guide.as_ref(), self.guide_state) {
            let next = guide.advance(state, token);
            self.guide_state = Some(next);
            self.stopped |= next == GuideState::Dead || guide.is_end_of_sequence(token);
        }
    }

    fn into_proposal(self) -> Result<Proposal> {
        let probs = match (self.probs, self.device_probs.is_empty()) {
            (Some(q), _) => Some(DraftProbs::Host(q)),
            (None, false) => Some(DraftProbs::Device(Tensor::cat(&self.device_probs, 0)?)),
            (None, true) => None,
        };
        Ok(Proposal { drafts: self.drafts, probs })
    }
}

impl SequentialProposer {
    /// Turns draft logits (rows `[n, Vd]`, one per entry of `rows`) into one token per row,
    /// sampling when asked. An argmax-drafting row whose chain has become too unlikely stops instead.
    fn choose(&self, logits: &DraftLogits, rows: &mut [&mut Drafting<'_>], step: usize) -> Result<()> {
        let vd = logits.logits.dim(1)?;
        let v = self.vocab_size;
        let to_target = |idx: u32| logits.draft_to_target.as_ref().map_or(idx, |m| m[idx as usize]);
        let sampled = |d: &Drafting<'_>| self.proposal == DraftProposal::Sampled && !d.params.is_greedy();
        // Guided rows mask their logits on the host, by the tokens their guide allows.
        let guided = |d: &Drafting<'_>| d.guide_state.is_some();
        if self.draws_on_device && rows.iter().any(|d| sampled(d) && !guided(d)) {
            // Sampled rows are drawn where the logits live; the others go on as below.
            let drawn: Vec<usize> = (0..rows.len()).filter(|&i| sampled(rows[i]) && !guided(rows[i])).collect();
            self.draw_on_device(logits, rows, &drawn, step)?;
            let kept: Vec<u32> =
                (0..rows.len() as u32).filter(|i| drawn.binary_search(&(*i as usize)).is_err()).collect();
            if kept.is_empty() {
                return Ok(());
            }
            let index = Tensor::from_vec(kept.clone(), kept.len(), logits.logits.device())?;
            let rest = DraftLogits {
                logits: logits.logits.index_select(&index, 0)?,
                draft_to_target: logits.draft_to_target.clone(),
            };
            let mut rest_rows: Vec<&mut Drafting<'_>> = rows
                .iter_mut()
                .enumerate()
                .filter(|(i, _)| kept.binary_search(&(*i as u32)).is_ok())
                .map(|(_, d)| &mut **d)
                .collect();
            return self.choose(&rest, &mut rest_rows, step);
        }
        let any_sampled = rows.iter().any(|d| sampled(d));
        if !any_sampled && self.draws_on_device && !rows.iter().any(|d| guided(d)) {
            // Argmax drafts off the host: reduce where the logits live, copy back only the ids
            // (and, for the confidence cut, each row's top-1 probability).
            let ids = reductions::argmax_rows(&logits.logits)?.to_vec1::<u32>()?;
            let tops = match self.confidence.is_off() {
                true => vec![1.0; ids.len()],
                false => top_probabilities(&logits.logits)?.to_vec1::<f32>()?,
            };
            for ((d, idx), top) in rows.iter_mut().zip(ids).zip(tops) {
                if self.confidence.keeps_top(&mut d.chain_probability, top) {
                    d.drafts.push(to_target(idx));
                } else {
                    d.stopped = true;
                }
            }
            return Ok(());
        }
        // On the host: every row's logits come over whole (the confidence cut reads the
        // row; sampled drafts keep their distribution in `Proposal::probs`).
        with_f32_slice(&logits.logits, |all| {
            for (i, d) in rows.iter_mut().enumerate() {
                let row = &all[i * vd..(i + 1) * vd];
                let allowed = d.params.guide.as_ref().zip(d.guide_state).map(|(g, state)| g.allowed(state));
                if !sampled(d) {
                    let best = match &allowed {
                        Some(allowed) => allowed_argmax(row, allowed, &to_target),
                        None => Some(argmax(row)),
                    };
                    match best {
                        Some(best) if self.confidence.keeps(&mut d.chain_probability, row, best) => {
                            d.push_draft(to_target(best))
                        }
                        _ => d.stopped = true,
                    }
                    continue;
                }
                // The draft distribution lives in target-id space so rejection sampling can
                // compare it with the target's.
                let mut full = vec![f32::NEG_INFINITY; v];
                for (j, &x) in row.iter().enumerate() {
                    full[to_target(j as u32) as usize] = x;
                }
                if let Some(allowed) = &allowed {
                    allowed.mask_logits(&mut full);
                    if full.iter().all(|x| *x == f32::NEG_INFINITY) {
                        d.stopped = true;
                        continue;
                    }
                }
                let q = processed_probs(&full, d.params, None);
                let u = uniform(d.seed, RngStream::Draft, step as u64);
                d.push_draft(sample_inverse_cdf(&q, u));
                d.probs.get_or_insert_with(Vec::new).extend_from_slice(&q);
            }
        })?;
        Ok(())
    }

    /// Draws the sampled drafts of `rows[i]` for `i` in `drawn` from their processed draft
    /// distributions on the logits' device (`specrs_models::reductions`, the same numbers as
    /// the host path in f32), keeping each distribution there in target-id space.
    fn draw_on_device(
        &self,
        logits: &DraftLogits,
        rows: &mut [&mut Drafting<'_>],
        drawn: &[usize],
        step: usize,
    ) -> Result<()> {
        let device = logits.logits.device();
        let n = drawn.len();
        let index = Tensor::from_vec(drawn.iter().map(|&i| i as u32).collect::<Vec<_>>(), n, device)?;
        let params: Vec<&SamplingParams> = drawn.iter().map(|&i| rows[i].params).collect();
        let x = logits.logits.index_select(&index, 0)?;
        let q = target_space_distributions(&x, &params, logits.draft_to_target.as_ref(), self.vocab_size)?;
        let uniforms: Vec<f64> = drawn.iter().map(|&i| uniform(rows[i].seed, RngStream::Draft, step as u64)).collect();
        let tokens = reductions::sample_rows(&q, &uniforms)?;
        for (k, (&i, token)) in drawn.iter().zip(tokens).enumerate() {
            rows[i].drafts.push(token);
            rows[i].device_probs.push(q.narrow(0, k, 1)?);
        }
        Ok(())
    }
}

/// Appends a row's committed positions `start..end` to a drafter batch: position `p` pairs
/// the target's hidden state at `p` with the committed token at `p + 1`.
fn push_positions(
    batch: &mut ForwardBatch,
    r: &ProposeRow<'_>,
    blocks: &specrs_core::kv_blocks::KvBlockManager,
    start: usize,
    end: usize,
) -> Result<()> {
    let query_start = batch.input_ids.len();
    batch.input_ids.extend(r.tokens[start + 1..end + 1].iter().copied());
    batch.positions.extend((start..end).map(|p| p as u32));
    batch.slot_mapping.extend(blocks.slots(r.seq, start..end)?);
    let table = blocks.block_table(r.seq);
    batch.rows.push(BatchRow {
        query_start,
        query_len: end - start,
        context_len: end,
        block_table_start: batch.block_tables.len(),
        block_table_len: table.len(),
    });
    batch.block_tables.extend_from_slice(table);
    Ok(())
}

impl Proposer for SequentialProposer {
    fn name(&self) -> &str {
        &self.name
    }

    fn num_speculative_tokens(&self) -> usize {
        self.num_speculative_tokens
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

    fn release(&mut self, seq: SeqId) {
        self.deferred.remove(&seq);
    }

    /// Positions a row keeps unfed (it has not drafted since) have no drafter KV yet.
    fn kv_final_len(&self, seq: SeqId, computed: usize) -> usize {
        self.deferred.get(&seq).map_or(computed, |d| d.start.min(computed))
    }

    fn take_catch_up_time(&mut self) -> Duration {
        std::mem::take(&mut self.catch_up_time)
    }

    fn propose(
        &mut self,
        rows: &[ProposeRow<'_>],
        taps: &StepTaps<'_>,
        scheduler: &Scheduler,
    ) -> Result<Vec<Proposal>> {
        let kv_cache = self.kv.as_ref().ok_or_else(|| EngineError::Internal("drafter KV not allocated".into()))?;
        let blocks = scheduler.kv();
        // 1. Drafter inputs of every position committed this step, rows in order.
        let flat_index: Vec<u32> =
            rows.iter().flat_map(|r| (r.flat_start..r.flat_start + r.num_valid).map(|i| i as u32)).collect();
        let flat_len = flat_index.len();
        if flat_len == 0 {
            return Ok(rows.iter().filter(|r| r.wants_drafts()).map(|_| Proposal::default()).collect());
        }
        let flat = Tensor::from_vec(flat_index, flat_len, &self.device)?;
        let step_inputs = self.model.first_inputs(taps.taps, taps.final_hidden, &flat)?;
        // 2. Rows that do not draft keep theirs (unless they ride along, see the module doc);
        //    the others first catch up on what they kept (one forward of its own, timed apart),
        //    then feed this step's positions, where the last pair of a drafting row gives
        //    draft 1.
        let drafter_runs = rows.iter().any(|r| r.wants_drafts() && r.num_valid > 0);
        let block_size = blocks.block_size();
        let mut catch_up = ForwardBatch { block_size, ..Default::default() };
        let mut catch_up_inputs: Vec<Tensor> = Vec::new();
        let mut batch = ForwardBatch { block_size, ..Default::default() };
        let mut inputs: Vec<Tensor> = Vec::new();
        let mut drafting: Vec<Drafting<'_>> = Vec::new();
        let mut offset = 0;
        for (index, r) in rows.iter().enumerate() {
            if r.num_valid == 0 {
                continue;
            }
            let own = step_inputs.narrow(0, offset, r.num_valid)?;
            offset += r.num_valid;
            // Kept positions join only if they end where this step's begin; anything else
            // (a preempted and recomputed row) starts afresh.
            let kept = self.deferred.remove(&r.seq).filter(|d| d.end() == r.fed_start);
            let kept_len = kept.as_ref().map_or(0, |d| d.len);
            let rides_along = (r.catch_up_now && drafter_runs) || r.feed_now;
            if !r.wants_drafts() && !rides_along && kept_len + r.num_valid <= MAX_DEFERRED_POSITIONS {
                let mut deferred = kept.unwrap_or(Deferred { start: r.fed_start, len: 0, pieces: Vec::new() });
                deferred.len += r.num_valid;
                deferred.pieces.push(own);
                self.deferred.insert(r.seq, deferred);
                continue;
            }
            if let Some(d) = kept {
                push_positions(&mut catch_up, r, blocks, d.start, r.fed_start)?;
                catch_up_inputs.extend(d.pieces);
            }
            let end = r.fed_start + r.num_valid;
            push_positions(&mut batch, r, blocks, r.fed_start, end)?;
            inputs.push(own);
            if !r.wants_drafts() {
                continue;
            }
            let last = batch.input_ids.len() - 1;
            batch.logits_indices.push(last as u32);
            drafting.push(Drafting {
                index,
                seq: r.seq,
                position: end,
                hidden_row: last,
                wanted: r.num_drafts.min(self.num_speculative_tokens),
                drafts: Vec::with_capacity(r.num_drafts),
                probs: None,
                device_probs: Vec::new(),
                params: r.params,
                seed: r.seed,
                chain_probability: 1.0,
                stopped: false,
                guide_state: r.guide_state,
            });
        }
        if !catch_up.input_ids.is_empty() {
            let started = Instant::now();
            let hidden = self.model.first_hidden(&Tensor::cat(&catch_up_inputs, 0)?)?;
            self.model.forward(&hidden, &catch_up, kv_cache)?;
            self.catch_up_time += started.elapsed();
        }
        if batch.input_ids.is_empty() {
            return Ok(rows.iter().filter(|r| r.wants_drafts()).map(|_| Proposal::default()).collect());
        }
        let hidden = self.model.first_hidden(&Tensor::cat(&inputs, 0)?)?;
        let (out, logits) = self.model.forward(&hidden, &batch, kv_cache)?;
        if drafting.is_empty() {
            return Ok(Vec::new());
        }
        self.choose(&logits, &mut drafting.iter_mut().collect::<Vec<_>>(), 0)?;
        // 3. Chain: each further draft from the drafter's own output, one position on, for the
        //    rows that still want one. `chained[i]` is the drafting row behind hidden row `i`.
        let mut chained: Vec<usize> = (0..drafting.len()).collect();
        let mut last_hidden = {
            let idx: Vec<u32> = drafting.iter().map(|d| d.hidden_row as u32).collect();
            out.index_select(&Tensor::from_vec(idx, drafting.len(), &self.device)?, 0)?
        };
        for step in 1.. {
            let next: Vec<usize> = (0..chained.len()).filter(|&i| drafting[chained[i]].needs_more()).collect();
            if next.is_empty() {
                break;
            }
            let hidden = if next.len() == chained.len() {
                last_hidden
            } else {
                let idx: Vec<u32> = next.iter().map(|&i| i as u32).collect();
                last_hidden.index_select(&Tensor::from_vec(idx, next.len(), &self.device)?, 0)?
            };
            chained = next.into_iter().map(|i| chained[i]).collect();
            let mut chain = ForwardBatch { block_size, ..Default::default() };
            for (i, &j) in chained.iter().enumerate() {
                let d = &drafting[j];
                let table = blocks.block_table(d.seq);
                chain.input_ids.push(*d.drafts.last().expect("one draft per row so far"));
                chain.positions.push(d.position as u32);
                chain.slot_mapping.push(blocks.slot(d.seq, d.position)?);
                chain.rows.push(BatchRow {
                    query_start: i,
                    query_len: 1,
                    context_len: d.position + 1,
                    block_table_start: chain.block_tables.len(),
                    block_table_len: table.len(),
                });
                chain.block_tables.extend_from_slice(table);
                chain.logits_indices.push(i as u32);
            }
            let (out, logits) = self.model.forward(&hidden, &chain, kv_cache)?;
            let mut rows: Vec<&mut Drafting<'_>> = Vec::with_capacity(chained.len());
            let mut in_chain = chained.iter().peekable();
            for (j, d) in drafting.iter_mut().enumerate() {
                if in_chain.next_if(|&&k| k == j).is_some() {
                    rows.push(d);
                }
            }
            self.choose(&logits, &mut rows, step)?;
            for &j in &chained {
                drafting[j].position += 1;
            }
            last_hidden = out;
        }
        // The chain fed each row only while it wanted more: no row holds more than it asked for.
        let mut by_row: Vec<Option<Proposal>> = vec![None; rows.len()];
        for d in drafting {
            let index = d.index;
            by_row[index] = Some(d.into_proposal()?);
        }
        Ok(rows.iter().zip(by_row).filter(|(r, _)| r.wants_drafts()).map(|(_, p)| p.unwrap_or_default()).collect())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use candle_core::DType;
    use specrs_core::kv_blocks::KvBlockManager;
    use specrs_core::scheduler::SchedulerConfig;
    use specrs_models::drafters::{DraftInputs, DraftLogits};

    use super::*;

    const HIDDEN: usize = 4;
    const VOCAB: usize = 16;

    /// What one drafter forward was fed.
    #[derive(Debug, Clone, PartialEq)]
    struct Fed {
        positions: Vec<u32>,
        input_ids: Vec<u32>,
        /// Column 0 of each input hidden row: the flat index it was taken from, plus 1000 × step.
        hidden: Vec<f32>,
    }

    /// A drafter that records its inputs and always drafts token 7: with probability ~1 after
    /// an input token below `sure_below`, and 0.15 (logit 1 against 15 zeros) otherwise.
    #[derive(Default)]
    struct Recorder {
        fed: Mutex<Vec<Fed>>,
        sure_below: u32,
    }

    impl SequentialDraftModel for Recorder {
        fn name(&self) -> &str {
            "recorder"
        }

        fn inputs(&self) -> DraftInputs {
            DraftInputs { taps: Vec::new(), final_hidden: true }
        }

        fn first_inputs(
            &self,
            _: &[Tensor],
            final_hidden: Option<&Tensor>,
            flat: &Tensor,
        ) -> candle_core::Result<Tensor> {
            final_hidden.expect("requested").index_select(flat, 0)
        }

        fn forward(
            &self,
            hidden: &Tensor,
            batch: &ForwardBatch,
            _: &PagedKvCache,
        ) -> candle_core::Result<(Tensor, DraftLogits)> {
            let column: Vec<f32> = hidden.narrow(1, 0, 1)?.flatten_all()?.to_vec1()?;
            self.fed.lock().unwrap().push(Fed {
                positions: batch.positions.clone(),
                input_ids: batch.input_ids.clone(),
                hidden: column,
            });
            let mut logits = vec![0f32; batch.logits_indices.len() * VOCAB];
            for (row, &i) in logits.chunks_mut(VOCAB).zip(&batch.logits_indices) {
                row[7] = if batch.input_ids[i as usize] < self.sure_below { 30.0 } else { 1.0 };
            }
            let logits = Tensor::from_vec(logits, (batch.logits_indices.len(), VOCAB), &Device::Cpu)?;
            Ok((hidden.clone(), DraftLogits { logits, draft_to_target: None }))
        }

        fn new_kv_cache(&self, num_blocks: usize, block_size: usize) -> candle_core::Result<PagedKvCache> {
            PagedKvCache::new(1, num_blocks, block_size, 1, HIDDEN, DType::F32, &Device::Cpu)
        }

        fn kv_bytes_per_token(&self) -> u64 {
            0
        }
    }

    /// The target's final hidden states of a step of `t` flat tokens: row `i` is
    /// `[i + 1000 · step, ...]`.
    fn step_hidden(t: usize, step: usize) -> Tensor {
        let v: Vec<f32> = (0..t * HIDDEN).map(|x| (x / HIDDEN + 1000 * step) as f32).collect();
        Tensor::from_vec(v, (t, HIDDEN), &Device::Cpu).unwrap()
    }

    /// A proposer over the recording drafter, one running sequence with `tokens` committed and
    /// KV reserved for all of them.
    struct Harness {
        recorder: Arc<Recorder>,
        proposer: SequentialProposer,
        scheduler: Scheduler,
        seq: SeqId,
        tokens: Vec<u32>,
        params: SamplingParams,
        /// Rows are marked [`ProposeRow::feed_now`].
        feed_now: bool,
    }

    impl Harness {
        fn new(num_blocks: usize, prompt_len: usize, tokens: Vec<u32>) -> Self {
            let recorder = Arc::new(Recorder::default());
            let mut proposer = SequentialProposer::new(recorder.clone(), 2, DraftProposal::Argmax, VOCAB, Device::Cpu);
            proposer.allocate(num_blocks, 4).unwrap();
            let mut scheduler = Scheduler::new(SchedulerConfig::default(), KvBlockManager::new(num_blocks, 4).unwrap());
            let seq: SeqId = 1;
            scheduler.add(seq, prompt_len);
            scheduler.schedule(&mut 0usize);
            assert!(scheduler.reserve(seq, tokens.len()));
            Self { recorder, proposer, scheduler, seq, tokens, params: SamplingParams::greedy(), feed_now: false }
        }

        /// One step of `t` flat tokens (see `step_hidden`) in which the sequence committed
        /// `num_valid` positions from `fed_start`, its first at flat row `flat_start`.
        fn propose(
            &mut self,
            (fed_start, num_valid, flat_start, num_drafts): (usize, usize, usize, usize),
            t: usize,
            step: usize,
        ) -> Vec<Proposal> {
            let row = ProposeRow {
                seq: self.seq,
                tokens: &self.tokens,
                prompt_len: 0,
                fed_start,
                num_valid,
                flat_start,
                num_drafts,
                num_copies: 0,
                catch_up_now: false,
                feed_now: self.feed_now,
                params: &self.params,
                seed: 0,
                guide_state: crate::proposer::guide_state_after(&self.tokens, 0, &self.params),
            };
            let hidden = step_hidden(t, step);
            let taps = StepTaps { taps: &[], final_hidden: Some(&hidden) };
            self.proposer.propose(&[row], &taps, &self.scheduler).unwrap()
        }

        fn fed(&self) -> Vec<Fed> {
            self.recorder.fed.lock().unwrap().clone()
        }
    }

    #[test]
    fn a_guided_row_drafts_only_what_its_grammar_allows_and_stops_at_the_end() {
        use specrs_core::structured::{StructuredOutputs, TokenVocabulary};
        // Token i spells the letter 'a' + i (3 is "d", 7 is "h"); 15 ends the sequence.
        let bytes = (0..VOCAB as u8).map(|i| (i < 15).then(|| vec![b'a' + i])).collect();
        let vocabulary = Arc::new(TokenVocabulary::new(bytes, vec![15]));
        let guide = |regex: &str| {
            let constraint = StructuredOutputs { regex: Some(regex.into()), ..Default::default() };
            Some(constraint.compile(&vocabulary).unwrap())
        };
        // The drafter's favourite is always 7 ("h"). After "dddd", "d+h?" allows "d", "h" or
        // the end: 7, and then only the end, after which the chain stops.
        let mut h = Harness::new(16, 3, vec![3, 3, 3, 3]);
        h.params.guide = guide("d+h?");
        assert_eq!(h.propose((0, 3, 0, 2), 3, 0)[0].drafts, vec![7, 15]);
        // "d+" refuses "h": the best allowed draft is taken instead (all else ties at 0, so the
        // first allowed, "d").
        let mut h = Harness::new(16, 3, vec![3, 3, 3, 3]);
        h.params.guide = guide("d+");
        assert_eq!(h.propose((0, 3, 0, 2), 3, 0)[0].drafts, vec![3, 3]);
        // Unguided, the same drafter drafts its favourite.
        let mut h = Harness::new(16, 3, vec![3, 3, 3, 3]);
        assert_eq!(h.propose((0, 3, 0, 2), 3, 0)[0].drafts, vec![7, 7]);
    }

    #[test]
    fn rows_that_do_not_draft_are_caught_up_in_order_when_they_draft_again() {
        let mut h = Harness::new(16, 5, (100..112).collect());

        // Step 0: the 5-token prompt (flat rows 1..6 of the step, behind another row's token),
        // step 1: one decode token; neither drafts, so the drafter runs nothing.
        assert!(h.propose((0, 5, 1, 0), 6, 0).is_empty());
        assert!(h.propose((5, 1, 0, 0), 1, 1).is_empty());
        assert!(h.fed().is_empty(), "a row that does not draft is fed nothing");
        assert_eq!(h.proposer.take_catch_up_time(), Duration::ZERO);

        // Step 2: two committed positions (a token and an accepted draft), and the row drafts:
        // a catch-up forward feeds the 6 kept positions in order, the step's forward its own 2,
        // then one chained draft.
        let proposals = h.propose((6, 2, 0, 2), 3, 2);
        assert_eq!(proposals, vec![Proposal { drafts: vec![7, 7], probs: None }]);
        let fed = h.fed();
        assert_eq!(fed.len(), 3, "catch-up forward, step forward, one chained draft");
        assert_eq!(fed[0].positions, (0..6).collect::<Vec<u32>>());
        assert_eq!(fed[0].input_ids, (101..107).collect::<Vec<u32>>(), "position p pairs with token p + 1");
        assert_eq!(fed[0].hidden, vec![1.0, 2.0, 3.0, 4.0, 5.0, 1000.0]);
        assert_eq!((fed[1].positions.clone(), fed[1].hidden.clone()), (vec![6, 7], vec![2000.0, 2001.0]));
        assert_eq!(fed[2].positions, vec![8]);
        assert!(h.proposer.take_catch_up_time() > Duration::ZERO, "the catch-up forward is timed");
        assert_eq!(h.proposer.take_catch_up_time(), Duration::ZERO, "and taken once");

        // Step 3: only the new position is fed; nothing is fed twice, nothing is caught up.
        h.propose((8, 1, 0, 2), 1, 3);
        let fed = h.fed();
        assert_eq!(fed[3].positions, vec![8]);
        assert_eq!(fed[3].hidden, vec![3000.0]);
        assert_eq!(h.proposer.take_catch_up_time(), Duration::ZERO);

        // A released row forgets what it kept: positions that do not continue it are fed alone.
        h.propose((9, 1, 0, 0), 1, 4);
        h.proposer.release(h.seq);
        h.propose((10, 1, 0, 2), 1, 5);
        let fed = h.fed();
        assert_eq!(fed[5].positions, vec![10]);
        assert_eq!(fed[5].hidden, vec![5000.0]);
    }

    #[test]
    fn rows_fed_now_are_never_kept_so_their_drafter_kv_is_final() {
        let mut h = Harness::new(16, 9, (100..112).collect());
        // Kept positions are not final: the prefix cache must not share their blocks yet.
        assert!(h.propose((0, 4, 0, 0), 4, 0).is_empty());
        assert_eq!(h.proposer.kv_final_len(h.seq, 4), 0);
        // A prompt chunk fed now feeds what was kept and itself, and drafts nothing.
        h.feed_now = true;
        assert!(h.propose((4, 4, 0, 0), 4, 1).is_empty());
        let fed = h.fed();
        assert_eq!(fed.iter().map(|f| f.positions.clone()).collect::<Vec<_>>(), [vec![0, 1, 2, 3], vec![4, 5, 6, 7]]);
        assert_eq!(h.proposer.kv_final_len(h.seq, 8), 8);
    }

    #[test]
    fn rows_prompt_lookup_served_ride_along_only_when_other_rows_draft() {
        let recorder = Arc::new(Recorder::default());
        let mut proposer = SequentialProposer::new(recorder.clone(), 2, DraftProposal::Argmax, VOCAB, Device::Cpu);
        proposer.allocate(16, 4).unwrap();
        let mut scheduler = Scheduler::new(SchedulerConfig::default(), KvBlockManager::new(16, 4).unwrap());
        let tokens: Vec<u32> = (100..112).collect();
        for seq in [1, 2] {
            scheduler.add(seq, 5);
        }
        scheduler.schedule(&mut 0usize);
        for seq in [1, 2] {
            assert!(scheduler.reserve(seq, tokens.len()));
        }
        let params = SamplingParams::greedy();
        // (seq, fed_start, num_valid, flat_start, num_drafts, catch_up_now)
        let mut step = |step: usize, flat_len: usize, rows: &[(SeqId, usize, usize, usize, usize, bool)]| {
            let rows: Vec<ProposeRow<'_>> = rows
                .iter()
                .map(|&(seq, fed_start, num_valid, flat_start, num_drafts, catch_up_now)| ProposeRow {
                    seq,
                    tokens: &tokens,
                    prompt_len: 0,
                    fed_start,
                    num_valid,
                    flat_start,
                    num_drafts,
                    num_copies: 0,
                    catch_up_now,
                    feed_now: false,
                    params: &params,
                    seed: 0,
                    guide_state: None,
                })
                .collect();
            let hidden = step_hidden(flat_len, step);
            let taps = StepTaps { taps: &[], final_hidden: Some(&hidden) };
            proposer.propose(&rows, &taps, &scheduler).unwrap().len()
        };
        let fed = || recorder.fed.lock().unwrap().clone();

        // Step 0: both prompts; row 1 drafts, prompt lookup served row 2: one forward feeds both.
        assert_eq!(step(0, 10, &[(1, 0, 5, 0, 2, false), (2, 0, 5, 5, 0, true)]), 1);
        assert_eq!(fed().len(), 2, "the step's forward and one chained draft, no catch-up");
        assert_eq!(fed()[0].positions, [0, 1, 2, 3, 4, 0, 1, 2, 3, 4]);
        assert_eq!(fed()[0].hidden[5..], [5.0, 6.0, 7.0, 8.0, 9.0]);

        // Step 1: row 2 served alone (nothing else drafts): nothing runs, its position is kept.
        assert_eq!(step(1, 1, &[(2, 5, 1, 0, 0, true)]), 0);
        assert_eq!(fed().len(), 2);

        // Step 2: row 1 drafts and row 2 does not draft on its own account (catch_up_now unset):
        // row 2 keeps both positions, row 1 feeds only its own.
        assert_eq!(step(2, 2, &[(1, 5, 1, 0, 2, false), (2, 6, 1, 1, 0, false)]), 1);
        assert_eq!(fed()[2].positions, [5]);

        // Step 3: row 2 drafts: its two kept positions are caught up, then its new one is fed.
        assert_eq!(step(3, 1, &[(2, 7, 1, 0, 1, false)]), 1);
        assert_eq!(fed()[4].positions, [5, 6]);
        assert_eq!(fed()[4].hidden, [1000.0, 2001.0]);
        assert_eq!(fed()[5].positions, [7]);
    }

    #[test]
    fn the_chain_stops_at_the_drafts_a_row_asked_for() {
        let mut h = Harness::new(16, 5, (100..112).collect());
        let proposals = h.propose((0, 5, 0, 1), 5, 0);
        assert_eq!(proposals, vec![Proposal { drafts: vec![7], probs: None }]);
        assert_eq!(h.fed().len(), 1, "one draft needs no chained forward");
        let proposals = h.propose((5, 1, 0, 2), 1, 1);
        assert_eq!(proposals[0].drafts, vec![7, 7]);
        assert_eq!(h.fed().len(), 3);
    }

    #[test]
    fn a_row_that_does_not_draft_is_fed_once_it_would_keep_too_many_positions() {
        let mut h = Harness::new(256, 600, (0..700).map(|t| t % VOCAB as u32).collect());
        // A 400-position prefill chunk is kept; the next 200 would make 600 > 512, so all 600
        // are fed now, with no drafts asked for.
        assert!(h.propose((0, 400, 0, 0), 400, 0).is_empty());
        assert!(h.fed().is_empty());
        assert!(h.propose((400, 200, 0, 0), 200, 1).is_empty());
        let fed = h.fed();
        assert_eq!(fed.len(), 2, "the kept positions, then the step's");
        assert_eq!(fed[0].positions, (0..400).collect::<Vec<u32>>());
        assert_eq!(fed[1].positions, (400..600).collect::<Vec<u32>>());
        assert_eq!((fed[0].hidden[399], fed[1].hidden[0]), (399.0, 1000.0));
        // Drafting next feeds only the new position: nothing was left behind.
        let proposals = h.propose((600, 1, 0, 2), 1, 2);
        assert_eq!(proposals.len(), 1);
        assert_eq!(h.fed()[2].positions, vec![600]);
    }

    /// One step of two 5-token rows ending in tokens 105 (row 1) and 50 (row 2), wanting
    /// `num_drafts` each from a K = 3 proposer cutting at `threshold`, over a drafter sure
    /// after tokens below 100 (its own drafts, 7, included) and 15% sure otherwise. Returns
    /// the proposals and what each drafter forward was fed.
    fn two_row_step(threshold: f64, num_drafts: [usize; 2]) -> (Vec<Proposal>, Vec<Fed>) {
        let recorder = Arc::new(Recorder { sure_below: 100, ..Default::default() });
        let mut proposer = SequentialProposer::new(recorder.clone(), 3, DraftProposal::Argmax, VOCAB, Device::Cpu)
            .with_confidence(DraftConfidence::new(threshold));
        proposer.allocate(16, 4).unwrap();
        let mut scheduler = Scheduler::new(SchedulerConfig::default(), KvBlockManager::new(16, 4).unwrap());
        for seq in [1, 2] {
            scheduler.add(seq, 4);
        }
        scheduler.schedule(&mut 0usize);
        for seq in [1, 2] {
            assert!(scheduler.reserve(seq, 5 + 4));
        }
        let params = SamplingParams::greedy();
        let tokens: [&[u32]; 2] = [&[1, 2, 3, 4, 105], &[1, 2, 3, 4, 50]];
        let rows: Vec<ProposeRow<'_>> = (0..2)
            .map(|i| ProposeRow {
                seq: i as SeqId + 1,
                tokens: tokens[i],
                prompt_len: 0,
                fed_start: 0,
                num_valid: 4,
                flat_start: 4 * i,
                num_drafts: num_drafts[i],
                num_copies: 0,
                catch_up_now: false,
                feed_now: false,
                params: &params,
                seed: 0,
                guide_state: None,
            })
            .collect();
        let hidden = step_hidden(8, 0);
        let taps = StepTaps { taps: &[], final_hidden: Some(&hidden) };
        let proposals = proposer.propose(&rows, &taps, &scheduler).unwrap();
        let fed = recorder.fed.lock().unwrap().clone();
        (proposals, fed)
    }

    #[test]
    fn a_greedy_chain_stops_where_its_running_draft_probability_falls_below_the_threshold() {
        let (proposals, fed) = two_row_step(0.2, [3, 3]);
        assert_eq!(proposals[0].drafts, Vec::<u32>::new(), "a first draft at 15% < 20% is cut: a plain row");
        assert_eq!(proposals[1].drafts, vec![7, 7, 7], "a sure chain drafts all K");
        assert_eq!(fed.len(), 3, "the step's forward and two chained drafts");
        assert_eq!((fed[1].positions.clone(), fed[2].positions.clone()), (vec![4], vec![5]), "row 1 is not chained");

        // Without a threshold the unsure row drafts all three, chained beside row 2.
        let (proposals, fed) = two_row_step(0.0, [3, 3]);
        assert_eq!(proposals[0].drafts, vec![7, 7, 7]);
        assert_eq!(fed[1].positions, vec![4, 4]);

        // At 10% the unsure row keeps its first draft (15%), and its later drafts, made after
        // token 7 with probability ~1, keep the product at 15%: both rows draft all three.
        let (proposals, _) = two_row_step(0.1, [3, 3]);
        assert_eq!((proposals[0].drafts.len(), proposals[1].drafts.len()), (3, 3));
    }

    #[test]
    fn rows_that_asked_for_fewer_drafts_leave_the_chain_early() {
        let (proposals, fed) = two_row_step(0.0, [1, 3]);
        assert_eq!((proposals[0].drafts.len(), proposals[1].drafts.len()), (1, 3));
        assert_eq!(fed.len(), 3);
        assert_eq!(fed[1].positions, vec![4], "only the row wanting more is chained");
    }
}
