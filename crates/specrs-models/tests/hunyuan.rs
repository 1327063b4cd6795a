//! HunYuan dense (`HunYuanDenseV1ForCausalLM`) on a tiny checkpoint in its real layout: per-head
//! q/k norms named `query_layernorm` / `key_layernorm` applied after RoPE, and RoPE's base raised
//! by NTK-alpha, matching transformers' forward (`common::Reference`) in one prefill and token by
//! token; its `hunyuan-dense` GGUF (the raised base as `rope.freq_base`) loads to the same
//! model; cross-layer attention is refused by key.

mod common;

use std::collections::HashMap;

use candle_core::quantized::gguf_file::Value as GgufValue;
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use common::{Reference, assert_close, assert_within, logits, write_gguf};
use serde_json::json;
use specrs_models::testing::{self, TinyShape};
use specrs_models::weights::gguf::gguf_name;
use specrs_models::{Architecture, DecoderConfig, ModelDType, load_causal_lm};

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
    let named: Vec<(String, QTensor)> = tensors
        .iter()
        .map(|(name, t)| (gguf_name(name).unwrap(), QTensor::quantize(t, GgmlDType::F32).unwrap()))
        .collect();
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
