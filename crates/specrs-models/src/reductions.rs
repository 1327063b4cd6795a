//! Acceptance reductions computed where the logits live.
//!
//! A verify step produces `[N, V]` logits (`N` = rows × positions, `V` up to ~150k). On a GPU,
//! copying them to the host for acceptance moves `4·N·V` bytes over PCIe every step, more
//! than the whole lm_head reads. The acceptance rules only need a few numbers per position
//! (see `specrs_core::acceptance::ReducedPosition`), so they are computed here with candle
//! ops, on whatever device holds the logits, and only `[N]`-sized results come back.
//!
//! The numbers follow the host definitions in `specrs_core::sampling` exactly in structure:
//!
//! - **argmax**: the first maximum, NaN skipped (`argmax`).
//! - **processed distribution**: top-k on the logits (ties with the k-th kept) → softmax at
//!   the request's temperature → top-p (the nucleus threshold, ties kept) → min-p → renormalise
//!   when anything was cut (`SamplingWorkspace::processed_probs`). Thresholds are found by
//!   bisection on each row's values: `O(iterations · V)` work, no sort (candle's CUDA sort is
//!   limited to rows that fit in shared memory).
//! - **draws**: inverse CDF with one uniform per position from the host's counter-based
//!   streams (`uniform(seed, stream, index)`), walked in blocks of 256 tokens like
//!   `sample_inverse_cdf`: block sums, the block holding the draw, then the token inside it.
//!
//! The host sums in f64 and the device in f32, so a draw can land on a neighbouring token
//! when `u · total` falls within f32 rounding of a CDF boundary (probability ~1e-7 per draw);
//! the distribution is the same. Argmax, greedy decisions and the relaxed statistics match
//! the host exactly. Rows with penalties are not served here (the engine verifies them on
//! their logits).

use candle_core::{D, DType, Device, Result, Tensor};
use specrs_core::acceptance::{ReducedPosition, Reductions, RelaxedStats};
use specrs_core::sampling::{RngStream, SamplingParams, uniform};

/// Tokens per block of the inverse-CDF walk (as on the host).
const CDF_BLOCK: usize = 256;

/// Bisection rounds between convergence checks (each check reads `[R]` flags back).
const BISECTION_ROUNDS_PER_CHECK: usize = 16;

/// Hard cap on bisection rounds; f32 values converge far sooner (adjacent floats).
const MAX_BISECTION_ROUNDS: usize = 160;

/// One position to reduce.
#[derive(Debug, Clone, Copy)]
pub struct PositionQuery<'a> {
    /// Row of the logits tensor holding this position.
    pub row: usize,
    pub params: &'a SamplingParams,
    /// The verify row's step seed.
    pub seed: u64,
    /// Position within its verify row: the counter of every random stream.
    pub index: usize,
    /// The draft verified here; `None` at the bonus position.
    pub draft: Option<u32>,
    /// Row of the draft-distribution tensor holding `q` for this position, if any.
    pub q_row: Option<usize>,
    /// What the row's rule reads (`AcceptanceSampler::reductions_for`).
    pub wants: Reductions,
}

