//! gpt-oss (`GptOssForCausalLM`) on a tiny checkpoint written in its real layouts: biased
//! q/k/v/o, a sink per head, sliding and full layers alternating, a biased router over experts
//! stored together with gate/up rows interleaved and a clamped SwiGLU, all matching
//! transformers' forward (`common::Reference`) in one prefill and token by token; the released
//! MXFP4 experts load to the same model as the dequantized ones (exactly in f32, within Q8_0's
//! rounding as spec-rs places them on the CPU by default); the config is read as transformers
//! reads it and errors name their key.

mod common;

use candle_core::Device;
use common::{GptOssLayout, Reference, assert_close, assert_within, logits};
use serde_json::json;
use specrs_models::testing::{self, TinyShape};
use specrs_models::{Architecture, DecoderConfig, ModelDType, RopeScaling, load_causal_lm};

/// Widths that are multiples of 32, as MXFP4 blocks need.
const SHAPE: TinyShape =
    TinyShape { vocab: 40, hidden: 32, layers: 4, heads: 4, kv_heads: 2, head_dim: 8, intermediate: 32 };
const SLIDING: [bool; 4] = [true, false, true, false];
const WINDOW: usize = 3;
const EXPERTS: usize = 4;
const TOP_K: usize = 2;
/// Low enough that the clamps bite on the tiny model's activations.
const LIMIT: f64 = 0.3;

fn config() -> serde_json::Value {
    testing::gpt_oss_config(&SHAPE, EXPERTS, TOP_K, &SLIDING, WINDOW, LIMIT)
}

fn ids() -> Vec<u32> {
    (0..11).map(|i| (i * 7 + 3) % 40).collect()
}

#[test]
fn sinks_windows_and_clamped_experts_match_the_transformers_forward() {
    let dir = tempfile::tempdir().unwrap();
    let (dense, _) = testing::random_gpt_oss(&SHAPE, EXPERTS, 3).unwrap();
    testing::write_checkpoint(dir.path(), &config(), &dense).unwrap();
    let (model, _) = load_causal_lm(dir.path(), &Device::Cpu, ModelDType::F32).unwrap();
    let cfg = model.config();
    assert_eq!(cfg.architecture, Architecture::GptOss);
    assert!(cfg.attention_bias && cfg.attention_output_bias && cfg.attention_sinks && !cfg.tie_word_embeddings);
    let reference = Reference {
        gpt_oss: Some(GptOssLayout { sliding: SLIDING.to_vec(), window: WINDOW, top_k: TOP_K, limit: LIMIT as f32 }),
        ..Reference::plain(&dense, SHAPE)
    };
    let want = reference.logits(&ids());
    assert_close(&logits(&model, &ids(), false), &want, "one prefill");
    assert_close(&logits(&model, &ids(), true), &want, "token by token");
}

#[test]
fn mxfp4_experts_load_to_the_same_model_as_dequantized_ones() {
    let dir = tempfile::tempdir().unwrap();
    let (dense, mxfp4) = testing::random_gpt_oss(&SHAPE, EXPERTS, 7).unwrap();
    assert!(mxfp4.contains_key("model.layers.0.mlp.experts.gate_up_proj_blocks"));
    assert!(!mxfp4.contains_key("model.layers.0.mlp.experts.gate_up_proj"));
    let (dense_dir, mxfp4_dir) = (dir.path().join("dense"), dir.path().join("mxfp4"));
    testing::write_checkpoint(&dense_dir, &config(), &dense).unwrap();
    testing::write_checkpoint(&mxfp4_dir, &config(), &mxfp4).unwrap();
    let (want, _) = load_causal_lm(&dense_dir, &Device::Cpu, ModelDType::F32).unwrap();
    let want = logits(&want, &ids(), false);
    let (exact, _) = load_causal_lm(&mxfp4_dir, &Device::Cpu, ModelDType::F32).unwrap();
    assert_close(&logits(&exact, &ids(), false), &want, "MXFP4 dequantized to f32");
    // Left to spec-rs on the CPU, the experts become Q8_0 (the rest stays f32).
    let (auto, _) = load_causal_lm(&mxfp4_dir, &Device::Cpu, ModelDType::Auto).unwrap();
    assert_within(&logits(&auto, &ids(), false), &want, 2e-2, "MXFP4 placed as Q8_0");
}

#[test]
fn mismatched_expert_blocks_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let (_, mut mxfp4) = testing::random_gpt_oss(&SHAPE, EXPERTS, 9).unwrap();
    let name = "model.layers.1.mlp.experts.down_proj_scales";
    mxfp4.insert(name.into(), testing::random_tensor(&[EXPERTS, SHAPE.hidden], 1.0, 1).unwrap());
    testing::write_checkpoint(dir.path(), &config(), &mxfp4).unwrap();
    let Err(e) = load_causal_lm(dir.path(), &Device::Cpu, ModelDType::F32) else { panic!("loaded bad scales") };
    assert!(e.to_string().contains(name), "{e}");
}

#[test]
fn configuration_is_read_as_transformers_reads_it_and_errors_name_their_key() {
    // The released config's keys: `experts_per_token` alone, no layer_types, YaRN untruncated.
    let mut c = config();
    let object = c.as_object_mut().unwrap();
    object.remove("layer_types");
    object.remove("num_experts_per_tok");
    c["rope_scaling"] = json!({"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
        "truncate": false, "original_max_position_embeddings": 128});
    let cfg = DecoderConfig::from_hf_json(&c).unwrap();
    let windows: Vec<Option<usize>> = (0..4).map(|i| cfg.layer_sliding_window(i)).collect();
    assert_eq!(windows, [Some(WINDOW), None, Some(WINDOW), None], "sliding first, then alternating");
    assert_eq!((cfg.uniform_sliding_window(), cfg.layered_window()), (None, Some(WINDOW)));
    assert_eq!(cfg.moe.as_ref().map(|m| (m.num_experts, m.top_k, m.norm_topk_prob)), Some((EXPERTS, TOP_K, true)));
    assert!(
        matches!(&cfg.rope_scaling, Some(RopeScaling::Yarn { params, .. }) if !params.truncate && params.factor == 32.0)
    );
    let error = |edit: &dyn Fn(&mut serde_json::Value)| {
        let mut c = config();
        edit(&mut c);
        DecoderConfig::from_hf_json(&c).unwrap_err().to_string()
    };
    let e = error(&|c| c["swiglu_limit"] = json!(-1.0));
    assert!(e.contains("swiglu_limit"), "{e}");
    let e = error(&|c| c["sliding_window"] = serde_json::Value::Null);
    assert!(e.contains("sliding_window"), "{e}");
    let e = error(&|c| c["layer_types"] = json!(["sliding_attention", "full_attention"]));
    assert!(e.contains("layer_types") && e.contains("names 2 layers, the model has 4"), "{e}");
    let e = error(&|c| {
        c.as_object_mut().unwrap().remove("num_local_experts");
    });
    assert!(e.contains("num_local_experts"), "{e}");
}
