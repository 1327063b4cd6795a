//! The reasoning phase ("thinking") of a request, advanced token by token in commit order.
//!
//! A committed start id (`<think>`) enters the phase and an end id (`</think>`) leaves it.
//! Verification advances the phase over the accepted drafts of the step as it walks, so a
//! `</think>` accepted at position `i` ends relaxed acceptance from position `i + 1` on, in
//! the same step (TensorRT-LLM only flips at the next step).

/// The token ids that open and close a reasoning span, from the tokenizer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThinkingTokens {
    pub start: u32,
    pub end: u32,
}

impl ThinkingTokens {
    /// The phase after committing `token` while in phase `in_thinking`.
    pub fn after(self, in_thinking: bool, token: u32) -> bool {
        if token == self.start {
            true
        } else if token == self.end {
            false
        } else {
            in_thinking
        }
    }

    /// The phase after committing `tokens` in order.
    pub fn after_all(self, in_thinking: bool, tokens: &[u32]) -> bool {
        tokens.iter().fold(in_thinking, |phase, &t| self.after(phase, t))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_enters_end_leaves_and_the_last_marker_wins() {
        let t = ThinkingTokens { start: 7, end: 8 };
        assert!(t.after(false, 7));
        assert!(!t.after(true, 8));
        assert!(t.after(true, 3));
        assert!(!t.after_all(false, &[1, 7, 2, 8, 4]));
        assert!(t.after_all(true, &[8, 7]));
        assert!(t.after_all(true, &[]));
    }
}
