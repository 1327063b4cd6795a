//! Acceptance cost per verify step: `accept_batch` over B = 64 rows of K = 4 drafts at the
//! default model's vocabulary (V = 49152), for the three rules a sampled or greedy request
//! can hit:
//!
//! - greedy: argmax per position;
//! - target-sample match at T = 0.8, top_p = 0.9 (argmax drafts);
//! - rejection sampling against random draft distributions q (sampled drafts).
//!
//! Logits are random (roughly normal, σ = 2), so nucleus truncation has to cover a large
//! part of the vocabulary: a harder case than real, peaked model outputs. Drafts copy the
//! target argmax 70% of the time so walks go past the first position.

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use specrs_core::acceptance::{AcceptanceSampler, VerifyRow};
use specrs_core::config::{DraftProposal, SpeculativeConfig, SpeculativeMethod};
use specrs_core::sampling::{RngStream, SamplingParams, argmax, sample_inverse_cdf, softmax_in_place, uniform};

const BATCH: usize = 64;
const K: usize = 4;
const VOCAB: usize = 49_152;
const DRAFT_MATCHES_ARGMAX: f64 = 0.7;

/// One row's inputs: drafts `[K]`, logits `[(K + 1) · V]`, draft distributions `[K · V]`.
struct RowData {
    drafts: Vec<u32>,
    logits: Vec<f32>,
    draft_probs: Vec<f32>,
}

fn random_normal_row(key: u64, len: usize, scale: f64) -> Vec<f32> {
    (0..len as u64)
        .map(|i| {
            let irwin_hall: f64 = (0..4).map(|j| uniform(key, RngStream::Draft, 4 * i + j)).sum();
            ((irwin_hall - 2.0) * 3f64.sqrt() * scale) as f32
        })
        .collect()
}

fn batch(sampled_drafts: bool) -> Vec<RowData> {
    (0..BATCH as u64)
        .map(|r| {
            let logits = random_normal_row(r, (K + 1) * VOCAB, 2.0);
            let mut draft_probs = Vec::new();
            let drafts = if sampled_drafts {
                draft_probs = random_normal_row(1_000 + r, K * VOCAB, 2.0);
                draft_probs
                    .chunks_mut(VOCAB)
                    .enumerate()
                    .map(|(i, q)| {
                        softmax_in_place(q);
                        sample_inverse_cdf(q, uniform(r, RngStream::Synthetic, i as u64))
                    })
                    .collect()
            } else {
                (0..K)
                    .map(|i| {
                        let position = &logits[i * VOCAB..(i + 1) * VOCAB];
                        if uniform(r, RngStream::Verdict, i as u64) < DRAFT_MATCHES_ARGMAX {
                            argmax(position)
                        } else {
                            (uniform(r, RngStream::Residual, i as u64) * VOCAB as f64) as u32
                        }
                    })
                    .collect()
            };
            RowData { drafts, logits, draft_probs }
        })
        .collect()
}

fn sampler(greedy: bool, proposal: DraftProposal) -> AcceptanceSampler {
    let config = SpeculativeConfig {
        speculative_method: Some(SpeculativeMethod::Eagle),
        num_speculative_tokens: Some(K as i64),
        use_greedy_acceptance: greedy,
        draft_proposal: proposal,
        ..Default::default()
    };
    AcceptanceSampler::new(&config, K, VOCAB, None).expect("valid bench config")
}

fn rows<'a>(data: &'a [RowData], params: &'a SamplingParams, with_probs: bool) -> Vec<VerifyRow<'a>> {
    data.iter()
        .enumerate()
        .map(|(i, d)| {
            let row = VerifyRow::new(&d.drafts, &d.logits, params, 17 + i as u64);
            if with_probs { row.with_draft_probs(&d.draft_probs) } else { row }
        })
        .collect()
}

fn accept_batch(c: &mut Criterion) {
    let mut group = c.benchmark_group(format!("accept_batch/B={BATCH},K={K},V={VOCAB}"));
    group.throughput(Throughput::Elements(BATCH as u64));

    let argmax_drafts = batch(false);
    let greedy_params = SamplingParams::greedy();
    let greedy_rows = rows(&argmax_drafts, &greedy_params, false);
    let greedy = sampler(true, DraftProposal::Argmax);
    group.bench_function("greedy", |b| b.iter(|| greedy.accept_batch(black_box(&greedy_rows))));

    let nucleus = SamplingParams { temperature: 0.8, top_p: 0.9, ..Default::default() };
    let match_rows = rows(&argmax_drafts, &nucleus, false);
    let target_sample = sampler(false, DraftProposal::Argmax);
    group.bench_function("target_sample_match/T=0.8,top_p=0.9", |b| {
        b.iter(|| target_sample.accept_batch(black_box(&match_rows)))
    });

    let sampled_drafts = batch(true);
    let rejection_rows = rows(&sampled_drafts, &nucleus, true);
    let rejection = sampler(false, DraftProposal::Sampled);
    group.bench_function("rejection_sampling/T=0.8,top_p=0.9,random_q", |b| {
        b.iter(|| rejection.accept_batch(black_box(&rejection_rows)))
    });
    group.finish();
}

criterion_group!(benches, accept_batch);
criterion_main!(benches);
