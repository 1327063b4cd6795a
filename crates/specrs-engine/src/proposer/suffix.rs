//! Suffix decoding (the `suffix` method, a spec-rs extension following vLLM's): drafts from
//! frequency-counted suffix trees over the request's own text and over earlier requests'
//! outputs, each as long as its estimated probability allows ([`specrs_core::suffix`]).

use std::collections::HashMap;

use specrs_core::kv_blocks::SeqId;
use specrs_core::scheduler::Scheduler;
use specrs_core::suffix::{SuffixCache, SuffixDraft};

use super::{Proposal, ProposeRow, Proposer, StepTaps};
use crate::error::Result;

/// The suffix cache kept in step with the engine's rows: each running sequence is a request
/// keyed by its id (ids are not reused while an output may be cached).
pub struct SuffixRows {
    cache: SuffixCache,
    /// Committed tokens the cache holds, per running sequence.
    known: HashMap<SeqId, usize>,
}

impl SuffixRows {
    pub fn new(cache: SuffixCache) -> Self {
        Self { cache, known: HashMap::new() }
    }

    /// The longest draft the trees can make.
    pub fn max_tree_depth(&self) -> usize {
        self.cache.config().max_tree_depth
    }

    /// Brings the cache up to every row's committed tokens: the prompt when a sequence is new
    /// (or back after preemption, which restarts it), then whatever it generated since. A row
    /// still reading its prompt has nothing to match yet; every other row's output joins the
    /// trees whether it drafts this step or not.
    pub fn observe(&mut self, rows: &[ProposeRow<'_>]) {
        for row in rows.iter().filter(|r| r.tokens.len() > r.prompt_len || r.may_draft()) {
            let known = *self.known.entry(row.seq).or_insert_with(|| {
                self.cache.start_request(row.seq, &row.tokens[..row.prompt_len]);
                row.prompt_len
            });
            if row.tokens.len() > known {
                self.cache.add_output(row.seq, &row.tokens[known..]);
                self.known.insert(row.seq, row.tokens.len());
            }
        }
    }

    /// The trees' draft for an observed row, at most `max_tokens` long.
    pub fn speculate(&self, row: &ProposeRow<'_>, max_tokens: usize) -> SuffixDraft {
        self.cache.speculate(row.seq, row.tokens, max_tokens)
    }

    /// Forgets finished requests' outputs ([`SuffixCache::forget_finished_outputs`]).
    pub fn forget_finished_outputs(&mut self) -> usize {
        self.cache.forget_finished_outputs()
    }

    /// The sequence's own tree goes; its output stays cached for later requests. A preempted
    /// sequence that returns starts over (its cached output is replaced).
    pub fn release(&mut self, seq: SeqId) {
        self.known.remove(&seq);
        self.cache.stop_request(seq);
    }
}

pub struct SuffixProposer {
    rows: SuffixRows,
    num_speculative_tokens: usize,
}

impl SuffixProposer {
    pub fn new(cache: SuffixCache, num_speculative_tokens: usize) -> Self {
        Self { rows: SuffixRows::new(cache), num_speculative_tokens }
    }
}

impl Proposer for SuffixProposer {
    fn name(&self) -> &str {
        "suffix"
    }

    fn num_speculative_tokens(&self) -> usize {
        self.num_speculative_tokens
    }

