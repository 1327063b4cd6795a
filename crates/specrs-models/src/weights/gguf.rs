//! GGUF checkpoints (llama.cpp's format): metadata → [`DecoderConfig`], tensor names mapped to
//! Hugging Face names, and llama.cpp's q/k row permutation undone so every checkpoint runs the
//! same (Hugging Face, rotate-half) RoPE.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fs::File;
use std::io::BufReader;
use std::path::Path;
use std::sync::Mutex;

use candle_core::Device;
use candle_core::quantized::gguf_file::{Content, Value};
use candle_core::quantized::{GgmlDType, QStorage, QTensor};

use crate::config::{
    Alibi, Architecture, BAICHUAN2_VOCAB, DecoderConfig, GemmaConfig, Llama4Attention, MlaConfig, MoeConfig,
    QueryTemperature, RopeScaling, Router, Scales, SharedExpertConfig,
};
use crate::error::{ModelError, Result};
use crate::rope::half_rotation_rows;
use crate::weights::gguf_header;

pub struct GgufSource {
    content: Content,
    reader: Mutex<BufReader<File>>,
    description: String,
    architecture: Architecture,
    arch_key: String,
    /// Heads of q and k and the rotated dims of each: their rows are reordered from
    /// interleaved RoPE pairs to the rotate-half pairs the shared RoPE turns (llama.cpp's
    /// permutation of Llama-derived checkpoints undone; GLM's own interleaving).
    rope_rows: Option<RopeRows>,
}

/// Where a Hugging Face tensor lives in a GGUF file: a tensor name, and for one expert of a
/// mixture the expert's index along the first dim of the stacked `*_exps` tensor.
pub fn gguf_location(hf: &str) -> Option<(String, Option<usize>)> {
    if let Some(name) = gguf_name(hf) {
        return Some((name, None));
    }
    // model.layers.{l}.mlp.experts.{e}.{gate,up,down}_proj.weight -> blk.{l}.ffn_{..}_exps.weight[e]
    let rest = hf.strip_prefix("model.layers.")?;
    let (layer, tail) = rest.split_once(".mlp.experts.")?;
    let (expert, proj) = tail.split_once('.')?;
    let stacked = match proj {
        "gate_proj.weight" => "ffn_gate_exps.weight",
        "up_proj.weight" => "ffn_up_exps.weight",
        "down_proj.weight" => "ffn_down_exps.weight",
        _ => return None,
    };
    Some((format!("blk.{}.{stacked}", layer.parse::<usize>().ok()?), Some(expert.parse().ok()?)))
}

/// The norms around attention and MLP (Gemma 2 / 3, GLM-4-0414, OLMo 2 / 3) in a GGUF file,
/// under Gemma's Hugging Face names: `post_attention_layernorm` (over the attention's output)
/// is llama.cpp's `post_attention_norm`, `pre_feedforward_layernorm` its `ffn_norm`,
/// `post_feedforward_layernorm` its `post_ffw_norm`.
fn sandwich_norm_name(hf: &str) -> Option<String> {
    let rest = hf.strip_prefix("model.layers.")?;
    let (layer, tail) = rest.split_once('.')?;
    let mapped = match tail {
        "post_attention_layernorm.weight" => "post_attention_norm.weight",
        "pre_feedforward_layernorm.weight" => "ffn_norm.weight",
        "post_feedforward_layernorm.weight" => "post_ffw_norm.weight",
        _ => return None,
    };
    Some(format!("blk.{}.{mapped}", layer.parse::<usize>().ok()?))
}

/// The norm before the MLP under llama.cpp's `post_attention_norm` (Seed-OSS, GLM-4.5), where
/// other Llama-style families keep it as `ffn_norm`.
fn pre_mlp_norm_name(hf: &str) -> Option<String> {
    let layer = hf.strip_prefix("model.layers.")?.strip_suffix(".post_attention_layernorm.weight")?;
    Some(format!("blk.{}.post_attention_norm.weight", layer.parse::<usize>().ok()?))
}

/// Falcon-40B's norm before the MLP (`ln_mlp`, read as `post_attention_layernorm`) under
/// llama.cpp's `attn_norm_2`.
fn falcon_mlp_norm_name(hf: &str) -> Option<String> {
    let (layer, part) = hf.strip_prefix("model.layers.")?.split_once(".post_attention_layernorm.")?;
    Some(format!("blk.{}.attn_norm_2.{part}", layer.parse::<usize>().ok()?))
}

/// Maps a Hugging Face tensor name to its GGUF name (one expert of a mixture has none of its
/// own: see [`gguf_location`]).
pub fn gguf_name(hf: &str) -> Option<String> {
    let fixed = match hf {
        "model.embed_tokens.weight" => Some("token_embd.weight"),
        "model.embed_positions.weight" => Some("position_embd.weight"),
        "model.embed_norm.weight" => Some("token_embd_norm.weight"),
        "model.embed_norm.bias" => Some("token_embd_norm.bias"),
        "model.norm.weight" => Some("output_norm.weight"),
        "model.norm.bias" => Some("output_norm.bias"),
        "lm_head.bias" => Some("output.bias"),
        "lm_head.weight" => Some("output.weight"),
        _ => None,
    };
    if let Some(f) = fixed {
        return Some(f.to_string());
    }
    let rest = hf.strip_prefix("model.layers.")?;
    let (layer, tail) = rest.split_once('.')?;
    layer.parse::<usize>().ok()?;
    let mapped = match tail {
        "input_layernorm.weight" => "attn_norm.weight",
        "post_attention_layernorm.weight" => "ffn_norm.weight",
        // LayerNorms' biases (StarCoder2).
        "input_layernorm.bias" => "attn_norm.bias",
        "post_attention_layernorm.bias" => "ffn_norm.bias",
        "self_attn.qkv_proj.weight" => "attn_qkv.weight",
        "self_attn.qkv_proj.bias" => "attn_qkv.bias",
        "self_attn.q_proj.weight" => "attn_q.weight",
        "self_attn.k_proj.weight" => "attn_k.weight",
        "self_attn.v_proj.weight" => "attn_v.weight",
        "self_attn.o_proj.weight" => "attn_output.weight",
        "self_attn.q_proj.bias" => "attn_q.bias",
        "self_attn.k_proj.bias" => "attn_k.bias",
        "self_attn.v_proj.bias" => "attn_v.bias",
        "self_attn.o_proj.bias" => "attn_output.bias",
        "self_attn.q_norm.weight" => "attn_q_norm.weight",
        "self_attn.k_norm.weight" => "attn_k_norm.weight",
        "self_attn.q_norm.bias" => "attn_q_norm.bias",
        "self_attn.k_norm.bias" => "attn_k_norm.bias",
        // DeepSeek's latent attention; llama.cpp splits `kv_b_proj` into `k_b` and `v_b` in
        // files written since mid 2025 (`crate::models::deepseek` reads either).
        "self_attn.q_a_proj.weight" => "attn_q_a.weight",
        "self_attn.q_a_layernorm.weight" => "attn_q_a_norm.weight",
        "self_attn.q_b_proj.weight" => "attn_q_b.weight",
        "self_attn.kv_a_proj_with_mqa.weight" => "attn_kv_a_mqa.weight",
        "self_attn.kv_a_layernorm.weight" => "attn_kv_a_norm.weight",
        "self_attn.kv_b_proj.weight" => "attn_kv_b.weight",
        "self_attn.k_b_proj.weight" => "attn_k_b.weight",
        "self_attn.v_b_proj.weight" => "attn_v_b.weight",
        "mlp.gate_proj.weight" => "ffn_gate.weight",
        "mlp.up_proj.weight" => "ffn_up.weight",
        // Phi-3 keeps gate and up fused in `ffn_up` (gate rows first); only Phi-3 asks for it.
        "mlp.gate_up_proj.weight" => "ffn_up.weight",
        "mlp.down_proj.weight" => "ffn_down.weight",
        // A biased MLP (StarCoder2's `c_fc` / `c_proj`, Llama's `mlp_bias`).
        "mlp.gate_proj.bias" => "ffn_gate.bias",
        "mlp.up_proj.bias" => "ffn_up.bias",
        "mlp.down_proj.bias" => "ffn_down.bias",
        "mlp.gate.weight" => "ffn_gate_inp.weight",
        "mlp.gate.e_score_correction_bias" => "exp_probs_b.bias",
        "mlp.moe_statics.e_score_correction_bias" => "exp_probs_b.bias",
        "mlp.shared_expert.gate_proj.weight" => "ffn_gate_shexp.weight",
        "mlp.shared_expert.up_proj.weight" => "ffn_up_shexp.weight",
        "mlp.shared_expert.down_proj.weight" => "ffn_down_shexp.weight",
        "mlp.shared_expert_gate.weight" => "ffn_gate_inp_shexp.weight",
        // An ungated shared expert (DeepSeek's names; Granite MoE's shared MLP).
        "mlp.shared_experts.gate_proj.weight" => "ffn_gate_shexp.weight",
        "mlp.shared_experts.up_proj.weight" => "ffn_up_shexp.weight",
        "mlp.shared_experts.down_proj.weight" => "ffn_down_shexp.weight",
        // A DeepSeek-style MTP layer's own parts (GLM-4.5's `nextn` layers past the last).
        "eh_proj.weight" => "nextn.eh_proj.weight",
        "enorm.weight" => "nextn.enorm.weight",
        "hnorm.weight" => "nextn.hnorm.weight",
        "embed_tokens.weight" => "nextn.embed_tokens.weight",
        "shared_head.head.weight" => "nextn.shared_head_head.weight",
        "shared_head.norm.weight" => "nextn.shared_head_norm.weight",
        _ => return None,
    };
    Some(format!("blk.{layer}.{mapped}"))
}

