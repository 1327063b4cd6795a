//! Forced drafts for structured outputs, in front of any proposer (a spec-rs extension; SGLang
//! calls the idea jump-forward decoding).
//!
//! Where a row's grammar leaves exactly one way on (a schema's keys and punctuation, the rest
//! of the only choice still possible), the forced text is tokenized and proposed as the row's
//! drafts: no drafter forward, and the target accepts them unless it would tokenize the text
//! differently. Verification is unchanged, so the output is exactly the guided plain output.
//! The forced text's last token is left to the model when there are others before it: it may
//! merge with what follows the forced text (a key's `: "` and the value's first letters), and
//! a draft the model would write differently costs its verified position. Where the forced
//! text completes the output (the closing `}` of a schema, the rest of the last choice), the
//! end-of-sequence token is drafted after it.

use std::sync::Arc;

use specrs_core::structured::GuideState;

use super::copies_first::{CopiesFirst, CopySource};
use super::{ProposeRow, Proposer};
use crate::tokenizer::TextTokenizer;

/// The most forced bytes tokenized per row and step.
const MAX_FORCED_BYTES: usize = 64;

/// A grammar's forced text as a source of copied drafts.
pub struct ForcedText {
    tokenizer: Arc<TextTokenizer>,
}

impl CopySource for ForcedText {
    fn name(&self, model: &str) -> String {
        model.to_string()
    }

    fn copy_width(&self, model: &dyn Proposer) -> usize {
        model.copy_width()
    }

    fn applies_to(&self, row: &ProposeRow<'_>) -> bool {
        row.params.guide.is_some()
    }

    fn copies(&mut self, row: &ProposeRow<'_>) -> Vec<u32> {
        forced_drafts(&self.tokenizer, row)
    }
}

pub type GuidedFirstProposer = CopiesFirst<ForcedText>;

impl GuidedFirstProposer {
    pub fn with_tokenizer(model: Box<dyn Proposer>, tokenizer: Arc<TextTokenizer>) -> Self {
        Self::new(ForcedText { tokenizer }, model)
    }
}

/// The forced tokens a guided row may take as drafts (at most its width), or none; ending
/// with end-of-sequence where the forced text completes the output.
fn forced_drafts(tokenizer: &TextTokenizer, row: &ProposeRow<'_>) -> Vec<u32> {
    let width = row.num_drafts.max(row.num_copies);
    let (Some(guide), Some(state)) = (&row.params.guide, row.guide_state) else { return Vec::new() };
    if width == 0 {
        return Vec::new();
    }
    let bytes = guide.forced_bytes(state, MAX_FORCED_BYTES);
    // Whole characters only.
    let text = match std::str::from_utf8(&bytes) {
        Ok(text) => text,
        Err(e) => std::str::from_utf8(&bytes[..e.valid_up_to()]).expect("valid up to there"),
    };
    let mut tokens = if text.is_empty() { Vec::new() } else { tokenizer.encode(text, false).unwrap_or_default() };
    // Only what the guide allows, in case the tokenizer spells the text unexpectedly.
    let mut at = state;
    let allowed = tokens
        .iter()
        .take_while(|&&t| {
            at = guide.advance(at, t);
            at != GuideState::Dead
        })
        .count();
    tokens.truncate(allowed);
    // `at` is dead if a token was refused, so the end is forced only after the whole text.
    match guide.forced_end(at) {
        // Nothing follows the forced text: no merge to fear, and the end is forced too.
        Some(eos) => tokens.push(eos),
        None if tokens.len() > 1 => drop(tokens.pop()),
        None => {}
    }
    tokens.truncate(width);
    tokens
}
