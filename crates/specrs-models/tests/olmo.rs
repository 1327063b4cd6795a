//! OLMo 1 (`OlmoForCausalLM`) on a tiny checkpoint in its real layout: Llama's layer with
//! LayerNorms that have no weights and q, k and v clamped to `±clip_qkv`, matching
//! transformers' forward (`common::Reference`) in one prefill and token by token; its `olmo`
//! GGUF (q/k rows permuted as Llama's, the bound as `attention.clamp_kqv`) loads to the same
//! model; a bound that is not positive is refused by key.

mod common;

use candle_core::Device;
use candle_core::quantized::gguf_file::Value as GgufValue;
use common::{Reference, assert_close, logits, write_llama_layout_gguf};
use serde_json::json;
use specrs_models::testing::{self, TinyShape};
use specrs_models::{Architecture, DecoderConfig, ModelDType, load_causal_lm};

const SHAPE: TinyShape =
    TinyShape { vocab: 40, hidden: 32, layers: 3, heads: 4, kv_heads: 2, head_dim: 8, intermediate: 48 };
/// Tight enough that some projected values pass it.
const CLIP: f32 = 0.5;

fn ids() -> Vec<u32> {
    (0..10).map(|i| (i * 9 + 1) % 40).collect()
}

#[test]
fn weightless_layer_norms_and_clamped_qkv_match_the_transformers_forward_and_the_gguf() {
    let dir = tempfile::tempdir().unwrap();
    let tensors = testing::random_olmo(&SHAPE, 61).unwrap();
    testing::write_checkpoint(dir.path(), &testing::olmo_config(&SHAPE, Some(f64::from(CLIP))), &tensors).unwrap();
    let (model, _) = load_causal_lm(dir.path(), &Device::Cpu, ModelDType::F32).unwrap();
    let cfg = model.config();
    assert_eq!((cfg.architecture, cfg.clip_qkv), (Architecture::Olmo, Some(CLIP)));
    assert!(cfg.norms_weightless() && cfg.centered_norms());
    let reference = |clip_qkv| Reference {
        centered_norms: true,
        weightless_norms: true,
        clip_qkv,
        ..Reference::plain(&tensors, SHAPE)
    };
    let want = reference(Some(CLIP)).logits(&ids());
    assert_close(&logits(&model, &ids(), false), &want, "one prefill");
    assert_close(&logits(&model, &ids(), true), &want, "token by token");
    // The bound binds: unclamped projections give other logits.
    let free = reference(None).logits(&ids());
    let diff = free.iter().flatten().zip(want.iter().flatten()).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    assert!(diff > 1e-3, "the clamp changes nothing");

    let path = dir.path().join("olmo.gguf");
    let extra = [
        ("olmo.attention.layer_norm_epsilon", GgufValue::F32(1e-5)),
        ("olmo.attention.clamp_kqv", GgufValue::F32(CLIP)),
    ];
    write_llama_layout_gguf(&path, "olmo", &SHAPE, &tensors, &extra);
    let (gguf, _) = load_causal_lm(&path, &Device::Cpu, ModelDType::F32).unwrap();
    assert_eq!(gguf.config().clip_qkv, Some(CLIP));
    assert_close(&logits(&gguf, &ids(), false), &want, "the olmo GGUF");
}

#[test]
fn clip_qkv_must_be_positive_or_null() {
    let c = DecoderConfig::from_hf_json(&testing::olmo_config(&SHAPE, None)).unwrap();
    assert_eq!((c.clip_qkv, c.rms_norm_eps), (None, 1e-5));
    let mut negative = testing::olmo_config(&SHAPE, Some(-1.0));
    let e = DecoderConfig::from_hf_json(&negative).unwrap_err().to_string();
    assert!(e.contains("clip_qkv"), "{e}");
    negative["clip_qkv"] = json!("8");
    assert!(DecoderConfig::from_hf_json(&negative).unwrap_err().to_string().contains("clip_qkv"));
}