impl GgufSource {
    pub fn open(path: &Path) -> Result<Self> {
        let file = File::open(path).map_err(|e| ModelError::file(path, e.to_string()))?;
        let mut reader = BufReader::new(file);
        gguf_header::check_alignment(gguf_header::declared_alignment(&mut reader))
            .map_err(|e| ModelError::file(path, e))?;
        let content =
            Content::read(&mut reader).map_err(|e| ModelError::file(path, format!("not a readable GGUF file: {e}")))?;
        let file_len = std::fs::metadata(path).map_err(|e| ModelError::file(path, e.to_string()))?.len();
        // Every tensor must lie inside the file: catch truncated downloads at open.
        for (name, info) in &content.tensor_infos {
            let elems = info.shape.elem_count();
            let bytes = (elems / info.ggml_dtype.block_size()) * info.ggml_dtype.type_size();
            let end = content.tensor_data_offset + info.offset + bytes as u64;
            if end > file_len {
                return Err(ModelError::file(
                    path,
                    format!(
                        "truncated GGUF file: tensor '{name}' ends at byte {end}, the file has {file_len}; download it again"
                    ),
                ));
            }
        }
        let arch_key = match content.metadata.get("general.architecture") {
            Some(Value::String(s)) => s.clone(),
            _ => {
                return Err(ModelError::file(path, "GGUF metadata lacks general.architecture"));
            }
        };
        let mut architecture = Architecture::from_gguf_name(&arch_key)?;
        // llama.cpp writes Mixtral as `llama` with experts, and OLMo 3 as `olmo2` with windows.
        if architecture == Architecture::Llama && content.metadata.contains_key("llama.expert_count") {
            architecture = Architecture::Mixtral;
        }
        if architecture == Architecture::Olmo2 && content.metadata.contains_key("olmo2.attention.sliding_window") {
            architecture = Architecture::Olmo3;
        }
        // DeepSeek-V2 and V3 (GLM-4.7-Flash too) are all `deepseek2`: V3 routes by sigmoid
        // scores (gating func 2; without the key, by the correction bias only V3's router has).
        if architecture == Architecture::DeepseekV3 {
            let sigmoid = match content.metadata.get("deepseek2.expert_gating_func").and_then(value_as_u64) {
                Some(gating) => gating == 2,
                None => content.tensor_infos.keys().any(|name| name.ends_with(".exp_probs_b.bias")),
            };
            if !sigmoid {
                architecture = Architecture::DeepseekV2;
            }
        }
        let mut src = Self {
            content,
            reader: Mutex::new(reader),
            description: path.display().to_string(),
            architecture,
            arch_key,
            rope_rows: None,
        };
        // llama.cpp's converter permutes q and k of every Llama-derived family into interleaved
        // pairs over the whole head; GLM's, Cohere's and Llama 4's checkpoints turn interleaved
        // pairs (over GLM's rotated part) already.
        if matches!(
            architecture,
            Architecture::Llama
                | Architecture::Arcee
                | Architecture::Baichuan
                | Architecture::Olmo
                | Architecture::Llama4
                | Architecture::Mixtral
                | Architecture::InternLm2
                | Architecture::Granite
                | Architecture::GraniteMoe
                | Architecture::SmolLm3
                | Architecture::Glm4
                | Architecture::Cohere
                | Architecture::Cohere2
        ) {
            let cfg = src.decoder_config()?;
            src.rope_rows = Some(RopeRows {
                q_heads: cfg.num_attention_heads,
                kv_heads: cfg.num_key_value_heads,
                head_dim: cfg.head_dim,
                rotary_dim: cfg.rotary_dim,
            });
        }
        Ok(src)
    }

    pub fn description(&self) -> &str {
        &self.description
    }

    pub fn metadata(&self) -> &HashMap<String, Value> {
        &self.content.metadata
    }

    /// Where this file keeps `hf_name`: [`gguf_location`], or for an expert of a file written
    /// before llama.cpp stacked them, its own `blk.{l}.ffn_{gate,up,down}.{e}.weight`.
    fn locate(&self, hf_name: &str) -> Option<(String, Option<usize>)> {
        let (g, expert) = match self.architecture {
            Architecture::Gemma2
            | Architecture::Gemma3
            | Architecture::Glm4
            | Architecture::Olmo2
            | Architecture::Olmo3
            | Architecture::Exaone4 => (sandwich_norm_name(hf_name).or_else(|| gguf_name(hf_name))?, None),
            Architecture::SeedOss | Architecture::Glm4Moe => match pre_mlp_norm_name(hf_name) {
                Some(name) => (name, None),
                None => gguf_location(hf_name)?,
            },
            Architecture::Falcon => (falcon_mlp_norm_name(hf_name).or_else(|| gguf_name(hf_name))?, None),
            _ => gguf_location(hf_name)?,
        };
        match (self.content.tensor_infos.get(&g), expert) {
            (Some(info), Some(e)) => info.shape.dims().first().is_some_and(|&n| e < n).then_some((g, expert)),
            (Some(_), None) => Some((g, None)),
            (None, Some(e)) => {
                let legacy = format!("{}.{e}.weight", g.strip_suffix("_exps.weight")?);
                self.content.tensor_infos.contains_key(&legacy).then_some((legacy, None))
            }
            (None, None) => None,
        }
    }

