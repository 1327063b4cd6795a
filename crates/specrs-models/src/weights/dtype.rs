//! Which numeric format weights take on the device.

use std::fmt;
use std::str::FromStr;

use candle_core::quantized::GgmlDType;
use candle_core::{DType, Device};

use crate::error::{ModelError, Result};

/// The user-facing weight dtype (`LLM(dtype=...)`, `--dtype`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize)]
pub enum ModelDType {
    /// The best for the device and checkpoint: on CPU, f32 for float checkpoints and the GGUF's
    /// own quantization where candle has fast kernels for it (others requantized to q8_0);
    /// on CUDA, bf16 for float checkpoints.
    #[default]
    #[serde(rename = "auto")]
    Auto,
    #[serde(rename = "f32")]
    F32,
    #[serde(rename = "f16")]
    F16,
    #[serde(rename = "bf16")]
    BF16,
    #[serde(rename = "q8_0")]
    Q8_0,
    #[serde(rename = "q4_0")]
    Q4_0,
    #[serde(rename = "q4_1")]
    Q4_1,
    #[serde(rename = "q4k")]
    Q4K,
    #[serde(rename = "q6k")]
    Q6K,
}

impl ModelDType {
    pub const NAMES: &'static [&'static str] = &["auto", "f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q4k", "q6k"];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::F32 => "f32",
            Self::F16 => "f16",
            Self::BF16 => "bf16",
            Self::Q8_0 => "q8_0",
            Self::Q4_0 => "q4_0",
            Self::Q4_1 => "q4_1",
            Self::Q4K => "q4k",
            Self::Q6K => "q6k",
        }
    }

    /// The quantized format, for the quantized dtypes.
    pub fn ggml(self) -> Option<GgmlDType> {
        match self {
            Self::Q8_0 => Some(GgmlDType::Q8_0),
            Self::Q4_0 => Some(GgmlDType::Q4_0),
            Self::Q4_1 => Some(GgmlDType::Q4_1),
            Self::Q4K => Some(GgmlDType::Q4K),
            Self::Q6K => Some(GgmlDType::Q6K),
            _ => None,
        }
    }

    /// The dense dtype, for the float dtypes.
    pub fn dense(self) -> Option<DType> {
        match self {
            Self::F32 => Some(DType::F32),
            Self::F16 => Some(DType::F16),
            Self::BF16 => Some(DType::BF16),
            _ => None,
        }
    }

    /// Rejects dtypes the device cannot run.
    pub fn check_device(self, device: &Device) -> Result<()> {
        if device.is_cpu() && matches!(self, Self::F16 | Self::BF16) {
            return Err(ModelError::Unsupported(format!(
                "dtype '{}' runs on CUDA; on CPU use f32 or a quantized dtype (q8_0, q4_0, q4_1, q4k)",
                self.as_str()
            )));
        }
        Ok(())
    }
}

impl fmt::Display for ModelDType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for ModelDType {
    type Err = ModelError;

    fn from_str(s: &str) -> Result<Self> {
        let normalized = s.trim().to_ascii_lowercase().replace('-', "_");
        Ok(match normalized.as_str() {
            "auto" | "" => Self::Auto,
            "f32" | "float32" => Self::F32,
            "f16" | "float16" | "half" => Self::F16,
            "bf16" | "bfloat16" => Self::BF16,
            "q8_0" | "q8" => Self::Q8_0,
            "q4_0" => Self::Q4_0,
            "q4_1" => Self::Q4_1,
            "q4k" | "q4_k" | "q4_k_m" => Self::Q4K,
            "q6k" | "q6_k" => Self::Q6K,
            _ => {
                return Err(ModelError::Unsupported(format!(
                    "unknown dtype '{s}'; expected one of {}",
                    Self::NAMES.join(", ")
                )));
            }
        })
    }
}

/// Quantized formats this build multiplies with SIMD on CPU: candle's SIMD dot products, and
/// the formats of [`crate::skinny_quant`] (Q4_1 among them, whose `vec_dot` in candle is
/// scalar). Anything else is requantized at load.
pub fn has_fast_cpu_kernel(dtype: GgmlDType) -> bool {
    matches!(
        dtype,
        GgmlDType::Q4_0 | GgmlDType::Q8_0 | GgmlDType::Q4K | GgmlDType::Q5K | GgmlDType::Q6K | GgmlDType::Q8K
    ) || crate::skinny_quant::serves(dtype)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_user_spellings() {
        assert_eq!("F32".parse::<ModelDType>().unwrap(), ModelDType::F32);
        assert_eq!("q4_k".parse::<ModelDType>().unwrap(), ModelDType::Q4K);
        assert_eq!("q8-0".parse::<ModelDType>().unwrap(), ModelDType::Q8_0);
        assert_eq!("Q4_1".parse::<ModelDType>().unwrap(), ModelDType::Q4_1);
        let e = "int3".parse::<ModelDType>().unwrap_err().to_string();
        assert!(e.contains("int3") && e.contains("q8_0"), "{e}");
    }

    #[test]
    fn half_precision_is_cuda_only() {
        assert!(ModelDType::BF16.check_device(&Device::Cpu).is_err());
        assert!(ModelDType::F32.check_device(&Device::Cpu).is_ok());
    }

    #[test]
    fn a_ggufs_q4_1_weights_stay_q4_1_where_this_build_multiplies_them() {
        let x86_simd =
            cfg!(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma", target_feature = "f16c"));
        assert_eq!(has_fast_cpu_kernel(GgmlDType::Q4_1), x86_simd);
        assert!(has_fast_cpu_kernel(GgmlDType::Q8_0));
        assert!(!has_fast_cpu_kernel(GgmlDType::Q5_1), "requantized: neither candle nor spec-rs has SIMD for it");
    }
}
