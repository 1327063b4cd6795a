//! The text decoder of an image-text checkpoint: Gemma 3's 4B-27B models
//! (`Gemma3ForConditionalGeneration`), Mistral Small 3.1 / 3.2
//! (`Mistral3ForConditionalGeneration`), Qwen2-VL / Qwen2.5-VL (a Qwen2 decoder) and Qwen3-VL (a
//! Qwen3 decoder, or Qwen3-MoE with its experts fused: `crate::moe`) keep a text decoder spec-rs
//! runs in `text_config` (Qwen2-VL's at the top level), its weights under `language_model.model.*`
//! and `language_model.lm_head.*` as released, `model.language_model.*` and `lm_head.*` as
//! transformers 4.52 and later save them, or plain `model.*` (Qwen2-VL), beside a vision tower and
//! projector that stay unread. The config is rewritten as the text decoder's ([`text_config`]) and
//! the store reads the text names from where the checkpoint keeps them ([`aliases`]).
//!
//! Qwen's multimodal RoPE (`mrope_section`) turns each frequency band by one of a token's
//! temporal, height and width positions; a text token's three are its one position, so for
//! text the bands turn together as plain RoPE does.

use serde_json::Value;

use crate::weights::{Alias, Aliases, WeightSource, WeightStore};

/// Image-text classes and the class their text decoder reads as.
const DECODERS: &[(&str, &str)] = &[
    ("Gemma3ForConditionalGeneration", "Gemma3ForCausalLM"),
    ("Mistral3ForConditionalGeneration", "MistralForCausalLM"),
    ("Qwen2VLForConditionalGeneration", "Qwen2ForCausalLM"),
    ("Qwen2_5_VLForConditionalGeneration", "Qwen2ForCausalLM"),
    ("Qwen3VLForConditionalGeneration", "Qwen3ForCausalLM"),
    ("Qwen3VLMoeForConditionalGeneration", "Qwen3MoeForCausalLM"),
];

/// Where the text decoder's `model.*` tensors live, released layout first.
const PREFIXES: &[&str] = &["language_model.model.", "model.language_model."];

/// The text decoder's config of an image-text checkpoint (`text_config`, read as its text
/// class), or `None` for any other config.
pub fn text_config(json: &Value) -> Option<Value> {
    let class = json.pointer("/architectures/0").and_then(Value::as_str)?;
    let (_, text_class) = DECODERS.iter().find(|(c, _)| *c == class)?;
    // Qwen2-VL keeps its text decoder's keys at the top level.
    let mut text = json.get("text_config").cloned().unwrap_or_else(|| json.clone());
    text["architectures"] = serde_json::json!([text_class]);
    // The image-text config's own token ids (the ones generation stops at) come first.
    for key in ["bos_token_id", "eos_token_id"] {
        if let Some(v) = json.get(key) {
            text[key] = v.clone();
        }
    }
    // Qwen3-VL says whether its head is tied at the top level only.
    if text.get("tie_word_embeddings").is_none()
        && let Some(tie) = json.get("tie_word_embeddings")
    {
        text["tie_word_embeddings"] = tie.clone();
    }
    // M-RoPE over text positions is plain RoPE (see the module's notes).
    let mrope = |rs: &Value| {
        rs.get("mrope_section").is_some()
            && matches!(
                rs.get("rope_type").or_else(|| rs.get("type")).and_then(Value::as_str),
                None | Some("mrope" | "default")
            )
    };
    if text.get("rope_scaling").is_some_and(mrope) {
        text["rope_scaling"] = Value::Null;
    }
    Some(text)
}

/// The text decoder's names (`model.*`, `lm_head.weight`) mapped to where the checkpoint keeps
/// them; tensors of the vision tower and projector get no name and are never read.
pub fn aliases(store: &WeightStore) -> Aliases {
    let WeightSource::Safetensors(source) = store.source() else { return Aliases::new() };
    let mut table = Aliases::new();
    for name in source.names() {
        if let Some(rest) = PREFIXES.iter().find_map(|p| name.strip_prefix(p)) {
            table.insert(format!("model.{rest}"), Alias::renamed(name));
        } else if name == "language_model.lm_head.weight" {
            table.insert("lm_head.weight".into(), Alias::renamed(name));
        }
    }
    table
}
