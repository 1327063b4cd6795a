//! Continuous batching: which sequences run each step, how much of each, and at what verify
//! width.
//!
//! A sequence holds `num_tokens` committed tokens, of which the first `num_computed` have
//! keys and values in the target's KV cache. Every step either
//! - decodes it (exactly one uncomputed token: the last committed one, fed together with up
//!   to `width` drafts to verify), or
//! - prefills a chunk of its uncomputed tokens (a fresh prompt, or a preempted sequence being
//!   recomputed); a chunk that reaches the end yields logits for the next token.
//!
//! Decode rows are served first (they are latency-critical and hold KV already), then
//! prefill chunks within the step's token budget, first-come first-served. When the KV pool
//! cannot hold a decode row's growth, the most recently arrived running sequence is preempted
//! by recompute: its blocks are freed and it returns to the front of the waiting queue with
//! every committed token, so nothing is lost or emitted twice.
//!
//! Mixed steps (decode and prefill rows together) verify nothing unless mixed speculative
//! batches are enabled and supported; then decode rows verify the mixed width.

use std::collections::{HashMap, VecDeque};

use crate::kv_blocks::{KvBlockManager, KvError, SeqId};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchedulerConfig {
    /// Sequences running at once.
    pub max_num_seqs: usize,
    /// Tokens one step may feed the target (decode rows count 1 + width each).
    pub max_num_batched_tokens: usize,
    /// Longest prefill chunk of one sequence per step.
    pub max_prefill_chunk: usize,
    /// Blocks kept free when admitting new sequences, so running ones can keep growing.
    pub watermark_blocks: usize,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self { max_num_seqs: 64, max_num_batched_tokens: 2048, max_prefill_chunk: 512, watermark_blocks: 1 }
    }
}

/// The verify-width policy the scheduler consults once per step.
pub trait WidthPolicy {
    /// Width for a step with `decode_rows` decode rows; `mixed` when prefill rows share it.
    fn step_width(&mut self, decode_rows: usize, mixed: bool) -> usize;
}

/// A fixed width (plain decoding uses 0).
impl WidthPolicy for usize {
    fn step_width(&mut self, _decode_rows: usize, _mixed: bool) -> usize {
        *self
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrefillChunk {
    pub seq: SeqId,
    /// First token of the chunk (== the sequence's `num_computed`).
    pub start: usize,
    pub len: usize,
    /// The chunk reaches the last committed token: its logits choose the next token.
    pub completes: bool,
}

/// What one step runs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StepPlan {
    /// Sequences decoding this step, in arrival order. Each has KV reserved for
    /// `num_computed + 1 + verify_width` tokens.
    pub decode: Vec<SeqId>,
    pub prefill: Vec<PrefillChunk>,
    /// Drafts each decode row may verify (rows with fewer drafts verify fewer).
    pub verify_width: usize,
    /// Decode and prefill rows share the step.
    pub mixed: bool,
    /// Sequences preempted this step (now waiting, to be recomputed).
    pub preempted: Vec<SeqId>,
    /// Sequences that can never fit the KV pool; the caller finishes them with an error.
    pub rejected: Vec<(SeqId, KvError)>,
}

impl StepPlan {
    pub fn is_empty(&self) -> bool {
        self.decode.is_empty() && self.prefill.is_empty()
    }

