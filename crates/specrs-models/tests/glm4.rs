//! GLM-4-0414 (`Glm4ForCausalLM`) on a tiny checkpoint written in its real layout: q/k/v
//! biases, fused `gate_up_proj`, norms around attention and MLP, and RoPE over half of each head
//! turning interleaved pairs, matching transformers' forward (`common::Reference`, which turns
//! the stored q/k rows as GLM does) in one prefill and token by token; its GGUF file (`glm4`)
//! loads to the same model.

mod common;

use std::collections::HashMap;

use candle_core::quantized::gguf_file::Value as GgufValue;
use candle_core::{Device, Tensor};
use common::{Reference, assert_close, logits, write_unpermuted_gguf};
use specrs_models::config::NormPlacement;
use specrs_models::testing::{self, TinyShape};
use specrs_models::{Architecture, ModelDType, load_causal_lm};

const SHAPE: TinyShape =
    TinyShape { vocab: 40, hidden: 32, layers: 3, heads: 4, kv_heads: 2, head_dim: 8, intermediate: 48 };

/// GLM's norm names as the reference's (Gemma's): the same tensors, renamed.
fn gemma_norm_names(tensors: &HashMap<String, Tensor>) -> HashMap<String, Tensor> {
    tensors
        .iter()
        .map(|(name, t)| {
            let renamed = name
                .replace(".post_attention_layernorm.", ".pre_feedforward_layernorm.")
                .replace(".post_self_attn_layernorm.", ".post_attention_layernorm.")
                .replace(".post_mlp_layernorm.", ".post_feedforward_layernorm.");
            (renamed, t.clone())
        })
        .collect()
}

#[test]
fn interleaved_half_rotation_and_sandwich_norms_match_the_transformers_forward() {
    let dir = tempfile::tempdir().unwrap();
    let tensors = testing::random_glm4(&SHAPE, 11).unwrap();
    testing::write_checkpoint(dir.path(), &testing::glm4_config(&SHAPE), &tensors).unwrap();
    let (model, _) = load_causal_lm(dir.path(), &Device::Cpu, ModelDType::F32).unwrap();
    let cfg = model.config();
    assert_eq!((cfg.architecture, cfg.rotary_dim), (Architecture::Glm4, 4));
    assert!(cfg.attention_bias && cfg.norm_placement() == NormPlacement::Sandwich && !cfg.norms_add_one());
    let renamed = gemma_norm_names(&tensors);
    let reference = |interleaved_rope| Reference {
        rotary: 4,
        factors: vec![1.0; 2],
        interleaved_rope,
        ..Reference::plain(&renamed, SHAPE)
    };
    let ids: Vec<u32> = (0..10).map(|i| (i * 9 + 2) % 40).collect();
    let want = reference(true).logits(&ids);
    assert_close(&logits(&model, &ids, false), &want, "one prefill");
    assert_close(&logits(&model, &ids, true), &want, "token by token");
    // The pairing matters: rotating halves of the stored rows gives other logits.
    let halves = reference(false).logits(&ids);
    let gap = want.iter().flatten().zip(halves.iter().flatten()).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    assert!(gap > 1e-2, "interleaved and half rotation agree to {gap}");
}

#[test]
fn a_glm4_gguf_loads_to_the_same_model() {
    let dir = tempfile::tempdir().unwrap();
    let tensors = testing::random_glm4(&SHAPE, 12).unwrap();
    testing::write_checkpoint(&dir.path().join("hf"), &testing::glm4_config(&SHAPE), &tensors).unwrap();
    // llama.cpp keeps GLM's q/k rows as they are and writes the rotated part of a head.
    let path = dir.path().join("glm4.gguf");
    write_unpermuted_gguf(
        &path,
        "glm4",
        &SHAPE,
        &gemma_norm_names(&tensors),
        false,
        &[("glm4.rope.dimension_count", GgufValue::U32(4))],
    );
    let (gguf, _) = load_causal_lm(&path, &Device::Cpu, ModelDType::F32).unwrap();
    let (hf, _) = load_causal_lm(&dir.path().join("hf"), &Device::Cpu, ModelDType::F32).unwrap();
    let (g, h) = (gguf.config(), hf.config());
    assert_eq!((g.architecture, g.head_dim, g.rotary_dim), (Architecture::Glm4, 8, 4));
    assert_eq!((g.attention_bias, g.fused_projections), (h.attention_bias, h.fused_projections));
    let ids: Vec<u32> = (0..10).map(|i| (i * 7 + 3) % 40).collect();
    assert_close(&logits(&gguf, &ids, false), &logits(&hf, &ids, false), "GGUF vs safetensors, one prefill");
    assert_close(&logits(&gguf, &ids, true), &logits(&hf, &ids, false), "GGUF token by token");
}