    pub fn contains(&self, hf_name: &str) -> bool {
        self.locate(hf_name).is_some() || self.metadata_scalar(hf_name).is_some()
    }

    /// Apertus's per-layer xIELU parameters (`model.layers.{l}.mlp.act_fn.{alpha_p, alpha_n,
    /// beta, eps}`), which llama.cpp's converter keeps as metadata, `xielu.{name}`: one value per
    /// layer, or one for every layer.
    fn metadata_scalar(&self, hf_name: &str) -> Option<f32> {
        let (layer, name) = hf_name.strip_prefix("model.layers.")?.split_once(".mlp.act_fn.")?;
        let value = self.content.metadata.get(&format!("xielu.{name}"))?;
        let value = match value {
            Value::Array(values) => values.get(layer.parse::<usize>().ok()?)?,
            one => one,
        };
        match value {
            Value::F32(x) => Some(*x),
            Value::F64(x) => Some(*x as f32),
            _ => None,
        }
    }

    /// A learned scalar the file keeps as metadata ([`Self::metadata_scalar`]).
    pub fn scalar(&self, hf_name: &str) -> Result<f32> {
        self.metadata_scalar(hf_name).ok_or_else(|| ModelError::MissingTensor {
            name: hf_name.to_string(),
            source_desc: self.description.clone(),
        })
    }

    pub fn stored_dtype(&self, hf_name: &str) -> Option<GgmlDType> {
        let (g, _) = self.locate(hf_name)?;
        self.content.tensor_infos.get(&g).map(|i| i.ggml_dtype)
    }

    fn meta(&self, key: &str) -> Option<&Value> {
        self.content.metadata.get(&format!("{}.{key}", self.arch_key))
    }

    fn meta_usize(&self, key: &str) -> Result<usize> {
        let v = self
            .meta(key)
            .ok_or_else(|| ModelError::config(format!("{}.{key}", self.arch_key), "missing from GGUF metadata"))?;
        let n = value_as_u64(v).map(|x| usize::try_from(x).unwrap_or(usize::MAX)).ok_or_else(|| {
            ModelError::config(format!("{}.{key}", self.arch_key), format!("expected an integer, got {v:?}"))
        })?;
        // The layer count sizes per-layer tables built while the metadata is read.
        match key {
            "block_count" => crate::config::check_layer_count(&format!("{}.{key}", self.arch_key), n),
            _ => Ok(n),
        }
    }

    fn meta_f64(&self, key: &str) -> Option<f64> {
        match self.meta(key)? {
            Value::F32(x) => Some(*x as f64),
            Value::F64(x) => Some(*x),
            _ => None,
        }
    }

