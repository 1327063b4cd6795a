//! InternLM2 (`InternLM2ForCausalLM`) on a tiny checkpoint written in its real layout: a Llama
//! checkpoint renamed and with q/k/v fused per key-value group into `attention.wqkv` computes
//! exactly what the Llama checkpoint computes (so every row of the fused projection reaches
//! the head it belongs to), in f32 and quantized at load; an `internlm2` GGUF (q, k and v
//! split and permuted by llama.cpp's converter) computes the same; its configuration errors
//! name their key.

mod common;

use candle_core::Device;
use common::{assert_close, logits, write_llama_layout_gguf};
use serde_json::json;
use specrs_models::testing::{self, TinyShape};
use specrs_models::{Architecture, DecoderConfig, ModelDType, load_causal_lm};

/// Four query heads over two key-value heads: two query heads per group.
const SHAPE: TinyShape =
    TinyShape { vocab: 40, hidden: 32, layers: 2, heads: 4, kv_heads: 2, head_dim: 8, intermediate: 64 };

fn internlm2_config() -> serde_json::Value {
    let mut c = testing::target_config(Architecture::InternLm2, &SHAPE, false);
    c["bias"] = json!(false);
    // InternLM2.5's scaling, which changes nothing inside the context.
    c["rope_scaling"] = json!({"type": "dynamic", "factor": 2.0});
    c
}

#[test]
fn the_fused_grouped_wqkv_computes_what_the_llama_checkpoint_computes() {
    let dir = tempfile::tempdir().unwrap();
    let (llama_dir, intern_dir) = (dir.path().join("llama"), dir.path().join("internlm2"));
    let llama = testing::random_target(Architecture::Llama, &SHAPE, false, 3).unwrap();
    testing::write_checkpoint(&llama_dir, &testing::target_config(Architecture::Llama, &SHAPE, false), &llama).unwrap();
    testing::write_checkpoint(&intern_dir, &internlm2_config(), &testing::as_internlm2(llama, &SHAPE).unwrap())
        .unwrap();
    let ids: Vec<u32> = (0..10).map(|i| (i * 9 + 4) % 40).collect();
    for dtype in [ModelDType::F32, ModelDType::Q8_0] {
        let (intern, _) = load_causal_lm(&intern_dir, &Device::Cpu, dtype).unwrap();
        assert_eq!(intern.config().architecture, Architecture::InternLm2);
        let (llama, _) = load_causal_lm(&llama_dir, &Device::Cpu, dtype).unwrap();
        assert_close(&logits(&intern, &ids, false), &logits(&llama, &ids, false), &format!("{dtype:?} prefill"));
        assert_close(&logits(&intern, &ids, true), &logits(&llama, &ids, true), &format!("{dtype:?} token by token"));
    }
}

#[test]
fn a_missing_tensor_is_named_as_the_checkpoint_names_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut tensors =
        testing::as_internlm2(testing::random_target(Architecture::Llama, &SHAPE, false, 4).unwrap(), &SHAPE).unwrap();
    tensors.remove("model.layers.1.attention.wqkv.weight");
    testing::write_checkpoint(dir.path(), &internlm2_config(), &tensors).unwrap();
    let Err(e) = load_causal_lm(dir.path(), &Device::Cpu, ModelDType::F32) else { panic!("loaded without wqkv") };
    let e = e.to_string();
    assert!(e.contains("model.layers.1.attention.wqkv.weight"), "{e}");
}

#[test]
fn biased_projections_are_refused_by_name() {
    let mut c = internlm2_config();
    c["bias"] = json!(true);
    let e = DecoderConfig::from_hf_json(&c).unwrap_err().to_string();
    assert!(e.contains("bias") && e.contains("bias: false"), "{e}");
    c["bias"] = json!(false);
    assert!(DecoderConfig::from_hf_json(&c).unwrap().rope_scaling.is_none(), "dynamic NTK is plain RoPE in context");
}

#[test]
fn an_internlm2_gguf_computes_what_the_llama_checkpoint_computes() {
    let dir = tempfile::tempdir().unwrap();
    let llama = testing::random_target(Architecture::Llama, &SHAPE, false, 6).unwrap();
    testing::write_checkpoint(dir.path(), &testing::target_config(Architecture::Llama, &SHAPE, false), &llama).unwrap();
    let (want, _) = load_causal_lm(dir.path(), &Device::Cpu, ModelDType::F32).unwrap();
    let path = dir.path().join("internlm2.gguf");
    write_llama_layout_gguf(&path, "internlm2", &SHAPE, &llama, &[]);
    let (gguf, _) = load_causal_lm(&path, &Device::Cpu, ModelDType::F32).unwrap();
    assert_eq!(gguf.config().architecture, Architecture::InternLm2);
    let ids: Vec<u32> = (0..10).map(|i| (i * 9 + 4) % 40).collect();
    assert_close(&logits(&gguf, &ids, false), &logits(&want, &ids, false), "one prefill");
    assert_close(&logits(&gguf, &ids, true), &logits(&want, &ids, false), "token by token");
}
