//! Falcon (`FalconForCausalLM`) on tiny checkpoints in its real layouts: Falcon-7B's
//! multi-query attention beside the MLP from one LayerNorm, Falcon-40B's KV groups with two
//! (`ln_attn`, `ln_mlp`), Falcon2-11B's groups with one, and the first layout's per-head q/k/v,
//! biased and one block after the other; q, k and v fused group by group; an exact-GELU MLP
//! without a gate. Each matches transformers' forward (`common::Reference`) in one prefill and
//! token by token, and loads from llama.cpp's `falcon` GGUF to the same model. Falcon-RW's
//! ALiBi is added before the scores are scaled, as transformers adds it.

mod common;

use std::collections::HashMap;

use candle_core::quantized::gguf_file::Value as GgufValue;
use candle_core::{Device, Tensor};
use common::{
    AlibiLayout, Reference, assert_close, bloom_alibi_slopes, gguf_fused_qkv, gguf_named, is_q_k_or_v, logits, max_gap,
    write_gguf,
};
use serde_json::json;
use specrs_models::config::NormPlacement;
use specrs_models::testing::{self, FalconLayout, TinyShape};
use specrs_models::{Alibi, Architecture, DecoderConfig, ModelDType, load_causal_lm};

/// Falcon's heads span the hidden size; `kv_heads` varies by layout.
fn shape(kv_heads: usize) -> TinyShape {
    TinyShape { vocab: 40, hidden: 32, layers: 3, heads: 4, kv_heads, head_dim: 8, intermediate: 48 }
}

/// (name, KV heads, layout) of each released layout.
fn layouts() -> [(&'static str, usize, FalconLayout); 4] {
    let layout = |new_decoder_architecture, parallel_attn, two_norms, bias| FalconLayout {
        new_decoder_architecture,
        parallel_attn,
        two_norms,
        bias,
    };
    [
        ("Falcon-7B (multi-query, one norm)", 1, layout(false, true, false, false)),
        ("Falcon-40B (KV groups, ln_attn / ln_mlp)", 2, layout(true, true, true, false)),
        ("Falcon2-11B (KV groups, one norm)", 2, layout(true, true, false, false)),
        ("first layout (per-head q/k/v, biased, sequential)", 4, layout(false, false, false, true)),
    ]
}

fn reference(tensors: &HashMap<String, Tensor>, s: TinyShape, layout: FalconLayout) -> Reference<'_> {
    Reference {
        centered_norms: true,
        ungated_gelu: true,
        exact_gelu: true,
        parallel: layout.parallel_attn,
        parallel_mlp_norm: layout.two_norms,
        ..Reference::plain(tensors, s)
    }
}

fn ids() -> Vec<u32> {
    (0..10).map(|i| (i * 7 + 3) % 40).collect()
}

#[test]
fn every_released_layout_matches_the_transformers_forward() {
    for (seed, (what, kv_heads, layout)) in layouts().into_iter().enumerate() {
        let s = shape(kv_heads);
        let dir = tempfile::tempdir().unwrap();
        let tensors = testing::random_falcon(&s, layout, 500 + seed as u64).unwrap();
        let on_disk = testing::as_falcon(&tensors, &s, layout).unwrap();
        testing::write_checkpoint(dir.path(), &testing::falcon_config(&s, layout), &on_disk).unwrap();
        let (model, _) = load_causal_lm(dir.path(), &Device::Cpu, ModelDType::F32).unwrap();
        let cfg = model.config();
        assert_eq!((cfg.architecture, cfg.num_key_value_heads), (Architecture::Falcon, kv_heads), "{what}");
        let placement = if layout.parallel_attn { NormPlacement::Parallel } else { NormPlacement::Pre };
        assert_eq!(cfg.norm_placement(), placement, "{what}");
        assert_eq!(
            (cfg.parallel_mlp_norm, cfg.attention_bias, cfg.mlp_bias),
            (layout.two_norms, layout.bias, layout.bias)
        );
        assert!(cfg.tie_word_embeddings && cfg.norms_have_bias() && !cfg.mlp_is_gated(), "{what}");
        let want = reference(&tensors, s, layout).logits(&ids());
        assert_close(&logits(&model, &ids(), false), &want, what);
        assert_close(&logits(&model, &ids(), true), &want, &format!("{what} token by token"));
        // The MLP's own norm matters where it has one: attention's normed input gives other logits.
        if layout.two_norms {
            let shared = Reference { parallel_mlp_norm: false, ..reference(&tensors, s, layout) }.logits(&ids());
            assert!(max_gap(&shared, &want) > 1e-3, "{what}: ln_mlp changes nothing");
        }
    }
}

