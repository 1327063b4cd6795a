//! Runtime configuration of the Llama-family decoders (Llama, Qwen2, Qwen3), read from a
//! Hugging Face `config.json` or from GGUF metadata.

use serde_json::Value;

use crate::error::{ModelError, Result};

/// The decoder families spec-rs runs as targets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Architecture {
    /// Llama 2/3/3.1 (incl. llama3 rope scaling), SmolLM2, TinyLlama.
    Llama,
    /// Qwen2: bias on the q/k/v projections.
    Qwen2,
    /// Qwen3: per-head RMSNorm on queries and keys, no q/k/v bias.
    Qwen3,
}

impl Architecture {
    /// Hugging Face `architectures[0]` names accepted for each family.
    pub const HF_NAMES: &'static [(&'static str, Architecture)] = &[
        ("LlamaForCausalLM", Architecture::Llama),
        ("MistralForCausalLM", Architecture::Llama),
        ("Qwen2ForCausalLM", Architecture::Qwen2),
        ("MiMoForCausalLM", Architecture::Qwen2),
        ("Qwen3ForCausalLM", Architecture::Qwen3),
    ];

    /// GGUF `general.architecture` values accepted for each family.
    pub const GGUF_NAMES: &'static [(&'static str, Architecture)] =
        &[("llama", Architecture::Llama), ("qwen2", Architecture::Qwen2), ("qwen3", Architecture::Qwen3)];

    pub fn from_hf_name(name: &str) -> Result<Self> {
        Self::HF_NAMES.iter().find(|(n, _)| *n == name).map(|(_, a)| *a).ok_or_else(|| {
            ModelError::UnknownArchitecture {
                name: name.to_string(),
                supported: Self::HF_NAMES.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", "),
            }
        })
    }

    pub fn from_gguf_name(name: &str) -> Result<Self> {
        Self::GGUF_NAMES.iter().find(|(n, _)| *n == name).map(|(_, a)| *a).ok_or_else(|| {
            ModelError::UnknownArchitecture {
                name: name.to_string(),
                supported: Self::GGUF_NAMES.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", "),
            }
        })
    }

    /// The canonical Hugging Face class name.
    pub fn hf_name(self) -> &'static str {
        match self {
            Self::Llama => "LlamaForCausalLM",
            Self::Qwen2 => "Qwen2ForCausalLM",
            Self::Qwen3 => "Qwen3ForCausalLM",
        }
    }
}

/// Rotary-embedding frequency scaling.
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    /// Llama 3.1: long wavelengths divided by `factor`, short ones kept, smooth in between.
    Llama3 { factor: f64, low_freq_factor: f64, high_freq_factor: f64, original_max_position_embeddings: f64 },
    /// Positions divided by `factor`.
    Linear { factor: f64 },
    /// Explicit per-frequency divisors (GGUF `rope_freqs.weight`), length head_dim / 2.
    FrequencyFactors(Vec<f32>),
}

#[derive(Debug, Clone, PartialEq)]
pub struct DecoderConfig {
    pub architecture: Architecture,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub vocab_size: usize,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub rope_scaling: Option<RopeScaling>,
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    /// Bias on q/k/v projections (Qwen2, some Llama variants).
    pub attention_bias: bool,
    /// Per-head RMSNorm on q and k before RoPE (Qwen3).
    pub qk_norm: bool,
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
}

fn req_usize(v: &Value, key: &str) -> Result<usize> {
    v.get(key)
        .and_then(Value::as_u64)
        .map(|x| x as usize)
        .ok_or_else(|| ModelError::config(key, "missing or not a non-negative integer in config.json"))
}

fn opt_f64(v: &Value, key: &str) -> Option<f64> {
    v.get(key).and_then(Value::as_f64)
}

fn token_ids(v: Option<&Value>) -> Vec<u32> {
    match v {
        Some(Value::Number(n)) => n.as_u64().map(|x| vec![x as u32]).unwrap_or_default(),
        Some(Value::Array(a)) => a.iter().filter_map(Value::as_u64).map(|x| x as u32).collect(),
        _ => Vec::new(),
    }
}

