//! Transformers' decoder forward written out with plain loops over host vectors, for one
//! sequence: the independent reference the family tests hold the engine's model code to. It
//! reads whatever the checkpoint holds (fused or separate projections, q/k/v biases, q/k
//! norms, dense MLPs or routed experts with an optional shared expert); what the checkpoint
//! cannot say (rotary dims and factors, window, routing rule) the test states explicitly.

// Each test binary includes this module and uses a part of it.
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::Path;

use candle_core::quantized::gguf_file::{self, Value as GgufValue};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use specrs_models::testing::{self, TinyShape};
use specrs_models::weights::gguf::gguf_name;
use specrs_models::{CausalLm, ForwardBatch};

const BLOCK: usize = 4;

/// One sequence on a contiguous block table: `tokens` after `cached` keys, logits everywhere.
pub fn batch(tokens: &[u32], cached: usize) -> ForwardBatch {
    testing::single_sequence_batch(tokens, cached, BLOCK, (0..tokens.len() as u32).collect())
}

/// The model's logits of every token: one prefill, or (`stepwise`) one token per step
/// against the paged cache.
pub fn logits(model: &CausalLm, ids: &[u32], stepwise: bool) -> Vec<Vec<f32>> {
    let kv = model.new_kv_cache(ids.len().div_ceil(BLOCK) + 1, BLOCK).unwrap();
    let rows = |b: &ForwardBatch| model.forward(b, &kv).unwrap().logits.unwrap().to_vec2::<f32>().unwrap();
    if !stepwise {
        return rows(&batch(ids, 0));
    }
    (0..ids.len()).flat_map(|i| rows(&batch(&ids[i..=i], i))).collect()
}

/// How a mixture's router chooses: softmax top-k; DeepSeek-V3's sigmoid scores within the best
/// groups (`n_group`, `topk_group`, `routed_scaling_factor`); or DeepSeek-V2's softmax within
/// the best groups.
pub enum Choice {
    Softmax,
    /// ERNIE 4.5 MoE: softmax probabilities plus the correction bias choose, the
    /// probabilities renormalised weigh.
    BiasedSoftmax,
    GroupedSigmoid(usize, usize, f64),
    GroupedSoftmax(usize, usize, f64),
    /// Llama 4: the top-k by logit, each expert fed the token times `sigmoid(logit)`.
    InputScaledSigmoid,
    /// Phi-3.5-MoE's sparsemixer (inference) with its jitter epsilon; top-2 only.
    SparseMixer(f32),
}

/// Routing of a mixture: each token's `top_k` experts as `choice` picks them, weights
/// renormalised when `norm_topk_prob`.
pub struct Routing {
    pub top_k: usize,
    pub norm_topk_prob: bool,
    pub choice: Choice,
}

/// Positions of the `k` largest values, the earlier first among equals.
fn largest(values: &[f32], k: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..values.len()).collect();
    order.sort_by(|&a, &b| values[b].total_cmp(&values[a]));
    order.truncate(k);
    order
}

/// Gemma 2's and 3's layer as transformers runs it: norms scaling by `1 + weight`, attention
/// and MLP outputs normed too, GeGLU, embeddings times `sqrt(hidden)`, per-layer attention,
/// and Gemma 2's soft caps.
pub struct GemmaLayout {
    /// Layers that attend within `window` with RoPE at `local_theta`.
    pub sliding: Vec<bool>,
    pub window: usize,
    pub local_theta: f64,
    /// The softmax scale (`query_pre_attn_scalar^-0.5`).
    pub scale: f32,
    /// Gemma 2's `attn_logit_softcapping` and `final_logit_softcapping`.
    pub softcaps: Option<(f32, f32)>,
}

fn soft_cap(x: f32, cap: f32) -> f32 {
    cap * (x / cap).tanh()
}

/// Granite's constants: embeddings times `embedding`, residual branches times `residual`,
/// scores times `attention`, logits divided by `logits_divisor`.
pub struct Multipliers {
    pub embedding: f32,
    pub residual: f32,
    pub attention: f32,
    pub logits_divisor: f32,
}

/// gpt-oss's layer as transformers runs it: sliding and full layers (`sliding`, `window`),
/// biased q/k/v/o, each head's sink in its softmax, and experts stored together (dense
/// `experts.gate_up_proj [E, H, 2I]` with gate/up interleaved, `experts.down_proj [E, I, H]`,
/// biases) under a biased `router` whose top-k logits are softmaxed; the clamped SwiGLU.
pub struct GptOssLayout {
    pub sliding: Vec<bool>,
    pub window: usize,
    pub top_k: usize,
    pub limit: f32,
}

/// Llama 4's attention as transformers runs it (`Llama4TextAttention`): the RoPE layers
/// (`Reference::rope_layers`) attend within `chunk` positions and, with `l2_norm`, norm each
/// rotated q and k head without weights; the NoPE layers multiply queries at position `p` by
/// `ln(floor((p + 1) / floor_scale) + 1) · attn_scale + 1` (`temperature`).
pub struct Llama4Layout {
    pub chunk: Option<usize>,
    pub l2_norm: bool,
    pub temperature: Option<(f64, f64)>,
}

/// DeepSeek's latent attention as transformers runs it (`DeepseekV3Attention`): dims, and the
/// softmax scale.
pub struct MlaLayout {
    pub kv_lora_rank: usize,
    pub nope: usize,
    pub rope: usize,
    pub v: usize,
    pub scale: f32,
}

/// ALiBi as transformers adds it: `slopes[h] · x` to head `h`'s score of key `x`, after the
/// scores are scaled (BLOOM's `baddbmm`) or before (Falcon-RW's, so scaled with them).
pub struct AlibiLayout {
    pub slopes: Vec<f32>,
    pub before_scaling: bool,
}

/// `build_alibi_tensor`'s slopes for `heads` heads, as BLOOM and Falcon compute them: a
/// geometric series `base^1 .. base^p` for the largest power of two `p <= heads`, then odd
/// powers of the next series' base for the rest.
pub fn bloom_alibi_slopes(heads: usize) -> Vec<f32> {
    let closest = 2usize.pow((heads as f64).log2().floor() as u32);
    let base = 2f32.powf(-(2f32.powf(-((closest as f32).log2() - 3.0))));
    let mut slopes: Vec<f32> = (1..=closest).map(|p| base.powi(p as i32)).collect();
    if closest != heads {
        let extra_base = 2f32.powf(-(2f32.powf(-((2.0 * closest as f32).log2() - 3.0))));
        let remaining = closest.min(heads - closest);
        slopes.extend((1..1 + 2 * remaining).step_by(2).map(|p| extra_base.powi(p as i32)));
    }
    slopes
}

