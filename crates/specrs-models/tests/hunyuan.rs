//! HunYuan dense (`HunYuanDenseV1ForCausalLM`) on a tiny checkpoint in its real layout: per-head
//! q/k norms named `query_layernorm` / `key_layernorm` applied after RoPE, and RoPE's base raised
//! by NTK-alpha, matching transformers' forward (`common::Reference`) in one prefill and token by
//! token; its `hunyuan-dense` GGUF (the raised base as `rope.freq_base`) loads to the same
//! model; cross-layer attention is refused by key. Hunyuan-A13B (`HunYuanMoEV1ForCausalLM`):
//! the same attention with renormalised softmax experts (router `mlp.gate.wg`) beside an ungated
//! shared MLP (`mlp.shared_mlp`), and its `hunyuan-moe` GGUF.

mod common;

use std::collections::HashMap;

use candle_core::quantized::gguf_file::Value as GgufValue;
use candle_core::{Device, Tensor};
use common::{
    Choice, Reference, Routing, assert_close, assert_within, gguf_named, gguf_with_stacked_experts, logits, write_gguf,
};
use serde_json::json;
use specrs_models::testing::{self, TinyMoe, TinyShape};
use specrs_models::{Architecture, DecoderConfig, ModelDType, SharedExpertConfig, load_causal_lm};

const SHAPE: TinyShape =
    TinyShape { vocab: 40, hidden: 32, layers: 3, heads: 4, kv_heads: 2, head_dim: 8, intermediate: 48 };
const ALPHA: f64 = 50.0;

fn config() -> serde_json::Value {
    let mut c = testing::target_config(Architecture::HunYuanDense, &SHAPE, true);
    c["use_qk_norm"] = json!(true);
    c["use_cla"] = json!(false);
    c["attention_bias"] = json!(false);
    c["rope_scaling"] = json!({"alpha": ALPHA, "factor": 1.0, "type": "dynamic", "beta_fast": 32, "beta_slow": 1});
    c
}

#[test]
fn qk_norms_after_rope_and_an_ntk_alpha_base_match_the_transformers_forward() {
    let dir = tempfile::tempdir().unwrap();
    // Qwen3's tensors carry the per-head q/k norms; HunYuan names them otherwise.
    let tensors = testing::random_target(Architecture::Qwen3, &SHAPE, true, 53).unwrap();
    let stored: HashMap<String, Tensor> = tensors
        .iter()
        .map(|(name, t)| {
            (name.replace(".q_norm.", ".query_layernorm.").replace(".k_norm.", ".key_layernorm."), t.clone())
        })
        .collect();
    testing::write_checkpoint(dir.path(), &config(), &stored).unwrap();
    let (model, _) = load_causal_lm(dir.path(), &Device::Cpu, ModelDType::F32).unwrap();
    let cfg = model.config();
    let d = SHAPE.head_dim as f64;
    assert_eq!(cfg.architecture, Architecture::HunYuanDense);
    assert!(cfg.qk_norm && cfg.qk_norm_after_rope());
    assert!((cfg.rope_theta - 10_000.0 * ALPHA.powf(d / (d - 2.0))).abs() < 1e-3, "{}", cfg.rope_theta);
    // The raised base as per-frequency factors: (θ·a^(d/(d-2)))^(2i/d) = θ^(2i/d) · a^(2i/(d-2)).
    let factors: Vec<f64> = (0..SHAPE.head_dim / 2).map(|i| ALPHA.powf(2.0 * i as f64 / (d - 2.0))).collect();
    let reference = |after: bool| Reference {
        factors: factors.clone(),
        qk_norm_after_rope: after,
        ..Reference::plain(&tensors, SHAPE)
    };
    let ids: Vec<u32> = (0..10).map(|i| (i * 7 + 2) % 40).collect();
    let want = reference(true).logits(&ids);
    assert_close(&logits(&model, &ids, false), &want, "one prefill");
    assert_close(&logits(&model, &ids, true), &want, "token by token");
    // Norming before RoPE gives other logits.
    let before = reference(false).logits(&ids);
    let gap = want.iter().flatten().zip(before.iter().flatten()).map(|(a, b)| (a - b).abs());
    assert!(gap.fold(0f32, f32::max) > 1e-3, "the norm's place changes nothing");
    // llama.cpp's file: the shared layer's names, the raised base as metadata.
    let named = gguf_named(&tensors, |_| false, false);
    let path = dir.path().join("hunyuan.gguf");
    let base = GgufValue::F32(cfg.rope_theta as f32);
    write_gguf(&path, "hunyuan-dense", &SHAPE, &named, &[("hunyuan-dense.rope.freq_base", base)]);
    let (gguf, _) = load_causal_lm(&path, &Device::Cpu, ModelDType::F32).unwrap();
    assert!(gguf.config().qk_norm_after_rope());
    assert_within(&logits(&gguf, &ids, false), &want, 1e-3, "the hunyuan-dense GGUF (its base stored as f32)");
    let mut cla = config();
    cla["use_cla"] = json!(true);
    let e = DecoderConfig::from_hf_json(&cla).unwrap_err().to_string();
    assert!(e.contains("use_cla"), "{e}");
}