    /// The decoder configuration stored in the metadata.
    pub fn decoder_config(&self) -> Result<DecoderConfig> {
        let hidden_size = self.meta_usize("embedding_length")?;
        let num_attention_heads = self.meta_usize("attention.head_count")?;
        let num_key_value_heads = self.meta_usize("attention.head_count_kv").unwrap_or(num_attention_heads);
        let phi3 = self.architecture == Architecture::Phi3;
        // Phi's, StableLM's and GLM's `rope.dimension_count` is the rotated part of a head, not
        // the head.
        let partial_rotary = matches!(
            self.architecture,
            Architecture::Phi3
                | Architecture::Phi
                | Architecture::StableLm
                | Architecture::Nemotron
                | Architecture::GptNeoX
                | Architecture::Glm4
                | Architecture::Glm4Moe
                | Architecture::ChatGlm
                | Architecture::MiniMaxM2
        );
        let mla = self.mla_config()?;
        let head_dim = match (mla, self.meta_usize("attention.key_length")) {
            (Some(m), _) => m.qk_rope_head_dim + m.kv_lora_rank,
            (None, Ok(d)) => d,
            (None, Err(_)) if partial_rotary => hidden_size / num_attention_heads.max(1),
            (None, Err(_)) => {
                self.meta_usize("rope.dimension_count").unwrap_or(hidden_size / num_attention_heads.max(1))
            }
        };
        let rotary_dim = match mla {
            Some(m) => m.qk_rope_head_dim,
            None if partial_rotary => self.meta_usize("rope.dimension_count").unwrap_or(head_dim),
            None => head_dim,
        };
        // Latent attention caches one entry per token (older files say one KV head per head).
        let num_key_value_heads = if mla.is_some() { 1 } else { num_key_value_heads };
        // GLM-4.5's count includes its MTP (`nextn`) layers past the last decoder layer.
        let num_hidden_layers =
            self.meta_usize("block_count")?.saturating_sub(self.meta_usize("nextn_predict_layers").unwrap_or(0));
        let cohere = matches!(self.architecture, Architecture::Cohere | Architecture::Cohere2);
        // LayerNorms with bias, their epsilon under `layer_norm_epsilon` as Cohere's.
        let layer_norms = self.architecture.has_layer_norms();
        // EXAONE 4.0 with a window: its pattern's sliding layers, the full ones without RoPE.
        let exaone4_window =
            self.meta_usize("attention.sliding_window").ok().filter(|_| self.architecture == Architecture::Exaone4);
        let exaone4_sliding = match exaone4_window {
            Some(_) => Some(self.sliding_pattern(num_hidden_layers)?),
            None => None,
        };
        // Command R7B: three sliding layers with RoPE to each full one without, as llama.cpp fixes.
        let cohere2_sliding: Option<Vec<bool>> = (self.architecture == Architecture::Cohere2)
            .then(|| (0..num_hidden_layers).map(|i| (i + 1) % 4 != 0).collect());
        let max_position_embeddings = self.meta_usize("context_length").unwrap_or(4096);
        let vocab_size = match self.meta_usize("vocab_size") {
            Ok(v) => v,
            Err(_) => match self.content.metadata.get("tokenizer.ggml.tokens") {
                Some(Value::Array(a)) => a.len(),
                _ => {
                    return Err(ModelError::config("vocab_size", "GGUF metadata has neither vocab_size nor tokens"));
                }
            },
        };
        let rope_scaling = if self.content.tensor_infos.contains_key("rope_factors_long.weight") {
            Some(self.long_rope(max_position_embeddings)?)
        } else if self.content.tensor_infos.contains_key("rope_freqs.weight") {
            let t = self.load_qtensor_raw("rope_freqs.weight", &Device::Cpu)?;
            Some(RopeScaling::FrequencyFactors(t.dequantize(&Device::Cpu)?.to_vec1::<f32>()?))
        } else {
            match self.content.metadata.get(&format!("{}.rope.scaling.type", self.arch_key)) {
                Some(Value::String(s)) if s == "linear" => {
                    Some(RopeScaling::Linear { factor: self.meta_f64("rope.scaling.factor").unwrap_or(1.0) })
                }
                Some(Value::String(s)) if s == "yarn" => Some(self.yarn(max_position_embeddings, mla.is_some())?),
                Some(Value::String(s)) if s != "none" => {
                    return Err(ModelError::config(
                        format!("{}.rope.scaling.type", self.arch_key),
                        format!("rope scaling '{s}' is not supported in GGUF files (supported: linear, yarn)"),
                    ));
                }
                _ => None,
            }
        };
        let token_id = |key: &str| self.content.metadata.get(key).and_then(value_as_u64).map(|x| x as u32);
        let gemma = self.gemma_config(hidden_size, num_attention_heads, head_dim)?;
        // Falcon's converter writes 4 × hidden whatever `ffn_hidden_size` says; the MLP's rows tell.
        let falcon_width = match self.architecture {
            Architecture::Falcon => self.content.tensor_infos.get("blk.0.ffn_up.weight").map(|i| i.shape.dims()[0]),
            _ => None,
        };
        let has = |name: &str| self.content.tensor_infos.contains_key(name);
        let mpt = self.architecture == Architecture::Mpt;
        if mpt && has("blk.0.attn_norm.bias") {
            return Err(ModelError::config(
                format!("{}.blk.0.attn_norm.bias", self.arch_key),
                "MPT with biased LayerNorms (no_bias: false) is not supported; released MPT checkpoints have none",
            ));
        }
        // BLOOM's slopes, or MPT's of `max_alibi_bias`; both added to the scaled scores.
        let alibi = match self.architecture {
            Architecture::Bloom => Some(Alibi::BLOOM),
            Architecture::Mpt => Some(Alibi {
                max_bias: self.meta_f64("attention.max_alibi_bias").unwrap_or(8.0),
                before_scaling: false,
            }),
            // llama.cpp tells Baichuan's 13B models (ALiBi) from its 7B ones (RoPE) by depth.
            Architecture::Baichuan if num_hidden_layers == 40 => Some(Alibi::BLOOM),
            _ => None,
        };
        let cfg = DecoderConfig {
            architecture: self.architecture,
            hidden_size,
            intermediate_size: match (falcon_width, self.meta_usize("feed_forward_length")) {
                (Some(width), _) => width,
                // Mixtures with no dense layer may leave the dense width out.
                (None, Err(_)) if self.meta("expert_count").is_some() => {
                    self.meta_usize("expert_feed_forward_length")?
                }
                (None, width) => width?,
            },
            num_hidden_layers,
            num_attention_heads,
            num_key_value_heads,
            head_dim,
            rotary_dim,
            vocab_size,
            rms_norm_eps: match cohere || layer_norms || mpt {
                true => self.meta_f64("attention.layer_norm_epsilon").unwrap_or(1e-5),
                false => self.meta_f64("attention.layer_norm_rms_epsilon").unwrap_or(1e-6),
            },
            rope_theta: self.meta_f64("rope.freq_base").unwrap_or(10_000.0),
            rope_scaling,
            max_position_embeddings,
            tie_word_embeddings: !self.content.tensor_infos.contains_key("output.weight"),
            attention_bias: self.content.tensor_infos.contains_key("blk.0.attn_q.bias")
                || self.content.tensor_infos.contains_key("blk.0.attn_qkv.bias"),
            qk_norm: self.content.tensor_infos.contains_key("blk.0.attn_q_norm.weight"),
            // GLM-4 keeps gate and up fused in `ffn_up`; its q, k and v apart; ChatGLM both fused.
            // GPT-NeoX, Falcon, StarCoder, GPT-2, BLOOM and MPT files, and Phi-2 files converted from
            // Microsoft's first layout, keep q, k and v fused in `attn_qkv` (all q rows, then k,
            // then v).
            fused_projections: matches!(
                self.architecture,
                Architecture::Phi3 | Architecture::Glm4 | Architecture::ChatGlm
            ) || (matches!(
                self.architecture,
                Architecture::Phi
                    | Architecture::GptNeoX
                    | Architecture::Falcon
                    | Architecture::GptBigCode
                    | Architecture::Gpt2
                    | Architecture::Bloom
                    | Architecture::Mpt
            ) && has("blk.0.attn_qkv.weight")),
            learned_positions: has("position_embd.weight"),
            alibi,
            embedding_norm: has("token_embd_norm.weight"),
            sliding_window: match (&gemma, self.architecture) {
                (Some((_, _, Some(_))), _) => Some(self.meta_usize("attention.sliding_window").unwrap_or(4096)),
                (Some((_, _, None)), _) => None,
                (None, Architecture::Olmo3 | Architecture::Cohere2) => {
                    Some(self.meta_usize("attention.sliding_window")?)
                }
                (None, Architecture::Exaone4) => exaone4_window,
                // StarCoder2's converter writes no window; a file that gives one is honoured.
                (None, _) => self
                    .meta_usize("attention.sliding_window")
                    .ok()
                    .filter(|_| phi3 || self.architecture == Architecture::Starcoder2),
            },
            sliding_layers: match &gemma {
                Some((_, _, layers)) => layers.clone(),
                None if self.architecture == Architecture::Olmo3 => Some(self.sliding_pattern(num_hidden_layers)?),
                None if exaone4_sliding.is_some() => exaone4_sliding.clone(),
                None => cohere2_sliding.clone(),
            },
            attention_output_bias: self.content.tensor_infos.contains_key("blk.0.attn_output.bias"),
            mlp_bias: self.content.tensor_infos.contains_key("blk.0.ffn_up.bias"),
            lm_head_bias: self.content.tensor_infos.contains_key("output.bias"),
            // llama.cpp keeps Baichuan 2's head as the checkpoint stores it; transformers
            // normalises its rows, and so does this reader.
            lm_head_normalized: self.architecture == Architecture::Baichuan && vocab_size == BAICHUAN2_VOCAB,
            // llama.cpp's converter stores Nemotron's LayerNorm1P as its scale.
            layer_norm_1p: false,
            clip_qkv: self.meta_f64("attention.clamp_kqv").filter(|c| *c > 0.0).map(|c| c as f32),
            // StableLM runs side by side where its file has no norm before the MLP.
            // llama.cpp runs every Falcon side by side.
            parallel_residual: cohere
                || matches!(self.architecture, Architecture::Phi | Architecture::Falcon)
                || (self.architecture == Architecture::GptNeoX
                    && !matches!(self.meta("use_parallel_residual"), Some(Value::Bool(false))))
                || (self.architecture == Architecture::StableLm
                    && !self.content.tensor_infos.contains_key("blk.0.ffn_norm.weight")),
            // Falcon-40B's `ln_mlp` is llama.cpp's `attn_norm_2`.
            parallel_mlp_norm: self.architecture == Architecture::GptNeoX
                || (self.architecture == Architecture::Falcon && has("blk.0.attn_norm_2.weight")),
            attention_sinks: false,
            // llama.cpp fixes SmolLM3's and Llama 4's step: every fourth layer attends without RoPE.
            rope_layers: match self.architecture {
                _ if has("position_embd.weight") || alibi.is_some() => Some(vec![false; num_hidden_layers]),
                Architecture::SmolLm3 | Architecture::Llama4 => {
                    Some((0..num_hidden_layers).map(|i| (i + 1) % 4 != 0).collect())
                }
                Architecture::Exaone4 => exaone4_sliding,
                _ => cohere2_sliding,
            },
            moe: self.moe_config()?,
            mla,
            scales: match (&gemma, mla) {
                (Some((_, scales, _)), _) => scales.clone(),
                (None, Some(m)) => self.deepseek_scales(&m),
                (None, None) if cohere => self.cohere_scales()?,
                (None, None) => self.granite_scales(head_dim)?,
            },
            gemma: gemma.map(|(g, _, _)| g),
            llama4: self.llama4_attention()?,
            bos_token_id: token_id("tokenizer.ggml.bos_token_id"),
            eos_token_ids: token_id("tokenizer.ggml.eos_token_id").into_iter().collect(),
        };
        let cfg = cfg.serve_context(None);
        cfg.check()?;
        Ok(cfg)
    }

