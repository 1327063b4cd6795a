//! Qwen2-VL / Qwen2.5-VL and Qwen3-VL: the text decoder of the image-text checkpoint (a Qwen2
//! or Qwen3 decoder; Qwen2.5-VL's config at the top level and its weights under `model.*`,
//! Qwen3-VL's in `text_config` and under `model.language_model.*`, its head tied at the top
//! level; Qwen3-VL-MoE's experts fused as `[E, H, 2I]` / `[E, I, H]` right-hand matrices)
//! computes what the same weights compute as a plain Qwen checkpoint: the multimodal RoPE of a
//! text token is plain RoPE, and the vision tower is never read.

mod common;

use std::collections::HashMap;

use candle_core::{Device, Tensor};
use common::{assert_close, logits};
use serde_json::json;
use specrs_models::testing::{self, TinyShape};
use specrs_models::{Architecture, ModelDType, load_causal_lm};

const SHAPE: TinyShape =
    TinyShape { vocab: 40, hidden: 32, layers: 2, heads: 4, kv_heads: 2, head_dim: 8, intermediate: 48 };

fn ids() -> Vec<u32> {
    (0..9).map(|i| (i * 5 + 3) % 40).collect()
}

/// The logits of `tensors` as a plain checkpoint of `arch`.
fn plain_logits(
    dir: &std::path::Path,
    arch: Architecture,
    tensors: &HashMap<String, Tensor>,
    tie: bool,
) -> Vec<Vec<f32>> {
    testing::write_checkpoint(dir, &testing::target_config(arch, &SHAPE, tie), tensors).unwrap();
    let (model, _) = load_causal_lm(dir, &Device::Cpu, ModelDType::F32).unwrap();
    logits(&model, &ids(), false)
}

#[test]
fn qwen2_5_vl_is_its_qwen2_decoder_with_mrope_read_as_plain_rope() {
    let dir = tempfile::tempdir().unwrap();
    let tensors = testing::random_target(Architecture::Qwen2, &SHAPE, false, 31).unwrap();
    let want = plain_logits(&dir.path().join("qwen2"), Architecture::Qwen2, &tensors, false);
    let mut config = testing::target_config(Architecture::Qwen2, &SHAPE, false);
    config["architectures"] = json!(["Qwen2_5_VLForConditionalGeneration"]);
    config["model_type"] = json!("qwen2_5_vl");
    config["rope_scaling"] = json!({"type": "mrope", "mrope_section": [2, 1, 1]});
    config["vision_config"] = json!({"hidden_size": 16, "out_hidden_size": 32});
    let mut stored = tensors.clone();
    stored.insert("visual.patch_embed.proj.weight".into(), testing::random_tensor(&[4, 4], 1.0, 1).unwrap());
    let path = dir.path().join("qwen2.5-vl");
    testing::write_checkpoint(&path, &config, &stored).unwrap();
    let (model, _) = load_causal_lm(&path, &Device::Cpu, ModelDType::F32).unwrap();
    assert_eq!((model.config().architecture, model.config().rope_scaling.is_none()), (Architecture::Qwen2, true));
    assert_close(&logits(&model, &ids(), false), &want, "Qwen2.5-VL's text decoder");
}

#[test]
fn qwen3_vl_is_its_qwen3_decoder_under_language_model_with_its_head_tied_at_the_top() {
    let dir = tempfile::tempdir().unwrap();
    let tensors = testing::random_target(Architecture::Qwen3, &SHAPE, true, 37).unwrap();
    let want = plain_logits(&dir.path().join("qwen3"), Architecture::Qwen3, &tensors, true);
    let mut text = testing::target_config(Architecture::Qwen3, &SHAPE, true);
    let object = text.as_object_mut().unwrap();
    for key in ["architectures", "tie_word_embeddings"] {
        object.remove(key);
    }
    object.insert("model_type".into(), json!("qwen3_vl_text"));
    object.insert(
        "rope_scaling".into(),
        json!({"rope_type": "default", "mrope_section": [2, 1, 1], "mrope_interleaved": true}),
    );
    let config = json!({
        "architectures": ["Qwen3VLForConditionalGeneration"],
        "model_type": "qwen3_vl",
        "text_config": text,
        "vision_config": {"hidden_size": 16, "deepstack_visual_indexes": [0]},
        "tie_word_embeddings": true,
        "eos_token_id": 39,
    });
    let mut stored: HashMap<String, Tensor> =
        tensors.iter().map(|(name, t)| (name.replace("model.", "model.language_model."), t.clone())).collect();
    stored.insert("model.visual.patch_embed.proj.weight".into(), testing::random_tensor(&[4, 4], 1.0, 2).unwrap());
    let path = dir.path().join("qwen3-vl");
    testing::write_checkpoint(&path, &config, &stored).unwrap();
    let (model, _) = load_causal_lm(&path, &Device::Cpu, ModelDType::F32).unwrap();
    let cfg = model.config();
    assert_eq!(
        (cfg.architecture, cfg.tie_word_embeddings, cfg.rope_scaling.is_none()),
        (Architecture::Qwen3, true, true)
    );
    assert_close(&logits(&model, &ids(), false), &want, "Qwen3-VL's text decoder");
}

