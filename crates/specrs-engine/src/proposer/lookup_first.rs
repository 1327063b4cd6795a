//! Prompt lookup in front of a model drafter (`enable_prompt_lookup`, a spec-rs extension).
//!
//! A row whose latest tokens repeat an earlier n-gram of its own text takes what followed that
//! occurrence as its drafts; the model drafts only the rows without such a match. Quoting,
//! editing and the loops small models fall into repeat long spans a learned head predicts
//! poorly, and copying them costs no drafter forward. The model still sees every row: rows
//! served by the lookup reach it as rows that do not draft this step, marked `catch_up_now`,
//! so a sequential drafter feeds their positions in the forward it runs for the other rows
//! rather than in a catch-up forward of their own when the model drafts for them again.
//!
//! Copies cost nothing to make, so in a small batch a row copies up to `K` whatever width the
//! adaptive controller planned for the model's drafts (`num_copies`, see
//! `EngineWidthPolicy::copy_width`), plain steps included: the step widens for the rows that
//! copied, and the others verify what the controller chose.

use specrs_core::ngram::NgramProposer as Lookup;

use super::copies_first::{CopiesFirst, CopySource};
use super::{ProposeRow, Proposer};
use crate::error::Result;

/// Prompt lookup as a source of copied drafts.
pub struct PromptLookup {
    lookup: Lookup,
}

impl CopySource for PromptLookup {
    fn name(&self, model: &str) -> String {
        format!("ngram+{model}")
    }

    fn copy_width(&self, model: &dyn Proposer) -> usize {
        model.num_speculative_tokens()
    }

    fn draft_lookahead(&self, model: &dyn Proposer) -> usize {
        model.draft_lookahead().max(model.num_speculative_tokens() + 1)
    }

    fn copies(&mut self, row: &ProposeRow<'_>) -> Vec<u32> {
        let mut drafts = self.lookup.propose(row.tokens);
        drafts.truncate(row.num_drafts.max(row.num_copies));
        drafts
    }
}

pub type LookupFirstProposer = CopiesFirst<PromptLookup>;

