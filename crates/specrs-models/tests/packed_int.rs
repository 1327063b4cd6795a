//! GPTQ and AWQ checkpoints on a tiny Llama: every linear layer of the decoder quantized to
//! integers per group and packed as AutoGPTQ / GPTQModel and AutoAWQ pack them (written here
//! from their packing loops), the embeddings, norms and head left in floats as those tools
//! leave them. Loaded, the model matches transformers' forward (`common::Reference`) over the
//! dequantized weights `s·(q − z)`: 4- and 8-bit GPTQ, its act-order `g_idx`, its `gptq_v2`
//! zero points, and AWQ's GEMM layout.

mod common;

use std::collections::HashMap;

use candle_core::{DType, Device, Tensor};
use common::{Reference, assert_close, logits};
use serde_json::{Value, json};
use specrs_models::testing::{self, TinyShape};
use specrs_models::{Architecture, ModelDType, load_causal_lm};

const SHAPE: TinyShape =
    TinyShape { vocab: 40, hidden: 32, layers: 2, heads: 4, kv_heads: 2, head_dim: 8, intermediate: 64 };
const GROUP: usize = 16;
const LINEARS: [&str; 7] = [
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
];

#[derive(Clone, Copy, PartialEq)]
enum Packing {
    /// AutoGPTQ's: `zero_offset` 1 stores `z − 1` (the `gptq` format), 0 stores `z` (`gptq_v2`);
    /// `act_order` permutes which group each input belongs to (`g_idx`).
    Gptq {
        bits: u32,
        zero_offset: i32,
        act_order: bool,
    },
    Awq,
}

impl Packing {
    fn bits(self) -> u32 {
        match self {
            Self::Gptq { bits, .. } => bits,
            Self::Awq => 4,
        }
    }

    fn config(self) -> Value {
        match self {
            Self::Gptq { bits, zero_offset, act_order } => json!({
                "quant_method": "gptq", "bits": bits, "group_size": GROUP, "desc_act": act_order, "sym": false,
                "checkpoint_format": if zero_offset == 1 { "gptq" } else { "gptq_v2" },
            }),
            Self::Awq => {
                json!({"quant_method": "awq", "bits": 4, "group_size": GROUP, "version": "gemm", "zero_point": true})
            }
        }
    }
}

/// One layer `w [out, in]` quantized per (group, output): integers `q [out][in]`, zero points and
/// f16-rounded scales `[groups][out]`, and the group of each input.
struct Quantized {
    q: Vec<Vec<u32>>,
    zeros: Vec<Vec<u32>>,
    scales: Vec<Vec<f32>>,
    group_of: Vec<usize>,
}

fn quantize(w: &Tensor, bits: u32, act_order: bool) -> Quantized {
    let rows = w.to_vec2::<f32>().unwrap();
    let (out, inputs) = (rows.len(), rows[0].len());
    let groups = inputs / GROUP;
    // Act-order: inputs visited in another order, each run of GROUP of them a group.
    let group_of: Vec<usize> =
        (0..inputs).map(|i| if act_order { ((i * 5 + 3) % inputs) / GROUP } else { i / GROUP }).collect();
    let top = (1u32 << bits) - 1;
    let (mut zeros, mut scales) = (vec![vec![0u32; out]; groups], vec![vec![0f32; out]; groups]);
    let mut q = vec![vec![0u32; inputs]; out];
    for c in 0..out {
        for g in 0..groups {
            let members: Vec<usize> = (0..inputs).filter(|&i| group_of[i] == g).collect();
            let (lo, hi) = members.iter().fold((0f32, 0f32), |(lo, hi), &i| (lo.min(rows[c][i]), hi.max(rows[c][i])));
            // Scales are stored in f16: quantize against the value the checkpoint keeps.
            let scale = f16_rounded(((hi - lo) / top as f32).max(1e-3));
            // The `gptq` format cannot store a zero point of 0 (it keeps z − 1).
            let zero = ((-lo / scale).round() as u32).clamp(1, top);
            (zeros[g][c], scales[g][c]) = (zero, scale);
            for &i in &members {
                q[c][i] = ((rows[c][i] / scale).round() + zero as f32).clamp(0.0, top as f32) as u32;
            }
        }
    }
    Quantized { q, zeros, scales, group_of }
}

