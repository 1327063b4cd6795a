//! Gemma 2 (`Gemma2ForCausalLM`) on a tiny checkpoint written in its real layout: Gemma's
//! norms around attention and MLP without q/k norms, sliding and full layers alternating under
//! one RoPE, and scores and logits soft-capped, all matching transformers' forward
//! (`common::Reference`) in one prefill and token by token; a `gemma2` GGUF loads to the same
//! model; the caps default as `Gemma2Config` does and bad ones are refused by key.

mod common;

use candle_core::Device;
use candle_core::quantized::gguf_file::Value as GgufValue;
use common::{GemmaLayout, Reference, assert_close, logits, write_unpermuted_gguf};
use serde_json::json;
use specrs_models::testing::{self, TinyShape};
use specrs_models::{Architecture, DecoderConfig, ModelDType, load_causal_lm};

const SHAPE: TinyShape =
    TinyShape { vocab: 40, hidden: 32, layers: 4, heads: 4, kv_heads: 2, head_dim: 8, intermediate: 48 };
/// Gemma 2's pattern: sliding first, then alternating.
const SLIDING: [bool; 4] = [true, false, true, false];
const WINDOW: usize = 3;
/// Caps low enough to bite on the tiny model's scores (about ±3) and logits (about ±4).
const CAPS: (f64, f64) = (1.5, 2.0);

fn reference(
    tensors: &std::collections::HashMap<String, candle_core::Tensor>,
    caps: Option<(f32, f32)>,
) -> Reference<'_> {
    Reference {
        gemma: Some(GemmaLayout {
            sliding: SLIDING.to_vec(),
            window: WINDOW,
            local_theta: 10_000.0,
            scale: 12f32.powf(-0.5),
            softcaps: caps,
        }),
        ..Reference::plain(tensors, SHAPE)
    }
}

#[test]
fn alternating_layers_and_soft_caps_match_the_transformers_forward() {
    let dir = tempfile::tempdir().unwrap();
    let tensors = testing::random_gemma2(&SHAPE, 3).unwrap();
    testing::write_checkpoint(dir.path(), &testing::gemma2_config(&SHAPE, &SLIDING, WINDOW, CAPS), &tensors).unwrap();
    let (model, _) = load_causal_lm(dir.path(), &Device::Cpu, ModelDType::F32).unwrap();
    let cfg = model.config();
    assert_eq!(cfg.architecture, Architecture::Gemma2);
    assert!(!cfg.qk_norm && cfg.tie_word_embeddings);
    let ids: Vec<u32> = (0..11).map(|i| (i * 7 + 3) % 40).collect();
    let want = reference(&tensors, Some((CAPS.0 as f32, CAPS.1 as f32))).logits(&ids);
    assert_close(&logits(&model, &ids, false), &want, "one prefill");
    assert_close(&logits(&model, &ids, true), &want, "token by token");
    // The caps shape the output: without them the same weights give other logits.
    let uncapped = reference(&tensors, None).logits(&ids);
    let gap = want.iter().flatten().zip(uncapped.iter().flatten()).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    assert!(gap > 0.1, "the caps changed the logits by only {gap}");
    assert!(want.iter().flatten().all(|v| v.abs() <= CAPS.1 as f32), "logits lie within the final cap");
}

#[test]
fn a_gemma2_gguf_loads_to_the_same_model() {
    let dir = tempfile::tempdir().unwrap();
    let tensors = testing::random_gemma2(&SHAPE, 9).unwrap();
    // llama.cpp's score scale is head_dim^-0.5: the safetensors config says the same.
    let mut config = testing::gemma2_config(&SHAPE, &SLIDING, WINDOW, CAPS);
    config["query_pre_attn_scalar"] = json!(SHAPE.head_dim);
    config.as_object_mut().unwrap().remove("layer_types");
    testing::write_checkpoint(&dir.path().join("hf"), &config, &tensors).unwrap();
    let path = dir.path().join("gemma2.gguf");
    let extra = [
        ("gemma2.attention.sliding_window", GgufValue::U32(WINDOW as u32)),
        ("gemma2.attn_logit_softcapping", GgufValue::F32(CAPS.0 as f32)),
        ("gemma2.final_logit_softcapping", GgufValue::F32(CAPS.1 as f32)),
    ];
    write_unpermuted_gguf(&path, "gemma2", &SHAPE, &tensors, true, &extra);
    let (gguf, _) = load_causal_lm(&path, &Device::Cpu, ModelDType::F32).unwrap();
    let (hf, _) = load_causal_lm(&dir.path().join("hf"), &Device::Cpu, ModelDType::F32).unwrap();
    assert_eq!(gguf.config().architecture, Architecture::Gemma2);
    assert_eq!(
        gguf.config().gemma,
        hf.config().gemma.clone().map(|g| specrs_models::config::GemmaConfig { norms_store_scale: true, ..g })
    );
    let windows = |cfg: &specrs_models::DecoderConfig| (cfg.sliding_window, cfg.sliding_layers.clone());
    assert_eq!(windows(gguf.config()), windows(hf.config()));
    assert_eq!(gguf.config().scales, hf.config().scales);
    let ids: Vec<u32> = (0..9).map(|i| (i * 5 + 3) % 40).collect();
    assert_close(&logits(&gguf, &ids, false), &logits(&hf, &ids, false), "GGUF vs safetensors");
}

#[test]
fn configuration_is_read_as_transformers_reads_it_and_errors_name_their_key() {
    // Without layer_types: sliding, full, sliding, ... ; without the caps: 50 and 30.
    let mut c = testing::gemma2_config(&TinyShape { layers: 6, ..SHAPE }, &[false; 6], WINDOW, CAPS);
    let object = c.as_object_mut().unwrap();
    for key in ["layer_types", "attn_logit_softcapping", "final_logit_softcapping"] {
        object.remove(key);
    }
    let cfg = DecoderConfig::from_hf_json(&c).unwrap();
    let windows: Vec<Option<usize>> = (0..6).map(|i| cfg.layer_sliding_window(i)).collect();
    assert_eq!(windows, [Some(WINDOW), None, Some(WINDOW), None, Some(WINDOW), None]);
    assert_eq!((cfg.scales.attention_softcap, cfg.scales.logits_softcap), (Some(50.0), Some(30.0)));
    let gemma = cfg.gemma.as_ref().unwrap();
    assert_eq!(gemma.local_rope_theta, cfg.rope_theta, "one RoPE for every layer");
    // `null` turns a cap off.
    c["final_logit_softcapping"] = serde_json::Value::Null;
    assert_eq!(DecoderConfig::from_hf_json(&c).unwrap().scales.logits_softcap, None);
    let error = |key: &str, value: serde_json::Value| {
        let mut c = testing::gemma2_config(&SHAPE, &SLIDING, WINDOW, CAPS);
        c[key] = value;
        DecoderConfig::from_hf_json(&c).unwrap_err().to_string()
    };
    let e = error("attn_logit_softcapping", json!(-50.0));
    assert!(e.contains("attn_logit_softcapping") && e.contains("positive"), "{e}");
    let e = error("final_logit_softcapping", json!("thirty"));
    assert!(e.contains("final_logit_softcapping"), "{e}");
    let e = error("layer_types", json!(["sliding_attention"]));
    assert!(e.contains("layer_types") && e.contains("names 1 layers, the model has 4"), "{e}");
}
