//! Phi (`PhiForCausalLM`: Phi-1, 1.5, 2) on tiny checkpoints in its real layout: attention
//! beside a tanh-GELU MLP without a gate from one LayerNorm with bias, biases on every
//! projection and on `lm_head`, RoPE over part of each head, and (`qk_layernorm`) q/k
//! LayerNorms with bias, matching transformers' forward (`common::Reference`) in one prefill and
//! token by token; its `phi2` GGUF, with q, k and v apart or fused in `attn_qkv`, loads to the
//! same model.

mod common;

use std::collections::HashMap;

use candle_core::quantized::gguf_file::Value as GgufValue;
use candle_core::{Device, Tensor};
use common::{Reference, assert_close, gguf_fused_qkv, gguf_named, is_q_k_or_v, logits, write_gguf};
use serde_json::json;
use specrs_models::config::NormPlacement;
use specrs_models::testing::{self, TinyShape};
use specrs_models::{Architecture, DecoderConfig, ModelDType, load_causal_lm};

/// Phi's heads span the hidden size; Phi-2's RoPE turns 0.4 of each head (32 of 80; here 4
/// of 10).
const SHAPE: TinyShape =
    TinyShape { vocab: 40, hidden: 40, layers: 3, heads: 4, kv_heads: 4, head_dim: 10, intermediate: 56 };
const ROTARY: usize = 4;

fn ids() -> Vec<u32> {
    (0..10).map(|i| (i * 11 + 4) % 40).collect()
}

fn reference(tensors: &HashMap<String, Tensor>) -> Reference<'_> {
    Reference {
        rotary: ROTARY,
        factors: vec![1.0; ROTARY / 2],
        centered_norms: true,
        parallel: true,
        ungated_gelu: true,
        ..Reference::plain(tensors, SHAPE)
    }
}

#[test]
fn parallel_blocks_biases_everywhere_and_a_gelu_mlp_match_the_transformers_forward() {
    for qk_norm in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let tensors = testing::random_phi(&SHAPE, qk_norm, 43).unwrap();
        testing::write_checkpoint(dir.path(), &testing::phi_config(&SHAPE, 0.4, qk_norm), &testing::as_phi(&tensors))
            .unwrap();
        let (model, _) = load_causal_lm(dir.path(), &Device::Cpu, ModelDType::F32).unwrap();
        let cfg = model.config();
        assert_eq!((cfg.architecture, cfg.rotary_dim, cfg.qk_norm), (Architecture::Phi, ROTARY, qk_norm));
        assert_eq!(cfg.norm_placement(), NormPlacement::Parallel);
        assert!(cfg.attention_bias && cfg.attention_output_bias && cfg.mlp_bias && cfg.lm_head_bias);
        let want = reference(&tensors).logits(&ids());
        assert_close(&logits(&model, &ids(), false), &want, "one prefill");
        assert_close(&logits(&model, &ids(), true), &want, "token by token");
        // The head's bias moves every logit: the test holds the model to it.
        let mut unbiased = tensors.clone();
        unbiased.remove("lm_head.bias");
        let other = reference(&unbiased).logits(&ids());
        let diff = other.iter().flatten().zip(want.iter().flatten()).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(diff > 1e-3, "without lm_head's bias the logits stay");
    }
}

#[test]
fn the_phi2_gguf_loads_to_the_same_model_with_q_k_v_apart_or_fused() {
    let dir = tempfile::tempdir().unwrap();
    let tensors = testing::random_phi(&SHAPE, false, 47).unwrap();
    let want = reference(&tensors).logits(&ids());
    let extra = [
        ("phi2.attention.layer_norm_epsilon", GgufValue::F32(1e-5)),
        ("phi2.rope.dimension_count", GgufValue::U32(ROTARY as u32)),
    ];
    for fused in [false, true] {
        let mut named = gguf_named(&tensors, |name| fused && is_q_k_or_v(name), false);
        if fused {
            named.extend(gguf_fused_qkv(&tensors, SHAPE.layers));
        }
        let path = dir.path().join(format!("phi2-{fused}.gguf"));
        write_gguf(&path, "phi2", &SHAPE, &named, &extra);
        let (gguf, _) = load_causal_lm(&path, &Device::Cpu, ModelDType::F32).unwrap();
        assert_eq!(gguf.config().architecture, Architecture::Phi);
        assert!(gguf.config().lm_head_bias && gguf.config().parallel_residual);
        assert_close(&logits(&gguf, &ids(), false), &want, &format!("phi2 GGUF (fused q/k/v: {fused})"));
    }
}

#[test]
fn the_config_reads_phi_keys_and_refuses_other_activations() {
    // Phi-2's config gives no num_key_value_heads (null) and no head_dim.
    let mut config = testing::phi_config(&SHAPE, 0.4, false);
    config["num_key_value_heads"] = json!(null);
    let c = DecoderConfig::from_hf_json(&config).unwrap();
    assert_eq!((c.num_key_value_heads, c.head_dim, c.rotary_dim), (4, 10, ROTARY));
    assert!(!c.mlp_is_gated() && !c.tie_word_embeddings && c.norms_have_bias());
    let mut relu = testing::phi_config(&SHAPE, 0.4, false);
    relu["hidden_act"] = json!("relu");
    let e = DecoderConfig::from_hf_json(&relu).unwrap_err().to_string();
    assert!(e.contains("hidden_act") && e.contains("gelu_new"), "{e}");
}
