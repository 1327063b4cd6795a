//! Phi-3 (`Phi3ForCausalLM`) on tiny checkpoints written in the real formats:
//! - fused projections: a Llama checkpoint stored the Phi-3 way computes the same logits;
//! - LongRoPE (both factor sets, the cos/sin scale), partial rotary dims and the sliding window
//!   match transformers' Phi-3 forward (`common::Reference`), in one prefill and token by
//!   token against the paged cache;
//! - the same checkpoint as llama.cpp's converter writes it (GGUF `phi3`) loads to the same
//!   model;
//! - configuration errors name their key.

mod common;

use std::collections::HashMap;
use std::path::Path;

use common::{Reference, assert_close, gguf_f32, gguf_named, logits};

use candle_core::quantized::QTensor;
use candle_core::quantized::gguf_file::{self, Value as GgufValue};
use candle_core::{Device, Tensor};
use serde_json::{Value, json};
use specrs_models::config::RopeScaling;
use specrs_models::testing::{self, TinyShape};
use specrs_models::{Architecture, CausalLm, DecoderConfig, ModelDType, WeightStore, load_causal_lm};

const SHAPE: TinyShape =
    TinyShape { vocab: 40, hidden: 32, layers: 2, heads: 4, kv_heads: 2, head_dim: 8, intermediate: 48 };
const SHORT: [f64; 2] = [1.0, 1.5];
const LONG: [f64; 2] = [3.0, 5.0];
const WINDOW: usize = 5;

/// Phi-3-mini-128k's shape of configuration, shrunk: LongRoPE over a 32-token pretrained
/// window stretched to 128, half of each head rotated (as Phi-4-mini rotates three
/// quarters), a 5-key window.
fn long_context_config() -> Value {
    let mut c = testing::target_config(Architecture::Phi3, &SHAPE, false);
    let extra = json!({
        "partial_rotary_factor": 0.5,
        "original_max_position_embeddings": 32,
        "max_position_embeddings": 128,
        "sliding_window": WINDOW,
        "rope_scaling": {"type": "longrope", "short_factor": SHORT, "long_factor": LONG},
    });
    for (k, v) in extra.as_object().unwrap() {
        c[k] = v.clone();
    }
    c
}

fn phi3_tensors(seed: u64) -> HashMap<String, Tensor> {
    testing::fused_as_phi3(testing::random_target(Architecture::Llama, &SHAPE, false, seed).unwrap(), &SHAPE).unwrap()
}

fn load_served(dir: &Path, context: Option<usize>) -> CausalLm {
    let store = WeightStore::open(dir, Device::Cpu, ModelDType::F32).unwrap();
    let cfg = specrs_models::models::read_config(&store, dir).unwrap().serve_context(context);
    CausalLm::load(&store, cfg).unwrap()
}

/// Transformers' Phi-3 forward over `tensors` with the given LongRoPE set.
fn reference(tensors: &HashMap<String, Tensor>, ids: &[u32], factors: [f64; 2], magnitude: f64) -> Vec<Vec<f32>> {
    Reference {
        rotary: SHAPE.head_dim / 2,
        factors: factors.to_vec(),
        magnitude,
        window: Some(WINDOW),
        ..Reference::plain(tensors, SHAPE)
    }
    .logits(ids)
}

#[test]
fn fused_projections_compute_what_the_llama_checkpoint_computes() {
    let dir = tempfile::tempdir().unwrap();
    let (llama_dir, phi3_dir) = (dir.path().join("llama"), dir.path().join("phi3"));
    let llama = testing::random_target(Architecture::Llama, &SHAPE, false, 7).unwrap();
    testing::write_checkpoint(&llama_dir, &testing::target_config(Architecture::Llama, &SHAPE, false), &llama).unwrap();
    let fused = testing::fused_as_phi3(llama, &SHAPE).unwrap();
    testing::write_checkpoint(&phi3_dir, &testing::target_config(Architecture::Phi3, &SHAPE, false), &fused).unwrap();
    let (phi3, _) = load_causal_lm(&phi3_dir, &Device::Cpu, ModelDType::F32).unwrap();
    assert!(phi3.config().fused_projections && phi3.config().sliding_window.is_none());
    let (llama, _) = load_causal_lm(&llama_dir, &Device::Cpu, ModelDType::F32).unwrap();
    let ids: Vec<u32> = (0..12).map(|i| (i * 7 + 3) % 40).collect();
    assert_close(&logits(&phi3, &ids, false), &logits(&llama, &ids, false), "phi3 vs llama");
}

