//! Speculative configuration: the method vocabulary, the validated config, YAML config files,
//! the CLI flag table generated from the fields, and vLLM's spelling of the config.

pub mod file;
pub mod flags;
pub mod method;
pub mod speculative;
pub mod vllm;

pub use method::{DraftPlacement, DraftProposal, SpeculativeMethod};
pub use speculative::{AcceptanceRule, SpeculativeConfig};