/// `build_mpt_alibi_tensor`'s slopes as MPT computes them: `1 / 2^(i · max_bias / P)` for
/// `i = 1..=P`, `P` the next power of two, then (for fewer heads) the odd-indexed ones first.
pub fn mpt_alibi_slopes(heads: usize, max_bias: f32) -> Vec<f32> {
    let p = 2usize.pow((heads as f64).log2().ceil() as u32);
    let all: Vec<f32> = (1..=p).map(|i| 1.0 / 2f32.powf(i as f32 * (max_bias / p as f32))).collect();
    if p == heads {
        return all;
    }
    all.iter().skip(1).step_by(2).chain(all.iter().step_by(2)).take(heads).copied().collect()
}

pub struct Reference<'a> {
    pub tensors: &'a HashMap<String, Tensor>,
    pub shape: TinyShape,
    /// Leading dims of a head that rotate.
    pub rotary: usize,
    /// Per-frequency divisors of the inverse frequencies (all 1 for plain RoPE).
    pub factors: Vec<f64>,
    /// What cos and sin are multiplied by (LongRoPE's attention factor).
    pub magnitude: f64,
    pub window: Option<usize>,
    pub routing: Option<Routing>,
    pub gemma: Option<GemmaLayout>,
    pub multipliers: Option<Multipliers>,
    pub gpt_oss: Option<GptOssLayout>,
    /// RoPE turns interleaved pairs `(2i, 2i + 1)` (GLM) rather than halves `(i, i + r/2)`.
    pub interleaved_rope: bool,
    /// `Some(layers)`: only these layers turn q and k (SmolLM3's NoPE layers do not).
    pub rope_layers: Option<Vec<bool>>,
    /// `Some(layers)`: only these layers attend within `window`, turning with the unscaled
    /// RoPE (OLMo 3); the others attend to everything with `factors` and `magnitude`.
    pub sliding: Option<Vec<bool>>,
    /// Latent attention in place of q/k/v projections (its rope part turned by `rotary` dims,
    /// interleaved as `interleaved_rope` says).
    pub mla: Option<MlaLayout>,
    /// Norms are LayerNorms without bias: the input centred first (Cohere).
    pub centered_norms: bool,
    /// The per-head q/k norms come after RoPE (HunYuan), not before.
    pub qk_norm_after_rope: bool,
    /// Attention and MLP read the same normed input and both join the residual (Cohere).
    pub parallel: bool,
    pub llama4: Option<Llama4Layout>,
    /// An MLP without a gate applies GELU's tanh form (StarCoder2), not `relu²` (Arcee).
    pub ungated_gelu: bool,
    /// The norms have no weights (OLMo 1): every norm scales by one.
    pub weightless_norms: bool,
    /// q, k and v clamped to `±clip` as projected (OLMo 1.7, MPT), after the whole-width q/k
    /// norms where there are some (OLMoE).
    pub clip_qkv: Option<f32>,
    /// The norms scale by `1 + weight` without Gemma's other parts (Nemotron's LayerNorm1P).
    pub layer_norm_1p: bool,
    /// The GELU of an MLP without a gate is the exact one (GPT-NeoX), not the tanh form.
    pub exact_gelu: bool,
    /// Side by side, the MLP reads `post_attention_layernorm` of the residual (GPT-NeoX), not
    /// attention's input.
    pub parallel_mlp_norm: bool,
    pub alibi: Option<AlibiLayout>,
    /// RoPE's base (10,000 unless a family scales it: ChatGLM's `rope_ratio`).
    pub theta: f64,
}

type Rows = Vec<Vec<f32>>;

fn host(t: &Tensor) -> Rows {
    t.to_vec2::<f32>().unwrap()
}

fn matmul_t(x: &[Vec<f32>], w: &Tensor) -> Rows {
    let w = host(w);
    x.iter().map(|row| w.iter().map(|wr| wr.iter().zip(row).map(|(a, b)| a * b).sum()).collect()).collect()
}

fn rms_row(row: &[f32], w: &[f32]) -> Vec<f32> {
    let scale = 1.0 / (row.iter().map(|v| v * v).sum::<f32>() / row.len() as f32 + 1e-5).sqrt();
    row.iter().zip(w).map(|(v, g)| v * scale * g).collect()
}

fn add(a: &[Vec<f32>], b: &[Vec<f32>]) -> Rows {
    a.iter().zip(b).map(|(x, y)| x.iter().zip(y).map(|(u, v)| u + v).collect()).collect()
}

fn silu(v: f32) -> f32 {
    v / (1.0 + (-v).exp())
}

/// The exact GELU, `x · Φ(x)`, with erf from Abramowitz and Stegun 7.1.26 (error below 2e-7).
fn gelu_erf(v: f32) -> f32 {
    let z = f64::from(v) / std::f64::consts::SQRT_2;
    let t = 1.0 / (1.0 + 0.3275911 * z.abs());
    let poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))));
    let erf = (1.0 - poly * (-z * z).exp()).copysign(z);
    (0.5 * f64::from(v) * (1.0 + erf)) as f32
}

/// `gelu_pytorch_tanh`.
fn gelu_tanh(v: f32) -> f32 {
    0.5 * v * (1.0 + ((2.0 / std::f32::consts::PI).sqrt() * (v + 0.044715 * v * v * v)).tanh())
}

impl<'a> Reference<'a> {
    /// Llama's forward over `tensors`: full-width plain RoPE, full attention, no family options
    /// (tests set theirs with `..Reference::plain(..)`).
    pub fn plain(tensors: &'a HashMap<String, Tensor>, shape: TinyShape) -> Self {
        Self {
            tensors,
            shape,
            rotary: shape.head_dim,
            factors: vec![1.0; shape.head_dim / 2],
            magnitude: 1.0,
            window: None,
            routing: None,
            gemma: None,
            multipliers: None,
            gpt_oss: None,
            interleaved_rope: false,
            rope_layers: None,
            sliding: None,
            mla: None,
            centered_norms: false,
            qk_norm_after_rope: false,
            parallel: false,
            llama4: None,
            ungated_gelu: false,
            weightless_norms: false,
            clip_qkv: None,
            layer_norm_1p: false,
            exact_gelu: false,
            parallel_mlp_norm: false,
            alibi: None,
            theta: 10_000.0,
        }
    }

    fn get(&self, name: &str) -> Option<&Tensor> {
        self.tensors.get(name)
    }

