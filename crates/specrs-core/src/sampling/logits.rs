//! Reductions over one position's logits or probabilities (`[V]` slices).
//!
//! Conventions shared by every function here: ties resolve to the lowest token id (so argmax
//! and top-n agree with a stable descending sort), NaN entries are never selected, and sums run
//! in f64 so a 150k-token vocabulary loses no mass to rounding.

use std::cmp::Ordering;

use super::exp::exp_f32;

/// Lanes of the manual max reduction; eight f32 fill one AVX register.
const LANES: usize = 8;

/// Up to this many results `top_n` keeps a sorted insertion list instead of selecting over a
/// copy of the whole row.
const SMALL_TOP_N: usize = 32;

/// The largest non-NaN value, or `-inf` for an empty or all-NaN slice.
#[inline]
pub fn max_value(values: &[f32]) -> f32 {
    // Independent lanes let the compiler keep eight running maxima in one vector register;
    // a single scalar accumulator would serialise on the compare.
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let chunks = values.chunks_exact(LANES);
    let tail = chunks.remainder();
    for chunk in chunks {
        for (lane, &v) in lanes.iter_mut().zip(chunk) {
            if v > *lane {
                *lane = v;
            }
        }
    }
    let mut max = f32::NEG_INFINITY;
    for &v in lanes.iter().chain(tail) {
        if v > max {
            max = v;
        }
    }
    max
}

/// Index of the largest value; the first one on ties. NaN entries are skipped; an empty or
/// all-NaN slice gives 0.
#[inline]
pub fn argmax(values: &[f32]) -> u32 {
    const CHUNK: usize = 4 * LANES;
    let max = max_value(values);
    // Find the chunk holding the first maximum with one vectorised test per chunk, then the
    // position inside it.
    for (c, chunk) in values.chunks(CHUNK).enumerate() {
        if chunk.iter().fold(false, |hit, &v| hit | (v == max))
            && let Some(i) = chunk.iter().position(|&v| v == max)
        {
            return (c * CHUNK + i) as u32;
        }
    }
    0
}

/// In-place softmax. A row whose maximum is `+inf` puts all mass evenly on its `+inf` entries;
/// a row without any finite or infinite-positive value (all `-inf` or NaN) becomes uniform,
/// so a fully masked row degrades to noise instead of NaN.
pub fn softmax_in_place(values: &mut [f32]) {
    softmax_with_inverse_temperature(values, 1.0);
}

/// `softmax(values · inv_temperature)` in place, with the same degenerate-row rules as
/// [`softmax_in_place`]. Returns nothing: the row sums to one.
pub(crate) fn softmax_with_inverse_temperature(values: &mut [f32], inv_temperature: f32) {
    let max = max_value(values);
    if max == f32::INFINITY {
        let count = values.iter().filter(|&&v| v == f32::INFINITY).count();
        let share = 1.0 / count as f32;
        for v in values.iter_mut() {
            *v = if *v == f32::INFINITY { share } else { 0.0 };
        }
        return;
    }
    if max == f32::NEG_INFINITY {
        let share = 1.0 / values.len().max(1) as f32;
        values.fill(share);
        return;
    }
    // `exp_f32` maps NaN to 0: a NaN logit gets no mass.
    values.iter_mut().for_each(|v| *v = exp_f32((*v - max) * inv_temperature));
    // The maximum contributes exp(0) = 1, so the sum is at least one.
    let scale = (1.0 / sum_positive(values)) as f32;
    for v in values.iter_mut() {
        *v *= scale;
    }
}

/// `Σ max(v, 0)` in f64 over `values`, NaN counted as 0. Lane-wise partial sums keep the
/// additions independent (a single f64 accumulator serialises on its add latency); the
/// summation order is fixed, so the result is deterministic.
#[inline]
pub(crate) fn sum_positive(values: &[f32]) -> f64 {
    let mut lanes = [0.0f64; LANES];
    let chunks = values.chunks_exact(LANES);
    let tail = chunks.remainder();
    for chunk in chunks {
        for (lane, &v) in lanes.iter_mut().zip(chunk) {
            *lane += if v > 0.0 { f64::from(v) } else { 0.0 };
        }
    }
    let tail_sum: f64 = tail.iter().map(|&v| if v > 0.0 { f64::from(v) } else { 0.0 }).sum();
    lanes.iter().sum::<f64>() + tail_sum
}

