//! GLM-4 as first ported (`GlmForCausalLM`) and as THUDM released ChatGLM2/3 and GLM-4-9B
//! (`ChatGLMModel`) on tiny checkpoints in their real layouts: q/k/v biases, a fused gate/up,
//! RoPE over half of each head turning interleaved pairs (at 10,000 × `rope_ratio` for
//! ChatGLM), Llama's two norms; ChatGLM's q, k and v stacked in `query_key_value` over
//! multi-query groups. Both match transformers' forward (`common::Reference`, which turns the
//! stored rows as GLM does) in one prefill and token by token, ChatGLM also from llama.cpp's
//! `chatglm` GGUF; ChatGLM-6B's first generation and options no release sets are refused by
//! key.

mod common;

use std::collections::HashMap;

use candle_core::quantized::gguf_file::Value as GgufValue;
use candle_core::{Device, Tensor};
use common::{Reference, assert_close, gguf_fused_qkv, gguf_named, is_q_k_or_v, logits, write_gguf};
use serde_json::json;
use specrs_models::config::NormPlacement;
use specrs_models::testing::{self, TinyShape};
use specrs_models::{Architecture, DecoderConfig, ModelDType, load_causal_lm};

const SHAPE: TinyShape =
    TinyShape { vocab: 40, hidden: 32, layers: 3, heads: 4, kv_heads: 2, head_dim: 8, intermediate: 48 };

fn reference(tensors: &HashMap<String, Tensor>, theta: f64) -> Reference<'_> {
    Reference { rotary: 4, factors: vec![1.0; 2], interleaved_rope: true, theta, ..Reference::plain(tensors, SHAPE) }
}

fn ids() -> Vec<u32> {
    (0..12).map(|i| (i * 11 + 3) % 40).collect()
}

#[test]
fn glm_for_causal_lm_matches_the_transformers_forward_with_pre_norms() {
    let dir = tempfile::tempdir().unwrap();
    let tensors = testing::random_glm(&SHAPE, 953).unwrap();
    testing::write_checkpoint(dir.path(), &testing::glm_config(&SHAPE), &tensors).unwrap();
    let (model, _) = load_causal_lm(dir.path(), &Device::Cpu, ModelDType::F32).unwrap();
    let cfg = model.config();
    assert_eq!((cfg.architecture, cfg.rotary_dim, cfg.norm_placement()), (Architecture::Glm, 4, NormPlacement::Pre));
    let want = reference(&tensors, 10_000.0).logits(&ids());
    assert_close(&logits(&model, &ids(), false), &want, "GlmForCausalLM");
    assert_close(&logits(&model, &ids(), true), &want, "GlmForCausalLM token by token");
}

#[test]
fn chatglm_checkpoints_match_the_transformers_forward_at_their_rope_ratio() {
    for (rope_ratio, seed) in [(1.0, 967), (50.0, 971)] {
        let dir = tempfile::tempdir().unwrap();
        let tensors = testing::random_glm(&SHAPE, seed).unwrap();
        let on_disk = testing::as_chatglm(&tensors, &SHAPE).unwrap();
        testing::write_checkpoint(dir.path(), &testing::chatglm_config(&SHAPE, rope_ratio), &on_disk).unwrap();
        let (model, _) = load_causal_lm(dir.path(), &Device::Cpu, ModelDType::F32).unwrap();
        let cfg = model.config();
        assert_eq!((cfg.architecture, cfg.num_key_value_heads, cfg.head_dim), (Architecture::ChatGlm, 2, 8));
        assert_eq!((cfg.rope_theta, cfg.max_position_embeddings), (10_000.0 * rope_ratio, 512));
        assert!(cfg.attention_bias && !cfg.attention_output_bias && !cfg.tie_word_embeddings);
        let want = reference(&tensors, 10_000.0 * rope_ratio).logits(&ids());
        let what = format!("ChatGLM, rope_ratio {rope_ratio}");
        assert_close(&logits(&model, &ids(), false), &want, &what);
        assert_close(&logits(&model, &ids(), true), &want, &format!("{what} token by token"));
    }
}

#[test]
fn chatglm_6b_and_options_no_release_sets_are_refused_by_key() {
    let base = testing::chatglm_config(&SHAPE, 1.0);
    for (key, value) in [
        ("position_encoding_2d", json!(true)),
        ("apply_residual_connection_post_layernorm", json!(true)),
        ("add_bias_linear", json!(true)),
        ("rmsnorm", json!(false)),
        ("original_rope", json!(false)),
        ("post_layer_norm", json!(false)),
    ] {
        let mut c = base.clone();
        c[key] = value;
        let e = DecoderConfig::from_hf_json(&c).unwrap_err().to_string();
        assert!(e.contains(key), "{key}: {e}");
    }
    // Without multi-query attention every head keeps its own KV head.
    let mut full = base;
    full["multi_query_attention"] = json!(false);
    assert_eq!(DecoderConfig::from_hf_json(&full).unwrap().num_key_value_heads, SHAPE.heads);
}

#[test]
fn the_chatglm_gguf_loads_to_the_same_model() {
    let dir = tempfile::tempdir().unwrap();
    let tensors = testing::random_glm(&SHAPE, 983).unwrap();
    // llama.cpp's converter keeps query_key_value (`attn_qkv`, q/k rows as stored) and
    // dense_h_to_4h (`ffn_up`, gate rows first), writes half the head as the rotated dims and
    // 10,000 × rope_ratio as the base.
    let mut named = gguf_named(&tensors, is_q_k_or_v, false);
    named.extend(gguf_fused_qkv(&tensors, SHAPE.layers));
    let extra = [("chatglm.rope.dimension_count", GgufValue::U32(4)), ("chatglm.rope.freq_base", GgufValue::F32(5e5))];
    let path = dir.path().join("chatglm.gguf");
    write_gguf(&path, "chatglm", &SHAPE, &named, &extra);
    let (gguf, _) = load_causal_lm(&path, &Device::Cpu, ModelDType::F32).unwrap();
    let cfg = gguf.config();
    assert_eq!((cfg.architecture, cfg.rotary_dim, cfg.rope_theta), (Architecture::ChatGlm, 4, 5e5));
    assert_close(&logits(&gguf, &ids(), false), &reference(&tensors, 5e5).logits(&ids()), "chatglm GGUF");
}
