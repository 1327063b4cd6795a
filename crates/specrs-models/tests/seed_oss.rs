//! Seed-OSS (`SeedOssForCausalLM`) on tiny checkpoints: q/k/v biases, and the o_proj bias only
//! where `attention_out_bias` says, matching transformers' forward (`common::Reference`, which
//! adds whatever biases the checkpoint holds) in one prefill and token by token; a `seed_oss`
//! GGUF (its pre-MLP norm as llama.cpp's `post_attention_norm`) loads to the same model.

mod common;

use candle_core::Device;
use common::{Reference, assert_close, logits, write_unpermuted_gguf};
use serde_json::json;
use specrs_models::testing::{self, TinyShape};
use specrs_models::{Architecture, DecoderConfig, ModelDType, load_causal_lm};

const SHAPE: TinyShape =
    TinyShape { vocab: 40, hidden: 32, layers: 3, heads: 4, kv_heads: 2, head_dim: 8, intermediate: 48 };

#[test]
fn qkv_and_output_biases_match_the_transformers_forward() {
    for out_bias in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let mut tensors = testing::random_target(Architecture::SeedOss, &SHAPE, false, 43).unwrap();
        if !out_bias {
            tensors.retain(|name, _| !name.ends_with("o_proj.bias"));
        }
        let mut config = testing::target_config(Architecture::SeedOss, &SHAPE, false);
        config["attention_out_bias"] = json!(out_bias);
        testing::write_checkpoint(dir.path(), &config, &tensors).unwrap();
        let (model, _) = load_causal_lm(dir.path(), &Device::Cpu, ModelDType::F32).unwrap();
        let cfg = model.config();
        assert_eq!((cfg.attention_bias, cfg.attention_output_bias), (true, out_bias));
        let ids: Vec<u32> = (0..10).map(|i| (i * 7 + 1) % 40).collect();
        let want = Reference::plain(&tensors, SHAPE).logits(&ids);
        assert_close(&logits(&model, &ids, false), &want, "one prefill");
        assert_close(&logits(&model, &ids, true), &want, "token by token");
    }
}

#[test]
fn biased_mlps_are_refused_by_key() {
    let mut config = testing::target_config(Architecture::SeedOss, &SHAPE, false);
    config["mlp_bias"] = json!(true);
    let e = DecoderConfig::from_hf_json(&config).unwrap_err().to_string();
    assert!(e.contains("mlp_bias"), "{e}");
}

#[test]
fn a_seed_oss_gguf_loads_to_the_same_model() {
    for out_bias in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let mut tensors = testing::random_target(Architecture::SeedOss, &SHAPE, false, 53).unwrap();
        if !out_bias {
            tensors.retain(|name, _| !name.ends_with("o_proj.bias"));
        }
        let mut config = testing::target_config(Architecture::SeedOss, &SHAPE, false);
        config["attention_out_bias"] = json!(out_bias);
        testing::write_checkpoint(dir.path(), &config, &tensors).unwrap();
        let (hf, _) = load_causal_lm(dir.path(), &Device::Cpu, ModelDType::F32).unwrap();
        let path = dir.path().join("seed-oss.gguf");
        write_unpermuted_gguf(&path, "seed_oss", &SHAPE, &tensors, false, &[]);
        let (gguf, _) = load_causal_lm(&path, &Device::Cpu, ModelDType::F32).unwrap();
        let cfg = gguf.config();
        assert_eq!(
            (cfg.architecture, cfg.attention_bias, cfg.attention_output_bias),
            (Architecture::SeedOss, true, out_bias)
        );
        let ids: Vec<u32> = (0..10).map(|i| (i * 3 + 4) % 40).collect();
        let want = logits(&hf, &ids, false);
        assert_close(&logits(&gguf, &ids, false), &want, "GGUF vs safetensors, one prefill");
        assert_close(&logits(&gguf, &ids, true), &want, "GGUF token by token");
    }
}
