//! OpenAI API request and response types (chat completions, completions, models, errors),
//! with vLLM's sampling extensions (`top_k`, `min_p`, `repetition_penalty`, `min_tokens`,
//! `ignore_eos`, `stop_token_ids`, `prompt_logprobs`, `allowed_token_ids`,
//! `include_stop_str_in_output`, `skip_special_tokens`, `truncate_prompt_tokens`, `bad_words`,
//! `stream_options.continuous_usage_stats`, `structured_outputs` and the older `guided_json`,
//! `guided_regex`, `guided_choice`, `guided_grammar`).

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// `stop`: one string or a list.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum StopSpec {
    One(String),
    Many(Vec<String>),
}

impl StopSpec {
    pub fn into_vec(self) -> Vec<String> {
        match self {
            Self::One(s) => vec![s],
            Self::Many(v) => v,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
    /// vLLM: with `include_usage`, every chunk also carries the usage so far.
    #[serde(default)]
    pub continuous_usage_stats: bool,
}

/// What usage a streamed response carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamUsage {
    /// A last chunk with the request's usage (`include_usage`).
    pub final_chunk: bool,
    /// The usage so far on every chunk that carries output (`continuous_usage_stats`).
    pub every_chunk: bool,
}

impl StreamUsage {
    pub fn of(options: Option<&StreamOptions>) -> Self {
        let final_chunk = options.is_some_and(|o| o.include_usage);
        Self { final_chunk, every_chunk: final_chunk && options.is_some_and(|o| o.continuous_usage_stats) }
    }
}

/// The usage so far of a stream, as `continuous_usage_stats` reports it on each chunk.
pub fn running_usage(prompt_tokens: usize, completion_tokens: usize) -> Value {
    serde_json::json!({
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    })
}

/// Sampling fields shared by both endpoints.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct SamplingFields {
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i64>,
    pub min_p: Option<f32>,
    pub seed: Option<u64>,
    pub stop: Option<StopSpec>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub min_tokens: Option<usize>,
    pub ignore_eos: Option<bool>,
    pub stop_token_ids: Option<Vec<u32>>,
    pub n: Option<usize>,
    pub best_of: Option<usize>,
    /// vLLM's beam search: refused when true (sampling would answer it silently otherwise).
    pub use_beam_search: Option<bool>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    pub response_format: Option<Value>,
    pub tools: Option<Value>,
    pub tool_choice: Option<Value>,
    pub logit_bias: Option<Value>,
    pub user: Option<String>,
    /// vLLM: score every prompt token, with this many top logprobs per position (returned as
    /// `prompt_logprobs`, non-streamed responses only).
    pub prompt_logprobs: Option<usize>,
    /// vLLM: sample only among these tokens.
    pub allowed_token_ids: Option<Vec<u32>>,
    /// vLLM: keep the stop string that ended the output in its text.
    pub include_stop_str_in_output: Option<bool>,
    /// vLLM: leave special tokens out of the text (the default).
    pub skip_special_tokens: Option<bool>,
    /// vLLM: keep only the last this many prompt tokens.
    pub truncate_prompt_tokens: Option<usize>,
    /// vLLM: words the output never contains.
    pub bad_words: Option<Vec<String>>,
    /// vLLM: the output follows a JSON schema, matches a regex, is one of some choices or
    /// is any JSON object.
    pub structured_outputs: Option<specrs_core::structured::StructuredOutputs>,
    /// vLLM (before `structured_outputs`): a JSON schema, as an object or its text.
    pub guided_json: Option<Value>,
    /// vLLM (before `structured_outputs`): a regex the whole output matches.
    pub guided_regex: Option<String>,
    /// vLLM (before `structured_outputs`): the output is one of these strings.
    pub guided_choice: Option<Vec<String>>,
    /// vLLM (before `structured_outputs`): a context-free grammar (EBNF or Lark).
    pub guided_grammar: Option<String>,
    /// spec-rs: record the per-step draft trace in the response.
    pub trace: Option<bool>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct ChatMessageIn {
    pub role: String,
    #[serde(default)]
    pub content: Option<Value>,
    #[serde(default)]
    pub name: Option<String>,
    /// An assistant's earlier calls: `[{"id", "type": "function", "function": {"name", "arguments"}}]`.
    #[serde(default)]
    pub tool_calls: Option<Vec<Value>>,
    /// A tool result: the id of the call it answers.
    #[serde(default)]
    pub tool_call_id: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct ChatCompletionRequest {
    pub model: String,
    pub messages: Vec<ChatMessageIn>,
    pub max_tokens: Option<usize>,
    pub max_completion_tokens: Option<usize>,
    pub logprobs: Option<bool>,
    pub top_logprobs: Option<usize>,
    /// vLLM: open a new assistant turn after the messages (the default).
    pub add_generation_prompt: Option<bool>,
    /// vLLM: leave the final message open and continue it (prefill the answer's start).
    pub continue_final_message: Option<bool>,
    /// OpenAI: with `tool_choice: "required"`, `false` allows exactly one call.
    pub parallel_tool_calls: Option<bool>,
    /// vLLM: a Jinja chat template for this request instead of the model's.
    pub chat_template: Option<String>,
    /// vLLM: more variables for the chat template.
    pub chat_template_kwargs: Option<serde_json::Map<String, Value>>,
    /// vLLM: send the reasoning a reasoning parser splits off (the default), or drop it.
    pub include_reasoning: Option<bool>,
    /// OpenAI: how hard a reasoning model thinks; the template's `reasoning_effort` (gpt-oss
    /// writes it in its system message), as the Responses API's `reasoning.effort`.
    pub reasoning_effort: Option<Value>,
    /// OpenAI's deprecated function calling (refused, naming `tools` instead).
    pub functions: Option<Value>,
    pub function_call: Option<Value>,
    #[serde(flatten)]
    pub sampling: SamplingFields,
}

/// `prompt`: text, texts, token ids, or lists of token ids.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum PromptSpec {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<u32>),
    TokenLists(Vec<Vec<u32>>),
}

#[derive(Debug, Clone, Deserialize)]
pub struct CompletionRequest {
    pub model: String,
    pub prompt: PromptSpec,
    pub max_tokens: Option<usize>,
    pub logprobs: Option<usize>,
    pub echo: Option<bool>,
    pub suffix: Option<String>,
    #[serde(flatten)]
    pub sampling: SamplingFields,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct SpecDecodeUsage {
    pub num_drafts: u64,
    pub num_draft_tokens: u64,
    pub num_accepted_tokens: u64,
    pub acceptance_length: f64,
    pub accepted_per_position: Vec<u64>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct PromptTokensDetails {
    pub cached_tokens: usize,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
    /// OpenAI's `prompt_tokens_details`: how many prompt tokens came from the prefix cache.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_tokens_details: Option<PromptTokensDetails>,
    /// spec-rs: the request's speculative-decoding statistics.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub spec_decode: Option<SpecDecodeUsage>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Clone, Serialize)]
pub struct ErrorDetail {
    pub message: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: Option<&'static str>,
}
