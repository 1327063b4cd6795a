//! MPT (`MptForCausalLM`, MosaicML's `MPTForCausalLM`) on tiny checkpoints in its real layout:
//! ALiBi of `alibi_bias_max` in place of positions, LayerNorms without bias, q, k and v
//! stacked in `attn.Wqkv` and clamped to `±clip_qkv`, no biases, an exact-GELU MLP without a
//! gate, tied embeddings. Matches transformers' forward (`common::Reference`, slopes as
//! `build_mpt_alibi_tensor` computes them) in one prefill and token by token, and loads from
//! llama.cpp's `mpt` GGUF to the same model; what transformers' MPT does not run is refused
//! by key.

mod common;

use std::collections::HashMap;

use candle_core::quantized::gguf_file::Value as GgufValue;
use candle_core::{Device, Tensor};
use common::{
    AlibiLayout, Reference, assert_close, gguf_fused_qkv, gguf_named, is_q_k_or_v, logits, max_gap, mpt_alibi_slopes,
    write_gguf,
};
use serde_json::json;
use specrs_models::testing::{self, TinyShape};
use specrs_models::{Alibi, Architecture, DecoderConfig, ModelDType, load_causal_lm};

const SHAPE: TinyShape =
    TinyShape { vocab: 40, hidden: 32, layers: 3, heads: 4, kv_heads: 4, head_dim: 8, intermediate: 128 };
/// Six heads take MPT's reordered slopes over eight.
const SIX_HEADS: TinyShape =
    TinyShape { vocab: 40, hidden: 24, layers: 2, heads: 6, kv_heads: 6, head_dim: 4, intermediate: 48 };

fn reference(tensors: &HashMap<String, Tensor>, s: TinyShape, max_bias: f32, clip: Option<f32>) -> Reference<'_> {
    Reference {
        centered_norms: true,
        ungated_gelu: true,
        exact_gelu: true,
        clip_qkv: clip,
        rope_layers: Some(vec![false; s.layers]),
        alibi: Some(AlibiLayout { slopes: mpt_alibi_slopes(s.heads, max_bias), before_scaling: false }),
        ..Reference::plain(tensors, s)
    }
}

fn ids() -> Vec<u32> {
    (0..13).map(|i| (i * 9 + 4) % 40).collect()
}

#[test]
fn mpt_checkpoints_match_the_transformers_forward_with_their_slopes_and_clamp() {
    for (s, max_bias, clip, seed) in [(SHAPE, 8.0, None, 901), (SIX_HEADS, 6.0, Some(0.3), 907)] {
        let dir = tempfile::tempdir().unwrap();
        let tensors = testing::random_mpt(&s, seed).unwrap();
        let config = testing::mpt_config(&s, f64::from(max_bias), clip.map(f64::from));
        testing::write_checkpoint(dir.path(), &config, &testing::as_mpt(&tensors, &s).unwrap()).unwrap();
        let (model, _) = load_causal_lm(dir.path(), &Device::Cpu, ModelDType::F32).unwrap();
        let cfg = model.config();
        let alibi = Alibi { max_bias: f64::from(max_bias), before_scaling: false };
        assert_eq!((cfg.architecture, cfg.alibi, cfg.clip_qkv), (Architecture::Mpt, Some(alibi), clip));
        assert!(cfg.centered_norms() && !cfg.norms_have_bias() && !cfg.attention_bias && !cfg.mlp_is_gated());
        let want = reference(&tensors, s, max_bias, clip).logits(&ids());
        let what = format!("{} heads, alibi_bias_max {max_bias}, clip {clip:?}", s.heads);
        assert_close(&logits(&model, &ids(), false), &want, &what);
        assert_close(&logits(&model, &ids(), true), &want, &format!("{what}, token by token"));
        // The slopes' series matters: BLOOM's 8 where MPT says 6 gives other logits.
        if max_bias != 8.0 {
            let bloom_series = reference(&tensors, s, 8.0, clip).logits(&ids());
            assert!(max_gap(&bloom_series, &want) > 1e-3, "{what}: alibi_bias_max changes nothing");
        }
    }
}

#[test]
fn the_config_reads_mpts_keys_and_refuses_what_transformers_does_not_run() {
    // MPT-7B's config as released: `d_model`, `expansion_ratio`, `max_seq_len`, ALiBi of 8.
    let c = DecoderConfig::from_hf_json(&json!({
        "architectures": ["MPTForCausalLM"], "d_model": 64, "n_heads": 4, "n_layers": 2, "expansion_ratio": 4,
        "max_seq_len": 2048, "vocab_size": 40, "no_bias": true, "attn_config": {"alibi": true},
    }))
    .unwrap();
    assert_eq!((c.hidden_size, c.head_dim, c.intermediate_size, c.max_position_embeddings), (64, 16, 256, 2048));
    assert_eq!((c.alibi, c.rope_layers.clone()), (Some(Alibi::BLOOM), Some(vec![false; 2])));
    assert!(c.tie_word_embeddings && c.clip_qkv.is_none());
    let base = testing::mpt_config(&SHAPE, 8.0, None);
    for (path, value, key) in [
        (["attn_config", "alibi"], json!(false), "attn_config.alibi"),
        (["attn_config", "attn_type"], json!("grouped_query_attention"), "attn_config.attn_type"),
        (["attn_config", "prefix_lm"], json!(true), "attn_config.prefix_lm"),
        (["attn_config", "qk_ln"], json!(true), "attn_config.qk_ln"),
        (["attn_config", "softmax_scale"], json!(0.5), "attn_config.softmax_scale"),
        (["attn_config", "alibi_bias_max"], json!(-1), "attn_config.alibi_bias_max"),
        (["no_bias", ""], json!(false), "no_bias"),
    ] {
        let mut c = base.clone();
        match path[1] {
            "" => c[path[0]] = value,
            inner => c[path[0]][inner] = value,
        }
        let e = DecoderConfig::from_hf_json(&c).unwrap_err().to_string();
        assert!(e.contains(key), "{key}: {e}");
    }
}

#[test]
fn the_mpt_gguf_loads_to_the_same_model() {
    let dir = tempfile::tempdir().unwrap();
    let tensors = testing::random_mpt(&SIX_HEADS, 911).unwrap();
    // llama.cpp's converter keeps Wqkv as it is (all q rows, then k, then v) and writes the
    // slopes' bias and the clamp.
    let mut named = gguf_named(&tensors, is_q_k_or_v, false);
    named.extend(gguf_fused_qkv(&tensors, SIX_HEADS.layers));
    let extra = [
        ("mpt.attention.layer_norm_epsilon", GgufValue::F32(1e-5)),
        ("mpt.attention.max_alibi_bias", GgufValue::F32(6.0)),
        ("mpt.attention.clamp_kqv", GgufValue::F32(0.3)),
    ];
    let path = dir.path().join("mpt.gguf");
    write_gguf(&path, "mpt", &SIX_HEADS, &named, &extra);
    let (gguf, _) = load_causal_lm(&path, &Device::Cpu, ModelDType::F32).unwrap();
    let cfg = gguf.config();
    assert_eq!((cfg.architecture, cfg.alibi.map(|a| a.max_bias)), (Architecture::Mpt, Some(6.0)));
    let want = reference(&tensors, SIX_HEADS, 6.0, Some(0.3)).logits(&ids());
    assert_close(&logits(&gguf, &ids(), false), &want, "mpt GGUF");
}