    fn propose(
        &mut self,
        rows: &[ProposeRow<'_>],
        _taps: &StepTaps<'_>,
        _scheduler: &Scheduler,
    ) -> Result<Vec<Proposal>> {
        self.rows.observe(rows);
        Ok(rows
            .iter()
            .filter(|r| r.may_draft())
            .map(|r| {
                let width = r.num_drafts.max(r.num_copies).min(self.num_speculative_tokens);
                Proposal { drafts: self.rows.speculate(r, width).tokens, probs: None }
            })
            .collect())
    }

    fn release(&mut self, seq: SeqId) {
        self.rows.release(seq);
    }

    fn forget_cached_outputs(&mut self) -> usize {
        self.rows.forget_finished_outputs()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use specrs_core::kv_blocks::KvBlockManager;
    use specrs_core::sampling::SamplingParams;
    use specrs_core::scheduler::SchedulerConfig;
    use specrs_core::suffix::SuffixCacheConfig;

    use super::*;

    pub(crate) fn cache() -> SuffixCache {
        let config =
            SuffixCacheConfig { max_tree_depth: 24, max_cached_requests: 8, max_spec_factor: 1.0, min_token_prob: 0.1 };
        SuffixCache::new(config)
    }

    fn proposer() -> SuffixProposer {
        SuffixProposer::new(cache(), 6)
    }

    pub(crate) fn row<'a>(
        seq: SeqId,
        tokens: &'a [u32],
        prompt_len: usize,
        params: &'a SamplingParams,
    ) -> ProposeRow<'a> {
        ProposeRow {
            seq,
            tokens,
            prompt_len,
            fed_start: tokens.len() - 1,
            num_valid: 1,
            flat_start: 0,
            num_drafts: 6,
            num_copies: 0,
            catch_up_now: false,
            feed_now: false,
            params,
            seed: 0,
            guide_state: None,
        }
    }

    pub(crate) fn propose(p: &mut dyn Proposer, rows: &[ProposeRow<'_>]) -> Vec<Vec<u32>> {
        let scheduler = Scheduler::new(SchedulerConfig::default(), KvBlockManager::new(8, 4).unwrap());
        let taps = StepTaps { taps: &[], final_hidden: None };
        p.propose(rows, &taps, &scheduler).unwrap().into_iter().map(|p| p.drafts).collect()
    }

    #[test]
    fn a_second_request_drafts_the_first_ones_answer() {
        let params = SamplingParams::default();
        let mut p = proposer();
        let answer = [40, 41, 42, 43, 44, 45, 46, 47];
        let mut first = vec![1, 2, 3];
        first.extend(answer);
        assert_eq!(propose(&mut p, &[row(1, &first, 3, &params)]).len(), 1);
        p.release(1);
        // The same question again: after two answer tokens, the rest is drafted from the
        // first request's output (a 2-token match drafts at most 2 at spec factor 1).
        let second = [1, 2, 3, 40, 41];
        assert_eq!(propose(&mut p, &[row(2, &second, 3, &params)]), vec![vec![42, 43]]);
        let later = [1, 2, 3, 40, 41, 42, 43, 44];
        assert_eq!(propose(&mut p, &[row(2, &later, 3, &params)]), vec![vec![45, 46, 47]]);
    }

    #[test]
    fn forgetting_cached_outputs_drops_finished_answers_but_not_running_ones() {
        let params = SamplingParams::default();
        let mut p = proposer();
        let done = [1, 2, 3, 40, 41, 42, 43];
        propose(&mut p, &[row(1, &done, 3, &params)]);
        p.release(1);
        let running = [9, 60, 61, 62, 63];
        propose(&mut p, &[row(2, &running, 1, &params)]);

        assert_eq!(p.forget_cached_outputs(), 1, "request 1 had finished; request 2 runs on");
        assert_eq!(propose(&mut p, &[row(3, &[5, 40, 41], 1, &params)]), vec![Vec::<u32>::new()], "1's answer is gone");
        assert_eq!(propose(&mut p, &[row(4, &[5, 60, 61], 1, &params)]), vec![vec![62, 63]], "2's stays");
    }

    #[test]
    fn rows_that_do_not_draft_still_feed_the_shared_tree() {
        let params = SamplingParams::default();
        let mut p = proposer();
        let mut quiet = row(1, &[9, 9, 50, 51, 52, 53], 2, &params);
        quiet.num_drafts = 0;
        assert!(propose(&mut p, &[quiet]).is_empty(), "no proposal for a row that does not draft");
        p.release(1);
        assert_eq!(propose(&mut p, &[row(2, &[7, 50, 51], 1, &params)]), vec![vec![52, 53]]);
    }
}
