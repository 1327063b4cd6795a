//! Speculative configuration: the method vocabulary, the validated config, YAML config files
//! and the CLI flag table generated from the fields.

pub mod file;
pub mod flags;
pub mod method;
pub mod speculative;

pub use method::{DraftPlacement, DraftProposal, SpeculativeMethod};
pub use speculative::{AcceptanceRule, SpeculativeConfig};
