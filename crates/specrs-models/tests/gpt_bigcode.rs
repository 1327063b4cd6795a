//! GPT-BigCode (`GPTBigCodeForCausalLM`: StarCoder, SantaCoder) on tiny checkpoints in its
//! real layout: learned absolute positions and no RoPE, multi-query attention with q, k and v
//! fused in `c_attn` (or a group per head), LayerNorms with bias, biases everywhere, a
//! tanh-GELU MLP without a gate. Matches transformers' forward (`common::Reference`) in one
//! prefill and token by token, loads from llama.cpp's `starcoder` GGUF to the same model, and
//! refuses positions past its table.

mod common;

use std::collections::HashMap;

use candle_core::quantized::gguf_file::Value as GgufValue;
use candle_core::{Device, Tensor};
use common::{Reference, assert_close, batch, gguf_fused_qkv, gguf_named, is_q_k_or_v, logits, write_gguf};
use serde_json::json;
use specrs_models::testing::{self, TinyShape};
use specrs_models::{Architecture, DecoderConfig, ModelDType, load_causal_lm};

fn shape(kv_heads: usize) -> TinyShape {
    TinyShape { vocab: 40, hidden: 32, layers: 3, heads: 4, kv_heads, head_dim: 8, intermediate: 48 }
}
const POSITIONS: usize = 16;

fn reference(tensors: &HashMap<String, Tensor>, s: TinyShape) -> Reference<'_> {
    Reference {
        centered_norms: true,
        ungated_gelu: true,
        rope_layers: Some(vec![false; s.layers]),
        ..Reference::plain(tensors, s)
    }
}

fn ids() -> Vec<u32> {
    (0..12).map(|i| (i * 7 + 5) % 40).collect()
}

#[test]
fn multi_query_and_per_head_layouts_match_the_transformers_forward() {
    for (kv_heads, seed) in [(1, 701), (4, 709)] {
        let s = shape(kv_heads);
        let dir = tempfile::tempdir().unwrap();
        let tensors = testing::random_gpt_bigcode(&s, POSITIONS, seed).unwrap();
        let on_disk = testing::as_gpt_bigcode(&tensors, &s).unwrap();
        testing::write_checkpoint(dir.path(), &testing::gpt_bigcode_config(&s, POSITIONS), &on_disk).unwrap();
        let (model, _) = load_causal_lm(dir.path(), &Device::Cpu, ModelDType::F32).unwrap();
        let cfg = model.config();
        assert_eq!((cfg.architecture, cfg.num_key_value_heads), (Architecture::GptBigCode, kv_heads));
        assert!(cfg.learned_positions && (0..s.layers).all(|l| !cfg.layer_rotates(l)));
        assert!(cfg.attention_bias && cfg.attention_output_bias && cfg.mlp_bias && cfg.tie_word_embeddings);
        let want = reference(&tensors, s).logits(&ids());
        let what = format!("{kv_heads} KV heads");
        assert_close(&logits(&model, &ids(), false), &want, &what);
        assert_close(&logits(&model, &ids(), true), &want, &format!("{what}, token by token"));
        // The learned positions matter: without them the logits differ.
        let mut unplaced = tensors.clone();
        unplaced.remove("model.embed_positions.weight");
        let other = reference(&unplaced, s).logits(&ids());
        let gap = other.iter().flatten().zip(want.iter().flatten()).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(gap > 1e-3, "{what}: positions change nothing");
    }
}

#[test]
fn a_position_past_the_learned_table_is_an_error_not_a_panic() {
    let s = shape(1);
    let dir = tempfile::tempdir().unwrap();
    let tensors = testing::random_gpt_bigcode(&s, POSITIONS, 719).unwrap();
    let on_disk = testing::as_gpt_bigcode(&tensors, &s).unwrap();
    testing::write_checkpoint(dir.path(), &testing::gpt_bigcode_config(&s, POSITIONS), &on_disk).unwrap();
    let (model, _) = load_causal_lm(dir.path(), &Device::Cpu, ModelDType::F32).unwrap();
    assert_eq!(model.max_positions(), POSITIONS);
    let kv = model.new_kv_cache(8, 4).unwrap();
    let tokens: Vec<u32> = (0..POSITIONS as u32 + 1).map(|i| i % 40).collect();
    let e = model.forward(&batch(&tokens, 0), &kv).unwrap_err().to_string();
    assert!(e.contains(&format!("position {POSITIONS}")), "{e}");
}

#[test]
fn the_config_reads_gpt2_keys_and_refuses_unscaled_attention() {
    let c = DecoderConfig::from_hf_json(&json!({
        "architectures": ["GPTBigCodeForCausalLM"], "n_embd": 64, "n_head": 4, "n_layer": 2, "n_positions": 128,
        "vocab_size": 40,
    }))
    .unwrap();
    assert_eq!((c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim), (64, 4, 1, 16));
    assert_eq!((c.intermediate_size, c.max_position_embeddings, c.rms_norm_eps), (256, 128, 1e-5));
    let mut unscaled = testing::gpt_bigcode_config(&shape(1), POSITIONS);
    unscaled["scale_attn_weights"] = json!(false);
    let e = DecoderConfig::from_hf_json(&unscaled).unwrap_err().to_string();
    assert!(e.contains("scale_attn_weights"), "{e}");
    let mut exact = testing::gpt_bigcode_config(&shape(1), POSITIONS);
    exact["activation_function"] = json!("relu");
    let e = DecoderConfig::from_hf_json(&exact).unwrap_err().to_string();
    assert!(e.contains("hidden_act") && e.contains("gelu_pytorch_tanh"), "{e}");
}

#[test]
fn the_starcoder_gguf_loads_to_the_same_model() {
    let s = shape(1);
    let dir = tempfile::tempdir().unwrap();
    let tensors = testing::random_gpt_bigcode(&s, POSITIONS, 727).unwrap();
    // llama.cpp's converter keeps c_attn as it is (multi-query: all q, then k, then v) and
    // writes the positions as `position_embd`.
    let mut named = gguf_named(&tensors, is_q_k_or_v, false);
    named.extend(gguf_fused_qkv(&tensors, s.layers));
    let extra = [
        ("starcoder.attention.layer_norm_epsilon", GgufValue::F32(1e-5)),
        ("starcoder.context_length", GgufValue::U32(POSITIONS as u32)),
    ];
    let path = dir.path().join("starcoder.gguf");
    write_gguf(&path, "starcoder", &s, &named, &extra);
    let (gguf, _) = load_causal_lm(&path, &Device::Cpu, ModelDType::F32).unwrap();
    let cfg = gguf.config();
    assert_eq!((cfg.architecture, cfg.learned_positions), (Architecture::GptBigCode, true));
    assert_close(&logits(&gguf, &ids(), false), &reference(&tensors, s).logits(&ids()), "starcoder GGUF");
}
