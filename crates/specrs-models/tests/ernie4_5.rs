//! ERNIE 4.5 dense (`Ernie4_5ForCausalLM`) and MoE (`Ernie4_5_MoeForCausalLM`) on tiny checkpoints:
//! Llama's layer with RoPE over interleaved pairs of the whole head (the MoE models' experts chosen
//! from a softmax plus `moe_statics`' correction bias, with shared experts), matching transformers'
//! forward (`common::Reference`, which turns the stored rows the interleaved way) in one prefill
//! and token by token; an `ernie4_5` / `ernie4_5-moe` GGUF (rows as the checkpoint has them, as
//! llama.cpp's converter keeps them; experts stacked) loads to the same model.

mod common;

use candle_core::Device;
use candle_core::quantized::gguf_file::Value as GgufValue;
use common::{Choice, Reference, Routing, assert_close, gguf_named, gguf_with_stacked_experts, logits, write_gguf};
use serde_json::json;
use specrs_models::testing::{self, TinyShape};
use specrs_models::{Architecture, DecoderConfig, ModelDType, load_causal_lm};

const SHAPE: TinyShape =
    TinyShape { vocab: 40, hidden: 32, layers: 3, heads: 4, kv_heads: 2, head_dim: 8, intermediate: 48 };

#[test]
fn interleaved_rope_over_the_whole_head_matches_the_transformers_forward() {
    let dir = tempfile::tempdir().unwrap();
    let tensors = testing::random_target(Architecture::Llama, &SHAPE, true, 47).unwrap();
    let mut config = testing::target_config(Architecture::Ernie4_5, &SHAPE, true);
    config["use_bias"] = json!(false);
    testing::write_checkpoint(dir.path(), &config, &tensors).unwrap();
    let (model, _) = load_causal_lm(dir.path(), &Device::Cpu, ModelDType::F32).unwrap();
    assert_eq!(model.config().architecture, Architecture::Ernie4_5);
    let reference = |interleaved_rope| Reference { interleaved_rope, ..Reference::plain(&tensors, SHAPE) };
    let ids: Vec<u32> = (0..10).map(|i| (i * 5 + 2) % 40).collect();
    let want = reference(true).logits(&ids);
    assert_close(&logits(&model, &ids, false), &want, "one prefill");
    assert_close(&logits(&model, &ids, true), &want, "token by token");
    let halves = reference(false).logits(&ids);
    let gap = want.iter().flatten().zip(halves.iter().flatten()).map(|(a, b)| (a - b).abs());
    assert!(gap.fold(0f32, f32::max) > 1e-2, "interleaved and half rotation agree");
    config["use_bias"] = json!(true);
    let e = DecoderConfig::from_hf_json(&config).unwrap_err().to_string();
    assert!(e.contains("use_bias"), "{e}");
}

#[test]
fn an_ernie4_5_gguf_loads_to_the_same_model() {
    let dir = tempfile::tempdir().unwrap();
    let tensors = testing::random_target(Architecture::Llama, &SHAPE, true, 59).unwrap();
    testing::write_checkpoint(dir.path(), &testing::target_config(Architecture::Ernie4_5, &SHAPE, true), &tensors)
        .unwrap();
    let (hf, _) = load_causal_lm(dir.path(), &Device::Cpu, ModelDType::F32).unwrap();
    let named = gguf_named(&tensors, |_| false, false);
    let path = dir.path().join("ernie.gguf");
    write_gguf(&path, "ernie4_5", &SHAPE, &named, &[]);
    let (gguf, _) = load_causal_lm(&path, &Device::Cpu, ModelDType::F32).unwrap();
    assert_eq!((gguf.config().architecture, gguf.config().tie_word_embeddings), (Architecture::Ernie4_5, true));
    let ids: Vec<u32> = (0..10).map(|i| (i * 7 + 3) % 40).collect();
    let want = logits(&hf, &ids, false);
    assert_close(&logits(&gguf, &ids, false), &want, "GGUF vs safetensors, one prefill");
    assert_close(&logits(&gguf, &ids, true), &want, "GGUF token by token");
}

