//! Writes a trained EAGLE-3 head in the speculators `eagle3` format: `config.json` with the
//! nested `transformer_layer_config`, and `model.safetensors` with `fc`, `layers.{i}.*`, `norm`,
//! `lm_head` (bf16) and the `d2t` / `t2d` vocabulary maps.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{DType, Device, Tensor};
use candle_nn::VarMap;
use serde_json::json;
use specrs_models::DecoderConfig;

use super::eagle3::Eagle3Shape;
use crate::error::{EngineError, Result};

#[allow(clippy::too_many_arguments)]
pub fn write_speculators_eagle3(
    dir: &Path,
    varmap: &VarMap,
    shape: &Eagle3Shape,
    taps: &[usize],
    vocab: &[u32],
    target: &DecoderConfig,
    num_speculative_tokens: usize,
    verifier: &str,
) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| EngineError::Internal(format!("{}: {e}", dir.display())))?;
    let mut tensors: HashMap<String, Tensor> = HashMap::new();
    for (name, var) in varmap.data().lock().expect("varmap lock").iter() {
        tensors.insert(name.clone(), var.as_tensor().to_dtype(DType::BF16)?);
    }
    let d2t: Vec<i64> = vocab.iter().enumerate().map(|(i, &t)| t as i64 - i as i64).collect();
    tensors.insert("d2t".into(), Tensor::from_vec(d2t, vocab.len(), &Device::Cpu)?);
    let mut t2d = vec![0u8; target.vocab_size];
    for &t in vocab {
        t2d[t as usize] = 1;
    }
    tensors.insert("t2d".into(), Tensor::from_vec(t2d, target.vocab_size, &Device::Cpu)?);
    candle_core::safetensors::save(&tensors, dir.join("model.safetensors"))?;
    let config = json!({
        "architectures": ["Eagle3DraftModel"],
        "speculators_model_type": "eagle3",
        "speculators_version": "0.1.0",
        "draft_vocab_size": vocab.len(),
        "norm_before_residual": false,
        "norm_before_fc": false,
        "norm_output": false,
        "target_hidden_size": null,
        "eagle_aux_hidden_state_layer_ids": taps,
        "transformer_layer_config": {
            "model_type": "llama",
            "hidden_size": shape.hidden,
            "num_hidden_layers": shape.num_layers,
            "num_attention_heads": shape.heads,
            "num_key_value_heads": shape.kv_heads,
            "head_dim": shape.head_dim,
            "intermediate_size": shape.intermediate,
            "rms_norm_eps": shape.rms_norm_eps,
            "rope_theta": shape.rope_theta,
            "max_position_embeddings": shape.max_positions,
            "vocab_size": target.vocab_size,
        },
        "speculators_config": {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": num_speculative_tokens,
                                  "verifier_accept_k": 1, "accept_tolerance": 0.0}],
            "verifier": {"name_or_path": verifier, "architectures": [target.architecture.hf_name()]},
        },
    });
    std::fs::write(dir.join("config.json"), serde_json::to_string_pretty(&config).expect("json"))
        .map_err(|e| EngineError::Internal(format!("{}: {e}", dir.display())))?;
    Ok(())
}

/// A draft written by [`write_speculators_eagle3`] (or any speculators `eagle3` checkpoint of
/// the same shape), read back to warm-start training.
pub struct InitialDraft {
    /// Every weight by its checkpoint name, f32.
    pub tensors: HashMap<String, Tensor>,
    pub taps: Vec<usize>,
    /// Target ids of the draft vocabulary, ascending (from `d2t`).
    pub vocab: Vec<u32>,
    pub hidden: usize,
    pub intermediate: usize,
    pub num_layers: usize,
}

/// Reads the speculators `eagle3` draft in `dir` to continue training it.
pub fn read_speculators_eagle3(dir: &Path) -> Result<InitialDraft> {
    let invalid = |what: String| EngineError::Request(format!("--init-from {}: {what}", dir.display()));
    let config_path = dir.join("config.json");
    let text = std::fs::read_to_string(&config_path)
        .map_err(|e| invalid(format!("cannot read config.json ({e}); pass a directory written by train-draft")))?;
    let config: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| invalid(format!("config.json is not JSON ({e})")))?;
    if config["speculators_model_type"] != "eagle3" {
        return Err(invalid("config.json is not a speculators eagle3 draft".into()));
    }
    let usize_at = |v: &serde_json::Value, name: &str| {
        v.as_u64().map(|x| x as usize).ok_or_else(|| invalid(format!("config.json has no integer {name}")))
    };
    let taps = config["eagle_aux_hidden_state_layer_ids"]
        .as_array()
        .ok_or_else(|| invalid("config.json has no eagle_aux_hidden_state_layer_ids".into()))?
        .iter()
        .map(|t| usize_at(t, "tap layer"))
        .collect::<Result<Vec<_>>>()?;
    let layer = &config["transformer_layer_config"];
    let hidden = usize_at(&layer["hidden_size"], "transformer_layer_config.hidden_size")?;
    let intermediate = usize_at(&layer["intermediate_size"], "transformer_layer_config.intermediate_size")?;
    let num_layers = match &layer["num_hidden_layers"] {
        serde_json::Value::Null => 1,
        n => usize_at(n, "transformer_layer_config.num_hidden_layers")?,
    };
    let mut tensors = candle_core::safetensors::load(dir.join("model.safetensors"), &Device::Cpu)?;
    let d2t = tensors.remove("d2t").ok_or_else(|| invalid("model.safetensors has no d2t".into()))?;
    tensors.remove("t2d");
    let vocab: Vec<u32> = d2t
        .to_dtype(DType::I64)?
        .to_vec1::<i64>()?
        .iter()
        .enumerate()
        .map(|(i, offset)| (i as i64 + offset) as u32)
        .collect();
    let tensors =
        tensors.into_iter().map(|(name, t)| Ok((name, t.to_dtype(DType::F32)?))).collect::<Result<HashMap<_, _>>>()?;
    Ok(InitialDraft { tensors, taps, vocab, hidden, intermediate, num_layers })
}