fn f16_rounded(x: f32) -> f32 {
    Tensor::new(&[x], &Device::Cpu)
        .unwrap()
        .to_dtype(DType::F16)
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap()
        .to_vec1()
        .unwrap()[0]
}

impl Quantized {
    /// `s·(q − z)` as `[out, in]`: the weight a loader must read back.
    fn dequantized(&self) -> Tensor {
        let rows: Vec<Vec<f32>> = self
            .q
            .iter()
            .enumerate()
            .map(|(c, row)| {
                row.iter()
                    .enumerate()
                    .map(|(i, &q)| {
                        let g = self.group_of[i];
                        self.scales[g][c] * (q as f32 - self.zeros[g][c] as f32)
                    })
                    .collect()
            })
            .collect();
        Tensor::new(rows, &Device::Cpu).unwrap()
    }

    /// The stored tensors of layer `prefix`.
    fn packed(&self, prefix: &str, packing: Packing) -> Vec<(String, Tensor)> {
        let (out, inputs) = (self.q.len(), self.q[0].len());
        let bits = packing.bits();
        let pack = (32 / bits) as usize;
        let word = |values: &mut dyn Iterator<Item = u32>| -> i32 {
            values.enumerate().fold(0u32, |w, (k, v)| w | (v << (bits as usize * k))) as i32
        };
        let scales: Vec<f32> = self.scales.iter().flatten().copied().collect();
        let scales =
            Tensor::from_vec(scales, (self.scales.len(), out), &Device::Cpu).unwrap().to_dtype(DType::F16).unwrap();
        let groups = self.scales.len();
        let mut parts = vec![(format!("{prefix}.scales"), scales)];
        match packing {
            Packing::Gptq { zero_offset, .. } => {
                // AutoGPTQ's pack: word (r, c) of qweight holds inputs r·pack .. r·pack + pack of
                // column c, input r·pack + k at bits k·b; qzeros pack columns the same way.
                let qweight: Vec<i32> = (0..inputs / pack)
                    .flat_map(|r| (0..out).map(move |c| (r, c)))
                    .map(|(r, c)| word(&mut (0..pack).map(|k| self.q[c][r * pack + k])))
                    .collect();
                let stored_zero = |z: u32| (z as i32 - zero_offset) as u32 & ((1 << bits) - 1);
                let qzeros: Vec<i32> = (0..groups)
                    .flat_map(|g| (0..out / pack).map(move |w| (g, w)))
                    .map(|(g, w)| word(&mut (0..pack).map(|k| stored_zero(self.zeros[g][w * pack + k]))))
                    .collect();
                let g_idx: Vec<i32> = self.group_of.iter().map(|&g| g as i32).collect();
                parts.push((
                    format!("{prefix}.qweight"),
                    Tensor::from_vec(qweight, (inputs / pack, out), &Device::Cpu).unwrap(),
                ));
                parts.push((
                    format!("{prefix}.qzeros"),
                    Tensor::from_vec(qzeros, (groups, out / pack), &Device::Cpu).unwrap(),
                ));
                parts.push((format!("{prefix}.g_idx"), Tensor::from_vec(g_idx, inputs, &Device::Cpu).unwrap()));
            }
            Packing::Awq => {
                // AutoAWQ's pack: nibble n of a word holds column [0, 2, 4, 6, 1, 3, 5, 7][n] of
                // its eight.
                const ORDER: [usize; 8] = [0, 2, 4, 6, 1, 3, 5, 7];
                let qweight: Vec<i32> = (0..inputs)
                    .flat_map(|i| (0..out / 8).map(move |w| (i, w)))
                    .map(|(i, w)| word(&mut ORDER.iter().map(|&o| self.q[w * 8 + o][i])))
                    .collect();
                let qzeros: Vec<i32> = (0..groups)
                    .flat_map(|g| (0..out / 8).map(move |w| (g, w)))
                    .map(|(g, w)| word(&mut ORDER.iter().map(|&o| self.zeros[g][w * 8 + o])))
                    .collect();
                parts.push((
                    format!("{prefix}.qweight"),
                    Tensor::from_vec(qweight, (inputs, out / 8), &Device::Cpu).unwrap(),
                ));
                parts.push((
                    format!("{prefix}.qzeros"),
                    Tensor::from_vec(qzeros, (groups, out / 8), &Device::Cpu).unwrap(),
                ));
            }
        }
        parts
    }
}

