//! spec-rs engine: the continuous-batching loop that runs a target and a drafter, verifies
//! drafts, commits tokens and streams text.

pub mod chat_template;
pub mod default_draft;
pub mod detokenizer;
pub mod engine;
pub mod error;
pub mod handle;
pub mod metrics;
pub mod pipeline;
pub mod proposer;
pub mod python_json;
pub mod request;
pub mod routing;
pub mod sequence;
pub mod tokenizer;
pub mod train;
pub mod width;

pub use chat_template::{
    ChatEnding, ChatMessage, ChatMessageError, ChatTemplate, Conversation, TemplateVars, text_messages,
};
pub use default_draft::{DefaultDraft, apply_default_draft, default_draft};
pub use detokenizer::{FinishReason, IncrementalDetokenizer, OutputState, StopReason};
pub use engine::{Engine, EngineConfig, EngineParts, MAX_CAPTURED_CONTEXT};
pub use error::{EngineError, Result};
pub use handle::{EngineHandle, FinalOutput};
pub use pipeline::{
    DeviceSpec, PipelineConfig, PipelineInfo, build_engine, build_engine_with, build_replicas, build_replicas_with,
    check_replica_devices,
};
pub use request::{GenerationRequest, Prompt, RequestFailure, RequestMetrics, RequestOutput, TokenLogprob, TraceStep};
pub use tokenizer::TextTokenizer;
