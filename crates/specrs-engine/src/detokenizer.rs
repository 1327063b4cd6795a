//! Streaming text out of committed tokens: incremental detokenization that never splits a
//! UTF-8 character or a multi-token grapheme across chunks, and the stop conditions checked
//! token by token inside an accepted run (EOS, stop token ids, stop strings, max_tokens), so
//! nothing after a stop is ever emitted.

use serde::{Deserialize, Serialize};
use specrs_core::sampling::SamplingParams;

use crate::error::Result;
use crate::tokenizer::TextTokenizer;

/// Why a request finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// EOS, a stop token id or a stop string.
    Stop,
    /// max_tokens or the model's context length.
    Length,
    /// Cancelled by the client.
    Abort,
    /// The engine failed to run it.
    Error,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Stop => "stop",
            Self::Length => "length",
            Self::Abort => "abort",
            Self::Error => "error",
        }
    }
}

/// Decodes a growing list of token ids into text deltas.
///
/// Keeps two offsets into the ids (as TGI does): text is decoded from `prefix_offset`, and
/// what the tokens up to `read_offset` already produced is subtracted. A delta is released
/// only when it does not end in a replacement character, i.e. when its bytes form whole
/// characters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IncrementalDetokenizer {
    prefix_offset: usize,
    read_offset: usize,
    skip_special_tokens: bool,
}

impl Default for IncrementalDetokenizer {
    /// Skips special tokens, as vLLM's `skip_special_tokens` does by default.
    fn default() -> Self {
        Self::new(true)
    }
}

impl IncrementalDetokenizer {
    pub fn new(skip_special_tokens: bool) -> Self {
        Self { prefix_offset: 0, read_offset: 0, skip_special_tokens }
    }

    /// New text made decodable by `ids[read_offset..]`.
    pub fn step(&mut self, tokenizer: &TextTokenizer, ids: &[u32]) -> Result<String> {
        if ids.len() <= self.read_offset {
            return Ok(String::new());
        }
        let prefix = tokenizer.decode(&ids[self.prefix_offset..self.read_offset], self.skip_special_tokens)?;
        let full = tokenizer.decode(&ids[self.prefix_offset..], self.skip_special_tokens)?;
        if full.len() <= prefix.len() || full.ends_with('\u{FFFD}') {
            return Ok(String::new());
        }
        let delta = match full.strip_prefix(prefix.as_str()) {
            Some(d) => d.to_string(),
            None => {
                // A decoder rewrote earlier text (e.g. a cleanup rule): emit what differs
                // after the longest common prefix, on a character boundary.
                let common = prefix
                    .char_indices()
                    .zip(full.chars())
                    .take_while(|((_, a), b)| a == b)
                    .last()
                    .map_or(0, |((i, c), _)| i + c.len_utf8());
                full[common..].to_string()
            }
        };
        self.prefix_offset = self.read_offset;
        self.read_offset = ids.len();
        Ok(delta)
    }
}

/// What stopped a request that finished with [`FinishReason::Stop`] other than by EOS (vLLM's
/// `stop_reason`): one of its `stop_token_ids`, or one of its `stop` strings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum StopReason {
    Token(u32),
    Text(String),
}

/// The outcome of committing tokens to a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommitOutcome {
    /// How many of the offered tokens were kept (the rest came after a stop).
    pub kept: usize,
    pub finish: Option<FinishReason>,
}

/// Per-request output state: token ids, text, and the stop rules.
#[derive(Debug, Clone)]
pub struct OutputState {
    pub token_ids: Vec<u32>,
    pub text: String,
    /// Bytes of `text` already handed to the client.
    sent: usize,
    detok: IncrementalDetokenizer,
    stop: Vec<String>,
    stop_token_ids: Vec<u32>,
    eos_token_ids: Vec<u32>,
    ignore_eos: bool,
    /// Keep the stop string, or the stop token's text, at the end of the text.
    include_stop: bool,
    max_tokens: usize,
    min_tokens: usize,
    /// Characters held back while streaming, so a stop string split across steps is never
    /// partially emitted.
    holdback: usize,
    stop_reason: Option<StopReason>,
}

