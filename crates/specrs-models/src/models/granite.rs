//! `GraniteForCausalLM`: IBM Granite 3.0-3.3. Llama's layer with four constants from the
//! config (`DecoderConfig::scales`): embeddings times `embedding_multiplier`, each residual
//! branch times `residual_multiplier` before it is added, scores scaled by
//! `attention_multiplier` instead of `head_dim^-0.5`, and logits divided by `logits_scaling`.
//! Granite's tool calls are read by the `granite` parser.
//!
//! `GraniteMoeForCausalLM` (Granite 3.x 1B-A400M, 3B-A800M) keeps the constants and routes
//! every layer's tokens to experts stored stacked under `block_sparse_moe`: `router.layer`
//! picks the top-k logits and softmaxes them, `input_linear [E, 2I, H]` holds each expert's
//! gate rows then its up rows, `output_linear [E, H, I]` its down projection
//! ([`load_experts`]). `GraniteMoeSharedForCausalLM` adds an always-on `shared_mlp` of the same
//! fused shape. The store reads both through [`aliases`].

use candle_core::{DType, Device, Tensor};

use crate::config::{DecoderConfig, MoeConfig};
use crate::error::Result;
use crate::linear::{FusedLinear, Linear};
use crate::models::transformer::Mlp;
use crate::weights::{Alias, Aliases, WeightStore};

/// Granite needs nothing beyond what its configuration reader sets.
pub fn adapt(cfg: DecoderConfig) -> DecoderConfig {
    cfg
}

/// Where a Granite MoE checkpoint keeps the router, the stacked experts and the shared MLP the
/// shared layer asks for.
pub fn aliases(cfg: &DecoderConfig) -> Aliases {
    let renamed = |source: String| Alias { source, rows: None };
    let shared = cfg.moe.as_ref().and_then(|m| m.shared_expert.as_ref()).map(|s| s.intermediate_size);
    let mut table = Aliases::new();
    for i in 0..cfg.num_hidden_layers {
        let (hf, own) = (format!("model.layers.{i}.mlp"), format!("model.layers.{i}.block_sparse_moe"));
        table.insert(format!("{hf}.gate.weight"), renamed(format!("{own}.router.layer.weight")));
        for stacked in ["input_linear", "output_linear"] {
            table.insert(format!("{hf}.{stacked}.weight"), renamed(format!("{own}.{stacked}.weight")));
        }
        if let Some(width) = shared {
            let fused = format!("model.layers.{i}.shared_mlp.input_linear.weight");
            for (proj, first) in [("gate_proj", 0), ("up_proj", width)] {
                let rows = (first as u32..(first + width) as u32).collect();
                table.insert(
                    format!("{hf}.shared_experts.{proj}.weight"),
                    Alias { source: fused.clone(), rows: Some(rows) },
                );
            }
            table.insert(
                format!("{hf}.shared_experts.down_proj.weight"),
                renamed(format!("model.layers.{i}.shared_mlp.output_linear.weight")),
            );
        }
    }
    table
}

/// The experts of one layer from `{prefix}.input_linear` and `{prefix}.output_linear`, each a
/// SwiGLU over its slice of the stacked weights.
pub fn load_experts(store: &WeightStore, prefix: &str, hidden: usize, moe: &MoeConfig) -> Result<Vec<Mlp>> {
    let (experts, width) = (moe.num_experts, moe.expert_intermediate_size);
    let host = |name: &str, shape: &[usize]| -> Result<Tensor> {
        Ok(store.tensor(&format!("{prefix}.{name}.weight"), shape)?.to_dtype(DType::F32)?.to_device(&Device::Cpu)?)
    };
    let input = host("input_linear", &[experts, 2 * width, hidden])?;
    let output = host("output_linear", &[experts, hidden, width])?;
    let linear = |w: Tensor| -> Result<Linear> {
        let (out, inp) = w.dims2()?;
        Ok(Linear::new(store.place_dense(&w, None)?, None, out, inp))
    };
    (0..experts)
        .map(|e| {
            let gate_up = input.get(e)?;
            let gate = linear(gate_up.narrow(0, 0, width)?)?;
            let up = linear(gate_up.narrow(0, width, width)?)?;
            Ok(Mlp::new(FusedLinear::new(vec![gate, up])?, linear(output.get(e)?)?))
        })
        .collect()
}
