//! OLMo 2 (`Olmo2ForCausalLM`) on a tiny checkpoint written in its real layout: the attention's
//! and the MLP's outputs normed instead of their inputs, and q and k normed across all heads at
//! once, matching transformers' forward (`common::Reference`) in one prefill and token by token.

mod common;

use candle_core::Device;
use common::{Reference, assert_close, logits};
use specrs_models::config::NormPlacement;
use specrs_models::testing::{self, TinyShape};
use specrs_models::{Architecture, ModelDType, load_causal_lm};

const SHAPE: TinyShape =
    TinyShape { vocab: 40, hidden: 32, layers: 3, heads: 4, kv_heads: 2, head_dim: 8, intermediate: 48 };

#[test]
fn output_norms_and_whole_width_qk_norms_match_the_transformers_forward() {
    let dir = tempfile::tempdir().unwrap();
    let tensors = testing::random_olmo2(&SHAPE, 13).unwrap();
    testing::write_checkpoint(dir.path(), &testing::target_config(Architecture::Olmo2, &SHAPE, false), &tensors)
        .unwrap();
    let (model, _) = load_causal_lm(dir.path(), &Device::Cpu, ModelDType::F32).unwrap();
    let cfg = model.config();
    assert_eq!((cfg.architecture, cfg.norm_placement()), (Architecture::Olmo2, NormPlacement::Post));
    assert!(cfg.qk_norm && cfg.qk_norm_spans_heads());
    let reference = Reference {
        tensors: &tensors,
        shape: SHAPE,
        rotary: SHAPE.head_dim,
        factors: vec![1.0; SHAPE.head_dim / 2],
        magnitude: 1.0,
        window: None,
        routing: None,
        gemma: None,
        multipliers: None,
        gpt_oss: None,
        interleaved_rope: false,
        rope_layers: None,
    };
    let ids: Vec<u32> = (0..10).map(|i| (i * 11 + 5) % 40).collect();
    let want = reference.logits(&ids);
    assert_close(&logits(&model, &ids, false), &want, "one prefill");
    assert_close(&logits(&model, &ids, true), &want, "token by token");
}
