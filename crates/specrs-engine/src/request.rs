//! What a client submits and what it receives back.

use std::time::Instant;

use serde::{Deserialize, Serialize};
use specrs_core::sampling::SamplingParams;

use crate::chat_template::Conversation;
use crate::detokenizer::{FinishReason, StopReason};

pub type RequestId = u64;

/// The prompt of a request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Prompt {
    /// Text encoded as-is (no chat template).
    Text(String),
    /// Token ids.
    Tokens(Vec<u32>),
    /// Messages rendered with the model's chat template, ending as the conversation says (a
    /// new assistant turn unless told otherwise; `Vec<ChatMessage>` converts with `.into()`).
    Chat(Conversation),
}

/// A generation request.
#[derive(Debug, Clone)]
pub struct GenerationRequest {
    pub prompt: Prompt,
    pub params: SamplingParams,
    /// Record a per-step draft trace (drafted tokens, target tokens, accepted count).
    pub trace: bool,
}

impl GenerationRequest {
    pub fn new(prompt: Prompt, params: SamplingParams) -> Self {
        Self { prompt, params, trace: false }
    }
}

/// Log probabilities of one emitted token, from the raw target logits.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenLogprob {
    pub token: u32,
    pub logprob: f32,
    /// The token's 1-based rank in the distribution (1: the most likely), vLLM's
    /// `Logprob.rank`.
    pub rank: usize,
    /// The `n` most likely tokens at that position, most likely first.
    pub top: Vec<(u32, f32)>,
}

/// One verify step of one request, for diagnosing drafters: what was drafted, what the
/// target chose at those positions (its argmax), and how many drafts were accepted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceStep {
    /// Position (index into prompt + output) of the first drafted token.
    pub position: usize,
    pub drafted: Vec<u32>,
    /// Target argmax at each drafted position and at the bonus position (`drafted.len() + 1`).
    pub target: Vec<u32>,
    pub num_accepted: usize,
}

/// Speculative-decoding statistics of one request.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RequestMetrics {
    /// Verify steps that carried at least one draft.
    pub num_drafts: u64,
    pub num_draft_tokens: u64,
    pub num_accepted_tokens: u64,
    /// `accepted_per_position[i]`: steps that accepted at least `i + 1` drafts.
    pub accepted_per_position: Vec<u64>,
    /// Mean committed tokens per verify step with drafts (accepted + 1).
    pub acceptance_length: f64,
    pub num_prompt_tokens: usize,
    /// Prompt tokens whose KV came from the prefix cache (vLLM's `num_cached_tokens`).
    pub num_cached_tokens: usize,
    pub num_generated_tokens: usize,
    /// Seconds from arrival to the first generated token.
    pub time_to_first_token: Option<f64>,
    /// Seconds from arrival to finish.
    pub latency: f64,
}

/// A streamed piece of one choice of a request's output. A choice's last piece carries its
/// `finish_reason`; the request's last piece (every choice finished) has `finished` set.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RequestOutput {
    pub request_id: RequestId,
    /// Which of the request's `n` choices this piece belongs to (vLLM's
    /// `CompletionOutput.index`); always 0 with `n = 1`.
    pub index: usize,
    /// Every choice of the request has finished: nothing more comes on the stream.
    pub finished: bool,
    /// Tokens committed since the previous output.
    pub token_ids: Vec<u32>,
    /// Text decoded since the previous output (never a split character).
    pub text: String,
    pub logprobs: Vec<TokenLogprob>,
    /// With `prompt_logprobs`: one entry per prompt token (`None` for the first, which has no
    /// context), in the first output.
    pub prompt_logprobs: Vec<Option<TokenLogprob>>,
    /// The prompt as the engine tokenized it (vLLM's `prompt_token_ids`), in each choice's
    /// first output.
    pub prompt_token_ids: Vec<u32>,
    pub trace: Vec<TraceStep>,
    pub finish_reason: Option<FinishReason>,
    /// With the finish reason: the stop token id or stop string that ended the choice (vLLM's
    /// `stop_reason`; `None` for EOS and length limits).
    pub stop_reason: Option<StopReason>,
    /// Set on the final output.
    pub metrics: Option<RequestMetrics>,
    /// Why the request failed, for `FinishReason::Error`.
    pub error: Option<RequestFailure>,
    pub num_prompt_tokens: usize,
}

/// Why a request ended with `FinishReason::Error`, and whose doing it was.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RequestFailure {
    pub message: String,
    /// The request asked for what cannot be (e.g. its masks leave no token to generate): a
    /// client error (HTTP 400), not an engine failure (500).
    pub caused_by_request: bool,
}

impl std::fmt::Display for RequestFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl RequestFailure {
    /// The engine failed to run the request.
    pub fn engine(message: impl Into<String>) -> Self {
        Self { message: message.into(), caused_by_request: false }
    }

    /// The request cannot go on as asked.
    pub fn request(message: impl Into<String>) -> Self {
        Self { message: message.into(), caused_by_request: true }
    }
}

impl RequestOutput {
    /// The whole request is done (with `n = 1`: its one choice has a finish reason).
    pub fn is_finished(&self) -> bool {
        self.finished
    }
}

/// Where a request's outputs go (every choice of it sends on the same sink). A send that fails means the client went away: the engine
/// cancels the request and frees its KV blocks.
pub type OutputSink = tokio::sync::mpsc::UnboundedSender<RequestOutput>;
pub type OutputStream = tokio::sync::mpsc::UnboundedReceiver<RequestOutput>;

/// Arrival bookkeeping.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    pub arrival: Instant,
    pub first_token: Option<Instant>,
}
