//! Mistral Small 3.1 / 3.2 (`Mistral3ForConditionalGeneration`): the text decoder of the
//! image-text checkpoint, stored as released (`language_model.model.*`,
//! `language_model.lm_head.weight`) or as transformers 4.52+ saves it
//! (`model.language_model.*`, `lm_head.weight`) beside a vision tower, computes what the same
//! weights compute as a plain Mistral checkpoint; its token ids come from the top level.

mod common;

use std::collections::HashMap;

use candle_core::{Device, Tensor};
use common::{assert_close, logits};
use serde_json::json;
use specrs_models::testing::{self, TinyShape};
use specrs_models::{Architecture, ModelDType, load_causal_lm};

const SHAPE: TinyShape =
    TinyShape { vocab: 40, hidden: 32, layers: 2, heads: 4, kv_heads: 2, head_dim: 8, intermediate: 48 };

#[test]
fn the_text_decoder_of_an_image_text_checkpoint_is_the_mistral_model() {
    let dir = tempfile::tempdir().unwrap();
    let tensors = testing::random_target(Architecture::Llama, &SHAPE, false, 23).unwrap();
    let mut text = testing::target_config(Architecture::Llama, &SHAPE, false);
    text["architectures"] = json!(["MistralForCausalLM"]);
    text["sliding_window"] = serde_json::Value::Null;
    testing::write_checkpoint(&dir.path().join("text"), &text, &tensors).unwrap();
    let (mistral, _) = load_causal_lm(&dir.path().join("text"), &Device::Cpu, ModelDType::F32).unwrap();
    let ids: Vec<u32> = (0..9).map(|i| (i * 5 + 1) % 40).collect();
    let want = logits(&mistral, &ids, false);
    let mut text_config = text.clone();
    let object = text_config.as_object_mut().unwrap();
    object.remove("architectures");
    object.insert("model_type".into(), json!("mistral"));
    let config = json!({
        "architectures": ["Mistral3ForConditionalGeneration"],
        "text_config": text_config,
        "vision_config": {"hidden_size": 16, "model_type": "pixtral"},
        "image_token_index": 10,
        "eos_token_id": [2, 39],
    });
    for (prefix, head) in [("language_model.model", "language_model.lm_head"), ("model.language_model", "lm_head")] {
        let mut stored: HashMap<String, Tensor> = tensors
            .iter()
            .map(|(name, t)| match name.strip_prefix("model.") {
                Some(rest) => (format!("{prefix}.{rest}"), t.clone()),
                None => (name.replace("lm_head", head), t.clone()),
            })
            .collect();
        stored.insert("vision_tower.patch_conv.weight".into(), testing::random_tensor(&[4, 4], 1.0, 1).unwrap());
        stored.insert("multi_modal_projector.linear_1.weight".into(), testing::random_tensor(&[4, 4], 1.0, 2).unwrap());
        let path = dir.path().join(prefix);
        testing::write_checkpoint(&path, &config, &stored).unwrap();
        let (model, _) = load_causal_lm(&path, &Device::Cpu, ModelDType::F32).unwrap();
        assert_eq!(model.config().architecture, Architecture::Llama);
        assert_eq!(model.config().eos_token_ids, vec![2, 39], "token ids from the top level");
        assert_close(&logits(&model, &ids, false), &want, prefix);
    }
}
