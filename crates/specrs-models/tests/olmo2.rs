//! OLMo 2 (`Olmo2ForCausalLM`) on a tiny checkpoint written in its real layout: the attention's
//! and the MLP's outputs normed instead of their inputs, and q and k normed across all heads at
//! once, matching transformers' forward (`common::Reference`) in one prefill and token by token;
//! OLMo 3 (`Olmo3ForCausalLM`) too, its sliding layers within their window turning with the
//! unscaled RoPE while the full layers' is scaled.

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
    let reference = Reference::plain(&tensors, SHAPE);
    let ids: Vec<u32> = (0..10).map(|i| (i * 11 + 5) % 40).collect();
    let want = reference.logits(&ids);
    assert_close(&logits(&model, &ids, false), &want, "one prefill");
    assert_close(&logits(&model, &ids, true), &want, "token by token");
}

#[test]
fn olmo3_sliding_layers_turn_unscaled_within_their_window() {
    const WINDOW: usize = 3;
    let dir = tempfile::tempdir().unwrap();
    let shape = TinyShape { layers: 4, ..SHAPE };
    let tensors = testing::random_olmo2(&shape, 19).unwrap();
    let mut config = testing::target_config(Architecture::Olmo3, &shape, false);
    config["layer_types"] =
        serde_json::json!(["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"]);
    config["sliding_window"] = serde_json::json!(WINDOW);
    config["rope_scaling"] = serde_json::json!({"rope_type": "linear", "factor": 4.0});
    testing::write_checkpoint(dir.path(), &config, &tensors).unwrap();
    let (model, _) = load_causal_lm(dir.path(), &Device::Cpu, ModelDType::F32).unwrap();
    let cfg = model.config();
    assert_eq!((cfg.architecture, cfg.norm_placement()), (Architecture::Olmo3, NormPlacement::Post));
    assert_eq!((cfg.layered_window(), cfg.sliding_rope_theta()), (Some(WINDOW), Some(10_000.0)));
    let reference = |unscaled_sliding: bool| Reference {
        // Linear scaling: every frequency divided by the factor.
        factors: vec![4.0; SHAPE.head_dim / 2],
        window: Some(WINDOW),
        sliding: unscaled_sliding.then(|| vec![true, true, true, false]),
        ..Reference::plain(&tensors, shape)
    };
    let ids: Vec<u32> = (0..10).map(|i| (i * 11 + 5) % 40).collect();
    let want = reference(true).logits(&ids);
    assert_close(&logits(&model, &ids, false), &want, "one prefill");
    assert_close(&logits(&model, &ids, true), &want, "token by token");
    // Scaling every layer and windowing every layer gives other logits.
    let uniform = reference(false).logits(&ids);
    let gap = want.iter().flatten().zip(uniform.iter().flatten()).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    assert!(gap > 1e-2, "the per-layer windows and RoPE change the logits by only {gap}");
}
