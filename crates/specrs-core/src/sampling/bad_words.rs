//! vLLM's `bad_words`: token sequences the output never contains.
//!
//! A word of one token is banned at every position; a longer one bans its last token wherever
//! the output so far ends with the rest of it. Only the output counts (a word begun in the
//! prompt is not completed against), as in vLLM. During verification the output includes the
//! drafts before the position being verified, so a draft that would complete a word is
//! rejected exactly where plain decoding would never have sampled it.

/// The token sequences of bad `words` for a tokenizer (`encode` without special tokens): each
/// word as written, leading spaces dropped, and with one leading space (how it reads
/// mid-sentence), as vLLM tokenizes them; a sequence both spellings give is kept once.
pub fn bad_word_token_ids<E>(
    words: &[String],
    mut encode: impl FnMut(&str) -> Result<Vec<u32>, E>,
) -> Result<Vec<Vec<u32>>, E> {
    let mut sequences: Vec<Vec<u32>> = Vec::new();
    // A set, not a scan of the list: long lists must not take quadratic time.
    let mut seen: std::collections::HashSet<Vec<u32>> = std::collections::HashSet::new();
    for word in words {
        let bare = word.trim_start();
        for spelling in [bare.to_string(), format!(" {bare}")] {
            let ids = encode(&spelling)?;
            if !ids.is_empty() && seen.insert(ids.clone()) {
                sequences.push(ids);
            }
        }
    }
    Ok(sequences)
}

/// The latest output tokens, as many as the longest bad word needs to be recognised.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OutputTail {
    tokens: Vec<u32>,
    keep: usize,
}

impl OutputTail {
    /// The tail of `output` that `bad_words` can match against.
    pub fn new(output: &[u32], bad_words: &[Vec<u32>]) -> Self {
        let keep = bad_words.iter().map(|w| w.len().saturating_sub(1)).max().unwrap_or(0);
        Self { tokens: output[output.len().saturating_sub(keep)..].to_vec(), keep }
    }

    /// One more output token (a draft accepted during the walk).
    pub fn push(&mut self, token: u32) {
        if self.keep == 0 {
            return;
        }
        if self.tokens.len() == self.keep {
            self.tokens.remove(0);
        }
        self.tokens.push(token);
    }

    /// Sets to `-inf` the logit of every token that would complete one of `bad_words` after
    /// the output so far. Tokens outside the row are ignored.
    pub fn ban_completions(&self, logits: &mut [f32], bad_words: &[Vec<u32>]) {
        for word in bad_words {
            let Some((&last, before)) = word.split_last() else { continue };
            if self.tokens.ends_with(before)
                && let Some(logit) = logits.get_mut(last as usize)
            {
                *logit = f32::NEG_INFINITY;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_word_is_tokenized_as_written_and_after_a_space_each_sequence_once() {
        let words = vec!["  cat".to_string(), "dog".to_string()];
        let encode = |s: &str| -> Result<Vec<u32>, ()> {
            Ok(match s {
                "cat" => vec![1],
                " cat" => vec![2],
                "dog" | " dog" => vec![3, 4],
                _ => unreachable!("{s:?}"),
            })
        };
        assert_eq!(bad_word_token_ids(&words, encode), Ok(vec![vec![1], vec![2], vec![3, 4]]));
        assert_eq!(bad_word_token_ids(&words, |_| Err("no tokenizer")), Err("no tokenizer"));
    }

    #[test]
    fn one_token_words_are_banned_everywhere_longer_ones_only_after_their_start() {
        let words = vec![vec![5], vec![1, 2, 3]];
        let banned = |output: &[u32]| {
            let mut logits = [0.0f32; 8];
            OutputTail::new(output, &words).ban_completions(&mut logits, &words);
            (0..8u32).filter(|&t| logits[t as usize] == f32::NEG_INFINITY).collect::<Vec<_>>()
        };
        assert_eq!(banned(&[]), [5]);
        assert_eq!(banned(&[1]), [5]);
        assert_eq!(banned(&[9, 1, 2]), [3, 5]);
        assert_eq!(banned(&[1, 2, 7]), [5]);
    }

    #[test]
    fn the_tail_follows_accepted_drafts_and_keeps_only_what_matching_needs() {
        let words = vec![vec![1, 2, 3]];
        let mut tail = OutputTail::new(&[4, 4, 4, 1], &words);
        assert_eq!(tail.tokens, [4, 1]);
        tail.push(2);
        assert_eq!(tail.tokens, [1, 2]);
        let mut logits = [0.0f32; 4];
        tail.ban_completions(&mut logits, &words);
        assert_eq!(logits[3], f32::NEG_INFINITY);
        tail.push(3);
        let mut logits = [0.0f32; 4];
        tail.ban_completions(&mut logits, &words);
        assert_eq!(logits, [0.0; 4], "after [2, 3] nothing completes [1, 2, 3]");
    }
}
