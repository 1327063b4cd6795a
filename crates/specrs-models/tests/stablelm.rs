//! StableLM (`StableLmForCausalLM`) on tiny checkpoints in its real layout, in StableLM 2
//! 1.6B's shape (q/k/v biases, a norm before the MLP) and 12B's (a LayerNorm over each q and k
//! head, one weight per head, and attention beside the MLP): LayerNorms with bias and RoPE
//! over a quarter of each head, matching transformers' forward (`common::Reference`) in one
//! prefill and token by token; their `stablelm` GGUF files (per-head norms stacked, as
//! llama.cpp's converter writes them) load to the same models.

mod common;

use std::collections::HashMap;

use candle_core::quantized::gguf_file::Value as GgufValue;
use candle_core::{Device, Tensor};
use common::{Reference, assert_close, gguf_named, logits, write_gguf};
use serde_json::json;
use specrs_models::config::NormPlacement;
use specrs_models::testing::{self, TinyShape};
use specrs_models::{Architecture, DecoderConfig, ModelDType, load_causal_lm};

const SHAPE: TinyShape =
    TinyShape { vocab: 40, hidden: 32, layers: 3, heads: 4, kv_heads: 2, head_dim: 16, intermediate: 48 };
/// A quarter of each 16-dim head turns.
const ROTARY: usize = 4;

fn ids() -> Vec<u32> {
    (0..10).map(|i| (i * 7 + 2) % 40).collect()
}

fn reference(tensors: &HashMap<String, Tensor>, parallel: bool) -> Reference<'_> {
    Reference {
        rotary: ROTARY,
        factors: vec![1.0; ROTARY / 2],
        centered_norms: true,
        parallel,
        ..Reference::plain(tensors, SHAPE)
    }
}

/// `tensors` as llama.cpp's converter writes them: f32 under GGUF names, q/k rows as they are.
fn write_stablelm_gguf(path: &std::path::Path, tensors: &HashMap<String, Tensor>) {
    let named = gguf_named(tensors, |_| false, false);
    let extra = [
        ("stablelm.attention.layer_norm_epsilon", GgufValue::F32(1e-5)),
        ("stablelm.rope.dimension_count", GgufValue::U32(ROTARY as u32)),
    ];
    write_gguf(path, "stablelm", &SHAPE, &named, &extra);
}

#[test]
fn stablelm_2_layouts_match_the_transformers_forward_and_their_gguf() {
    // (q/k/v biases, per-head q/k norms, attention beside the MLP): 1.6B, then 12B.
    for (qkv_bias, qk_norm, parallel) in [(true, false, false), (false, true, true)] {
        let what = if parallel { "12B layout" } else { "1.6B layout" };
        let dir = tempfile::tempdir().unwrap();
        let tensors = testing::random_stablelm(&SHAPE, qkv_bias, qk_norm, parallel, 37).unwrap();
        let config = testing::stablelm_config(&SHAPE, 0.25, qkv_bias, qk_norm, parallel);
        testing::write_checkpoint(dir.path(), &config, &testing::as_stablelm(&tensors).unwrap()).unwrap();
        let (model, _) = load_causal_lm(dir.path(), &Device::Cpu, ModelDType::F32).unwrap();
        let cfg = model.config();
        assert_eq!((cfg.architecture, cfg.rotary_dim), (Architecture::StableLm, ROTARY));
        assert_eq!((cfg.attention_bias, cfg.qk_norm, cfg.parallel_residual), (qkv_bias, qk_norm, parallel));
        let placement = if parallel { NormPlacement::Parallel } else { NormPlacement::Pre };
        assert_eq!(cfg.norm_placement(), placement);
        let want = reference(&tensors, parallel).logits(&ids());
        assert_close(&logits(&model, &ids(), false), &want, what);
        assert_close(&logits(&model, &ids(), true), &want, &format!("{what} token by token"));
        // Without the norms' biases the logits differ: the test holds the model to them.
        let unbiased: HashMap<String, Tensor> =
            tensors.iter().filter(|(n, _)| !n.ends_with("norm.bias")).map(|(n, t)| (n.clone(), t.clone())).collect();
        let other = reference(&unbiased, parallel).logits(&ids());
        let diff = other.iter().flatten().zip(want.iter().flatten()).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(diff > 1e-3, "{what}: norms without bias give the same logits");

        let path = dir.path().join("stablelm.gguf");
        write_stablelm_gguf(&path, &tensors);
        let (gguf, _) = load_causal_lm(&path, &Device::Cpu, ModelDType::F32).unwrap();
        assert_eq!(gguf.config().parallel_residual, parallel, "{what}: GGUF parallel");
        assert_close(&logits(&gguf, &ids(), false), &want, &format!("{what} GGUF"));
    }
}

#[test]
fn the_config_reads_stablelm_keys_and_refuses_other_activations() {
    // StableLM-3B-4E1T: no biases, sequential, RoPE over a quarter.
    let c = DecoderConfig::from_hf_json(&testing::stablelm_config(&SHAPE, 0.25, false, false, false)).unwrap();
    assert!(!c.attention_bias && !c.qk_norm && !c.parallel_residual && !c.mlp_bias && c.norms_have_bias());
    assert!(c.mlp_is_gated() && !c.tie_word_embeddings);
    let mut gelu = testing::stablelm_config(&SHAPE, 0.25, false, false, false);
    gelu["hidden_act"] = json!("gelu");
    let e = DecoderConfig::from_hf_json(&gelu).unwrap_err().to_string();
    assert!(e.contains("hidden_act") && e.contains("silu"), "{e}");
}