    pub fn num_tokens(&self) -> usize {
        self.decode.len() * (1 + self.verify_width) + self.prefill.iter().map(|c| c.len).sum::<usize>()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct SeqState {
    arrival: u64,
    num_tokens: usize,
    num_computed: usize,
}

#[derive(Debug)]
pub struct Scheduler {
    cfg: SchedulerConfig,
    kv: KvBlockManager,
    seqs: HashMap<SeqId, SeqState>,
    /// Waiting sequences, ordered by arrival (preempted ones keep their place).
    waiting: VecDeque<SeqId>,
    /// Running sequences (KV held), in arrival order.
    running: Vec<SeqId>,
    next_arrival: u64,
}

impl Scheduler {
    pub fn new(cfg: SchedulerConfig, kv: KvBlockManager) -> Self {
        Self { cfg, kv, seqs: HashMap::new(), waiting: VecDeque::new(), running: Vec::new(), next_arrival: 0 }
    }

    pub fn config(&self) -> &SchedulerConfig {
        &self.cfg
    }

    pub fn kv(&self) -> &KvBlockManager {
        &self.kv
    }

    pub fn num_waiting(&self) -> usize {
        self.waiting.len()
    }

    pub fn num_running(&self) -> usize {
        self.running.len()
    }

    pub fn has_work(&self) -> bool {
        !self.waiting.is_empty() || !self.running.is_empty()
    }

    pub fn contains(&self, seq: SeqId) -> bool {
        self.seqs.contains_key(&seq)
    }

    pub fn num_computed(&self, seq: SeqId) -> usize {
        self.seqs.get(&seq).map_or(0, |s| s.num_computed)
    }

    /// Queues a new sequence of `num_tokens` prompt tokens.
    pub fn add(&mut self, seq: SeqId, num_tokens: usize) {
        let arrival = self.next_arrival;
        self.next_arrival += 1;
        self.seqs.insert(seq, SeqState { arrival, num_tokens, num_computed: 0 });
        self.waiting.push_back(seq);
    }

    /// Drops a sequence (finished or cancelled) and returns its blocks. Unknown ids are a no-op.
    pub fn remove(&mut self, seq: SeqId) -> bool {
        if self.seqs.remove(&seq).is_none() {
            return false;
        }
        self.waiting.retain(|&s| s != seq);
        self.running.retain(|&s| s != seq);
        self.kv.release(seq);
        true
    }

    /// Records a step's outcome: `num_tokens` committed, `num_computed` of them in the KV
    /// cache. Rolls the KV reservation back to `num_computed` (rejected drafts).
    pub fn commit(&mut self, seq: SeqId, num_tokens: usize, num_computed: usize) -> Result<(), KvError> {
        let Some(state) = self.seqs.get_mut(&seq) else {
            return Err(KvError::UnknownSequence { seq });
        };
        debug_assert!(num_computed <= num_tokens);
        state.num_tokens = num_tokens;
        state.num_computed = num_computed;
        if self.kv.contains(seq) && self.kv.len(seq) > num_computed {
            self.kv.truncate(seq, num_computed)?;
        }
        Ok(())
    }

    /// Reserves KV for `len` tokens of a running sequence without preempting anyone (drafters
    /// writing their proposals). Returns false when the pool cannot.
    pub fn reserve(&mut self, seq: SeqId, len: usize) -> bool {
        if !self.running.contains(&seq) {
            return false;
        }
        self.kv.len(seq) >= len || self.kv.grow(seq, len).is_ok()
    }

    fn state(&self, seq: SeqId) -> SeqState {
        self.seqs[&seq]
    }

    /// Plans the next step.
    pub fn schedule(&mut self, policy: &mut dyn WidthPolicy) -> StepPlan {
        let mut plan = StepPlan::default();
        let is_decode = |s: &SeqState| s.num_computed + 1 == s.num_tokens;
        let decode_candidates: Vec<SeqId> =
            self.running.iter().copied().filter(|&s| is_decode(&self.state(s))).collect();
        let prefill_pending = self.running.iter().any(|&s| !is_decode(&self.state(s)))
            || (!self.waiting.is_empty() && self.running.len() < self.cfg.max_num_seqs);

        // 1. Decode rows, at the width of a (tentatively) mixed or pure step.
        let mut width =
            if decode_candidates.is_empty() { 0 } else { policy.step_width(decode_candidates.len(), prefill_pending) };
        let mut decode = Vec::with_capacity(decode_candidates.len());
        for seq in decode_candidates {
            if !self.running.contains(&seq) {
                continue; // preempted while growing an earlier row
            }
            let need = self.state(seq).num_computed + 1 + width;
            if self.grow_or_preempt(seq, need, &mut plan) {
                decode.push(seq);
            }
        }

        // 2. Prefill chunks within what the decode rows left of the token budget.
        let mut budget = self.cfg.max_num_batched_tokens.saturating_sub(decode.len() * (1 + width));
        let prefilling: Vec<SeqId> = self.running.iter().copied().filter(|&s| !is_decode(&self.state(s))).collect();
        for seq in prefilling {
            if budget == 0 {
                break;
            }
            if let Some(chunk) = self.plan_chunk(seq, budget, 0) {
                budget -= chunk.len;
                plan.prefill.push(chunk);
            }
        }
        while budget > 0 && self.running.len() < self.cfg.max_num_seqs {
            let Some(&seq) = self.waiting.front() else { break };
            let state = self.state(seq);
            // A sequence the whole pool could never hold is rejected rather than waiting forever.
            let needed = self.kv.blocks_needed(0, state.num_tokens + 1);
            if needed > self.kv.num_total_blocks() {
                self.waiting.pop_front();
                self.seqs.remove(&seq);
                plan.rejected.push((
                    seq,
                    KvError::OutOfBlocks {
                        seq,
                        current_len: 0,
                        new_len: state.num_tokens + 1,
                        needed,
                        free: self.kv.num_total_blocks(),
                    },
                ));
                continue;
            }
            let Some(chunk) = self.plan_chunk(seq, budget, self.cfg.watermark_blocks) else {
                break; // FCFS: later arrivals do not overtake the head of the queue
            };
            self.waiting.pop_front();
            self.insert_running(seq);
            budget -= chunk.len;
            plan.prefill.push(chunk);
        }

        // 3. The final width: a mixed step verifies the mixed width; a step that turned out
        //    pure (nothing could be prefilled) may widen.
        plan.mixed = !decode.is_empty() && !plan.prefill.is_empty();
        if !decode.is_empty() && prefill_pending && !plan.mixed {
            let pure = policy.step_width(decode.len(), false);
            if pure > width && decode.iter().all(|&s| self.kv.can_grow(s, self.state(s).num_computed + 1 + pure)) {
                for &s in &decode {
                    let need = self.state(s).num_computed + 1 + pure;
                    let grown = self.kv.grow(s, need);
                    debug_assert!(grown.is_ok());
                }
                width = pure;
            } else {
                width = width.min(pure);
            }
        }
        plan.decode = decode;
        plan.verify_width = width;
        plan
    }

    /// Reserves KV for a prefill chunk of `seq`; `None` when nothing fits.
    fn plan_chunk(&mut self, seq: SeqId, budget: usize, keep_free: usize) -> Option<PrefillChunk> {
        let state = self.state(seq);
        let remaining = state.num_tokens - state.num_computed;
        let len = remaining.min(budget).min(self.cfg.max_prefill_chunk);
        if len == 0 {
            return None;
        }
        let new_len = state.num_computed + len;
        let needed = self.kv.blocks_needed(self.kv.len(seq), new_len);
        if self.kv.num_free_blocks() < needed + keep_free || self.kv.grow(seq, new_len).is_err() {
            return None;
        }
        Some(PrefillChunk { seq, start: state.num_computed, len, completes: new_len == state.num_tokens })
    }

    /// Grows `seq` to `need`, preempting the latest arrivals (never `seq` itself first) until
    /// it fits. Returns false when `seq` had to be preempted itself.
    fn grow_or_preempt(&mut self, seq: SeqId, need: usize, plan: &mut StepPlan) -> bool {
        loop {
            if self.kv.len(seq) >= need || self.kv.grow(seq, need).is_ok() {
                return true;
            }
            let victim = self.running.iter().copied().filter(|&s| s != seq).max_by_key(|&s| self.state(s).arrival);
            match victim {
                Some(v) if self.state(v).arrival > self.state(seq).arrival => self.preempt(v, plan),
                _ => {
                    self.preempt(seq, plan);
                    return false;
                }
            }
        }
    }

    fn preempt(&mut self, seq: SeqId, plan: &mut StepPlan) {
        self.kv.release(seq);
        self.running.retain(|&s| s != seq);
        plan.decode.retain(|&s| s != seq);
        plan.prefill.retain(|c| c.seq != seq);
        let state = self.seqs.get_mut(&seq).expect("running sequences are known");
        state.num_computed = 0;
        let arrival = state.arrival;
        let at = self.waiting.iter().position(|&w| self.seqs[&w].arrival > arrival).unwrap_or(self.waiting.len());
        self.waiting.insert(at, seq);
        plan.preempted.push(seq);
    }

    fn insert_running(&mut self, seq: SeqId) {
        let arrival = self.state(seq).arrival;
        let at = self.running.iter().position(|&r| self.seqs[&r].arrival > arrival).unwrap_or(self.running.len());
        self.running.insert(at, seq);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sched(blocks: usize, max_seqs: usize, budget: usize, chunk: usize) -> Scheduler {
        Scheduler::new(
            SchedulerConfig {
                max_num_seqs: max_seqs,
                max_num_batched_tokens: budget,
                max_prefill_chunk: chunk,
                watermark_blocks: 0,
            },
            KvBlockManager::new(blocks, 4).unwrap(),
        )
    }

    /// Commits a plan as an engine would: prefill chunks advance, completed ones and decode
    /// rows each gain `1 + accepted` tokens.
    fn run_step(s: &mut Scheduler, plan: &StepPlan, accepted: usize) {
        for c in &plan.prefill {
            let st = s.state(c.seq);
            let tokens = if c.completes { st.num_tokens + 1 } else { st.num_tokens };
            s.commit(c.seq, tokens, c.start + c.len).unwrap();
        }
        for &d in &plan.decode {
            let st = s.state(d);
            let a = accepted.min(plan.verify_width);
            s.commit(d, st.num_tokens + 1 + a, st.num_computed + 1 + a).unwrap();
        }
    }

    #[test]
    fn prefill_is_chunked_within_the_budget_fcfs() {
        let mut s = sched(64, 8, 10, 6);
        s.add(1, 9);
        s.add(2, 3);
        let p = s.schedule(&mut 0usize);
        assert_eq!(
            p.prefill,
            vec![
                PrefillChunk { seq: 1, start: 0, len: 6, completes: false },
                PrefillChunk { seq: 2, start: 0, len: 3, completes: true },
            ]
        );
        run_step(&mut s, &p, 0);
        let p = s.schedule(&mut 0usize);
        assert_eq!(p.decode, vec![2]);
        assert_eq!(p.prefill, vec![PrefillChunk { seq: 1, start: 6, len: 3, completes: true }]);
        assert!(p.mixed);
    }

    #[test]
    fn mixed_steps_take_the_mixed_width_and_pure_steps_the_decode_width() {
        struct Policy;
        impl WidthPolicy for Policy {
            fn step_width(&mut self, _rows: usize, mixed: bool) -> usize {
                if mixed { 0 } else { 3 }
            }
        }
        let mut s = sched(64, 8, 64, 64);
        s.add(1, 5);
        let p = s.schedule(&mut Policy);
        run_step(&mut s, &p, 0);
        s.add(2, 5);
        let p = s.schedule(&mut Policy);
        assert!(p.mixed);
        assert_eq!(p.verify_width, 0);
        run_step(&mut s, &p, 0);
        let p = s.schedule(&mut Policy);
        assert!(!p.mixed);
        assert_eq!((p.decode.len(), p.verify_width), (2, 3));
        // KV reserved for the last token plus three drafts.
        assert!(s.kv().len(1) >= s.num_computed(1) + 4);
    }

    #[test]
    fn max_num_seqs_bounds_admission() {
        let mut s = sched(64, 2, 64, 64);
        for id in 0..4 {
            s.add(id, 3);
        }
        let p = s.schedule(&mut 0usize);
        assert_eq!(p.prefill.len(), 2);
        assert_eq!(s.num_running(), 2);
        assert_eq!(s.num_waiting(), 2);
    }

    #[test]
    fn growth_preempts_the_latest_arrival_which_is_recomputed_later() {
        // 6 blocks of 4 tokens; two sequences of 8 tokens fill 4 blocks, decode growth
        // with width 3 then needs more than the pool has.
        let mut s = sched(6, 4, 64, 64);
        s.add(1, 8);
        s.add(2, 8);
        let p = s.schedule(&mut 3usize);
        run_step(&mut s, &p, 0);
        let mut preempted = Vec::new();
        for _ in 0..6 {
            let p = s.schedule(&mut 3usize);
            preempted.extend(p.preempted.iter().copied());
            run_step(&mut s, &p, 3);
        }
        assert_eq!(preempted.first(), Some(&2), "the later arrival is preempted first");
        assert!(s.contains(2), "a preempted sequence is kept, not lost");
    }

    #[test]
    fn a_sequence_larger_than_the_pool_is_rejected() {
        let mut s = sched(2, 4, 64, 64);
        s.add(7, 100);
        let p = s.schedule(&mut 0usize);
        assert_eq!(p.rejected.len(), 1);
        assert!(!s.contains(7));
    }

    #[test]
    fn random_workloads_never_leak_blocks() {
        let mut rng = 0x1234_5678u64;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let mut s = sched(40, 6, 48, 16);
        let mut id = 0u64;
        let mut lengths: HashMap<SeqId, usize> = HashMap::new();
        for _ in 0..400 {
            if next() % 3 == 0 {
                id += 1;
                let len = 1 + (next() % 30) as usize;
                s.add(id, len);
                lengths.insert(id, len + 1 + (next() % 20) as usize);
            }
            let width = (next() % 4) as usize;
            let p = s.schedule(&mut { width });
            run_step(&mut s, &p, (next() % 4) as usize);
            for (seq, _) in &p.rejected {
                lengths.remove(seq);
            }
            // Finish sequences that reached their length, cancel some at random.
            let done: Vec<SeqId> = lengths
                .iter()
                .filter(|(seq, max)| s.contains(**seq) && s.state(**seq).num_tokens >= **max)
                .map(|(seq, _)| *seq)
                .collect();
            for seq in done {
                s.remove(seq);
                lengths.remove(&seq);
            }
            if next() % 17 == 0
                && let Some(&seq) = lengths.keys().next()
            {
                s.remove(seq);
                lengths.remove(&seq);
            }
            let held: usize = s.running.iter().map(|&r| s.kv.block_table(r).len()).sum();
            assert_eq!(held + s.kv.num_free_blocks(), s.kv.num_total_blocks());
        }
        for seq in lengths.keys().copied().collect::<Vec<_>>() {
            s.remove(seq);
        }
        assert_eq!(s.kv.num_free_blocks(), s.kv.num_total_blocks());
        assert!(!s.has_work());
    }
}
