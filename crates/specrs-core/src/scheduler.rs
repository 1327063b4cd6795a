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
//!
//! With prefix caching ([`KvBlockManager::with_prefix_caching`]) a sequence keyed by its
//! block hashes ([`Scheduler::add_with_prefix`]) adopts the cached blocks its tokens start
//! with when it is admitted (a fresh prompt, or a preempted sequence's own blocks if nothing
//! evicted them), and its prefill starts after them. A sequence whose next block another
//! running sequence is prefilling right now waits for it rather than computing it too (a
//! request's `n` choices, a burst sharing a system prompt). The engine caches a sequence's
//! blocks ([`Scheduler::cache_blocks`]) once every model's keys and values there are final.

use std::collections::{HashMap, VecDeque};

use crate::kv_blocks::{BlockId, KvBlockManager, KvError, SeqId};
use crate::prefix_cache::BlockHash;

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
    /// Sequences admitted this step, with the prompt tokens their cached prefix covered.
    pub admitted: Vec<(SeqId, usize)>,
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

/// A sequence's block keys, for prefix caching.
#[derive(Debug, Clone, Default)]
struct PrefixKeys {
    /// Keys of the blocks its committed tokens complete.
    hashes: Vec<BlockHash>,
    /// It may start from cached blocks (not when every prompt position must be computed).
    reuse: bool,
    /// Leading blocks already cached (adopted, or cached through [`Scheduler::cache_blocks`]).
    cached: usize,
}

#[derive(Debug)]
pub struct Scheduler {
    cfg: SchedulerConfig,
    kv: KvBlockManager,
    seqs: HashMap<SeqId, SeqState>,
    prefix: HashMap<SeqId, PrefixKeys>,
    /// Waiting sequences, ordered by arrival (preempted ones keep their place).
    waiting: VecDeque<SeqId>,
    /// Running sequences (KV held), in arrival order.
    running: Vec<SeqId>,
    next_arrival: u64,
}

