//! Gemma 3 (`Gemma3ForCausalLM`) on a tiny checkpoint written in its real layout: norms that
//! scale by `1 + weight` around attention and MLP, q/k norms, GeGLU, `sqrt(hidden)` embedding
//! scale, `query_pre_attn_scalar`, and sliding layers with their own RoPE base among full ones,
//! all matching transformers' forward (`common::Reference`) in one prefill and token by token;
//! configuration errors name their key.

mod common;

use candle_core::Device;
use common::{GemmaLayout, Reference, assert_close, logits};
use serde_json::json;
use specrs_models::testing::{self, TinyShape};
use specrs_models::{Architecture, DecoderConfig, ModelDType, load_causal_lm};

const SHAPE: TinyShape =
    TinyShape { vocab: 40, hidden: 32, layers: 4, heads: 4, kv_heads: 2, head_dim: 8, intermediate: 48 };
const SLIDING: [bool; 4] = [true, false, true, true];
const WINDOW: usize = 3;

#[test]
fn local_and_global_layers_match_the_transformers_forward() {
    let dir = tempfile::tempdir().unwrap();
    let tensors = testing::random_gemma3(&SHAPE, 3).unwrap();
    testing::write_checkpoint(dir.path(), &testing::gemma3_config(&SHAPE, &SLIDING, WINDOW), &tensors).unwrap();
    let (model, _) = load_causal_lm(dir.path(), &Device::Cpu, ModelDType::F32).unwrap();
    assert_eq!(model.config().architecture, Architecture::Gemma3);
    let reference = Reference {
        tensors: &tensors,
        shape: SHAPE,
        rotary: SHAPE.head_dim,
        factors: vec![1.0; SHAPE.head_dim / 2],
        magnitude: 1.0,
        window: None,
        routing: None,
        gemma: Some(GemmaLayout {
            sliding: SLIDING.to_vec(),
            window: WINDOW,
            local_theta: 500.0,
            scale: 12f32.powf(-0.5),
        }),
    };
    let ids: Vec<u32> = (0..11).map(|i| (i * 7 + 3) % 40).collect();
    let want = reference.logits(&ids);
    assert_close(&logits(&model, &ids, false), &want, "one prefill");
    assert_close(&logits(&model, &ids, true), &want, "token by token");
}

fn config_error(edit: impl Fn(&mut serde_json::Value)) -> String {
    let mut c = testing::gemma3_config(&SHAPE, &SLIDING, WINDOW);
    edit(&mut c);
    DecoderConfig::from_hf_json(&c).unwrap_err().to_string()
}

#[test]
fn configuration_is_read_as_transformers_reads_it_and_errors_name_their_key() {
    // Without layer_types, five sliding layers to each full one (`sliding_window_pattern`).
    let mut c = testing::gemma3_config(&TinyShape { layers: 12, ..SHAPE }, &[false; 12], WINDOW);
    c.as_object_mut().unwrap().remove("layer_types");
    let cfg = DecoderConfig::from_hf_json(&c).unwrap();
    let windows: Vec<Option<usize>> = (0..12).map(|i| cfg.layer_sliding_window(i)).collect();
    let full = [5, 11];
    for (i, w) in windows.iter().enumerate() {
        assert_eq!(*w, (!full.contains(&i)).then_some(WINDOW), "layer {i}");
    }
    assert!(cfg.tie_word_embeddings && cfg.qk_norm && cfg.uniform_sliding_window().is_none());
    let e = config_error(|c| c["final_logit_softcapping"] = json!(30.0));
    assert!(e.contains("final_logit_softcapping"), "{e}");
    let e = config_error(|c| c["attn_logit_softcapping"] = json!(50.0));
    assert!(e.contains("attn_logit_softcapping"), "{e}");
    let e = config_error(|c| c["hidden_activation"] = json!("silu"));
    assert!(e.contains("hidden_activation") && e.contains("silu"), "{e}");
    let e = config_error(|c| c["layer_types"] = json!(["sliding_attention"]));
    assert!(e.contains("layer_types") && e.contains("names 1 layers, the model has 4"), "{e}");
    let e = config_error(|c| c["layer_types"] = json!(["local", "full_attention", "full_attention", "full_attention"]));
    assert!(e.contains("layer_types") && e.contains("local"), "{e}");
}
