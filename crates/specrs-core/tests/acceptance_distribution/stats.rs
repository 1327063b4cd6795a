//! Goodness-of-fit statistics, written out so the tests depend on nothing but std.

use std::f64::consts::PI;

/// Bins with fewer expected draws than this are merged (the usual χ² validity rule).
const MIN_EXPECTED_PER_BIN: f64 = 5.0;

/// `ln Γ(x)` for `x > 0`: Lanczos approximation (g = 7, 9 terms), ~1e-15 relative error.
pub fn ln_gamma(x: f64) -> f64 {
    const G: f64 = 7.0;
    const COEFFICIENTS: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    if x < 0.5 {
        // Reflection: Γ(x) Γ(1 - x) = π / sin(πx).
        return (PI / (PI * x).sin()).ln() - ln_gamma(1.0 - x);
    }
    let x = x - 1.0;
    let t = x + G + 0.5;
    let series =
        COEFFICIENTS[1..].iter().enumerate().fold(COEFFICIENTS[0], |acc, (i, c)| acc + c / (x + i as f64 + 1.0));
    0.5 * (2.0 * PI).ln() + (x + 0.5) * t.ln() - t + series.ln()
}

/// The regularized upper incomplete gamma function `Q(a, x) = Γ(a, x) / Γ(a)`: the power
/// series of `P` below `x = a + 1`, Lentz's continued fraction for `Q` above (Numerical
/// Recipes §6.2).
pub fn regularized_gamma_q(a: f64, x: f64) -> f64 {
    if x <= 0.0 {
        return 1.0;
    }
    let prefactor = (-x + a * x.ln() - ln_gamma(a)).exp();
    if x < a + 1.0 {
        let (mut term, mut sum, mut ap) = (1.0 / a, 1.0 / a, a);
        for _ in 0..10_000 {
            ap += 1.0;
            term *= x / ap;
            sum += term;
            if term.abs() < sum.abs() * 1e-16 {
                break;
            }
        }
        1.0 - sum * prefactor
    } else {
        const TINY: f64 = 1e-300;
        let mut b = x + 1.0 - a;
        let mut c = 1.0 / TINY;
        let mut d = 1.0 / b;
        let mut h = d;
        for i in 1..10_000 {
            let an = -(i as f64) * (i as f64 - a);
            b += 2.0;
            d = an * d + b;
            if d.abs() < TINY {
                d = TINY;
            }
            c = b + an / c;
            if c.abs() < TINY {
                c = TINY;
            }
            d = 1.0 / d;
            let delta = d * c;
            h *= delta;
            if (delta - 1.0).abs() < 1e-16 {
                break;
            }
        }
        prefactor * h
    }
}

/// `P(χ²_df >= statistic)`.
pub fn chi_square_survival(statistic: f64, df: usize) -> f64 {
    regularized_gamma_q(df as f64 / 2.0, statistic / 2.0)
}

/// A χ² goodness-of-fit result.
#[derive(Debug, Clone)]
pub struct GoodnessOfFit {
    pub draws: u64,
    pub statistic: f64,
    pub df: usize,
    pub p_value: f64,
    /// Draws of tokens the expected distribution gives no mass (must be zero).
    pub impossible_draws: u64,
}

/// Pearson's χ² test of `observed` counts against `expected` probabilities (`[V]`, summing to
/// one). Zero-probability tokens are left out of the statistic and reported in
/// `impossible_draws`; bins expecting fewer than 5 draws are merged, smallest first.
pub fn chi_square(observed: &[u64], expected: &[f64]) -> GoodnessOfFit {
    assert_eq!(observed.len(), expected.len());
    let draws: u64 = observed.iter().sum();
    let impossible_draws = observed.iter().zip(expected).filter(|&(_, &e)| e <= 0.0).map(|(&o, _)| o).sum();
    let mut bins: Vec<(f64, f64)> =
        observed.iter().zip(expected).filter(|&(_, &e)| e > 0.0).map(|(&o, &e)| (e * draws as f64, o as f64)).collect();
    bins.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut merged: Vec<(f64, f64)> = Vec::new();
    let mut pending = (0.0, 0.0);
    for (e, o) in bins {
        pending = (pending.0 + e, pending.1 + o);
        if pending.0 >= MIN_EXPECTED_PER_BIN {
            merged.push(pending);
            pending = (0.0, 0.0);
        }
    }
    if pending.0 > 0.0 {
        match merged.last_mut() {
            Some(last) => *last = (last.0 + pending.0, last.1 + pending.1),
            None => merged.push(pending),
        }
    }
    let statistic: f64 = merged.iter().map(|(e, o)| (o - e) * (o - e) / e).sum();
    let df = merged.len().saturating_sub(1);
    let p_value = if df == 0 { 1.0 } else { chi_square_survival(statistic, df) };
    GoodnessOfFit { draws, statistic, df, p_value, impossible_draws }
}

/// Euclidean distance between two distributions.
pub fn l2_distance(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum::<f64>().sqrt()
}

/// The normalized histogram of `samples` over `vocab` tokens.
pub fn histogram(samples: &[u32], vocab: usize) -> Vec<f64> {
    let mut counts = vec![0.0; vocab];
    for &s in samples {
        counts[s as usize] += 1.0;
    }
    counts.iter().map(|c| c / samples.len() as f64).collect()
}