impl Scheduler {
    pub fn new(cfg: SchedulerConfig, kv: KvBlockManager) -> Self {
        Self {
            cfg,
            kv,
            seqs: HashMap::new(),
            prefix: HashMap::new(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            next_arrival: 0,
        }
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

    /// Queues a new sequence keyed for prefix caching by `block_hashes` (its prompt's
    /// [`crate::prefix_cache::BlockHasher`] keys). With `reuse` it starts from the cached
    /// blocks its prompt begins with; without, it computes every position (prompt logprobs)
    /// but its blocks are still cached for others.
    pub fn add_with_prefix(&mut self, seq: SeqId, num_tokens: usize, block_hashes: Vec<BlockHash>, reuse: bool) {
        self.add(seq, num_tokens);
        self.prefix.insert(seq, PrefixKeys { hashes: block_hashes, reuse, cached: 0 });
    }

    /// Keys of blocks a sequence's newly committed tokens complete, in order.
    pub fn extend_block_hashes(&mut self, seq: SeqId, hashes: &[BlockHash]) {
        if let Some(keys) = self.prefix.get_mut(&seq) {
            keys.hashes.extend_from_slice(hashes);
        }
    }

    /// Caches the full blocks of a running sequence's first `final_len` positions, which the
    /// caller vouches are final in every model's KV (at most what the target has computed).
    /// Returns how many blocks were newly cached.
    pub fn cache_blocks(&mut self, seq: SeqId, final_len: usize) -> usize {
        let (Some(state), Some(keys)) = (self.seqs.get(&seq), self.prefix.get_mut(&seq)) else {
            return 0;
        };
        if !self.kv.prefix_caching() || !self.running.contains(&seq) {
            return 0;
        }
        let final_len = final_len.min(state.num_computed).min(self.kv.len(seq));
        let upto = (final_len / self.kv.block_size()).min(keys.hashes.len());
        let newly = (keys.cached..upto).filter(|&i| self.kv.cache_block(seq, i, keys.hashes[i])).count();
        keys.cached = keys.cached.max(upto);
        newly
    }

    /// Forgets every cached prefix ([`KvBlockManager::reset_prefix_cache`]); running sequences
    /// cache their blocks again as they go. Returns how many blocks were cached.
    pub fn reset_prefix_cache(&mut self) -> usize {
        for keys in self.prefix.values_mut() {
            keys.cached = 0;
        }
        self.kv.reset_prefix_cache()
    }

    /// Drops a sequence (finished or cancelled) and returns its blocks. Unknown ids are a no-op.
    pub fn remove(&mut self, seq: SeqId) -> bool {
        if self.seqs.remove(&seq).is_none() {
            return false;
        }
        self.prefix.remove(&seq);
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
            let hit = self.cached_prefix(seq);
            if self.prefix_being_prefilled(seq, hit.len()) {
                break; // it waits to adopt the block instead of computing it a second time
            }
            let Some(chunk) = self.plan_admission(seq, &hit, budget) else {
                break; // FCFS: later arrivals do not overtake the head of the queue
            };
            self.waiting.pop_front();
            self.insert_running(seq);
            budget -= chunk.len;
            plan.prefill.push(chunk);
            plan.admitted.push((seq, chunk.start));
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

    /// The cached blocks a waiting sequence may start from: always short of its last token,
    /// whose logits the next token needs.
    fn cached_prefix(&self, seq: SeqId) -> Vec<BlockId> {
        let Some(keys) = self.prefix.get(&seq).filter(|k| k.reuse) else {
            return Vec::new();
        };
        let mut hit = self.kv.cached_prefix(&keys.hashes);
        hit.truncate((self.state(seq).num_tokens - 1) / self.kv.block_size());
        hit
    }

    /// Whether a running sequence is prefilling, right now, the block a waiting sequence needs
    /// after its `cached` cached ones: same key at the same index, so the same tokens up to it.
    fn prefix_being_prefilled(&self, seq: SeqId, cached: usize) -> bool {
        let Some(next) = self.prefix.get(&seq).filter(|k| k.reuse).and_then(|k| k.hashes.get(cached)) else {
            return false;
        };
        self.running.iter().any(|&r| {
            let state = self.state(r);
            state.num_computed + 1 < state.num_tokens
                && self.prefix.get(&r).is_some_and(|k| k.cached <= cached && k.hashes.get(cached) == Some(next))
        })
    }

    /// Admits a waiting sequence: adopts its cached prefix `hit` and reserves KV for its first
    /// prefill chunk after it, keeping the watermark free; `None` (nothing changed) when that
    /// does not fit.
    fn plan_admission(&mut self, seq: SeqId, hit: &[BlockId], budget: usize) -> Option<PrefillChunk> {
        let cached_len = hit.len() * self.kv.block_size();
        let remaining = self.state(seq).num_tokens - cached_len;
        let len = remaining.min(budget).min(self.cfg.max_prefill_chunk);
        if len == 0 {
            return None;
        }
        let new_len = cached_len + len;
        let takes = self.kv.blocks_needed(cached_len, new_len) + self.kv.num_parked(hit);
        // The watermark keeps room for running rows to grow; with none running, holding it
        // back would leave a prompt that needs the whole pool waiting forever.
        let watermark = if self.running.is_empty() { 0 } else { self.cfg.watermark_blocks };
        if self.kv.num_free_blocks() < takes + watermark {
            return None;
        }
        if self.kv.adopt_prefix(seq, hit).is_err() || self.kv.grow(seq, new_len).is_err() {
            debug_assert!(false, "an admission that fits the free blocks failed");
            self.kv.release(seq);
            return None;
        }
        self.seqs.get_mut(&seq).expect("waiting sequences are known").num_computed = cached_len;
        if let Some(keys) = self.prefix.get_mut(&seq) {
            keys.cached = hit.len();
        }
        Some(PrefillChunk { seq, start: cached_len, len, completes: new_len == self.state(seq).num_tokens })
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
        if let Some(keys) = self.prefix.get_mut(&seq) {
            keys.cached = 0;
        }
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
    fn the_watermark_holds_back_newcomers_only_while_others_run() {
        // 4 blocks of 4 tokens, one held back while a row runs.
        let with_watermark = |watermark_blocks: usize| {
            let cfg = SchedulerConfig {
                max_num_seqs: 4,
                max_num_batched_tokens: 64,
                max_prefill_chunk: 64,
                watermark_blocks,
            };
            Scheduler::new(cfg, KvBlockManager::new(4, 4).unwrap())
        };
        // A 13-token prompt needs all four: it starts at once on an idle engine (it used to
        // wait forever behind the watermark).
        let mut s = with_watermark(1);
        s.add(1, 13);
        let p = s.schedule(&mut 0usize);
        assert_eq!(p.prefill, vec![PrefillChunk { seq: 1, start: 0, len: 13, completes: true }]);
        // A 9-token row holds three blocks; a newcomer needing the last one waits while the
        // watermark keeps it for the row's growth, and is admitted without a watermark.
        for (watermark, admitted) in [(1, false), (0, true)] {
            let mut s = with_watermark(watermark);
            s.add(1, 9);
            let p = s.schedule(&mut 0usize);
            run_step(&mut s, &p, 0);
            s.add(2, 2);
            let p = s.schedule(&mut 0usize);
            assert_eq!(p.decode, vec![1]);
            assert_eq!(p.prefill.len() == 1, admitted, "watermark {watermark}");
        }
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

    /// A scheduler over a prefix-caching pool of `blocks` blocks of 4 tokens.
    fn caching_sched(blocks: usize, budget: usize, chunk: usize) -> Scheduler {
        Scheduler::new(
            SchedulerConfig {
                max_num_seqs: 8,
                max_num_batched_tokens: budget,
                max_prefill_chunk: chunk,
                watermark_blocks: 0,
            },
            KvBlockManager::new(blocks, 4).unwrap().with_prefix_caching(true),
        )
    }

    /// Queues `tokens` keyed for prefix caching, as the engine does.
    fn add_keyed(s: &mut Scheduler, seq: SeqId, tokens: &[u32], reuse: bool) {
        let mut hasher = crate::prefix_cache::BlockHasher::default();
        s.add_with_prefix(seq, tokens.len(), hasher.update(tokens, 4).to_vec(), reuse);
    }

    /// Runs one step in which every prefill chunk's positions become final and are cached.
    fn step_and_cache(s: &mut Scheduler) -> StepPlan {
        let plan = s.schedule(&mut 0usize);
        run_step(s, &plan, 0);
        for c in &plan.prefill {
            s.cache_blocks(c.seq, c.start + c.len);
        }
        plan
    }

    #[test]
    fn a_sequence_adopts_the_cached_blocks_its_prompt_starts_with() {
        let mut s = caching_sched(32, 64, 64);
        let prompt: Vec<u32> = (0..13).collect();
        add_keyed(&mut s, 1, &prompt, true);
        step_and_cache(&mut s);
        assert_eq!(s.kv().num_cached_blocks(), 3, "blocks 0..3 hold final positions 0..12");

        // Same first 9 tokens: blocks 0 and 1 (their next token, 8, matches too), not block 2.
        let mut other = prompt[..9].to_vec();
        other.extend([90, 91, 92, 93, 94]);
        add_keyed(&mut s, 2, &other, true);
        let plan = s.schedule(&mut 0usize);
        assert_eq!(plan.admitted, vec![(2, 8)]);
        assert_eq!(plan.prefill, vec![PrefillChunk { seq: 2, start: 8, len: 6, completes: true }]);
        assert_eq!(s.kv().block_table(2)[..2], s.kv().block_table(1)[..2]);
    }

    #[test]
    fn a_fully_cached_prompt_still_computes_its_last_token() {
        let mut s = caching_sched(32, 64, 64);
        let prompt: Vec<u32> = (0..9).collect();
        add_keyed(&mut s, 1, &prompt, true);
        step_and_cache(&mut s);
        add_keyed(&mut s, 2, &prompt, true);
        let plan = s.schedule(&mut 0usize);
        assert_eq!(plan.prefill, vec![PrefillChunk { seq: 2, start: 8, len: 1, completes: true }]);
        // An 8-token prompt keys only block 0 (block 1 has no next token): 4 cached, 4 computed.
        let mut s = caching_sched(32, 64, 64);
        add_keyed(&mut s, 1, &prompt[..8], true);
        step_and_cache(&mut s);
        add_keyed(&mut s, 2, &prompt[..8], true);
        assert_eq!(s.schedule(&mut 0usize).admitted, vec![(2, 4)]);
    }

    #[test]
    fn a_sequence_that_must_compute_its_prompt_reuses_nothing_but_is_cached_for_others() {
        let mut s = caching_sched(32, 64, 64);
        let prompt: Vec<u32> = (0..13).collect();
        add_keyed(&mut s, 1, &prompt, false);
        step_and_cache(&mut s);
        add_keyed(&mut s, 2, &prompt, false);
        assert_eq!(step_and_cache(&mut s).admitted, vec![(2, 0)]);
        add_keyed(&mut s, 3, &prompt, true);
        assert_eq!(s.schedule(&mut 0usize).admitted, vec![(3, 12)]);
    }

    #[test]
    fn a_sequence_waits_for_the_prefix_a_running_sequence_is_prefilling() {
        let mut s = caching_sched(32, 64, 8);
        let prompt: Vec<u32> = (0..20).collect();
        add_keyed(&mut s, 1, &prompt, true);
        add_keyed(&mut s, 2, &prompt, true);
        let unrelated: Vec<u32> = (100..105).collect();
        add_keyed(&mut s, 3, &unrelated, true);
        // Sequence 1 prefills in chunks of 8; 2 waits (and 3 behind it, first come first served).
        for start in [0, 8] {
            let plan = step_and_cache(&mut s);
            assert_eq!(plan.admitted, if start == 0 { vec![(1, 0)] } else { vec![] });
            assert_eq!(plan.prefill.iter().map(|c| (c.seq, c.start)).collect::<Vec<_>>(), vec![(1, start)]);
        }
        // Blocks 0..4 are final and cached once 1 has computed 16 positions: 2 adopts all four
        // keyed blocks while 1 computes its last chunk.
        let plan = s.schedule(&mut 0usize);
        assert_eq!(plan.prefill[0], PrefillChunk { seq: 1, start: 16, len: 4, completes: true });
        assert_eq!(plan.admitted, vec![(2, 16), (3, 0)]);
    }

    #[test]
    fn a_preempted_sequence_readopts_its_own_cached_blocks() {
        let mut s = caching_sched(6, 64, 64);
        let mut tokens: Vec<u32> = (0..8).collect();
        let mut hasher = crate::prefix_cache::BlockHasher::default();
        s.add_with_prefix(1, tokens.len(), hasher.update(&tokens, 4).to_vec(), true);
        step_and_cache(&mut s);
        tokens.push(8);
        s.extend_block_hashes(1, hasher.update(&tokens, 4));
        assert_eq!(s.cache_blocks(1, 8), 1, "the computed block 1 is cached once keyed");
        let mut plan = StepPlan::default();
        s.preempt(1, &mut plan);
        assert_eq!(s.kv().num_free_blocks(), 6, "its cached blocks are parked, not lost");
        let plan = s.schedule(&mut 0usize);
        assert_eq!(plan.admitted, vec![(1, 8)]);
    }

    #[test]
    fn random_workloads_with_shared_prefixes_never_leak_or_share_written_blocks() {
        let mut rng = 0x9E37_79B9u64;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let mut s = caching_sched(40, 48, 16);
        let mut tokens: HashMap<SeqId, (Vec<u32>, crate::prefix_cache::BlockHasher, usize)> = HashMap::new();
        let mut hits = 0;
        for id in 0..300u64 {
            if next() % 3 == 0 {
                // One of three shared system prompts, then a short own part.
                let mut t: Vec<u32> = (0..(next() % 3) as u32 * 5 + 6).map(|i| i + 1000 * (id as u32 % 3)).collect();
                t.extend((0..1 + next() % 6).map(|i| (id * 7 + i) as u32));
                let mut hasher = crate::prefix_cache::BlockHasher::default();
                let keys = hasher.update(&t, 4).to_vec();
                s.add_with_prefix(id, t.len(), keys, next() % 5 != 0);
                let max = t.len() + 1 + (next() % 12) as usize;
                tokens.insert(id, (t, hasher, max));
            }
            let plan = s.schedule(&mut { (next() % 3) as usize });
            hits += plan.admitted.iter().filter(|(_, cached)| *cached > 0).count();
            // No row writes into a block another table holds.
            for c in &plan.prefill {
                let first_written = c.start / 4;
                for &b in &s.kv().block_table(c.seq)[first_written..] {
                    let holders = s.running.iter().filter(|&&r| s.kv().block_table(r).contains(&b)).count();
                    assert_eq!(holders, 1, "seq {} writes shared block {b}", c.seq);
                }
            }
            let accepted = (next() % 3) as usize;
            run_step(&mut s, &plan, accepted);
            let rows: Vec<SeqId> = plan.prefill.iter().map(|c| c.seq).chain(plan.decode.iter().copied()).collect();
            for seq in rows {
                let (t, hasher, _) = tokens.get_mut(&seq).unwrap();
                while t.len() < s.state(seq).num_tokens {
                    t.push((t.len() * 31 % 97) as u32);
                }
                let new = hasher.update(t, 4).to_vec();
                s.extend_block_hashes(seq, &new);
                let computed = s.num_computed(seq);
                s.cache_blocks(seq, computed);
            }
            for seq in plan.rejected.iter().map(|(seq, _)| *seq) {
                tokens.remove(&seq);
            }
            let done: Vec<SeqId> = tokens
                .iter()
                .filter(|(seq, (_, _, max))| s.contains(**seq) && s.state(**seq).num_tokens >= *max)
                .map(|(seq, _)| *seq)
                .collect();
            for seq in done {
                s.remove(seq);
                tokens.remove(&seq);
            }
        }
        assert!(hits > 10, "shared system prompts are reused ({hits} hits)");
        for seq in tokens.keys().copied().collect::<Vec<_>>() {
            s.remove(seq);
        }
        assert_eq!(s.kv.num_free_blocks(), s.kv.num_total_blocks());
        s.reset_prefix_cache();
        assert_eq!((s.kv.num_free_blocks(), s.kv.num_cached_blocks()), (40, 0));
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