    /// A norm's scale: its weight, or Gemma's `1 + weight`.
    fn norm_weight(&self, name: &str) -> Vec<f32> {
        if self.weightless_norms {
            return vec![1.0; self.shape.hidden];
        }
        let w = self.tensors[name].to_vec1::<f32>().unwrap();
        if self.gemma.is_some() || self.layer_norm_1p { w.iter().map(|v| 1.0 + v).collect() } else { w }
    }

    /// `x` normed by the norm whose weight is `name`, plus its bias where it has one
    /// (StarCoder2's LayerNorms).
    fn rms(&self, x: &[Vec<f32>], name: &str) -> Rows {
        let w = self.norm_weight(name);
        let normed: Rows = x.iter().map(|row| self.norm_row(row, &w)).collect();
        match self.get(&name.replace(".weight", ".bias")) {
            Some(b) => add(&normed, &vec![b.to_vec1::<f32>().unwrap(); normed.len()]),
            None => normed,
        }
    }

    /// `row` normed with weight `w`: RMSNorm, or LayerNorm without bias when `centered_norms`.
    fn norm_row(&self, row: &[f32], w: &[f32]) -> Vec<f32> {
        if !self.centered_norms {
            return rms_row(row, w);
        }
        let mean = row.iter().sum::<f32>() / row.len() as f32;
        let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / row.len() as f32;
        row.iter().zip(w).map(|(v, g)| (v - mean) / (var + 1e-5).sqrt() * g).collect()
    }

    /// Layer `l`'s window and RoPE base.
    /// Layer `l`'s window, RoPE base, and whether its RoPE takes the scaling.
    fn layer_attention(&self, l: usize) -> (Option<usize>, f64, bool) {
        match (&self.gemma, &self.gpt_oss, &self.sliding) {
            (Some(g), _, _) if g.sliding[l] => (Some(g.window), g.local_theta, false),
            (Some(_), _, _) => (None, self.theta, true),
            (None, Some(o), _) => (o.sliding[l].then_some(o.window), self.theta, true),
            (None, None, Some(s)) if s[l] => (self.window, self.theta, false),
            (None, None, Some(_)) => (None, self.theta, true),
            (None, None, None) => (self.window, self.theta, true),
        }
    }

    fn rotate(&self, v: &mut [f32], p: usize, theta: f64, scaled: bool) {
        let half = self.rotary / 2;
        let magnitude = if scaled { self.magnitude } else { 1.0 };
        for i in 0..half {
            let factor = if scaled { self.factors[i] } else { 1.0 };
            let inv = 1.0 / (factor * theta.powf(2.0 * i as f64 / self.rotary as f64));
            let angle = p as f64 * inv;
            let (c, s) = ((magnitude * angle.cos()) as f32, (magnitude * angle.sin()) as f32);
            let (x, y) = if self.interleaved_rope { (2 * i, 2 * i + 1) } else { (i, i + half) };
            let (a, b) = (v[x], v[y]);
            v[x] = a * c - b * s;
            v[y] = b * c + a * s;
        }
    }

    /// `[T, q | k | v]` projections of the normed input, biases added where the checkpoint has them.
    fn qkv(&self, p: &str, x: &[Vec<f32>]) -> Rows {
        if let Some(fused) = self.get(&format!("{p}.qkv_proj.weight")) {
            return matmul_t(x, fused);
        }
        let part = |n: &str| {
            let y = matmul_t(x, &self.tensors[&format!("{p}.{n}_proj.weight")]);
            match self.get(&format!("{p}.{n}_proj.bias")) {
                Some(b) => add(&y, &vec![b.to_vec1::<f32>().unwrap(); y.len()]),
                None => y,
            }
        };
        let (q, k, v) = (part("q"), part("k"), part("v"));
        (0..x.len()).map(|t| [q[t].clone(), k[t].clone(), v[t].clone()].concat()).collect()
    }

    /// `x @ {p}.{name}.weight^T`.
    fn linear(&self, p: &str, name: &str, x: &[Vec<f32>]) -> Rows {
        matmul_t(x, &self.tensors[&format!("{p}.{name}.weight")])
    }

    /// [`Self::linear`] plus `{p}.{name}.bias` where the checkpoint has it.
    fn biased(&self, p: &str, name: &str, x: &[Vec<f32>]) -> Rows {
        let y = self.linear(p, name, x);
        match self.get(&format!("{p}.{name}.bias")) {
            Some(b) => add(&y, &vec![b.to_vec1::<f32>().unwrap(); y.len()]),
            None => y,
        }
    }

    /// DeepSeek-V3's attention: queries `q_b(rms(q_a(x)))` (or `q_proj(x)`) split per head into
    /// `[nope, rope]`; `kv_a_proj_with_mqa(x)` split into the latent and one rope key shared by
    /// the heads; `kv_b(rms(latent))` split per head into `[key nope, value]`; scores over
    /// `[nope, rope]` with the rope parts turned; `o_proj` over the heads' values.
    fn latent_attention(&self, p: &str, x: &[Vec<f32>], m: &MlaLayout) -> Rows {
        let nh = self.shape.heads;
        let (d, rank) = (m.nope + m.rope, m.kv_lora_rank);
        let q = match self.get(&format!("{p}.q_a_proj.weight")) {
            Some(_) => self.linear(
                p,
                "q_b_proj",
                &self.rms(&self.linear(p, "q_a_proj", x), &format!("{p}.q_a_layernorm.weight")),
            ),
            None => self.linear(p, "q_proj", x),
        };
        let compressed = self.linear(p, "kv_a_proj_with_mqa", x);
        let latent: Rows = compressed.iter().map(|r| r[..rank].to_vec()).collect();
        let kv = self.linear(p, "kv_b_proj", &self.rms(&latent, &format!("{p}.kv_a_layernorm.weight")));
        // Token `t`'s query and key of head `h`: `[nope, rope]`, the rope part turned at `t`.
        let query = |t: usize, h: usize| {
            let mut v = q[t][h * d..(h + 1) * d].to_vec();
            self.rotate(&mut v[m.nope..], t, 10_000.0, true);
            v
        };
        let key = |t: usize, h: usize| {
            let w = m.nope + m.v;
            let mut rope = compressed[t][rank..rank + m.rope].to_vec();
            self.rotate(&mut rope, t, 10_000.0, true);
            [kv[t][h * w..h * w + m.nope].to_vec(), rope].concat()
        };
        let value = |t: usize, h: usize| {
            let w = m.nope + m.v;
            kv[t][h * w + m.nope..(h + 1) * w].to_vec()
        };
        let mut out = vec![vec![0f32; nh * m.v]; x.len()];
        for (qi, row) in out.iter_mut().enumerate() {
            for h in 0..nh {
                let qv = query(qi, h);
                let scores: Vec<f32> =
                    (0..=qi).map(|kj| qv.iter().zip(&key(kj, h)).map(|(a, b)| a * b).sum::<f32>() * m.scale).collect();
                let top = scores.iter().cloned().fold(f32::MIN, f32::max);
                let weights: Vec<f32> = scores.iter().map(|s| (s - top).exp()).collect();
                let total: f32 = weights.iter().sum();
                for (kj, w) in weights.iter().enumerate() {
                    for (o, vv) in row[h * m.v..(h + 1) * m.v].iter_mut().zip(&value(kj, h)) {
                        *o += w / total * vv;
                    }
                }
            }
        }
        self.linear(p, "o_proj", &out)
    }

