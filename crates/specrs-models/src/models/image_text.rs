//! The text decoder of an image-text checkpoint: Gemma 3's 4B-27B models
//! (`Gemma3ForConditionalGeneration`) and Mistral Small 3.1 / 3.2
//! (`Mistral3ForConditionalGeneration`) keep a text decoder spec-rs runs in `text_config`, its
//! weights under `language_model.model.*` and `language_model.lm_head.*` as released, or
//! `model.language_model.*` and `lm_head.*` as transformers 4.52 and later save them, beside a
//! vision tower and projector that stay unread. The config is rewritten as the text decoder's
//! ([`text_config`]) and the store reads the text names from where the checkpoint keeps them
//! ([`aliases`]).

use serde_json::Value;

use crate::weights::{Alias, Aliases, WeightSource, WeightStore};

/// Image-text classes and the class their text decoder reads as.
const DECODERS: &[(&str, &str)] = &[
    ("Gemma3ForConditionalGeneration", "Gemma3ForCausalLM"),
    ("Mistral3ForConditionalGeneration", "MistralForCausalLM"),
];

/// Where the text decoder's `model.*` tensors live, released layout first.
const PREFIXES: &[&str] = &["language_model.model.", "model.language_model."];

/// The text decoder's config of an image-text checkpoint (`text_config`, read as its text
/// class), or `None` for any other config.
pub fn text_config(json: &Value) -> Option<Value> {
    let class = json.pointer("/architectures/0").and_then(Value::as_str)?;
    let (_, text_class) = DECODERS.iter().find(|(c, _)| *c == class)?;
    let mut text = json.get("text_config").cloned().unwrap_or_else(|| Value::Object(Default::default()));
    text["architectures"] = serde_json::json!([text_class]);
    // The image-text config's own token ids (the ones generation stops at) come first.
    for key in ["bos_token_id", "eos_token_id"] {
        if let Some(v) = json.get(key) {
            text[key] = v.clone();
        }
    }
    Some(text)
}

/// The text decoder's names (`model.*`, `lm_head.weight`) mapped to where the checkpoint keeps
/// them; tensors of the vision tower and projector get no name and are never read.
pub fn aliases(store: &WeightStore) -> Aliases {
    let WeightSource::Safetensors(source) = store.source() else { return Aliases::new() };
    let renamed = |source: &str| Alias { source: source.to_string(), rows: None };
    let mut table = Aliases::new();
    for name in source.names() {
        if let Some(rest) = PREFIXES.iter().find_map(|p| name.strip_prefix(p)) {
            table.insert(format!("model.{rest}"), renamed(name));
        } else if name == "language_model.lm_head.weight" {
            table.insert("lm_head.weight".into(), renamed(name));
        }
    }
    table
}
