//! Drafters that share the target's output head share what the target does to its logits
//! after `lm_head`: an EAGLE-1 draft over a Phi target (whose `lm_head` adds a bias) gives
//! logits that differ from the same draft over the same target with a zero bias by exactly
//! that bias, so the draft ranks tokens as the target does.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{Device, Tensor};
use specrs_models::drafters::SequentialDraftModel;
use specrs_models::drafters::eagle::EagleDraft;
use specrs_models::testing::{self, TinyShape};
use specrs_models::{ModelDType, load_causal_lm};

const SHAPE: TinyShape =
    TinyShape { vocab: 40, hidden: 40, layers: 2, heads: 4, kv_heads: 4, head_dim: 10, intermediate: 56 };

fn draft_logits(target_dir: &Path, head_dir: &Path, tensors: &HashMap<String, Tensor>) -> Vec<Vec<f32>> {
    testing::write_checkpoint(target_dir, &testing::phi_config(&SHAPE, 0.4, false), &testing::as_phi(tensors)).unwrap();
    let (target, _) = load_causal_lm(target_dir, &Device::Cpu, ModelDType::F32).unwrap();
    let draft = EagleDraft::load(head_dir, &target, &Device::Cpu, ModelDType::F32).unwrap();
    let tokens = [3u32, 17, 8, 25];
    let batch = testing::single_sequence_batch(&tokens, 0, 4, (0..tokens.len() as u32).collect());
    let kv = draft.new_kv_cache(4, 4).unwrap();
    let hidden = testing::random_tensor(&[tokens.len(), SHAPE.hidden], 0.5, 11).unwrap();
    let (_, logits) = draft.forward(&hidden, &batch, &kv).unwrap();
    logits.logits.to_vec2::<f32>().unwrap()
}

#[test]
fn an_eagle1_draft_over_a_phi_target_adds_the_targets_lm_head_bias() {
    let dir = tempfile::tempdir().unwrap();
    let head = dir.path().join("eagle1");
    let (c, t) = testing::eagle1_oracle(&SHAPE).unwrap();
    testing::write_checkpoint(&head, &c, &testing::randomized(t, 0.3, 13).unwrap()).unwrap();
    let tensors = testing::random_phi(&SHAPE, false, 17).unwrap();
    let bias = tensors["lm_head.bias"].to_vec1::<f32>().unwrap();
    let mut unbiased = tensors.clone();
    unbiased.insert("lm_head.bias".into(), Tensor::zeros(SHAPE.vocab, candle_core::DType::F32, &Device::Cpu).unwrap());
    let with = draft_logits(&dir.path().join("biased"), &head, &tensors);
    let without = draft_logits(&dir.path().join("unbiased"), &head, &unbiased);
    for (row_with, row_without) in with.iter().zip(&without) {
        for ((a, b), want) in row_with.iter().zip(row_without).zip(&bias) {
            assert!((a - b - want).abs() < 1e-4, "draft logits differ by {} where the bias is {want}", a - b);
        }
    }
    assert!(bias.iter().any(|b| b.abs() > 1e-3), "the fixture's bias is not zero");
}
