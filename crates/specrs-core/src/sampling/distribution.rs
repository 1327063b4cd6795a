//! The processed target distribution of one position, and sampling from it.
//!
//! Order: logit bias → penalties → temperature → top-k → top-p → min-p → renormalise. Greedy requests
//! (temperature below [`GREEDY_TEMPERATURE`](super::params::GREEDY_TEMPERATURE)) get a one-hot
//! row at the penalised argmax, so every caller can treat them as a distribution.
//!
//! Every step that speculative verification and plain decoding share lives here, once: a
//! token accepted by the target-sample rule is then drawn from exactly the distribution a
//! non-speculative step would have drawn from.

use super::logits::{argmax, max_value, softmax_with_inverse_temperature, sum_positive};
use super::params::SamplingParams;
use super::penalties::PenaltyContext;
use super::truncation::{kth_largest, min_p_threshold, top_p_threshold};

/// Reusable buffers for processing positions one at a time: no allocation per position once
/// the buffers have grown to the vocabulary size.
#[derive(Debug, Clone, Default)]
pub struct SamplingWorkspace {
    /// `[V]`: the row being processed (logits, then probabilities).
    row: Vec<f32>,
    /// `[<= V]`: selection scratch for top-k and top-p.
    pool: Vec<f32>,
}

impl SamplingWorkspace {
    pub fn new(vocab_size: usize) -> Self {
        Self { row: Vec::with_capacity(vocab_size), pool: Vec::with_capacity(vocab_size) }
    }

    /// `logits` (`[V]`) with the request's penalties applied (a copy; the input is untouched).
    pub fn penalized_logits(
        &mut self,
        logits: &[f32],
        params: &SamplingParams,
        penalties: Option<&PenaltyContext>,
    ) -> &[f32] {
        self.load_penalized(logits, params, penalties);
        &self.row
    }

    /// Whether any token survives the request's masks (allowed tokens, bad words, its
    /// structured-output guide) at a position whose `logits` already carry the engine's own
    /// (`-inf` for the stop tokens `min_tokens` holds back). A row where none survives has no
    /// token that every rule agrees to emit: its argmax and its distribution would be junk.
    pub fn allows_any_token(
        &mut self,
        logits: &[f32],
        params: &SamplingParams,
        penalties: Option<&PenaltyContext>,
    ) -> bool {
        self.load_penalized(logits, params, penalties);
        self.row.iter().any(|&logit| logit > f32::NEG_INFINITY)
    }

    /// The argmax after penalties; reads `logits` in place when no penalty applies.
    pub fn penalized_argmax(
        &mut self,
        logits: &[f32],
        params: &SamplingParams,
        penalties: Option<&PenaltyContext>,
    ) -> u32 {
        if penalties.is_some() && params.adjusts_logits() {
            self.load_penalized(logits, params, penalties);
            argmax(&self.row)
        } else {
            argmax(logits)
        }
    }

    /// The processed target distribution (`[V]`, sums to one) of one position's `logits`.
    pub fn processed_probs(
        &mut self,
        logits: &[f32],
        params: &SamplingParams,
        penalties: Option<&PenaltyContext>,
    ) -> &[f32] {
        self.load_penalized(logits, params, penalties);
        let row = &mut self.row;
        if params.is_greedy() {
            let best = argmax(row) as usize;
            row.fill(0.0);
            if let Some(p) = row.get_mut(best) {
                *p = 1.0;
            }
            return row;
        }
        if let Some(k) = params.top_k_for(row.len()) {
            let kth = kth_largest(row, k, &mut self.pool);
            for logit in row.iter_mut() {
                if *logit < kth {
                    *logit = f32::NEG_INFINITY;
                }
            }
        }
        softmax_with_inverse_temperature(row, 1.0 / params.temperature);
        let mut cut = false;
        if params.top_p < 1.0 {
            let threshold = top_p_threshold(row, params.top_p, &mut self.pool);
            cut |= zero_below(row, threshold);
        }
        if params.min_p > 0.0 {
            // Clamped so an unvalidated `min_p > 1` still keeps the most likely token.
            let threshold = min_p_threshold(max_value(row), params.min_p.min(1.0));
            cut |= zero_below(row, threshold);
        }
        if cut {
            renormalize(row);
        }
        row
    }

