//! `StableLmForCausalLM`: StableLM-3B-4E1T, StableLM 2 (1.6B, 12B) and StableLM Zephyr.
//! Llama's layer with LayerNorms with bias, RoPE over the leading `partial_rotary_factor` of
//! each head (a quarter), q/k/v biases where `use_qkv_bias` says, and on the 12B models a
//! LayerNorm without bias over each head of q and k, one per head (`qk_layernorm`,
//! [`head_norm`]), with attention beside the MLP (`use_parallel_residual`).

use candle_core::Tensor;

use crate::config::DecoderConfig;
use crate::error::Result as LoadResult;
use crate::norm::RmsNorm;
use crate::weights::WeightStore;

/// StableLM needs nothing beyond what its configuration reader sets.
pub fn adapt(cfg: DecoderConfig) -> DecoderConfig {
    cfg
}

/// StableLM's LayerNorm over each of `heads` heads of `which` (`q` or `k`) of the attention at
/// `prefix`: the checkpoint's one weight per head (`{which}_layernorm.norms.{h}.weight`,
/// `[head_dim]`), or the `[heads, head_dim]` stack llama.cpp's converter writes.
pub fn head_norm(
    store: &WeightStore,
    prefix: &str,
    which: &str,
    heads: usize,
    cfg: &DecoderConfig,
) -> LoadResult<RmsNorm> {
    let d = cfg.head_dim;
    let stacked = format!("{prefix}.{which}_norm.weight");
    let weights = if store.contains(&stacked) {
        store.tensor(&stacked, &[heads, d])?
    } else {
        let rows = (0..heads)
            .map(|h| store.tensor(&format!("{prefix}.{which}_layernorm.norms.{h}.weight"), &[d]))
            .collect::<LoadResult<Vec<_>>>()?;
        Tensor::stack(&rows, 0)?
    };
    Ok(RmsNorm::per_head(weights, cfg.rms_norm_eps)?.centered(true))
}