/// Reduces `logits [N, V]` (f32) at `queries`. `draft_probs [Nq, V]` holds the draft
/// distributions that `q_row` points into; it must live on the logits' device.
pub fn reduce(
    logits: &Tensor,
    queries: &[PositionQuery],
    draft_probs: Option<&Tensor>,
) -> Result<Vec<ReducedPosition>> {
    if queries.is_empty() {
        return Ok(Vec::new());
    }
    if queries.iter().any(|q| q.params.adjusts_logits()) {
        candle_core::bail!("reductions: rows with penalties or a logit bias are verified on their logits");
    }
    let device = logits.device().clone();
    let raw = select_rows(logits, &queries.iter().map(|q| q.row).collect::<Vec<_>>())?;
    let x = sanitize(&raw)?;
    let argmaxes = argmax_sanitized(&x)?.to_vec1::<u32>()?;
    let mut out: Vec<ReducedPosition> =
        argmaxes.iter().map(|&argmax| ReducedPosition { argmax, ..Default::default() }).collect();

    // Sampled positions: the processed distribution, its draws, and the rejection numbers.
    // Greedy rows have a one-hot distribution at the argmax, answered without one.
    let sampled: Vec<usize> = (0..queries.len())
        .filter(|&i| {
            let w = queries[i].wants;
            !queries[i].params.is_greedy() && (w.target_sample || (w.rejection && queries[i].draft.is_some()))
        })
        .collect();
    for (i, q) in queries.iter().enumerate() {
        if !q.params.is_greedy() {
            continue;
        }
        let a = out[i].argmax;
        if q.wants.target_sample {
            out[i].target_sample = Some(a);
        }
        if let (true, Some(d)) = (q.wants.rejection, q.draft) {
            // p is one-hot at the argmax; a rejected draft (d != argmax) recovers the argmax.
            out[i].draft_p = Some(if d == a { 1.0 } else { 0.0 });
            out[i].draft_q = q_value(draft_probs, q, d)?;
            out[i].residual_sample = Some(a);
        }
    }
    if !sampled.is_empty() {
        let xs = select_rows(&x, &sampled)?;
        let params: Vec<&SamplingParams> = sampled.iter().map(|&i| queries[i].params).collect();
        let probs = processed_probs(&xs, &params)?;
        let targets: Vec<usize> = (0..sampled.len()).filter(|&j| queries[sampled[j]].wants.target_sample).collect();
        if !targets.is_empty() {
            let us: Vec<f64> = targets
                .iter()
                .map(|&j| {
                    let q = &queries[sampled[j]];
                    uniform(q.seed, RngStream::TargetSample, q.index as u64)
                })
                .collect();
            let draws = sample_rows(&select_rows(&probs, &targets)?, &us)?;
            for (&j, t) in targets.iter().zip(draws) {
                out[sampled[j]].target_sample = Some(t);
            }
        }
        let rejecting: Vec<usize> = (0..sampled.len())
            .filter(|&j| queries[sampled[j]].wants.rejection && queries[sampled[j]].draft.is_some())
            .collect();
        if !rejecting.is_empty() {
            let qs: Vec<&PositionQuery> = rejecting.iter().map(|&j| &queries[sampled[j]]).collect();
            let p = select_rows(&probs, &rejecting)?;
            for (k, r) in rejection(&p, &qs, draft_probs, &device)?.into_iter().enumerate() {
                let o = &mut out[sampled[rejecting[k]]];
                (o.draft_p, o.draft_q, o.residual_sample) = (Some(r.0), r.1, Some(r.2));
            }
        }
    }

    // Relaxed statistics at draft positions, on the raw (sanitised) logits.
    let relaxed: Vec<usize> =
        (0..queries.len()).filter(|&i| queries[i].wants.relaxed_topk.is_some() && queries[i].draft.is_some()).collect();
    if !relaxed.is_empty() {
        let drafts: Vec<u32> = relaxed.iter().map(|&i| queries[i].draft.expect("filtered")).collect();
        let stats = relaxed_stats(&select_rows(&raw, &relaxed)?, &select_rows(&x, &relaxed)?, &drafts)?;
        for (&i, s) in relaxed.iter().zip(stats) {
            let topk = queries[i].wants.relaxed_topk.expect("filtered");
            out[i].relaxed = Some(RelaxedStats { top: out[i].argmax, ahead: s.ahead.min(topk), ..s });
        }
    }
    Ok(out)
}

/// `[M]` u32: the first maximum of each row, NaN entries skipped (all-NaN rows give 0), as
/// `specrs_core::sampling::argmax`. Device-side, so drafters and plain decoding can take
/// argmaxes without copying logits.
pub fn argmax_rows(logits: &Tensor) -> Result<Tensor> {
    argmax_sanitized(&sanitize(logits)?)
}

