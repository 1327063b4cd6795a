//! MiniMax-M2 (`MiniMaxM2ForCausalLM`) on a tiny checkpoint in its real layout: q and k normed
//! across all heads, RoPE over `rotary_dim` of each head, and experts under Mixtral's names
//! chosen by sigmoid score plus `block_sparse_moe.e_score_correction_bias`, matching
//! transformers' forward (`common::Reference`) in one prefill and token by token; a
//! `minimax-m2` GGUF loads to the same model; configuration errors name their key.

mod common;

use std::collections::HashMap;

use candle_core::quantized::gguf_file::Value as GgufValue;
use candle_core::{Device, Tensor};
use common::{Choice, Reference, Routing, assert_close, gguf_with_stacked_experts, logits, write_gguf};
use serde_json::{Value, json};
use specrs_models::testing::{self, TinyMoe, TinyShape};
use specrs_models::{Architecture, DecoderConfig, ModelDType, Router, load_causal_lm};

const SHAPE: TinyShape =
    TinyShape { vocab: 40, hidden: 32, layers: 3, heads: 4, kv_heads: 2, head_dim: 8, intermediate: 48 };
const ROTARY: usize = 4;

const MOE: TinyMoe = TinyMoe {
    experts: 4,
    top_k: 2,
    expert_intermediate: 16,
    shared_intermediate: None,
    norm_topk_prob: true,
    dense_layers: Vec::new(),
    groups: (1, 1, 1.0),
};

fn config() -> Value {
    testing::minimax_m2_config(&SHAPE, &MOE, ROTARY)
}

fn tensors(seed: u64) -> HashMap<String, Tensor> {
    testing::random_minimax_m2(&SHAPE, &MOE, seed).unwrap()
}

fn on_disk(tensors: &HashMap<String, Tensor>) -> HashMap<String, Tensor> {
    testing::as_minimax_m2(tensors.clone())
}

fn ids() -> Vec<u32> {
    (0..10).map(|i| (i * 7 + 4) % 40).collect()
}

#[test]
fn whole_width_qk_norms_partial_rope_and_biased_sigmoid_experts_match_the_transformers_forward() {
    let dir = tempfile::tempdir().unwrap();
    let tensors = tensors(61);
    testing::write_checkpoint(dir.path(), &config(), &on_disk(&tensors)).unwrap();
    let (model, _) = load_causal_lm(dir.path(), &Device::Cpu, ModelDType::F32).unwrap();
    let cfg = model.config();
    assert_eq!((cfg.architecture, cfg.rotary_dim), (Architecture::MiniMaxM2, ROTARY));
    assert!(cfg.qk_norm && cfg.qk_norm_spans_heads());
    let moe = cfg.moe.as_ref().unwrap();
    assert_eq!(moe.router, Router::GroupedSigmoid { n_group: 1, topk_group: 1, routed_scaling_factor: 1.0 });
    assert!(moe.norm_topk_prob && moe.shared_expert.is_none());
    let want = Reference {
        rotary: ROTARY,
        factors: vec![1.0; ROTARY / 2],
        routing: Some(Routing { top_k: MOE.top_k, norm_topk_prob: true, choice: Choice::GroupedSigmoid(1, 1, 1.0) }),
        ..Reference::plain(&tensors, SHAPE)
    }
    .logits(&ids());
    assert_close(&logits(&model, &ids(), false), &want, "one prefill");
    assert_close(&logits(&model, &ids(), true), &want, "token by token");
}

#[test]
fn a_minimax_m2_gguf_loads_to_the_same_model() {
    let dir = tempfile::tempdir().unwrap();
    let tensors = tensors(67);
    testing::write_checkpoint(dir.path(), &config(), &on_disk(&tensors)).unwrap();
    let (hf, _) = load_causal_lm(dir.path(), &Device::Cpu, ModelDType::F32).unwrap();
    // llama.cpp's layout: the shared layer's names, experts stacked, rows as they are.
    let named = gguf_with_stacked_experts(&tensors, 0..SHAPE.layers, MOE.experts);
    let u32v = |x: usize| GgufValue::U32(x as u32);
    let metadata = [
        ("minimax-m2.rope.dimension_count", u32v(ROTARY)),
        ("minimax-m2.expert_count", u32v(MOE.experts)),
        ("minimax-m2.expert_used_count", u32v(MOE.top_k)),
        ("minimax-m2.expert_feed_forward_length", u32v(MOE.expert_intermediate)),
        ("minimax-m2.feed_forward_length", u32v(MOE.expert_intermediate)),
        ("minimax-m2.expert_gating_func", u32v(2)),
    ];
    let path = dir.path().join("minimax-m2.gguf");
    write_gguf(&path, "minimax-m2", &SHAPE, &named, &metadata);
    let (gguf, _) = load_causal_lm(&path, &Device::Cpu, ModelDType::F32).unwrap();
    assert_eq!(gguf.config().moe, hf.config().moe);
    assert_eq!(gguf.config().rotary_dim, ROTARY);
    let want = logits(&hf, &ids(), false);
    assert_close(&logits(&gguf, &ids(), false), &want, "GGUF vs safetensors, one prefill");
    assert_close(&logits(&gguf, &ids(), true), &want, "GGUF token by token");
}

#[test]
fn lightning_attention_other_norms_and_other_routers_are_refused_by_key() {
    let error = |key: &str, value: Value| {
        let mut c = config();
        c[key] = value;
        DecoderConfig::from_hf_json(&c).unwrap_err().to_string()
    };
    for (key, value) in [
        ("attn_type_list", json!([1, 0, 1])),
        ("attn_window_size", json!(128)),
        ("qk_norm_type", json!("per_head")),
        ("scoring_func", json!("softmax")),
        ("use_routing_bias", json!(false)),
        ("shared_intermediate_size", json!(64)),
    ] {
        let e = error(key, value);
        assert!(e.contains(key), "{key}: {e}");
    }
}
