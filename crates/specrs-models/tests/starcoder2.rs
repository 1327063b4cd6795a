//! StarCoder2 (`Starcoder2ForCausalLM`) on a tiny checkpoint in its real layout: biases on every
//! projection, LayerNorms with bias, an MLP without a gate (`c_proj(gelu_tanh(c_fc(x)))`) and
//! a sliding window, matching transformers' forward (`common::Reference`) in one prefill and
//! token by token; its `starcoder2` GGUF (q/k rows as the checkpoint has them, no window
//! written) loads to the same model attending fully; other activations are refused by key.

mod common;

use std::collections::HashMap;

use candle_core::quantized::gguf_file::Value as GgufValue;
use candle_core::{Device, Tensor};
use common::{Reference, assert_close, gguf_named, logits, write_gguf};
use serde_json::json;
use specrs_models::testing::{self, TinyShape};
use specrs_models::{Architecture, DecoderConfig, ModelDType, load_causal_lm};

const SHAPE: TinyShape =
    TinyShape { vocab: 40, hidden: 32, layers: 3, heads: 4, kv_heads: 2, head_dim: 8, intermediate: 48 };
const WINDOW: usize = 4;

fn ids() -> Vec<u32> {
    (0..10).map(|i| (i * 7 + 5) % 40).collect()
}

/// StarCoder2's forward: LayerNorms, tanh GELU without a gate, attending within `window`.
fn reference(tensors: &HashMap<String, Tensor>, window: Option<usize>) -> Reference<'_> {
    Reference { centered_norms: true, ungated_gelu: true, window, ..Reference::plain(tensors, SHAPE) }
}

#[test]
fn biased_projections_layer_norms_with_bias_and_a_gelu_mlp_match_the_transformers_forward() {
    let dir = tempfile::tempdir().unwrap();
    let tensors = testing::random_starcoder2(&SHAPE, 29).unwrap();
    testing::write_checkpoint(
        dir.path(),
        &testing::starcoder2_config(&SHAPE, Some(WINDOW)),
        &testing::as_starcoder2(&tensors),
    )
    .unwrap();
    let (model, _) = load_causal_lm(dir.path(), &Device::Cpu, ModelDType::F32).unwrap();
    let cfg = model.config();
    assert_eq!(cfg.architecture, Architecture::Starcoder2);
    assert!(cfg.attention_bias && cfg.attention_output_bias && cfg.mlp_bias && cfg.norms_have_bias());
    assert!(cfg.tie_word_embeddings && !cfg.mlp_is_gated());
    assert_eq!(cfg.sliding_window, Some(WINDOW));
    let want = reference(&tensors, Some(WINDOW)).logits(&ids());
    assert_close(&logits(&model, &ids(), false), &want, "one prefill");
    assert_close(&logits(&model, &ids(), true), &want, "token by token");
    // What the test holds the model to matters: without the norms' biases, with relu² in
    // place of GELU, or attending fully, the logits differ.
    let unbiased: HashMap<String, Tensor> = tensors
        .iter()
        .filter(|(n, _)| !n.contains("layernorm.bias") && *n != "model.norm.bias")
        .map(|(n, t)| (n.clone(), t.clone()))
        .collect();
    for (what, other) in [
        ("norms without bias", reference(&unbiased, Some(WINDOW)).logits(&ids())),
        ("relu² MLP", Reference { ungated_gelu: false, ..reference(&tensors, Some(WINDOW)) }.logits(&ids())),
        ("no window", reference(&tensors, None).logits(&ids())),
    ] {
        let diff = other.iter().flatten().zip(want.iter().flatten()).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(diff > 1e-3, "{what} gives the same logits");
    }
}

#[test]
fn the_starcoder2_gguf_loads_to_the_same_model_attending_fully() {
    let dir = tempfile::tempdir().unwrap();
    let tensors = testing::random_starcoder2(&SHAPE, 31).unwrap();
    // llama.cpp's converter keeps StarCoder2's q/k rows (NeoX RoPE) and writes no window.
    let named = gguf_named(&tensors, |_| false, false);
    let path = dir.path().join("starcoder2.gguf");
    let eps = [("starcoder2.attention.layer_norm_epsilon", GgufValue::F32(1e-5))];
    write_gguf(&path, "starcoder2", &SHAPE, &named, &eps);
    let (gguf, _) = load_causal_lm(&path, &Device::Cpu, ModelDType::F32).unwrap();
    let cfg = gguf.config();
    assert_eq!(cfg.architecture, Architecture::Starcoder2);
    assert!(cfg.attention_output_bias && cfg.mlp_bias && cfg.tie_word_embeddings);
    assert_eq!(cfg.sliding_window, None);
    let want = reference(&tensors, None).logits(&ids());
    assert_close(&logits(&gguf, &ids(), false), &want, "the starcoder2 GGUF");
    assert_close(&logits(&gguf, &ids(), true), &want, "the starcoder2 GGUF token by token");
}

#[test]
fn the_config_reads_use_bias_and_norm_epsilon_and_refuses_other_activations() {
    let c = DecoderConfig::from_hf_json(&testing::starcoder2_config(&SHAPE, None)).unwrap();
    assert_eq!((c.rms_norm_eps, c.sliding_window), (1e-5, None));
    let mut plain = testing::starcoder2_config(&SHAPE, Some(WINDOW));
    plain["use_bias"] = json!(false);
    plain["norm_epsilon"] = json!(1e-6);
    let c = DecoderConfig::from_hf_json(&plain).unwrap();
    assert!(!c.attention_bias && !c.attention_output_bias && !c.mlp_bias);
    assert_eq!(c.rms_norm_eps, 1e-6);
    // Released configs leave tie_word_embeddings and use_bias to their defaults (true).
    let mut defaults = testing::starcoder2_config(&SHAPE, None);
    let map = defaults.as_object_mut().unwrap();
    map.remove("use_bias");
    map.remove("tie_word_embeddings");
    let c = DecoderConfig::from_hf_json(&defaults).unwrap();
    assert!(c.attention_bias && c.mlp_bias && c.tie_word_embeddings);

    let mut relu = testing::starcoder2_config(&SHAPE, None);
    relu["hidden_act"] = json!("relu");
    let e = DecoderConfig::from_hf_json(&relu).unwrap_err().to_string();
    assert!(e.contains("hidden_act") && e.contains("gelu_pytorch_tanh"), "{e}");
}
