//! A trainable EAGLE-3 head, with the weight names of the speculators `eagle3` format so the
//! engine's normal loader reads what training writes.
//!
//! Training-time test (TTT): the head is unrolled `steps` times over a whole sequence at once.
//! Step 0 pairs `fc(taps_t)` with the token `x_{t+1}` at position `t`; step `s` continues the
//! chain anchored at `t` from step `s - 1`'s output with the true token `x_{t+s+1}`, at position
//! `t + s`, exactly as inference chains drafts. A chain's query at step `s` sees the step-0
//! keys of positions `<= t` and its own keys of steps `1..=s` (the diagonal), as the draft's
//! KV cache holds at inference. Step `s` at anchor `t` predicts `x_{t+s+2}`.
//!
//! Layers past the first (`num_layers > 1`, vLLM's layers `i > 0`) are ordinary pre-norm
//! decoder layers over the first one's output, each with its own keys; their output
//! projections start at zero, so a head grown from a trained one starts out drafting exactly
//! as it did.

use candle_core::{D, DType, Device, Result, Tensor};
use candle_nn::{Init, Linear, Module, VarBuilder};

/// Shape of the head.
#[derive(Debug, Clone, PartialEq)]
pub struct Eagle3Shape {
    pub hidden: usize,
    pub num_taps: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub intermediate: usize,
    /// Decoder layers: the fused first one plus `num_layers - 1` ordinary ones.
    pub num_layers: usize,
    pub draft_vocab: usize,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub max_positions: usize,
}

pub struct TrainableEagle3 {
    pub shape: Eagle3Shape,
    fc: Linear,
    input_layernorm: Tensor,
    hidden_norm: Tensor,
    /// The first layer's attention (over `[embedding | hidden]`, 2H wide) and MLP.
    first: LayerWeights,
    /// Layers `1..num_layers`: `input_layernorm` and an H-wide layer.
    extra: Vec<(Tensor, LayerWeights)>,
    norm: Tensor,
    lm_head: Linear,
    /// `[max_positions, head_dim]`: cos/sin, halves duplicated (rotate-half layout).
    cos: Tensor,
    sin: Tensor,
}

/// One decoder layer's attention and MLP (its input norms are the caller's).
struct LayerWeights {
    post_attention_layernorm: Tensor,
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    o_proj: Linear,
    gate_proj: Linear,
    up_proj: Linear,
    down_proj: Linear,
}

impl LayerWeights {
    /// The layer under `vb` with attention inputs `attn_in` wide. With `identity`, the output
    /// projections start at zero: the layer adds nothing to its residual until trained.
    fn new(vb: &VarBuilder, shape: &Eagle3Shape, attn_in: usize, identity: bool) -> Result<Self> {
        let (h, d) = (shape.hidden, shape.head_dim);
        let output = |out: usize, inp: usize, name: &str| -> Result<Linear> {
            if identity {
                Ok(Linear::new(vb.get_with_hints((out, inp), &format!("{name}.weight"), Init::Const(0.0))?, None))
            } else {
                linear(vb, out, inp, name)
            }
        };
        Ok(Self {
            post_attention_layernorm: vb.get_with_hints(h, "post_attention_layernorm.weight", Init::Const(1.0))?,
            q_proj: linear(vb, shape.heads * d, attn_in, "self_attn.q_proj")?,
            k_proj: linear(vb, shape.kv_heads * d, attn_in, "self_attn.k_proj")?,
            v_proj: linear(vb, shape.kv_heads * d, attn_in, "self_attn.v_proj")?,
            o_proj: output(h, shape.heads * d, "self_attn.o_proj")?,
            gate_proj: linear(vb, shape.intermediate, h, "mlp.gate_proj")?,
            up_proj: linear(vb, shape.intermediate, h, "mlp.up_proj")?,
            down_proj: output(h, shape.intermediate, "mlp.down_proj")?,
        })
    }
}

fn rms_norm(x: &Tensor, w: &Tensor, eps: f64) -> Result<Tensor> {
    // Differentiable RMSNorm (candle's fused op has no backward).
    let h = x.dim(D::Minus1)? as f64;
    let ms = (x.sqr()?.sum_keepdim(D::Minus1)? / h)?;
    x.broadcast_div(&(ms + eps)?.sqrt()?)?.broadcast_mul(w)
}

