//! Llama 4 (`Llama4ForConditionalGeneration` as released, and `Llama4ForCausalLM`) on tiny
//! checkpoints in their real layouts: RoPE over interleaved pairs with weightless q/k norms
//! after it and attention within chunks in three layers of four, full attention without
//! positions and queries tempered by position in the fourth, and `feed_forward` experts stored
//! fused whose input (not output) the router's sigmoid scales, beside a shared expert; matching
//! transformers' forward (`common::Reference`) in one prefill and token by token. Scout's
//! layout (every layer sparse) and Maverick's (dense and sparse layers alternating, no q/k
//! norm) both load, and so does the `llama4` GGUF (llama.cpp's fixed chunk and floor, rows kept
//! interleaved, experts stacked); configuration errors name their key.

mod common;

use std::collections::HashMap;

use candle_core::quantized::gguf_file::Value as GgufValue;
use candle_core::{Device, Tensor};
use common::{Choice, Llama4Layout, Reference, Routing, assert_close, gguf_with_stacked_experts, logits, write_gguf};
use serde_json::{Value, json};
use specrs_models::testing::{self, TinyMoe, TinyShape};
use specrs_models::{Architecture, DecoderConfig, ModelDType, QueryTemperature, Router, load_causal_lm};

const SHAPE: TinyShape =
    TinyShape { vocab: 40, hidden: 32, layers: 4, heads: 4, kv_heads: 2, head_dim: 8, intermediate: 48 };
const CHUNK: usize = 4;
const FLOOR_SCALE: f64 = 4.0;

const MOE: TinyMoe = TinyMoe {
    experts: 4,
    top_k: 1,
    expert_intermediate: 24,
    shared_intermediate: Some(24),
    norm_topk_prob: false,
    dense_layers: Vec::new(),
    groups: (1, 1, 1.0),
};

/// Thirteen tokens: three chunks and a bit, and NoPE positions past the temperature's floor.
fn ids() -> Vec<u32> {
    (0..13).map(|i| (i * 7 + 3) % 40).collect()
}

fn reference<'a>(tensors: &'a HashMap<String, Tensor>, l2_norm: bool, chunk: Option<usize>) -> Reference<'a> {
    Reference {
        interleaved_rope: true,
        rope_layers: Some(vec![true, true, true, false]),
        routing: Some(Routing { top_k: MOE.top_k, norm_topk_prob: false, choice: Choice::InputScaledSigmoid }),
        llama4: Some(Llama4Layout { chunk, l2_norm, temperature: Some((FLOOR_SCALE, 0.1)) }),
        ..Reference::plain(tensors, SHAPE)
    }
}

/// The largest gap between two sets of logits.
fn gap(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    a.iter().flatten().zip(b.iter().flatten()).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max)
}

#[test]
fn scouts_image_text_checkpoint_matches_the_transformers_forward() {
    let dir = tempfile::tempdir().unwrap();
    let tensors = testing::random_llama4(&SHAPE, &MOE, 1, 71).unwrap();
    let text = testing::llama4_config(&SHAPE, &MOE, 1, CHUNK, FLOOR_SCALE);
    let stored = testing::as_llama4(&tensors, MOE.experts, true).unwrap();
    testing::write_checkpoint(dir.path(), &testing::llama4_image_text_config(&text), &stored).unwrap();
    let (model, _) = load_causal_lm(dir.path(), &Device::Cpu, ModelDType::F32).unwrap();
    let cfg = model.config();
    assert_eq!(cfg.architecture, Architecture::Llama4);
    assert_eq!(cfg.rope_layers, Some(vec![true, true, true, false]), "every fourth layer without RoPE");
    assert_eq!(cfg.attention_chunk(), Some(CHUNK));
    let llama4 = cfg.llama4.unwrap();
    assert!(llama4.qk_l2_norm);
    assert_eq!(llama4.query_temperature, Some(QueryTemperature { floor_scale: FLOOR_SCALE, attn_scale: 0.1 }));
    let moe = cfg.moe.as_ref().unwrap();
    assert_eq!((&moe.router, moe.num_experts, moe.top_k), (&Router::InputScaledSigmoid, 4, 1));
    assert!((0..4).all(|l| moe.is_sparse_layer(l)), "Scout: every layer sparse");
    assert_eq!((cfg.intermediate_size, moe.expert_intermediate_size), (48, 24));

    let want = reference(&tensors, true, Some(CHUNK)).logits(&ids());
    assert_close(&logits(&model, &ids(), false), &want, "one prefill");
    assert_close(&logits(&model, &ids(), true), &want, "token by token");
    // What the test holds the model to changes the logits: chunks, the q/k norm.
    assert!(gap(&want, &reference(&tensors, true, None).logits(&ids())) > 1e-3, "chunking changes nothing");
    assert!(gap(&want, &reference(&tensors, false, Some(CHUNK)).logits(&ids())) > 1e-3, "the q/k norm changes nothing");
}

