//! Baichuan (`BaiChuanForCausalLM`, `BaichuanForCausalLM`) on tiny checkpoints in its real
//! layout: Llama's layer with q, k and v stacked in `W_pack`; Baichuan-7B turning RoPE, the 13B
//! models adding ALiBi (BLOOM's slopes) in its place, and Baichuan 2's `NormHead` dividing each
//! `lm_head` row by its norm. Each matches transformers' forward (`common::Reference`, the
//! normalised head written out) in one prefill and token by token, and loads from llama.cpp's
//! `baichuan` GGUF (q/k rows permuted; 40 layers meaning ALiBi) to the same model.

mod common;

use std::collections::HashMap;

use candle_core::{Device, Tensor};
use common::{AlibiLayout, Reference, assert_close, bloom_alibi_slopes, logits, max_gap, write_llama_layout_gguf};
use serde_json::json;
use specrs_models::config::BAICHUAN2_VOCAB;
use specrs_models::testing::{self, TinyShape};
use specrs_models::{Alibi, Architecture, DecoderConfig, ModelDType, load_causal_lm};

const SHAPE: TinyShape =
    TinyShape { vocab: 40, hidden: 32, layers: 2, heads: 4, kv_heads: 4, head_dim: 8, intermediate: 48 };

fn alibi_reference(tensors: &HashMap<String, Tensor>, s: TinyShape) -> Reference<'_> {
    Reference {
        rope_layers: Some(vec![false; s.layers]),
        alibi: Some(AlibiLayout { slopes: bloom_alibi_slopes(s.heads), before_scaling: false }),
        ..Reference::plain(tensors, s)
    }
}

fn ids() -> Vec<u32> {
    (0..11).map(|i| (i * 7 + 5) % 40).collect()
}

fn load(
    dir: &std::path::Path,
    s: &TinyShape,
    class: &str,
    tensors: &HashMap<String, Tensor>,
) -> specrs_models::CausalLm {
    let on_disk = testing::as_baichuan(tensors, s).unwrap();
    testing::write_checkpoint(dir, &testing::baichuan_config(s, class), &on_disk).unwrap();
    load_causal_lm(dir, &Device::Cpu, ModelDType::F32).unwrap().0
}

#[test]
fn baichuan_7b_turns_rope_and_the_13b_models_add_alibi_as_transformers_does() {
    let tensors = testing::random_target(Architecture::Llama, &SHAPE, false, 931).unwrap();
    let (rope_dir, alibi_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let rope = load(rope_dir.path(), &SHAPE, "BaiChuanForCausalLM", &tensors);
    assert_eq!((rope.config().architecture, rope.config().alibi), (Architecture::Baichuan, None));
    let want = Reference::plain(&tensors, SHAPE).logits(&ids());
    assert_close(&logits(&rope, &ids(), false), &want, "Baichuan-7B");
    assert_close(&logits(&rope, &ids(), true), &want, "Baichuan-7B token by token");
    let alibi = load(alibi_dir.path(), &SHAPE, "BaichuanForCausalLM", &tensors);
    let cfg = alibi.config();
    assert_eq!((cfg.alibi, cfg.max_position_embeddings), (Some(Alibi::BLOOM), 512));
    let want_alibi = alibi_reference(&tensors, SHAPE).logits(&ids());
    assert_close(&logits(&alibi, &ids(), false), &want_alibi, "Baichuan-13B");
    assert_close(&logits(&alibi, &ids(), true), &want_alibi, "Baichuan-13B token by token");
    assert!(max_gap(&want, &want_alibi) > 1e-3, "RoPE and ALiBi give other logits");
}

#[test]
fn baichuan_2_divides_each_lm_head_row_by_its_norm() {
    // Baichuan 2 is told apart by its vocabulary; a narrow model keeps the head small.
    let s = TinyShape {
        vocab: BAICHUAN2_VOCAB,
        hidden: 16,
        layers: 1,
        heads: 2,
        kv_heads: 2,
        head_dim: 8,
        intermediate: 24,
    };
    let dir = tempfile::tempdir().unwrap();
    let tensors = testing::random_target(Architecture::Llama, &s, false, 937).unwrap();
    let model = load(dir.path(), &s, "BaichuanForCausalLM", &tensors);
    assert!(model.config().lm_head_normalized);
    let head = &tensors["lm_head.weight"];
    let norms = head.sqr().unwrap().sum_keepdim(1).unwrap().sqrt().unwrap();
    let mut normed = tensors.clone();
    normed.insert("lm_head.weight".into(), head.broadcast_div(&norms).unwrap());
    let ids = [3u32, 90_000, 125_000, 17, 64_000];
    let want = alibi_reference(&normed, s).logits(&ids);
    assert_close(&logits(&model, &ids, false), &want, "Baichuan 2");
    let unnormed = alibi_reference(&tensors, s).logits(&ids);
    assert!(max_gap(&unnormed, &want) > 1e-3, "the NormHead changes the logits");
}

#[test]
fn the_config_tells_rope_from_alibi_as_baichuans_modeling_files_do() {
    let config = |class: &str, hidden: usize| {
        DecoderConfig::from_hf_json(&json!({
            "architectures": [class], "hidden_size": hidden, "intermediate_size": 64, "num_attention_heads": 4,
            "num_hidden_layers": 2, "vocab_size": 64_000, "rms_norm_eps": 1e-6, "max_position_embeddings": 4096,
        }))
        .unwrap()
    };
    // Baichuan 2 7B (4096 wide) turns RoPE under the 13B models' class name.
    assert_eq!(config("BaichuanForCausalLM", 4096).alibi, None);
    assert_eq!(config("BaiChuanForCausalLM", 5120).alibi, None);
    let thirteen = config("BaichuanForCausalLM", 5120);
    assert_eq!((thirteen.alibi, thirteen.num_key_value_heads), (Some(Alibi::BLOOM), 4));
    assert!(!thirteen.lm_head_normalized, "Baichuan 1's vocabulary: a plain head");
}

#[test]
fn the_baichuan_gguf_loads_to_the_same_model_with_rope_or_at_forty_layers_alibi() {
    for (layers, seed) in [(2, 941), (40, 947)] {
        let s = TinyShape { layers, hidden: 16, heads: 2, kv_heads: 2, head_dim: 8, intermediate: 24, ..SHAPE };
        let dir = tempfile::tempdir().unwrap();
        let tensors = testing::random_target(Architecture::Llama, &s, false, seed).unwrap();
        let path = dir.path().join("baichuan.gguf");
        write_llama_layout_gguf(&path, "baichuan", &s, &tensors, &[]);
        let (gguf, _) = load_causal_lm(&path, &Device::Cpu, ModelDType::F32).unwrap();
        let alibi = layers == 40;
        assert_eq!(gguf.config().alibi.is_some(), alibi, "{layers} layers");
        let want = if alibi { alibi_reference(&tensors, s) } else { Reference::plain(&tensors, s) }.logits(&ids());
        assert_close(&logits(&gguf, &ids(), false), &want, &format!("baichuan GGUF, {layers} layers"));
    }
}