fn linear(vb: &VarBuilder, out: usize, inp: usize, name: &str) -> Result<Linear> {
    let std = (1.0 / inp as f64).sqrt();
    let w = vb.get_with_hints((out, inp), &format!("{name}.weight"), Init::Randn { mean: 0.0, stdev: std })?;
    Ok(Linear::new(w, None))
}

/// `x [heads, n, d]` rotated at the rows `positions` of the tables.
fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    let d = x.dim(D::Minus1)?;
    let x1 = x.narrow(D::Minus1, 0, d / 2)?;
    let x2 = x.narrow(D::Minus1, d / 2, d / 2)?;
    let rotated = Tensor::cat(&[&x2.neg()?, &x1], D::Minus1)?;
    x.broadcast_mul(cos)? + rotated.broadcast_mul(sin)?
}

impl TrainableEagle3 {
    /// Creates the variables in `vb` (or reuses those of a loaded VarMap).
    pub fn new(vb: VarBuilder, shape: Eagle3Shape) -> Result<Self> {
        let (h, d) = (shape.hidden, shape.head_dim);
        let ones = |name: &str, n: usize| vb.get_with_hints(n, name, Init::Const(1.0));
        let layer = vb.pp("layers.0");
        let half = d / 2;
        let inv: Vec<f32> =
            (0..half).map(|i| (1.0 / shape.rope_theta.powf(2.0 * i as f64 / d as f64)) as f32).collect();
        let mut cos = Vec::with_capacity(shape.max_positions * d);
        let mut sin = Vec::with_capacity(shape.max_positions * d);
        for p in 0..shape.max_positions {
            // Both halves of the rotate-half layout share the frequencies.
            for _half in 0..2 {
                for f in &inv {
                    let a = p as f64 * *f as f64;
                    cos.push(a.cos() as f32);
                    sin.push(a.sin() as f32);
                }
            }
        }
        let dev = vb.device();
        Ok(Self {
            fc: linear(&vb, h, shape.num_taps * h, "fc")?,
            input_layernorm: ones("layers.0.input_layernorm.weight", h)?,
            hidden_norm: ones("layers.0.hidden_norm.weight", h)?,
            first: LayerWeights::new(&layer, &shape, 2 * h, false)?,
            extra: (1..shape.num_layers)
                .map(|i| {
                    let vb = vb.pp(format!("layers.{i}"));
                    Ok((
                        vb.get_with_hints(h, "input_layernorm.weight", Init::Const(1.0))?,
                        LayerWeights::new(&vb, &shape, h, true)?,
                    ))
                })
                .collect::<Result<_>>()?,
            norm: ones("norm.weight", h)?,
            lm_head: linear(&vb, shape.draft_vocab, h, "lm_head")?,
            cos: Tensor::from_vec(cos, (shape.max_positions, d), dev)?,
            sin: Tensor::from_vec(sin, (shape.max_positions, d), dev)?,
            shape,
        })
    }

    fn tables(&self, first: usize, n: usize) -> Result<(Tensor, Tensor)> {
        Ok((self.cos.narrow(0, first, n)?, self.sin.narrow(0, first, n)?))
    }

    /// `[n, heads*d] -> [heads, n, d]`.
    fn split_heads(x: &Tensor, heads: usize, d: usize) -> Result<Tensor> {
        let n = x.dim(0)?;
        x.reshape((n, heads, d))?.transpose(0, 1)?.contiguous()
    }

    fn repeat_kv(&self, x: &Tensor) -> Result<Tensor> {
        let group = self.shape.heads / self.shape.kv_heads;
        if group == 1 {
            return Ok(x.clone());
        }
        let (kv, n, d) = x.dims3()?;
        x.unsqueeze(1)?.broadcast_as((kv, group, n, d))?.reshape((kv * group, n, d))
    }