const MOE: TinyMoe = TinyMoe {
    experts: 4,
    top_k: 2,
    expert_intermediate: 24,
    shared_intermediate: Some(40),
    norm_topk_prob: true,
    dense_layers: Vec::new(),
    groups: (1, 1, 1.0),
};

#[test]
fn hunyuan_a13b_experts_and_shared_mlp_match_the_transformers_forward_and_its_gguf() {
    let dir = tempfile::tempdir().unwrap();
    let mut tensors = testing::random_moe_target(Architecture::HunYuanMoe, &SHAPE, &MOE, 59).unwrap();
    tensors.remove("lm_head.weight"); // A13B ties its head to the embeddings.
    testing::write_checkpoint(
        dir.path(),
        &testing::hunyuan_moe_config(&SHAPE, &MOE, ALPHA),
        &testing::as_hunyuan(&tensors),
    )
    .unwrap();
    let (model, _) = load_causal_lm(dir.path(), &Device::Cpu, ModelDType::F32).unwrap();
    let cfg = model.config();
    assert_eq!(cfg.architecture, Architecture::HunYuanMoe);
    assert!(cfg.qk_norm && cfg.qk_norm_after_rope());
    let moe = cfg.moe.as_ref().unwrap();
    assert_eq!((moe.num_experts, moe.top_k, moe.expert_intermediate_size), (4, 2, 24));
    assert_eq!(moe.shared_expert, Some(SharedExpertConfig { intermediate_size: 40, gated: false }));
    let d = SHAPE.head_dim as f64;
    let factors: Vec<f64> = (0..SHAPE.head_dim / 2).map(|i| ALPHA.powf(2.0 * i as f64 / (d - 2.0))).collect();
    let want = Reference {
        factors,
        qk_norm_after_rope: true,
        routing: Some(Routing { top_k: 2, norm_topk_prob: true, choice: Choice::Softmax }),
        ..Reference::plain(&tensors, SHAPE)
    }
    .logits(&ids());
    assert_close(&logits(&model, &ids(), false), &want, "one prefill");
    assert_close(&logits(&model, &ids(), true), &want, "token by token");
    // llama.cpp's `hunyuan-moe`: the shared layer's names, experts stacked, the raised base.
    let named = gguf_with_stacked_experts(&tensors, 0..SHAPE.layers, MOE.experts);
    let u32v = |x: usize| GgufValue::U32(x as u32);
    let metadata = [
        ("hunyuan-moe.rope.freq_base", GgufValue::F32(cfg.rope_theta as f32)),
        ("hunyuan-moe.expert_count", u32v(MOE.experts)),
        ("hunyuan-moe.expert_used_count", u32v(MOE.top_k)),
        ("hunyuan-moe.expert_feed_forward_length", u32v(MOE.expert_intermediate)),
        ("hunyuan-moe.expert_shared_feed_forward_length", u32v(40)),
    ];
    let path = dir.path().join("hunyuan-moe.gguf");
    write_gguf(&path, "hunyuan-moe", &SHAPE, &named, &metadata);
    let (gguf, _) = load_causal_lm(&path, &Device::Cpu, ModelDType::F32).unwrap();
    assert_eq!(gguf.config().moe, cfg.moe);
    assert_within(&logits(&gguf, &ids(), false), &want, 1e-3, "the hunyuan-moe GGUF (its base stored as f32)");
    // Layers that differ, and leading dense ones, are refused by key.
    for (key, value) in [("moe_topk", json!([2, 1, 2])), ("moe_layer_num_skipped", json!(1))] {
        let mut c = testing::hunyuan_moe_config(&SHAPE, &MOE, ALPHA);
        c[key] = value;
        let e = DecoderConfig::from_hf_json(&c).unwrap_err().to_string();
        assert!(e.contains(key), "{key}: {e}");
    }
}

fn ids() -> Vec<u32> {
    (0..10).map(|i| (i * 7 + 2) % 40).collect()
}
