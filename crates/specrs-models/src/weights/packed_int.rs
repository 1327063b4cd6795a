//! GPTQ and AWQ checkpoints: a linear layer's integer weights packed into `int32` words
//! (`qweight`) with per-group scales (`scales`, f16) and zero points (`qzeros`, packed the same
//! way), read back to floats at load and then placed by the dtype policy like any dense weight.
//!
//! ```text
//! GPTQ (AutoGPTQ / GPTQModel):           AWQ (AutoAWQ, GEMM):
//!   qweight [in / (32/b), out]             qweight [in, out / 8]
//!     packed along the input, value k        packed along the output, column c of
//!     of a word at bits k·b                  a word at nibble REVERSE[c % 8]
//!   qzeros  [groups, out / (32/b)]         qzeros  [groups, out / 8], as qweight
//!   scales  [groups, out]                  scales  [groups, out]
//!   g_idx   [in] (the group of each input; act-order permutes it)
//!   w = s·(q − (z + 1)) ("gptq" format;    w = s·(q − z), group = input / group_size
//!       "gptq_v2" stores z itself)
//! ```
//!
//! The layer's weight is `w` transposed, `[out, in]`, as Hugging Face's `Linear` keeps it.

use serde_json::Value;

use crate::error::{ModelError, Result};

/// Where AWQ's packer put column `c % 8` of a word: its nibble (the packer wrote column
/// `[0, 2, 4, 6, 1, 3, 5, 7][i]` at nibble `i`).
const AWQ_NIBBLE_OF_COLUMN: [u32; 8] = [0, 4, 1, 5, 2, 6, 3, 7];

/// How a checkpoint packs its linear layers' integer weights (`quantization_config`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PackedIntFormat {
    Gptq {
        bits: u32,
        /// Inputs per group; `None`: one group over the whole input (`group_size: -1`).
        group_size: Option<usize>,
        /// Added to each stored zero point: 1 in the original `gptq` format, which stores
        /// `z − 1`; 0 in `gptq_v2`.
        zero_offset: i32,
    },
    Awq {
        group_size: usize,
    },
}

fn config_error(key: &str, message: impl Into<String>) -> ModelError {
    ModelError::config(format!("quantization_config.{key}"), message)
}

impl PackedIntFormat {
    /// The packed format `config.json`'s `quantization_config` names, if any: GPTQ and AWQ.
    /// gpt-oss's `mxfp4` is left to its experts; every other method is refused.
    pub fn from_hf(config: &Value) -> Result<Option<Self>> {
        let Some(q) = config.get("quantization_config").filter(|q| !q.is_null()) else { return Ok(None) };
        let usize_of = |keys: &[&str]| keys.iter().find_map(|k| q.get(*k)).and_then(Value::as_i64);
        match q.get("quant_method").and_then(Value::as_str) {
            Some("gptq") => {
                let bits = usize_of(&["bits"]).unwrap_or(4);
                if ![2, 4, 8].contains(&bits) {
                    return Err(config_error(
                        "bits",
                        format!(
                            "{bits}-bit GPTQ is not supported (2, 4 and 8 bits are: their values fill whole int32 words)"
                        ),
                    ));
                }
                let group_size = match usize_of(&["group_size"]).unwrap_or(128) {
                    -1 => None,
                    g if g > 0 => Some(g as usize),
                    g => return Err(config_error("group_size", format!("must be positive or -1, got {g}"))),
                };
                let zero_offset = match q.get("checkpoint_format").and_then(Value::as_str).unwrap_or("gptq") {
                    "gptq" => 1,
                    "gptq_v2" => 0,
                    other => {
                        return Err(config_error(
                            "checkpoint_format",
                            format!(
                                "'{other}' is not supported (gptq and gptq_v2 are; repack Marlin checkpoints to gptq)"
                            ),
                        ));
                    }
                };
                Ok(Some(Self::Gptq { bits: bits as u32, group_size, zero_offset }))
            }
            Some("awq") => {
                let bits = usize_of(&["bits", "w_bit"]).unwrap_or(4);
                if bits != 4 {
                    return Err(config_error("bits", format!("{bits}-bit AWQ is not supported (4-bit is)")));
                }
                let version = q.get("version").and_then(Value::as_str).unwrap_or("gemm").to_ascii_lowercase();
                if version != "gemm" {
                    return Err(config_error(
                        "version",
                        format!("AWQ's '{version}' packing is not supported; use a GEMM checkpoint (version: gemm)"),
                    ));
                }
                if q.get("zero_point").and_then(Value::as_bool) == Some(false) {
                    return Err(config_error("zero_point", "AWQ without zero points is not supported"));
                }
                let group_size = usize_of(&["group_size", "q_group_size"]).unwrap_or(128);
                if group_size <= 0 {
                    return Err(config_error("group_size", format!("must be positive, got {group_size}")));
                }
                Ok(Some(Self::Awq { group_size: group_size as usize }))
            }
            // gpt-oss's MXFP4 experts read their own blocks; a config naming no method packs nothing.
            Some("mxfp4") | None => Ok(None),
            // Loading any other method's weights as plain floats would run without their scales
            // and generate garbage (FP8 blocks without `weight_scale_inv`, say).
            Some(other) => Err(config_error(
                "quant_method",
                format!(
                    "'{other}' checkpoints are not supported: spec-rs reads GPTQ, AWQ and gpt-oss's MXFP4 \
                     ones; use the model's bf16 / f16 checkpoint or a GGUF file"
                ),
            )),
        }
    }

