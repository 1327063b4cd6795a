//! Apertus (`ApertusForCausalLM`) on a tiny checkpoint in its real layout: Llama's layer with
//! per-head q/k norms, its norms named `attention_layernorm` / `feedforward_layernorm`, and an
//! MLP without a gate whose xIELU has learned parameters in every layer; it matches
//! transformers' forward (`common::Reference`) in one prefill and token by token, and its
//! `apertus` GGUF (q/k rows as the checkpoint has them, the xIELU parameters as `xielu.*`
//! metadata, per layer or one for all) loads to the same model.

mod common;

use std::collections::HashMap;

use candle_core::quantized::gguf_file::Value as GgufValue;
use candle_core::{Device, Tensor};
use common::{Reference, assert_close, gguf_named, logits, max_gap, write_gguf};
use serde_json::json;
use specrs_models::testing::{self, TinyShape};
use specrs_models::{Architecture, DecoderConfig, ModelDType, load_causal_lm};

const SHAPE: TinyShape =
    TinyShape { vocab: 40, hidden: 32, layers: 3, heads: 4, kv_heads: 2, head_dim: 8, intermediate: 48 };

/// The `xielu.*` metadata llama.cpp's converter writes: each parameter's stored value in every
/// layer (`layers: None`: layer 0's alone, which llama.cpp broadcasts).
fn xielu_metadata(tensors: &HashMap<String, Tensor>, layers: Option<usize>) -> Vec<(&'static str, GgufValue)> {
    let value = |layer: usize, name: &str| {
        GgufValue::F32(tensors[&format!("model.layers.{layer}.mlp.act_fn.{name}")].to_vec1::<f32>().unwrap()[0])
    };
    [("xielu.alpha_p", "alpha_p"), ("xielu.alpha_n", "alpha_n"), ("xielu.beta", "beta"), ("xielu.eps", "eps")]
        .into_iter()
        .map(|(key, name)| match layers {
            Some(n) => (key, GgufValue::Array((0..n).map(|l| value(l, name)).collect())),
            None => (key, value(0, name)),
        })
        .collect()
}

#[test]
fn apertus_matches_the_transformers_forward_and_its_gguf() {
    let dir = tempfile::tempdir().unwrap();
    let tensors = testing::random_apertus(&SHAPE, 29).unwrap();
    testing::write_checkpoint(dir.path(), &testing::apertus_config(&SHAPE), &testing::as_apertus(&tensors)).unwrap();
    let (model, _) = load_causal_lm(dir.path(), &Device::Cpu, ModelDType::F32).unwrap();
    let cfg = model.config();
    assert_eq!(cfg.architecture, Architecture::Apertus);
    assert!(cfg.qk_norm && !cfg.mlp_is_gated());
    let ids: Vec<u32> = (0..10).map(|i| (i * 7 + 5) % 40).collect();
    let want = Reference::plain(&tensors, SHAPE).logits(&ids);
    assert_close(&logits(&model, &ids, false), &want, "one prefill");
    assert_close(&logits(&model, &ids, true), &want, "token by token");

    // Each layer's own parameters count: the first layer's everywhere is another model.
    let mut shared = tensors.clone();
    for i in 1..SHAPE.layers {
        for name in ["alpha_p", "alpha_n"] {
            let first = shared[&format!("model.layers.0.mlp.act_fn.{name}")].clone();
            shared.insert(format!("model.layers.{i}.mlp.act_fn.{name}"), first);
        }
    }
    assert!(max_gap(&Reference::plain(&shared, SHAPE).logits(&ids), &want) > 1e-2, "the parameters matter");

    let is_act = |name: &str| name.contains(".act_fn.");
    let named = gguf_named(&tensors, is_act, false);
    let path = dir.path().join("apertus.gguf");
    write_gguf(&path, "apertus", &SHAPE, &named, &xielu_metadata(&tensors, Some(SHAPE.layers)));
    let (gguf, _) = load_causal_lm(&path, &Device::Cpu, ModelDType::F32).unwrap();
    assert_close(&logits(&gguf, &ids, false), &want, "the apertus GGUF");

    // One value for every layer (llama.cpp broadcasts a scalar key).
    let path = dir.path().join("apertus-shared.gguf");
    write_gguf(&path, "apertus", &SHAPE, &named, &xielu_metadata(&shared, None));
    let (gguf, _) = load_causal_lm(&path, &Device::Cpu, ModelDType::F32).unwrap();
    assert_close(&logits(&gguf, &ids, false), &Reference::plain(&shared, SHAPE).logits(&ids), "one value for all");

    // A GGUF without the parameters is refused by name.
    let path = dir.path().join("apertus-bare.gguf");
    write_gguf(&path, "apertus", &SHAPE, &named, &[]);
    let e = load_causal_lm(&path, &Device::Cpu, ModelDType::F32).err().unwrap().to_string();
    assert!(e.contains("act_fn.alpha_p"), "{e}");

    let mut swiglu = testing::apertus_config(&SHAPE);
    swiglu["hidden_act"] = json!("silu");
    let e = DecoderConfig::from_hf_json(&swiglu).unwrap_err().to_string();
    assert!(e.contains("hidden_act"), "{e}");
}