/// The `k` largest entries of each row of `logits [M, V]`, best first, ties to the lower
/// index (NaN entries last): `(ids [M, k] u32, values [M, k] f32)`, where the logits are.
/// `k` argmax rounds, each masking the entry it took, so for the small `k` of a candidate
/// list only `[M, k]` ever leaves the device.
pub fn top_k_rows(logits: &Tensor, k: usize) -> Result<(Tensor, Tensor)> {
    let raw = logits.to_dtype(DType::F32)?;
    let (m, v) = raw.dims2()?;
    let cols = iota(v, raw.device())?.unsqueeze(0)?.broadcast_as((m, v))?;
    let mut x = sanitize(&raw)?;
    let (mut ids, mut values) = (Vec::with_capacity(k), Vec::with_capacity(k));
    for _ in 0..k.min(v) {
        let first = argmax_sanitized(&x)?.unsqueeze(1)?; // [M, 1]
        values.push(raw.gather(&first, 1)?);
        x = x.masked_fill(&cols.broadcast_eq(&first)?, f32::NEG_INFINITY)?;
        ids.push(first);
    }
    Ok((Tensor::cat(&ids, 1)?, Tensor::cat(&values, 1)?))
}

/// Rows `rows` of `t`, without a copy when they are all of them in order.
fn select_rows(t: &Tensor, rows: &[usize]) -> Result<Tensor> {
    if rows.len() == t.dim(0)? && rows.iter().enumerate().all(|(i, &r)| i == r) {
        return Ok(t.clone());
    }
    let idx: Vec<u32> = rows.iter().map(|&r| r as u32).collect();
    t.index_select(&Tensor::from_vec(idx, rows.len(), t.device())?, 0)
}

/// f32, NaN → -inf, infinities clamped to ±f32::MAX, so every row has a finite maximum and
/// masked entries (set to -inf later) are the only infinities. A +inf logit becomes a tie at
/// the maximum, which is how the host treats it (equal mass on the +inf entries).
fn sanitize(x: &Tensor) -> Result<Tensor> {
    let x = x.to_dtype(DType::F32)?;
    let nan = x.ne(&x)?;
    x.clamp(f32::MIN, f32::MAX)?.masked_fill(&nan, f32::MIN)
}

trait MaskedFill {
    /// `where(mask, scalar, self)`.
    fn masked_fill(&self, mask: &Tensor, scalar: f32) -> Result<Tensor>;
}

impl MaskedFill for Tensor {
    fn masked_fill(&self, mask: &Tensor, scalar: f32) -> Result<Tensor> {
        let s = Tensor::new(scalar, self.device())?.broadcast_as(self.shape())?;
        mask.where_cond(&s, self)
    }
}

fn iota(n: usize, device: &Device) -> Result<Tensor> {
    Tensor::arange(0u32, n as u32, device)
}

/// First index of the row maximum of finite rows.
fn argmax_sanitized(x: &Tensor) -> Result<Tensor> {
    let (m, v) = x.dims2()?;
    let max = x.max_keepdim(D::Minus1)?;
    let is_max = x.broadcast_eq(&max)?;
    let ids = iota(v, x.device())?.unsqueeze(0)?.broadcast_as((m, v))?;
    let none = Tensor::new(v as u32, x.device())?.broadcast_as((m, v))?;
    let first = is_max.where_cond(&ids, &none)?.min(D::Minus1)?;
    // Rows cannot be all-NaN after sanitising (NaN became MIN, a maximum), so `first < v`.
    Ok(first)
}

/// Per-row column of f32 parameters, `[R, 1]`.
fn column(values: impl Iterator<Item = f32>, device: &Device) -> Result<Tensor> {
    let v: Vec<f32> = values.collect();
    let n = v.len();
    Tensor::from_vec(v, (n, 1), device)
}

