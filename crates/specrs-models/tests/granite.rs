//! Granite (`GraniteForCausalLM`) on a tiny checkpoint: Llama's layer with its four
//! multipliers (embeddings, residual branches, scores, logits) matches transformers' Granite
//! forward (`common::Reference`) in one prefill and token by token, and a `granite` GGUF (the
//! multipliers as llama.cpp's `*_scale` keys) loads to the same model. Granite MoE
//! (`GraniteMoeForCausalLM`, and `GraniteMoeSharedForCausalLM`): the multipliers around
//! stacked experts under a top-k-softmax router, with and without the shared MLP. Granite 4.0
//! (`GraniteMoeHybridForCausalLM`) attending in every layer: Granite with its MLP as the fused
//! `shared_mlp`, or Granite MoE Shared; Mamba-2 layers and NoPE refused by key.

mod common;

use candle_core::Device;
use candle_core::quantized::gguf_file::Value as GgufValue;
use common::{Choice, Multipliers, Reference, Routing, assert_close, logits, write_llama_layout_gguf};
use serde_json::json;
use specrs_models::testing::{self, TinyShape};
use specrs_models::{Architecture, DecoderConfig, ModelDType, load_causal_lm};

const SHAPE: TinyShape =
    TinyShape { vocab: 40, hidden: 32, layers: 3, heads: 4, kv_heads: 2, head_dim: 8, intermediate: 48 };

#[test]
fn the_multipliers_match_the_transformers_forward() {
    let dir = tempfile::tempdir().unwrap();
    let tensors = testing::random_target(Architecture::Llama, &SHAPE, true, 8).unwrap();
    let mut config = testing::target_config(Architecture::Granite, &SHAPE, true);
    // Granite 3.3-2B's values, the attention multiplier rescaled to the tiny head.
    (config["embedding_multiplier"], config["residual_multiplier"]) = (json!(12.0), json!(0.22));
    (config["attention_multiplier"], config["logits_scaling"]) = (json!(0.0625), json!(8.0));
    testing::write_checkpoint(dir.path(), &config, &tensors).unwrap();
    let (model, _) = load_causal_lm(dir.path(), &Device::Cpu, ModelDType::F32).unwrap();
    assert_eq!(model.config().architecture, Architecture::Granite);
    let reference = Reference {
        multipliers: Some(Multipliers { embedding: 12.0, residual: 0.22, attention: 0.0625, logits_divisor: 8.0 }),
        ..Reference::plain(&tensors, SHAPE)
    };
    let ids: Vec<u32> = (0..10).map(|i| (i * 3 + 7) % 40).collect();
    let want = reference.logits(&ids);
    assert_close(&logits(&model, &ids, false), &want, "one prefill");
    assert_close(&logits(&model, &ids, true), &want, "token by token");
}

#[test]
fn a_multiplier_that_is_not_positive_is_refused_by_key() {
    let mut config = testing::target_config(Architecture::Granite, &SHAPE, true);
    config["logits_scaling"] = json!(0.0);
    let e = DecoderConfig::from_hf_json(&config).unwrap_err().to_string();
    assert!(e.contains("logits_scaling") && e.contains("positive"), "{e}");
    config["logits_scaling"] = json!(8.0);
    config["residual_multiplier"] = json!(-1.0);
    assert!(DecoderConfig::from_hf_json(&config).unwrap_err().to_string().contains("residual_multiplier"));
}

