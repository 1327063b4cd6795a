//! Synthetic acceptance: the measured mean joint acceptance matches the configured rate, and
//! every emitted non-draft token is the target argmax.

use specrs_core::acceptance::{AcceptanceSampler, VerifyRow, calibrate_per_position_rate};
use specrs_core::config::{SpeculativeConfig, SpeculativeMethod};
use specrs_core::sampling::{RngStream, SamplingParams, argmax, uniform};

const V: usize = 6;
const STEPS: u64 = 100_000;

fn synthetic_sampler(rate: f64, k: usize) -> AcceptanceSampler {
    let config = SpeculativeConfig {
        speculative_method: Some(SpeculativeMethod::Eagle),
        num_speculative_tokens: Some(k as i64),
        synthetic_acceptance_rate: Some(rate),
        ..Default::default()
    };
    AcceptanceSampler::new(&config, k, V, None).unwrap()
}

#[test]
fn measured_mean_joint_acceptance_matches_the_configured_rate() {
    // Sampled (non-greedy) rows with random logits: synthetic acceptance ignores both.
    let params = SamplingParams::default();
    for rate in [0.3, 0.7, 0.9] {
        for k in [1usize, 3, 5] {
            let sampler = synthetic_sampler(rate, k);
            let a = sampler.synthetic_rule().unwrap().per_position_rate;
            assert_eq!(a, calibrate_per_position_rate(rate, k));
            let drafts: Vec<u32> = (0..k as u32).map(|i| i % V as u32).collect();
            let mut reached = vec![0u64; k + 1];
            for step in 0..STEPS {
                let logits: Vec<f32> =
                    (0..(k + 1) * V).map(|c| uniform(step, RngStream::Draft, c as u64) as f32).collect();
                let out = sampler.accept_row(&VerifyRow::new(&drafts, &logits, &params, 77 + step)).unwrap();
                for count in reached.iter_mut().take(out.num_accepted + 1) {
                    *count += 1;
                }
                let position = &logits[out.num_accepted * V..(out.num_accepted + 1) * V];
                assert_eq!(out.next_token(), Some(argmax(position)), "rate {rate} k {k} step {step}");
                assert_eq!(out.next_is_bonus, out.num_accepted == k);
            }
            // P(first i accepted) for i = 1..=K, and its mean.
            let joint: Vec<f64> = reached[1..].iter().map(|&c| c as f64 / STEPS as f64).collect();
            let mean = joint.iter().sum::<f64>() / k as f64;
            assert!((mean - rate).abs() < 0.01, "rate {rate} k {k}: measured {mean}");
            for (i, p) in joint.iter().enumerate() {
                let want = a.powi(i as i32 + 1);
                assert!((p - want).abs() < 0.01, "rate {rate} k {k} position {i}: {p} vs {want}");
            }
        }
    }
}

#[test]
fn extreme_rates_accept_nothing_or_everything() {
    let logits = vec![0.0f32; 4 * V];
    let params = SamplingParams::default();
    for seed in 0..200 {
        let none = synthetic_sampler(0.0, 3).accept_row(&VerifyRow::new(&[1, 2, 3], &logits, &params, seed)).unwrap();
        assert_eq!(none.tokens, vec![0]);
        let all = synthetic_sampler(1.0, 3).accept_row(&VerifyRow::new(&[1, 2, 3], &logits, &params, seed)).unwrap();
        assert_eq!(all.tokens, vec![1, 2, 3, 0]);
    }
}

#[test]
fn synthetic_overrides_greedy_rows_and_penalizes_its_argmax() {
    // A greedy row whose drafts all match the argmax still follows the coin at rate 0.
    let sampler = synthetic_sampler(0.0, 2);
    let mut logits = vec![0.0f32; 3 * V];
    logits[1] = 1.0;
    logits[2] = 0.8;
    let greedy = SamplingParams { presence_penalty: 0.5, ..SamplingParams::greedy() };
    let out = sampler.accept_row(&VerifyRow::new(&[1, 1], &logits, &greedy, 5)).unwrap();
    assert_eq!(out.num_accepted, 0);
    assert_eq!(out.tokens, vec![1]);
    // With token 1 in the output, the presence penalty moves the argmax to 2.
    let out = sampler.accept_row(&VerifyRow::new(&[1, 1], &logits, &greedy, 5).with_history(&[1], 0)).unwrap();
    assert_eq!(out.tokens, vec![2]);
}