    fn attention(&self, p: &str, x: &[Vec<f32>], layer: usize) -> Rows {
        if let Some(m) = &self.mla {
            return self.latent_attention(p, x, m);
        }
        let TinyShape { heads: nh, kv_heads: nkv, head_dim: d, .. } = self.shape;
        let (window, theta, scaled) = self.layer_attention(layer);
        let scale = match (&self.gemma, &self.multipliers) {
            (Some(g), _) => g.scale,
            (None, Some(m)) => m.attention,
            (None, None) => 1.0 / (d as f32).sqrt(),
        };
        let qkv = self.qkv(p, x);
        // A q/k norm's weights, flattened; `[heads, d]` ones (Cohere) scale head by head.
        let norm = |n: &str| {
            let name = format!("{p}.{n}_norm.weight");
            self.get(&name).map(|t| match t.rank() {
                2 => t.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
                _ => self.norm_weight(&name),
            })
        };
        let per_head = self.get(&format!("{p}.q_norm.weight")).is_some_and(|t| t.rank() == 2);
        let (q_norm, k_norm) = (norm("q"), norm("k"));
        // OLMo 2 norms q and k across all heads at once, before splitting them.
        let spans = !per_head && q_norm.as_ref().is_some_and(|w| w.len() == nh * d);
        let qkv: Rows = match (&q_norm, &k_norm) {
            (Some(qw), Some(kw)) if spans => qkv
                .iter()
                .map(|row| {
                    let (q, rest) = row.split_at(nh * d);
                    let (k, v) = rest.split_at(nkv * d);
                    [rms_row(q, qw), rms_row(k, kw), v.to_vec()].concat()
                })
                .collect(),
            _ => qkv,
        };
        let (q_norm, k_norm) = if spans { (None, None) } else { (q_norm, k_norm) };
        let qkv: Rows = match self.clip_qkv {
            Some(c) => qkv.into_iter().map(|row| row.into_iter().map(|v| v.clamp(-c, c)).collect()).collect(),
            None => qkv,
        };
        // Phi's q/k LayerNorms add a bias.
        let norm_bias = |n: &str| self.get(&format!("{p}.{n}_norm.bias")).map(|b| b.to_vec1::<f32>().unwrap());
        let (q_bias, k_bias) = (norm_bias("q"), norm_bias("k"));
        let sinks = self.get(&format!("{p}.sinks")).map(|s| s.to_vec1::<f32>().unwrap());
        // Head `at` of token `t` (head `at - first` of its kind), normed (Qwen3; Cohere with a
        // weight row per head) and rotated at position `t`.
        let head = |t: usize, at: usize, first: usize, norm: &Option<Vec<f32>>, turn: bool| {
            let mut v = qkv[t][at * d..(at + 1) * d].to_vec();
            let normed = |v: &[f32]| match norm {
                Some(w) => {
                    let w = if per_head { &w[(at - first) * d..(at - first + 1) * d] } else { &w[..] };
                    let normed = self.norm_row(v, w);
                    match if at < nh { &q_bias } else { &k_bias } {
                        Some(b) => normed.iter().zip(b).map(|(x, y)| x + y).collect(),
                        None => normed,
                    }
                }
                None => v.to_vec(),
            };
            if !self.qk_norm_after_rope {
                v = normed(&v);
            }
            let rotating = self.rope_layers.as_ref().is_none_or(|r| r[layer]);
            if turn && rotating {
                self.rotate(&mut v, t, theta, scaled);
            }
            match &self.llama4 {
                Some(l) if turn && rotating && l.l2_norm => return rms_row(&v, &vec![1.0; d]),
                // Only queries (the heads before the keys) are tempered.
                Some(Llama4Layout { temperature: Some((floor_scale, attn_scale)), .. }) if !rotating && at < nh => {
                    let factor = ((((t as f64 + 1.0) / floor_scale).floor() + 1.0).ln() * attn_scale + 1.0) as f32;
                    return v.iter().map(|x| x * factor).collect();
                }
                _ => {}
            }
            if self.qk_norm_after_rope { normed(&v) } else { v }
        };
        let mut out = vec![vec![0f32; nh * d]; x.len()];
        for (qi, row) in out.iter_mut().enumerate() {
            let first = window.map_or(0, |w| (qi + 1).saturating_sub(w));
            // Llama 4's RoPE layers: the query's own chunk only.
            let first = match self.llama4.as_ref().and_then(|l| l.chunk) {
                Some(c) if self.rope_layers.as_ref().is_none_or(|r| r[layer]) => first.max(qi - qi % c),
                _ => first,
            };
            for h in 0..nh {
                let kvh = h / (nh / nkv);
                let q = head(qi, h, 0, &q_norm, true);
                let scores: Vec<f32> = (first..=qi)
                    .map(|kj| {
                        let k = head(kj, nh + kvh, nh, &k_norm, true);
                        let dot = q.iter().zip(&k).map(|(a, b)| a * b).sum::<f32>();
                        let score = match &self.alibi {
                            Some(a) if a.before_scaling => (dot + a.slopes[h] * kj as f32) * scale,
                            Some(a) => dot * scale + a.slopes[h] * kj as f32,
                            None => dot * scale,
                        };
                        match self.gemma.as_ref().and_then(|g| g.softcaps) {
                            Some((cap, _)) => soft_cap(score, cap),
                            None => score,
                        }
                    })
                    .collect();
                // gpt-oss's sink joins the softmax as one more logit with no value.
                let sink = sinks.as_ref().map(|s| s[h]);
                let top = scores.iter().cloned().chain(sink).fold(f32::MIN, f32::max);
                let weights: Vec<f32> = scores.iter().map(|s| (s - top).exp()).collect();
                let total: f32 = weights.iter().sum::<f32>() + sink.map_or(0.0, |s| (s - top).exp());
                for (kj, w) in (first..=qi).zip(&weights) {
                    let v = head(kj, nh + nkv + kvh, nh + nkv, &None, false);
                    for (o, vv) in row[h * d..(h + 1) * d].iter_mut().zip(&v) {
                        *o += w / total * vv;
                    }
                }
            }
        }
        let o = matmul_t(&out, &self.tensors[&format!("{p}.o_proj.weight")]);
        match self.get(&format!("{p}.o_proj.bias")) {
            Some(b) => add(&o, &vec![b.to_vec1::<f32>().unwrap(); o.len()]),
            None => o,
        }
    }

