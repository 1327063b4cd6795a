//! OLMo 2 (`Olmo2ForCausalLM`) on a tiny checkpoint written in its real layout: the attention's
//! and the MLP's outputs normed instead of their inputs, and q and k normed across all heads at
//! once, matching transformers' forward (`common::Reference`) in one prefill and token by token;
//! OLMo 3 (`Olmo3ForCausalLM`) too, its sliding layers within their window turning with the
//! unscaled RoPE while the full layers' is scaled. Their GGUF files (`olmo2`, with a window
//! for OLMo 3) load to the same models. OLMoE (`OlmoeForCausalLM`): OLMo's whole-width q/k
//! norms in Llama's pre-norm layer, with softmax-routed experts in every layer, and q, k and v
//! clamped after those norms where `clip_qkv` says. EXAONE 4.0
//! (`Exaone4ForCausalLM`): OLMo 2's layer with per-head q/k norms, its full layers without
//! RoPE where it has sliding ones, and its `exaone4` GGUF.

mod common;

use candle_core::Device;
use candle_core::quantized::gguf_file::Value as GgufValue;
use common::{Choice, Reference, Routing, assert_close, logits, write_unpermuted_gguf};
use specrs_models::config::NormPlacement;
use specrs_models::testing::{self, TinyShape};
use specrs_models::{Architecture, ModelDType, load_causal_lm};

const SHAPE: TinyShape =
    TinyShape { vocab: 40, hidden: 32, layers: 3, heads: 4, kv_heads: 2, head_dim: 8, intermediate: 48 };

#[test]
fn output_norms_and_whole_width_qk_norms_match_the_transformers_forward() {
    let dir = tempfile::tempdir().unwrap();
    let tensors = testing::random_olmo2(&SHAPE, 13).unwrap();
    testing::write_checkpoint(dir.path(), &testing::target_config(Architecture::Olmo2, &SHAPE, false), &tensors)
        .unwrap();
    let (model, _) = load_causal_lm(dir.path(), &Device::Cpu, ModelDType::F32).unwrap();
    let cfg = model.config();
    assert_eq!((cfg.architecture, cfg.norm_placement()), (Architecture::Olmo2, NormPlacement::Post));
    assert!(cfg.qk_norm && cfg.qk_norm_spans_heads());
    let reference = Reference::plain(&tensors, SHAPE);
    let ids: Vec<u32> = (0..10).map(|i| (i * 11 + 5) % 40).collect();
    let want = reference.logits(&ids);
    assert_close(&logits(&model, &ids, false), &want, "one prefill");
    assert_close(&logits(&model, &ids, true), &want, "token by token");
}

#[test]
fn olmo3_sliding_layers_turn_unscaled_within_their_window() {
    const WINDOW: usize = 3;
    let dir = tempfile::tempdir().unwrap();
    let shape = TinyShape { layers: 4, ..SHAPE };
    let tensors = testing::random_olmo2(&shape, 19).unwrap();
    let mut config = testing::target_config(Architecture::Olmo3, &shape, false);
    config["layer_types"] =
        serde_json::json!(["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"]);
    config["sliding_window"] = serde_json::json!(WINDOW);
    config["rope_scaling"] = serde_json::json!({"rope_type": "linear", "factor": 4.0});
    testing::write_checkpoint(dir.path(), &config, &tensors).unwrap();
    let (model, _) = load_causal_lm(dir.path(), &Device::Cpu, ModelDType::F32).unwrap();
    let cfg = model.config();
    assert_eq!((cfg.architecture, cfg.norm_placement()), (Architecture::Olmo3, NormPlacement::Post));
    assert_eq!((cfg.layered_window(), cfg.sliding_rope_theta()), (Some(WINDOW), Some(10_000.0)));
    let reference = |unscaled_sliding: bool| Reference {
        // Linear scaling: every frequency divided by the factor.
        factors: vec![4.0; SHAPE.head_dim / 2],
        window: Some(WINDOW),
        sliding: unscaled_sliding.then(|| vec![true, true, true, false]),
        ..Reference::plain(&tensors, shape)
    };
    let ids: Vec<u32> = (0..10).map(|i| (i * 11 + 5) % 40).collect();
    let want = reference(true).logits(&ids);
    assert_close(&logits(&model, &ids, false), &want, "one prefill");
    assert_close(&logits(&model, &ids, true), &want, "token by token");
    // Scaling every layer and windowing every layer gives other logits.
    let uniform = reference(false).logits(&ids);
    let gap = want.iter().flatten().zip(uniform.iter().flatten()).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    assert!(gap > 1e-2, "the per-layer windows and RoPE change the logits by only {gap}");
}

