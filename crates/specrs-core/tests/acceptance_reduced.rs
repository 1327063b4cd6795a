//! The reduced walk ([`AcceptanceSampler::accept_reduced_row`]) decides exactly what the walk
//! over logits decides, for every rule, when its reductions are computed from those logits
//! ([`ReducedPosition::from_logits`]): the contract device reductions are held to.

use specrs_core::acceptance::{AcceptanceSampler, ReducedError, ReducedPosition, ReducedRow, VerifyRow};
use specrs_core::config::{DraftProposal, SpeculativeConfig, SpeculativeMethod};
use specrs_core::sampling::{RngStream, SamplingParams, processed_probs, uniform};

const V: usize = 24;
const K: usize = 4;
const THINK_START: u32 = 22;
const THINK_END: u32 = 23;

fn config(f: impl FnOnce(&mut SpeculativeConfig)) -> SpeculativeConfig {
    let mut c = SpeculativeConfig {
        speculative_method: Some(SpeculativeMethod::Eagle),
        num_speculative_tokens: Some(K as i64),
        ..Default::default()
    };
    f(&mut c);
    c
}

/// Deterministic pseudo-random logits with a few peaked positions, so drafts are sometimes
/// accepted and sometimes not.
fn logits(seed: u64, positions: usize) -> Vec<f32> {
    (0..positions * V)
        .map(|i| {
            let u = uniform(seed, RngStream::Draft, i as u64) as f32;
            if i % V == (seed as usize + i / V) % V { 4.0 + u } else { 3.0 * u - 1.0 }
        })
        .collect()
}

/// Drafts that follow the argmax for a while, then wander.
fn drafts(seed: u64, logits: &[f32]) -> Vec<u32> {
    (0..K)
        .map(|i| {
            let row = &logits[i * V..(i + 1) * V];
            if uniform(seed, RngStream::Verdict, i as u64) < 0.7 {
                specrs_core::sampling::argmax(row)
            } else {
                (uniform(seed, RngStream::Residual, i as u64) * V as f64) as u32
            }
        })
        .collect()
}

fn draft_probs(seed: u64, params: &SamplingParams) -> Vec<f32> {
    let raw: Vec<f32> = (0..K * V).map(|i| 2.0 * uniform(seed ^ 0xABCD, RngStream::Draft, i as u64) as f32).collect();
    raw.chunks(V).flat_map(|row| processed_probs(row, params, None)).collect()
}

fn check_rule(sampler: &AcceptanceSampler, params: &SamplingParams, with_q: bool, in_thinking: bool) -> usize {
    let mut accepted_total = 0;
    for seed in 0..300u64 {
        let logits = logits(seed, K + 1);
        let mut drafts = drafts(seed, &logits);
        if in_thinking && seed % 5 == 0 {
            // Leave the reasoning span mid-row: relaxed positions switch to strict ones.
            drafts[1] = THINK_END;
        }
        let q = with_q.then(|| draft_probs(seed, params));
        let mut row = VerifyRow::new(&drafts, &logits, params, seed * 7919).with_thinking(in_thinking);
        if let Some(q) = &q {
            row = row.with_draft_probs(q);
        }
        let expected = sampler.accept_row(&row).unwrap();

        let wants = sampler.reductions_for(params).expect("no penalties");
        let positions: Vec<ReducedPosition> = (0..=K)
            .map(|i| {
                ReducedPosition::from_logits(
                    &logits[i * V..(i + 1) * V],
                    params,
                    row.seed,
                    i,
                    drafts.get(i).copied(),
                    q.as_ref().filter(|_| i < K).map(|q| &q[i * V..(i + 1) * V]),
                    wants,
                )
            })
            .collect();
        let reduced = ReducedRow { drafts: &drafts, positions: &positions, params, seed: row.seed, in_thinking };
        assert_eq!(sampler.accept_reduced_row(&reduced).unwrap(), expected, "seed {seed}");
        accepted_total += expected.num_accepted;
    }
    accepted_total
}

#[test]
fn every_rule_decides_the_same_on_reductions_as_on_logits() {
    let sampled = SamplingParams { temperature: 0.8, top_k: 12, top_p: 0.9, min_p: 0.02, ..Default::default() };
    let plain = SamplingParams { temperature: 1.0, ..Default::default() };
    let greedy = SamplingParams::greedy();
    let thinking = Some((THINK_START, THINK_END));
    let cases: Vec<(&str, SpeculativeConfig, &SamplingParams, bool, bool)> = vec![
        ("greedy rule", config(|c| c.use_greedy_acceptance = true), &sampled, false, false),
        ("greedy row", config(|_| {}), &greedy, false, false),
        ("target-sample match", config(|_| {}), &sampled, false, false),
        ("target-sample match, plain", config(|_| {}), &plain, false, false),
        (
            "relaxed in thinking",
            config(|c| {
                c.use_relaxed_acceptance_for_thinking = true;
                c.relaxed_topk = 3;
                c.relaxed_delta = 0.3;
            }),
            &sampled,
            false,
            true,
        ),
        ("rejection, one-hot", config(|c| c.draft_proposal = DraftProposal::Sampled), &sampled, false, false),
        ("rejection, with q", config(|c| c.draft_proposal = DraftProposal::Sampled), &sampled, true, false),
        ("synthetic", config(|c| c.synthetic_acceptance_rate = Some(0.6)), &sampled, false, false),
    ];
    for (name, cfg, params, with_q, in_thinking) in cases {
        let sampler = AcceptanceSampler::new(&cfg, K, V, thinking).unwrap();
        let accepted = check_rule(&sampler, params, with_q, in_thinking);
        // The cases exercise both outcomes, not only immediate rejections.
        assert!(accepted > 50, "{name}: only {accepted} drafts accepted over 300 rows");
    }
}

#[test]
fn rows_the_reductions_cannot_serve_are_refused() {
    let sampler = AcceptanceSampler::new(&config(|_| {}), K, V, None).unwrap();
    let penalized = SamplingParams { repetition_penalty: 1.3, ..Default::default() };
    assert_eq!(sampler.reductions_for(&penalized), None);
    let params = SamplingParams::default();
    let positions = vec![ReducedPosition::default(); 2];
    let row = ReducedRow { drafts: &[3], positions: &positions, params: &penalized, seed: 1, in_thinking: false };
    assert_eq!(sampler.accept_reduced_row(&row), Err(ReducedError::Penalties));
    let row = ReducedRow { drafts: &[3, 4], positions: &positions, params: &params, seed: 1, in_thinking: false };
    assert_eq!(sampler.accept_reduced_row(&row), Err(ReducedError::Positions { got: 2, num_drafts: 2 }));
    // A sampled row under target-sample match reads target samples.
    let row = ReducedRow { drafts: &[3], positions: &positions, params: &params, seed: 1, in_thinking: false };
    assert_eq!(sampler.accept_reduced_row(&row), Err(ReducedError::Missing { position: 0, what: "target sample" }));
}
