//! `CohereForCausalLM` (Command-R, Command R+, Aya) and `Cohere2ForCausalLM` (Command R7B,
//! Command A). Attention and MLP run side by side on one normed input and both join the
//! residual (`NormPlacement::Parallel`); the norms are LayerNorms without bias
//! (`RmsNorm::centered`); logits are multiplied by `logit_scale`; RoPE turns interleaved pairs
//! `(2i, 2i + 1)` of the whole head. Command R+ norms each head of q and k with a weight row of
//! its own (`use_qk_norm`). Cohere 2 runs three sliding-window layers with RoPE to each
//! full-attention layer without (`DecoderConfig::rope_layers`).
//!
//! The store reads q and k through `super::interleaved_rope_aliases`, each head's rows
//! reordered evens first, then odds (`crate::rope::half_rotation_rows`): one reordering of q
//! and k leaves the scores unchanged and turns the interleaved pairs into the rotate-half pairs
//! the shared RoPE turns.
//! The per-head q/k norm weights are reordered the same way along a head ([`head_norm`]).

use candle_core::Tensor;

use crate::config::DecoderConfig;
use crate::error::Result as LoadResult;
use crate::norm::RmsNorm;
use crate::rope::half_rotation_rows;
use crate::weights::WeightStore;

/// Cohere needs nothing beyond what its configuration reader sets.
pub fn adapt(cfg: DecoderConfig) -> DecoderConfig {
    cfg
}

/// Command R+'s LayerNorm over each of `heads` heads of q or k: `name` holds `[heads, head_dim]`
/// weights, their columns reordered as the heads' rows are.
pub fn head_norm(store: &WeightStore, name: &str, heads: usize, cfg: &DecoderConfig) -> LoadResult<RmsNorm> {
    let d = cfg.head_dim;
    let weights = store.tensor(name, &[heads, d])?;
    let order = half_rotation_rows(1, d, d);
    let weights = weights.index_select(&Tensor::from_slice(&order, d, weights.device())?, 1)?;
    Ok(RmsNorm::per_head(weights, cfg.rms_norm_eps)?.centered(true))
}