#[test]
fn long_rope_partial_rotary_and_window_match_the_transformers_forward() {
    let dir = tempfile::tempdir().unwrap();
    let tensors = phi3_tensors(11);
    testing::write_checkpoint(dir.path(), &long_context_config(), &tensors).unwrap();
    // Stretched 4x past a 32-token window: sqrt(1 + ln 4 / ln 32).
    let magnitude = (1.0 + 4f64.ln() / 32f64.ln()).sqrt();
    let ids: Vec<u32> = (0..14).map(|i| (i * 11 + 5) % 40).collect();
    for (context, factors, set) in [(None, LONG, "long"), (Some(32), SHORT, "short")] {
        let model = load_served(dir.path(), context);
        assert_eq!((model.config().rotary_dim, model.config().sliding_window), (4, Some(WINDOW)));
        let want = reference(&tensors, &ids, factors, magnitude);
        assert_close(&logits(&model, &ids, false), &want, &format!("{set} factors, one prefill"));
        assert_close(&logits(&model, &ids, true), &want, &format!("{set} factors, token by token"));
    }
}

#[test]
fn the_window_hides_keys_only_past_its_length() {
    let dir = tempfile::tempdir().unwrap();
    let tensors = phi3_tensors(13);
    let mut cfg = long_context_config();
    testing::write_checkpoint(dir.path(), &cfg, &tensors).unwrap();
    let windowed = load_served(dir.path(), None);
    cfg["sliding_window"] = Value::Null;
    testing::write_checkpoint(dir.path(), &cfg, &tensors).unwrap();
    let full = load_served(dir.path(), None);
    let ids: Vec<u32> = (0..10).map(|i| (i * 3 + 1) % 40).collect();
    let (a, b) = (logits(&windowed, &ids, false), logits(&full, &ids, false));
    assert_close(&a[..WINDOW], &b[..WINDOW], "within the window");
    assert!(a[WINDOW..].iter().zip(&b[WINDOW..]).all(|(x, y)| x != y), "past the window every token sees fewer keys");
}

/// Writes `tensors` as llama.cpp's converter writes a Phi-3 GGUF (f32 tensors; the LongRoPE
/// factors as `rope_factors_*` tensors).
fn write_phi3_gguf(path: &Path, tensors: &HashMap<String, Tensor>, scale_in_metadata: Option<f32>) {
    let mut named = gguf_named(tensors, |_| false, false);
    let factors = |f: [f64; 2]| Tensor::new(&[f[0] as f32, f[1] as f32], &Device::Cpu).unwrap();
    named.push(("rope_factors_short.weight".into(), gguf_f32(&factors(SHORT))));
    named.push(("rope_factors_long.weight".into(), gguf_f32(&factors(LONG))));
    let u32v = |x: usize| GgufValue::U32(x as u32);
    let mut metadata = vec![
        ("general.architecture", GgufValue::String("phi3".into())),
        ("phi3.embedding_length", u32v(SHAPE.hidden)),
        ("phi3.feed_forward_length", u32v(SHAPE.intermediate)),
        ("phi3.block_count", u32v(SHAPE.layers)),
        ("phi3.attention.head_count", u32v(SHAPE.heads)),
        ("phi3.attention.head_count_kv", u32v(SHAPE.kv_heads)),
        ("phi3.rope.dimension_count", u32v(SHAPE.head_dim / 2)),
        ("phi3.context_length", u32v(128)),
        ("phi3.rope.scaling.original_context_length", u32v(32)),
        ("phi3.attention.sliding_window", u32v(WINDOW)),
        ("phi3.attention.layer_norm_rms_epsilon", GgufValue::F32(1e-5)),
        ("phi3.rope.freq_base", GgufValue::F32(10_000.0)),
        ("phi3.vocab_size", u32v(SHAPE.vocab)),
    ];
    if let Some(scale) = scale_in_metadata {
        metadata.push(("phi3.rope.scaling.attn_factor", GgufValue::F32(scale)));
    }
    let metadata: Vec<(&str, &GgufValue)> = metadata.iter().map(|(k, v)| (*k, v)).collect();
    let named: Vec<(&str, &QTensor)> = named.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let mut file = std::fs::File::create(path).unwrap();
    gguf_file::write(&mut file, &metadata, &named).unwrap();
}

