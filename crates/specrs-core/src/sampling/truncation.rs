//! Top-k, top-p and min-p cut-offs, each in O(V) expected time without sorting the row.
//!
//! Each function returns a threshold: the kept set is every token at or above it. Tokens tied
//! with the boundary token are therefore kept together (as the sorting implementations of
//! vLLM and the fused top-k kernels do), so the set never depends on how ties are ordered.

/// Below this many candidates a plain sort is cheaper than another partition round.
const SORT_BELOW: usize = 32;

/// Partition rounds before giving up on pivots and sorting what is left; median-of-three
/// pivots make this unreachable except on adversarial rows.
const MAX_PARTITION_ROUNDS: usize = 64;

/// The k-th largest value of `values` (`1 <= k <= values.len()`), found by selection on a
/// copy in `pool`. NaN values are not candidates; if fewer than `k` values remain the
/// smallest candidate (or `-inf`) is returned so everything is kept.
pub(crate) fn kth_largest(values: &[f32], k: usize, pool: &mut Vec<f32>) -> f32 {
    pool.clear();
    pool.extend(values.iter().copied().filter(|v| !v.is_nan()));
    if pool.is_empty() {
        return f32::NEG_INFINITY;
    }
    let k = k.clamp(1, pool.len());
    let (_, kth, _) = pool.select_nth_unstable_by(k - 1, |a, b| b.total_cmp(a));
    *kth
}

/// Buckets of the top-p histogram. A non-negative f32's bit pattern orders like its value,
/// so `bits >> BUCKET_SHIFT` splits every power of two into 8 contiguous value ranges;
/// probabilities up to 1.0 fall in buckets `..=1016`.
const BUCKETS: usize = 1024;
const BUCKET_SHIFT: u32 = 20;

#[inline]
fn bucket_of(p: f32) -> usize {
    ((p.to_bits() >> BUCKET_SHIFT) as usize).min(BUCKETS - 1)
}

/// The probability of the token at which the nucleus closes: walking tokens from most to
/// least likely, the first one whose cumulative mass reaches `top_p`. Keeping every token
/// with `p >= threshold` keeps the smallest such set (plus ties with its last token).
///
/// `probs` (`[V]`) should sum to one; if rounding leaves its total below `top_p` the
/// threshold keeps every positive token. Two passes, no sort: the first sums the mass of each
/// value bucket (branch-free), the buckets are walked from the top to the one where the mass
/// reaches `top_p`, and only that bucket's probabilities (copied into `pool`) are searched
/// for the boundary token by a weighted quickselect.
pub(crate) fn top_p_threshold(probs: &[f32], top_p: f32, pool: &mut Vec<f32>) -> f32 {
    let mut mass = [0.0f64; BUCKETS];
    for &p in probs {
        // Zero, negative and NaN entries add nothing (to bucket 0).
        let p = if p > 0.0 { p } else { 0.0 };
        mass[bucket_of(p)] += f64::from(p);
    }
    // An unvalidated `top_p <= 0` keeps just the most likely token(s).
    let target = f64::from(top_p).max(f64::MIN_POSITIVE);
    let mut covered = 0.0f64;
    // Bucket 0 holds zeros and the smallest subnormals: reaching it means keeping everything.
    let mut boundary = None;
    for bucket in (1..BUCKETS).rev() {
        if mass[bucket] > 0.0 && covered + mass[bucket] >= target {
            boundary = Some((bucket, target - covered));
            break;
        }
        covered += mass[bucket];
    }
    let Some((bucket, need)) = boundary else {
        return 0.0;
    };
    collect_bucket(probs, bucket, pool);
    // If rounding left the bucket a hair short of `need`, its smallest token closes the set.
    weighted_select(pool, need).unwrap_or_else(|| pool.iter().copied().fold(f32::INFINITY, f32::min))
}