impl DecoderConfig {
    /// Reads a Hugging Face `config.json` value. The family comes from `architectures[0]`.
    pub fn from_hf_json(v: &Value) -> Result<Self> {
        let arch_name = v
            .get("architectures")
            .and_then(Value::as_array)
            .and_then(|a| a.first())
            .and_then(Value::as_str)
            .ok_or_else(|| {
                ModelError::config("architectures", "config.json must list the model class in architectures[0]")
            })?;
        let architecture = Architecture::from_hf_name(arch_name)?;
        Self::from_hf_json_as(v, architecture)
    }

    /// Reads a Hugging Face config for a known family (drafters reuse target layer shapes).
    pub fn from_hf_json_as(v: &Value, architecture: Architecture) -> Result<Self> {
        let hidden_size = req_usize(v, "hidden_size")?;
        let num_attention_heads = req_usize(v, "num_attention_heads")?;
        let num_key_value_heads =
            v.get("num_key_value_heads").and_then(Value::as_u64).map_or(num_attention_heads, |x| x as usize);
        let head_dim =
            v.get("head_dim").and_then(Value::as_u64).map_or(hidden_size / num_attention_heads.max(1), |x| x as usize);
        let rope_scaling = match v.get("rope_scaling") {
            None | Some(Value::Null) => None,
            Some(rs) => {
                let kind = rs.get("rope_type").or_else(|| rs.get("type")).and_then(Value::as_str).unwrap_or("default");
                match kind {
                    "default" => None,
                    "llama3" => Some(RopeScaling::Llama3 {
                        factor: opt_f64(rs, "factor").unwrap_or(8.0),
                        low_freq_factor: opt_f64(rs, "low_freq_factor").unwrap_or(1.0),
                        high_freq_factor: opt_f64(rs, "high_freq_factor").unwrap_or(4.0),
                        original_max_position_embeddings: opt_f64(rs, "original_max_position_embeddings")
                            .unwrap_or(8192.0),
                    }),
                    "linear" => Some(RopeScaling::Linear { factor: opt_f64(rs, "factor").unwrap_or(1.0) }),
                    other => {
                        return Err(ModelError::config(
                            "rope_scaling",
                            format!("rope scaling type '{other}' is not supported (supported: llama3, linear)"),
                        ));
                    }
                }
            }
        };
        let cfg = Self {
            architecture,
            hidden_size,
            intermediate_size: req_usize(v, "intermediate_size")?,
            num_hidden_layers: req_usize(v, "num_hidden_layers")?,
            num_attention_heads,
            num_key_value_heads,
            head_dim,
            vocab_size: req_usize(v, "vocab_size")?,
            rms_norm_eps: opt_f64(v, "rms_norm_eps").unwrap_or(1e-6),
            rope_theta: opt_f64(v, "rope_theta").unwrap_or(10_000.0),
            rope_scaling,
            max_position_embeddings: v
                .get("max_position_embeddings")
                .and_then(Value::as_u64)
                .map_or(4096, |x| x as usize),
            tie_word_embeddings: v.get("tie_word_embeddings").and_then(Value::as_bool).unwrap_or(false),
            attention_bias: v
                .get("attention_bias")
                .and_then(Value::as_bool)
                .unwrap_or(architecture == Architecture::Qwen2),
            qk_norm: architecture == Architecture::Qwen3,
            bos_token_id: token_ids(v.get("bos_token_id")).first().copied(),
            eos_token_ids: token_ids(v.get("eos_token_id")),
        };
        cfg.check()?;
        Ok(cfg)
    }