/// `log Σ exp(values)`, computed stably in f64. `-inf` for a row without mass.
pub fn logsumexp(values: &[f32]) -> f32 {
    let max = max_value(values);
    if !max.is_finite() {
        return max;
    }
    let sum: f64 = values.iter().map(|&v| f64::from(v - max).exp()).filter(|e| *e >= 0.0).sum();
    (f64::from(max) + sum.ln()) as f32
}

/// In-place log-softmax (`values - logsumexp(values)`).
pub fn log_softmax_in_place(values: &mut [f32]) {
    let lse = logsumexp(values);
    for v in values.iter_mut() {
        *v -= lse;
    }
}

/// The log-probability of `token` under `softmax(logits)` and the `top_n` most likely tokens
/// with theirs, most likely first. An id outside the row gets `-inf`.
///
/// The server reports logprobs of the raw target logits (before temperature and
/// truncation), as vLLM's default `logprobs_mode` does.
pub fn logprobs_of(logits: &[f32], token: u32, top_n_count: usize) -> (f32, Vec<(u32, f32)>) {
    let lse = logsumexp(logits);
    let logprob = logits.get(token as usize).map_or(f32::NEG_INFINITY, |&l| l - lse);
    let top = top_n(logits, top_n_count).into_iter().map(|(id, l)| (id, l - lse)).collect();
    (logprob, top)
}

/// The 1-based rank of `token` among `values` in [`top_n`]'s order (larger first, ties by
/// lower id; NaN entries rank last): vLLM's `Logprob.rank`. An id outside the row ranks
/// past every entry.
pub fn rank_of(values: &[f32], token: u32) -> usize {
    let Some(&v) = values.get(token as usize) else {
        return values.len() + 1;
    };
    let ahead =
        values
            .iter()
            .enumerate()
            .filter(|&(i, &w)| {
                if v.is_nan() { !w.is_nan() || i < token as usize } else { w > v || (w == v && i < token as usize) }
            })
            .count();
    ahead + 1
}

/// Descending by value, then ascending by id: the order of a stable descending sort.
#[inline]
fn rank_order(a: &(u32, f32), b: &(u32, f32)) -> Ordering {
    b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))
}

/// The `n` largest values with their ids, largest first, ties by lowest id; NaN entries are
/// skipped. Works on probabilities and logits alike.
pub fn top_n(values: &[f32], n: usize) -> Vec<(u32, f32)> {
    if n == 0 {
        return Vec::new();
    }
    if n <= SMALL_TOP_N {
        return top_n_by_insertion(values, n);
    }
    let mut ranked: Vec<(u32, f32)> =
        values.iter().enumerate().filter(|(_, v)| !v.is_nan()).map(|(i, &v)| (i as u32, v)).collect();
    if ranked.len() > n {
        ranked.select_nth_unstable_by(n - 1, rank_order);
        ranked.truncate(n);
    }
    ranked.sort_unstable_by(rank_order);
    ranked
}

