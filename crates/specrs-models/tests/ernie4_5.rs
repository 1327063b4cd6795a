//! ERNIE 4.5 dense (`Ernie4_5ForCausalLM`) on a tiny checkpoint: Llama's layer with RoPE over
//! interleaved pairs of the whole head, matching transformers' forward (`common::Reference`,
//! which turns the stored rows the interleaved way) in one prefill and token by token.

mod common;

use candle_core::Device;
use common::{Reference, assert_close, logits};
use serde_json::json;
use specrs_models::testing::{self, TinyShape};
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
