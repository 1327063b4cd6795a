//! The n-gram (prompt lookup) proposer: drafts by copying what followed the context's suffix
//! the last time it appeared.
//!
//! Summaries, code edits and RAG answers repeat long spans of their prompt; when the last few
//! tokens occurred earlier, the tokens that followed them then are a free and often correct
//! guess. No weights, no KV cache, works with any target.
//!
//! Contract of [`NgramProposer::propose`] on a context of `len` tokens:
//! - For `n` from `max_n` down to `min_n` (the longest match wins), the pattern is the last
//!   `n` tokens. An *occurrence* is a start `i` with `tokens[i..i + n] == pattern` and
//!   `i + n <= len - 1`, i.e. it is not the suffix itself and at least one token follows it.
//!   An occurrence may overlap the suffix (that is how runs like `a b a b a b` continue).
//! - Among the occurrences of the chosen `n`, the most recent (largest `i`) wins: recent text
//!   predicts the continuation better than text far back in the prompt.
//! - The proposal is `tokens[i + n..]`, cut to `num_speculative_tokens`; shorter when the
//!   context ends first. No occurrence for any `n` gives an empty proposal.
//!
//! Cost: one backward scan over candidate end positions, comparing each candidate with the
//! suffix last token first, so a mismatch usually costs one comparison. That is O(len) per
//! call in practice and O(len * max_n) in the worst case, with no allocation besides the
//! proposal; all `n` are served by the same scan, which stops at the first (most recent)
//! match of length `max_n`. Measured on a 32k-token context (release build, shared 2-core
//! machine): 10-40 us per call on varied text, 55-115 us when nearly every token equals the
//! last one. That is negligible next to a target forward, so no incremental index is kept.

use crate::config::SpeculativeConfig;
use crate::error::ConfigError;

/// Proposes draft tokens by prompt lookup. See the module docs for the exact contract.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NgramProposer {
    min_n: usize,
    max_n: usize,
    num_speculative_tokens: usize,
}

/// Where the chosen n-gram occurred: `tokens[start..start + n]` equals the last `n` tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NgramMatch {
    pub start: usize,
    pub n: usize,
}

impl NgramMatch {
    /// Index of the first token that followed the occurrence.
    pub fn continuation_start(&self) -> usize {
        self.start + self.n
    }
}

impl NgramProposer {
    /// Requires `1 <= min_n <= max_n` and `num_speculative_tokens >= 1`.
    pub fn new(min_n: usize, max_n: usize, num_speculative_tokens: usize) -> Result<Self, ConfigError> {
        if min_n < 1 || max_n < min_n {
            return Err(ConfigError::field(
                "prompt_lookup_min",
                format!(
                    "prompt_lookup_min and prompt_lookup_max must satisfy 1 <= min <= max, got min={min_n} max={max_n}"
                ),
            ));
        }
        if num_speculative_tokens < 1 {
            return Err(ConfigError::field(
                "num_speculative_tokens",
                "the ngram method needs num_speculative_tokens >= 1",
            ));
        }
        Ok(Self { min_n, max_n, num_speculative_tokens })
    }

    /// The proposer a validated `ngram` configuration describes.
    pub fn from_config(config: &SpeculativeConfig) -> Result<Self, ConfigError> {
        let to_usize = |field: &str, value: i64| {
            usize::try_from(value).map_err(|_| ConfigError::field(field, format!("{field} must be >= 1, got {value}")))
        };
        Self::new(
            to_usize("prompt_lookup_min", config.prompt_lookup_min)?,
            to_usize("prompt_lookup_max", config.prompt_lookup_max)?,
            config.draft_width()?,
        )
    }

    pub fn min_n(&self) -> usize {
        self.min_n
    }

    pub fn max_n(&self) -> usize {
        self.max_n
    }

    pub fn num_speculative_tokens(&self) -> usize {
        self.num_speculative_tokens
    }

    /// Up to `num_speculative_tokens` drafts copied from after the best match; empty when the
    /// suffix never occurred before.
    pub fn propose(&self, tokens: &[u32]) -> Vec<u32> {
        self.longest_match(tokens).map_or_else(Vec::new, |found| {
            let from = found.continuation_start();
            let to = (from + self.num_speculative_tokens).min(tokens.len());
            tokens[from..to].to_vec()
        })
    }

