//! Target model families and the loader that picks one from a checkpoint.

pub mod apertus;
pub mod arcee;
pub mod baichuan;
pub mod bloom;
pub mod chatglm;
pub mod cohere;
pub mod deepseek;
pub mod ernie4_5;
pub mod falcon;
pub mod gemma;
pub mod gemma2;
pub mod gemma3;
pub mod glm;
pub mod glm4;
pub mod glm4_moe;
pub mod gpt2;
pub mod gpt_bigcode;
pub mod gpt_neox;
pub mod gpt_oss;
pub mod granite;
pub mod hunyuan;
pub mod image_text;
pub mod internlm2;
pub mod llama;
pub mod llama4;
pub mod minimax_m2;
pub mod mixtral;
pub mod mpt;
pub mod nemotron;
pub mod olmo;
pub mod olmo2;
pub mod phi;
pub mod phi3;
pub mod phi_moe;
pub mod qwen2;
pub mod qwen3;
pub mod seed_oss;
pub mod smollm3;
pub mod stablelm;
pub mod starcoder2;
pub mod transformer;

use std::path::Path;

use candle_core::Device;

pub use transformer::{CausalLm, ForwardOutput};

use crate::config::{Architecture, DecoderConfig};
use crate::error::{ModelError, Result};
use crate::rope::half_rotation_rows;
use crate::weights::{Alias, Aliases, ModelDType, WeightSource, WeightStore};

