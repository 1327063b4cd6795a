//! spec-rs engine: the continuous-batching loop that runs a target and a drafter, verifies
//! drafts, commits tokens and streams text.

pub mod chat_template;
pub mod detokenizer;
pub mod error;
pub mod tokenizer;

pub use chat_template::{ChatMessage, ChatTemplate};
pub use detokenizer::{FinishReason, IncrementalDetokenizer, OutputState};
pub use error::{EngineError, Result};
pub use tokenizer::TextTokenizer;
