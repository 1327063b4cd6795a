//! Cohere (`CohereForCausalLM`) and Cohere 2 (`Cohere2ForCausalLM`) on tiny checkpoints
//! written in their real layout: attention and MLP side by side from one bias-free LayerNorm,
//! RoPE over interleaved pairs, logits times `logit_scale`, Command R+'s per-head q/k
//! LayerNorms, and Cohere 2's sliding layers with RoPE beside full layers without, matching
//! transformers' forward (`common::Reference`) in one prefill and token by token; their GGUF
//! files (`command-r`, `cohere2`) load to the same models.

mod common;

use candle_core::Device;
use candle_core::quantized::gguf_file::Value as GgufValue;
use common::{Multipliers, Reference, assert_close, logits, write_unpermuted_gguf};
use serde_json::json;
use specrs_models::config::NormPlacement;
use specrs_models::testing::{self, TinyShape};
use specrs_models::{Architecture, DecoderConfig, ModelDType, load_causal_lm};

const SHAPE: TinyShape =
    TinyShape { vocab: 40, hidden: 32, layers: 4, heads: 4, kv_heads: 2, head_dim: 8, intermediate: 48 };

/// Cohere's forward: centred norms, parallel blocks, interleaved RoPE over the whole head, and
/// logits times 0.25.
fn cohere_reference(tensors: &std::collections::HashMap<String, candle_core::Tensor>) -> Reference<'_> {
    Reference {
        interleaved_rope: true,
        centered_norms: true,
        parallel: true,
        multipliers: Some(Multipliers {
            embedding: 1.0,
            residual: 1.0,
            attention: (SHAPE.head_dim as f32).powf(-0.5),
            logits_divisor: 4.0,
        }),
        ..Reference::plain(tensors, SHAPE)
    }
}

fn ids() -> Vec<u32> {
    (0..10).map(|i| (i * 7 + 3) % 40).collect()
}

#[test]
fn parallel_blocks_layer_norms_and_interleaved_rope_match_the_transformers_forward() {
    for qk_norm in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let tensors = testing::random_cohere(&SHAPE, qk_norm, 3).unwrap();
        testing::write_checkpoint(dir.path(), &testing::cohere_config(Architecture::Cohere, &SHAPE, qk_norm), &tensors)
            .unwrap();
        let (model, _) = load_causal_lm(dir.path(), &Device::Cpu, ModelDType::F32).unwrap();
        let cfg = model.config();
        assert_eq!((cfg.norm_placement(), cfg.qk_norm), (NormPlacement::Parallel, qk_norm));
        assert!(cfg.centered_norms() && cfg.tie_word_embeddings);
        let want = cohere_reference(&tensors).logits(&ids());
        assert_close(&logits(&model, &ids(), false), &want, "one prefill");
        assert_close(&logits(&model, &ids(), true), &want, "token by token");
        // What the test holds the model to matters: uncentred norms and halves-paired RoPE
        // give other logits.
        for (what, other) in [
            ("RMSNorms", Reference { centered_norms: false, ..cohere_reference(&tensors) }),
            ("half rotation", Reference { interleaved_rope: false, ..cohere_reference(&tensors) }),
        ] {
            let other = other.logits(&ids());
            let gap = want.iter().flatten().zip(other.iter().flatten()).map(|(a, b)| (a - b).abs());
            assert!(gap.fold(0f32, f32::max) > 1e-2, "{what} agree with Cohere's forward");
        }
    }
}

#[test]
fn cohere2_sliding_layers_turn_and_full_layers_attend_without_rope() {
    const WINDOW: usize = 3;
    let dir = tempfile::tempdir().unwrap();
    let tensors = testing::random_cohere(&SHAPE, false, 7).unwrap();
    let mut config = testing::cohere_config(Architecture::Cohere2, &SHAPE, false);
    config["sliding_window"] = json!(WINDOW);
    testing::write_checkpoint(dir.path(), &config, &tensors).unwrap();
    let (model, _) = load_causal_lm(dir.path(), &Device::Cpu, ModelDType::F32).unwrap();
    let sliding = vec![true, true, true, false];
    let cfg = model.config();
    assert_eq!((cfg.sliding_layers.clone(), cfg.rope_layers.clone()), (Some(sliding.clone()), Some(sliding.clone())));
    let want = Reference {
        window: Some(WINDOW),
        sliding: Some(sliding.clone()),
        rope_layers: Some(sliding),
        ..cohere_reference(&tensors)
    }
    .logits(&ids());
    assert_close(&logits(&model, &ids(), false), &want, "one prefill");
    assert_close(&logits(&model, &ids(), true), &want, "token by token");
}