/// Copies the probabilities of `bucket` (`>= 1`) into `pool`. A bucket is a value range
/// `[low, high)`; chunks without a member, the vast majority, are rejected by one vectorised
/// range test instead of a branch per token.
fn collect_bucket(probs: &[f32], bucket: usize, pool: &mut Vec<f32>) {
    const CHUNK: usize = 16;
    debug_assert!((1..BUCKETS).contains(&bucket));
    let low = f32::from_bits((bucket as u32) << BUCKET_SHIFT);
    let high = f32::from_bits((bucket as u32 + 1) << BUCKET_SHIFT);
    let in_bucket = |p: f32| (p >= low) & (p < high);
    pool.clear();
    for chunk in probs.chunks(CHUNK) {
        if chunk.iter().fold(false, |hit, &p| hit | in_bucket(p)) {
            pool.extend(chunk.iter().copied().filter(|&p| in_bucket(p)));
        }
    }
}

/// The value at which the descending cumulative mass of `values` first reaches `need`, or
/// `None` when all of them together fall short. Weighted quickselect: each round partitions
/// around a pivot and keeps only the side holding the boundary, O(n) expected.
fn weighted_select(values: &mut [f32], mut need: f64) -> Option<f32> {
    let (mut lo, mut hi) = (0usize, values.len());
    let mut rounds = 0;
    while hi - lo > SORT_BELOW && rounds < MAX_PARTITION_ROUNDS {
        rounds += 1;
        let pivot = median_of_three(values[lo], values[lo + (hi - lo) / 2], values[hi - 1]);
        let (greater_end, equal_end) = partition_descending(&mut values[lo..hi], pivot);
        let (greater_end, equal_end) = (lo + greater_end, lo + equal_end);
        let greater_mass: f64 = values[lo..greater_end].iter().map(|&p| f64::from(p)).sum();
        if greater_mass >= need {
            hi = greater_end;
            continue;
        }
        let with_equal = greater_mass + f64::from(pivot) * (equal_end - greater_end) as f64;
        if with_equal >= need {
            return Some(pivot);
        }
        need -= with_equal;
        lo = equal_end;
    }
    let rest = &mut values[lo..hi];
    rest.sort_unstable_by(|a, b| b.total_cmp(a));
    let mut covered = 0.0f64;
    for &p in rest.iter() {
        covered += f64::from(p);
        if covered >= need {
            return Some(p);
        }
    }
    None
}

/// The min-p cut: tokens below `min_p` times the most likely token's probability go.
#[inline]
pub(crate) fn min_p_threshold(max_prob: f32, min_p: f32) -> f32 {
    min_p * max_prob
}

#[inline]
fn median_of_three(a: f32, b: f32, c: f32) -> f32 {
    a.max(b).min(a.min(b).max(c))
}