    /// Llama 4's attention as llama.cpp fixes it for Scout and Maverick: chunks of 8192
    /// positions, the NoPE layers' temperature from position 8191 (`attn_scale` 0.1), and q/k
    /// norms unless the file has Maverick's 128 experts. A file that turns chunking off
    /// (`attention.sliding_window` 0, MobileLLM-R1) is refused.
    fn llama4_attention(&self) -> Result<Option<Llama4Attention>> {
        if self.architecture != Architecture::Llama4 {
            return Ok(None);
        }
        if self.meta_usize("attention.sliding_window").ok() == Some(0) {
            return Err(ModelError::config(
                format!("{}.attention.sliding_window", self.arch_key),
                "Llama 4 without chunked attention (0: MobileLLM-R1's layout) is not supported",
            ));
        }
        Ok(Some(Llama4Attention {
            attention_chunk_size: Some(8192),
            qk_l2_norm: self.meta_usize("expert_count").ok() != Some(128),
            query_temperature: Some(QueryTemperature { floor_scale: 8192.0, attn_scale: 0.1 }),
        }))
    }

    /// DeepSeek's latent attention dims. Files written since llama.cpp runs it absorbed give
    /// `key_length = kv_lora_rank + rope` and the expanded head's dims as `*_mla`; older ones
    /// give the expanded head's dims as `key_length` / `value_length`.
    fn mla_config(&self) -> Result<Option<MlaConfig>> {
        if !matches!(self.architecture, Architecture::DeepseekV2 | Architecture::DeepseekV3) {
            return Ok(None);
        }
        let rope = self.meta_usize("rope.dimension_count")?;
        let key = match self.meta_usize("attention.key_length_mla") {
            Ok(k) => k,
            Err(_) => self.meta_usize("attention.key_length")?,
        };
        let v_head_dim = match self.meta_usize("attention.value_length_mla") {
            Ok(v) => v,
            Err(_) => self.meta_usize("attention.value_length")?,
        };
        if key <= rope {
            return Err(ModelError::config(
                format!("{}.attention.key_length_mla", self.arch_key),
                format!("a {key}-wide head with {rope} rotated dims has no latent part"),
            ));
        }
        Ok(Some(MlaConfig {
            // 0 (or absent) is V2-Lite's single `attn_q`.
            q_lora_rank: self.meta_usize("attention.q_lora_rank").ok().filter(|&r| r > 0),
            kv_lora_rank: self.meta_usize("attention.kv_lora_rank")?,
            qk_nope_head_dim: key - rope,
            qk_rope_head_dim: rope,
            v_head_dim,
            // llama.cpp keeps DeepSeek's interleaved pairs (its `deepseek2` rope is GPT-J style).
            rope_interleave: true,
        }))
    }

    /// DeepSeek's score scale: the expanded head's `(nope + rope)^-0.5` times `mscale²` under
    /// YaRN, `mscale = 1 + yarn_log_multiplier · ln(factor)` (the file's multiplier is
    /// `0.1 · mscale_all_dim`), as llama.cpp's `deepseek2` graph scales them.
    fn deepseek_scales(&self, m: &MlaConfig) -> Scales {
        let factor = self.meta_f64("rope.scaling.factor").unwrap_or(1.0);
        let log_multiplier = self.meta_f64("rope.scaling.yarn_log_multiplier").unwrap_or(0.0);
        let yarn = matches!(self.meta("rope.scaling.type"), Some(Value::String(s)) if s == "yarn");
        let mscale = if yarn && factor > 1.0 { 1.0 + log_multiplier * factor.ln() } else { 1.0 };
        let head = (m.qk_nope_head_dim + m.qk_rope_head_dim) as f64;
        Scales { attention: Some(head.powf(-0.5) * mscale * mscale), ..Scales::default() }
    }

    /// Cohere's `logit_scale` on the logits.
    fn cohere_scales(&self) -> Result<Scales> {
        let key = format!("{}.logit_scale", self.arch_key);
        let scale =
            self.meta_f64("logit_scale").ok_or_else(|| ModelError::config(&key, "missing from GGUF metadata"))?;
        if !(scale.is_finite() && scale > 0.0) {
            return Err(ModelError::config(&key, format!("must be positive and finite, got {scale}")));
        }
        Ok(Scales { logits_divisor: 1.0 / scale, ..Scales::default() })
    }

    /// The sliding layers of OLMo 3 and EXAONE 4.0: `attention.sliding_window_pattern` (one
    /// flag per layer), else three sliding layers to each full one, as their converter writes
    /// by default.
    fn sliding_pattern(&self, layers: usize) -> Result<Vec<bool>> {
        let key = format!("{}.attention.sliding_window_pattern", self.arch_key);
        let pattern: Vec<bool> = match self.content.metadata.get(&key) {
            None => return Ok((0..layers).map(|i| (i + 1) % 4 != 0).collect()),
            Some(Value::Array(flags)) => flags
                .iter()
                .map(|f| match f {
                    Value::Bool(b) => Some(*b),
                    _ => None,
                })
                .collect::<Option<_>>()
                .ok_or_else(|| ModelError::config(&key, "expected an array of booleans"))?,
            Some(other) => {
                return Err(ModelError::config(&key, format!("expected an array of booleans, got {other:?}")));
            }
        };
        if pattern.len() != layers {
            return Err(ModelError::config(&key, format!("names {} layers, the model has {layers}", pattern.len())));
        }
        Ok(pattern)
    }

    /// Gemma 2 and 3 as llama.cpp reads them: Gemma 2 alternates sliding and full layers
    /// (sliding first) under one RoPE and soft-caps scores and logits by the `*_softcapping`
    /// keys; Gemma 3 runs five sliding layers (local RoPE at base 10,000) to each global one.
    /// Scores are scaled by `head_dim^-0.5` (`hidden / heads` for the 27B models, 46 layers in
    /// Gemma 2 and 62 in Gemma 3, as their `query_pre_attn_scalar` says); norms are stored as
    /// their scale.
    fn gemma_config(
        &self,
        hidden_size: usize,
        num_attention_heads: usize,
        head_dim: usize,
    ) -> Result<Option<GemmaParts>> {
        let gemma2 = match self.architecture {
            Architecture::Gemma2 => true,
            Architecture::Gemma3 => false,
            // Gemma: the norms as their scale and `sqrt(hidden)`, nothing sliding or capped.
            Architecture::Gemma => {
                let gemma = GemmaConfig {
                    local_rope_theta: self.meta_f64("rope.freq_base").unwrap_or(10_000.0),
                    norms_store_scale: true,
                };
                let scales = Scales {
                    embedding: (hidden_size as f64).sqrt(),
                    attention: Some((head_dim as f64).powf(-0.5)),
                    ..Scales::default()
                };
                return Ok(Some((gemma, scales, None)));
            }
            _ => return Ok(None),
        };
        let layers = self.meta_usize("block_count")?;
        let scalar =
            if layers == if gemma2 { 46 } else { 62 } { hidden_size / num_attention_heads.max(1) } else { head_dim };
        let pattern = if gemma2 { 2 } else { 6 };
        let sliding_layers = (0..layers).map(|i| !(i + 1).is_multiple_of(pattern)).collect();
        let gemma = GemmaConfig {
            local_rope_theta: if gemma2 { self.meta_f64("rope.freq_base").unwrap_or(10_000.0) } else { 10_000.0 },
            norms_store_scale: true,
        };
        let cap = |key: &str| self.meta_f64(key).filter(|_| gemma2);
        let scales = Scales {
            embedding: (hidden_size as f64).sqrt(),
            attention: Some((scalar as f64).powf(-0.5)),
            attention_softcap: cap("attn_logit_softcapping"),
            logits_softcap: cap("final_logit_softcapping"),
            ..Scales::default()
        };
        Ok(Some((gemma, scales, Some(sliding_layers))))
    }

