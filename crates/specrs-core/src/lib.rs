//! spec-rs core: every speculative-decoding rule that can be stated on plain numbers.
//!
//! No tensors live here, so the crate compiles in seconds and its algorithms are tested on
//! slices: configuration rules, the verify-width policy, acceptance walks, sampling, KV block
//! allocation, scheduling, the n-gram and suffix proposers and acceptance metrics.

pub mod acceptance;
pub mod config;
pub mod error;
pub mod kv_blocks;
pub mod metrics;
pub mod model_alias;
pub mod ngram;
pub mod prefix_cache;
pub mod registry;
pub mod sampling;
pub mod scheduler;
pub mod structured;
pub mod suffix;
pub mod width;

pub use config::{AcceptanceRule, DraftPlacement, DraftProposal, SpeculativeConfig, SpeculativeMethod};
pub use error::{ConfigError, ConfigFileError};