/// Reads the decoder configuration of a checkpoint: GGUF metadata, or the `config.json` beside
/// (or inside) a safetensors checkpoint.
pub fn read_config(store: &WeightStore, path: &Path) -> Result<DecoderConfig> {
    match store.source() {
        WeightSource::Gguf(g) => {
            let cfg = g.decoder_config()?;
            // llama.cpp keeps DeepSeek's and ERNIE 4.5's interleaved RoPE rows as the checkpoint
            // has them (DeepSeek's MTP layers left out).
            match cfg.architecture {
                Architecture::DeepseekV2 | Architecture::DeepseekV3 => {
                    store.set_aliases(deepseek::aliases(&cfg, cfg.num_hidden_layers))?
                }
                Architecture::Ernie4_5 | Architecture::Ernie4_5Moe => store.set_aliases(ernie4_5::aliases(&cfg))?,
                Architecture::ChatGlm => store.set_aliases(chatglm::gguf_aliases(&cfg))?,
                _ => {}
            }
            Ok(cfg)
        }
        WeightSource::Safetensors(_) => {
            let dir = if path.is_dir() { path } else { path.parent().unwrap_or(Path::new(".")) };
            let cfg_path = dir.join("config.json");
            let text = std::fs::read_to_string(&cfg_path)
                .map_err(|e| ModelError::file(&cfg_path, format!("cannot read the model's config.json: {e}")))?;
            let json: serde_json::Value =
                serde_json::from_str(&text).map_err(|e| ModelError::file(&cfg_path, format!("invalid JSON: {e}")))?;
            // Image-text checkpoints (Gemma 3, Mistral Small 3.x): their text decoder. Granite 4.0:
            // the Granite class it runs as.
            let multimodal = image_text::text_config(&json).or_else(|| llama4::text_config(&json));
            let granite_hybrid = granite::hybrid_config(&json)?;
            let cfg = DecoderConfig::from_hf_json(granite_hybrid.as_ref().or(multimodal.as_ref()).unwrap_or(&json))?;
            // GPTQ and AWQ checkpoints store their linear layers packed.
            if let Some(format) = crate::weights::PackedIntFormat::from_hf(&json)? {
                store.set_packed_int_format(format)?;
            }
            match cfg.architecture {
                Architecture::Granite if granite_hybrid.is_some() => {
                    store.set_aliases(granite::shared_mlp_aliases(&cfg))?
                }
                Architecture::InternLm2 => store.set_aliases(internlm2::aliases(&cfg))?,
                Architecture::Apertus => store.set_aliases(apertus::aliases(&cfg))?,
                Architecture::Mixtral | Architecture::PhiMoe => store.set_aliases(mixtral::aliases(&cfg))?,
                Architecture::MiniMaxM2 => store.set_aliases(minimax_m2::aliases(&cfg))?,
                Architecture::HunYuanDense | Architecture::HunYuanMoe => store.set_aliases(hunyuan::aliases(&cfg))?,
                Architecture::Llama4 => store.set_aliases(llama4::aliases(store, &cfg))?,
                Architecture::Glm4 => store.set_aliases(glm4::aliases(&cfg))?,
                Architecture::Starcoder2 => store.set_aliases(starcoder2::aliases(&cfg))?,
                Architecture::Phi => store.set_aliases(phi::aliases(&cfg))?,
                Architecture::GptNeoX => store.set_aliases(gpt_neox::aliases(&cfg))?,
                Architecture::Falcon => store.set_aliases(falcon::aliases(&cfg))?,
                Architecture::GptBigCode => store.set_aliases(gpt_bigcode::aliases(&cfg))?,
                Architecture::Gpt2 => store.set_aliases(gpt2::aliases(store, &cfg))?,
                Architecture::Bloom => store.set_aliases(bloom::aliases(store, &cfg))?,
                Architecture::Mpt => store.set_aliases(mpt::aliases(&cfg))?,
                Architecture::Baichuan => store.set_aliases(baichuan::aliases(&cfg))?,
                Architecture::Glm => store.set_aliases(glm::aliases(&cfg))?,
                Architecture::ChatGlm => store.set_aliases(chatglm::aliases(&cfg))?,
                Architecture::GraniteMoe => store.set_aliases(granite::aliases(&cfg))?,
                Architecture::Cohere | Architecture::Cohere2 => store.set_aliases(interleaved_rope_aliases(&cfg))?,
                Architecture::Ernie4_5 | Architecture::Ernie4_5Moe => store.set_aliases(ernie4_5::aliases(&cfg))?,
                // The MTP layers past the last decoder layer attend the same way.
                Architecture::DeepseekV2 | Architecture::DeepseekV3 => {
                    let mtp = json.get("num_nextn_predict_layers").and_then(serde_json::Value::as_u64).unwrap_or(0);
                    store.set_aliases(deepseek::aliases(&cfg, cfg.num_hidden_layers + mtp as usize))?
                }
                _ if multimodal.is_some() => store.set_aliases(image_text::aliases(store))?,
                _ => {}
            }
            Ok(match cfg.architecture {
                Architecture::Llama => llama::adapt(cfg),
                Architecture::Qwen2 | Architecture::Qwen2Moe => qwen2::adapt(cfg),
                Architecture::SeedOss => seed_oss::adapt(cfg),
                Architecture::Qwen3 | Architecture::Qwen3Moe | Architecture::Dots1 => qwen3::adapt(cfg),
                Architecture::Phi3 => phi3::adapt(cfg),
                Architecture::Glm4Moe => glm4_moe::adapt(cfg),
                Architecture::InternLm2 => internlm2::adapt(cfg),
                Architecture::Mixtral => mixtral::adapt(cfg),
                Architecture::Gemma => gemma::adapt(cfg),
                Architecture::Nemotron => nemotron::adapt(cfg),
                Architecture::GptNeoX => gpt_neox::adapt(cfg),
                Architecture::Falcon => falcon::adapt(cfg),
                Architecture::GptBigCode => gpt_bigcode::adapt(cfg),
                Architecture::Gpt2 => gpt2::adapt(cfg),
                Architecture::Bloom => bloom::adapt(cfg),
                Architecture::Mpt => mpt::adapt(cfg),
                Architecture::Baichuan => baichuan::adapt(cfg),
                Architecture::Glm => glm::adapt(cfg),
                Architecture::ChatGlm => chatglm::adapt(cfg),
                Architecture::Gemma2 => gemma2::adapt(cfg),
                Architecture::Gemma3 => gemma3::adapt(cfg),
                Architecture::Granite | Architecture::GraniteMoe => granite::adapt(cfg),
                Architecture::GptOss => gpt_oss::adapt(cfg),
                Architecture::Glm4 => glm4::adapt(cfg),
                Architecture::Olmo2 | Architecture::Olmo3 | Architecture::Olmoe | Architecture::Exaone4 => {
                    olmo2::adapt(cfg)
                }
                Architecture::SmolLm3 => smollm3::adapt(cfg),
                Architecture::DeepseekV2 | Architecture::DeepseekV3 => deepseek::adapt(cfg),
                Architecture::Cohere | Architecture::Cohere2 => cohere::adapt(cfg),
                Architecture::Ernie4_5 | Architecture::Ernie4_5Moe => ernie4_5::adapt(cfg),
                Architecture::MiniMaxM2 => minimax_m2::adapt(cfg),
                Architecture::HunYuanDense | Architecture::HunYuanMoe => hunyuan::adapt(cfg),
                Architecture::Llama4 => llama4::adapt(cfg),
                Architecture::Arcee => arcee::adapt(cfg),
                Architecture::Apertus => apertus::adapt(cfg),
                Architecture::Starcoder2 => starcoder2::adapt(cfg),
                Architecture::StableLm => stablelm::adapt(cfg),
                Architecture::Phi => phi::adapt(cfg),
                Architecture::PhiMoe => phi_moe::adapt(cfg),
                Architecture::Olmo => olmo::adapt(cfg),
            })
        }
    }
}