/// The processed target distribution `[R, V]` of sanitised logits `x [R, V]`, one parameter
/// set per row (none greedy): top-k → softmax(x / T) → top-p → min-p → renormalise if cut.
pub fn processed_probs(x: &Tensor, params: &[&SamplingParams]) -> Result<Tensor> {
    let device = x.device().clone();
    let (r, v) = x.dims2()?;
    debug_assert_eq!(r, params.len());
    // 1. Top-k on the logits: keep values >= the k-th largest.
    let mut x = x.clone();
    let topk_rows: Vec<usize> = (0..r).filter(|&i| params[i].top_k_for(v).is_some()).collect();
    if !topk_rows.is_empty() {
        let ks: Vec<f32> = topk_rows.iter().map(|&i| params[i].top_k_for(v).expect("filtered") as f32).collect();
        let kth = kth_largest(&select_rows(&x, &topk_rows)?, &ks)?.to_vec1::<f32>()?;
        let mut thresholds = vec![f32::NEG_INFINITY; r];
        for (&i, t) in topk_rows.iter().zip(kth) {
            thresholds[i] = t;
        }
        let thr = column(thresholds.into_iter(), &device)?;
        x = x.masked_fill(&x.broadcast_lt(&thr)?, f32::NEG_INFINITY)?;
    }
    // 2. Softmax at the temperature; the row maximum is finite (sanitised, and top-k keeps it).
    let inv_t = column(params.iter().map(|p| 1.0 / p.temperature), &device)?;
    let max = x.max_keepdim(D::Minus1)?;
    let e = x.broadcast_sub(&max)?.broadcast_mul(&inv_t)?.exp()?;
    let mut p = e.broadcast_div(&e.sum_keepdim(D::Minus1)?)?;
    // 3. Top-p and 4. min-p zero everything below their thresholds.
    let mut thresholds = vec![0f32; r];
    let topp_rows: Vec<usize> = (0..r).filter(|&i| params[i].top_p < 1.0).collect();
    if !topp_rows.is_empty() {
        let targets: Vec<f32> = topp_rows.iter().map(|&i| params[i].top_p).collect();
        let thr = top_p_threshold(&select_rows(&p, &topp_rows)?, &targets)?.to_vec1::<f32>()?;
        for (&i, t) in topp_rows.iter().zip(thr) {
            thresholds[i] = t;
        }
    }
    let any_min_p = params.iter().any(|q| q.min_p > 0.0);
    let cut_rows = thresholds.iter().any(|&t| t > 0.0) || any_min_p;
    if !cut_rows {
        return Ok(p);
    }
    let mut thr = column(thresholds.into_iter(), &device)?;
    if any_min_p {
        let min_p = column(params.iter().map(|q| q.min_p.clamp(0.0, 1.0)), &device)?;
        let min_p_thr = p.max_keepdim(D::Minus1)?.mul(&min_p)?;
        thr = thr.maximum(&min_p_thr)?;
    }
    let kept_before = p.gt(0f32)?.to_dtype(DType::F32)?.sum_keepdim(D::Minus1)?;
    p = p.masked_fill(&p.broadcast_lt(&thr)?, 0.0)?;
    let kept_after = p.gt(0f32)?.to_dtype(DType::F32)?.sum_keepdim(D::Minus1)?;
    // Renormalise only rows that lost tokens, as the host does.
    let cut = kept_after.lt(&kept_before)?;
    let scale = cut.where_cond(&p.sum_keepdim(D::Minus1)?.recip()?, &Tensor::ones_like(&kept_after)?)?;
    p.broadcast_mul(&scale)
}

/// The processed distribution `[R, V]` of raw `logits` under each row's parameters, greedy
/// rows included (one-hot at `argmax [R]`, as the host's `processed_probs` makes them).
pub fn distributions(logits: &Tensor, params: &[&SamplingParams], argmax: &Tensor) -> Result<Tensor> {
    let x = sanitize(logits)?;
    let (r, v) = x.dims2()?;
    let plain = SamplingParams::default();
    let stand_ins: Vec<&SamplingParams> = params.iter().map(|p| if p.is_greedy() { &plain } else { *p }).collect();
    let probs = processed_probs(&x, &stand_ins)?;
    if !params.iter().any(|p| p.is_greedy()) {
        return Ok(probs);
    }
    let one_hot = iota(v, x.device())?.unsqueeze(0)?.broadcast_eq(&argmax.unsqueeze(1)?)?.to_dtype(DType::F32)?;
    let greedy = column(params.iter().map(|p| if p.is_greedy() { 1.0 } else { 0.0 }), x.device())?.gt(0.5)?;
    greedy.broadcast_as((r, v))?.where_cond(&one_hot, &probs)
}

