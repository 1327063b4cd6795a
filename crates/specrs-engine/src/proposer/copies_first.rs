//! Drafts made without the model for some rows, in front of a model proposer: the one
//! mechanism behind prompt lookup ([`super::lookup_first`]), suffix decoding's trees
//! ([`super::suffix_first`]) and a grammar's forced text ([`super::guided_first`]).
//!
//! A row served by copies reaches the model as a row that does not draft this step, marked
//! `catch_up_now`, so a sequential drafter feeds its positions in the forward it runs for the
//! other rows rather than in a catch-up forward of its own when it drafts for the row again.

use std::time::Duration;

use specrs_core::kv_blocks::SeqId;
use specrs_core::scheduler::Scheduler;
use specrs_core::structured::GuideState;

use super::{Proposal, ProposeRow, Proposer, StepTaps, TapRequest};
use crate::error::{EngineError, Result};

/// Where copied drafts come from.
pub trait CopySource: Send {
    /// The wrapper's name, given the model's.
    fn name(&self, model: &str) -> String;

    /// Drafts a row may copy whatever width the next step was planned at
    /// ([`Proposer::copy_width`]).
    fn copy_width(&self, model: &dyn Proposer) -> usize;

    /// KV slots past a row's committed tokens that drafting writes
    /// ([`Proposer::draft_lookahead`]).
    fn draft_lookahead(&self, model: &dyn Proposer) -> usize {
        model.draft_lookahead()
    }

    /// Whether `row` may have copies at all: a step where no row may goes to the model as is.
    fn applies_to(&self, _row: &ProposeRow<'_>) -> bool {
        true
    }