    /// Granite's four constants, which llama.cpp's converter writes as `*_scale` keys; a key
    /// left out leaves its factor neutral (the scores at `head_dim^-0.5`).
    fn granite_scales(&self, head_dim: usize) -> Result<Scales> {
        if !matches!(self.architecture, Architecture::Granite | Architecture::GraniteMoe) {
            return Ok(Scales::default());
        }
        let scale = |key: &str| -> Result<Option<f64>> {
            match self.meta_f64(key) {
                Some(x) if x.is_finite() && x > 0.0 => Ok(Some(x)),
                Some(x) => Err(ModelError::config(
                    format!("{}.{key}", self.arch_key),
                    format!("must be positive and finite, got {x}"),
                )),
                None => Ok(None),
            }
        };
        Ok(Scales {
            embedding: scale("embedding_scale")?.unwrap_or(1.0),
            residual: scale("residual_scale")?.unwrap_or(1.0),
            attention: Some(scale("attention.scale")?.unwrap_or((head_dim as f64).powf(-0.5))),
            logits_divisor: scale("logit_scale")?.unwrap_or(1.0),
            ..Scales::default()
        })
    }

    /// The experts of a `qwen2moe` / `qwen3moe` / Mixtral / `granitemoe` file. llama.cpp runs
    /// every layer sparse and renormalises the top-k weights of all but Qwen2-MoE, as the
    /// released configs ask.
    fn moe_config(&self) -> Result<Option<MoeConfig>> {
        let experts = || -> Result<(usize, usize)> {
            Ok((self.meta_usize("expert_count")?, self.meta_usize("expert_used_count")?))
        };
        // A shared MLP added ungated (`ffn_*_shexp`), where the file gives it a width.
        let ungated_shared_mlp = || {
            self.meta_usize("expert_shared_feed_forward_length")
                .ok()
                .filter(|&w| w > 0)
                .map(|w| SharedExpertConfig { intermediate_size: w, gated: false })
        };
        // Experts as wide as `expert_feed_forward_length`, else as the dense MLP (configs
        // without a separate expert width).
        let expert_or_dense_width = || match self.meta_usize("expert_feed_forward_length") {
            Ok(w) => Ok(w),
            Err(_) => self.meta_usize("feed_forward_length"),
        };
        let moe = match self.architecture {
            Architecture::Qwen2Moe | Architecture::Qwen3Moe => {
                let (count, used) = experts()?;
                let width = self.meta_usize("expert_feed_forward_length")?;
                let mut moe =
                    MoeConfig::softmax_everywhere(count, used, width, self.architecture == Architecture::Qwen3Moe);
                if self.architecture == Architecture::Qwen2Moe {
                    moe.shared_expert = Some(SharedExpertConfig {
                        intermediate_size: self.meta_usize("expert_shared_feed_forward_length")?,
                        gated: true,
                    });
                }
                moe
            }
            Architecture::Mixtral => {
                let (count, used) = experts()?;
                MoeConfig::softmax_everywhere(count, used, self.meta_usize("feed_forward_length")?, true)
            }
            // Phi-3.5-MoE: sparsemixer over two experts, with the released jitter (the file
            // carries none).
            Architecture::PhiMoe => {
                let (count, used) = experts()?;
                if used != 2 {
                    return Err(ModelError::config(
                        format!("{}.expert_used_count", self.arch_key),
                        format!("Phi-3.5-MoE's sparsemixer routes each token to 2 experts, got {used}"),
                    ));
                }
                MoeConfig {
                    router: Router::SparseMixer { jitter_eps: 0.01 },
                    ..MoeConfig::softmax_everywhere(count, used, self.meta_usize("feed_forward_length")?, false)
                }
            }
            // ERNIE 4.5 MoE: softmax plus the correction bias, leading dense layers, shared
            // experts `expert_shared_count` experts wide.
            Architecture::Ernie4_5Moe => {
                let (count, used) = experts()?;
                let width = self.meta_usize("expert_feed_forward_length")?;
                MoeConfig {
                    router: Router::BiasedSoftmax,
                    first_k_dense_replace: self.meta_usize("leading_dense_block_count").unwrap_or(1),
                    decoder_sparse_step: self.meta_usize("interleave_moe_layer_step").unwrap_or(1).max(1),
                    shared_expert: match self.meta_usize("expert_shared_count").unwrap_or(0) {
                        0 => None,
                        n => Some(SharedExpertConfig { intermediate_size: n * width, gated: false }),
                    },
                    ..MoeConfig::softmax_everywhere(count, used, width, true)
                }
            }
            // Llama 4: the top-k by logit feeding their sigmoid-scaled input, a shared expert as
            // wide, in every `interleave_moe_layer_step`-th layer (the others dense).
            Architecture::Llama4 => {
                let (count, used) = experts()?;
                let width = self.meta_usize("expert_feed_forward_length")?;
                MoeConfig {
                    router: Router::InputScaledSigmoid,
                    decoder_sparse_step: self.meta_usize("interleave_moe_layer_step").unwrap_or(1).max(1),
                    shared_expert: Some(SharedExpertConfig { intermediate_size: width, gated: false }),
                    ..MoeConfig::softmax_everywhere(count, used, width, false)
                }
            }
            // HunYuan MoE: softmax, renormalised, and the shared MLP `ffn_*_shexp` added ungated.
            Architecture::HunYuanMoe => {
                let (count, used) = experts()?;
                MoeConfig {
                    shared_expert: ungated_shared_mlp(),
                    ..MoeConfig::softmax_everywhere(count, used, self.meta_usize("expert_feed_forward_length")?, true)
                }
            }
            // OLMoE: softmax over its experts, the routed weights as they are; the experts as
            // wide as `feed_forward_length` (its config has no separate expert width).
            Architecture::Olmoe => {
                let (count, used) = experts()?;
                let width = expert_or_dense_width()?;
                let norm = matches!(self.meta("expert_weights_norm"), Some(Value::Bool(true)));
                MoeConfig::softmax_everywhere(count, used, width, norm)
            }
            // Granite MoE: llama.cpp splits the stacked experts into `ffn_{gate,up,down}_exps`
            // and GraniteMoeShared's shared MLP into `ffn_*_shexp` (added ungated).
            Architecture::GraniteMoe => {
                let (count, used) = experts()?;
                MoeConfig {
                    shared_expert: ungated_shared_mlp(),
                    ..MoeConfig::softmax_everywhere(count, used, expert_or_dense_width()?, true)
                }
            }
            // DeepSeek: sigmoid scores with a correction bias (V3, GLM-4.5, MiniMax-M2) or softmax (V2),
            // within the best groups, a shared expert `expert_shared_count` experts wide, added
            // ungated.
            Architecture::DeepseekV2
            | Architecture::DeepseekV3
            | Architecture::Glm4Moe
            | Architecture::Dots1
            | Architecture::MiniMaxM2 => {
                let (count, used) = experts()?;
                let width = self.meta_usize("expert_feed_forward_length")?;
                let (n_group, topk_group) = (
                    self.meta_usize("expert_group_count").unwrap_or(1),
                    self.meta_usize("expert_group_used_count").unwrap_or(1),
                );
                let routed_scaling_factor = self.meta_f64("expert_weights_scale").unwrap_or(1.0);
                let router = match self.architecture {
                    Architecture::DeepseekV2 => Router::GroupedSoftmax { n_group, topk_group, routed_scaling_factor },
                    _ => Router::GroupedSigmoid { n_group, topk_group, routed_scaling_factor },
                };
                // llama.cpp renormalises MiniMax-M2's weights without saying so in the file.
                let norm = match self.meta("expert_weights_norm") {
                    Some(Value::Bool(norm)) => *norm,
                    _ => self.architecture == Architecture::MiniMaxM2,
                };
                MoeConfig {
                    router,
                    first_k_dense_replace: self.meta_usize("leading_dense_block_count").unwrap_or(0),
                    shared_expert: match self.meta_usize("expert_shared_count").unwrap_or(0) {
                        0 => None,
                        n => Some(SharedExpertConfig { intermediate_size: n * width, gated: false }),
                    },
                    ..MoeConfig::softmax_everywhere(count, used, width, norm)
                }
            }
            _ => return Ok(None),
        };
        Ok(Some(moe))
    }

