//! spec-rs models on candle: the Llama-family targets and the drafters, weight loading from
//! safetensors and GGUF, paged KV storage and attention over ragged batches.
//!
//! Model files follow candle's pattern (`Config` → `load` → `forward`), keep Hugging Face
//! weight names and comment shapes per step. The same code runs on `Device::Cpu` and
//! `Device::Cuda`; CPU-only fast paths fall back to device-generic tensor ops elsewhere.

pub mod activation;
pub mod alibi;
pub mod attention;
pub mod batch;
pub mod compute;
pub mod config;
pub mod drafters;
pub mod error;
pub mod graph;
pub mod host;
pub mod kv_cache;
pub mod linear;
pub mod models;
pub mod moe;
pub mod norm;
pub mod packed_quant;
pub mod padded_attention;
pub mod placement;
pub mod reductions;
pub mod rope;
mod simd;
pub mod skinny;
pub mod skinny_quant;
pub mod testing;
pub mod tiled_attention;
pub mod weights;

pub use batch::{AttentionMask, BatchRow, ForwardBatch};
pub use compute::on_compute_pool;
pub use config::{
    Alibi, Architecture, DecoderConfig, Llama4Attention, MoeConfig, QueryTemperature, RopeScaling, Router,
    SharedExpertConfig,
};
pub use error::{ModelError, Result};
pub use kv_cache::PagedKvCache;
pub use models::{CausalLm, ForwardOutput, load_causal_lm};
pub use weights::{Alias, Aliases, ModelDType, WeightStore};