impl LookupFirstProposer {
    /// Matches suffix n-grams of `min_n..=max_n` tokens and copies up to the model's `K`.
    pub fn with_lookup(min_n: usize, max_n: usize, model: Box<dyn Proposer>) -> Result<Self> {
        let lookup = Lookup::new(min_n, max_n, model.num_speculative_tokens())?;
        Ok(Self::new(PromptLookup { lookup }, model))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use specrs_core::kv_blocks::{KvBlockManager, SeqId};
    use specrs_core::sampling::SamplingParams;
    use specrs_core::scheduler::{Scheduler, SchedulerConfig};

    use super::*;
    use crate::proposer::{DraftProbs, Proposal, StepTaps};

    /// Per call, each row's `(seq, num_drafts, catch_up_now)` as the model proposer was asked.
    type Calls = Arc<Mutex<Vec<Vec<(SeqId, usize, bool)>>>>;

    /// A model proposer that drafts `[900, 901, ...]` and records what each call asked of it.
    struct Recording {
        asked: Calls,
        released: Arc<Mutex<Vec<SeqId>>>,
    }

    impl Proposer for Recording {
        fn name(&self) -> &str {
            "model"
        }

        fn num_speculative_tokens(&self) -> usize {
            3
        }

        fn draft_lookahead(&self) -> usize {
            8
        }

        fn propose(&mut self, rows: &[ProposeRow<'_>], _: &StepTaps<'_>, _: &Scheduler) -> Result<Vec<Proposal>> {
            self.asked.lock().unwrap().push(rows.iter().map(|r| (r.seq, r.num_drafts, r.catch_up_now)).collect());
            Ok(rows
                .iter()
                .filter(|r| r.wants_drafts())
                .map(|r| Proposal {
                    drafts: (900..900 + r.num_drafts as u32).collect(),
                    probs: Some(DraftProbs::Host(vec![0.5])),
                })
                .collect())
        }

        fn release(&mut self, seq: SeqId) {
            self.released.lock().unwrap().push(seq);
        }
    }

    struct Harness {
        proposer: LookupFirstProposer,
        asked: Calls,
        released: Arc<Mutex<Vec<SeqId>>>,
        scheduler: Scheduler,
        params: SamplingParams,
    }

    fn harness() -> Harness {
        let asked = Arc::new(Mutex::new(Vec::new()));
        let released = Arc::new(Mutex::new(Vec::new()));
        let model = Recording { asked: asked.clone(), released: released.clone() };
        // Matches of 2 to 4 tokens, copying up to the model's 3.
        let proposer = LookupFirstProposer::with_lookup(2, 4, Box::new(model)).unwrap();
        let scheduler = Scheduler::new(SchedulerConfig::default(), KvBlockManager::new(8, 4).unwrap());
        Harness { proposer, asked, released, scheduler, params: SamplingParams::greedy() }
    }

    impl Harness {
        fn propose(&mut self, rows: &[(SeqId, &[u32], usize)]) -> Vec<Proposal> {
            let rows: Vec<_> = rows.iter().map(|&(seq, tokens, num_drafts)| (seq, tokens, num_drafts, 0)).collect();
            self.propose_copying(&rows)
        }

        /// Rows as `(seq, tokens, num_drafts, num_copies)`.
        fn propose_copying(&mut self, rows: &[(SeqId, &[u32], usize, usize)]) -> Vec<Proposal> {
            let rows: Vec<ProposeRow<'_>> = rows
                .iter()
                .map(|&(seq, tokens, num_drafts, num_copies)| ProposeRow {
                    seq,
                    tokens,
                    prompt_len: 0,
                    fed_start: tokens.len() - 1,
                    num_valid: 1,
                    flat_start: 0,
                    num_drafts,
                    num_copies,
                    catch_up_now: false,
                    feed_now: false,
                    params: &self.params,
                    seed: 0,
                    guide_state: None,
                })
                .collect();
            let taps = StepTaps { taps: &[], final_hidden: None };
            self.proposer.propose(&rows, &taps, &self.scheduler).unwrap()
        }
    }

    /// `5 6 7 8 9 5 6`: the suffix `5 6` occurred before, followed by `7 8 9`.
    const REPEATING: &[u32] = &[5, 6, 7, 8, 9, 5, 6];
    /// No suffix of two or more tokens occurs earlier.
    const FRESH: &[u32] = &[1, 2, 3, 4];

    #[test]
    fn matched_rows_copy_their_continuation_and_the_model_drafts_the_rest_in_row_order() {
        let mut h = harness();
        let proposals = h.propose(&[(1, FRESH, 3), (2, REPEATING, 3), (3, FRESH, 0), (4, FRESH, 2)]);
        let drafts: Vec<&[u32]> = proposals.iter().map(|p| p.drafts.as_slice()).collect();
        assert_eq!(drafts, [&[900, 901, 902][..], &[7, 8, 9], &[900, 901]]);
        // Copied drafts carry no distribution (verified as one-hot); the model's keep theirs.
        assert_eq!(proposals.iter().map(|p| p.probs.is_some()).collect::<Vec<_>>(), [true, false, true]);
        // The model saw every row, the matched one as a row that does not draft but is fed now.
        let asked = [(1, 3, false), (2, 0, true), (3, 0, false), (4, 2, false)];
        assert_eq!(*h.asked.lock().unwrap(), [asked.to_vec()]);
    }

    #[test]
    fn copied_drafts_respect_the_planned_width() {
        let mut h = harness();
        let proposals = h.propose(&[(2, REPEATING, 1)]);
        assert_eq!(proposals, [Proposal { drafts: vec![7], probs: None }]);
    }

    #[test]
    fn rows_copy_up_to_num_copies_whatever_the_planned_width() {
        let mut h = harness();
        // A plain step planned (no model drafts): the matched row still copies all of `7 8 9`,
        // the unmatched one gets an empty proposal, and the model drafts for nobody.
        let proposals = h.propose_copying(&[(1, REPEATING, 0, 3), (2, FRESH, 0, 3), (3, FRESH, 0, 0)]);
        let drafts: Vec<&[u32]> = proposals.iter().map(|p| p.drafts.as_slice()).collect();
        assert_eq!(drafts, [&[7, 8, 9][..], &[]]);
        assert_eq!(*h.asked.lock().unwrap(), [vec![(1, 0, true), (2, 0, false), (3, 0, false)]]);
        // A narrow width planned: copies go past it, the model's drafts keep to it.
        let proposals = h.propose_copying(&[(1, REPEATING, 1, 3), (2, FRESH, 1, 3)]);
        let drafts: Vec<&[u32]> = proposals.iter().map(|p| p.drafts.as_slice()).collect();
        assert_eq!(drafts, [&[7, 8, 9][..], &[900]]);
        assert_eq!(h.proposer.copy_width(), 3);
    }

    #[test]
    fn widths_and_lookahead_follow_the_model_and_release_reaches_it() {
        let mut h = harness();
        assert_eq!(h.proposer.num_speculative_tokens(), 3);
        assert_eq!(h.proposer.draft_lookahead(), 8);
        assert_eq!(h.proposer.name(), "ngram+model");
        // A lookup wider than the model is cut to the model's width.
        let long: Vec<u32> = [1, 2].iter().chain(&[3, 4, 5, 6, 7, 8]).chain(&[1, 2]).copied().collect();
        assert_eq!(h.propose(&[(5, &long, 3)])[0].drafts, [3, 4, 5]);
        h.proposer.release(5);
        assert_eq!(*h.released.lock().unwrap(), [5]);
    }
}