    /// Sees every row of the step before any copies are asked for (a source with state of its
    /// own brings it up to the committed tokens).
    fn observe(&mut self, _rows: &[ProposeRow<'_>]) {}

    /// The drafts `row` copies, at most `max(num_drafts, num_copies)`; empty when none.
    fn copies(&mut self, row: &ProposeRow<'_>) -> Vec<u32>;

    /// Forgets a sequence ([`Proposer::release`]).
    fn release(&mut self, _seq: SeqId) {}

    /// Forgets what finished requests left behind ([`Proposer::forget_cached_outputs`]).
    fn forget_cached_outputs(&mut self) -> usize {
        0
    }
}

/// The copies a guided row may verify: those its guide allows in turn, up to and including
/// an end of sequence (a prompt lookup copies text that knows nothing of the grammar).
fn within_guide(row: &ProposeRow<'_>, mut drafts: Vec<u32>) -> Vec<u32> {
    let (Some(guide), Some(mut state)) = (&row.params.guide, row.guide_state) else { return drafts };
    let mut kept = 0;
    for &token in &drafts {
        state = guide.advance(state, token);
        if state == GuideState::Dead {
            break;
        }
        kept += 1;
        if guide.is_end_of_sequence(token) {
            break;
        }
    }
    drafts.truncate(kept);
    drafts
}

/// A model proposer with a [`CopySource`] in front of it.
pub struct CopiesFirst<S> {
    source: S,
    model: Box<dyn Proposer>,
    name: String,
}

impl<S: CopySource> CopiesFirst<S> {
    pub fn new(source: S, model: Box<dyn Proposer>) -> Self {
        let name = source.name(model.name());
        Self { source, model, name }
    }
}

impl<S: CopySource> Proposer for CopiesFirst<S> {
    fn name(&self) -> &str {
        &self.name
    }

    fn num_speculative_tokens(&self) -> usize {
        self.model.num_speculative_tokens()
    }

    fn draft_lookahead(&self) -> usize {
        self.source.draft_lookahead(self.model.as_ref())
    }

    fn copy_width(&self) -> usize {
        self.source.copy_width(self.model.as_ref())
    }

    fn tap_request(&self) -> TapRequest {
        self.model.tap_request()
    }

    fn input_device(&self) -> Option<&candle_core::Device> {
        self.model.input_device()
    }

    fn propose(
        &mut self,
        rows: &[ProposeRow<'_>],
        taps: &StepTaps<'_>,
        scheduler: &Scheduler,
    ) -> Result<Vec<Proposal>> {
        self.source.observe(rows);
        if !rows.iter().any(|r| self.source.applies_to(r)) {
            return self.model.propose(rows, taps, scheduler);
        }
        // Copies of the rows that may draft, in row order; `None` where there are none. A row
        // copies up to `num_copies` even where the model would draft fewer (or none).
        let copied: Vec<Option<Vec<u32>>> = rows
            .iter()
            .filter(|r| r.may_draft())
            .map(|r| Some(within_guide(r, self.source.copies(r))).filter(|d| !d.is_empty()))
            .collect();
        let mut served = copied.iter().map(Option::is_some);
        let model_rows: Vec<ProposeRow<'_>> = rows
            .iter()
            .map(|r| {
                let by_copies = r.may_draft() && served.next().expect("one entry per row that may draft");
                let r = ProposeRow { num_copies: 0, ..*r };
                if by_copies { ProposeRow { num_drafts: 0, catch_up_now: true, ..r } } else { r }
            })
            .collect();
        let mut from_model = self.model.propose(&model_rows, taps, scheduler)?.into_iter();
        rows.iter()
            .filter(|r| r.may_draft())
            .zip(copied)
            .map(|(r, found)| match found {
                Some(drafts) => Ok(Proposal { drafts, probs: None }),
                // Nothing to copy and no model drafts wanted: the row verifies nothing.
                None if !r.wants_drafts() => Ok(Proposal::default()),
                None => from_model.next().ok_or_else(|| {
                    EngineError::Internal(format!(
                        "{} returned fewer proposals than rows asked for drafts",
                        self.model.name()
                    ))
                }),
            })
            .collect()
    }

    fn take_catch_up_time(&mut self) -> Duration {
        self.model.take_catch_up_time()
    }

    fn kv_bytes_per_token(&self) -> u64 {
        self.model.kv_bytes_per_token()
    }

    fn allocate(&mut self, num_blocks: usize, block_size: usize) -> Result<()> {
        self.model.allocate(num_blocks, block_size)
    }

    fn release(&mut self, seq: SeqId) {
        self.source.release(seq);
        self.model.release(seq);
    }

    fn forget_cached_outputs(&mut self) -> usize {
        self.source.forget_cached_outputs() + self.model.forget_cached_outputs()
    }

    fn kv_final_len(&self, seq: SeqId, computed: usize) -> usize {
        self.model.kv_final_len(seq, computed)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use specrs_core::sampling::SamplingParams;
    use specrs_core::structured::{StructuredOutputs, TokenVocabulary};

    use super::*;

    const EOS: u32 = 3;

    fn row<'a>(tokens: &'a [u32], params: &'a SamplingParams) -> ProposeRow<'a> {
        ProposeRow {
            seq: 1,
            tokens,
            prompt_len: 1,
            fed_start: 0,
            num_valid: 1,
            flat_start: 0,
            num_drafts: 4,
            num_copies: 4,
            catch_up_now: false,
            feed_now: false,
            params,
            seed: 0,
            guide_state: crate::proposer::guide_state_after(tokens, 1, params),
        }
    }

    #[test]
    fn a_guided_rows_copies_stop_where_its_grammar_refuses_and_after_the_end() {
        // Tokens "a", "b", "c" and an end of sequence; the output must be "abab" or "ab".
        let bytes = vec![Some(b"a".to_vec()), Some(b"b".to_vec()), Some(b"c".to_vec()), None];
        let vocabulary = Arc::new(TokenVocabulary::new(bytes, vec![EOS]));
        let constraint = StructuredOutputs { regex: Some("ab(ab)?".into()), ..Default::default() };
        let guide = constraint.compile(&vocabulary).unwrap();
        let guided = SamplingParams { guide: Some(guide), ..Default::default() };
        // Prompt token 2, output "a" so far.
        let tokens = [2, 0];
        assert_eq!(within_guide(&row(&tokens, &guided), vec![1, EOS, 0]), vec![1, EOS], "nothing after the end");
        assert_eq!(within_guide(&row(&tokens, &guided), vec![1, 0, 2, 1]), vec![1, 0], "cut at the refused 'c'");
        assert_eq!(within_guide(&row(&tokens, &guided), vec![0, 1]), Vec::<u32>::new());
        let free = SamplingParams::default();
        assert_eq!(within_guide(&row(&tokens, &free), vec![2, 2, 2]), vec![2, 2, 2], "unguided rows keep theirs");
    }
}
