//! ERNIE 4.5 dense (`Ernie4_5ForCausalLM`) on a tiny checkpoint: Llama's layer with RoPE over
//! interleaved pairs of the whole head, matching transformers' forward (`common::Reference`,
//! which turns the stored rows the interleaved way) in one prefill and token by token; an
//! `ernie4_5` GGUF (rows as the checkpoint has them, as llama.cpp's converter keeps them) loads
//! to the same model.

mod common;

use candle_core::Device;
use candle_core::quantized::{GgmlDType, QTensor};
use common::{Reference, assert_close, logits, write_gguf};
use serde_json::json;
use specrs_models::testing::{self, TinyShape};
use specrs_models::weights::gguf::gguf_name;
use specrs_models::{Architecture, DecoderConfig, ModelDType, load_causal_lm};

const SHAPE: TinyShape =
    TinyShape { vocab: 40, hidden: 32, layers: 3, heads: 4, kv_heads: 2, head_dim: 8, intermediate: 48 };

#[test]
fn interleaved_rope_over_the_whole_head_matches_the_transformers_forward() {
    let dir = tempfile::tempdir().unwrap();
    let tensors = testing::random_target(Architecture::Llama, &SHAPE, true, 47).unwrap();
    let mut config = testing::target_config(Architecture::Ernie4_5, &SHAPE, true);
    config["use_bias"] = json!(false);
    testing::write_checkpoint(dir.path(), &config, &tensors).unwrap();
    let (model, _) = load_causal_lm(dir.path(), &Device::Cpu, ModelDType::F32).unwrap();
    assert_eq!(model.config().architecture, Architecture::Ernie4_5);
    let reference = |interleaved_rope| Reference { interleaved_rope, ..Reference::plain(&tensors, SHAPE) };
    let ids: Vec<u32> = (0..10).map(|i| (i * 5 + 2) % 40).collect();
    let want = reference(true).logits(&ids);
    assert_close(&logits(&model, &ids, false), &want, "one prefill");
    assert_close(&logits(&model, &ids, true), &want, "token by token");
    let halves = reference(false).logits(&ids);
    let gap = want.iter().flatten().zip(halves.iter().flatten()).map(|(a, b)| (a - b).abs());
    assert!(gap.fold(0f32, f32::max) > 1e-2, "interleaved and half rotation agree");
    config["use_bias"] = json!(true);
    let e = DecoderConfig::from_hf_json(&config).unwrap_err().to_string();
    assert!(e.contains("use_bias"), "{e}");
}

#[test]
fn an_ernie4_5_gguf_loads_to_the_same_model() {
    let dir = tempfile::tempdir().unwrap();
    let tensors = testing::random_target(Architecture::Llama, &SHAPE, true, 59).unwrap();
    testing::write_checkpoint(dir.path(), &testing::target_config(Architecture::Ernie4_5, &SHAPE, true), &tensors)
        .unwrap();
    let (hf, _) = load_causal_lm(dir.path(), &Device::Cpu, ModelDType::F32).unwrap();
    let named: Vec<(String, QTensor)> = tensors
        .iter()
        .map(|(name, t)| (gguf_name(name).unwrap(), QTensor::quantize(t, GgmlDType::F32).unwrap()))
        .collect();
    let path = dir.path().join("ernie.gguf");
    write_gguf(&path, "ernie4_5", &SHAPE, &named, &[]);
    let (gguf, _) = load_causal_lm(&path, &Device::Cpu, ModelDType::F32).unwrap();
    assert_eq!((gguf.config().architecture, gguf.config().tie_word_embeddings), (Architecture::Ernie4_5, true));
    let ids: Vec<u32> = (0..10).map(|i| (i * 7 + 3) % 40).collect();
    let want = logits(&hf, &ids, false);
    assert_close(&logits(&gguf, &ids, false), &want, "GGUF vs safetensors, one prefill");
    assert_close(&logits(&gguf, &ids, true), &want, "GGUF token by token");
}