    fn load_penalized(&mut self, logits: &[f32], params: &SamplingParams, penalties: Option<&PenaltyContext>) {
        self.row.clear();
        self.row.extend_from_slice(logits);
        // The target's rows come with a context whenever the request adjusts its logits (the
        // acceptance walk builds one); a draft's distribution comes without, and is left as
        // the draft proposed it, as with penalties.
        if let Some(ctx) = penalties
            && params.adjusts_logits()
        {
            for (&token, &bias) in &params.logit_bias {
                if let Some(logit) = self.row.get_mut(token as usize) {
                    *logit += bias;
                }
            }
            if let Some(allowed) = &params.allowed_token_ids {
                mask_all_but(&mut self.row, allowed, &mut self.pool);
            }
            ctx.apply(&mut self.row, params);
        }
    }
}

/// The processed target distribution (`[V]`) of one position; allocates. Hot loops use
/// [`SamplingWorkspace::processed_probs`].
pub fn processed_probs(logits: &[f32], params: &SamplingParams, penalties: Option<&PenaltyContext>) -> Vec<f32> {
    let mut workspace = SamplingWorkspace::new(logits.len());
    workspace.processed_probs(logits, params, penalties);
    workspace.row
}

/// Whether a request with `params` may generate any token right after `prompt`, whatever the
/// model says: its allowed tokens, single-token bad words and its guide's first state
/// checked together, with `held_back` (the stop tokens `min_tokens` masks) masked too. The
/// engine refuses a request whose masks leave nothing at its first position instead of
/// emitting junk there; later positions are checked as they are verified.
pub fn first_token_allowed(params: &SamplingParams, prompt: &[u32], vocab_size: usize, held_back: &[u32]) -> bool {
    let mut logits = vec![0.0f32; vocab_size];
    for &token in held_back {
        if let Some(logit) = logits.get_mut(token as usize) {
            *logit = f32::NEG_INFINITY;
        }
    }
    let context = PenaltyContext::for_params(prompt, prompt.len(), params);
    SamplingWorkspace::new(vocab_size).allows_any_token(&logits, params, Some(&context))
}

/// Sets every logit to `-inf` except those of `allowed` (ids outside the row are ignored).
/// `scratch` keeps the allowed values while the row is cleared.
fn mask_all_but(logits: &mut [f32], allowed: &[u32], scratch: &mut Vec<f32>) {
    scratch.clear();
    scratch.extend(allowed.iter().map(|&t| logits.get(t as usize).copied().unwrap_or(f32::NEG_INFINITY)));
    logits.fill(f32::NEG_INFINITY);
    for (&t, &logit) in allowed.iter().zip(scratch.iter()) {
        if let Some(slot) = logits.get_mut(t as usize) {
            *slot = logit;
        }
    }
}

/// Zeroes every probability below `threshold`; returns whether anything was removed.
fn zero_below(probs: &mut [f32], threshold: f32) -> bool {
    // Branch-free (a bit mask): on a flat row the keep/drop decision is a coin flip that a
    // branch would mispredict.
    let mut removed = false;
    for p in probs.iter_mut() {
        let drop = (*p < threshold) & (*p > 0.0);
        removed |= drop;
        let keep_mask = u32::from(drop).wrapping_sub(1);
        *p = f32::from_bits(p.to_bits() & keep_mask);
    }
    removed
}

/// Rescales a row with positive mass to sum to one.
fn renormalize(probs: &mut [f32]) {
    let total = sum_positive(probs);
    if total > 0.0 {
        let scale = (1.0 / total) as f32;
        for p in probs.iter_mut() {
            *p *= scale;
        }
    }
}

/// Tokens per block of the inverse-CDF walk: blocks are summed vectorised and skipped whole,
/// only the block holding the draw is walked token by token.
const CDF_BLOCK: usize = 256;

