//! Llama 4's text decoder (`Llama4ForCausalLM`, and the decoder of the released image-text
//! `Llama4ForConditionalGeneration`: Scout 17B-16E, Maverick 17B-128E). Llama's pre-norm layer
//! with three differences, all configuration the shared layer reads
//! (`DecoderConfig::llama4`, `DecoderConfig::rope_layers`, `Router::InputScaledSigmoid`):
//!
//! - Attention alternates: three layers of four (`no_rope_layers` 1) turn q and k by RoPE over
//!   interleaved pairs (the rows reordered at load, [`aliases`]), norm each head without weights
//!   after it (`use_qk_norm`), and attend only within their `attention_chunk_size` positions;
//!   the fourth attends to the whole context without positions, its queries multiplied by a
//!   temperature that grows with `ln` of the position (`attn_temperature_tuning`).
//! - The mixture (`moe_layers`, every `interleave_moe_layer_step`-th layer) sends each token to
//!   its top-k experts by logit, scaling the token going in by `sigmoid(logit)`, and adds an
//!   ungated shared expert; the other layers keep a dense MLP `intermediate_size_mlp` wide.
//! - Weights: `feed_forward.*` for the MLP (`router`, `shared_expert`, the experts stored fused
//!   as right-hand matrices `experts.gate_up_proj [E, H, 2I]` and `experts.down_proj [E, I, H]`),
//!   under `language_model.model.*` in the image-text checkpoints beside a vision tower that
//!   stays unread.

use serde_json::Value;

use crate::config::DecoderConfig;
use crate::rope::half_rotation_rows;
use crate::weights::{Alias, Aliases, WeightSource, WeightStore};

/// Where a checkpoint keeps the text decoder's `model.*` tensors: the image-text layout as
/// released, as transformers 4.52 and later save it, or the text class's own.
const PREFIXES: &[&str] = &["language_model.model.", "model.language_model.", "model."];

/// The text decoder's config of a `Llama4ForConditionalGeneration` (its `text_config`, read as
/// `Llama4ForCausalLM`), or `None` for any other config.
pub fn text_config(json: &Value) -> Option<Value> {
    if json.pointer("/architectures/0").and_then(Value::as_str) != Some("Llama4ForConditionalGeneration") {
        return None;
    }
    let mut text = json.get("text_config").cloned().unwrap_or_else(|| json.clone());
    text["architectures"] = serde_json::json!(["Llama4ForCausalLM"]);
    for key in ["bos_token_id", "eos_token_id", "tie_word_embeddings"] {
        if let Some(v) = json.get(key).filter(|_| text.get(key).is_none()) {
            text[key] = v.clone();
        }
    }
    Some(text)
}

pub fn adapt(cfg: DecoderConfig) -> DecoderConfig {
    cfg
}

/// The shared layer's name for a Llama 4 decoder tensor `rest` (relative to `model.`).
fn shared_name(rest: &str) -> String {
    let rest = rest
        .replace(".feed_forward.router.", ".mlp.gate.")
        .replace(".feed_forward.shared_expert.", ".mlp.shared_experts.")
        .replace(".feed_forward.", ".mlp.");
    format!("model.{rest}")
}

/// The shared layer's names mapped to where a Llama 4 checkpoint keeps them: `feed_forward`
/// renamed as the shared layer's `mlp`, the image-text prefixes stripped, and the q/k rows of
/// the RoPE layers reordered from interleaved pairs to halves (one reordering of both leaves
/// the scores, and the per-head norm after RoPE, unchanged).
pub fn aliases(store: &WeightStore, cfg: &DecoderConfig) -> Aliases {
    let WeightSource::Safetensors(source) = store.source() else { return Aliases::new() };
    let (d, r) = (cfg.head_dim, cfg.rotary_dim);
    let q_rows = half_rotation_rows(cfg.num_attention_heads, d, r);
    let k_rows = half_rotation_rows(cfg.num_key_value_heads, d, r);
    let rotating = |layer: usize| cfg.rope_layers.as_ref().is_none_or(|l| l.get(layer).copied().unwrap_or(true));
    let mut table = Aliases::new();
    for name in source.names() {
        let ours = match PREFIXES.iter().find_map(|p| name.strip_prefix(p)) {
            Some(rest) => shared_name(rest),
            None if name == "language_model.lm_head.weight" || name == "lm_head.weight" => "lm_head.weight".into(),
            None => continue,
        };
        let layer = ours.strip_prefix("model.layers.").and_then(|s| s.split('.').next()?.parse::<usize>().ok());
        let rows = match layer {
            Some(l) if rotating(l) && ours.ends_with(".self_attn.q_proj.weight") => Some(q_rows.clone()),
            Some(l) if rotating(l) && ours.ends_with(".self_attn.k_proj.weight") => Some(k_rows.clone()),
            _ => None,
        };
        table.insert(ours, Alias { source: name.to_string(), rows, transposed: false });
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn feed_forward_names_map_to_the_shared_layers_mlp() {
        assert_eq!(shared_name("layers.3.feed_forward.router.weight"), "model.layers.3.mlp.gate.weight");
        assert_eq!(
            shared_name("layers.0.feed_forward.shared_expert.down_proj.weight"),
            "model.layers.0.mlp.shared_experts.down_proj.weight"
        );
        assert_eq!(
            shared_name("layers.1.feed_forward.experts.gate_up_proj"),
            "model.layers.1.mlp.experts.gate_up_proj"
        );
        assert_eq!(shared_name("layers.2.feed_forward.gate_proj.weight"), "model.layers.2.mlp.gate_proj.weight");
        assert_eq!(shared_name("layers.2.self_attn.q_proj.weight"), "model.layers.2.self_attn.q_proj.weight");
        assert_eq!(shared_name("embed_tokens.weight"), "model.embed_tokens.weight");
    }

    #[test]
    fn the_image_text_config_reads_as_its_text_decoder() {
        let json = serde_json::json!({
            "architectures": ["Llama4ForConditionalGeneration"],
            "text_config": {"hidden_size": 8, "eos_token_id": [3, 4]},
            "vision_config": {"hidden_size": 16},
            "tie_word_embeddings": false,
        });
        let text = text_config(&json).unwrap();
        assert_eq!(text["architectures"][0], "Llama4ForCausalLM");
        assert_eq!(text["hidden_size"], 8);
        assert_eq!(text["eos_token_id"], serde_json::json!([3, 4]), "the text config's own ids stay");
        assert_eq!(text["tie_word_embeddings"], false);
        assert!(text_config(&serde_json::json!({"architectures": ["LlamaForCausalLM"]})).is_none());
    }
}