    /// Reads expert `expert` of a stacked `[experts, rows, cols]` tensor: its bytes only, as
    /// the experts lie one after another in the file.
    fn load_expert_raw(&self, gguf: &str, expert: usize) -> Result<QTensor> {
        let info = &self.content.tensor_infos[gguf];
        let dims = info.shape.dims();
        let [experts, rows, cols] = dims else {
            return Err(ModelError::file(
                &self.description,
                format!("'{gguf}' is {dims:?}, expected [experts, rows, cols]"),
            ));
        };
        if expert >= *experts {
            return Err(ModelError::file(
                &self.description,
                format!("'{gguf}' holds {experts} experts, not expert {expert}"),
            ));
        }
        let dtype = info.ggml_dtype;
        let bytes = rows * cols / dtype.block_size() * dtype.type_size();
        let start = self.content.tensor_data_offset + info.offset + (expert * bytes) as u64;
        let mut data = vec![0u8; bytes];
        {
            use std::io::{Read, Seek, SeekFrom};
            let mut reader = self.reader.lock().map_err(|_| ModelError::Unsupported("GGUF reader poisoned".into()))?;
            reader.seek(SeekFrom::Start(start)).and_then(|_| reader.read_exact(&mut data)).map_err(|e| {
                ModelError::file(&self.description, format!("reading expert {expert} of '{gguf}': {e}"))
            })?;
        }
        let storage = QStorage::from_data(Cow::Owned(data), &Device::Cpu, dtype)?;
        Ok(QTensor::new(storage, (*rows, *cols))?)
    }

    /// YaRN as llama.cpp keeps it: the factor and pretrained context as metadata, cos/sin
    /// scaled by `attn_factor` (1 when absent) times YaRN's own `0.1·ln(factor) + 1`, as
    /// llama.cpp's rope scales them; DeepSeek's cos/sin unscaled (its graph cancels the
    /// magnitude, which its scores take instead: `deepseek_scales`).
    fn yarn(&self, max_position_embeddings: usize, deepseek: bool) -> Result<RopeScaling> {
        let factor = self.meta_f64("rope.scaling.factor").unwrap_or(1.0).max(1.0);
        let original = self.meta_usize("rope.scaling.original_context_length").unwrap_or(max_position_embeddings);
        let magnitude = if factor > 1.0 && !deepseek { 0.1 * factor.ln() + 1.0 } else { 1.0 };
        Ok(RopeScaling::Yarn {
            params: crate::config::Yarn {
                factor,
                original_max_position_embeddings: original as f64,
                beta_fast: self.meta_f64("rope.scaling.yarn_beta_fast").unwrap_or(32.0),
                beta_slow: self.meta_f64("rope.scaling.yarn_beta_slow").unwrap_or(1.0),
                truncate: true,
            },
            attention_factor: self.meta_f64("rope.scaling.attn_factor").unwrap_or(1.0) * magnitude,
        })
    }

    /// Phi-3's LongRoPE as llama.cpp's converter writes it: the factor sets as tensors, the
    /// pretrained window and the cos/sin scale as metadata (the scale computed as transformers
    /// does when absent).
    fn long_rope(&self, max_position_embeddings: usize) -> Result<RopeScaling> {
        let factors = |name: &str| -> Result<Vec<f32>> {
            Ok(self.load_qtensor_raw(name, &Device::Cpu)?.dequantize(&Device::Cpu)?.to_vec1::<f32>()?)
        };
        let window = self.meta_usize("rope.scaling.original_context_length").unwrap_or(max_position_embeddings);
        let scale = max_position_embeddings as f64 / window.max(1) as f64;
        let attention_factor = self
            .meta_f64("rope.scaling.attn_factor")
            .unwrap_or_else(|| if scale <= 1.0 { 1.0 } else { (1.0 + scale.ln() / (window as f64).ln()).sqrt() });
        Ok(RopeScaling::LongRope {
            short_factor: factors("rope_factors_short.weight")?,
            long_factor: factors("rope_factors_long.weight")?,
            original_max_position_embeddings: window,
            attention_factor,
            mscales: None,
            extended: false,
        })
    }

    fn load_qtensor_raw(&self, gguf: &str, device: &Device) -> Result<QTensor> {
        let mut reader = self.reader.lock().map_err(|_| ModelError::Unsupported("GGUF reader poisoned".into()))?;
        self.content
            .tensor(&mut *reader, gguf, device)
            .map_err(|e| ModelError::file(&self.description, format!("reading tensor '{gguf}': {e}")))
    }

    /// Loads a tensor by its Hugging Face name, in the checkpoint's storage format, with
    /// llama.cpp's q/k permutation undone.
    pub fn load_qtensor(&self, hf_name: &str, device: &Device) -> Result<QTensor> {
        let (gguf, expert) = self.locate(hf_name).ok_or_else(|| ModelError::MissingTensor {
            name: hf_name.to_string(),
            source_desc: self.description.clone(),
        })?;
        // Permute on the host, then move: row moves are byte copies.
        let t = match expert {
            Some(e) => self.load_expert_raw(&gguf, e)?,
            None => self.load_qtensor_raw(&gguf, &Device::Cpu)?,
        };
        // llama.cpp keeps Qwen2-MoE's shared-expert gate as a vector; transformers as [1, hidden].
        let t = match t.shape().dims() {
            [h] if hf_name.ends_with("shared_expert_gate.weight") => {
                let h = *h;
                let storage = QStorage::from_data(Cow::Owned(t.data()?.into_owned()), &Device::Cpu, t.dtype())?;
                QTensor::new(storage, (1, h))?
            }
            _ => t,
        };
        let heads = match &self.rope_rows {
            Some(r) if hf_name.ends_with("self_attn.q_proj.weight") || hf_name.ends_with("self_attn.q_proj.bias") => {
                Some((r.q_heads, r))
            }
            Some(r) if hf_name.ends_with("self_attn.k_proj.weight") || hf_name.ends_with("self_attn.k_proj.bias") => {
                Some((r.kv_heads, r))
            }
            _ => None,
        };
        let t = match heads {
            Some((heads, r)) => gather_rows(&t, &half_rotation_rows(heads, r.head_dim, r.rotary_dim))?,
            None => t,
        };
        if device.is_cpu() {
            Ok(t)
        } else {
            let data = t.data()?;
            let storage = QStorage::from_data(Cow::Borrowed(&data), device, t.dtype())?;
            Ok(QTensor::new(storage, t.shape().clone())?)
        }
    }
}