/// Loads `tensors` from a safetensors checkpoint with `config` and from a GGUF file with
/// `extra` metadata, and checks both give the same logits.
fn gguf_matches_safetensors(
    shape: TinyShape,
    tensors: &std::collections::HashMap<String, candle_core::Tensor>,
    config: &serde_json::Value,
    extra: &[(&str, GgufValue)],
) -> specrs_models::DecoderConfig {
    let dir = tempfile::tempdir().unwrap();
    testing::write_checkpoint(&dir.path().join("hf"), config, tensors).unwrap();
    let path = dir.path().join("olmo.gguf");
    write_unpermuted_gguf(&path, "olmo2", &shape, tensors, false, extra);
    let (gguf, _) = load_causal_lm(&path, &Device::Cpu, ModelDType::F32).unwrap();
    let (hf, _) = load_causal_lm(&dir.path().join("hf"), &Device::Cpu, ModelDType::F32).unwrap();
    let (g, h) = (gguf.config(), hf.config());
    assert_eq!((g.architecture, g.qk_norm), (h.architecture, h.qk_norm));
    assert_eq!((g.layered_window(), g.sliding_layers.clone()), (h.layered_window(), h.sliding_layers.clone()));
    let ids: Vec<u32> = (0..10).map(|i| (i * 11 + 5) % 40).collect();
    assert_close(&logits(&gguf, &ids, false), &logits(&hf, &ids, false), "GGUF vs safetensors, one prefill");
    assert_close(&logits(&gguf, &ids, true), &logits(&hf, &ids, false), "GGUF token by token");
    g.clone()
}

#[test]
fn olmo2_and_olmo3_ggufs_load_to_the_same_models() {
    let tensors = testing::random_olmo2(&SHAPE, 23).unwrap();
    let olmo2 = testing::target_config(Architecture::Olmo2, &SHAPE, false);
    assert_eq!(gguf_matches_safetensors(SHAPE, &tensors, &olmo2, &[]).architecture, Architecture::Olmo2);

    // OLMo 3: llama.cpp writes it as `olmo2` with a window and one sliding flag per layer.
    let shape = TinyShape { layers: 4, ..SHAPE };
    let tensors = testing::random_olmo2(&shape, 29).unwrap();
    let mut olmo3 = testing::target_config(Architecture::Olmo3, &shape, false);
    olmo3["layer_types"] =
        serde_json::json!(["sliding_attention", "full_attention", "sliding_attention", "full_attention"]);
    olmo3["sliding_window"] = serde_json::json!(3);
    olmo3["rope_scaling"] = serde_json::json!({"rope_type": "linear", "factor": 4.0});
    let pattern = [true, false, true, false].map(GgufValue::Bool).to_vec();
    let scaled_with_window = [
        ("olmo2.attention.sliding_window", GgufValue::U32(3)),
        ("olmo2.rope.scaling.type", GgufValue::String("linear".into())),
        ("olmo2.rope.scaling.factor", GgufValue::F32(4.0)),
    ];
    let mut extra = scaled_with_window.to_vec();
    extra.push(("olmo2.attention.sliding_window_pattern", GgufValue::Array(pattern)));
    let cfg = gguf_matches_safetensors(shape, &tensors, &olmo3, &extra);
    assert_eq!((cfg.architecture, cfg.sliding_rope_theta()), (Architecture::Olmo3, Some(10_000.0)));
    // Without a pattern, three sliding layers to each full one, as OLMo 3's default.
    olmo3.as_object_mut().unwrap().remove("layer_types");
    gguf_matches_safetensors(shape, &tensors, &olmo3, &scaled_with_window);
}