#[test]
fn a_granite_gguf_loads_to_the_same_model() {
    let dir = tempfile::tempdir().unwrap();
    let tensors = testing::random_target(Architecture::Llama, &SHAPE, true, 21).unwrap();
    let mut config = testing::target_config(Architecture::Granite, &SHAPE, true);
    (config["embedding_multiplier"], config["residual_multiplier"]) = (json!(12.0), json!(0.22));
    (config["attention_multiplier"], config["logits_scaling"]) = (json!(0.0625), json!(8.0));
    testing::write_checkpoint(&dir.path().join("hf"), &config, &tensors).unwrap();
    let (hf, _) = load_causal_lm(&dir.path().join("hf"), &Device::Cpu, ModelDType::F32).unwrap();
    let path = dir.path().join("granite.gguf");
    let scales = [
        ("granite.embedding_scale", GgufValue::F32(12.0)),
        ("granite.residual_scale", GgufValue::F32(0.22)),
        ("granite.attention.scale", GgufValue::F32(0.0625)),
        ("granite.logit_scale", GgufValue::F32(8.0)),
    ];
    write_llama_layout_gguf(&path, "granite", &SHAPE, &tensors, &scales);
    let (gguf, _) = load_causal_lm(&path, &Device::Cpu, ModelDType::F32).unwrap();
    assert_eq!(gguf.config().architecture, Architecture::Granite);
    let ids: Vec<u32> = (0..10).map(|i| (i * 7 + 3) % 40).collect();
    assert_close(&logits(&gguf, &ids, false), &logits(&hf, &ids, false), "GGUF vs safetensors, one prefill");
    assert_close(&logits(&gguf, &ids, true), &logits(&hf, &ids, false), "GGUF token by token");
    // A scale that is not positive is refused by its key.
    write_llama_layout_gguf(&path, "granite", &SHAPE, &tensors, &[("granite.logit_scale", GgufValue::F32(0.0))]);
    let Err(e) = load_causal_lm(&path, &Device::Cpu, ModelDType::F32) else { panic!("a zero logit scale loaded") };
    assert!(e.to_string().contains("granite.logit_scale"), "{e}");
}

#[test]
fn granite_moe_stacked_experts_and_shared_mlp_match_the_transformers_forward() {
    for shared in [None, Some(24)] {
        let dir = tempfile::tempdir().unwrap();
        let moe =
            testing::TinyMoe { expert_intermediate: 16, shared_intermediate: shared, ..testing::TinyMoe::routed(4, 2) };
        // The reference reads the experts one by one; the checkpoint stacks them.
        let tensors = testing::random_moe_target(Architecture::GraniteMoe, &SHAPE, &moe, 41).unwrap();
        let stacked = testing::as_granite_moe(tensors.clone(), &SHAPE, &moe).unwrap();
        let config = testing::granite_moe_config(&SHAPE, &moe, [12.0, 0.22, 0.0625, 8.0]);
        testing::write_checkpoint(dir.path(), &config, &stacked).unwrap();
        let (model, _) = load_causal_lm(dir.path(), &Device::Cpu, ModelDType::F32).unwrap();
        assert_eq!(model.config().architecture, Architecture::GraniteMoe);
        // A softmax over the top-k logits is the renormalised top-k of the full softmax.
        let reference = Reference {
            multipliers: Some(Multipliers { embedding: 12.0, residual: 0.22, attention: 0.0625, logits_divisor: 8.0 }),
            routing: Some(Routing { top_k: 2, norm_topk_prob: true, choice: Choice::Softmax }),
            ..Reference::plain(&tensors, SHAPE)
        };
        let ids: Vec<u32> = (0..10).map(|i| (i * 3 + 7) % 40).collect();
        let want = reference.logits(&ids);
        assert_close(&logits(&model, &ids, false), &want, "one prefill");
        assert_close(&logits(&model, &ids, true), &want, "token by token");
    }
}

/// Granite 3.3-2B's multipliers, the attention multiplier rescaled to the tiny head.
fn multiplied(mut config: serde_json::Value) -> serde_json::Value {
    (config["embedding_multiplier"], config["residual_multiplier"]) = (json!(12.0), json!(0.22));
    (config["attention_multiplier"], config["logits_scaling"]) = (json!(0.0625), json!(8.0));
    config
}

/// `config` as Granite 4.0 writes it: the hybrid class, every layer attention, RoPE.
fn as_granite4(mut config: serde_json::Value, experts: usize, shared: usize) -> serde_json::Value {
    config["architectures"] = json!(["GraniteMoeHybridForCausalLM"]);
    config["model_type"] = json!("granitemoehybrid");
    config["layer_types"] = json!(vec!["attention"; SHAPE.layers]);
    config["position_embedding_type"] = json!("rope");
    config["num_local_experts"] = json!(experts);
    config["shared_intermediate_size"] = json!(shared);
    config
}