/// A Gemma file's layer configuration, its scales, and its sliding layers (none for Gemma 1).
type GemmaParts = (GemmaConfig, Scales, Option<Vec<bool>>);

fn value_as_u64(v: &Value) -> Option<u64> {
    match v {
        Value::U8(x) => Some(*x as u64),
        Value::U16(x) => Some(*x as u64),
        Value::U32(x) => Some(*x as u64),
        Value::U64(x) => Some(*x),
        Value::I8(x) if *x >= 0 => Some(*x as u64),
        Value::I16(x) if *x >= 0 => Some(*x as u64),
        Value::I32(x) if *x >= 0 => Some(*x as u64),
        Value::I64(x) if *x >= 0 => Some(*x as u64),
        _ => None,
    }
}

/// The shape [`GgufSource::rope_rows`] reorders q and k rows by.
#[derive(Debug, Clone, Copy)]
struct RopeRows {
    q_heads: usize,
    kv_heads: usize,
    head_dim: usize,
    rotary_dim: usize,
}

/// Row `i` of the result is row `rows[i]` of `t`. Rows are independently quantized, so a
/// reordering moves whole rows of blocks.
pub(crate) fn gather_rows(t: &QTensor, rows: &[u32]) -> Result<QTensor> {
    let dims = t.shape().dims().to_vec();
    if rows.len() != dims[0] || rows.iter().any(|&r| r as usize >= dims[0]) {
        return Err(ModelError::Unsupported(format!(
            "cannot reorder the rows of a {dims:?} tensor by a {}-row RoPE layout",
            rows.len()
        )));
    }
    let row_elems: usize = dims[1..].iter().product();
    let dtype = t.dtype();
    let row_bytes = row_elems / dtype.block_size() * dtype.type_size();
    let data = t.data()?;
    let out: Vec<u8> =
        rows.iter().flat_map(|&r| &data[r as usize * row_bytes..(r as usize + 1) * row_bytes]).copied().collect();
    let storage = QStorage::from_data(Cow::Owned(out), &Device::Cpu, dtype)?;
    Ok(QTensor::new(storage, dims)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Tensor;

    #[test]
    fn maps_hf_names_to_gguf() {
        assert_eq!(gguf_name("model.embed_tokens.weight").as_deref(), Some("token_embd.weight"));
        assert_eq!(gguf_name("model.layers.7.self_attn.k_proj.weight").as_deref(), Some("blk.7.attn_k.weight"));
        assert_eq!(gguf_name("model.layers.0.mlp.down_proj.weight").as_deref(), Some("blk.0.ffn_down.weight"));
        assert_eq!(gguf_name("model.layers.x.mlp.down_proj.weight"), None);
        assert_eq!(gguf_name("fc.weight"), None);
    }

    /// A llama GGUF holding only metadata and an embedding, with `extra` metadata.
    fn metadata_only(extra: &[(&str, Value)]) -> Result<DecoderConfig> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.gguf");
        let mut meta: Vec<(&str, Value)> = vec![
            ("general.architecture", Value::String("llama".into())),
            ("llama.embedding_length", Value::U32(8)),
            ("llama.feed_forward_length", Value::U32(16)),
            ("llama.block_count", Value::U32(1)),
            ("llama.attention.head_count", Value::U32(2)),
            ("llama.vocab_size", Value::U32(4)),
            ("llama.context_length", Value::U32(4096)),
            ("llama.rope.freq_base", Value::F32(10_000.0)),
        ];
        meta.extend(extra.iter().cloned());
        let embd =
            QTensor::quantize(&Tensor::zeros((4, 8), candle_core::DType::F32, &Device::Cpu).unwrap(), GgmlDType::F32)
                .unwrap();
        let meta: Vec<(&str, &Value)> = meta.iter().map(|(k, v)| (*k, v)).collect();
        candle_core::quantized::gguf_file::write(
            &mut std::fs::File::create(&path).unwrap(),
            &meta,
            &[("token_embd.weight", &embd)],
        )
        .unwrap();
        GgufSource::open(&path)?.decoder_config()
    }

    #[test]
    fn reads_yarn_and_refuses_unknown_rope_scaling_by_key() {
        let cfg = metadata_only(&[
            ("llama.rope.scaling.type", Value::String("yarn".into())),
            ("llama.rope.scaling.factor", Value::F32(4.0)),
            ("llama.rope.scaling.original_context_length", Value::U32(1024)),
        ])
        .unwrap();
        let Some(RopeScaling::Yarn { params, attention_factor }) = cfg.rope_scaling else { panic!("YaRN expected") };
        assert_eq!((params.factor, params.original_max_position_embeddings), (4.0, 1024.0));
        assert!((attention_factor - (0.1 * 4f64.ln() + 1.0)).abs() < 1e-9);
        assert!(
            metadata_only(&[("llama.rope.scaling.type", Value::String("none".into()))]).unwrap().rope_scaling.is_none()
        );
        let e =
            metadata_only(&[("llama.rope.scaling.type", Value::String("longrope2".into()))]).unwrap_err().to_string();
        assert!(e.contains("llama.rope.scaling.type") && e.contains("longrope2"), "{e}");
    }

    #[test]
    fn corrupt_sizes_are_refused_by_key_before_anything_is_allocated() {
        // candle would divide by this alignment; 2^30 layers or a 2^31-dim head would abort on
        // the allocation of per-layer or per-row tables.
        for (key, value, message) in [
            ("general.alignment", Value::U32(0), "general.alignment is 0"),
            ("general.alignment", Value::U32(48), "must be a power of two"),
            ("llama.block_count", Value::U32(1 << 30), "layers is past any real model"),
            ("llama.block_count", Value::U32(0), "at least one layer"),
            ("llama.rope.dimension_count", Value::U32(1 << 31), "head_dim must be even, positive and at most"),
            ("llama.rope.freq_base", Value::F32(-10_000.0), "RoPE base must be a positive number"),
            ("llama.attention.layer_norm_rms_epsilon", Value::F32(-1e-5), "epsilon must be a non-negative"),
        ] {
            let e = metadata_only(&[(key, value)]).unwrap_err().to_string();
            assert!(e.contains(message), "{key}: {e}");
        }
    }

    #[test]
    fn half_rotation_rows_undo_llama_cpp_permutation() {
        // Two heads of dim 4 over 2 input columns; llama.cpp's permute interleaves halves.
        let hf: Vec<f32> = (0..16).map(|x| x as f32).collect();
        let n_head = 2;
        let d = 4;
        let mut gguf = vec![0f32; 16];
        for h in 0..n_head {
            for i in 0..d / 2 {
                for j in 0..2 {
                    let hf_row = h * d + j * (d / 2) + i;
                    let gguf_row = h * d + 2 * i + j;
                    gguf[gguf_row * 2..gguf_row * 2 + 2].copy_from_slice(&hf[hf_row * 2..hf_row * 2 + 2]);
                }
            }
        }
        let t = QTensor::quantize(&Tensor::from_vec(gguf, (8, 2), &Device::Cpu).unwrap(), GgmlDType::F32).unwrap();
        let back = gather_rows(&t, &half_rotation_rows(n_head, d, d)).unwrap().dequantize(&Device::Cpu).unwrap();
        assert_eq!(back.flatten_all().unwrap().to_vec1::<f32>().unwrap(), hf);
    }
}