    /// gpt-oss's mixture: `softmax(top-k(router(x)))`-weighted experts, each
    /// `((clamp(up, ±limit) + 1) · g · σ(1.702 g)) W_down + b` with `g = min(gate, limit)`.
    fn gpt_oss_experts(&self, p: &str, x: &[Vec<f32>], layout: &GptOssLayout) -> Rows {
        let router = add(
            &matmul_t(x, &self.tensors[&format!("{p}.router.weight")]),
            &vec![self.tensors[&format!("{p}.router.bias")].to_vec1::<f32>().unwrap(); x.len()],
        );
        let experts3 = |name: &str| self.tensors[&format!("{p}.experts.{name}")].to_vec3::<f32>().unwrap();
        let experts2 = |name: &str| self.tensors[&format!("{p}.experts.{name}")].to_vec2::<f32>().unwrap();
        let (gate_up, down) = (experts3("gate_up_proj"), experts3("down_proj"));
        let (gate_up_bias, down_bias) = (experts2("gate_up_proj_bias"), experts2("down_proj_bias"));
        let limit = layout.limit;
        x.iter()
            .zip(&router)
            .map(|(row, logits)| {
                let chosen = largest(logits, layout.top_k);
                let top = chosen.iter().map(|&e| logits[e]).fold(f32::MIN, f32::max);
                let total: f32 = chosen.iter().map(|&e| (logits[e] - top).exp()).sum();
                let mut out = vec![0f32; row.len()];
                for &e in &chosen {
                    let weight = (logits[e] - top).exp() / total;
                    // [H] · [H, 2I] + b: gate at even columns, up at odd ones.
                    let gu: Vec<f32> = (0..gate_up_bias[e].len())
                        .map(|j| row.iter().zip(&gate_up[e]).map(|(v, w)| v * w[j]).sum::<f32>() + gate_up_bias[e][j])
                        .collect();
                    let act: Vec<f32> = gu
                        .chunks(2)
                        .map(|pair| {
                            let (g, u) = (pair[0].min(limit), pair[1].clamp(-limit, limit));
                            (u + 1.0) * g / (1.0 + (-1.702 * g).exp())
                        })
                        .collect();
                    for (h, o) in out.iter_mut().enumerate() {
                        let y = act.iter().zip(&down[e]).map(|(a, w)| a * w[h]).sum::<f32>() + down_bias[e][h];
                        *o += weight * y;
                    }
                }
                out
            })
            .collect()
    }

    /// SwiGLU under `p` (fused `gate_up_proj` or separate); without a gate, Arcee's
    /// `relu(up)²`, StarCoder2's `gelu_tanh(up)` or, where the layer stores its parameters,
    /// Apertus's xIELU; biases added where the checkpoint has them.
    fn mlp(&self, p: &str, x: &[Vec<f32>]) -> Rows {
        if self.get(&format!("{p}.gate_proj.weight")).is_none()
            && self.get(&format!("{p}.gate_up_proj.weight")).is_none()
        {
            let up = self.biased(p, "up_proj", x);
            let xielu = self.get(&format!("{p}.act_fn.alpha_p")).map(|_| {
                let param = |name: &str| self.tensors[&format!("{p}.act_fn.{name}")].to_vec1::<f32>().unwrap()[0];
                let softplus = |v: f32| (1.0 + v.exp()).ln();
                let beta = param("beta");
                (softplus(param("alpha_p")), beta + softplus(param("alpha_n")), beta, param("eps"))
            });
            let act = |v: f32| match (xielu, self.ungated_gelu, self.exact_gelu) {
                // transformers' XIELUActivation.
                (Some((alpha_p, _, beta, _)), _, _) if v > 0.0 => alpha_p * v * v + beta * v,
                (Some((_, alpha_n, beta, eps)), _, _) => (v.min(eps).exp_m1() - v) * alpha_n + beta * v,
                (None, true, true) => gelu_erf(v),
                (None, true, false) => gelu_tanh(v),
                (None, false, _) => v.max(0.0) * v.max(0.0),
            };
            let act: Rows = up.iter().map(|r| r.iter().map(|&v| act(v)).collect()).collect();
            return self.biased(p, "down_proj", &act);
        }
        let silu = |v: f32| if self.gemma.is_some() { gelu_tanh(v) } else { silu(v) };
        let act: Rows = match self.get(&format!("{p}.gate_up_proj.weight")) {
            Some(fused) => matmul_t(x, fused)
                .iter()
                .map(|r| {
                    let i = r.len() / 2;
                    (0..i).map(|j| silu(r[j]) * r[i + j]).collect()
                })
                .collect(),
            None => {
                let (gate, up) = (self.biased(p, "gate_proj", x), self.biased(p, "up_proj", x));
                gate.iter().zip(&up).map(|(g, u)| g.iter().zip(u).map(|(a, b)| silu(*a) * b).collect()).collect()
            }
        };
        self.biased(p, "down_proj", &act)
    }