#[test]
fn granite4_without_experts_is_granite_with_its_mlp_as_the_fused_shared_mlp() {
    let dir = tempfile::tempdir().unwrap();
    let tensors = testing::random_target(Architecture::Llama, &SHAPE, true, 43).unwrap();
    let granite = multiplied(testing::target_config(Architecture::Granite, &SHAPE, true));
    testing::write_checkpoint(&dir.path().join("granite3"), &granite, &tensors).unwrap();
    let (want, _) = load_causal_lm(&dir.path().join("granite3"), &Device::Cpu, ModelDType::F32).unwrap();
    let ids: Vec<u32> = (0..10).map(|i| (i * 3 + 5) % 40).collect();
    // Granite 4.0 Micro's layout: gate and up rows fused in shared_mlp.input_linear.
    let mut stored = tensors.clone();
    for i in 0..SHAPE.layers {
        let mut take = |proj: &str| stored.remove(&format!("model.layers.{i}.mlp.{proj}.weight")).unwrap();
        let fused = candle_core::Tensor::cat(&[take("gate_proj"), take("up_proj")], 0).unwrap();
        let down = take("down_proj");
        stored.insert(format!("model.layers.{i}.shared_mlp.input_linear.weight"), fused);
        stored.insert(format!("model.layers.{i}.shared_mlp.output_linear.weight"), down);
    }
    let mut config = as_granite4(granite.clone(), 0, SHAPE.intermediate);
    config["intermediate_size"] = json!(512);
    let path = dir.path().join("granite4");
    testing::write_checkpoint(&path, &config, &stored).unwrap();
    let (model, _) = load_causal_lm(&path, &Device::Cpu, ModelDType::F32).unwrap();
    assert_eq!(
        (model.config().architecture, model.config().intermediate_size),
        (Architecture::Granite, SHAPE.intermediate)
    );
    assert_close(&logits(&model, &ids, false), &logits(&want, &ids, false), "Granite 4.0 without experts");
    // The H models' Mamba-2 layers and NoPE attention are named, not run.
    let error = |key: &str, value: serde_json::Value| {
        let mut c = config.clone();
        c[key] = value;
        testing::write_checkpoint(&path, &c, &stored).unwrap();
        load_causal_lm(&path, &Device::Cpu, ModelDType::F32).err().unwrap().to_string()
    };
    let e = error("layer_types", json!(["mamba", "attention", "mamba"]));
    assert!(e.contains("layer_types") && e.contains("Mamba"), "{e}");
    let e = error("position_embedding_type", json!("nope"));
    assert!(e.contains("position_embedding_type"), "{e}");
}

#[test]
fn granite4_with_experts_is_granite_moe_shared() {
    let dir = tempfile::tempdir().unwrap();
    let moe =
        testing::TinyMoe { expert_intermediate: 16, shared_intermediate: Some(24), ..testing::TinyMoe::routed(4, 2) };
    let tensors = testing::random_moe_target(Architecture::GraniteMoe, &SHAPE, &moe, 47).unwrap();
    let stacked = testing::as_granite_moe(tensors.clone(), &SHAPE, &moe).unwrap();
    let shared = testing::granite_moe_config(&SHAPE, &moe, [12.0, 0.22, 0.0625, 8.0]);
    testing::write_checkpoint(&dir.path().join("granite3"), &shared, &stacked).unwrap();
    let (want, _) = load_causal_lm(&dir.path().join("granite3"), &Device::Cpu, ModelDType::F32).unwrap();
    let path = dir.path().join("granite4");
    testing::write_checkpoint(&path, &as_granite4(shared, moe.experts, 24), &stacked).unwrap();
    let (model, _) = load_causal_lm(&path, &Device::Cpu, ModelDType::F32).unwrap();
    assert_eq!(model.config().architecture, Architecture::GraniteMoe);
    let ids: Vec<u32> = (0..10).map(|i| (i * 3 + 5) % 40).collect();
    assert_close(&logits(&model, &ids, false), &logits(&want, &ids, false), "Granite 4.0 with experts");
}