/// Where a checkpoint whose RoPE turns interleaved pairs (Cohere and ERNIE 4.5 over the whole
/// head, GLM-4 over its rotated half) keeps each q and k row the shared layer asks for: each
/// head's rotated rows (weights and biases) evens first, then odds. One reordering of q and k
/// leaves the scores unchanged and turns the interleaved pairs into the rotate-half pairs the
/// shared RoPE turns.
pub(crate) fn interleaved_rope_aliases(cfg: &DecoderConfig) -> Aliases {
    let (d, r) = (cfg.head_dim, cfg.rotary_dim);
    let q_rows = half_rotation_rows(cfg.num_attention_heads, d, r);
    let k_rows = half_rotation_rows(cfg.num_key_value_heads, d, r);
    let mut table = Aliases::new();
    for i in 0..cfg.num_hidden_layers {
        for (proj, rows) in [("q_proj", &q_rows), ("k_proj", &k_rows)] {
            for part in ["weight", "bias"] {
                let name = format!("model.layers.{i}.self_attn.{proj}.{part}");
                table.insert(name.clone(), Alias::rows(name, rows.clone()));
            }
        }
    }
    table
}

/// Rows of a q/k/v projection stacked whole (all q rows, then k, then v) that hold `part` (0 q,
/// 1 k, 2 v), for `q_dim` query and `kv_dim` key/value rows: GPT-2's `c_attn`, MPT's `Wqkv`,
/// Baichuan's `W_pack`, ChatGLM's `query_key_value`.
pub(crate) fn stacked_qkv_rows(q_dim: usize, kv_dim: usize, part: usize) -> Vec<u32> {
    let (start, len) = match part {
        0 => (0, q_dim),
        1 => (q_dim, kv_dim),
        _ => (q_dim + kv_dim, kv_dim),
    };
    (start as u32..(start + len) as u32).collect()
}

/// Rows of a fused q/k/v projection that hold `part` (0 q, 1 k, 2 v) for `heads` query heads
/// of dim `d` in `kv_heads` groups, each group's query heads first, then its key head, then
/// its value head: Falcon's layout, multi-query (one group: all q, then k, then v) and the
/// per-head `[q, k, v]` of GPT-NeoX and GPT-BigCode (a group per head) alike.
pub(crate) fn grouped_qkv_rows(heads: usize, kv_heads: usize, d: usize, part: usize) -> Vec<u32> {
    let per_group = heads / kv_heads;
    let group_rows = (per_group + 2) * d;
    let (offset, len) = match part {
        0 => (0, per_group * d),
        1 => (per_group * d, d),
        _ => ((per_group + 1) * d, d),
    };
    (0..kv_heads).flat_map(|g| (g * group_rows + offset) as u32..(g * group_rows + offset + len) as u32).collect()
}

/// Reads layer `ours`'s q, k and v `part` (`weight` or `bias`) as rows of the fused
/// `{fused}.{part}`, grouped as [`grouped_qkv_rows`] says for `(heads, kv_heads, head_dim)`.
pub(crate) fn insert_grouped_qkv(
    table: &mut Aliases,
    ours: &str,
    fused: &str,
    part: &str,
    shape: (usize, usize, usize),
) {
    let (heads, kv_heads, d) = shape;
    for (j, proj) in ["q_proj", "k_proj", "v_proj"].into_iter().enumerate() {
        table.insert(
            format!("{ours}.self_attn.{proj}.{part}"),
            Alias::rows(format!("{fused}.{part}"), grouped_qkv_rows(heads, kv_heads, d, j)),
        );
    }
}

/// Opens a checkpoint (GGUF file, safetensors file or directory) and loads its decoder.
pub fn load_causal_lm(path: &Path, device: &Device, dtype: ModelDType) -> Result<(CausalLm, WeightStore)> {
    let store = WeightStore::open(path, device.clone(), dtype)?;
    let config = read_config(&store, path)?;
    let model = CausalLm::load(&store, config)?;
    Ok((model, store))
}

#[cfg(test)]
mod tests {
    use super::grouped_qkv_rows;

    #[test]
    fn grouped_rows_take_each_groups_queries_then_its_key_then_its_value() {
        // 4 query heads in 2 groups of head dim 1: rows q0 q1 k0 v0 | q2 q3 k1 v1.
        assert_eq!(grouped_qkv_rows(4, 2, 1, 0), [0, 1, 4, 5]);
        assert_eq!(grouped_qkv_rows(4, 2, 1, 1), [2, 6]);
        assert_eq!(grouped_qkv_rows(4, 2, 1, 2), [3, 7]);
        // Multi-query: all queries, then the one key, then the one value.
        assert_eq!(grouped_qkv_rows(3, 1, 2, 1), [6, 7]);
        // A group per head is the per-head q, k, v layout.
        assert_eq!(grouped_qkv_rows(2, 2, 1, 0), [0, 3]);
    }
}