    /// Values per int32 word.
    fn pack(&self) -> usize {
        match self {
            Self::Gptq { bits, .. } => 32 / *bits as usize,
            Self::Awq { .. } => 8,
        }
    }

    fn groups(&self, inputs: usize) -> usize {
        match self {
            Self::Gptq { group_size: None, .. } => 1,
            Self::Gptq { group_size: Some(g), .. } | Self::Awq { group_size: g } => inputs.div_ceil(*g),
        }
    }

    /// The stored shapes of `qweight`, `qzeros` and `scales` for a layer `[out, in]`.
    pub fn shapes(&self, out: usize, inputs: usize) -> [[usize; 2]; 3] {
        let (pack, groups) = (self.pack(), self.groups(inputs));
        match self {
            Self::Gptq { .. } => [[inputs / pack, out], [groups, out / pack], [groups, out]],
            Self::Awq { .. } => [[inputs, out / pack], [groups, out / pack], [groups, out]],
        }
    }

    /// Checks that a layer `[out, in]` packs into whole words and groups.
    pub fn check_layer(&self, name: &str, out: usize, inputs: usize) -> Result<()> {
        let pack = self.pack();
        let packed_dim = match self {
            Self::Gptq { .. } => inputs,
            Self::Awq { .. } => out,
        };
        if !packed_dim.is_multiple_of(pack) || !out.is_multiple_of(pack) {
            return Err(ModelError::Unsupported(format!(
                "{name}: a [{out}, {inputs}] layer does not pack into whole int32 words of {pack} values"
            )));
        }
        Ok(())
    }

