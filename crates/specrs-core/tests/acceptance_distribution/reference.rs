//! A deliberately naive reference for the processed target distribution: f64 throughout,
//! full sorts, penalties from raw occurrence counts. The sampler's optimised path must agree
//! with it.

use specrs_core::sampling::SamplingParams;

/// The processed target of one position's `logits` (`[V]`) for a request whose prompt is
/// `prompt` and whose output so far (including accepted drafts) is `output`.
pub fn reference_probs(logits: &[f32], params: &SamplingParams, prompt: &[u32], output: &[u32]) -> Vec<f64> {
    let vocab = logits.len();
    let mut l: Vec<f64> = logits.iter().map(|&x| f64::from(x)).collect();
    for (token, logit) in l.iter_mut().enumerate() {
        let count = output.iter().filter(|&&t| t as usize == token).count() as f64;
        let seen = count > 0.0 || prompt.iter().any(|&t| t as usize == token);
        if seen {
            let r = f64::from(params.repetition_penalty);
            *logit = if *logit > 0.0 { *logit / r } else { *logit * r };
        }
        if count > 0.0 {
            *logit -= f64::from(params.frequency_penalty) * count + f64::from(params.presence_penalty);
        }
    }
    if params.top_k > 0 && (params.top_k as usize) < vocab {
        let mut sorted = l.clone();
        sorted.sort_by(|a, b| b.total_cmp(a));
        let kth = sorted[params.top_k as usize - 1];
        l.iter_mut().filter(|x| **x < kth).for_each(|x| *x = f64::NEG_INFINITY);
    }
    let max = l.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let t = f64::from(params.temperature);
    let mut p: Vec<f64> = l.iter().map(|x| ((x - max) / t).exp()).collect();
    normalize(&mut p);
    if params.top_p < 1.0 {
        let mut order: Vec<usize> = (0..vocab).collect();
        order.sort_by(|&a, &b| p[b].total_cmp(&p[a]));
        let mut cumulative = 0.0;
        let mut threshold = 0.0;
        for &i in &order {
            cumulative += p[i];
            if cumulative >= f64::from(params.top_p) {
                threshold = p[i];
                break;
            }
        }
        p.iter_mut().filter(|x| **x < threshold).for_each(|x| *x = 0.0);
    }
    if params.min_p > 0.0 {
        let cut = f64::from(params.min_p) * p.iter().copied().fold(0.0, f64::max);
        p.iter_mut().filter(|x| **x < cut).for_each(|x| *x = 0.0);
    }
    normalize(&mut p);
    p
}

pub fn normalize(p: &mut [f64]) {
    let total: f64 = p.iter().sum();
    p.iter_mut().for_each(|x| *x /= total);
}