#[test]
fn mavericks_alternating_dense_layers_without_qk_norm_match_the_transformers_forward() {
    let dir = tempfile::tempdir().unwrap();
    let moe = TinyMoe { top_k: 2, ..MOE };
    let tensors = testing::random_llama4(&SHAPE, &moe, 2, 73).unwrap();
    let mut config = testing::llama4_config(&SHAPE, &moe, 2, CHUNK, FLOOR_SCALE);
    config["use_qk_norm"] = json!(false);
    config["attn_temperature_tuning"] = json!(true);
    testing::write_checkpoint(dir.path(), &config, &testing::as_llama4(&tensors, moe.experts, false).unwrap()).unwrap();
    let (model, _) = load_causal_lm(dir.path(), &Device::Cpu, ModelDType::F32).unwrap();
    let cfg = model.config();
    let sparse: Vec<bool> = (0..4).map(|l| cfg.moe.as_ref().unwrap().is_sparse_layer(l)).collect();
    assert_eq!(sparse, vec![false, true, false, true], "interleave_moe_layer_step 2");
    assert!(!cfg.llama4.unwrap().qk_l2_norm);
    let want = Reference {
        routing: Some(Routing { top_k: 2, norm_topk_prob: false, choice: Choice::InputScaledSigmoid }),
        ..reference(&tensors, false, Some(CHUNK))
    }
    .logits(&ids());
    assert_close(&logits(&model, &ids(), false), &want, "one prefill");
    assert_close(&logits(&model, &ids(), true), &want, "token by token");
    // The NoPE layer's temperature matters at these positions.
    let untempered = Reference {
        routing: Some(Routing { top_k: 2, norm_topk_prob: false, choice: Choice::InputScaledSigmoid }),
        llama4: Some(Llama4Layout { chunk: Some(CHUNK), l2_norm: false, temperature: None }),
        ..reference(&tensors, false, Some(CHUNK))
    }
    .logits(&ids());
    assert!(gap(&want, &untempered) > 1e-3, "the query temperature changes nothing");
}

