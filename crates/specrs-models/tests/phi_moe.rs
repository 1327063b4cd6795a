//! Phi-3.5-MoE (`PhimoeForCausalLM`) on a tiny checkpoint in its real layout (Mixtral's names):
//! LayerNorms with bias, biases on q, k, v, o and `lm_head`, LongRoPE scaled by its own
//! `short_mscale`, and two experts chosen by sparsemixer, matching transformers' forward
//! (`common::Reference`, with sparsemixer written out as transformers masks and softmaxes) in
//! one prefill and token by token; its `phimoe` GGUF (experts stacked, the LongRoPE factors as
//! tensors) loads to the same model with the released jitter; configuration errors name their
//! key.

mod common;

use std::collections::HashMap;

use candle_core::quantized::gguf_file::Value as GgufValue;
use candle_core::{Device, Tensor};
use common::{Choice, Reference, Routing, assert_close, gguf_f32, gguf_with_stacked_experts, logits, write_gguf};
use serde_json::json;
use specrs_models::testing::{self, TinyMoe, TinyShape};
use specrs_models::{Architecture, DecoderConfig, ModelDType, Router, load_causal_lm};

const SHAPE: TinyShape =
    TinyShape { vocab: 40, hidden: 32, layers: 3, heads: 4, kv_heads: 2, head_dim: 8, intermediate: 48 };
const MOE: TinyMoe = TinyMoe {
    experts: 4,
    top_k: 2,
    expert_intermediate: 32,
    shared_intermediate: None,
    norm_topk_prob: false,
    dense_layers: Vec::new(),
    groups: (1, 1, 1.0),
};
/// Wide enough that some tokens keep a near rival and some do not.
const JITTER: f32 = 0.3;

fn ids() -> Vec<u32> {
    (0..10).map(|i| (i * 13 + 6) % 40).collect()
}

/// Phi-3.5-MoE's forward with `choice` routing: LayerNorms, the short LongRoPE factors of
/// `testing::phimoe_config`, cos/sin scaled by its `short_mscale`.
fn reference(tensors: &HashMap<String, Tensor>, choice: Choice) -> Reference<'_> {
    Reference {
        centered_norms: true,
        factors: (0..SHAPE.head_dim / 2).map(|i| 1.0 + 0.25 * i as f64).collect(),
        magnitude: 1.2,
        routing: Some(Routing { top_k: 2, norm_topk_prob: false, choice }),
        ..Reference::plain(tensors, SHAPE)
    }
}

#[test]
fn sparsemixer_routing_layer_norms_and_biases_match_the_transformers_forward() {
    let dir = tempfile::tempdir().unwrap();
    let tensors = testing::random_phimoe(&SHAPE, &MOE, 53).unwrap();
    let config = testing::phimoe_config(&SHAPE, &MOE, f64::from(JITTER));
    testing::write_checkpoint(dir.path(), &config, &testing::as_mixtral(tensors.clone())).unwrap();
    let (model, _) = load_causal_lm(dir.path(), &Device::Cpu, ModelDType::F32).unwrap();
    let cfg = model.config();
    assert_eq!(cfg.architecture, Architecture::PhiMoe);
    assert!(cfg.attention_bias && cfg.attention_output_bias && cfg.lm_head_bias && cfg.norms_have_bias());
    assert!(
        matches!(cfg.moe.as_ref().unwrap().router, Router::SparseMixer { jitter_eps } if jitter_eps == f64::from(JITTER))
    );
    let want = reference(&tensors, Choice::SparseMixer(JITTER)).logits(&ids());
    assert_close(&logits(&model, &ids(), false), &want, "one prefill");
    assert_close(&logits(&model, &ids(), true), &want, "token by token");
    // The router matters: Mixtral's renormalised softmax top-2 gives other logits.
    let softmax = Reference {
        routing: Some(Routing { top_k: 2, norm_topk_prob: true, choice: Choice::Softmax }),
        ..reference(&tensors, Choice::Softmax)
    }
    .logits(&ids());
    let diff = softmax.iter().flatten().zip(want.iter().flatten()).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    assert!(diff > 1e-3, "sparsemixer and a softmax top-2 agree");
    // Past the pretrained window the long factors serve, scaled by `long_mscale`.
    let long = DecoderConfig::from_hf_json(&config).unwrap().serve_context(Some(1024));
    assert_eq!(long.rope_scaling.as_ref().unwrap().attention_factor(), 1.3);
}

#[test]
fn the_phimoe_gguf_loads_to_the_same_model() {
    let dir = tempfile::tempdir().unwrap();
    let tensors = testing::random_phimoe(&SHAPE, &MOE, 59).unwrap();
    let mut named = gguf_with_stacked_experts(&tensors, 0..SHAPE.layers, MOE.experts);
    let half = SHAPE.head_dim / 2;
    let factors = |base: f32| {
        let values: Vec<f32> = (0..half).map(|i| base + 0.25 * i as f32).collect();
        gguf_f32(&Tensor::new(values.as_slice(), &Device::Cpu).unwrap())
    };
    named.push(("rope_factors_short.weight".into(), factors(1.0)));
    named.push(("rope_factors_long.weight".into(), factors(2.0)));
    let extra = [
        ("phimoe.expert_count", GgufValue::U32(MOE.experts as u32)),
        ("phimoe.expert_used_count", GgufValue::U32(2)),
        ("phimoe.feed_forward_length", GgufValue::U32(MOE.expert_intermediate as u32)),
        ("phimoe.attention.layer_norm_epsilon", GgufValue::F32(1e-5)),
        ("phimoe.rope.scaling.original_context_length", GgufValue::U32(512)),
        ("phimoe.rope.scaling.attn_factor", GgufValue::F32(1.2)),
    ];
    let path = dir.path().join("phimoe.gguf");
    write_gguf(&path, "phimoe", &SHAPE, &named, &extra);
    let (gguf, _) = load_causal_lm(&path, &Device::Cpu, ModelDType::F32).unwrap();
    assert_eq!(gguf.config().architecture, Architecture::PhiMoe);
    assert!(gguf.config().lm_head_bias);
    // The file carries no jitter: the released 0.01 serves.
    let want = reference(&tensors, Choice::SparseMixer(0.01)).logits(&ids());
    assert_close(&logits(&gguf, &ids(), false), &want, "the phimoe GGUF");
}

#[test]
fn configuration_errors_name_their_key() {
    let mut three = testing::phimoe_config(&SHAPE, &MOE, 0.01);
    three["num_experts_per_tok"] = json!(3);
    let e = DecoderConfig::from_hf_json(&three).unwrap_err().to_string();
    assert!(e.contains("num_experts_per_tok") && e.contains("sparsemixer"), "{e}");
    let mut half = testing::phimoe_config(&SHAPE, &MOE, 0.01);
    half["rope_scaling"].as_object_mut().unwrap().remove("long_mscale");
    let e = DecoderConfig::from_hf_json(&half).unwrap_err().to_string();
    assert!(e.contains("rope_scaling") && e.contains("long_mscale"), "{e}");
}