/// O(V) for small `n`: most entries fail the single comparison against the current n-th.
fn top_n_by_insertion(values: &[f32], n: usize) -> Vec<(u32, f32)> {
    let mut best: Vec<(u32, f32)> = Vec::with_capacity(n + 1);
    for (i, &v) in values.iter().enumerate() {
        if v.is_nan() || (best.len() == n && v <= best[n - 1].1) {
            continue;
        }
        // Strictly-less keeps earlier (lower) ids ahead of equal values.
        let at = best.partition_point(|&(_, b)| b >= v);
        best.insert(at, (i as u32, v));
        best.truncate(n);
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argmax_takes_the_first_maximum_and_skips_nan() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), 1);
        assert_eq!(argmax(&[f32::NAN, 0.5, f32::NAN, 0.7]), 3);
        assert_eq!(argmax(&[f32::NEG_INFINITY; 4]), 0);
        assert_eq!(argmax(&[]), 0);
        assert_eq!(argmax(&[f32::NAN; 3]), 0);
        // Longer than one lane block, maximum in the tail.
        let mut v = vec![0.0f32; 37];
        v[36] = 1.0;
        assert_eq!(argmax(&v), 36);
    }

    #[test]
    fn softmax_matches_the_definition_and_handles_degenerate_rows() {
        let mut v = [1.0f32, 2.0, 3.0];
        softmax_in_place(&mut v);
        let z: f32 = [1.0f32, 2.0, 3.0].iter().map(|x| x.exp()).sum();
        for (p, x) in v.iter().zip([1.0f32, 2.0, 3.0]) {
            assert!((p - x.exp() / z).abs() < 1e-6);
        }
        let mut masked = [f32::NEG_INFINITY; 4];
        softmax_in_place(&mut masked);
        assert_eq!(masked, [0.25; 4]);
        let mut inf = [0.0, f32::INFINITY, 1.0, f32::INFINITY];
        softmax_in_place(&mut inf);
        assert_eq!(inf, [0.0, 0.5, 0.0, 0.5]);
        let mut nan = [0.0, f32::NAN, 0.0];
        softmax_in_place(&mut nan);
        assert_eq!(nan, [0.5, 0.0, 0.5]);
    }

    #[test]
    fn temperature_sharpens_and_flattens() {
        let mut sharp = [1.0f32, 2.0];
        softmax_with_inverse_temperature(&mut sharp, 2.0);
        let expected = 1.0 / (1.0 + (-2.0f32).exp());
        assert!((sharp[1] - expected).abs() < 1e-6);
    }

    #[test]
    fn logprobs_are_log_softmax_of_the_raw_logits() {
        let logits = [0.5f32, 2.0, -1.0, 2.0];
        let mut expected = logits;
        log_softmax_in_place(&mut expected);
        let (lp, top) = logprobs_of(&logits, 2, 2);
        assert!((lp - expected[2]).abs() < 1e-6);
        assert_eq!(top.iter().map(|t| t.0).collect::<Vec<_>>(), vec![1, 3]);
        assert!((top[0].1 - expected[1]).abs() < 1e-6);
        let total: f32 = expected.iter().map(|l| l.exp()).sum();
        assert!((total - 1.0).abs() < 1e-6);
        assert_eq!(logprobs_of(&logits, 9, 0), (f32::NEG_INFINITY, vec![]));
    }

    #[test]
    fn rank_is_the_position_in_the_top_n_order() {
        let logits = [0.5f32, 2.0, -1.0, 2.0, f32::NAN, 0.5];
        let order: Vec<u32> = top_n(&logits, logits.len()).into_iter().map(|(id, _)| id).collect();
        for (position, &id) in order.iter().enumerate() {
            assert_eq!(rank_of(&logits, id), position + 1, "token {id} in {order:?}");
        }
        assert_eq!(rank_of(&logits, 4), 6, "NaN ranks last");
        assert_eq!(rank_of(&logits, 99), 7);
    }

    #[test]
    fn top_n_equals_a_stable_descending_sort_on_both_paths() {
        // Values with many ties, long enough for both the insertion and the selection path.
        let values: Vec<f32> = (0..500u32).map(|i| ((i * 7919) % 53) as f32 / 4.0).collect();
        let mut sorted: Vec<(u32, f32)> = values.iter().enumerate().map(|(i, &v)| (i as u32, v)).collect();
        sorted.sort_by(|a, b| b.1.partial_cmp(&a.1).unwrap());
        for n in [1, 5, SMALL_TOP_N, SMALL_TOP_N + 1, 100, 500, 900] {
            assert_eq!(top_n(&values, n), sorted[..n.min(500)].to_vec(), "n={n}");
        }
        assert_eq!(top_n(&[f32::NAN, 1.0, f32::NAN], 3), vec![(1, 1.0)]);
        assert_eq!(top_n(&[1.0], 0), vec![]);
    }
}
