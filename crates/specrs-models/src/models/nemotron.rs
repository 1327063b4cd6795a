//! `NemotronForCausalLM`: Nemotron-4, Minitron and Nemotron-Mini. Llama's pre-norm layer with
//! LayerNorm1P (a LayerNorm with bias whose weight is stored less one: it scales by
//! `1 + weight`), RoPE over the leading half of each head (`partial_rotary_factor`), biases
//! where `attention_bias` / `mlp_bias` say, and an MLP without a gate, `down(relu(up(x))²)`.
//! llama.cpp's `nemotron` files store each norm as its scale and q/k rows as they are.

use crate::config::DecoderConfig;

/// Nemotron needs nothing beyond what its configuration reader sets.
pub fn adapt(cfg: DecoderConfig) -> DecoderConfig {
    cfg
}