    /// The layer's weight `[out, in]`, row-major, from its packed parts (row-major as stored);
    /// `g_idx` is GPTQ's group of each input where the checkpoint has one.
    pub fn dequantize(
        &self,
        (out, inputs): (usize, usize),
        qweight: &[i32],
        qzeros: &[i32],
        scales: &[f32],
        g_idx: Option<&[i32]>,
    ) -> Result<Vec<f32>> {
        let pack = self.pack();
        let groups = self.groups(inputs);
        let mut w = vec![0f32; out * inputs];
        match *self {
            Self::Gptq { bits, group_size, zero_offset } => {
                let mask = (1u32 << bits) - 1;
                let value = |word: i32, k: usize| ((word as u32 >> (bits as usize * k)) & mask) as i32;
                let group_of = |i: usize| -> Result<usize> {
                    let g = match (g_idx, group_size) {
                        (Some(g_idx), _) => g_idx[i] as usize,
                        (None, Some(size)) => i / size,
                        (None, None) => 0,
                    };
                    if g >= groups {
                        return Err(ModelError::Unsupported(format!("g_idx names group {g} of {groups}")));
                    }
                    Ok(g)
                };
                for i in 0..inputs {
                    let g = group_of(i)?;
                    for c in 0..out {
                        let q = value(qweight[(i / pack) * out + c], i % pack);
                        let z = value(qzeros[g * (out / pack) + c / pack], c % pack) + zero_offset;
                        w[c * inputs + i] = scales[g * out + c] * (q - z) as f32;
                    }
                }
            }
            Self::Awq { group_size } => {
                let nibble = |word: i32, c: usize| ((word as u32 >> (4 * AWQ_NIBBLE_OF_COLUMN[c % 8])) & 15) as i32;
                for i in 0..inputs {
                    let g = i / group_size;
                    for c in 0..out {
                        let q = nibble(qweight[i * (out / pack) + c / pack], c);
                        let z = nibble(qzeros[g * (out / pack) + c / pack], c);
                        w[c * inputs + i] = scales[g * out + c] * (q - z) as f32;
                    }
                }
            }
        }
        Ok(w)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn format(q: Value) -> Result<Option<PackedIntFormat>> {
        PackedIntFormat::from_hf(&json!({"quantization_config": q}))
    }

    #[test]
    fn configs_read_as_their_packing_and_the_unsupported_are_refused_by_key() {
        assert_eq!(
            format(json!({"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": true})).unwrap(),
            Some(PackedIntFormat::Gptq { bits: 4, group_size: Some(128), zero_offset: 1 })
        );
        assert_eq!(
            format(json!({"quant_method": "gptq", "bits": 8, "group_size": -1, "checkpoint_format": "gptq_v2"}))
                .unwrap(),
            Some(PackedIntFormat::Gptq { bits: 8, group_size: None, zero_offset: 0 })
        );
        assert_eq!(
            format(
                json!({"quant_method": "awq", "w_bit": 4, "q_group_size": 64, "version": "GEMM", "zero_point": true})
            )
            .unwrap(),
            Some(PackedIntFormat::Awq { group_size: 64 })
        );
        assert_eq!(format(json!({"quant_method": "mxfp4"})).unwrap(), None, "gpt-oss's experts read their own");
        assert_eq!(PackedIntFormat::from_hf(&json!({})).unwrap(), None);
        for method in ["fp8", "compressed-tensors", "bitsandbytes"] {
            let e = format(json!({"quant_method": method, "weight_block_size": [128, 128]})).unwrap_err().to_string();
            assert!(e.contains("quantization_config.quant_method") && e.contains(method), "{e}");
        }
        for (q, key) in [
            (json!({"quant_method": "gptq", "bits": 3}), "bits"),
            (json!({"quant_method": "gptq", "checkpoint_format": "marlin"}), "checkpoint_format"),
            (json!({"quant_method": "awq", "bits": 4, "version": "gemv"}), "version"),
            (json!({"quant_method": "awq", "bits": 8}), "bits"),
            (json!({"quant_method": "awq", "zero_point": false}), "zero_point"),
        ] {
            let e = format(q.clone()).unwrap_err().to_string();
            assert!(e.contains(&format!("quantization_config.{key}")), "{q}: {e}");
        }
    }

    #[test]
    fn awq_columns_come_back_from_the_nibbles_its_packer_chose() {
        // AutoAWQ's packer: nibble i of a word holds column [0, 2, 4, 6, 1, 3, 5, 7][i].
        let columns: [i32; 8] = [1, 2, 3, 4, 5, 6, 7, 8];
        let order = [0, 2, 4, 6, 1, 3, 5, 7];
        let word = (0..8).fold(0u32, |w, i| w | ((columns[order[i]] as u32) << (4 * i))) as i32;
        let awq = PackedIntFormat::Awq { group_size: 1 };
        // One input, eight outputs, zero point 0, scale 1: the weights are the columns.
        let w = awq.dequantize((8, 1), &[word], &[0], &[1.0; 8], None).unwrap();
        assert_eq!(w, columns.map(|c| c as f32));
    }
}
