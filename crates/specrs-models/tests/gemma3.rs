//! Gemma 3 (`Gemma3ForCausalLM`) on a tiny checkpoint written in its real layout: norms that
//! scale by `1 + weight` around attention and MLP, q/k norms, GeGLU, `sqrt(hidden)` embedding
//! scale, `query_pre_attn_scalar`, and sliding layers with their own RoPE base among full ones,
//! all matching transformers' forward (`common::Reference`) in one prefill and token by token;
//! configuration errors name their key.

mod common;

use candle_core::Device;
use candle_core::quantized::gguf_file::Value as GgufValue;
use common::{GemmaLayout, Reference, assert_close, logits, write_unpermuted_gguf};
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
        gemma: Some(GemmaLayout {
            sliding: SLIDING.to_vec(),
            window: WINDOW,
            local_theta: 500.0,
            scale: 12f32.powf(-0.5),
            softcaps: None,
        }),
        ..Reference::plain(&tensors, SHAPE)
    };
    let ids: Vec<u32> = (0..11).map(|i| (i * 7 + 3) % 40).collect();
    let want = reference.logits(&ids);
    assert_close(&logits(&model, &ids, false), &want, "one prefill");
    assert_close(&logits(&model, &ids, true), &want, "token by token");
}

#[test]
fn the_text_decoder_of_an_image_text_checkpoint_is_the_same_model() {
    let dir = tempfile::tempdir().unwrap();
    let tensors = testing::random_gemma3(&SHAPE, 5).unwrap();
    let text = testing::gemma3_config(&SHAPE, &SLIDING, WINDOW);
    testing::write_checkpoint(&dir.path().join("text"), &text, &tensors).unwrap();
    let ids: Vec<u32> = (0..9).map(|i| (i * 5 + 1) % 40).collect();
    let (text_model, _) = load_causal_lm(&dir.path().join("text"), &Device::Cpu, ModelDType::F32).unwrap();
    let want = logits(&text_model, &ids, false);
    // As released (`language_model.model.*`) and as transformers >= 4.52 saves it
    // (`model.language_model.*`), each beside a vision tower that is never read.
    for prefix in ["language_model.model", "model.language_model"] {
        let mut text_config = text.clone();
        text_config.as_object_mut().unwrap().remove("architectures");
        let config = json!({
            "architectures": ["Gemma3ForConditionalGeneration"],
            "text_config": text_config,
            "vision_config": {"hidden_size": 16},
            "eos_token_id": [1, 39],
        });
        let mut stored: std::collections::HashMap<String, candle_core::Tensor> = tensors
            .iter()
            .map(|(n, t)| (format!("{prefix}.{}", n.strip_prefix("model.").unwrap()), t.clone()))
            .collect();
        stored.insert("vision_tower.patch_embedding.weight".into(), testing::random_tensor(&[4, 4], 1.0, 1).unwrap());
        let path = dir.path().join(prefix);
        testing::write_checkpoint(&path, &config, &stored).unwrap();
        let (model, _) = load_causal_lm(&path, &Device::Cpu, ModelDType::F32).unwrap();
        assert_eq!(model.config().eos_token_ids, vec![1, 39], "token ids from the top level");
        assert_close(&logits(&model, &ids, false), &want, prefix);
    }
}

#[test]
fn an_image_text_text_config_takes_gemma3s_defaults() {
    // google/gemma-3-4b-it's text_config lists only what differs from the defaults.
    let config = json!({
        "architectures": ["Gemma3ForConditionalGeneration"],
        "text_config": {"hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text",
            "num_hidden_layers": 34, "rope_scaling": {"factor": 8.0, "rope_type": "linear"}, "sliding_window": 1024},
    });
    let text = specrs_models::models::image_text::text_config(&config).unwrap();
    let cfg = DecoderConfig::from_hf_json(&text).unwrap();
    assert_eq!((cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.vocab_size), (8, 4, 256, 262_208));
    assert_eq!((cfg.rope_theta, cfg.rms_norm_eps, cfg.max_position_embeddings), (1e6, 1e-6, 131_072));
    let gemma = cfg.gemma.as_ref().unwrap();
    assert_eq!((cfg.sliding_window, gemma.local_rope_theta), (Some(1024), 1e4));
    assert_eq!((cfg.scales.attention, cfg.scales.embedding), (Some(1.0 / 16.0), 2560f64.sqrt()));
    let global = cfg.sliding_layers.as_ref().unwrap().iter().filter(|s| !**s).count();
    assert_eq!(global, 5, "layers 5, 11, 17, 23, 29 are global");
    assert!(matches!(cfg.rope_scaling, Some(specrs_models::RopeScaling::Linear { factor }) if factor == 8.0));
}

#[test]
fn a_gemma3_gguf_loads_to_the_same_model() {
    // Six layers: five sliding, one global, llama.cpp's fixed pattern; its local RoPE base
    // (10,000) and score scale (head_dim^-0.5) written into the safetensors config to match.
    let shape = TinyShape { layers: 6, ..SHAPE };
    let dir = tempfile::tempdir().unwrap();
    let tensors = testing::random_gemma3(&shape, 9).unwrap();
    let mut config = testing::gemma3_config(&shape, &[false; 6], WINDOW);
    config.as_object_mut().unwrap().remove("layer_types");
    (config["rope_local_base_freq"], config["query_pre_attn_scalar"]) = (json!(10_000.0), json!(shape.head_dim));
    testing::write_checkpoint(&dir.path().join("hf"), &config, &tensors).unwrap();
    let path = dir.path().join("gemma3.gguf");
    write_unpermuted_gguf(
        &path,
        "gemma3",
        &shape,
        &tensors,
        true,
        &[("gemma3.attention.sliding_window", GgufValue::U32(WINDOW as u32))],
    );
    let (gguf, _) = load_causal_lm(&path, &Device::Cpu, ModelDType::F32).unwrap();
    let (hf, _) = load_causal_lm(&dir.path().join("hf"), &Device::Cpu, ModelDType::F32).unwrap();
    assert_eq!(
        gguf.config().gemma,
        hf.config().gemma.clone().map(|g| specrs_models::config::GemmaConfig { norms_store_scale: true, ..g })
    );
    let windows = |cfg: &specrs_models::DecoderConfig| (cfg.sliding_window, cfg.sliding_layers.clone());
    assert_eq!(windows(gguf.config()), windows(hf.config()));
    let ids: Vec<u32> = (0..9).map(|i| (i * 5 + 3) % 40).collect();
    assert_close(&logits(&gguf, &ids, false), &logits(&hf, &ids, false), "GGUF vs safetensors");
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
    assert_eq!((cfg.scales.attention_softcap, cfg.scales.logits_softcap), (None, None), "null caps are off");
    let e = config_error(|c| c["final_logit_softcapping"] = json!(0.0));
    assert!(e.contains("final_logit_softcapping") && e.contains("positive"), "{e}");
    let e = config_error(|c| c["attn_logit_softcapping"] = json!("high"));
    assert!(e.contains("attn_logit_softcapping"), "{e}");
    let e = config_error(|c| c["hidden_activation"] = json!("silu"));
    assert!(e.contains("hidden_activation") && e.contains("silu"), "{e}");
    let e = config_error(|c| c["layer_types"] = json!(["sliding_attention"]));
    assert!(e.contains("layer_types") && e.contains("names 1 layers, the model has 4"), "{e}");
    let e = config_error(|c| c["layer_types"] = json!(["local", "full_attention", "full_attention", "full_attention"]));
    assert!(e.contains("layer_types") && e.contains("local"), "{e}");
}