#[test]
fn olmoe_pre_norms_whole_width_qk_norms_and_softmax_experts_match_the_transformers_forward() {
    let dir = tempfile::tempdir().unwrap();
    let moe = testing::TinyMoe { expert_intermediate: 16, norm_topk_prob: false, ..testing::TinyMoe::routed(4, 2) };
    let tensors = testing::random_olmoe(&SHAPE, &moe, 37).unwrap();
    testing::write_checkpoint(dir.path(), &testing::olmoe_config(&SHAPE, &moe), &tensors).unwrap();
    let (model, _) = load_causal_lm(dir.path(), &Device::Cpu, ModelDType::F32).unwrap();
    let cfg = model.config();
    assert_eq!((cfg.architecture, cfg.norm_placement()), (Architecture::Olmoe, NormPlacement::Pre));
    assert!(cfg.qk_norm && cfg.qk_norm_spans_heads());
    let ids: Vec<u32> = (0..10).map(|i| (i * 11 + 5) % 40).collect();
    let want = Reference {
        routing: Some(Routing { top_k: moe.top_k, norm_topk_prob: false, choice: Choice::Softmax }),
        ..Reference::plain(&tensors, SHAPE)
    }
    .logits(&ids);
    assert_close(&logits(&model, &ids, false), &want, "one prefill");
    assert_close(&logits(&model, &ids, true), &want, "token by token");
    // `clip_qkv`: q and k clamped after their norms, v as projected, as transformers' OLMoE does.
    let clipped_dir = tempfile::tempdir().unwrap();
    let mut clipped = testing::olmoe_config(&SHAPE, &moe);
    clipped["clip_qkv"] = serde_json::json!(0.3);
    testing::write_checkpoint(clipped_dir.path(), &clipped, &tensors).unwrap();
    let (model, _) = load_causal_lm(clipped_dir.path(), &Device::Cpu, ModelDType::F32).unwrap();
    assert_eq!(model.config().clip_qkv, Some(0.3));
    let want_clipped = Reference {
        routing: Some(Routing { top_k: moe.top_k, norm_topk_prob: false, choice: Choice::Softmax }),
        clip_qkv: Some(0.3),
        ..Reference::plain(&tensors, SHAPE)
    }
    .logits(&ids);
    assert_close(&logits(&model, &ids, false), &want_clipped, "clipped, one prefill");
    assert_close(&logits(&model, &ids, true), &want_clipped, "clipped, token by token");
    assert!(common::max_gap(&want, &want_clipped) > 1e-3, "the clamp changes the logits");
}

/// OLMo 2's tensors with EXAONE 4.0's per-head q/k norms.
fn exaone4_tensors(shape: &TinyShape, seed: u64) -> std::collections::HashMap<String, candle_core::Tensor> {
    let mut tensors = testing::random_olmo2(shape, seed).unwrap();
    for i in 0..shape.layers {
        for (name, s) in [("q_norm", seed + 50), ("k_norm", seed + 60)] {
            let norm = (testing::random_tensor(&[shape.head_dim], 0.2, s + i as u64).unwrap() + 1.0).unwrap();
            tensors.insert(format!("model.layers.{i}.self_attn.{name}.weight"), norm);
        }
    }
    tensors
}

#[test]
fn exaone4_norms_outputs_and_heads_and_its_full_layers_attend_without_rope_beside_sliding_ones() {
    const WINDOW: usize = 3;
    let shape = TinyShape { layers: 4, ..SHAPE };
    let ids: Vec<u32> = (0..10).map(|i| (i * 7 + 5) % 40).collect();
    let sliding = vec![true, true, true, false];
    for windowed in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let tensors = exaone4_tensors(&shape, 29);
        let mut config = testing::target_config(Architecture::Exaone4, &shape, false);
        if windowed {
            config["sliding_window"] = serde_json::json!(WINDOW);
            config["sliding_window_pattern"] = serde_json::json!(4);
        } else {
            config["sliding_window"] = serde_json::Value::Null;
        }
        testing::write_checkpoint(dir.path(), &config, &tensors).unwrap();
        let (model, _) = load_causal_lm(dir.path(), &Device::Cpu, ModelDType::F32).unwrap();
        let cfg = model.config();
        assert_eq!((cfg.architecture, cfg.norm_placement()), (Architecture::Exaone4, NormPlacement::Post));
        assert!(cfg.qk_norm && !cfg.qk_norm_spans_heads());
        let expected = windowed.then(|| sliding.clone());
        assert_eq!((cfg.sliding_layers.clone(), cfg.rope_layers.clone()), (expected.clone(), expected.clone()));
        let want = Reference {
            // Only the sliding layers attend within the window (no RoPE scaling to differ by).
            window: windowed.then_some(WINDOW),
            sliding: expected.clone(),
            rope_layers: expected.clone(),
            ..Reference::plain(&tensors, shape)
        }
        .logits(&ids);
        assert_close(&logits(&model, &ids, false), &want, &format!("windowed {windowed}, one prefill"));
        assert_close(&logits(&model, &ids, true), &want, &format!("windowed {windowed}, token by token"));
        // llama.cpp's file: OLMo 2's norm names, the window and its pattern as metadata.
        let path = dir.path().join("exaone4.gguf");
        let mut extra = vec![];
        if windowed {
            extra.push(("exaone4.attention.sliding_window", GgufValue::U32(WINDOW as u32)));
            extra.push((
                "exaone4.attention.sliding_window_pattern",
                GgufValue::Array(sliding.iter().map(|&b| GgufValue::Bool(b)).collect()),
            ));
        }
        write_unpermuted_gguf(&path, "exaone4", &shape, &tensors, false, &extra);
        let (gguf, _) = load_causal_lm(&path, &Device::Cpu, ModelDType::F32).unwrap();
        assert_eq!(gguf.config().rope_layers, expected);
        assert_close(&logits(&gguf, &ids, false), &want, &format!("windowed {windowed}, the exaone4 GGUF"));
    }
}
