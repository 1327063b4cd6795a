//! The sequential driver for EAGLE-1, EAGLE-3 and MTP drafters.
//!
//! After each step, the drafter first catches up on every position the target committed:
//! position `p` pairs the target's hidden state at `p` with the committed token at `p + 1`,
//! writing the drafter's KV there (a prefill chunk, or the last fed token plus the accepted
//! drafts). The last of those pairs yields the first draft. Each further draft feeds the
//! drafter its own output and its previous draft one position on. Those chained positions
//! are speculative; the next step's committed pairs overwrite them.

use std::sync::Arc;

use candle_core::{Device, Tensor};
use specrs_core::config::DraftProposal;
use specrs_core::kv_blocks::SeqId;
use specrs_core::sampling::{RngStream, SamplingParams, argmax, processed_probs, sample_inverse_cdf, uniform};
use specrs_core::scheduler::Scheduler;
use specrs_models::drafters::{DraftLogits, SequentialDraftModel};
use specrs_models::host::with_f32_slice;
use specrs_models::reductions;
use specrs_models::{BatchRow, ForwardBatch, PagedKvCache};

use super::{Proposal, ProposeRow, Proposer, StepTaps, TapRequest};
use crate::error::{EngineError, Result};

pub struct SequentialProposer {
    model: Arc<dyn SequentialDraftModel>,
    kv: Option<PagedKvCache>,
    num_speculative_tokens: usize,
    proposal: DraftProposal,
    vocab_size: usize,
    device: Device,
    name: String,
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
        Self { model, kv: None, num_speculative_tokens, proposal, vocab_size, device, name }
    }
}

/// A row that drafts this step, and where its last hidden state sits.
struct Drafting {
    index: usize,
    seq: SeqId,
    /// Position the next chained draft is fed at.
    position: usize,
    hidden_row: usize,
    drafts: Vec<u32>,
    probs: Option<Vec<f32>>,
}

impl SequentialProposer {
    /// Turns draft logits (rows `[n, Vd]`) into one token per row, sampling when asked.
    fn choose(
        &self,
        logits: &DraftLogits,
        rows: &mut [Drafting],
        params: &[&SamplingParams],
        seeds: &[u64],
        step: usize,
    ) -> Result<()> {
        let vd = logits.logits.dim(1)?;
        let v = self.vocab_size;
        let to_target = |idx: u32| logits.draft_to_target.as_ref().map_or(idx, |m| m[idx as usize]);
        let any_sampled = self.proposal == DraftProposal::Sampled && params.iter().any(|p| !p.is_greedy());
        if !any_sampled && !logits.logits.device().is_cpu() {
            // Argmax drafts off the host: reduce where the logits live, copy back only the ids.
            let ids = reductions::argmax_rows(&logits.logits)?.to_vec1::<u32>()?;
            for (d, idx) in rows.iter_mut().zip(ids) {
                d.drafts.push(to_target(idx));
            }
            return Ok(());
        }
        // Sampled drafts keep their distribution on the host (`Proposal::probs`), so their
        // logits come over whole.
        with_f32_slice(&logits.logits, |all| {
            for (i, d) in rows.iter_mut().enumerate() {
                let row = &all[i * vd..(i + 1) * vd];
                let sample = self.proposal == DraftProposal::Sampled && !params[i].is_greedy();
                if !sample {
                    d.drafts.push(to_target(argmax(row)));
                    continue;
                }
                // The draft distribution lives in target-id space so rejection sampling can
                // compare it with the target's.
                let mut full = vec![f32::NEG_INFINITY; v];
                for (j, &x) in row.iter().enumerate() {
                    full[to_target(j as u32) as usize] = x;
                }
                let q = processed_probs(&full, params[i], None);
                let u = uniform(seeds[i], RngStream::Draft, step as u64);
                d.drafts.push(sample_inverse_cdf(&q, u));
                d.probs.get_or_insert_with(Vec::new).extend_from_slice(&q);
            }
        })?;
        Ok(())
    }
}

