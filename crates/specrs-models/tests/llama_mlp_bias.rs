//! Llama's `mlp_bias`: a Llama whose config sets it loads a bias on each of the MLP's three
//! projections and matches transformers' forward (`common::Reference`); a family whose class
//! ignores the key is refused when it sets it, naming the key.

mod common;

use candle_core::Device;
use common::{Reference, assert_close, logits};
use serde_json::json;
use specrs_models::testing::{self, TinyShape};
use specrs_models::{Architecture, DecoderConfig, ModelDType, load_causal_lm};

const SHAPE: TinyShape =
    TinyShape { vocab: 40, hidden: 32, layers: 2, heads: 4, kv_heads: 2, head_dim: 8, intermediate: 48 };

#[test]
fn a_llama_with_mlp_bias_adds_a_bias_to_each_mlp_projection() {
    let dir = tempfile::tempdir().unwrap();
    let mut tensors = testing::random_target(Architecture::Llama, &SHAPE, false, 41).unwrap();
    for i in 0..SHAPE.layers {
        for (proj, dim, seed) in [("gate_proj", 48, 1), ("up_proj", 48, 2), ("down_proj", 32, 3)] {
            let bias = testing::random_tensor(&[dim], 0.2, 500 + 10 * i as u64 + seed).unwrap();
            tensors.insert(format!("model.layers.{i}.mlp.{proj}.bias"), bias);
        }
    }
    let mut config = testing::target_config(Architecture::Llama, &SHAPE, false);
    config["mlp_bias"] = json!(true);
    testing::write_checkpoint(dir.path(), &config, &tensors).unwrap();
    let (model, _) = load_causal_lm(dir.path(), &Device::Cpu, ModelDType::F32).unwrap();
    assert!(model.config().mlp_bias);
    let ids: Vec<u32> = (0..8).map(|i| (i * 5 + 1) % 40).collect();
    let want = Reference::plain(&tensors, SHAPE).logits(&ids);
    assert_close(&logits(&model, &ids, false), &want, "one prefill");
    assert_close(&logits(&model, &ids, true), &want, "token by token");

    let mut qwen = testing::target_config(Architecture::Qwen3, &SHAPE, false);
    qwen["mlp_bias"] = json!(true);
    let e = DecoderConfig::from_hf_json(&qwen).unwrap_err().to_string();
    assert!(e.contains("mlp_bias") && e.contains("Qwen3ForCausalLM"), "{e}");
}
