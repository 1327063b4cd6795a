//! Prompt lookup (the `ngram` method, a spec-rs extension to MAX's methods): drafts copied
//! from what followed the latest earlier occurrence of the request's own suffix.

use specrs_core::kv_blocks::SeqId;
use specrs_core::ngram::NgramProposer as Lookup;
use specrs_core::scheduler::Scheduler;

use super::{Proposal, ProposeRow, Proposer, StepTaps};
use crate::error::Result;

pub struct NgramProposer {
    lookup: Lookup,
}

impl NgramProposer {
    pub fn new(lookup: Lookup) -> Self {
        Self { lookup }
    }
}

impl Proposer for NgramProposer {
    fn name(&self) -> &str {
        "ngram"
    }

    fn num_speculative_tokens(&self) -> usize {
        self.lookup.num_speculative_tokens()
    }

    fn propose(
        &mut self,
        rows: &[ProposeRow<'_>],
        _taps: &StepTaps<'_>,
        _scheduler: &Scheduler,
    ) -> Result<Vec<Proposal>> {
        Ok(rows
            .iter()
            .filter(|r| r.wants_drafts())
            .map(|r| {
                let mut drafts = self.lookup.propose(r.tokens);
                drafts.truncate(r.num_drafts);
                Proposal { drafts, probs: None }
            })
            .collect())
    }

    fn release(&mut self, _seq: SeqId) {}
}
