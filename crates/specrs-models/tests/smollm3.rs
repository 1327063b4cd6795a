//! SmolLM3 (`SmolLM3ForCausalLM`) on a tiny checkpoint: Llama's layer with the layers
//! `no_rope_layers` marks 0 attending without RoPE, matching transformers' forward
//! (`common::Reference`) in one prefill and token by token; the default NoPE pattern (every
//! fourth layer) and bad flags are read as transformers reads them; a GGUF file (`smollm3`,
//! whose NoPE step llama.cpp fixes at four) loads to the same model.

mod common;

use candle_core::Device;
use common::{Reference, assert_close, logits, write_llama_layout_gguf};
use serde_json::json;
use specrs_models::testing::{self, TinyShape};
use specrs_models::{Architecture, DecoderConfig, ModelDType, load_causal_lm};

const SHAPE: TinyShape =
    TinyShape { vocab: 40, hidden: 32, layers: 4, heads: 4, kv_heads: 2, head_dim: 8, intermediate: 48 };
const ROPE_LAYERS: [bool; 4] = [true, false, true, false];

fn config() -> serde_json::Value {
    let mut c = testing::target_config(Architecture::SmolLm3, &SHAPE, true);
    c["no_rope_layers"] = json!(ROPE_LAYERS.map(u8::from));
    c["use_sliding_window"] = json!(false);
    c
}

#[test]
fn nope_layers_match_the_transformers_forward() {
    let dir = tempfile::tempdir().unwrap();
    let tensors = testing::random_target(Architecture::Llama, &SHAPE, true, 17).unwrap();
    testing::write_checkpoint(dir.path(), &config(), &tensors).unwrap();
    let (model, _) = load_causal_lm(dir.path(), &Device::Cpu, ModelDType::F32).unwrap();
    assert_eq!(model.config().architecture, Architecture::SmolLm3);
    let reference = |rope_layers: [bool; 4]| Reference {
        rope_layers: Some(rope_layers.to_vec()),
        ..Reference::plain(&tensors, SHAPE)
    };
    let ids: Vec<u32> = (0..10).map(|i| (i * 13 + 1) % 40).collect();
    let want = reference(ROPE_LAYERS).logits(&ids);
    assert_close(&logits(&model, &ids, false), &want, "one prefill");
    assert_close(&logits(&model, &ids, true), &want, "token by token");
    let rotating_everywhere = reference([true; 4]).logits(&ids);
    let gap = want.iter().flatten().zip(rotating_everywhere.iter().flatten()).map(|(a, b)| (a - b).abs());
    assert!(gap.fold(0f32, f32::max) > 1e-2, "the NoPE layers change the logits");
}

#[test]
fn configuration_is_read_as_transformers_reads_it_and_errors_name_their_key() {
    let mut c = config();
    c.as_object_mut().unwrap().remove("no_rope_layers");
    c["num_hidden_layers"] = json!(8);
    let cfg = DecoderConfig::from_hf_json(&c).unwrap();
    let nope: Vec<usize> = (0..8).filter(|&i| !cfg.rope_layers.as_ref().unwrap()[i]).collect();
    assert_eq!(nope, [3, 7], "every fourth layer without RoPE");
    let error = |key: &str, value: serde_json::Value| {
        let mut c = config();
        c[key] = value;
        DecoderConfig::from_hf_json(&c).unwrap_err().to_string()
    };
    let e = error("no_rope_layers", json!([1, 0, 2, 1]));
    assert!(e.contains("no_rope_layers") && e.contains("0 or 1"), "{e}");
    let e = error("no_rope_layers", json!([1, 0]));
    assert!(e.contains("no_rope_layers") && e.contains("names only 2 layers, the model has 4"), "{e}");
    let e = error("use_sliding_window", json!(true));
    assert!(e.contains("use_sliding_window"), "{e}");
}

#[test]
fn a_smollm3_gguf_loads_to_the_same_model() {
    let dir = tempfile::tempdir().unwrap();
    let tensors = testing::random_target(Architecture::Llama, &SHAPE, true, 31).unwrap();
    // The default pattern: the fourth layer attends without RoPE, as llama.cpp assumes.
    let mut hf_config = config();
    hf_config["no_rope_layers"] = json!([1, 1, 1, 0]);
    testing::write_checkpoint(&dir.path().join("hf"), &hf_config, &tensors).unwrap();
    let path = dir.path().join("smollm3.gguf");
    write_llama_layout_gguf(&path, "smollm3", &SHAPE, &tensors, &[]);
    let (gguf, _) = load_causal_lm(&path, &Device::Cpu, ModelDType::F32).unwrap();
    let (hf, _) = load_causal_lm(&dir.path().join("hf"), &Device::Cpu, ModelDType::F32).unwrap();
    assert_eq!(gguf.config().architecture, Architecture::SmolLm3);
    assert_eq!(gguf.config().rope_layers, hf.config().rope_layers);
    let ids: Vec<u32> = (0..10).map(|i| (i * 13 + 1) % 40).collect();
    assert_close(&logits(&gguf, &ids, false), &logits(&hf, &ids, false), "GGUF vs safetensors, one prefill");
    assert_close(&logits(&gguf, &ids, true), &logits(&hf, &ids, false), "GGUF token by token");
}