#[test]
fn a_llama4_gguf_loads_to_the_same_model() {
    // llama.cpp's chunk and floor (8192) in both, so the checkpoint and the file agree.
    let dir = tempfile::tempdir().unwrap();
    let tensors = testing::random_llama4(&SHAPE, &MOE, 2, 79).unwrap();
    let config = testing::llama4_config(&SHAPE, &MOE, 2, 8192, 8192.0);
    testing::write_checkpoint(dir.path(), &config, &testing::as_llama4(&tensors, MOE.experts, false).unwrap()).unwrap();
    let (hf, _) = load_causal_lm(dir.path(), &Device::Cpu, ModelDType::F32).unwrap();
    // llama.cpp's layout: the shared layer's names, q/k rows as the checkpoint has them
    // (`undo_permute = False`), the experts split from gate_up and stacked.
    let named = gguf_with_stacked_experts(&tensors, [1, 3], MOE.experts);
    let u32v = |x: usize| GgufValue::U32(x as u32);
    let metadata = [
        ("llama4.expert_count", u32v(MOE.experts)),
        ("llama4.expert_used_count", u32v(MOE.top_k)),
        ("llama4.expert_feed_forward_length", u32v(MOE.expert_intermediate)),
        ("llama4.interleave_moe_layer_step", u32v(2)),
    ];
    let path = dir.path().join("llama4.gguf");
    write_gguf(&path, "llama4", &SHAPE, &named, &metadata);
    let (gguf, _) = load_causal_lm(&path, &Device::Cpu, ModelDType::F32).unwrap();
    let (g, h) = (gguf.config(), hf.config());
    assert_eq!((&g.moe, g.llama4, &g.rope_layers), (&h.moe, h.llama4, &h.rope_layers));
    assert_eq!(g.intermediate_size, SHAPE.intermediate, "feed_forward_length: the dense layers' width");
    let want = logits(&hf, &ids(), false);
    assert_close(&logits(&gguf, &ids(), false), &want, "GGUF vs safetensors, one prefill");
    assert_close(&logits(&gguf, &ids(), true), &want, "GGUF token by token");
    // Maverick's 128 experts run without the q/k norm, as llama.cpp runs them.
    let mut maverick = metadata.to_vec();
    maverick[0] = ("llama4.expert_count", u32v(128));
    let path = dir.path().join("maverick.gguf");
    write_gguf(&path, "llama4", &SHAPE, &[], &maverick);
    let file = specrs_models::weights::gguf::GgufSource::open(&path).unwrap();
    assert!(!file.decoder_config().unwrap().llama4.unwrap().qk_l2_norm);
    // MobileLLM-R1's unchunked layout is refused by key.
    let mut unchunked = metadata.to_vec();
    unchunked.push(("llama4.attention.sliding_window", u32v(0)));
    write_gguf(&path, "llama4", &SHAPE, &[], &unchunked);
    let Err(e) = load_causal_lm(&path, &Device::Cpu, ModelDType::F32) else {
        panic!("an unchunked llama4 GGUF loaded")
    };
    let e = e.to_string();
    assert!(e.contains("sliding_window"), "{e}");
}

#[test]
fn the_query_temperature_is_one_until_the_first_floor_and_grows_with_its_log() {
    let t = QueryTemperature { floor_scale: 8192.0, attn_scale: 0.1 };
    assert_eq!((t.factor(0), t.factor(8190)), (1.0, 1.0));
    assert!((t.factor(8191) - (1.0 + 0.1 * 2f64.ln())).abs() < 1e-12);
    assert!((t.factor(3 * 8192 - 1) - (1.0 + 0.1 * 4f64.ln())).abs() < 1e-12);
}

#[test]
fn configuration_errors_name_their_key() {
    let error = |key: &str, value: Value| {
        let mut c = testing::llama4_config(&SHAPE, &MOE, 1, CHUNK, FLOOR_SCALE);
        c[key] = value;
        DecoderConfig::from_hf_json(&c).unwrap_err().to_string()
    };
    for (key, value) in [
        ("attention_chunk_size", json!(0)),
        ("attn_temperature_tuning", json!("yes")),
        ("floor_scale", json!(0.0)),
        ("interleave_moe_layer_step", json!(0)),
        ("moe_layers", json!([0, 9])),
        ("intermediate_size_mlp", Value::Null),
    ] {
        let e = error(key, value);
        assert!(e.contains(key), "{key}: {e}");
    }
    // An explicit `moe_layers` names the sparse layers whatever the step says.
    let mut c = testing::llama4_config(&SHAPE, &MOE, 1, CHUNK, FLOOR_SCALE);
    c["moe_layers"] = json!([0, 3]);
    let moe = DecoderConfig::from_hf_json(&c).unwrap().moe.unwrap();
    assert_eq!((0..4).map(|l| moe.is_sparse_layer(l)).collect::<Vec<_>>(), vec![true, false, false, true]);
    // A null chunk attends fully; a missing one takes transformers' default.
    let mut c = testing::llama4_config(&SHAPE, &MOE, 1, CHUNK, FLOOR_SCALE);
    c["attention_chunk_size"] = Value::Null;
    assert_eq!(DecoderConfig::from_hf_json(&c).unwrap().attention_chunk(), None);
    c.as_object_mut().unwrap().remove("attention_chunk_size");
    assert_eq!(DecoderConfig::from_hf_json(&c).unwrap().attention_chunk(), Some(8192));
}