    /// Shape invariants every loader relies on.
    pub fn check(&self) -> Result<()> {
        if self.num_attention_heads == 0 || self.num_key_value_heads == 0 {
            return Err(ModelError::config("num_attention_heads", "head counts must be positive"));
        }
        if !self.num_attention_heads.is_multiple_of(self.num_key_value_heads) {
            return Err(ModelError::config(
                "num_key_value_heads",
                format!(
                    "num_attention_heads ({}) must be a multiple of num_key_value_heads ({})",
                    self.num_attention_heads, self.num_key_value_heads
                ),
            ));
        }
        if self.head_dim == 0 || !self.head_dim.is_multiple_of(2) {
            return Err(ModelError::config(
                "head_dim",
                format!("head_dim must be even and positive, got {}", self.head_dim),
            ));
        }
        if self.hidden_size == 0 || self.vocab_size == 0 || self.intermediate_size == 0 {
            return Err(ModelError::config(
                "hidden_size",
                "hidden_size, intermediate_size and vocab_size must be positive",
            ));
        }
        Ok(())
    }

    /// Bytes of K and V one token occupies across all layers at `dtype_bytes` per element.
    pub fn kv_bytes_per_token(&self, dtype_bytes: usize) -> u64 {
        (2 * self.num_hidden_layers * self.num_key_value_heads * self.head_dim * dtype_bytes) as u64
    }

    /// Hugging Face `hidden_states` indices of the EAGLE-3 default taps {2, L/2, L-3}.
    pub fn default_eagle3_taps(&self) -> [usize; 3] {
        let l = self.num_hidden_layers;
        [2.min(l), l / 2, l.saturating_sub(3)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn smollm2() -> Value {
        json!({
            "architectures": ["LlamaForCausalLM"], "hidden_size": 576, "intermediate_size": 1536,
            "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
            "vocab_size": 49152, "rms_norm_eps": 1e-5, "rope_theta": 100000.0,
            "max_position_embeddings": 8192, "tie_word_embeddings": true,
            "bos_token_id": 1, "eos_token_id": 2
        })
    }

    #[test]
    fn reads_smollm2_shape() {
        let c = DecoderConfig::from_hf_json(&smollm2()).unwrap();
        assert_eq!(c.architecture, Architecture::Llama);
        assert_eq!((c.head_dim, c.num_key_value_heads), (64, 3));
        assert!(c.tie_word_embeddings && !c.attention_bias && !c.qk_norm);
        assert_eq!(c.eos_token_ids, vec![2]);
        assert_eq!(c.default_eagle3_taps(), [2, 15, 27]);
    }

    #[test]
    fn family_flags_follow_architecture() {
        let mut v = smollm2();
        v["architectures"] = json!(["Qwen2ForCausalLM"]);
        assert!(DecoderConfig::from_hf_json(&v).unwrap().attention_bias);
        v["architectures"] = json!(["Qwen3ForCausalLM"]);
        let q3 = DecoderConfig::from_hf_json(&v).unwrap();
        assert!(q3.qk_norm && !q3.attention_bias);
    }

    #[test]
    fn errors_name_the_key() {
        let mut v = smollm2();
        v["architectures"] = json!(["GPT2LMHeadModel"]);
        let e = DecoderConfig::from_hf_json(&v).unwrap_err().to_string();
        assert!(e.contains("GPT2LMHeadModel") && e.contains("LlamaForCausalLM"), "{e}");
        let mut v = smollm2();
        v.as_object_mut().unwrap().remove("intermediate_size");
        let e = DecoderConfig::from_hf_json(&v).unwrap_err().to_string();
        assert!(e.contains("intermediate_size"), "{e}");
        let mut v = smollm2();
        v["num_key_value_heads"] = json!(4);
        assert!(DecoderConfig::from_hf_json(&v).unwrap_err().to_string().contains("multiple"));
    }

    #[test]
    fn reads_llama3_rope_scaling() {
        let mut v = smollm2();
        v["rope_scaling"] = json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192});
        let c = DecoderConfig::from_hf_json(&v).unwrap();
        assert!(matches!(c.rope_scaling, Some(RopeScaling::Llama3 { factor, .. }) if factor == 8.0));
        v["rope_scaling"] = json!({"rope_type": "yarn", "factor": 4.0});
        assert!(DecoderConfig::from_hf_json(&v).unwrap_err().to_string().contains("yarn"));
    }
}