    /// Unrolls the head over one sequence: `taps [n, num_taps*H]`, `tokens [n]`, `embed` the
    /// frozen target embedding. Returns per step `s` the draft logits `[n - 1 - s - first_anchor,
    /// Vd]` of the chains anchored at `t = first_anchor..n-1-s` (predicting `x_{t+s+2}`).
    /// Positions before `first_anchor` only serve as step-0 keys: training skips the chains whose
    /// every prediction lies in the prompt, which would be masked out of the loss anyway.
    pub fn forward_ttt(
        &self,
        taps: &Tensor,
        tokens: &[u32],
        embed: &Tensor,
        steps: usize,
        first_anchor: usize,
    ) -> Result<Vec<Tensor>> {
        let n = tokens.len();
        let a = first_anchor;
        let eps = self.shape.rms_norm_eps;
        let dev = taps.device().clone();
        let ids = Tensor::from_slice(tokens, n, &dev)?;
        let emb_all = embed.index_select(&ids, 0)?; // [n, H], frozen
        let layers = 1 + self.extra.len();
        // Step 0 runs over every anchor t = 0..n-2 for its keys; later rows start at `a`.
        let mut hidden = self.fc.forward(taps)?.narrow(0, 0, n - 1)?;
        // Per layer: the step-0 keys and values of every anchor, and those of each later step.
        let mut step0_kv: Vec<Option<(Tensor, Tensor)>> = vec![None; layers];
        let mut chain_kv: Vec<Vec<(Tensor, Tensor)>> = vec![Vec::new(); layers];
        let mut outputs = Vec::with_capacity(steps);
        for s in 0..steps.min(n - 1) {
            let m = n - 1 - s;
            if a >= m {
                break;
            }
            let rows = m - a; // chains anchored at t = a..m-1
            // 1. Rows embedded (keys) and rows queried. Step 0 keys every anchor; it queries only
            //    the kept chains, unless a later layer needs every anchor's output for its keys.
            let (first, count) = if s == 0 { (0, m) } else { (a, rows) };
            let queried = if s == 0 && layers == 1 { (a, rows) } else { (first, count) };
            let h_in = if s == 0 { hidden.clone() } else { hidden.narrow(0, 0, rows)? };
            let emb = emb_all.narrow(0, s + 1 + first, count)?;
            let attn_in = Tensor::cat(
                &[rms_norm(&emb, &self.input_layernorm, eps)?, rms_norm(&h_in, &self.hidden_norm, eps)?],
                D::Minus1,
            )?;
            // 2. The fused first layer (residual: the un-normed hidden), then the others.
            let keyed = Keyed { step: s, first, count, queried, n };
            let mut x = self.block(&self.first, &attn_in, &h_in, &keyed, &mut step0_kv[0], &mut chain_kv[0])?;
            for (i, (input_layernorm, layer)) in self.extra.iter().enumerate() {
                let normed = rms_norm(&x, input_layernorm, eps)?;
                let keyed = Keyed { first: queried.0, count: queried.1, ..keyed };
                x = self.block(layer, &normed, &x, &keyed, &mut step0_kv[i + 1], &mut chain_kv[i + 1])?;
            }
            if queried.1 != rows {
                x = x.narrow(0, a - queried.0, rows)?;
            }
            outputs.push(self.lm_head.forward(&rms_norm(&x, &self.norm, eps)?)?);
            hidden = x;
        }
        Ok(outputs)
    }