impl Proposer for SequentialProposer {
    fn name(&self) -> &str {
        &self.name
    }

    fn num_speculative_tokens(&self) -> usize {
        self.num_speculative_tokens
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
        let kv_cache = self.kv.as_ref().ok_or_else(|| EngineError::Internal("drafter KV not allocated".into()))?;
        let blocks = scheduler.kv();
        // 1. Catch up on every committed position; the last pair of a drafting row gives draft 1.
        let mut batch = ForwardBatch { block_size: blocks.block_size(), ..Default::default() };
        let mut flat_index: Vec<u32> = Vec::new();
        let mut drafting: Vec<Drafting> = Vec::new();
        let mut params: Vec<&SamplingParams> = Vec::new();
        let mut seeds: Vec<u64> = Vec::new();
        for (index, r) in rows.iter().enumerate() {
            if r.num_valid == 0 {
                continue;
            }
            let start = r.fed_start;
            let end = start + r.num_valid;
            let query_start = batch.input_ids.len();
            batch.input_ids.extend(r.tokens[start + 1..end + 1].iter().copied());
            batch.positions.extend((start..end).map(|p| p as u32));
            batch.slot_mapping.extend(blocks.slots(r.seq, start..end)?);
            let table = blocks.block_table(r.seq);
            batch.rows.push(BatchRow {
                query_start,
                query_len: r.num_valid,
                context_len: end,
                block_table_start: batch.block_tables.len(),
                block_table_len: table.len(),
            });
            batch.block_tables.extend_from_slice(table);
            flat_index.extend((r.flat_start..r.flat_start + r.num_valid).map(|i| i as u32));
            if r.wants_drafts {
                let last = query_start + r.num_valid - 1;
                batch.logits_indices.push(last as u32);
                drafting.push(Drafting {
                    index,
                    seq: r.seq,
                    position: end,
                    hidden_row: last,
                    drafts: Vec::with_capacity(self.num_speculative_tokens),
                    probs: None,
                });
                params.push(r.params);
                seeds.push(r.seed);
            }
        }
        if batch.input_ids.is_empty() {
            return Ok(rows.iter().filter(|r| r.wants_drafts).map(|_| Proposal::default()).collect());
        }
        let flat = Tensor::from_vec(flat_index.clone(), flat_index.len(), &self.device)?;
        let hidden = self.model.first_hidden(taps.taps, taps.final_hidden, &flat)?;
        let (out, logits) = self.model.forward(&hidden, &batch, kv_cache)?;
        if !drafting.is_empty() {
            self.choose(&logits, &mut drafting, &params, &seeds, 0)?;
        }
        // 2. Chain: each further draft from the drafter's own output, one position on.
        let mut last_hidden = if drafting.is_empty() {
            None
        } else {
            let idx: Vec<u32> = drafting.iter().map(|d| d.hidden_row as u32).collect();
            Some(out.index_select(&Tensor::from_vec(idx, drafting.len(), &self.device)?, 0)?)
        };
        for step in 1..self.num_speculative_tokens {
            let Some(hidden) = last_hidden.take() else { break };
            let mut chain = ForwardBatch { block_size: blocks.block_size(), ..Default::default() };
            for (i, d) in drafting.iter().enumerate() {
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
            self.choose(&logits, &mut drafting, &params, &seeds, step)?;
            for d in &mut drafting {
                d.position += 1;
            }
            last_hidden = Some(out);
        }
        let mut by_row: Vec<Option<Proposal>> = vec![None; rows.len()];
        for d in drafting {
            by_row[d.index] = Some(Proposal { drafts: d.drafts, probs: d.probs });
        }
        Ok(rows.iter().zip(by_row).filter(|(r, _)| r.wants_drafts).map(|(_, p)| p.unwrap_or_default()).collect())
    }
}
