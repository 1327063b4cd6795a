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
//!
//! `GraniteMoeHybridForCausalLM` (Granite 4.0) without Mamba-2 layers (the Micro model; the H
//! models' Mamba layers are refused by key) is one of these: Granite's layer whose MLP is the
//! fused `shared_mlp` alone when it has no experts ([`shared_mlp_aliases`]), Granite MoE Shared
//! when it has them ([`hybrid_config`] rewrites the config as that class).

use candle_core::{DType, Device, Tensor};
use serde_json::{Value, json};

use crate::config::{DecoderConfig, MoeConfig};
use crate::error::{ModelError, Result};
use crate::linear::{FusedLinear, Linear};
use crate::models::transformer::Mlp;
use crate::weights::{Alias, Aliases, WeightStore};

/// Granite needs nothing beyond what its configuration reader sets.
pub fn adapt(cfg: DecoderConfig) -> DecoderConfig {
    cfg
}

/// Granite 4.0's `GraniteMoeHybridForCausalLM` config as the Granite class it runs as: Granite
/// with the shared MLP's width when it has no experts, Granite MoE Shared when it has; `None`
/// for any other config. Mamba-2 layers and NoPE attention are refused by key.
pub fn hybrid_config(json: &Value) -> Result<Option<Value>> {
    if json.pointer("/architectures/0").and_then(Value::as_str) != Some("GraniteMoeHybridForCausalLM") {
        return Ok(None);
    }
    for key in ["layer_types", "layers_block_type"] {
        if let Some(types) = json.get(key).and_then(Value::as_array)
            && types.iter().any(|t| t.as_str() != Some("attention"))
        {
            return Err(ModelError::config(
                key,
                "Granite 4.0's Mamba-2 layers (the H models) are not supported; only checkpoints attending in every \
                 layer (Granite 4.0 Micro) load",
            ));
        }
    }
    match json.get("position_embedding_type").and_then(Value::as_str) {
        None | Some("rope") => {}
        Some(other) => {
            return Err(ModelError::config(
                "position_embedding_type",
                format!("'{other}' is not supported for attention-only Granite 4.0 checkpoints (supported: rope)"),
            ));
        }
    }
    let mut cfg = json.clone();
    let experts = json.get("num_local_experts").and_then(Value::as_u64).unwrap_or(0);
    if experts == 0 {
        let width = json.get("shared_intermediate_size").cloned().ok_or_else(|| {
            ModelError::config("shared_intermediate_size", "missing: a Granite 4.0 model without experts needs it")
        })?;
        cfg["architectures"] = json!(["GraniteForCausalLM"]);
        cfg["model_type"] = json!("granite");
        cfg["intermediate_size"] = width;
    } else {
        cfg["architectures"] = json!(["GraniteMoeSharedForCausalLM"]);
        cfg["model_type"] = json!("granitemoeshared");
    }
    Ok(Some(cfg))
}

/// Where a Granite 4.0 checkpoint without experts keeps each layer's MLP: its `shared_mlp`,
/// gate rows then up rows in `input_linear`.
pub fn shared_mlp_aliases(cfg: &DecoderConfig) -> Aliases {
    let width = cfg.intermediate_size as u32;
    let mut table = Aliases::new();
    for i in 0..cfg.num_hidden_layers {
        let (mlp, shared) = (format!("model.layers.{i}.mlp"), format!("model.layers.{i}.shared_mlp"));
        for (proj, first) in [("gate_proj", 0), ("up_proj", width)] {
            let source = format!("{shared}.input_linear.weight");
            table.insert(format!("{mlp}.{proj}.weight"), Alias::rows(source, (first..first + width).collect()));
        }
        let source = format!("{shared}.output_linear.weight");
        table.insert(format!("{mlp}.down_proj.weight"), Alias::renamed(source));
    }
    table
}

/// Where a Granite MoE checkpoint keeps the router, the stacked experts and the shared MLP the
/// shared layer asks for.
pub fn aliases(cfg: &DecoderConfig) -> Aliases {
    let shared = cfg.moe.as_ref().and_then(|m| m.shared_expert.as_ref()).map(|s| s.intermediate_size);
    let mut table = Aliases::new();
    for i in 0..cfg.num_hidden_layers {
        let (hf, own) = (format!("model.layers.{i}.mlp"), format!("model.layers.{i}.block_sparse_moe"));
        table.insert(format!("{hf}.gate.weight"), Alias::renamed(format!("{own}.router.layer.weight")));
        for stacked in ["input_linear", "output_linear"] {
            table.insert(format!("{hf}.{stacked}.weight"), Alias::renamed(format!("{own}.{stacked}.weight")));
        }
        if let Some(width) = shared {
            let fused = format!("model.layers.{i}.shared_mlp.input_linear.weight");
            for (proj, first) in [("gate_proj", 0), ("up_proj", width)] {
                let rows = (first as u32..(first + width) as u32).collect();
                table.insert(format!("{hf}.shared_experts.{proj}.weight"), Alias::rows(fused.clone(), rows));
            }
            table.insert(
                format!("{hf}.shared_experts.down_proj.weight"),
                Alias::renamed(format!("model.layers.{i}.shared_mlp.output_linear.weight")),
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