#[test]
fn moe_layers_choose_by_softmax_plus_the_correction_bias_and_match_the_transformers_forward() {
    let dir = tempfile::tempdir().unwrap();
    let moe = testing::TinyMoe {
        expert_intermediate: 16,
        shared_intermediate: Some(32),
        dense_layers: vec![0],
        ..testing::TinyMoe::routed(4, 2)
    };
    let tensors = testing::random_ernie4_5_moe(&SHAPE, &moe, 71).unwrap();
    let gguf_path = dir.path().join("ernie-moe.gguf");
    write_moe_gguf(&gguf_path, &moe, &tensors);
    let config = testing::ernie4_5_moe_config(&SHAPE, &moe);
    testing::write_checkpoint(dir.path(), &config, &testing::as_ernie4_5_moe(tensors.clone()).unwrap()).unwrap();
    let (model, _) = load_causal_lm(dir.path(), &Device::Cpu, ModelDType::F32).unwrap();
    let cfg = model.config();
    assert_eq!(cfg.architecture, Architecture::Ernie4_5Moe);
    let experts = cfg.moe.as_ref().unwrap();
    assert_eq!((0..3).map(|l| experts.is_sparse_layer(l)).collect::<Vec<_>>(), [false, true, true]);
    assert_eq!(experts.shared_expert.as_ref().map(|s| (s.intermediate_size, s.gated)), Some((32, false)));
    let reference = |choice| Reference {
        interleaved_rope: true,
        routing: Some(Routing { top_k: moe.top_k, norm_topk_prob: true, choice }),
        ..Reference::plain(&tensors, SHAPE)
    };
    let ids: Vec<u32> = (0..10).map(|i| (i * 3 + 7) % 40).collect();
    let want = reference(Choice::BiasedSoftmax).logits(&ids);
    assert_close(&logits(&model, &ids, false), &want, "one prefill");
    assert_close(&logits(&model, &ids, true), &want, "token by token");
    let (gguf, _) = load_causal_lm(&gguf_path, &Device::Cpu, ModelDType::F32).unwrap();
    assert_eq!(gguf.config().moe, cfg.moe);
    assert_close(&logits(&gguf, &ids, false), &want, "the ernie4_5-moe GGUF");
    // The bias changes the choice here: plain softmax routing gives other logits.
    let plain = reference(Choice::Softmax).logits(&ids);
    let gap = want.iter().flatten().zip(plain.iter().flatten()).map(|(a, b)| (a - b).abs());
    assert!(gap.fold(0f32, f32::max) > 1e-3, "the correction bias chose nothing differently");
    let error = |key: &str, value: serde_json::Value| {
        let mut c = config.clone();
        c[key] = value;
        DecoderConfig::from_hf_json(&c).unwrap_err().to_string()
    };
    for (key, value) in [
        ("moe_gate_act", json!("sigmoid")),
        ("moe_intermediate_size", json!([16, 8])),
        ("moe_layer_end_index", json!(-3)),
        ("use_bias", json!(true)),
    ] {
        let e = error(key, value);
        assert!(e.contains(key), "{key}: {e}");
    }
}

/// Writes `tensors` as llama.cpp's converter writes an `ernie4_5-moe` file: the shared layer's
/// GGUF names (the correction bias as `exp_probs_b`), experts stacked, rows as they are.
fn write_moe_gguf(
    path: &std::path::Path,
    moe: &testing::TinyMoe,
    tensors: &std::collections::HashMap<String, candle_core::Tensor>,
) {
    let named =
        gguf_with_stacked_experts(tensors, (0..SHAPE.layers).filter(|l| !moe.dense_layers.contains(l)), moe.experts);
    let u32v = |x: usize| GgufValue::U32(x as u32);
    let metadata = [
        ("ernie4_5-moe.expert_count", u32v(moe.experts)),
        ("ernie4_5-moe.expert_used_count", u32v(moe.top_k)),
        ("ernie4_5-moe.interleave_moe_layer_step", u32v(1)),
        ("ernie4_5-moe.leading_dense_block_count", u32v(moe.dense_layers.len())),
        ("ernie4_5-moe.expert_feed_forward_length", u32v(moe.expert_intermediate)),
        ("ernie4_5-moe.expert_shared_count", u32v(moe.shared_intermediate.unwrap() / moe.expert_intermediate)),
    ];
    write_gguf(path, "ernie4_5-moe", &SHAPE, &named, &metadata);
}
