//! Suffix decoding in front of a model drafter (`enable_suffix_decoding`, a spec-rs extension
//! after SGLang's suffix-decoding fork).
//!
//! Every step, suffix decoding's trees (the request's own text, and earlier requests' outputs)
//! follow each row's best match as far as they go; a row copies the start of that continuation
//! when its score, the continuation's expected number of accepted tokens, reaches
//! `suffix_decoding_min_score_ratio` times the model's `K`, and the model drafts the other
//! rows. A request asked again, an agent's repeated tool call or a quoted passage is copied;
//! fresh text goes to the model, whose drafts a weak tree match would displace for less.
//!
//! A copy runs as far as the trees speculate (up to `suffix_decoding_max_tree_depth`), past the
//! model's `K`: a repeated answer is verified 10 or 20 tokens at a time, as suffix decoding
//! alone verifies it, rather than `K` at a time. As prompt lookup's, copies are verified in a
//! small batch whatever width the adaptive controller planned for the model (see
//! [`super::lookup_first`]); in a large batch, where every verified position costs about the
//! token it may return, they are cut to the planned width.

use specrs_core::kv_blocks::SeqId;
use specrs_core::suffix::SuffixCache;

use super::copies_first::{CopiesFirst, CopySource};
use super::suffix::SuffixRows;
use super::{ProposeRow, Proposer};

/// Suffix decoding's trees as a source of copied drafts.
pub struct SuffixLookup {
    rows: SuffixRows,
    /// The score a draft needs to be taken.
    min_score: f32,
}

impl CopySource for SuffixLookup {
    fn name(&self, model: &str) -> String {
        format!("suffix+{model}")
    }

    fn copy_width(&self, model: &dyn Proposer) -> usize {
        self.rows.max_tree_depth().max(model.num_speculative_tokens())
    }

    fn draft_lookahead(&self, model: &dyn Proposer) -> usize {
        model.draft_lookahead().max(self.copy_width(model) + 1)
    }

    fn observe(&mut self, rows: &[ProposeRow<'_>]) {
        self.rows.observe(rows);
    }

    fn copies(&mut self, row: &ProposeRow<'_>) -> Vec<u32> {
        // Scored over the whole continuation: how sure the trees are that the row repeats.
        let mut draft = self.rows.speculate(row, self.rows.max_tree_depth());
        if draft.score < self.min_score {
            return Vec::new();
        }
        draft.tokens.truncate(row.num_drafts.max(row.num_copies));
        draft.tokens
    }

    fn release(&mut self, seq: SeqId) {
        self.rows.release(seq);
    }

    fn forget_cached_outputs(&mut self) -> usize {
        self.rows.forget_finished_outputs()
    }
}

pub type SuffixFirstProposer = CopiesFirst<SuffixLookup>;

impl SuffixFirstProposer {
    /// Suffix drafts scoring at least `min_score_ratio` times the model's `K` go first.
    pub fn with_cache(cache: SuffixCache, min_score_ratio: f64, model: Box<dyn Proposer>) -> Self {
        let min_score = (min_score_ratio * model.num_speculative_tokens() as f64) as f32;
        Self::new(SuffixLookup { rows: SuffixRows::new(cache), min_score }, model)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use specrs_core::sampling::SamplingParams;

    use super::*;
    use crate::error::Result;
    use crate::proposer::suffix::tests::{cache, propose, row};
    use crate::proposer::{Proposal, StepTaps};

    /// A model proposer drafting `[900, 901, ...]` that records which rows it was asked for.
    struct Model {
        asked: Arc<Mutex<Vec<(SeqId, usize, bool)>>>,
        released: Arc<Mutex<Vec<SeqId>>>,
    }

    impl Proposer for Model {
        fn name(&self) -> &str {
            "model"
        }

        fn num_speculative_tokens(&self) -> usize {
            2
        }

        fn propose(
            &mut self,
            rows: &[ProposeRow<'_>],
            _: &StepTaps<'_>,
            _: &specrs_core::scheduler::Scheduler,
        ) -> Result<Vec<Proposal>> {
            let mut asked = self.asked.lock().unwrap();
            asked.extend(rows.iter().map(|r| (r.seq, r.num_drafts, r.catch_up_now)));
            Ok(rows
                .iter()
                .filter(|r| r.wants_drafts())
                .map(|r| Proposal { drafts: (900..900 + r.num_drafts as u32).collect(), probs: None })
                .collect())
        }

        fn release(&mut self, seq: SeqId) {
            self.released.lock().unwrap().push(seq);
        }
    }

    #[test]
    fn a_row_repeating_an_earlier_answer_copies_it_and_the_model_drafts_the_rest() {
        let asked = Arc::new(Mutex::new(Vec::new()));
        let released = Arc::new(Mutex::new(Vec::new()));
        let model = Model { asked: asked.clone(), released: released.clone() };
        // K = 2 and a ratio of 1: a suffix draft must be worth 2 accepted tokens.
        let mut p = SuffixFirstProposer::with_cache(cache(), 1.0, Box::new(model));
        assert_eq!(p.name(), "suffix+model");
        assert_eq!(
            (p.num_speculative_tokens(), p.copy_width(), p.draft_lookahead()),
            (2, 24, 25),
            "copies run as deep as the trees, past the model's K"
        );
        let params = SamplingParams::default();
        let first: Vec<u32> = [1, 2, 3, 40, 41, 42, 43, 44, 45, 46, 47].into();
        let first_row = ProposeRow { num_drafts: 2, ..row(1, &first, 3, &params) };
        assert_eq!(propose(&mut p, &[first_row]), vec![vec![900, 901]], "nothing to copy yet");
        p.release(1);
        assert_eq!(*released.lock().unwrap(), vec![1], "the model forgets it too");

        // Request 2 repeats request 1's answer (a 4-token match: a continuation of 4 tokens of
        // probability 1/2, score 2, which it copies whole, past K); request 3 has a one-token
        // match (1 token of probability 1/3) and goes to the model.
        let repeat: Vec<u32> = [1, 2, 3, 40, 41, 42, 43].into();
        let fresh: Vec<u32> = [7, 8, 43].into();
        let mut rows = [row(2, &repeat, 3, &params), row(3, &fresh, 2, &params)];
        for r in &mut rows {
            (r.num_drafts, r.num_copies) = (2, p.copy_width());
        }
        asked.lock().unwrap().clear();
        assert_eq!(propose(&mut p, &rows), vec![vec![44, 45, 46, 47], vec![900, 901]]);
        assert_eq!(
            *asked.lock().unwrap(),
            vec![(2, 0, true), (3, 2, false)],
            "the copying row only catches the model up; the other drafts from it"
        );

        // In a large batch rows get no copies past the planned width: the copy is cut to it.
        let large_batch_row = ProposeRow { num_drafts: 2, num_copies: 0, ..row(2, &repeat, 3, &params) };
        assert_eq!(propose(&mut p, &[large_batch_row]), vec![vec![44, 45]]);
    }
}