/// What a monotone-decreasing bisection predicate measures over `values >= t`.
#[derive(Clone, Copy)]
enum Measure {
    /// How many values are `>= t`.
    Count,
    /// Their sum.
    Mass,
}

/// `measure(x >= t) >= target`, per row: `[R, 1]` u8.
fn predicate(x: &Tensor, t: &Tensor, target: &Tensor, measure: Measure) -> Result<Tensor> {
    let mask = x.broadcast_ge(t)?.to_dtype(DType::F32)?;
    let m = match measure {
        Measure::Count => mask.sum_keepdim(D::Minus1)?,
        Measure::Mass => (x * mask)?.sum_keepdim(D::Minus1)?,
    };
    m.ge(target)
}

/// The largest value `t` of each row of `x [R, V]` with `measure(x >= t) >= target`, given
/// `lo` (predicate true) and `hi` (the row maximum). Values `<= floor` are not candidates.
///
/// Bisects `[lo, hi)` in value space, then snaps `lo` up to the smallest value at or above
/// it; converged when no other value lies in `(snap, hi)`, which f32 bisection reaches once
/// `lo` and `hi` are adjacent floats.
fn bisect(x: &Tensor, target: &Tensor, lo: Tensor, hi: Tensor, measure: Measure, floor: f32) -> Result<Tensor> {
    let inf = f32::INFINITY;
    // Rows whose maximum already satisfies the predicate answer with it.
    let hi_ok = predicate(x, &hi, target, measure)?;
    let mut lo = hi_ok.where_cond(&hi, &lo)?;
    let mut hi = hi;
    let candidates = x.gt(floor)?;
    let mut rounds = 0;
    loop {
        for _ in 0..BISECTION_ROUNDS_PER_CHECK {
            let mid = ((&lo + &hi)? * 0.5)?;
            let ok = predicate(x, &mid, target, measure)?;
            lo = ok.where_cond(&mid, &lo)?;
            hi = ok.where_cond(&hi, &mid)?;
        }
        rounds += BISECTION_ROUNDS_PER_CHECK;
        // snap = min{x : x >= lo, x > floor}; converged iff min{x : x > snap} >= hi.
        let eligible = (x.broadcast_ge(&lo)? * &candidates)?;
        let snap = x.masked_fill(&eligible.eq(0u8)?, inf)?.min_keepdim(D::Minus1)?;
        let next = x.masked_fill(&x.broadcast_le(&snap)?, inf)?.min_keepdim(D::Minus1)?;
        let pending = next.lt(&hi)?.to_dtype(DType::F32)?.sum_all()?.to_scalar::<f32>()?;
        // Rows with no candidate at all (snap = inf) keep everything: threshold `floor`.
        let snap = snap.masked_fill(&snap.eq(inf)?, floor)?;
        if pending == 0.0 || rounds >= MAX_BISECTION_ROUNDS {
            return snap.squeeze(1);
        }
    }
}

/// The `k`-th largest value of each row of finite `x [R, V]` (`1 <= k < V`), ties counted:
/// `kth_largest` on the host.
fn kth_largest(x: &Tensor, ks: &[f32]) -> Result<Tensor> {
    let target = column(ks.iter().copied(), x.device())?;
    let lo = x.min_keepdim(D::Minus1)?;
    let hi = x.max_keepdim(D::Minus1)?;
    bisect(x, &target, lo, hi, Measure::Count, f32::NEG_INFINITY)
}

/// The nucleus threshold of each row of `p [R, V]`: the probability of the token at which
/// the mass, walked from the most likely token down, reaches `top_p` (`top_p_threshold`).
/// A row whose total falls short keeps every positive token (threshold 0).
fn top_p_threshold(p: &Tensor, top_ps: &[f32]) -> Result<Tensor> {
    let target = column(top_ps.iter().copied(), p.device())?;
    let lo = Tensor::zeros((p.dim(0)?, 1), DType::F32, p.device())?;
    let hi = p.max_keepdim(D::Minus1)?;
    let reaches = predicate(p, &lo, &target, Measure::Mass)?.squeeze(1)?;
    let t = bisect(p, &target, lo, hi, Measure::Mass, 0.0)?;
    reaches.where_cond(&t, &t.zeros_like()?)
}

