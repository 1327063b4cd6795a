//! Cutting a row's argmax drafts short where they stop being worth verifying
//! (`draft_confidence_threshold`, a spec-rs extension).
//!
//! A draft is accepted only if every draft before it was, so for a calibrated drafter the
//! chance that draft `i` is accepted is about the product of the drafter's top-1
//! probabilities up to it (EAGLE-2's observation, which its dynamic trees rank by). Each verified draft costs
//! the target a row of its forward, and on CPUs without wide int8 products that row costs a
//! sizeable share of a plain step; a chain continued past the point where it is likely to be
//! rejected spends that on nothing. The row's chain stops at the first draft whose running
//! product falls below the threshold, that draft excluded. Sampled drafts are never cut: they
//! are not the drafter's top-1, and rejection sampling has its own accounting.

/// Logits further than this below the row's maximum add less than `e^-20` each to the softmax
/// denominator: skipping them changes the top-1 probability by far less than any threshold
/// resolves, and spares an `exp` per entry of a mostly flat vocabulary.
const NEGLIGIBLE_LOGIT_GAP: f32 = 20.0;

/// The cut rule of one pipeline: drafts stop where their running probability falls below
/// `threshold`; 0 keeps every draft (and computes nothing).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct DraftConfidence {
    threshold: f32,
}

impl DraftConfidence {
    /// A rule with `threshold` in `[0, 1)` (validated with the speculative config).
    pub fn new(threshold: f64) -> Self {
        Self { threshold: threshold as f32 }
    }

    pub fn is_off(&self) -> bool {
        self.threshold <= 0.0
    }

    /// Whether a row keeps its next greedy draft `best` (the argmax of `logits`, over the
    /// drafter's vocabulary), updating the row's running product `chain` (1.0 before its first
    /// draft) when it does.
    pub fn keeps(&self, chain: &mut f32, logits: &[f32], best: u32) -> bool {
        if self.is_off() {
            return true;
        }
        self.keeps_top(chain, top_probability(logits, logits[best as usize]))
    }

    /// [`Self::keeps`] for a draft whose top-1 probability was computed elsewhere
    /// ([`top_probabilities`] on the drafter's device).
    pub fn keeps_top(&self, chain: &mut f32, top: f32) -> bool {
        if self.is_off() {
            return true;
        }
        let product = *chain * top;
        if product < self.threshold {
            return false;
        }
        *chain = product;
        true
    }
}

/// Softmax probability of each row's largest logit, `logits [n, V]` to `[n]` on their device,
/// with the host's floor (logits more than [`NEGLIGIBLE_LOGIT_GAP`] below the maximum add
/// nothing), so only `n` numbers cross to the host.
pub fn top_probabilities(logits: &candle_core::Tensor) -> candle_core::Result<candle_core::Tensor> {
    use candle_core::D;
    let max = logits.max_keepdim(D::Minus1)?;
    let shifted = logits.broadcast_sub(&max)?;
    let kept = shifted.ge(-NEGLIGIBLE_LOGIT_GAP)?;
    let terms = kept.where_cond(&shifted.exp()?, &shifted.zeros_like()?)?;
    terms.sum(D::Minus1)?.recip()
}

/// Softmax probability of the largest logit `max` of `logits`.
fn top_probability(logits: &[f32], max: f32) -> f32 {
    if !max.is_finite() {
        // An infinite maximum takes all the mass (shared among ties); NaN logits are no
        // evidence for a draft.
        return if max == f32::INFINITY { 1.0 / logits.iter().filter(|&&x| x == max).count() as f32 } else { 0.0 };
    }
    let floor = max - NEGLIGIBLE_LOGIT_GAP;
    1.0 / logits.iter().filter(|&&x| x > floor).map(|&x| (x - max).exp()).sum::<f32>()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `ln` of unnormalised probabilities, so the softmax of the result is `p / Σp`.
    fn logits(p: &[f32]) -> Vec<f32> {
        p.iter().map(|x| x.ln()).collect()
    }

    #[test]
    fn top_probability_is_the_softmax_of_the_maximum() {
        assert!((top_probability(&logits(&[0.5, 0.25, 0.25]), 0.5f32.ln()) - 0.5).abs() < 1e-6);
        let mut flat = vec![0.0f32; 8192];
        flat[17] = 3.0;
        let exact = 3.0f32.exp() / (3.0f32.exp() + 8191.0);
        assert!((top_probability(&flat, 3.0) - exact).abs() < 1e-6);
        // Far-below entries are negligible, not lost: one dominant logit is probability ~1.
        let mut peaked = vec![-100.0f32; 8192];
        peaked[3] = 10.0;
        assert!((top_probability(&peaked, 10.0) - 1.0).abs() < 1e-6);
        assert_eq!(top_probability(&[f32::INFINITY, 1.0, f32::INFINITY], f32::INFINITY), 0.5);
        assert_eq!(top_probability(&[f32::NAN, 1.0], f32::NAN), 0.0);
    }

    #[test]
    fn device_top_probabilities_match_the_host_rule() {
        let mut flat = vec![0.0f32; 8192];
        flat[17] = 3.0;
        let mut peaked = vec![-100.0f32; 8192];
        peaked[3] = 10.0;
        let mut skewed = logits(&[0.5, 0.25, 0.25]);
        skewed.resize(8192, -1e9);
        let rows = [flat, peaked, skewed];
        let t = candle_core::Tensor::from_vec(rows.concat(), (3, 8192), &candle_core::Device::Cpu).unwrap();
        let device = top_probabilities(&t).unwrap().to_vec1::<f32>().unwrap();
        for (row, got) in rows.iter().zip(device) {
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let host = top_probability(row, max);
            assert!((got - host).abs() < 1e-6, "device {got} vs host {host}");
        }
    }

    #[test]
    fn a_chain_stops_at_the_first_draft_whose_running_product_falls_below_the_threshold() {
        let rule = DraftConfidence::new(0.3);
        let mut chain = 1.0;
        // 0.8, then 0.8 · 0.5 = 0.4 >= 0.3: both kept.
        assert!(rule.keeps(&mut chain, &logits(&[0.8, 0.2]), 0));
        assert!(rule.keeps(&mut chain, &logits(&[0.5, 0.3, 0.2]), 0));
        assert!((chain - 0.4).abs() < 1e-6);
        // 0.4 · 0.6 = 0.24 < 0.3: cut, and the product stays what the kept drafts earned.
        assert!(!rule.keeps(&mut chain, &logits(&[0.6, 0.4]), 0));
        assert!((chain - 0.4).abs() < 1e-6);
        // A first draft below the threshold is cut too: the row verifies nothing.
        let mut first = 1.0;
        assert!(!rule.keeps(&mut first, &logits(&[0.25, 0.25, 0.25, 0.25]), 0));
    }

    #[test]
    fn the_off_rule_keeps_everything_without_looking() {
        let rule = DraftConfidence::default();
        assert!(rule.is_off());
        let mut chain = 1.0;
        assert!(rule.keeps(&mut chain, &[f32::NAN, 0.0], 1));
        assert_eq!(chain, 1.0);
    }
}