#[test]
fn a_phi3_gguf_loads_to_the_same_model() {
    let dir = tempfile::tempdir().unwrap();
    let tensors = phi3_tensors(17);
    testing::write_checkpoint(&dir.path().join("hf"), &long_context_config(), &tensors).unwrap();
    let magnitude = (1.0 + 4f64.ln() / 32f64.ln()).sqrt();
    let ids: Vec<u32> = (0..9).map(|i| (i * 5 + 2) % 40).collect();
    let want = logits(&load_served(&dir.path().join("hf"), None), &ids, false);
    // The scale as the converter writes it, and computed when a file leaves it out.
    for scale in [Some(magnitude as f32), None] {
        let path = dir.path().join("phi3.gguf");
        write_phi3_gguf(&path, &tensors, scale);
        let model = load_served(&path, None);
        let cfg = model.config();
        assert_eq!((cfg.architecture, cfg.head_dim, cfg.rotary_dim), (Architecture::Phi3, 8, 4));
        assert_eq!((cfg.sliding_window, cfg.fused_projections), (Some(WINDOW), true));
        assert!(matches!(&cfg.rope_scaling, Some(RopeScaling::LongRope { attention_factor, extended: true, .. })
                if (attention_factor - magnitude).abs() < 1e-6));
        assert_close(&logits(&model, &ids, false), &want, &format!("GGUF (scale {scale:?}) vs safetensors"));
    }
}

fn config_error(edit: impl Fn(&mut Value)) -> String {
    let mut cfg = long_context_config();
    edit(&mut cfg);
    DecoderConfig::from_hf_json(&cfg).unwrap_err().to_string()
}

#[test]
fn configuration_errors_name_their_key() {
    let e = config_error(|c| c["partial_rotary_factor"] = json!(1.5));
    assert!(e.contains("partial_rotary_factor") && e.contains("1.5"), "{e}");
    let e = config_error(|c| c["rope_scaling"]["long_factor"] = json!([1.0, 2.0, 3.0]));
    assert!(e.contains("rope_scaling") && e.contains("one short and one long factor per rotary frequency (2)"), "{e}");
    let e = config_error(|c| c["rope_scaling"]["short_factor"] = json!("wide"));
    assert!(e.contains("rope_scaling.short_factor"), "{e}");
    let e = config_error(|c| c["sliding_window"] = json!(0));
    assert!(e.contains("sliding_window"), "{e}");
    let e = config_error(|c| {
        c["architectures"] = json!(["Qwen2ForCausalLM"]);
        c["use_sliding_window"] = json!(true);
    });
    assert!(e.contains("use_sliding_window") && e.contains("false"), "{e}");
    // Phi-3's first 128k checkpoints named LongRoPE "su".
    let mut su = long_context_config();
    su["rope_scaling"]["type"] = json!("su");
    assert!(matches!(DecoderConfig::from_hf_json(&su).unwrap().rope_scaling, Some(RopeScaling::LongRope { .. })));
}
