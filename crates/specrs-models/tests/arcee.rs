//! Arcee (`ArceeForCausalLM`, AFM-4.5B) on a tiny checkpoint in its real layout: Llama's layer
//! whose MLP has no gate (`down(relu(up)²)`), matching transformers' forward
//! (`common::Reference`) in one prefill and token by token; its `arcee` GGUF (q/k rows permuted
//! as llama.cpp writes Llama's) loads to the same model; another activation is refused by key.

mod common;

use std::collections::HashMap;

use candle_core::{Device, Tensor};
use common::{Reference, assert_close, logits, write_llama_layout_gguf};
use serde_json::json;
use specrs_models::testing::{self, TinyShape};
use specrs_models::{Architecture, DecoderConfig, ModelDType, load_causal_lm};

const SHAPE: TinyShape =
    TinyShape { vocab: 40, hidden: 32, layers: 3, heads: 4, kv_heads: 2, head_dim: 8, intermediate: 48 };

fn tensors() -> HashMap<String, Tensor> {
    let mut t = testing::random_target(Architecture::Llama, &SHAPE, false, 83).unwrap();
    t.retain(|name, _| !name.ends_with("mlp.gate_proj.weight"));
    t
}

fn config() -> serde_json::Value {
    let mut c = testing::target_config(Architecture::Arcee, &SHAPE, false);
    c["hidden_act"] = json!("relu2");
    c
}

#[test]
fn an_mlp_without_a_gate_squaring_its_relu_matches_the_transformers_forward_and_its_gguf() {
    let dir = tempfile::tempdir().unwrap();
    let tensors = tensors();
    testing::write_checkpoint(dir.path(), &config(), &tensors).unwrap();
    let (model, _) = load_causal_lm(dir.path(), &Device::Cpu, ModelDType::F32).unwrap();
    assert_eq!(model.config().architecture, Architecture::Arcee);
    assert!(!model.config().mlp_is_gated());
    let ids: Vec<u32> = (0..10).map(|i| (i * 7 + 5) % 40).collect();
    let want = Reference::plain(&tensors, SHAPE).logits(&ids);
    assert_close(&logits(&model, &ids, false), &want, "one prefill");
    assert_close(&logits(&model, &ids, true), &want, "token by token");
    // A model at 32 bits reads as 32 bits a weight: the ungated MLP counts two projections.
    assert!((model.layer_bits_per_weight() - 32.0).abs() < 1e-9, "{}", model.layer_bits_per_weight());

    let path = dir.path().join("arcee.gguf");
    write_llama_layout_gguf(&path, "arcee", &SHAPE, &tensors, &[]);
    let (gguf, _) = load_causal_lm(&path, &Device::Cpu, ModelDType::F32).unwrap();
    assert_close(&logits(&gguf, &ids, false), &want, "the arcee GGUF");

    let mut gelu = config();
    gelu["hidden_act"] = json!("gelu");
    let e = DecoderConfig::from_hf_json(&gelu).unwrap_err().to_string();
    assert!(e.contains("hidden_act"), "{e}");
}
