//! A trainable EAGLE-3 head, with the weight names of the speculators `eagle3` format so the
//! engine's normal loader reads what training writes.
//!
//! Training-time test (TTT): the head is unrolled `steps` times over a whole sequence at once.
//! Step 0 pairs `fc(taps_t)` with the token `x_{t+1}` at position `t`; step `s` continues the
//! chain anchored at `t` from step `s - 1`'s output with the true token `x_{t+s+1}`, at position
//! `t + s`, exactly as inference chains drafts. A chain's query at step `s` sees the step-0
//! keys of positions `<= t` and its own keys of steps `1..=s` (the diagonal), as the draft's
//! KV cache holds at inference. Step `s` at anchor `t` predicts `x_{t+s+2}`.

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
    post_attention_layernorm: Tensor,
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    o_proj: Linear,
    gate_proj: Linear,
    up_proj: Linear,
    down_proj: Linear,
    norm: Tensor,
    lm_head: Linear,
    /// `[max_positions, head_dim]`: cos/sin, halves duplicated (rotate-half layout).
    cos: Tensor,
    sin: Tensor,
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
            post_attention_layernorm: ones("layers.0.post_attention_layernorm.weight", h)?,
            q_proj: linear(&layer, shape.heads * d, 2 * h, "self_attn.q_proj")?,
            k_proj: linear(&layer, shape.kv_heads * d, 2 * h, "self_attn.k_proj")?,
            v_proj: linear(&layer, shape.kv_heads * d, 2 * h, "self_attn.v_proj")?,
            o_proj: linear(&layer, h, shape.heads * d, "self_attn.o_proj")?,
            gate_proj: linear(&layer, shape.intermediate, h, "mlp.gate_proj")?,
            up_proj: linear(&layer, shape.intermediate, h, "mlp.up_proj")?,
            down_proj: linear(&layer, h, shape.intermediate, "mlp.down_proj")?,
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
        let Eagle3Shape { hidden: _, heads, kv_heads, head_dim: d, rms_norm_eps: eps, .. } = self.shape;
        let scale = (d as f64).powf(-0.5);
        let dev = taps.device().clone();
        let ids = Tensor::from_slice(tokens, n, &dev)?;
        let emb_all = embed.index_select(&ids, 0)?; // [n, H], frozen
        // Step 0 runs over every anchor t = 0..n-2 for its keys; later rows start at `a`.
        let mut hidden = self.fc.forward(taps)?.narrow(0, 0, n - 1)?;
        let mut k0: Option<(Tensor, Tensor)> = None;
        let mut chain_kv: Vec<(Tensor, Tensor)> = Vec::new();
        let mut outputs = Vec::with_capacity(steps);
        for s in 0..steps.min(n - 1) {
            let m = n - 1 - s;
            if a >= m {
                break;
            }
            let rows = m - a; // chains anchored at t = a..m-1
            // 1. Inputs: hidden of the chain's previous step, true token x_{t+s+1}. Step 0
            //    embeds every anchor (all are keys); later steps only the kept chains.
            let (first, count) = if s == 0 { (0, m) } else { (a, rows) };
            let h_in = if s == 0 { hidden.clone() } else { hidden.narrow(0, 0, rows)? };
            let emb = emb_all.narrow(0, s + 1 + first, count)?;
            let attn_in = Tensor::cat(
                &[rms_norm(&emb, &self.input_layernorm, eps)?, rms_norm(&h_in, &self.hidden_norm, eps)?],
                D::Minus1,
            )?;
            // 2. Keys at t + s for the embedded anchors; queries only for the kept chains.
            let (cos, sin) = self.tables(s + first, count)?;
            let k = rope(&Self::split_heads(&self.k_proj.forward(&attn_in)?, kv_heads, d)?, &cos, &sin)?;
            let v = Self::split_heads(&self.v_proj.forward(&attn_in)?, kv_heads, d)?;
            let (k, v) = (self.repeat_kv(&k)?, self.repeat_kv(&v)?);
            let (q_in, h_in) =
                if s == 0 { (attn_in.narrow(0, a, rows)?, h_in.narrow(0, a, rows)?) } else { (attn_in, h_in) };
            let (cos, sin) = self.tables(s + a, rows)?;
            let q = rope(&Self::split_heads(&self.q_proj.forward(&q_in)?, heads, d)?, &cos, &sin)?;
            if s == 0 {
                k0 = Some((k, v));
            } else {
                chain_kv.push((k, v));
            }
            let (k0t, v0t) = k0.as_ref().expect("set at step 0");
            // 3. Scores: causal over step-0 keys (anchor t sees t' <= t), plus the diagonal of
            //    every chain step so far (this chain's own keys).
            let s0 = (q.matmul(&k0t.t()?)? * scale)?; // [heads, rows, n-1]
            let s0 = s0.broadcast_add(&causal_mask(rows, n - 1, a, &dev)?)?;
            let mut parts = vec![s0];
            for (kj, _) in &chain_kv {
                parts.push(((&q * kj.narrow(1, 0, rows)?)?.sum_keepdim(D::Minus1)? * scale)?);
            }
            let probs = candle_nn::ops::softmax(&Tensor::cat(&parts, D::Minus1)?, D::Minus1)?;
            let mut attn = probs.narrow(D::Minus1, 0, n - 1)?.matmul(v0t)?;
            for (j, (_, vj)) in chain_kv.iter().enumerate() {
                let pj = probs.narrow(D::Minus1, n - 1 + j, 1)?;
                attn = (attn + pj.broadcast_mul(&vj.narrow(1, 0, rows)?)?)?;
            }
            let attn = attn.transpose(0, 1)?.reshape((rows, heads * d))?;
            // 4. Residual (the un-normed hidden), MLP.
            let x = (h_in + self.o_proj.forward(&attn)?)?;
            let hmlp = rms_norm(&x, &self.post_attention_layernorm, eps)?;
            let mlp = self
                .down_proj
                .forward(&(candle_nn::ops::silu(&self.gate_proj.forward(&hmlp)?)? * self.up_proj.forward(&hmlp)?)?)?;
            let x = (x + mlp)?;
            outputs.push(self.lm_head.forward(&rms_norm(&x, &self.norm, eps)?)?);
            hidden = x;
        }
        Ok(outputs)
    }
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
        let shape = Eagle3Shape {
            hidden: 16,
            num_taps: 3,
            heads: 4,
            kv_heads: 2,
            head_dim: 4,
            intermediate: 24,
            draft_vocab: 32,
            rms_norm_eps: 1e-5,
            rope_theta: 10_000.0,
            max_positions: 64,
        };
        let varmap = VarMap::new();
        let head = TrainableEagle3::new(VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu), shape).unwrap();
        (varmap, head)
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