#[test]
fn configuration_is_read_as_transformers_reads_it_and_errors_name_their_key() {
    let base = testing::cohere_config(Architecture::Cohere, &SHAPE, false);
    let mut defaults = base.clone();
    for key in ["logit_scale", "tie_word_embeddings", "layer_norm_eps"] {
        defaults.as_object_mut().unwrap().remove(key);
    }
    let cfg = DecoderConfig::from_hf_json(&defaults).unwrap();
    assert_eq!((cfg.scales.logits_divisor, cfg.tie_word_embeddings, cfg.rms_norm_eps), (16.0, true, 1e-5));
    let mut c = base.clone();
    c["logit_scale"] = json!(0.0);
    let e = DecoderConfig::from_hf_json(&c).unwrap_err().to_string();
    assert!(e.contains("logit_scale") && e.contains("positive"), "{e}");
    // Cohere 2 without layer_types: three sliding layers to each full one.
    let mut c2 = testing::cohere_config(Architecture::Cohere2, &SHAPE, false);
    c2["num_hidden_layers"] = json!(8);
    let cfg = DecoderConfig::from_hf_json(&c2).unwrap();
    let full: Vec<usize> = (0..8).filter(|&i| !cfg.sliding_layers.as_ref().unwrap()[i]).collect();
    assert_eq!((full, cfg.layered_window()), (vec![3, 7], Some(4096)));
}

#[test]
fn command_r_and_cohere2_ggufs_load_to_the_same_models() {
    // llama.cpp keeps Cohere's q/k rows (and R+'s per-head norm weights) as they are.
    for (arch, gguf_arch, qk_norm) in
        [(Architecture::Cohere, "command-r", true), (Architecture::Cohere2, "cohere2", false)]
    {
        let dir = tempfile::tempdir().unwrap();
        let tensors = testing::random_cohere(&SHAPE, qk_norm, 11).unwrap();
        let mut config = testing::cohere_config(arch, &SHAPE, qk_norm);
        config["sliding_window"] = json!(3);
        testing::write_checkpoint(&dir.path().join("hf"), &config, &tensors).unwrap();
        let path = dir.path().join("cohere.gguf");
        let key = |k: &str| format!("{gguf_arch}.{k}");
        let (scale, eps, window) =
            (key("logit_scale"), key("attention.layer_norm_epsilon"), key("attention.sliding_window"));
        let extra = [
            (scale.as_str(), GgufValue::F32(0.25)),
            (eps.as_str(), GgufValue::F32(1e-5)),
            (window.as_str(), GgufValue::U32(3)),
        ];
        write_unpermuted_gguf(&path, gguf_arch, &SHAPE, &tensors, false, &extra);
        let (gguf, _) = load_causal_lm(&path, &Device::Cpu, ModelDType::F32).unwrap();
        let (hf, _) = load_causal_lm(&dir.path().join("hf"), &Device::Cpu, ModelDType::F32).unwrap();
        let (g, h) = (gguf.config(), hf.config());
        assert_eq!((g.architecture, g.qk_norm, g.tie_word_embeddings), (arch, qk_norm, true));
        assert_eq!(
            (g.sliding_layers.clone(), g.rope_layers.clone()),
            (h.sliding_layers.clone(), h.rope_layers.clone())
        );
        assert_close(&logits(&gguf, &ids(), false), &logits(&hf, &ids(), false), "GGUF vs safetensors, one prefill");
        assert_close(&logits(&gguf, &ids(), true), &logits(&hf, &ids(), false), "GGUF token by token");
    }
}