/// The float tensors with every decoder linear layer read back from its quantized form, and
/// the checkpoint's tensors with those layers packed.
fn checkpoint(packing: Packing) -> (HashMap<String, Tensor>, HashMap<String, Tensor>) {
    let tensors = testing::random_target(Architecture::Llama, &SHAPE, false, 61).unwrap();
    let (mut float, mut stored) = (tensors.clone(), tensors);
    let act_order = matches!(packing, Packing::Gptq { act_order: true, .. });
    for layer in 0..SHAPE.layers {
        for linear in LINEARS {
            let prefix = format!("model.layers.{layer}.{linear}");
            let name = format!("{prefix}.weight");
            let quantized = quantize(&float[&name], packing.bits(), act_order);
            float.insert(name.clone(), quantized.dequantized());
            stored.remove(&name);
            stored.extend(quantized.packed(&prefix, packing));
        }
    }
    (float, stored)
}

#[test]
fn gptq_and_awq_checkpoints_load_as_their_dequantized_weights() {
    let ids: Vec<u32> = (0..9).map(|i| (i * 11 + 3) % 40).collect();
    for packing in [
        Packing::Gptq { bits: 4, zero_offset: 1, act_order: false },
        Packing::Gptq { bits: 4, zero_offset: 1, act_order: true },
        Packing::Gptq { bits: 8, zero_offset: 0, act_order: false },
        Packing::Gptq { bits: 2, zero_offset: 1, act_order: false },
        Packing::Awq,
    ] {
        let label = packing.config().to_string();
        let dir = tempfile::tempdir().unwrap();
        let (float, stored) = checkpoint(packing);
        let mut config = testing::target_config(Architecture::Llama, &SHAPE, false);
        config["quantization_config"] = packing.config();
        testing::write_checkpoint(dir.path(), &config, &stored).unwrap();
        let (model, _) = load_causal_lm(dir.path(), &Device::Cpu, ModelDType::F32).unwrap();
        let want = Reference::plain(&float, SHAPE).logits(&ids);
        assert_close(&logits(&model, &ids, false), &want, &label);
        assert_close(&logits(&model, &ids, true), &want, &label);
        // The dtype left to spec-rs keeps the layers at 8 bits on the CPU.
        let (auto, _) = load_causal_lm(dir.path(), &Device::Cpu, ModelDType::Auto).unwrap();
        assert!(auto.layer_bits_per_weight() < 9.0, "{label}: {} bits", auto.layer_bits_per_weight());
    }
}

#[test]
fn a_packed_layer_of_the_wrong_shape_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let packing = Packing::Awq;
    let (_, mut stored) = checkpoint(packing);
    let name = "model.layers.1.mlp.up_proj.scales";
    stored.insert(name.into(), Tensor::zeros((1, SHAPE.intermediate), DType::F16, &Device::Cpu).unwrap());
    let mut config = testing::target_config(Architecture::Llama, &SHAPE, false);
    config["quantization_config"] = packing.config();
    testing::write_checkpoint(dir.path(), &config, &stored).unwrap();
    let e = load_causal_lm(dir.path(), &Device::Cpu, ModelDType::F32).err().unwrap().to_string();
    assert!(e.contains(name), "{e}");
}