/// One inverse-CDF draw per row of `weights [R, V]` (non-negative; NaN and negative entries
/// weigh nothing) with `uniforms[r]`: the first token whose cumulative weight exceeds
/// `u · total`, as `sample_inverse_cdf`.
pub fn sample_rows(weights: &Tensor, uniforms: &[f64]) -> Result<Vec<u32>> {
    let device = weights.device().clone();
    let (r, v) = weights.dims2()?;
    let nb = v.div_ceil(CDF_BLOCK);
    let w = weights.to_dtype(DType::F32)?;
    let w = w.gt(0f32)?.where_cond(&w, &w.zeros_like()?)?;
    let w = if nb * CDF_BLOCK > v { w.pad_with_zeros(1, 0, nb * CDF_BLOCK - v)? } else { w };
    let blocks = w.reshape((r, nb, CDF_BLOCK))?;
    // 1. Block sums and their running total; the draw's target mass.
    let block_sum = blocks.sum(2)?;
    let cum = block_sum.cumsum(1)?;
    let total = cum.narrow(1, nb - 1, 1)?;
    let u = column(uniforms.iter().map(|&u| u as f32), &device)?;
    let target = (u * &total)?;
    // 2. The block holding the draw: the first whose running total exceeds the target.
    let b = cum.broadcast_le(&target)?.to_dtype(DType::U32)?.sum(1)?.minimum(nb as u32 - 1)?;
    let b_col = b.unsqueeze(1)?;
    let before = (cum.gather(&b_col, 1)? - block_sum.gather(&b_col, 1)?)?;
    let flat = ((iota(r, &device)? * nb as f64)? + &b)?;
    let vals = blocks.reshape((r * nb, CDF_BLOCK))?.index_select(&flat, 0)?;
    // 3. The token inside it, and the fallbacks for draws that rounding pushed past the end.
    let within = vals.cumsum(1)?.broadcast_add(&before)?;
    let j = within.broadcast_le(&target)?.to_dtype(DType::U32)?.sum(1)?;
    let last_positive = |t: &Tensor, n: usize| -> Result<Tensor> {
        let ids1 = (iota(n, &device)? + 1.0)?.unsqueeze(0)?.broadcast_as(t.shape())?;
        t.gt(0f32)?.where_cond(&ids1, &ids1.zeros_like()?)?.max(1)
    };
    let last_in_block = last_positive(&vals, CDF_BLOCK)?;
    let last_overall = last_positive(&w, nb * CDF_BLOCK)?;
    let out = Tensor::stack(&[&b, &j, &last_in_block, &last_overall], 1)?.to_vec2::<u32>()?;
    Ok(out
        .into_iter()
        .map(|row| {
            let (b, j, last_in_block, last_overall) = (row[0], row[1], row[2], row[3]);
            if (j as usize) < CDF_BLOCK {
                b * CDF_BLOCK as u32 + j
            } else if last_in_block > 0 {
                b * CDF_BLOCK as u32 + last_in_block - 1
            } else {
                last_overall.saturating_sub(1)
            }
        })
        .collect())
}

/// `q(draft)` of a position from the draft-distribution tensor (a one-element copy).
fn q_value(draft_probs: Option<&Tensor>, q: &PositionQuery, draft: u32) -> Result<Option<f32>> {
    match (draft_probs, q.q_row) {
        (Some(t), Some(row)) => Ok(Some(t.get(row)?.get(draft as usize)?.to_dtype(DType::F32)?.to_scalar::<f32>()?)),
        _ => Ok(None),
    }
}

