//! `Glm4MoeForCausalLM`: GLM-4.5, GLM-4.6, GLM-4.7 and the Air models. Llama's layer with a
//! bias on q, k and v (`attention_bias`), an optional RMSNorm over each head of q and k
//! (`use_qk_norm`), RoPE over the leading half of each head (`partial_rotary_factor`, NeoX
//! rotate-half within it), dense MLPs in the first `first_k_dense_replace` layers and then
//! DeepSeek-V3-style experts: sigmoid scores, a correction bias that steers the choice only,
//! group-limited top-k, renormalised weights times `routed_scaling_factor`, and an ungated
//! shared expert (`crate::moe`). The multi-token-prediction layer the checkpoints carry past
//! `num_hidden_layers` is not part of the target.

use crate::config::DecoderConfig;

/// GLM-4.5 needs nothing beyond what its configuration reader sets.
pub fn adapt(cfg: DecoderConfig) -> DecoderConfig {
    cfg
}
