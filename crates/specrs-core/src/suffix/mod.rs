//! Suffix decoding (the `suffix` method, Arctic Inference's SuffixDecoding as vLLM runs it):
//! drafts from frequency-counted suffix trees over the request's own prompt and output and
//! over earlier requests' outputs, as long as the continuation is likely.

pub mod cache;
pub mod tree;

pub use cache::{SuffixCache, SuffixCacheConfig};
pub use tree::{SequenceKey, SpeculationLimits, SuffixDraft, SuffixTree};
