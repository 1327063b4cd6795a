//! Repetition, frequency and presence penalties (vLLM / OpenAI semantics).
//!
//! - repetition (`r`): every token seen in the prompt or the output has its logit divided by
//!   `r` when positive and multiplied by `r` otherwise (CTRL, Keskar et al. 2019);
//! - frequency (`f`): `logit -= f · count`, count = occurrences in the output;
//! - presence (`p`): `logit -= p` once for every token that occurs in the output.
//!
//! Repetition is applied first, then the additive penalties, as vLLM does. "Output" is every
//! generated token, and during verification also the drafts before the position being
//! verified: position `i` is judged as if `drafts[..i]` had been committed, because that is
//! exactly what accepting them means.
//!
//! The context stores one entry per distinct token, so applying it costs O(distinct history)
//! per position instead of O(V).

use super::bad_words::OutputTail;
use super::params::SamplingParams;
use crate::structured::GuideCursor;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct TokenOccurrences {
    token: u32,
    in_prompt: bool,
    output_count: u32,
}

/// Occurrence counts of one request's tokens, sorted by token id, the output's latest
/// tokens for its bad words, and where the output is in its structured-output guide.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PenaltyContext {
    entries: Vec<TokenOccurrences>,
    tail: OutputTail,
    guide: Option<GuideCursor>,
}

impl PenaltyContext {
    /// Counts `history = prompt ++ output`; the first `prompt_len` tokens are the prompt
    /// (clamped to the history length).
    pub fn new(history: &[u32], prompt_len: usize) -> Self {
        let prompt_len = prompt_len.min(history.len());
        // (token, is_output) sorts each token's prompt occurrences before its output ones.
        let mut tagged: Vec<(u32, bool)> = history.iter().enumerate().map(|(i, &t)| (t, i >= prompt_len)).collect();
        tagged.sort_unstable();
        let mut entries: Vec<TokenOccurrences> = Vec::new();
        for (token, is_output) in tagged {
            match entries.last_mut() {
                Some(last) if last.token == token => last.output_count += u32::from(is_output),
                _ => {
                    entries.push(TokenOccurrences { token, in_prompt: !is_output, output_count: u32::from(is_output) })
                }
            }
        }
        Self { entries, tail: OutputTail::default(), guide: None }
    }

    /// What `params` needs of `history = prompt ++ output`: occurrence counts when it has
    /// penalties, the output's tail when it has bad words, the guide's state after the output
    /// when it has structured outputs, nothing otherwise.
    pub fn for_params(history: &[u32], prompt_len: usize, params: &SamplingParams) -> Self {
        let mut ctx = if params.has_penalties() { Self::new(history, prompt_len) } else { Self::default() };
        let output = &history[prompt_len.min(history.len())..];
        if !params.bad_word_ids.is_empty() {
            ctx.tail = OutputTail::new(output, &params.bad_word_ids);
        }
        let prompt = &history[..prompt_len.min(history.len())];
        ctx.guide = params.guide.as_ref().map(|guide| GuideCursor::after(guide, prompt, output));
        ctx
    }

    /// Counts one more output token (a draft accepted during the walk).
    pub fn record_output(&mut self, token: u32) {
        self.tail.push(token);
        if let Some(guide) = &mut self.guide {
            guide.push(token);
        }
        match self.entries.binary_search_by_key(&token, |e| e.token) {
            Ok(i) => self.entries[i].output_count += 1,
            Err(i) => self.entries.insert(i, TokenOccurrences { token, in_prompt: false, output_count: 1 }),
        }
    }

    /// Occurrences of `token` in the output so far.
    pub fn output_count(&self, token: u32) -> u32 {
        self.entries.binary_search_by_key(&token, |e| e.token).map_or(0, |i| self.entries[i].output_count)
    }

    /// Applies the three penalties of `params`, then its bad words, then its guide's mask to
    /// one position's logits (`[V]`). Tokens outside the row are ignored.
    pub fn apply(&self, logits: &mut [f32], params: &SamplingParams) {
        self.apply_penalties(logits, params);
        self.tail.ban_completions(logits, &params.bad_word_ids);
        if let Some(guide) = &self.guide {
            guide.mask_logits(logits);
        }
    }

    fn apply_penalties(&self, logits: &mut [f32], params: &SamplingParams) {
        let repetition = params.repetition_penalty;
        let frequency = params.frequency_penalty;
        let presence = params.presence_penalty;
        for e in &self.entries {
            let Some(logit) = logits.get_mut(e.token as usize) else {
                continue;
            };
            let in_output = e.output_count > 0;
            if repetition != 1.0 && (e.in_prompt || in_output) {
                *logit = if *logit > 0.0 { *logit / repetition } else { *logit * repetition };
            }
            if in_output {
                *logit -= frequency * e.output_count as f32 + presence;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(repetition: f32, frequency: f32, presence: f32) -> SamplingParams {
        SamplingParams {
            repetition_penalty: repetition,
            frequency_penalty: frequency,
            presence_penalty: presence,
            ..Default::default()
        }
    }

    #[test]
    fn counts_output_occurrences_only_after_the_prompt() {
        let mut ctx = PenaltyContext::new(&[5, 5, 2, 5, 7, 7], 3);
        assert_eq!(ctx.output_count(5), 1);
        assert_eq!(ctx.output_count(7), 2);
        assert_eq!(ctx.output_count(2), 0);
        ctx.record_output(2);
        ctx.record_output(9);
        assert_eq!(ctx.output_count(2), 1);
        assert_eq!(ctx.output_count(9), 1);
        // A prompt length past the history treats everything as prompt.
        assert_eq!(PenaltyContext::new(&[1, 1], 10).output_count(1), 0);
    }

    #[test]
    fn frequency_and_presence_subtract_per_count_and_once() {
        // Output: token 1 twice, token 2 once; token 3 only in the prompt.
        let ctx = PenaltyContext::new(&[3, 1, 2, 1], 1);
        let mut logits = [1.0f32, 1.0, 1.0, 1.0];
        ctx.apply(&mut logits, &params(1.0, 0.25, 0.5));
        assert_eq!(logits, [1.0, 1.0 - 0.5 - 0.5, 1.0 - 0.25 - 0.5, 1.0]);
    }

    #[test]
    fn repetition_divides_positive_and_multiplies_negative_logits_of_prompt_and_output() {
        let ctx = PenaltyContext::new(&[0, 1, 2], 2);
        let mut logits = [2.0f32, -2.0, 4.0, 4.0];
        ctx.apply(&mut logits, &params(2.0, 0.0, 0.0));
        assert_eq!(logits, [1.0, -4.0, 2.0, 4.0]);
    }

    #[test]
    fn repetition_applies_before_the_additive_penalties() {
        let ctx = PenaltyContext::new(&[0], 0);
        let mut logits = [3.0f32];
        ctx.apply(&mut logits, &params(2.0, 1.0, 0.5));
        assert_eq!(logits, [3.0 / 2.0 - 1.0 - 0.5]);
    }

    #[test]
    fn tokens_outside_the_row_are_ignored() {
        let ctx = PenaltyContext::new(&[100], 0);
        let mut logits = [1.0f32; 4];
        ctx.apply(&mut logits, &params(2.0, 1.0, 1.0));
        assert_eq!(logits, [1.0; 4]);
    }
}