    /// The longest (then most recent) earlier occurrence of a suffix n-gram with
    /// `min_n <= n <= max_n`, if any.
    pub fn longest_match(&self, tokens: &[u32]) -> Option<NgramMatch> {
        let len = tokens.len();
        // An occurrence ends at index <= len - 2 and starts at >= 0, so n <= len - 1.
        let widest = self.max_n.min(len.checked_sub(1)?);
        if widest < self.min_n {
            return None;
        }
        let suffix = &tokens[len - widest..];
        let mut best: Option<NgramMatch> = None;
        // Scanning from the most recent end, the first candidate reaching a length is the most
        // recent occurrence of that length, so only strictly longer matches replace `best`.
        let last = tokens[len - 1];
        for end in (0..len - 1).rev() {
            // The common case, kept to one comparison: the candidate's last token differs.
            if tokens[end] != last {
                continue;
            }
            let matched = common_suffix_len(&tokens[..=end], suffix);
            if matched >= self.min_n && best.is_none_or(|b| matched > b.n) {
                best = Some(NgramMatch { start: end + 1 - matched, n: matched });
                if matched == widest {
                    break;
                }
            }
        }
        best
    }
}

/// Length of the longest common suffix of `a` and `b`, compared from the back so a mismatch
/// on the last token costs one comparison.
fn common_suffix_len(a: &[u32], b: &[u32]) -> usize {
    a.iter().rev().zip(b.iter().rev()).take_while(|(x, y)| x == y).count()
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::config::SpeculativeMethod;

    fn proposer(min_n: usize, max_n: usize, k: usize) -> NgramProposer {
        NgramProposer::new(min_n, max_n, k).unwrap()
    }

    /// The contract stated literally: every n from longest, every start from most recent.
    fn reference_match(p: &NgramProposer, tokens: &[u32]) -> Option<NgramMatch> {
        let len = tokens.len();
        for n in (p.min_n..=p.max_n).rev() {
            if len < n + 1 {
                continue;
            }
            let pattern = &tokens[len - n..];
            if let Some(start) = (0..=len - 1 - n).rev().find(|&i| &tokens[i..i + n] == pattern) {
                return Some(NgramMatch { start, n });
            }
        }
        None
    }

    #[test]
    fn new_validates_bounds_and_width() {
        assert!(NgramProposer::new(1, 1, 1).is_ok());
        let err = NgramProposer::new(0, 3, 4).unwrap_err();
        assert_eq!(err.field.as_deref(), Some("prompt_lookup_min"));
        assert!(err.message.contains("1 <= min <= max, got min=0 max=3"));
        assert!(NgramProposer::new(3, 2, 4).is_err());
        let err = NgramProposer::new(2, 4, 0).unwrap_err();
        assert_eq!(err.field.as_deref(), Some("num_speculative_tokens"));
    }

    #[test]
    fn from_config_reads_lookup_bounds_and_draft_width() {
        let config = SpeculativeConfig {
            speculative_method: Some(SpeculativeMethod::Ngram),
            num_speculative_tokens: Some(5),
            prompt_lookup_min: 1,
            prompt_lookup_max: 3,
            ..SpeculativeConfig::default()
        };
        assert_eq!(NgramProposer::from_config(&config), Ok(proposer(1, 3, 5)));
        let negative = SpeculativeConfig { prompt_lookup_min: -1, ..config };
        assert!(NgramProposer::from_config(&negative).is_err());
    }

    #[test]
    fn copies_the_tokens_that_followed_the_suffix() {
        // 1 2 3 [4 5 6 7] 9 ... 2 3 -> "2 3" was followed by 4 5 6.
        let tokens = [1, 2, 3, 4, 5, 6, 7, 9, 2, 3];
        assert_eq!(proposer(2, 2, 3).propose(&tokens), vec![4, 5, 6]);
    }

    #[test]
    fn longest_match_is_preferred_over_a_more_recent_shorter_one() {
        // "7 8 9" occurred at 0 (followed by 1 2); only "8 9" occurred at 5 (followed by 3).
        let tokens = [7, 8, 9, 1, 2, 8, 9, 3, 7, 8, 9];
        let p = proposer(2, 3, 2);
        assert_eq!(p.longest_match(&tokens), Some(NgramMatch { start: 0, n: 3 }));
        assert_eq!(p.propose(&tokens), vec![1, 2]);
        // Capping n at 2 makes the recent "8 9" win instead.
        assert_eq!(proposer(2, 2, 2).propose(&tokens), vec![3, 7]);
    }

    #[test]
    fn most_recent_occurrence_is_preferred() {
        let tokens = [5, 6, 1, 5, 6, 2, 5, 6];
        assert_eq!(proposer(2, 2, 1).longest_match(&tokens), Some(NgramMatch { start: 3, n: 2 }));
        assert_eq!(proposer(2, 2, 1).propose(&tokens), vec![2]);
    }

    #[test]
    fn proposal_is_cut_where_the_context_ends() {
        // The most recent "1 2" is followed only by 3 and the suffix itself.
        let tokens = [1, 2, 3, 1, 2];
        assert_eq!(proposer(2, 2, 5).propose(&tokens), vec![3, 1, 2]);
        // An occurrence overlapping the suffix: a a a -> pattern "a a" at 0, one token follows.
        assert_eq!(proposer(2, 2, 4).propose(&[4, 4, 4]), vec![4]);
    }

    #[test]
    fn no_match_or_too_short_context_proposes_nothing() {
        let p = proposer(2, 4, 3);
        assert!(p.propose(&[]).is_empty());
        assert!(p.propose(&[1]).is_empty());
        assert!(p.propose(&[1, 1]).is_empty(), "the suffix itself is not an occurrence");
        assert!(p.propose(&[1, 2, 3, 4, 5, 6]).is_empty());
    }

    #[test]
    fn matches_shorter_than_min_n_are_ignored() {
        // Only the 1-gram "9" repeats (followed by 4).
        let tokens = [9, 4, 1, 2, 9];
        assert!(proposer(2, 3, 2).propose(&tokens).is_empty());
        assert_eq!(proposer(1, 3, 2).propose(&tokens), vec![4, 1]);
    }

    #[test]
    fn code_edit_copies_the_original_code_around_the_edit() {
        // Prompt: the original function, then an instruction token (99) to rename x to y.
        //            def  f   (   x   )   :  total =   x   +   1   ; return total  ;
        let prompt = [10, 11, 12, 13, 14, 15, 20, 21, 13, 22, 23, 24, 30, 20, 24, 99];
        let p = proposer(2, 4, 4);
        let context = |answer: &[u32]| -> Vec<u32> { prompt.iter().chain(answer).copied().collect() };

        // Answer so far "def f (": lookup copies the old parameter list, including the old
        // name, which the target will reject as its first token.
        assert_eq!(p.propose(&context(&[10, 11, 12])), vec![13, 14, 15, 20]);
        // After the edited name, ") :" re-synchronises with the original: copy the body.
        assert_eq!(p.propose(&context(&[10, 11, 12, 16, 14, 15])), vec![20, 21, 13, 22]);
        // Deep in the copied tail "+ 1 ; return" (a 4-gram) the rest of the line follows.
        let tail = context(&[10, 11, 12, 16, 14, 15, 20, 21, 16, 22, 23, 24, 30]);
        assert_eq!(p.longest_match(&tail), Some(NgramMatch { start: 9, n: 4 }));
        assert_eq!(p.propose(&tail), vec![20, 24, 99, 10]);
    }

    #[test]
    fn long_context_scan_finds_a_distant_match() {
        let mut tokens: Vec<u32> = (0..32_768).map(|i| 1000 + i % 30_000).collect();
        tokens.extend([1000, 1001, 1002]);
        assert_eq!(proposer(2, 4, 3).longest_match(&tokens), Some(NgramMatch { start: 30_000, n: 3 }));
        assert_eq!(proposer(2, 4, 3).propose(&tokens), vec![1003, 1004, 1005]);
    }

    proptest! {
        #[test]
        fn single_scan_agrees_with_the_literal_contract(
            tokens in proptest::collection::vec(0u32..4, 0..40),
            min_n in 1usize..4,
            extra in 0usize..3,
            k in 1usize..6,
        ) {
            let p = proposer(min_n, min_n + extra, k);
            let expected = reference_match(&p, &tokens);
            prop_assert_eq!(p.longest_match(&tokens), expected);
            let proposal = p.propose(&tokens);
            prop_assert!(proposal.len() <= k);
            if let Some(found) = expected {
                let from = found.continuation_start();
                prop_assert_eq!(&proposal[..], &tokens[from..(from + k).min(tokens.len())]);
            } else {
                prop_assert!(proposal.is_empty());
            }
        }
    }
}
