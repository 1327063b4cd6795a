//! `Gemma3ForCausalLM`: Gemma 3's text decoder (1B, and the language model of the larger
//! checkpoints stored on their own). The shared layer with Gemma's changes, all configured by
//! `DecoderConfig::gemma`: every RMSNorm scales by `1 + weight`; a layer normalises its input,
//! its attention's output (`post_attention_layernorm`), the MLP's input
//! (`pre_feedforward_layernorm`) and the MLP's output (`post_feedforward_layernorm`); q and k are
//! normed per head; scores are scaled by `query_pre_attn_scalar^-0.5`; the MLP is GeGLU (tanh
//! GELU); embeddings are multiplied by `sqrt(hidden)`; and five of every six layers
//! (`layer_types`) attend within `sliding_window` keys with RoPE at `rope_local_base_freq`,
//! the others to the whole context with the global RoPE (`rope_theta`, `rope_scaling`).
//! Soft caps on scores and logits (Gemma 2's) apply when a config sets them. Per-layer windows
//! and RoPE mean one fixed-shape step cannot serve every layer, so Gemma 3 declares no
//! device-graph capture.
//!
//! The 4B, 12B and 27B checkpoints are `Gemma3ForConditionalGeneration`: the same decoder in
//! `text_config`, its weights under `language_model.model.*` (or `model.language_model.*` as
//! newer transformers saves them) beside a vision tower. spec-rs runs their text decoder and
//! leaves the vision weights unread ([`text_config`], [`multimodal_aliases`]).
//!
//! GGUF `gemma3` files (llama.cpp's) name the norms `post_attention_norm`, `ffn_norm` and
//! `post_ffw_norm`, store each norm's scale (`1 + weight`) rather than its weight, and leave
//! the layer pattern (five sliding to one global), the local RoPE base (10,000) and the score
//! scale (`head_dim^-0.5`, `hidden / heads` for the 27B) to the reader, as llama.cpp does.

use serde_json::Value;

use crate::config::DecoderConfig;
use crate::weights::{Alias, Aliases, WeightStore};

/// The Hugging Face class of Gemma 3's image-text checkpoints.
pub const MULTIMODAL: &str = "Gemma3ForConditionalGeneration";

/// The text decoder's config of an image-text checkpoint (`text_config`, read as a
/// `Gemma3ForCausalLM`), or `None` for any other config.
pub fn text_config(json: &Value) -> Option<Value> {
    if json.pointer("/architectures/0").and_then(Value::as_str) != Some(MULTIMODAL) {
        return None;
    }
    let mut text = json.get("text_config").cloned().unwrap_or_else(|| Value::Object(Default::default()));
    text["architectures"] = serde_json::json!(["Gemma3ForCausalLM"]);
    // The image-text config's own token ids (the ones generation stops at) come first.
    for key in ["bos_token_id", "eos_token_id"] {
        if let Some(v) = json.get(key) {
            text[key] = v.clone();
        }
    }
    Some(text)
}

/// Where an image-text checkpoint keeps the decoder's tensors: `language_model.model.*`
/// (the released checkpoints) or `model.language_model.*` (transformers 4.52 and later).
pub fn multimodal_aliases(cfg: &DecoderConfig, store: &WeightStore) -> Aliases {
    let prefix = if store.contains("model.language_model.embed_tokens.weight") {
        "model.language_model"
    } else {
        "language_model.model"
    };
    let mut names = vec!["embed_tokens.weight".to_string(), "norm.weight".to_string()];
    for i in 0..cfg.num_hidden_layers {
        for t in [
            "input_layernorm",
            "post_attention_layernorm",
            "pre_feedforward_layernorm",
            "post_feedforward_layernorm",
            "self_attn.q_proj",
            "self_attn.k_proj",
            "self_attn.v_proj",
            "self_attn.o_proj",
            "self_attn.q_norm",
            "self_attn.k_norm",
            "mlp.gate_proj",
            "mlp.up_proj",
            "mlp.down_proj",
        ] {
            names.push(format!("layers.{i}.{t}.weight"));
        }
    }
    names.into_iter().map(|n| (format!("model.{n}"), Alias { source: format!("{prefix}.{n}"), rows: None })).collect()
}

/// Gemma 3 needs nothing beyond what its configuration reader sets.
pub fn adapt(cfg: DecoderConfig) -> DecoderConfig {
    cfg
}
