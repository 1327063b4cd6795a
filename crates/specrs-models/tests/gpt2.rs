//! GPT-2 (`GPT2LMHeadModel`) on tiny checkpoints in its real layout: every projection a Conv1D
//! stored `[in, out]` (q, k and v side by side in `c_attn`), learned absolute positions and no
//! RoPE, LayerNorms with bias, biases everywhere, a tanh-GELU MLP without a gate; names under
//! `transformer.` or, as the first checkpoints saved them, without. Matches transformers'
//! forward (`common::Reference`) in one prefill and token by token, and loads from llama.cpp's
//! `gpt2` GGUF (Conv1D weights turned by its converter) to the same model.

mod common;

use std::collections::HashMap;

use candle_core::quantized::gguf_file::Value as GgufValue;
use candle_core::{Device, Tensor};
use common::{Reference, assert_close, gguf_fused_qkv, gguf_named, is_q_k_or_v, logits, write_gguf};
use serde_json::json;
use specrs_models::testing::{self, TinyShape};
use specrs_models::{Architecture, DecoderConfig, ModelDType, load_causal_lm};

const SHAPE: TinyShape =
    TinyShape { vocab: 40, hidden: 32, layers: 3, heads: 4, kv_heads: 4, head_dim: 8, intermediate: 48 };
const POSITIONS: usize = 16;

fn reference(tensors: &HashMap<String, Tensor>) -> Reference<'_> {
    Reference {
        centered_norms: true,
        ungated_gelu: true,
        rope_layers: Some(vec![false; SHAPE.layers]),
        ..Reference::plain(tensors, SHAPE)
    }
}

fn ids() -> Vec<u32> {
    (0..12).map(|i| (i * 5 + 3) % 40).collect()
}

#[test]
fn conv1d_weights_under_either_root_match_the_transformers_forward() {
    for (root, seed) in [("transformer.", 733), ("", 739)] {
        let dir = tempfile::tempdir().unwrap();
        let tensors = testing::random_gpt_bigcode(&SHAPE, POSITIONS, seed).unwrap();
        let on_disk = testing::as_gpt2(&tensors, &SHAPE, root).unwrap();
        testing::write_checkpoint(dir.path(), &testing::gpt2_config(&SHAPE, POSITIONS), &on_disk).unwrap();
        let (model, _) = load_causal_lm(dir.path(), &Device::Cpu, ModelDType::F32).unwrap();
        let cfg = model.config();
        assert_eq!((cfg.architecture, cfg.num_key_value_heads), (Architecture::Gpt2, SHAPE.heads));
        assert!(cfg.learned_positions && cfg.tie_word_embeddings && !cfg.mlp_is_gated());
        let want = reference(&tensors).logits(&ids());
        let what = format!("root '{root}'");
        assert_close(&logits(&model, &ids(), false), &want, &what);
        assert_close(&logits(&model, &ids(), true), &want, &format!("{what}, token by token"));
    }
}

#[test]
fn the_config_reads_gpt2_defaults_and_refuses_layer_scaled_attention() {
    let c = DecoderConfig::from_hf_json(&json!({
        "architectures": ["GPT2LMHeadModel"], "n_embd": 64, "n_head": 4, "n_layer": 2, "vocab_size": 40,
    }))
    .unwrap();
    assert_eq!((c.num_key_value_heads, c.intermediate_size, c.max_position_embeddings), (4, 256, 1024));
    let mut scaled = testing::gpt2_config(&SHAPE, POSITIONS);
    scaled["scale_attn_by_inverse_layer_idx"] = json!(true);
    let e = DecoderConfig::from_hf_json(&scaled).unwrap_err().to_string();
    assert!(e.contains("scale_attn_by_inverse_layer_idx"), "{e}");
}

#[test]
fn the_gpt2_gguf_loads_to_the_same_model() {
    let dir = tempfile::tempdir().unwrap();
    let tensors = testing::random_gpt_bigcode(&SHAPE, POSITIONS, 743).unwrap();
    // llama.cpp's converter turns the Conv1D weights to `[out, in]` and keeps c_attn's q, k, v.
    let mut named = gguf_named(&tensors, is_q_k_or_v, false);
    named.extend(gguf_fused_qkv(&tensors, SHAPE.layers));
    let extra = [
        ("gpt2.attention.layer_norm_epsilon", GgufValue::F32(1e-5)),
        ("gpt2.context_length", GgufValue::U32(POSITIONS as u32)),
    ];
    let path = dir.path().join("gpt2.gguf");
    write_gguf(&path, "gpt2", &SHAPE, &named, &extra);
    let (gguf, _) = load_causal_lm(&path, &Device::Cpu, ModelDType::F32).unwrap();
    assert_eq!((gguf.config().architecture, gguf.config().learned_positions), (Architecture::Gpt2, true));
    assert_close(&logits(&gguf, &ids(), false), &reference(&tensors).logits(&ids()), "gpt2 GGUF");
}