    /// Transformers' sparse MoE block: the router's choice (softmax top-k, or DeepSeek-V3's
    /// grouped sigmoid), the weighted sum of the chosen experts, plus a shared expert where there
    /// is one (sigmoid-gated on Qwen2-MoE).
    fn experts(&self, p: &str, x: &[Vec<f32>], routing: &Routing) -> Rows {
        let logits = matmul_t(x, &self.tensors[&format!("{p}.gate.weight")]);
        let mut out = vec![vec![0f32; x[0].len()]; x.len()];
        for (t, l) in logits.iter().enumerate() {
            let softmax = || {
                let top = l.iter().cloned().fold(f32::MIN, f32::max);
                let exp: Vec<f32> = l.iter().map(|v| (v - top).exp()).collect();
                let sum: f32 = exp.iter().sum();
                exp.iter().map(|e| e / sum).collect::<Vec<f32>>()
            };
            let (chosen, weight): (Vec<usize>, Vec<f32>) = match routing.choice {
                Choice::Softmax => {
                    let probs = softmax();
                    let chosen = largest(&probs, routing.top_k);
                    let total: f32 = if routing.norm_topk_prob { chosen.iter().map(|&e| probs[e]).sum() } else { 1.0 };
                    (chosen, probs.iter().map(|p| p / total).collect())
                }
                Choice::BiasedSoftmax => {
                    // transformers' Ernie4_5_MoeSparseMoeBlock (its `moe_norm_min` floor never binds).
                    let probs = softmax();
                    let bias = self.tensors[&format!("{p}.gate.e_score_correction_bias")].to_vec1::<f32>().unwrap();
                    let biased: Vec<f32> = probs.iter().zip(&bias).map(|(s, b)| s + b).collect();
                    let chosen = largest(&biased, routing.top_k);
                    let total: f32 = chosen.iter().map(|&e| probs[e]).sum::<f32>().max(1e-12);
                    (chosen, probs.iter().map(|p| p / total).collect())
                }
                Choice::GroupedSigmoid(n_group, topk_group, scale) => {
                    // transformers' DeepseekV3TopkRouter.
                    let scores: Vec<f32> = l.iter().map(|v| 1.0 / (1.0 + (-v).exp())).collect();
                    let bias = self.tensors[&format!("{p}.gate.e_score_correction_bias")].to_vec1::<f32>().unwrap();
                    let biased: Vec<f32> = scores.iter().zip(&bias).map(|(s, b)| s + b).collect();
                    let size = biased.len() / n_group;
                    let group_scores: Vec<f32> =
                        biased.chunks(size).map(|g| largest(g, 2).into_iter().map(|i| g[i]).sum()).collect();
                    let kept = largest(&group_scores, topk_group);
                    let masked: Vec<f32> =
                        (0..biased.len()).map(|e| if kept.contains(&(e / size)) { biased[e] } else { 0.0 }).collect();
                    let chosen = largest(&masked, routing.top_k);
                    let total: f32 = if routing.norm_topk_prob {
                        chosen.iter().map(|&e| scores[e]).sum::<f32>() + 1e-20
                    } else {
                        1.0
                    };
                    (chosen, scores.iter().map(|s| s / total * scale as f32).collect())
                }
                Choice::InputScaledSigmoid => {
                    // transformers' Llama4TextMoe: sigmoid(top-k logits) scale the experts' input.
                    let chosen = largest(l, routing.top_k);
                    for &e in &chosen {
                        let w = 1.0 / (1.0 + (-l[e]).exp());
                        let scaled: Vec<f32> = x[t].iter().map(|v| v * w).collect();
                        let y = self.mlp(&format!("{p}.experts.{e}"), &[scaled]);
                        for (o, v) in out[t].iter_mut().zip(&y[0]) {
                            *o += v;
                        }
                    }
                    continue;
                }
                Choice::SparseMixer(eps) => {
                    // transformers' `sparsemixer` at inference: mask the logits far below the
                    // best with -inf, softmax, take the best's share; then again without it.
                    let masked_softmax = |scores: &[f32]| -> (usize, f32) {
                        let best = largest(scores, 1)[0];
                        let top = scores[best];
                        let masked: Vec<f32> = scores
                            .iter()
                            .zip(l)
                            .map(|(&s, &orig)| {
                                let far = (top - orig) / orig.abs().max(top) > 2.0 * eps;
                                if far { f32::NEG_INFINITY } else { s }
                            })
                            .collect();
                        let exp: Vec<f32> = masked.iter().map(|v| (v - top).exp()).collect();
                        (best, exp[best] / exp.iter().sum::<f32>())
                    };
                    let (first, w1) = masked_softmax(l);
                    let mut without = l.clone();
                    without[first] = f32::NEG_INFINITY;
                    let (second, w2) = masked_softmax(&without);
                    let mut weight = vec![0f32; l.len()];
                    (weight[first], weight[second]) = (w1, w2);
                    (vec![first, second], weight)
                }
                Choice::GroupedSoftmax(n_group, topk_group, scale) => {
                    // DeepSeek-V2's MoEGate (`group_limited_greedy`): a group scores its best.
                    let probs = softmax();
                    let size = probs.len() / n_group;
                    let group_scores: Vec<f32> =
                        probs.chunks(size).map(|g| g.iter().cloned().fold(f32::MIN, f32::max)).collect();
                    let kept = largest(&group_scores, topk_group);
                    let masked: Vec<f32> =
                        (0..probs.len()).map(|e| if kept.contains(&(e / size)) { probs[e] } else { 0.0 }).collect();
                    let chosen = largest(&masked, routing.top_k);
                    let factor = if routing.norm_topk_prob && routing.top_k > 1 {
                        1.0 / (chosen.iter().map(|&e| probs[e]).sum::<f32>() + 1e-20)
                    } else {
                        scale as f32
                    };
                    (chosen, probs.iter().map(|p| p * factor).collect())
                }
            };
            for e in chosen {
                let y = self.mlp(&format!("{p}.experts.{e}"), &x[t..=t]);
                for (o, v) in out[t].iter_mut().zip(&y[0]) {
                    *o += weight[e] * v;
                }
            }
        }
        if self.get(&format!("{p}.shared_expert_gate.weight")).is_some() {
            let shared = self.mlp(&format!("{p}.shared_expert"), x);
            let gate = matmul_t(x, &self.tensors[&format!("{p}.shared_expert_gate.weight")]);
            for t in 0..x.len() {
                let g = 1.0 / (1.0 + (-gate[t][0]).exp());
                for (o, v) in out[t].iter_mut().zip(&shared[t]) {
                    *o += g * v;
                }
            }
        }
        if self.get(&format!("{p}.shared_experts.gate_proj.weight")).is_some() {
            out = add(&out, &self.mlp(&format!("{p}.shared_experts"), x));
        }
        out
    }

