//! What one row brings to verification and what it takes away.

use thiserror::Error;

use crate::sampling::SamplingParams;

/// One request's verify step.
///
/// Position `i < n` of `logits` verifies `drafts[i]`; position `n` is the bonus position,
/// sampled only when every draft is accepted. Rows without drafts (`n = 0`) are plain decode
/// steps: they emit the bonus token alone.
#[derive(Debug, Clone, Copy)]
pub struct VerifyRow<'a> {
    /// `[n]` draft tokens.
    pub drafts: &'a [u32],
    /// `[(n + 1) · V]` target logits, row-major by position.
    pub logits: &'a [f32],
    /// `[n · V]` distributions the drafts were sampled from (`draft_proposal = "sampled"`).
    /// Without it, or where `q(draft) = 0`, the draft is verified as a one-hot proposal.
    pub draft_probs: Option<&'a [f32]>,
    pub params: &'a SamplingParams,
    /// This step's seed: the engine passes `request seed + committed tokens · γ`, so position
    /// `i` of the step draws the request's counter for its sequence position, and no row
    /// depends on its batch or on where its steps begin.
    pub seed: u64,
    /// Prompt followed by the generated tokens; read only by the penalties and bad words.
    pub history: &'a [u32],
    /// How many leading `history` tokens are the prompt.
    pub prompt_len: usize,
    /// Whether the request is inside a reasoning span when the step starts.
    pub in_thinking: bool,
}

impl<'a> VerifyRow<'a> {
    /// A row with no history, no draft distributions, outside any reasoning span.
    pub fn new(drafts: &'a [u32], logits: &'a [f32], params: &'a SamplingParams, seed: u64) -> Self {
        Self { drafts, logits, draft_probs: None, params, seed, history: &[], prompt_len: 0, in_thinking: false }
    }

    pub fn with_draft_probs(self, draft_probs: &'a [f32]) -> Self {
        Self { draft_probs: Some(draft_probs), ..self }
    }

    pub fn with_history(self, history: &'a [u32], prompt_len: usize) -> Self {
        Self { history, prompt_len, ..self }
    }

    pub fn with_thinking(self, in_thinking: bool) -> Self {
        Self { in_thinking, ..self }
    }

    /// Checks the slice lengths and draft ids against the vocabulary.
    pub fn check(&self, vocab_size: usize) -> Result<(), VerifyError> {
        let num_drafts = self.drafts.len();
        let expected = (num_drafts + 1).saturating_mul(vocab_size);
        if self.logits.len() != expected {
            return Err(VerifyError::LogitsLen { got: self.logits.len(), expected, num_drafts, vocab_size });
        }
        if let Some(q) = self.draft_probs {
            let expected = num_drafts.saturating_mul(vocab_size);
            if q.len() != expected {
                return Err(VerifyError::DraftProbsLen { got: q.len(), expected, num_drafts, vocab_size });
            }
        }
        if let Some((position, &token)) = self.drafts.iter().enumerate().find(|&(_, &t)| t as usize >= vocab_size) {
            return Err(VerifyError::DraftOutOfVocab { position, token, vocab_size });
        }
        Ok(())
    }
}

/// The outcome of one row: `tokens = drafts[..num_accepted] ++ [next]`, or the accepted drafts
/// alone at a dead end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifyOutput {
    /// `n`, the number of drafts verified.
    pub num_drafts: usize,
    /// Drafts accepted, a prefix of the drafts (`0..=n`).
    pub num_accepted: usize,
    /// The tokens to commit, `num_accepted + 1` of them (`num_accepted` at a dead end).
    pub tokens: Vec<u32>,
    /// True when every draft was accepted and the last token is the bonus token; false when
    /// it is the recovered token of the first rejection.
    pub next_is_bonus: bool,
    /// The reasoning phase after committing `tokens` (unchanged without thinking token ids).
    pub in_thinking_after: bool,
    /// Accepted drafts that only the relaxed thinking rule admitted (see
    /// [`RelaxedRule`](super::RelaxedRule)).
    pub num_relaxed_accepted: usize,
    /// The request's allowed tokens, bad words, structured-output guide and the engine's masks
    /// together leave no token at the position after the accepted drafts, so no rule can emit
    /// one there: `tokens` holds the accepted drafts alone, and the request ends after them
    /// unless they finish it (a stop token or string among them ends it normally, as plain
    /// decoding would have stopped before reaching the dead end).
    pub dead_end: bool,
}

impl VerifyOutput {
    /// The token emitted after the accepted drafts (recovered or bonus); `None` at a dead end.
    pub fn next_token(&self) -> Option<u32> {
        self.tokens.get(self.num_accepted).copied()
    }

    /// The verify position the dead end is at (the first after the accepted drafts).
    pub fn dead_end_position(&self) -> Option<usize> {
        self.dead_end.then_some(self.num_accepted)
    }

    /// Per verify position, whether its draft was accepted (`n` flags, a true prefix).
    pub fn accepted_flags(&self) -> impl Iterator<Item = bool> + '_ {
        (0..self.num_drafts).map(|i| i < self.num_accepted)
    }
}

/// A row the verifier cannot walk: one that does not fit it (a bug in the caller, reported
/// instead of read out of bounds), or one whose request masks every token at a position.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum VerifyError {
    #[error(
        "logits hold {got} values; {num_drafts} drafts + 1 bonus position at vocabulary size {vocab_size} need {expected}"
    )]
    LogitsLen { got: usize, expected: usize, num_drafts: usize, vocab_size: usize },
    #[error("draft_probs hold {got} values; {num_drafts} drafts at vocabulary size {vocab_size} need {expected}")]
    DraftProbsLen { got: usize, expected: usize, num_drafts: usize, vocab_size: usize },
    #[error("draft token {token} at position {position} is outside the vocabulary of {vocab_size} tokens")]
    DraftOutOfVocab { position: usize, token: u32, vocab_size: usize },
}