    /// One decoder layer at TTT step `keyed.step`: keys and values of the `keyed` rows of
    /// `attn_in` (stored as the step-0 ones or appended to the chain's), attention of the
    /// queried rows over the step-0 keys (causal) and the chain's own keys (the diagonal),
    /// residual, MLP. Returns the queried rows' output `[queried.1, H]`.
    fn block(
        &self,
        layer: &LayerWeights,
        attn_in: &Tensor,
        residual: &Tensor,
        keyed: &Keyed,
        step0_kv: &mut Option<(Tensor, Tensor)>,
        chain_kv: &mut Vec<(Tensor, Tensor)>,
    ) -> Result<Tensor> {
        let Eagle3Shape { heads, kv_heads, head_dim: d, rms_norm_eps: eps, .. } = self.shape;
        let scale = (d as f64).powf(-0.5);
        let &Keyed { step: s, first, count, queried: (q_first, q_count), n } = keyed;
        let dev = attn_in.device();
        // Keys at positions t + s of the keyed anchors.
        let (cos, sin) = self.tables(s + first, count)?;
        let k = rope(&Self::split_heads(&layer.k_proj.forward(attn_in)?, kv_heads, d)?, &cos, &sin)?;
        let v = Self::split_heads(&layer.v_proj.forward(attn_in)?, kv_heads, d)?;
        let (k, v) = (self.repeat_kv(&k)?, self.repeat_kv(&v)?);
        let (q_in, residual) = if (q_first, q_count) == (first, count) {
            (attn_in.clone(), residual.clone())
        } else {
            (attn_in.narrow(0, q_first - first, q_count)?, residual.narrow(0, q_first - first, q_count)?)
        };
        let (cos, sin) = self.tables(s + q_first, q_count)?;
        let q = rope(&Self::split_heads(&layer.q_proj.forward(&q_in)?, heads, d)?, &cos, &sin)?;
        if s == 0 {
            *step0_kv = Some((k, v));
        } else {
            chain_kv.push((k, v));
        }
        let (k0, v0) = step0_kv.as_ref().expect("set at step 0");
        // Scores: causal over step-0 keys (anchor t sees t' <= t), plus the diagonal of every
        // chain step so far (this chain's own keys).
        let s0 = (q.matmul(&k0.t()?)? * scale)?; // [heads, q_count, n-1]
        let s0 = s0.broadcast_add(&causal_mask(q_count, n - 1, q_first, dev)?)?;
        let mut parts = vec![s0];
        for (kj, _) in chain_kv.iter() {
            parts.push(((&q * kj.narrow(1, 0, q_count)?)?.sum_keepdim(D::Minus1)? * scale)?);
        }
        let probs = candle_nn::ops::softmax(&Tensor::cat(&parts, D::Minus1)?, D::Minus1)?;
        let mut attn = probs.narrow(D::Minus1, 0, n - 1)?.matmul(v0)?;
        for (j, (_, vj)) in chain_kv.iter().enumerate() {
            let pj = probs.narrow(D::Minus1, n - 1 + j, 1)?;
            attn = (attn + pj.broadcast_mul(&vj.narrow(1, 0, q_count)?)?)?;
        }
        let attn = attn.transpose(0, 1)?.reshape((q_count, heads * d))?;
        // Residual, MLP.
        let x = (residual + layer.o_proj.forward(&attn)?)?;
        let hmlp = rms_norm(&x, &layer.post_attention_layernorm, eps)?;
        let mlp = layer
            .down_proj
            .forward(&(candle_nn::ops::silu(&layer.gate_proj.forward(&hmlp)?)? * layer.up_proj.forward(&hmlp)?)?)?;
        x + mlp
    }
}

/// Which rows a layer keys and queries at a TTT step: anchors `first..first + count` get keys,
/// `queried.0..queried.0 + queried.1` (within them) get queries; `n` tokens in the sequence.
#[derive(Clone, Copy)]
struct Keyed {
    step: usize,
    first: usize,
    count: usize,
    queried: (usize, usize),
    n: usize,
}

/// `[rows, cols]`: 0 where key `j <= first_row + i`, -inf elsewhere.
fn causal_mask(rows: usize, cols: usize, first_row: usize, dev: &Device) -> Result<Tensor> {
    let mut v = vec![0f32; rows * cols];
    for i in 0..rows {
        for j in first_row + i + 1..cols {
            v[i * cols + j] = f32::NEG_INFINITY;
        }
    }
    Tensor::from_vec(v, (rows, cols), dev)
}

/// Soft cross-entropy of draft logits against target probabilities over the draft vocabulary,
/// averaged over the rows where `mask` is 1. Returns `(loss, top-1 agreements, rows)`.
pub fn soft_cross_entropy(logits: &Tensor, target_probs: &Tensor, mask: &Tensor) -> Result<(Tensor, f64, f64)> {
    let logp = candle_nn::ops::log_softmax(logits, D::Minus1)?;
    let per_row = (target_probs * logp)?.sum(D::Minus1)?.neg()?; // [rows]
    let rows = mask.sum_all()?.to_scalar::<f32>()? as f64;
    let loss = (per_row * mask)?.sum_all()?.affine(1.0 / rows.max(1.0), 0.0)?;
    let agree = logits
        .argmax(D::Minus1)?
        .eq(&target_probs.argmax(D::Minus1)?)?
        .to_dtype(DType::F32)?
        .mul(mask)?
        .sum_all()?
        .to_scalar::<f32>()? as f64;
    Ok((loss, agree, rows))
}

#[cfg(test)]
mod tests {
    use candle_nn::VarMap;

    use super::*;

    fn tiny_head() -> (VarMap, TrainableEagle3) {
        tiny_head_of(1)
    }

