//! One request inside the engine.

use std::time::Instant;

use specrs_core::kv_blocks::SeqId;
use specrs_core::metrics::SpecDecodeStats;
use specrs_core::prefix_cache::BlockHasher;
use specrs_core::sampling::SamplingParams;

use crate::detokenizer::FinishReason;
use crate::detokenizer::OutputState;
use crate::proposer::DraftProbs;
use crate::request::{OutputSink, RequestFailure, RequestMetrics, RequestOutput, TokenLogprob, TraceStep};

/// One choice of a request: a request with `n` choices runs as `n` sequences.
pub struct Sequence {
    pub id: SeqId,
    /// The request this choice belongs to: the id its outputs carry and aborts name.
    pub request_id: SeqId,
    /// The choice's index among the request's `n`.
    pub index: usize,
    /// Prompt followed by every committed output token.
    pub tokens: Vec<u32>,
    pub prompt_len: usize,
    pub params: SamplingParams,
    /// The request's seed; each step uses `seed + tokens.len()`.
    pub seed: u64,
    pub output: OutputState,
    /// Drafts to verify next step, with their distributions for rejection sampling.
    pub drafts: Vec<u32>,
    pub draft_probs: Option<DraftProbs>,
    /// Inside a reasoning span (relaxed acceptance for thinking).
    pub in_thinking: bool,
    pub stats: SpecDecodeStats,
    pub trace: Option<Vec<TraceStep>>,
    pub pending_logprobs: Vec<TokenLogprob>,
    /// Prompt logprobs computed so far (`prompt_logprobs`), sent with the first output.
    pub pending_prompt_logprobs: Vec<Option<TokenLogprob>>,
    /// Prompt positions given a prompt logprob so far: a request preempted and prefilled
    /// again (with its output) must not score its prompt twice, nor score its output.
    pub prompt_scored: usize,
    pub sink: OutputSink,
    pub arrival: Instant,
    pub first_token: Option<Instant>,
    /// Tokens of `output.token_ids` not yet sent.
    pub unsent_from: usize,
    /// The prompt's token ids went out with an output.
    pub prompt_sent: bool,
    /// Prefix-cache keys of the blocks `tokens` completes (with prefix caching on).
    pub block_hasher: BlockHasher,
    /// Prompt tokens the prefix cache covered when the sequence was first admitted.
    pub num_cached_tokens: Option<usize>,
}

impl Sequence {
    /// The seed of the step starting at the next position: the request's generator advanced
    /// by the committed tokens, so position `p` of the sequence always draws counter `p` of one
    /// SplitMix64 sequence (`seed + p·γ`) however the steps around it are cut, so with argmax
    /// drafts a seeded request samples what plain decoding samples at any width or batch.
    pub fn step_seed(&self) -> u64 {
        self.seed.wrapping_add((self.tokens.len() as u64).wrapping_mul(specrs_core::sampling::GOLDEN_GAMMA))
    }

    pub fn num_generated(&self) -> usize {
        self.tokens.len() - self.prompt_len
    }

    /// Sends what was committed since the last send; `last_choice` marks the final piece of
    /// the request's last running choice. Returns false when the client is gone.
    pub fn send(&mut self, finish: Option<FinishReason>, error: Option<RequestFailure>, last_choice: bool) -> bool {
        let finished = finish.is_some();
        let token_ids = self.output.token_ids[self.unsent_from..].to_vec();
        self.unsent_from = self.output.token_ids.len();
        let text = self.output.take_delta(finished);
        let metrics = finished.then(|| self.metrics());
        let out = RequestOutput {
            request_id: self.request_id,
            index: self.index,
            finished: finished && last_choice,
            token_ids,
            text,
            logprobs: std::mem::take(&mut self.pending_logprobs),
            prompt_logprobs: std::mem::take(&mut self.pending_prompt_logprobs),
            prompt_token_ids: if self.prompt_sent { Vec::new() } else { self.tokens[..self.prompt_len].to_vec() },
            trace: self.trace.as_mut().map(std::mem::take).unwrap_or_default(),
            finish_reason: finish,
            stop_reason: if finished { self.output.stop_reason().cloned() } else { None },
            metrics,
            error,
            num_prompt_tokens: self.prompt_len,
        };
        if !finished && out.token_ids.is_empty() && out.text.is_empty() {
            // Nothing to say yet: keep the prompt logprobs for the first real output.
            self.pending_prompt_logprobs = out.prompt_logprobs;
            return !self.sink.is_closed();
        }
        self.prompt_sent = true;
        self.sink.send(out).is_ok()
    }

    pub fn metrics(&self) -> RequestMetrics {
        let s = &self.stats;
        RequestMetrics {
            num_drafts: s.num_drafts,
            num_draft_tokens: s.num_draft_tokens,
            num_accepted_tokens: s.num_accepted_tokens,
            accepted_per_position: s.accepted_per_position.clone(),
            acceptance_length: s.mean_acceptance_length().unwrap_or(1.0),
            num_prompt_tokens: self.prompt_len,
            num_cached_tokens: self.num_cached_tokens.unwrap_or(0),
            num_generated_tokens: self.output.num_tokens(),
            time_to_first_token: self.first_token.map(|t| t.duration_since(self.arrival).as_secs_f64()),
            latency: self.arrival.elapsed().as_secs_f64(),
        }
    }
}
