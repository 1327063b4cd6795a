//! BLOOM (`BloomForCausalLM`) on tiny checkpoints in its real layout: ALiBi in place of
//! positions, a LayerNorm over the embeddings, q, k and v fused head by head, LayerNorms with
//! bias, biases everywhere, a tanh-GELU MLP without a gate, tied embeddings; names under
//! `transformer.` or, as BigScience saved the base model, without. Matches transformers'
//! forward (`common::Reference`, ALiBi as BLOOM's `slope · key position`) in one prefill and
//! token by token, with a power-of-two head count and one that takes the next series' slopes,
//! and loads from llama.cpp's `bloom` GGUF to the same model.

mod common;

use std::collections::HashMap;

use candle_core::quantized::gguf_file::Value as GgufValue;
use candle_core::{Device, Tensor};
use common::{
    AlibiLayout, Reference, assert_close, bloom_alibi_slopes, gguf_fused_qkv, gguf_named, is_q_k_or_v, logits, max_gap,
    write_gguf,
};
use serde_json::json;
use specrs_models::testing::{self, TinyShape};
use specrs_models::{Alibi, Architecture, DecoderConfig, ModelDType, load_causal_lm};

const SHAPE: TinyShape =
    TinyShape { vocab: 40, hidden: 32, layers: 3, heads: 4, kv_heads: 4, head_dim: 8, intermediate: 128 };
/// Six heads: four slopes of the 4-head series, two odd ones of the 8-head series.
const SIX_HEADS: TinyShape =
    TinyShape { vocab: 40, hidden: 24, layers: 2, heads: 6, kv_heads: 6, head_dim: 4, intermediate: 96 };

fn reference(tensors: &HashMap<String, Tensor>, s: TinyShape) -> Reference<'_> {
    Reference {
        centered_norms: true,
        ungated_gelu: true,
        rope_layers: Some(vec![false; s.layers]),
        alibi: Some(AlibiLayout { slopes: bloom_alibi_slopes(s.heads), before_scaling: false }),
        ..Reference::plain(tensors, s)
    }
}

fn ids() -> Vec<u32> {
    (0..14).map(|i| (i * 7 + 2) % 40).collect()
}

#[test]
fn bloom_checkpoints_under_either_root_match_the_transformers_forward() {
    for (s, root, seed) in [(SHAPE, "transformer.", 801), (SHAPE, "", 803), (SIX_HEADS, "", 807)] {
        let dir = tempfile::tempdir().unwrap();
        let tensors = testing::random_bloom(&s, seed).unwrap();
        let on_disk = testing::as_bloom(&tensors, &s, root).unwrap();
        testing::write_checkpoint(dir.path(), &testing::bloom_config(&s), &on_disk).unwrap();
        let (model, _) = load_causal_lm(dir.path(), &Device::Cpu, ModelDType::F32).unwrap();
        let cfg = model.config();
        assert_eq!((cfg.architecture, cfg.alibi), (Architecture::Bloom, Some(Alibi::BLOOM)));
        assert!(cfg.embedding_norm && cfg.tie_word_embeddings && cfg.attention_bias && !cfg.mlp_is_gated());
        let want = reference(&tensors, s).logits(&ids());
        let what = format!("{} heads, root '{root}'", s.heads);
        assert_close(&logits(&model, &ids(), false), &want, &what);
        assert_close(&logits(&model, &ids(), true), &want, &format!("{what}, token by token"));
        // What the test holds the model to matters: without ALiBi, or without the embedding
        // norm, the forward gives other logits.
        let without_alibi = Reference { alibi: None, ..reference(&tensors, s) }.logits(&ids());
        assert!(max_gap(&without_alibi, &want) > 1e-3, "{what}: ALiBi changes nothing");
        let mut unnormed = tensors.clone();
        unnormed.remove("model.embed_norm.weight");
        assert!(max_gap(&reference(&unnormed, s).logits(&ids()), &want) > 1e-3, "{what}: embed norm");
    }
}

#[test]
fn the_config_reads_blooms_keys_and_defaults_and_refuses_the_post_norm_residual() {
    // BLOOM-560m's config as released: old names, no MLP width, no context length.
    let c = DecoderConfig::from_hf_json(&json!({
        "architectures": ["BloomForCausalLM"], "model_type": "bloom", "n_embed": 64, "n_head": 4, "n_layer": 2,
        "vocab_size": 40, "layer_norm_epsilon": 1e-5, "apply_residual_connection_post_layernorm": false,
    }))
    .unwrap();
    assert_eq!((c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim), (64, 4, 4, 16));
    assert_eq!((c.intermediate_size, c.max_position_embeddings, c.num_hidden_layers), (256, 2048, 2));
    assert_eq!(c.rope_layers, Some(vec![false; 2]), "ALiBi models turn nothing");
    assert!(c.tie_word_embeddings && c.embedding_norm && c.mlp_bias && c.attention_output_bias);
    let mut post_norm = testing::bloom_config(&SHAPE);
    post_norm["apply_residual_connection_post_layernorm"] = json!(true);
    let e = DecoderConfig::from_hf_json(&post_norm).unwrap_err().to_string();
    assert!(e.contains("apply_residual_connection_post_layernorm"), "{e}");
}

#[test]
fn the_bloom_gguf_loads_to_the_same_model() {
    let dir = tempfile::tempdir().unwrap();
    let tensors = testing::random_bloom(&SHAPE, 809).unwrap();
    // llama.cpp's converter restacks query_key_value as all q rows, then k, then v, and names
    // the embeddings' norm `token_embd_norm`.
    let mut named = gguf_named(&tensors, is_q_k_or_v, false);
    named.extend(gguf_fused_qkv(&tensors, SHAPE.layers));
    let extra = [("bloom.attention.layer_norm_epsilon", GgufValue::F32(1e-5))];
    let path = dir.path().join("bloom.gguf");
    write_gguf(&path, "bloom", &SHAPE, &named, &extra);
    let (gguf, _) = load_causal_lm(&path, &Device::Cpu, ModelDType::F32).unwrap();
    let cfg = gguf.config();
    assert_eq!((cfg.architecture, cfg.alibi, cfg.embedding_norm), (Architecture::Bloom, Some(Alibi::BLOOM), true));
    assert_close(&logits(&gguf, &ids(), false), &reference(&tensors, SHAPE).logits(&ids()), "bloom GGUF");
}
