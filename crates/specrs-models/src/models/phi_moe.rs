//! `PhimoeForCausalLM`: Phi-3.5-MoE. Mixtral's layer and names (`block_sparse_moe`, experts
//! `w1` / `w3` / `w2`, read through `super::mixtral::aliases`) with LayerNorms with bias,
//! biases on q, k, v and o and (`lm_head_bias`) on `lm_head`, LongRoPE whose cos/sin scale is
//! its own `short_mscale` / `long_mscale`, and the top-2 experts chosen by sparsemixer
//! (`crate::moe::sparse_mixer_choice`): each expert weighted by its softmax among the experts
//! near it, without renormalising the pair. llama.cpp's `phimoe` files route the same way
//! here (their metadata carries no jitter, so the released 0.01 serves).

use crate::config::DecoderConfig;

/// Phi-3.5-MoE needs nothing beyond what its configuration reader sets.
pub fn adapt(cfg: DecoderConfig) -> DecoderConfig {
    cfg
}