#[test]
fn qwen3_vl_moe_is_its_qwen3_moe_decoder_with_experts_fused_as_right_hand_matrices() {
    let dir = tempfile::tempdir().unwrap();
    let moe = testing::TinyMoe {
        experts: 4,
        top_k: 2,
        // hidden 32 = 2I: the down projection's shape tells the fused layout apart.
        expert_intermediate: 16,
        shared_intermediate: None,
        norm_topk_prob: true,
        dense_layers: vec![],
        groups: (1, 1, 1.0),
    };
    let tensors = testing::random_moe_target(Architecture::Qwen3Moe, &SHAPE, &moe, 41).unwrap();
    let plain = testing::moe_target_config(Architecture::Qwen3Moe, &SHAPE, &moe);
    testing::write_checkpoint(&dir.path().join("qwen3-moe"), &plain, &tensors).unwrap();
    let (qwen3_moe, _) = load_causal_lm(&dir.path().join("qwen3-moe"), &Device::Cpu, ModelDType::F32).unwrap();
    let want = logits(&qwen3_moe, &ids(), false);
    let mut text = plain.clone();
    text.as_object_mut().unwrap().remove("architectures");
    text["model_type"] = json!("qwen3_vl_moe_text");
    text["rope_scaling"] = json!({"rope_type": "default", "mrope_section": [2, 1, 1], "mrope_interleaved": true});
    let config = json!({
        "architectures": ["Qwen3VLMoeForConditionalGeneration"],
        "text_config": text,
        "vision_config": {"hidden_size": 16},
    });
    // Qwen3-VL-MoE's layout: per layer `experts.gate_up_proj [E, H, 2I]` (gate columns first)
    // and `experts.down_proj [E, I, H]`, all under `model.language_model`.
    let mut stored: HashMap<String, Tensor> = HashMap::new();
    for (name, t) in &tensors {
        if !name.contains(".experts.") {
            stored.insert(name.replace("model.", "model.language_model."), t.clone());
        }
    }
    for l in 0..SHAPE.layers {
        let p = format!("model.layers.{l}.mlp.experts");
        let each = |e: usize, proj: &str| tensors[&format!("{p}.{e}.{proj}.weight")].t().unwrap();
        let gate_up: Vec<Tensor> =
            (0..moe.experts).map(|e| Tensor::cat(&[each(e, "gate_proj"), each(e, "up_proj")], 1).unwrap()).collect();
        let down: Vec<Tensor> = (0..moe.experts).map(|e| each(e, "down_proj")).collect();
        let fused = format!("model.language_model.layers.{l}.mlp.experts");
        stored.insert(format!("{fused}.gate_up_proj"), Tensor::stack(&gate_up, 0).unwrap().contiguous().unwrap());
        stored.insert(format!("{fused}.down_proj"), Tensor::stack(&down, 0).unwrap().contiguous().unwrap());
    }
    let path = dir.path().join("qwen3-vl-moe");
    testing::write_checkpoint(&path, &config, &stored).unwrap();
    let (model, _) = load_causal_lm(&path, &Device::Cpu, ModelDType::F32).unwrap();
    assert_eq!(model.config().architecture, Architecture::Qwen3Moe);
    assert_close(&logits(&model, &ids(), false), &want, "Qwen3-VL-MoE's text decoder");
}