    /// Logits of every token of `ids`.
    pub fn logits(&self, ids: &[u32]) -> Rows {
        let embed = host(&self.tensors["model.embed_tokens.weight"]);
        let embed_scale = match (&self.gemma, &self.multipliers) {
            (Some(_), _) => (self.shape.hidden as f32).sqrt(),
            (None, Some(m)) => m.embedding,
            (None, None) => 1.0,
        };
        let residual = self.multipliers.as_ref().map_or(1.0, |m| m.residual);
        let scaled =
            |h: Rows| -> Rows { h.into_iter().map(|r| r.into_iter().map(|v| v * residual).collect()).collect() };
        let mut x: Rows = ids.iter().map(|&i| embed[i as usize].iter().map(|v| v * embed_scale).collect()).collect();
        // Learned absolute positions (GPT-BigCode), token `t` at position `t`.
        if let Some(table) = self.get("model.embed_positions.weight") {
            x = add(&x, &host(table)[..ids.len()]);
        }
        // BLOOM's LayerNorm over the embeddings.
        if self.get("model.embed_norm.weight").is_some() {
            x = self.rms(&x, "model.embed_norm.weight");
        }
        // Norms around attention and MLP (Gemma, GLM-4) under Gemma's names, or after them only
        // (OLMo 2: no input norms).
        let sandwich = self.get("model.layers.0.pre_feedforward_layernorm.weight").is_some();
        let post_only = !self.weightless_norms && self.get("model.layers.0.input_layernorm.weight").is_none();
        for l in 0..self.shape.layers {
            let p = format!("model.layers.{l}");
            let attention_in = if post_only { x.clone() } else { self.rms(&x, &format!("{p}.input_layernorm.weight")) };
            let mut attended = self.attention(&format!("{p}.self_attn"), &attention_in, l);
            if self.parallel {
                let mlp_in = match self.parallel_mlp_norm {
                    true => self.rms(&x, &format!("{p}.post_attention_layernorm.weight")),
                    false => attention_in.clone(),
                };
                let mlp = self.mlp(&format!("{p}.mlp"), &mlp_in);
                x = add(&add(&x, &attended), &mlp);
                continue;
            }
            if sandwich || post_only {
                attended = self.rms(&attended, &format!("{p}.post_attention_layernorm.weight"));
            }
            x = add(&x, &scaled(attended));
            let mlp_norm = if sandwich { "pre_feedforward_layernorm" } else { "post_attention_layernorm" };
            let normed = if post_only { x.clone() } else { self.rms(&x, &format!("{p}.{mlp_norm}.weight")) };
            let ff = match (&self.routing, &self.gpt_oss) {
                (_, Some(layout)) => self.gpt_oss_experts(&format!("{p}.mlp"), &normed, layout),
                (Some(r), _) if self.get(&format!("{p}.mlp.gate.weight")).is_some() => {
                    self.experts(&format!("{p}.mlp"), &normed, r)
                }
                _ => self.mlp(&format!("{p}.mlp"), &normed),
            };
            let ff = if sandwich || post_only {
                self.rms(&ff, &format!("{p}.post_feedforward_layernorm.weight"))
            } else {
                ff
            };
            x = add(&x, &scaled(ff));
        }
        let head = self.get("lm_head.weight").unwrap_or(&self.tensors["model.embed_tokens.weight"]);
        let divisor = self.multipliers.as_ref().map_or(1.0, |m| m.logits_divisor);
        let logits = matmul_t(&self.rms(&x, "model.norm.weight"), head);
        let logits = match self.get("lm_head.bias") {
            Some(b) => add(&logits, &vec![b.to_vec1::<f32>().unwrap(); logits.len()]),
            None => logits,
        };
        let final_cap = self.gemma.as_ref().and_then(|g| g.softcaps).map(|(_, cap)| cap);
        let finish = |v: f32| final_cap.map_or(v / divisor, |cap| soft_cap(v / divisor, cap));
        logits.into_iter().map(|r| r.into_iter().map(finish).collect()).collect()
    }
}

/// The largest elementwise gap between two sets of logit rows.
pub fn max_gap(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    a.iter().flatten().zip(b.iter().flatten()).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max)
}

/// Every row within 2e-4 of its reference row (f32 rounding).
pub fn assert_close(got: &[Vec<f32>], want: &[Vec<f32>], what: &str) {
    assert_within(got, want, 2e-4, what);
}

/// Every row within `tolerance` of its reference row.
pub fn assert_within(got: &[Vec<f32>], want: &[Vec<f32>], tolerance: f32, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: rows");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let diff = g.iter().zip(w).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(diff < tolerance, "{what}: token {i} differs by {diff}");
    }
}

/// llama.cpp's row permutation of a Llama q/k projection: GGUF row `h·d + 2i + j` holds
/// Hugging Face row `h·d + j·(d/2) + i`.
pub fn llama_cpp_permuted(t: &Tensor, heads: usize) -> Tensor {
    let d = t.dim(0).unwrap() / heads;
    let rows: Vec<u32> = (0..heads)
        .flat_map(|h| (0..d / 2).flat_map(move |i| (0..2).map(move |j| (h * d + j * (d / 2) + i) as u32)))
        .collect();
    t.index_select(&Tensor::new(rows.as_slice(), &Device::Cpu).unwrap(), 0).unwrap()
}

/// Writes a dense Llama-layout checkpoint (Hugging Face names) as llama.cpp's converter writes
/// a Llama-derived family `arch` (`llama`, `internlm2`, `granite`): f32 tensors under GGUF
/// names, q and k rows permuted, the shape as metadata, and `extra` metadata.
pub fn write_llama_layout_gguf(
    path: &Path,
    arch: &str,
    shape: &TinyShape,
    tensors: &HashMap<String, Tensor>,
    extra: &[(&str, GgufValue)],
) {
    let named: Vec<(String, QTensor)> = tensors
        .iter()
        .map(|(name, t)| {
            let t = if name.ends_with("q_proj.weight") {
                llama_cpp_permuted(t, shape.heads)
            } else if name.ends_with("k_proj.weight") {
                llama_cpp_permuted(t, shape.kv_heads)
            } else {
                t.clone()
            };
            let gguf = gguf_name(name).unwrap_or_else(|| panic!("{name} has a GGUF name"));
            (gguf, QTensor::quantize(&t, GgmlDType::F32).unwrap())
        })
        .collect();
    write_gguf(path, arch, shape, &named, extra);
}