/// Draws one token from `weights` (`[V]`, non-negative, need not sum to one) with one
/// uniform `u ∈ [0, 1)`: the first token, in id order, whose cumulative weight exceeds
/// `u · total`.
///
/// Token `i` is returned for a `u`-interval of length `weights[i] / total` (up to f64
/// rounding, ~1e-16). Tokens with zero (or NaN, or negative) weight are never returned, even
/// when rounding pushes `u · total` past the last cumulative sum: then the last positive
/// token is returned. A row without positive weight returns token 0.
pub fn sample_inverse_cdf(weights: &[f32], u: f64) -> u32 {
    let total: f64 = weights.chunks(CDF_BLOCK).map(sum_positive).sum();
    let target = u * total;
    let mut cumulative = 0.0f64;
    for (b, block) in weights.chunks(CDF_BLOCK).enumerate() {
        let block_sum = sum_positive(block);
        if cumulative + block_sum > target {
            let offset = b * CDF_BLOCK;
            let mut last_positive = None;
            for (i, &w) in block.iter().enumerate() {
                if w > 0.0 {
                    cumulative += f64::from(w);
                    last_positive = Some(offset + i);
                    if cumulative > target {
                        return (offset + i) as u32;
                    }
                }
            }
            // Rounding: the block's own walk fell a hair short of its vectorised sum.
            if let Some(i) = last_positive {
                return i as u32;
            }
        }
        cumulative += block_sum;
    }
    weights.iter().rposition(|&w| w > 0.0).unwrap_or(0) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(temperature: f32, top_k: i64, top_p: f32, min_p: f32) -> SamplingParams {
        SamplingParams { temperature, top_k, top_p, min_p, ..Default::default() }
    }

    fn support(probs: &[f32]) -> Vec<usize> {
        probs.iter().enumerate().filter(|(_, p)| **p > 0.0).map(|(i, _)| i).collect()
    }

    #[test]
    fn greedy_rows_are_one_hot_at_the_penalized_argmax() {
        let logits = [1.0f32, 3.0, 2.9, 0.0];
        assert_eq!(processed_probs(&logits, &SamplingParams::greedy(), None), [0.0, 1.0, 0.0, 0.0]);
        let ctx = PenaltyContext::new(&[1], 0);
        let penalized = SamplingParams { presence_penalty: 0.5, ..SamplingParams::greedy() };
        assert_eq!(processed_probs(&logits, &penalized, Some(&ctx)), [0.0, 0.0, 1.0, 0.0]);
    }

    #[test]
    fn logit_bias_shifts_target_rows_before_the_penalties_and_leaves_draft_rows_alone() {
        let logits = [1.0f32, 3.0, 2.9, 0.0];
        let biased = SamplingParams {
            logit_bias: std::collections::BTreeMap::from([(1, -100.0), (3, 2.5)]),
            ..SamplingParams::greedy()
        };
        let target = PenaltyContext::default();
        let mut w = SamplingWorkspace::new(4);
        assert_eq!(w.penalized_logits(&logits, &biased, Some(&target)), [1.0, -97.0, 2.9, 2.5]);
        assert_eq!(w.penalized_argmax(&logits, &biased, Some(&target)), 2);
        // A draft's distribution (no context) is the draft's own, as with penalties.
        assert_eq!(w.penalized_argmax(&logits, &biased, None), 1);
        // Bias first, then repetition: token 3 was seen, so its biased logit 2.5 is halved.
        let both = SamplingParams { repetition_penalty: 2.0, ..biased };
        let seen = PenaltyContext::new(&[3], 1);
        assert_eq!(w.penalized_logits(&logits, &both, Some(&seen)), [1.0, -97.0, 2.9, 1.25]);
    }

    #[test]
    fn allowed_token_ids_mask_every_other_target_logit_after_the_bias() {
        let logits = [1.0f32, 3.0, 2.9, 0.0];
        let allowed = SamplingParams {
            allowed_token_ids: Some(vec![3, 0]),
            logit_bias: std::collections::BTreeMap::from([(0, -2.0)]),
            ..SamplingParams::default()
        };
        let target = PenaltyContext::default();
        let mut w = SamplingWorkspace::new(4);
        let inf = f32::NEG_INFINITY;
        assert_eq!(w.penalized_logits(&logits, &allowed, Some(&target)), [-1.0, inf, inf, 0.0]);
        let greedy = SamplingParams { temperature: 0.0, ..allowed.clone() };
        assert_eq!(w.penalized_argmax(&logits, &greedy, Some(&target)), 3);
        let p = processed_probs(&logits, &allowed, Some(&target));
        assert_eq!(support(&p), vec![0, 3]);
        assert!((p[3] - 1.0 / (1.0 + (-1.0f32).exp())).abs() < 1e-6);
        assert_eq!(w.penalized_argmax(&logits, &greedy, None), 1, "a draft's own distribution is left alone");
    }

    #[test]
    fn bad_words_mask_the_token_completing_a_word_after_the_output_and_accepted_drafts() {
        let logits = [1.0f32, 3.0, 2.9, 0.0];
        // Token 2 is banned everywhere; token 1 only right after output token 3.
        let params = SamplingParams { temperature: 0.0, bad_word_ids: vec![vec![2], vec![3, 1]], ..Default::default() };
        let inf = f32::NEG_INFINITY;
        let mut w = SamplingWorkspace::new(4);
        // History [prompt 3 | output 0]: the output does not end with 3.
        let mut ctx = PenaltyContext::for_params(&[3, 0], 1, &params);
        assert_eq!(w.penalized_logits(&logits, &params, Some(&ctx)), [1.0, 3.0, inf, 0.0]);
        // An accepted draft 3 makes token 1 complete the word.
        ctx.record_output(3);
        assert_eq!(w.penalized_logits(&logits, &params, Some(&ctx)), [1.0, inf, inf, 0.0]);
        assert_eq!(w.penalized_argmax(&logits, &params, Some(&ctx)), 0);
        // A word begun in the prompt is not completed against.
        let from_prompt = PenaltyContext::for_params(&[3], 1, &params);
        assert_eq!(w.penalized_argmax(&logits, &params, Some(&from_prompt)), 1);
    }

    #[test]
    fn each_filter_keeps_the_documented_set_and_renormalizes() {
        // softmax([ln 4, ln 3, ln 2, ln 1]) = [0.4, 0.3, 0.2, 0.1].
        let logits = [4.0f32.ln(), 3.0f32.ln(), 2.0f32.ln(), 0.0];
        let p = processed_probs(&logits, &params(1.0, 2, 1.0, 0.0), None);
        assert_eq!(support(&p), vec![0, 1]);
        assert!((p[0] - 4.0 / 7.0).abs() < 1e-6);
        // 0.4 + 0.3 = 0.7 reaches 0.65, 0.4 alone does not.
        let p = processed_probs(&logits, &params(1.0, 0, 0.65, 0.0), None);
        assert_eq!(support(&p), vec![0, 1]);
        // min_p 0.45 keeps p >= 0.18.
        let p = processed_probs(&logits, &params(1.0, 0, 1.0, 0.45), None);
        assert_eq!(support(&p), vec![0, 1, 2]);
        assert!((p[2] - 0.2 / 0.9).abs() < 1e-6);
        let total: f32 = p.iter().sum();
        assert!((total - 1.0).abs() < 1e-6);
    }

    #[test]
    fn top_p_applies_after_top_k_on_the_renormalized_mass() {
        let logits = [4.0f32.ln(), 3.0f32.ln(), 2.0f32.ln(), 0.0];
        // After top-k 3 the row is [4, 3, 2] / 9 and 4/9 alone reaches 0.42; on the full
        // row 0.4 would not.
        let p = processed_probs(&logits, &params(1.0, 3, 0.42, 0.0), None);
        assert_eq!(support(&p), vec![0]);
        let p = processed_probs(&logits, &params(1.0, 0, 0.42, 0.0), None);
        assert_eq!(support(&p), vec![0, 1]);
    }

    #[test]
    fn temperature_scales_logits_before_the_softmax() {
        let logits = [0.0f32, 1.0];
        let p = processed_probs(&logits, &params(0.5, 0, 1.0, 0.0), None);
        let expected = 1.0 / (1.0 + (-2.0f32).exp());
        assert!((p[1] - expected).abs() < 1e-6);
    }

    #[test]
    fn inverse_cdf_walks_weights_in_id_order_and_never_returns_zero_weight() {
        let weights = [0.0f32, 0.25, 0.0, 0.5, 0.25, 0.0];
        assert_eq!(sample_inverse_cdf(&weights, 0.0), 1);
        assert_eq!(sample_inverse_cdf(&weights, 0.2499), 1);
        assert_eq!(sample_inverse_cdf(&weights, 0.25), 3);
        assert_eq!(sample_inverse_cdf(&weights, 0.7499), 3);
        assert_eq!(sample_inverse_cdf(&weights, 0.75), 4);
        assert_eq!(sample_inverse_cdf(&weights, 1.0 - f64::EPSILON / 2.0), 4);
        // Unnormalized weights and NaN entries.
        assert_eq!(sample_inverse_cdf(&[f32::NAN, 2.0, 2.0, f32::NAN], 0.6), 2);
        // Rounding past the end (u = 1 cannot come from `uniform`, it stands for rounding).
        assert_eq!(sample_inverse_cdf(&weights, 1.0), 4);
        assert_eq!(sample_inverse_cdf(&[0.0, 0.0], 0.5), 0);
    }

    #[test]
    fn inverse_cdf_across_blocks_matches_a_sequential_walk() {
        // Sparse weights spread over several blocks, with long zero runs.
        let weights: Vec<f32> = (0..1000).map(|i| if i % 97 == 3 { (i % 7 + 1) as f32 } else { 0.0 }).collect();
        let total: f64 = weights.iter().map(|&w| f64::from(w)).sum();
        for k in 0..1000 {
            let u = (k as f64 + 0.5) / 1000.0;
            let mut cumulative = 0.0;
            let expected = weights
                .iter()
                .position(|&w| {
                    cumulative += f64::from(w);
                    w > 0.0 && cumulative > u * total
                })
                .unwrap();
            assert_eq!(sample_inverse_cdf(&weights, u) as usize, expected, "u = {u}");
        }
        assert_eq!(sample_inverse_cdf(&weights, 1.0), 973);
    }

    #[test]
    fn unvalidated_parameters_still_give_a_distribution() {
        let logits = [0.5f32, 2.0, -1.0, 2.0, 0.0];
        for p in [
            params(1.0, 0, 0.0, 0.0),
            params(1.0, 0, -3.0, 0.0),
            params(1.0, 0, f32::NAN, 0.0),
            params(1.0, 0, 1.0, 7.0),
            params(f32::INFINITY, -5, 1.0, -1.0),
            params(f32::NAN, 99, 1.0, 0.0),
            SamplingParams { repetition_penalty: 0.0, ..params(1.0, 2, 0.5, 0.0) },
        ] {
            let history = PenaltyContext::new(&[1, 3], 0);
            let probs = processed_probs(&logits, &p, Some(&history));
            let total: f32 = probs.iter().sum();
            assert!((total - 1.0).abs() < 1e-5, "{p:?}: {probs:?}");
            let token = sample_inverse_cdf(&probs, 0.5) as usize;
            assert!(probs[token] > 0.0, "{p:?}");
        }
        // top_p <= 0 keeps exactly the top tokens (here the tie at 2.0).
        assert_eq!(support(&processed_probs(&logits, &params(1.0, 0, 0.0, 0.0), None)), vec![1, 3]);
    }

    #[test]
    fn workspace_reuse_gives_the_same_rows_as_fresh_processing() {
        let mut ws = SamplingWorkspace::new(4);
        let a = [0.3f32, 1.0, -2.0, 0.7];
        let b = [2.0f32, 1.0, 0.0, -1.0, 5.0, 0.1];
        let p = params(0.8, 3, 0.9, 0.05);
        assert_eq!(ws.processed_probs(&b, &p, None), processed_probs(&b, &p, None).as_slice());
        assert_eq!(ws.processed_probs(&a, &p, None), processed_probs(&a, &p, None).as_slice());
        assert_eq!(ws.penalized_logits(&a, &p, None), &a);
        assert_eq!(ws.penalized_argmax(&a, &p, None), 1);
    }

    #[test]
    fn the_first_token_check_combines_allowed_tokens_bad_words_and_held_back_stops() {
        let allowed = |ids: Vec<u32>| SamplingParams { allowed_token_ids: Some(ids), ..Default::default() };
        assert!(first_token_allowed(&allowed(vec![3]), &[1, 2], 8, &[]));
        // Only EOS is allowed and min_tokens holds it back.
        assert!(!first_token_allowed(&allowed(vec![3]), &[1, 2], 8, &[3]));
        assert!(first_token_allowed(&allowed(vec![3, 4]), &[1, 2], 8, &[3]));
        // Every allowed token is a one-token bad word; a two-token bad word bans only its end.
        let banned = SamplingParams { bad_word_ids: vec![vec![3], vec![4]], ..allowed(vec![3, 4]) };
        assert!(!first_token_allowed(&banned, &[1, 2], 8, &[]));
        let pair = SamplingParams { bad_word_ids: vec![vec![3], vec![2, 4]], ..allowed(vec![3, 4]) };
        assert!(first_token_allowed(&pair, &[1, 2], 8, &[]), "the prompt does not start a bad word");
        // Without masks of its own only the held-back tokens count.
        assert!(first_token_allowed(&SamplingParams::default(), &[1], 2, &[0]));
        assert!(!first_token_allowed(&SamplingParams::default(), &[1], 2, &[0, 1]));
    }
}
