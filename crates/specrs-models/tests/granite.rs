//! Granite (`GraniteForCausalLM`) on a tiny checkpoint: Llama's layer with its four
//! multipliers (embeddings, residual branches, scores, logits) matches transformers' Granite
//! forward (`common::Reference`) in one prefill and token by token, and a `granite` GGUF (the
//! multipliers as llama.cpp's `*_scale` keys) loads to the same model. Granite MoE
//! (`GraniteMoeForCausalLM`, and `GraniteMoeSharedForCausalLM`): the multipliers around
//! stacked experts under a top-k-softmax router, with and without the shared MLP.

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
        let moe = testing::TinyMoe {
            experts: 4,
            top_k: 2,
            expert_intermediate: 16,
            shared_intermediate: shared,
            norm_topk_prob: true,
            dense_layers: vec![],
            groups: (1, 1, 1.0),
        };
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