impl OutputState {
    pub fn new(params: &SamplingParams, eos_token_ids: &[u32], max_tokens: usize) -> Self {
        let stop: Vec<String> = params.stop.iter().filter(|s| !s.is_empty()).cloned().collect();
        let holdback = stop.iter().map(|s| s.chars().count()).max().unwrap_or(1).saturating_sub(1);
        Self {
            token_ids: Vec::new(),
            text: String::new(),
            sent: 0,
            detok: IncrementalDetokenizer::new(params.skip_special_tokens),
            stop,
            stop_token_ids: params.stop_token_ids.clone(),
            eos_token_ids: eos_token_ids.to_vec(),
            ignore_eos: params.ignore_eos,
            include_stop: params.include_stop_str_in_output,
            max_tokens,
            min_tokens: params.min_tokens,
            holdback,
            stop_reason: None,
        }
    }

    pub fn num_tokens(&self) -> usize {
        self.token_ids.len()
    }

    /// The stop token id or stop string that finished the request (`None` for EOS, a length
    /// limit, or while it runs).
    pub fn stop_reason(&self) -> Option<&StopReason> {
        self.stop_reason.as_ref()
    }

    /// Tokens still allowed before max_tokens.
    pub fn remaining(&self) -> usize {
        self.max_tokens.saturating_sub(self.token_ids.len())
    }

    /// Commits tokens in order, stopping at the first stop condition.
    pub fn commit(&mut self, tokenizer: &TextTokenizer, tokens: &[u32]) -> Result<CommitOutcome> {
        for (i, &t) in tokens.iter().enumerate() {
            self.token_ids.push(t);
            let may_stop = self.token_ids.len() > self.min_tokens;
            let is_eos = !self.ignore_eos && self.eos_token_ids.contains(&t);
            if may_stop && (is_eos || self.stop_token_ids.contains(&t)) {
                // EOS stops without a reason, as vLLM reports it, even when also listed.
                self.stop_reason = (!is_eos).then_some(StopReason::Token(t));
                if self.include_stop {
                    let delta = self.detok.step(tokenizer, &self.token_ids)?;
                    self.text.push_str(&delta);
                }
                return Ok(CommitOutcome { kept: i + 1, finish: Some(FinishReason::Stop) });
            }
            let before = self.text.len();
            let delta = self.detok.step(tokenizer, &self.token_ids)?;
            self.text.push_str(&delta);
            if may_stop && !self.stop.is_empty() && self.truncate_at_stop_string(before) {
                return Ok(CommitOutcome { kept: i + 1, finish: Some(FinishReason::Stop) });
            }
            if self.token_ids.len() >= self.max_tokens {
                return Ok(CommitOutcome { kept: i + 1, finish: Some(FinishReason::Length) });
            }
        }
        Ok(CommitOutcome { kept: tokens.len(), finish: None })
    }

    /// Looks for a stop string that ends in the text added since byte `before`; truncates
    /// the text where the first such match starts (or, with `include_stop`, where it ends).
    fn truncate_at_stop_string(&mut self, before: usize) -> bool {
        let mut cut: Option<(usize, usize, &String)> = None;
        for s in &self.stop {
            // A match must end inside the new text: it starts after `before - len(s)`. One
            // ending at `before` lies in text checked earlier, or passed under `min_tokens`, and
            // part of it has been sent.
            let mut from = (before + 1).saturating_sub(s.len()).min(self.text.len());
            while !self.text.is_char_boundary(from) {
                from += 1;
            }
            if let Some(p) = self.text[from..].find(s.as_str()) {
                let at = from + p;
                if cut.is_none_or(|(start, _, _)| at < start) {
                    cut = Some((at, at + s.len(), s));
                }
            }
        }
        match cut {
            Some((start, end, stop)) => {
                self.stop_reason = Some(StopReason::Text(stop.clone()));
                let at = if self.include_stop { end } else { start };
                self.text.truncate(at);
                self.sent = self.sent.min(at);
                true
            }
            None => false,
        }
    }

    /// Text not yet handed out. While the request runs, the last characters that could begin
    /// a stop string are held back.
    pub fn take_delta(&mut self, finished: bool) -> String {
        let mut end = self.text.len();
        if !finished && self.holdback > 0 {
            let chars: Vec<usize> = self.text.char_indices().map(|(i, _)| i).collect();
            end = if chars.len() > self.holdback { chars[chars.len() - self.holdback] } else { 0 };
        }
        if end <= self.sent {
            return String::new();
        }
        let delta = self.text[self.sent..end].to_string();
        self.sent = end;
        delta
    }
}