/// Writes a checkpoint as llama.cpp's converter writes a family whose q/k rows it keeps as they
/// are (`arch`: `gemma2`, `gemma3`, `glm4` renamed to Gemma's norm names, `olmo2`,
/// `command-r`, `cohere2`): f32 tensors, Gemma's norms under llama.cpp's names
/// (`post_attention_norm`, `ffn_norm` before the MLP, `post_ffw_norm`), stored as their scale
/// (`1 + weight`) when `norms_as_scale` (Gemma), the shape as metadata, and `extra` metadata.
pub fn write_unpermuted_gguf(
    path: &Path,
    arch: &str,
    shape: &TinyShape,
    tensors: &HashMap<String, Tensor>,
    norms_as_scale: bool,
    extra: &[(&str, GgufValue)],
) {
    let name = |hf: &str| -> String {
        let renamed = hf
            .replace(".post_attention_layernorm.", ".post_attention_NORM.")
            .replace(".pre_feedforward_layernorm.", ".ffn_NORM.")
            .replace(".post_feedforward_layernorm.", ".post_ffw_NORM.");
        match renamed.split_once("_NORM.") {
            Some((head, _)) => format!("{}_norm.weight", head.replace("model.layers.", "blk.")),
            None => gguf_name(hf).unwrap_or_else(|| panic!("{hf} has a GGUF name")),
        }
    };
    let named: Vec<(String, QTensor)> = tensors
        .iter()
        .map(|(n, t)| {
            let t = if norms_as_scale && n.ends_with("norm.weight") { (t + 1.0).unwrap() } else { t.clone() };
            (name(n), QTensor::quantize(&t, GgmlDType::F32).unwrap())
        })
        .collect();
    write_gguf(path, arch, shape, &named, extra);
}

/// A tensor as an f32 GGUF tensor.
pub fn gguf_f32(t: &Tensor) -> QTensor {
    QTensor::quantize(&t.contiguous().unwrap(), GgmlDType::F32).unwrap()
}

/// The tensors (all but those `skip` names) in f32 under their GGUF names, as llama.cpp's
/// converter writes a family whose rows it keeps as they are; norms stored as their scale
/// (`1 + weight`) when `norms_as_scale` (Gemma, Nemotron's LayerNorm1P).
pub fn gguf_named(
    tensors: &HashMap<String, Tensor>,
    skip: impl Fn(&str) -> bool,
    norms_as_scale: bool,
) -> Vec<(String, QTensor)> {
    tensors
        .iter()
        .filter(|(name, _)| !skip(name))
        .map(|(name, t)| {
            let t = if norms_as_scale && name.ends_with("norm.weight") { (t + 1.0).unwrap() } else { t.clone() };
            (gguf_name(name).unwrap_or_else(|| panic!("{name} has a GGUF name")), gguf_f32(&t))
        })
        .collect()
}

/// Each layer's q, k and v projections (weight, and bias where they have one) as one
/// `attn_qkv`, all q rows, then k, then v, as llama.cpp's converter writes Phi-2's, GPT-NeoX's
/// and Falcon's.
pub fn gguf_fused_qkv(tensors: &HashMap<String, Tensor>, layers: usize) -> Vec<(String, QTensor)> {
    let mut named = Vec::new();
    for l in 0..layers {
        for part in ["weight", "bias"] {
            let Some(qkv) = ["q", "k", "v"]
                .iter()
                .map(|x| tensors.get(&format!("model.layers.{l}.self_attn.{x}_proj.{part}")).cloned())
                .collect::<Option<Vec<Tensor>>>()
            else {
                continue;
            };
            named.push((format!("blk.{l}.attn_qkv.{part}"), gguf_f32(&Tensor::cat(&qkv, 0).unwrap())));
        }
    }
    named
}

/// The q, k and v projections, which [`gguf_fused_qkv`] writes as one.
pub fn is_q_k_or_v(name: &str) -> bool {
    ["q_proj", "k_proj", "v_proj"].iter().any(|p| name.contains(&format!("self_attn.{p}.")))
}

/// A mixture's tensors as llama.cpp's converter writes them, in f32: each under its GGUF name,
/// and the experts of every layer in `sparse_layers` stacked into `ffn_{gate,up,down}_exps`.
pub fn gguf_with_stacked_experts(
    tensors: &HashMap<String, Tensor>,
    sparse_layers: impl IntoIterator<Item = usize>,
    experts: usize,
) -> Vec<(String, QTensor)> {
    let mut named = gguf_named(tensors, |name| name.contains(".mlp.experts."), false);
    for l in sparse_layers {
        for (proj, short) in [("gate_proj", "gate"), ("up_proj", "up"), ("down_proj", "down")] {
            let stacked: Vec<Tensor> = (0..experts)
                .map(|e| tensors[&format!("model.layers.{l}.mlp.experts.{e}.{proj}.weight")].clone())
                .collect();
            named.push((format!("blk.{l}.ffn_{short}_exps.weight"), gguf_f32(&Tensor::stack(&stacked, 0).unwrap())));
        }
    }
    named
}

/// Writes `named` tensors with the metadata llama.cpp's converter gives a dense `arch` of
/// `shape` (head dims as both `attention.key_length` and `rope.dimension_count`), then `extra`
/// (which replaces any of those keys it names).
pub fn write_gguf(
    path: &Path,
    arch: &str,
    shape: &TinyShape,
    named: &[(String, QTensor)],
    extra: &[(&str, GgufValue)],
) {
    let u32v = |x: usize| GgufValue::U32(x as u32);
    let mut metadata: Vec<(String, GgufValue)> = vec![
        ("general.architecture".into(), GgufValue::String(arch.into())),
        (format!("{arch}.embedding_length"), u32v(shape.hidden)),
        (format!("{arch}.feed_forward_length"), u32v(shape.intermediate)),
        (format!("{arch}.block_count"), u32v(shape.layers)),
        (format!("{arch}.attention.head_count"), u32v(shape.heads)),
        (format!("{arch}.attention.head_count_kv"), u32v(shape.kv_heads)),
        (format!("{arch}.attention.key_length"), u32v(shape.head_dim)),
        (format!("{arch}.rope.dimension_count"), u32v(shape.head_dim)),
        (format!("{arch}.context_length"), u32v(512)),
        (format!("{arch}.attention.layer_norm_rms_epsilon"), GgufValue::F32(1e-5)),
        (format!("{arch}.rope.freq_base"), GgufValue::F32(10_000.0)),
        (format!("{arch}.vocab_size"), u32v(shape.vocab)),
    ];
    metadata.retain(|(key, _)| !extra.iter().any(|(k, _)| k == key));
    metadata.extend(extra.iter().map(|(k, v)| (k.to_string(), v.clone())));
    let metadata: Vec<(&str, &GgufValue)> = metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let named: Vec<(&str, &QTensor)> = named.iter().map(|(n, t)| (n.as_str(), t)).collect();
    gguf_file::write(&mut std::fs::File::create(path).unwrap(), &metadata, &named).unwrap();
}