/// Rejection-sampling numbers of draft positions with processed distributions `p [R, V]`:
/// `(p(d), q(d) if positive, residual draw)` per row.
fn rejection(
    p: &Tensor,
    queries: &[&PositionQuery],
    draft_probs: Option<&Tensor>,
    device: &Device,
) -> Result<Vec<(f32, Option<f32>, u32)>> {
    let (r, v) = p.dims2()?;
    let drafts: Vec<u32> = queries.iter().map(|q| q.draft.expect("draft positions")).collect();
    let d = Tensor::from_vec(drafts.clone(), (r, 1), device)?;
    let p_d = p.gather(&d, 1)?;
    // q rows, zeros where a position has no distribution.
    let q = match draft_probs {
        Some(t) if queries.iter().any(|q| q.q_row.is_some()) => {
            let idx: Vec<u32> = queries.iter().map(|q| q.q_row.unwrap_or(0) as u32).collect();
            let has: Vec<f32> = queries.iter().map(|q| if q.q_row.is_some() { 1.0 } else { 0.0 }).collect();
            let rows = t.to_dtype(DType::F32)?.index_select(&Tensor::from_vec(idx, r, device)?, 0)?;
            rows.broadcast_mul(&Tensor::from_vec(has, (r, 1), device)?)?
        }
        _ => Tensor::zeros((r, v), DType::F32, device)?,
    };
    let q_d = q.gather(&d, 1)?;
    // With q(d) > 0: max(p - q, 0); without: p with the draft removed (a one-hot proposal).
    let use_q = q_d.gt(0f32)?;
    let not_draft = iota(v, device)?.unsqueeze(0)?.broadcast_ne(&d)?.to_dtype(DType::F32)?;
    let residual = use_q.broadcast_as((r, v))?.where_cond(&(p - &q)?.relu()?, &(p * not_draft)?)?;
    // A residual without mass (p <= q everywhere, p = q up to rounding) falls back to p.
    let empty = residual.sum_keepdim(D::Minus1)?.le(0f32)?.broadcast_as((r, v))?;
    let weights = empty.where_cond(p, &residual)?;
    let us: Vec<f64> = queries.iter().map(|q| uniform(q.seed, RngStream::Residual, q.index as u64)).collect();
    let draws = sample_rows(&weights, &us)?;
    let p_d = p_d.squeeze(1)?.to_vec1::<f32>()?;
    let q_d = q_d.squeeze(1)?.to_vec1::<f32>()?;
    Ok((0..r).map(|i| (p_d[i], (q_d[i] > 0.0).then_some(q_d[i]), draws[i])).collect())
}

/// The relaxed rule's statistics for `drafts`, from raw logits (for the draft's own logit,
/// NaN kept) and their sanitised copy (for ranks and the log-sum-exp). `top` is filled in
/// by the caller.
fn relaxed_stats(raw: &Tensor, x: &Tensor, drafts: &[u32]) -> Result<Vec<RelaxedStats>> {
    let device = x.device();
    let (r, v) = x.dims2()?;
    let d = Tensor::from_vec(drafts.iter().map(|&d| d.min(v as u32 - 1)).collect::<Vec<_>>(), (r, 1), device)?;
    let draft_logit = raw.to_dtype(DType::F32)?.gather(&d, 1)?;
    let ahead_higher = x.broadcast_gt(&draft_logit)?.to_dtype(DType::F32)?.sum(1)?;
    let lower_id = iota(v, device)?.unsqueeze(0)?.broadcast_lt(&d)?;
    let tied = x.broadcast_eq(&draft_logit)?;
    let ahead_tied = (tied * lower_id)?.to_dtype(DType::F32)?.sum(1)?;
    let ahead = (ahead_higher + ahead_tied)?;
    let max = x.max_keepdim(D::Minus1)?;
    let lse = (x.broadcast_sub(&max)?.exp()?.sum_keepdim(D::Minus1)?.log()? + &max)?;
    let cols = Tensor::cat(&[&ahead.unsqueeze(1)?, &draft_logit, &max, &lse], 1)?.to_vec2::<f32>()?;
    Ok(cols
        .into_iter()
        .zip(drafts)
        .map(|(c, &draft)| RelaxedStats {
            top: 0,
            ahead: c[0] as usize,
            draft_logit: if (draft as usize) < v { c[1] } else { f32::NAN },
            top_logit: c[2],
            logsumexp: f64::from(c[3]),
        })
        .collect())
}

#[cfg(test)]
mod tests;