/// Three-way partition of `values` into `[> pivot | == pivot | < pivot]`; returns the ends
/// of the first two parts.
fn partition_descending(values: &mut [f32], pivot: f32) -> (usize, usize) {
    let (mut greater_end, mut i, mut less_start) = (0, 0, values.len());
    while i < less_start {
        let v = values[i];
        if v > pivot {
            values.swap(greater_end, i);
            greater_end += 1;
            i += 1;
        } else if v < pivot {
            less_start -= 1;
            values.swap(i, less_start);
        } else {
            i += 1;
        }
    }
    (greater_end, less_start)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::rng::{RngStream, uniform};

    /// The definition: sort descending, walk until the cumulative mass reaches `top_p`.
    fn sorted_top_p_threshold(probs: &[f32], top_p: f32) -> f32 {
        let mut sorted: Vec<f32> = probs.iter().copied().filter(|&p| p > 0.0).collect();
        sorted.sort_by(|a, b| b.total_cmp(a));
        let mut covered = 0.0f64;
        for p in sorted {
            covered += f64::from(p);
            if covered >= f64::from(top_p) {
                return p;
            }
        }
        0.0
    }

    fn random_probs(seed: u64, len: usize, sharpness: f64) -> Vec<f32> {
        let weights: Vec<f64> =
            (0..len as u64).map(|i| (sharpness * uniform(seed, RngStream::TargetSample, i)).exp()).collect();
        let total: f64 = weights.iter().sum();
        weights.iter().map(|w| (w / total) as f32).collect()
    }

    #[test]
    fn top_p_threshold_agrees_with_sorting_on_flat_and_peaked_rows() {
        let mut pool = Vec::new();
        for (seed, len, sharpness) in [(1, 10, 1.0), (2, 1000, 0.5), (3, 5000, 20.0), (4, 3000, 60.0)] {
            let probs = random_probs(seed, len, sharpness);
            for top_p in [0.05, 0.5, 0.8, 0.9, 0.99, 1.0] {
                assert_eq!(
                    top_p_threshold(&probs, top_p, &mut pool),
                    sorted_top_p_threshold(&probs, top_p),
                    "seed {seed} len {len} top_p {top_p}"
                );
            }
        }
    }

    #[test]
    fn top_p_threshold_keeps_ties_with_the_boundary_token() {
        let mut pool = Vec::new();
        let probs = vec![0.025f32; 40];
        // Any single token reaches 0.01; the threshold keeps all 40 equal tokens.
        assert_eq!(top_p_threshold(&probs, 0.01, &mut pool), 0.025);
        let probs = [0.5f32, 0.2, 0.2, 0.1];
        assert_eq!(top_p_threshold(&probs, 0.6, &mut pool), 0.2);
        assert_eq!(top_p_threshold(&probs, 0.5, &mut pool), 0.5);
        assert_eq!(top_p_threshold(&[0.3f32, 0.3], 0.9, &mut pool), 0.0);
    }

    #[test]
    fn top_p_threshold_resolves_boundaries_inside_a_crowded_bucket() {
        let mut pool = Vec::new();
        // 1000 distinct values within one bucket ([0.5, 0.5625)), then renormalised: the
        // boundary has to be found among them, not just located in the bucket.
        let raw: Vec<f32> = (0..1000).map(|i| 0.5 + i as f32 * 5e-5).collect();
        let total: f32 = raw.iter().sum();
        let probs: Vec<f32> = raw.iter().map(|x| x / total).collect();
        for top_p in [0.001, 0.3, 0.77, 0.999] {
            assert_eq!(top_p_threshold(&probs, top_p, &mut pool), sorted_top_p_threshold(&probs, top_p));
        }
        // NaN and negative entries are ignored.
        let dirty = [0.5f32, f32::NAN, -0.2, 0.3, 0.2];
        assert_eq!(top_p_threshold(&dirty, 0.6, &mut pool), 0.3);
    }

    #[test]
    fn weighted_select_reports_a_short_fall() {
        let mut values = vec![0.1f32; 100];
        assert_eq!(weighted_select(&mut values, 5.0), Some(0.1));
        assert_eq!(weighted_select(&mut values, 10.5), None);
    }

    #[test]
    fn kth_largest_selects_by_value_and_skips_nan() {
        let mut pool = Vec::new();
        let values = [0.1f32, 5.0, f32::NAN, 3.0, 3.0, -1.0];
        assert_eq!(kth_largest(&values, 1, &mut pool), 5.0);
        assert_eq!(kth_largest(&values, 2, &mut pool), 3.0);
        assert_eq!(kth_largest(&values, 3, &mut pool), 3.0);
        assert_eq!(kth_largest(&values, 5, &mut pool), -1.0);
        assert_eq!(kth_largest(&values, 9, &mut pool), -1.0);
        assert_eq!(kth_largest(&[f32::NAN], 1, &mut pool), f32::NEG_INFINITY);
    }

    #[test]
    fn median_of_three_is_the_middle_value() {
        for (a, b, c) in [(1.0, 2.0, 3.0), (3.0, 1.0, 2.0), (2.0, 3.0, 1.0), (2.0, 2.0, 1.0)] {
            let mut v = [a, b, c];
            v.sort_by(f32::total_cmp);
            assert_eq!(median_of_three(a, b, c), v[1]);
        }
    }
}