#[test]
fn falcon_rw_adds_alibi_to_the_scores_before_scaling_them() {
    // Falcon-RW-1B's layout: per-head q/k/v, biased, one block after the other, `alibi`.
    let (s, layout) = (
        shape(4),
        FalconLayout { new_decoder_architecture: false, parallel_attn: false, two_norms: false, bias: true },
    );
    let dir = tempfile::tempdir().unwrap();
    let tensors = testing::random_falcon(&s, layout, 560).unwrap();
    let mut config = testing::falcon_config(&s, layout);
    config["alibi"] = json!(true);
    testing::write_checkpoint(dir.path(), &config, &testing::as_falcon(&tensors, &s, layout).unwrap()).unwrap();
    let (model, _) = load_causal_lm(dir.path(), &Device::Cpu, ModelDType::F32).unwrap();
    let cfg = model.config();
    assert_eq!((cfg.alibi, cfg.rope_layers.clone()), (Some(Alibi::FALCON_RW), Some(vec![false; s.layers])));
    let with_alibi = |before_scaling| Reference {
        rope_layers: Some(vec![false; s.layers]),
        alibi: Some(AlibiLayout { slopes: bloom_alibi_slopes(s.heads), before_scaling }),
        ..reference(&tensors, s, layout)
    };
    let want = with_alibi(true).logits(&ids());
    assert_close(&logits(&model, &ids(), false), &want, "Falcon-RW");
    assert_close(&logits(&model, &ids(), true), &want, "Falcon-RW token by token");
    assert!(max_gap(&with_alibi(false).logits(&ids()), &want) > 1e-3, "where the bias joins the scores matters");
}

#[test]
fn the_config_reads_falcons_keys_and_defaults() {
    // Falcon-7B's config as released: no KV count (multi-query), no MLP width (4 × hidden),
    // old names for the shape.
    let c = DecoderConfig::from_hf_json(&json!({
        "architectures": ["FalconForCausalLM"], "model_type": "falcon", "n_embed": 64, "n_head": 4,
        "n_layer": 2, "vocab_size": 40, "multi_query": true, "parallel_attn": true, "bias": false,
    }))
    .unwrap();
    assert_eq!((c.hidden_size, c.num_attention_heads, c.num_hidden_layers), (64, 4, 2));
    assert_eq!((c.num_key_value_heads, c.head_dim, c.intermediate_size), (1, 16, 256));
    assert_eq!((c.rms_norm_eps, c.rope_theta, c.max_position_embeddings), (1e-5, 10_000.0, 2048));
    assert!(c.parallel_residual && !c.parallel_mlp_norm && c.tie_word_embeddings && !c.attention_bias);
    // Falcon-40B: the new layout's groups and two norms by default.
    let c = DecoderConfig::from_hf_json(&json!({
        "architectures": ["FalconForCausalLM"], "hidden_size": 64, "num_attention_heads": 8, "num_hidden_layers": 2,
        "vocab_size": 40, "new_decoder_architecture": true, "num_kv_heads": 2,
    }))
    .unwrap();
    assert_eq!(c.num_key_value_heads, 2);
    assert!(c.parallel_residual && c.parallel_mlp_norm);
}

#[test]
fn unsupported_falcon_configs_are_refused_by_key() {
    let s = shape(1);
    let base = testing::falcon_config(
        &s,
        FalconLayout { new_decoder_architecture: false, parallel_attn: true, two_norms: false, bias: false },
    );
    for (key, value, names) in
        [("activation", json!("relu"), "gelu"), ("num_ln_in_parallel_attn", json!(2), "new_decoder_architecture")]
    {
        let mut c = base.clone();
        c[key] = value;
        let e = DecoderConfig::from_hf_json(&c).unwrap_err().to_string();
        let shown = if key == "activation" { "hidden_act" } else { key };
        assert!(e.contains(shown) && e.contains(names), "{key}: {e}");
    }
    let mut sequential_new = base;
    sequential_new["new_decoder_architecture"] = json!(true);
    sequential_new["parallel_attn"] = json!(false);
    let e = DecoderConfig::from_hf_json(&sequential_new).unwrap_err().to_string();
    assert!(e.contains("parallel_attn"), "{e}");
}

#[test]
fn the_falcon_gguf_loads_to_the_same_model_with_one_or_two_norms() {
    for (seed, (what, kv_heads, layout)) in layouts().into_iter().take(3).enumerate() {
        let s = shape(kv_heads);
        let dir = tempfile::tempdir().unwrap();
        let tensors = testing::random_falcon(&s, layout, 600 + seed as u64).unwrap();
        // llama.cpp's converter restacks query_key_value as all q rows, then k, then v, and
        // names ln_mlp `attn_norm_2`; it writes 4 × hidden as the MLP width whatever the
        // checkpoint's, and no rope base.
        let mut named: Vec<_> = gguf_named(&tensors, is_q_k_or_v, false)
            .into_iter()
            .map(|(name, t)| (name.replace(".ffn_norm.", ".attn_norm_2."), t))
            .collect();
        named.extend(gguf_fused_qkv(&tensors, s.layers));
        let extra = [
            ("falcon.attention.layer_norm_epsilon", GgufValue::F32(1e-5)),
            ("falcon.feed_forward_length", GgufValue::U32(4 * s.hidden as u32)),
        ];
        let path = dir.path().join("falcon.gguf");
        write_gguf(&path, "falcon", &s, &named, &extra);
        let (gguf, _) = load_causal_lm(&path, &Device::Cpu, ModelDType::F32).unwrap();
        let cfg = gguf.config();
        assert_eq!(
            (cfg.architecture, cfg.intermediate_size, cfg.parallel_mlp_norm),
            (Architecture::Falcon, 48, layout.two_norms)
        );
        let want = reference(&tensors, s, layout).logits(&ids());
        assert_close(&logits(&gguf, &ids(), false), &want, &format!("{what} GGUF"));
    }
}