    fn tiny_head_of(num_layers: usize) -> (VarMap, TrainableEagle3) {
        let shape = Eagle3Shape {
            hidden: 16,
            num_taps: 3,
            heads: 4,
            kv_heads: 2,
            head_dim: 4,
            intermediate: 24,
            num_layers,
            draft_vocab: 32,
            rms_norm_eps: 1e-5,
            rope_theta: 10_000.0,
            max_positions: 64,
        };
        let varmap = VarMap::new();
        let head = TrainableEagle3::new(VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu), shape).unwrap();
        (varmap, head)
    }

    fn inputs(n: usize) -> (Tensor, Tensor, Vec<u32>) {
        let taps = Tensor::randn(0f32, 1.0, (n, 48), &Device::Cpu).unwrap();
        let embed = Tensor::randn(0f32, 1.0, (40, 16), &Device::Cpu).unwrap();
        let tokens: Vec<u32> = (0..n as u32).map(|i| (i * 7 + 3) % 40).collect();
        (taps, embed, tokens)
    }

    #[test]
    fn a_grown_head_drafts_exactly_like_the_head_it_grew_from() {
        let (small_vars, small) = tiny_head_of(1);
        let (grown_vars, grown) = tiny_head_of(3);
        let small_data = small_vars.data().lock().unwrap();
        for (name, var) in grown_vars.data().lock().unwrap().iter() {
            if let Some(w) = small_data.get(name) {
                var.set(w.as_tensor()).unwrap();
            }
        }
        let (taps, embed, tokens) = inputs(10);
        let a = small.forward_ttt(&taps, &tokens, &embed, 3, 2).unwrap();
        let b = grown.forward_ttt(&taps, &tokens, &embed, 3, 2).unwrap();
        for (s, (a, b)) in a.iter().zip(&b).enumerate() {
            let diff = specrs_models::testing::max_abs_diff(a, b).unwrap();
            assert_eq!(diff, 0.0, "step {s}: new layers start as identities, off by {diff}");
        }
    }

    #[test]
    fn skipping_prompt_anchors_leaves_a_deep_heads_logits_unchanged() {
        let (vars, head) = tiny_head_of(2);
        // Give the second layer's output projections weight, so it changes what it passes on.
        for (name, var) in vars.data().lock().unwrap().iter() {
            if name.starts_with("layers.1.") && (name.contains("o_proj") || name.contains("down_proj")) {
                var.set(&Tensor::randn(0f32, 0.3, var.dims(), &Device::Cpu).unwrap()).unwrap();
            }
        }
        let n = 12;
        let (taps, embed, tokens) = inputs(n);
        let all = head.forward_ttt(&taps, &tokens, &embed, 3, 0).unwrap();
        let kept = head.forward_ttt(&taps, &tokens, &embed, 3, 4).unwrap();
        for (s, (full, part)) in all.iter().zip(&kept).enumerate() {
            assert_eq!(part.dims(), [n - 1 - s - 4, 32]);
            let diff = specrs_models::testing::max_abs_diff(&full.narrow(0, 4, n - 5 - s).unwrap(), part).unwrap();
            assert!(diff < 1e-5, "step {s}: kept chains differ by {diff}");
        }
    }

    #[test]
    fn skipping_prompt_anchors_leaves_the_kept_chains_logits_unchanged() {
        let (_vars, head) = tiny_head();
        let n = 12;
        let taps = Tensor::randn(0f32, 1.0, (n, 48), &Device::Cpu).unwrap();
        let embed = Tensor::randn(0f32, 1.0, (40, 16), &Device::Cpu).unwrap();
        let tokens: Vec<u32> = (0..n as u32).map(|i| (i * 7 + 3) % 40).collect();
        let all = head.forward_ttt(&taps, &tokens, &embed, 3, 0).unwrap();
        let kept = head.forward_ttt(&taps, &tokens, &embed, 3, 4).unwrap();
        assert_eq!(kept.len(), 3);
        for (s, (full, part)) in all.iter().zip(&kept).enumerate() {
            assert_eq!(full.dims(), [n - 1 - s, 32]);
            assert_eq!(part.dims(), [n - 1 - s - 4, 32]);
            let diff = specrs_models::testing::max_abs_diff(&full.narrow(0, 4, n - 5 - s).unwrap(), part).unwrap();
            assert!(diff < 1e-5, "step {s}: kept chains differ by {diff}");
        }
        // Anchors past the last chain of a step end the unrolling there.
        assert_eq!(head.forward_ttt(&taps, &tokens, &embed, 3, 10).unwrap().len(), 1);
    }
}
