//! Losslessness of stochastic acceptance: every emitted token follows the processed target
//! distribution, at every position.
//!
//! Setting: `K = 2` drafts, vocabulary 12, random target logits per position, 100 000 trials
//! per case with consecutive step seeds (as the engine produces). With `p_i` the processed
//! target at position `i` given the committed prefix, and `q_i` the proposal (one-hot for
//! argmax drafts), speculative sampling guarantees:
//!
//! - first emitted token `~ p_0`;
//! - recovered token at the first position, given a rejection `~ max(p_0 - q_0, 0)`
//!   normalised (for one-hot `q_0`: `p_0` conditioned on `≠ d_0`);
//! - second emitted token, given the first draft was accepted: `p_1` given the prefix `d_0`.
//!   `P(d_0 = x accepted) = min(q_0(x), p_0(x))`, so when `p_1` depends on `x` (penalties)
//!   the expected law is the mixture `Σ_x min(q_0, p_0)(x) · p_1^{(x)}`, normalised;
//! - bonus token given both drafts accepted: likewise the mixture of `p_2^{(x, y)}` with
//!   weights `min(q_0, p_0)(x) · min(q_1, p_1^{(x)})(y)`.
//!
//! Proposals covered: fixed argmax-like drafts (target-sample match; and sampled-mode rows
//! without draft distributions, i.e. one-hot rejection sampling), drafts sampled from a
//! noisy copy of the target, and drafts sampled from unrelated random `q` (vLLM's setting).
//! Cases: temperature {0.7, 1.3} × top-k {off, 3} × top-p {1, 0.8}, min-p, and penalties.
//!
//! Each law is checked with a χ² goodness-of-fit test (p-value > 0.001, bins merged to at
//! least 5 expected draws, zero-probability tokens must never appear) and the first emitted
//! token also with vLLM's convergence check. Expected laws come from a naive f64 reference
//! implementation of the processing, not from the code under test.

mod reference;
mod stats;

use reference::{normalize, reference_probs};
use specrs_core::acceptance::{AcceptanceSampler, VerifyRow};
use specrs_core::config::{DraftProposal, SpeculativeConfig, SpeculativeMethod};
use specrs_core::sampling::{
    PenaltyContext, RngStream, SamplingParams, processed_probs, sample_inverse_cdf, softmax_in_place, uniform,
};
use stats::{chi_square, chi_square_survival, histogram, l2_distance};

const V: usize = 12;
const K: usize = 2;
const TRIALS: u64 = 100_000;
const MIN_P_VALUE: f64 = 1e-3;
/// Conditional laws observed fewer times than this would make a powerless test.
const MIN_CONDITIONAL_DRAWS: u64 = 300;
const CONVERGENCE_SIZES: [usize; 5] = [10, 100, 1_000, 10_000, 100_000];
const CONVERGENCE_FACTOR: f64 = 20.0;
const CONVERGENCE_WINDOWS: usize = 100;
const REFERENCE_DISTRIBUTIONS: usize = 100;
/// Step seeds of the trials start here; test fixtures use keys far from this range.
/// Standard deviation of the random target logits: spread enough that truncation matters,
/// flat enough that no case collapses to a single token.
const LOGIT_SCALE: f64 = 1.0;
/// Step seeds of the trials start here; test fixtures use keys far from this range.
const ROW_SEED_BASE: u64 = 1;
const FIXTURE_KEY: u64 = 0x7E57_0000_0000_0000;

fn fixture_uniform(key: u64, counter: u64) -> f64 {
    uniform(FIXTURE_KEY ^ key, RngStream::Synthetic, counter)
}

/// Roughly normal logits with standard deviation `scale` (`[len]`).
fn random_logits(key: u64, len: usize, scale: f64) -> Vec<f32> {
    (0..len as u64)
        .map(|i| {
            let irwin_hall: f64 = (0..4).map(|j| fixture_uniform(key, 4 * i + j)).sum();
            ((irwin_hall - 2.0) * 3f64.sqrt() * scale) as f32
        })
        .collect()
}

/// What a trained drafter proposes from: the raw target logits of each draft position plus
/// unit Gaussian noise, softmaxed (`[K · V]`). Close enough to the target that both drafts
/// are often accepted, different enough (and untruncated) that rejections and residuals
/// matter.
fn noisy_draft_distributions(key: u64, target_logits: &[f32]) -> Vec<f32> {
    let noise = random_logits(key, K * V, 1.0);
    let mut q: Vec<f32> = target_logits[..K * V].iter().zip(noise).map(|(l, n)| l + n).collect();
    for row in q.chunks_mut(V) {
        softmax_in_place(row);
    }
    q
}

/// A random distribution over `V` tokens, `count` times (`[count · V]`).
fn random_distributions(key: u64, count: usize) -> Vec<f32> {
    let mut q = random_logits(key, count * V, 1.2);
    for row in q.chunks_mut(V) {
        softmax_in_place(row);
    }
    q
}

struct Case {
    name: String,
    params: SamplingParams,
    prompt: Vec<u32>,
    output: Vec<u32>,
}

impl Case {
    fn history(&self) -> Vec<u32> {
        [self.prompt.as_slice(), self.output.as_slice()].concat()
    }
}

/// Temperature {0.7, 1.3} × top-k {off, 3} × top-p {1.0, 0.8}, plus min-p and penalties.
fn cases() -> Vec<Case> {
    let mut cases = Vec::new();
    for temperature in [0.7, 1.3] {
        for top_k in [0, 3] {
            for top_p in [1.0, 0.8] {
                cases.push(Case {
                    name: format!("T={temperature} top_k={top_k} top_p={top_p}"),
                    params: SamplingParams { temperature, top_k, top_p, ..Default::default() },
                    prompt: vec![],
                    output: vec![],
                });
            }
        }
    }
    cases.push(Case {
        name: "T=1 min_p=0.1".into(),
        params: SamplingParams { min_p: 0.1, ..Default::default() },
        prompt: vec![],
        output: vec![],
    });
    cases.push(Case {
        name: "T=1 top_p=0.9 with repetition, frequency and presence penalties".into(),
        params: SamplingParams {
            top_p: 0.9,
            repetition_penalty: 1.3,
            frequency_penalty: 0.5,
            presence_penalty: 0.3,
            ..Default::default()
        },
        prompt: vec![1, 4],
        output: vec![2, 2, 9],
    });
    cases
}

fn config(proposal: DraftProposal) -> SpeculativeConfig {
    SpeculativeConfig {
        speculative_method: Some(SpeculativeMethod::Eagle),
        num_speculative_tokens: Some(K as i64),
        draft_proposal: proposal,
        ..Default::default()
    }
}

/// How the drafts of every trial are made.
enum Proposal {
    /// The same deterministic drafts every trial (argmax / n-gram drafters).
    Fixed([u32; K]),
    /// Drafts drawn from `[K · V]` distributions, which the row carries.
    Sampled(Vec<f32>),
}

impl Proposal {
    /// The proposal distributions as the theory sees them (one-hot for fixed drafts).
    fn distributions(&self) -> Vec<Vec<f64>> {
        match self {
            Self::Fixed(drafts) => {
                drafts.iter().map(|&d| (0..V).map(|x| if x == d as usize { 1.0 } else { 0.0 }).collect()).collect()
            }
            Self::Sampled(q) => q.chunks(V).map(|row| row.iter().map(|&x| f64::from(x)).collect()).collect(),
        }
    }
}

/// The laws of the four observed quantities; `None` where the condition has probability 0.
struct ExpectedLaws {
    first: Vec<f64>,
    recovered_first: Option<Vec<f64>>,
    second_given_accept: Option<Vec<f64>>,
    bonus_given_all: Option<Vec<f64>>,
}

fn normalized(mut p: Vec<f64>) -> Option<Vec<f64>> {
    let total: f64 = p.iter().sum();
    (total > 1e-12).then(|| {
        normalize(&mut p);
        p
    })
}

fn expected_laws(case: &Case, logits: &[f32], proposal: &Proposal) -> ExpectedLaws {
    let q = proposal.distributions();
    let position = |i: usize| &logits[i * V..(i + 1) * V];
    let target = |i: usize, prefix: &[u32]| {
        let output = [case.output.as_slice(), prefix].concat();
        reference_probs(position(i), &case.params, &case.prompt, &output)
    };
    let p0 = target(0, &[]);
    let accept0: Vec<f64> = (0..V).map(|x| q[0][x].min(p0[x])).collect();
    let residual0 = (0..V).map(|x| (p0[x] - q[0][x]).max(0.0)).collect();
    let mut second = vec![0.0; V];
    let mut bonus = vec![0.0; V];
    for x in (0..V).filter(|&x| accept0[x] > 0.0) {
        let p1 = target(1, &[x as u32]);
        for y in 0..V {
            second[y] += accept0[x] * p1[y];
            let both = accept0[x] * q[1][y].min(p1[y]);
            if both > 0.0 {
                let p2 = target(2, &[x as u32, y as u32]);
                for (b, p) in bonus.iter_mut().zip(p2) {
                    *b += both * p;
                }
            }
        }
    }
    ExpectedLaws {
        first: p0,
        recovered_first: normalized(residual0),
        second_given_accept: normalized(second),
        bonus_given_all: normalized(bonus),
    }
}

#[derive(Default)]
struct Tallies {
    first_sequence: Vec<u32>,
    first: Vec<u64>,
    recovered_first: Vec<u64>,
    second_given_accept: Vec<u64>,
    bonus_given_all: Vec<u64>,
}

fn run_trials(
    sampler: &AcceptanceSampler,
    case: &Case,
    logits: &[f32],
    proposal: &Proposal,
    carry_probs: bool,
) -> Tallies {
    let history = case.history();
    let mut t = Tallies {
        first: vec![0; V],
        recovered_first: vec![0; V],
        second_given_accept: vec![0; V],
        bonus_given_all: vec![0; V],
        ..Default::default()
    };
    for trial in 0..TRIALS {
        let seed = ROW_SEED_BASE + trial;
        let drafts: [u32; K] = match proposal {
            Proposal::Fixed(drafts) => *drafts,
            Proposal::Sampled(q) => std::array::from_fn(|i| {
                sample_inverse_cdf(&q[i * V..(i + 1) * V], uniform(seed, RngStream::Draft, i as u64))
            }),
        };
        let mut row = VerifyRow::new(&drafts, logits, &case.params, seed).with_history(&history, case.prompt.len());
        if let (Proposal::Sampled(q), true) = (proposal, carry_probs) {
            row = row.with_draft_probs(q);
        }
        let out = sampler.accept_row(&row).expect("well-formed row");
        let first = out.tokens[0];
        t.first_sequence.push(first);
        t.first[first as usize] += 1;
        if out.num_accepted == 0 {
            t.recovered_first[first as usize] += 1;
        } else {
            t.second_given_accept[out.tokens[1] as usize] += 1;
        }
        if out.num_accepted == K {
            t.bonus_given_all[out.tokens[K] as usize] += 1;
        }
    }
    t
}

/// Appends a failure to `failures` unless `observed` fits `expected`.
fn check_fit(label: &str, observed: &[u64], expected: Option<&[f64]>, min_draws: u64, failures: &mut Vec<String>) {
    let draws: u64 = observed.iter().sum();
    let Some(expected) = expected else {
        if draws > 0 {
            failures.push(format!("{label}: {draws} draws of an impossible event"));
        }
        return;
    };
    if draws < min_draws {
        failures.push(format!("{label}: only {draws} draws, the test would lack power"));
        return;
    }
    let fit = chi_square(observed, expected);
    if fit.impossible_draws > 0 || fit.p_value <= MIN_P_VALUE {
        failures.push(format!(
            "{label}: chi2 = {:.2} on {} df, p = {:.2e}, zero-probability draws = {} over {}\n  observed {observed:?}\n  expected {:?}",
            fit.statistic,
            fit.df,
            fit.p_value,
            fit.impossible_draws,
            fit.draws,
            expected.iter().map(|p| (p * draws as f64).round()).collect::<Vec<_>>()
        ));
    }
}

/// vLLM's convergence check: as the sample grows from 10 to 10^5, the distance to the target
/// must shrink more than 20× faster than the distance to unrelated distributions. Distances
/// at each size are averaged over up to 100 disjoint windows of the trials, so one lucky
/// window of 10 cannot decide the outcome. Vacuous for a point-mass target (the χ² check
/// already requires every draw to be that token).
fn check_convergence(label: &str, samples: &[u32], target: &[f64], failures: &mut Vec<String>) {
    if target.iter().filter(|&&p| p > 0.0).count() < 2 {
        return;
    }
    let references: Vec<Vec<f64>> = random_distributions(0xC0_4E46, REFERENCE_DISTRIBUTIONS)
        .chunks(V)
        .map(|r| r.iter().map(|&x| f64::from(x)).collect())
        .collect();
    let distances: Vec<(f64, f64)> = CONVERGENCE_SIZES
        .iter()
        .map(|&n| {
            let windows: Vec<&[u32]> = samples.chunks_exact(n).take(CONVERGENCE_WINDOWS).collect();
            let mean = |distance: &dyn Fn(&[f64]) -> f64| {
                windows.iter().map(|w| distance(&histogram(w, V))).sum::<f64>() / windows.len() as f64
            };
            let to_target = mean(&|h| l2_distance(h, target));
            let to_refs =
                mean(&|h| references.iter().map(|r| l2_distance(h, r)).sum::<f64>() / references.len() as f64);
            (to_target, to_refs)
        })
        .collect();
    let (first, last) = (distances[0], distances[distances.len() - 1]);
    let target_shrink = first.0 / last.0;
    let reference_shrink = first.1 / last.1;
    if target_shrink.is_nan() || target_shrink <= CONVERGENCE_FACTOR * reference_shrink {
        failures.push(format!(
            "{label}: distance to target shrank {target_shrink:.1}x, to references {reference_shrink:.2}x ({distances:?})"
        ));
    }
}

fn case_logits(index: usize) -> Vec<f32> {
    random_logits(100 + index as u64, (K + 1) * V, LOGIT_SCALE)
}

/// The drafts an argmax drafter might make: the target's favourite at position 0 and its
/// runner-up at position 1 (when that has mass).
fn argmax_like_drafts(case: &Case, logits: &[f32]) -> [u32; K] {
    let p0 = reference_probs(&logits[..V], &case.params, &case.prompt, &case.output);
    let d0 = top_tokens(&p0)[0];
    let output = [case.output.as_slice(), &[d0]].concat();
    let p1 = reference_probs(&logits[V..2 * V], &case.params, &case.prompt, &output);
    let ranked = top_tokens(&p1);
    let d1 = if p1[ranked[1] as usize] > 0.0 { ranked[1] } else { ranked[0] };
    [d0, d1]
}

fn top_tokens(p: &[f64]) -> Vec<u32> {
    let mut order: Vec<u32> = (0..p.len() as u32).collect();
    order.sort_by(|&a, &b| p[b as usize].total_cmp(&p[a as usize]));
    order
}

/// Runs every case under `proposal_for(case, logits)` and checks the four laws.
fn check_all_cases(
    draft_proposal: DraftProposal,
    carry_probs: bool,
    proposal_for: impl Fn(usize, &Case, &[f32]) -> Proposal,
) {
    let sampler = AcceptanceSampler::new(&config(draft_proposal), K, V, None).unwrap();
    let mut failures = Vec::new();
    for (index, case) in cases().iter().enumerate() {
        let logits = case_logits(index);
        let proposal = proposal_for(index, case, &logits);
        let expected = expected_laws(case, &logits, &proposal);
        let tallies = run_trials(&sampler, case, &logits, &proposal, carry_probs);
        let label = |what: &str| format!("[{}] {what}", case.name);
        check_fit(&label("first emitted"), &tallies.first, Some(&expected.first), TRIALS, &mut failures);
        check_fit(
            &label("recovered at the first position"),
            &tallies.recovered_first,
            expected.recovered_first.as_deref(),
            MIN_CONDITIONAL_DRAWS,
            &mut failures,
        );
        check_fit(
            &label("second emitted given the first accepted"),
            &tallies.second_given_accept,
            expected.second_given_accept.as_deref(),
            MIN_CONDITIONAL_DRAWS,
            &mut failures,
        );
        check_fit(
            &label("bonus given every draft accepted"),
            &tallies.bonus_given_all,
            expected.bonus_given_all.as_deref(),
            MIN_CONDITIONAL_DRAWS,
            &mut failures,
        );
        check_convergence(&label("first emitted"), &tallies.first_sequence, &expected.first, &mut failures);
    }
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn chi_square_survival_matches_known_quantiles() {
    // 95th percentiles of χ² with 1, 5 and 10 degrees of freedom, and the closed form for 2.
    for (statistic, df) in [(3.841_458_820_694_124, 1), (11.070_497_693_516_35, 5), (18.307_038_053_275_146, 10)] {
        assert!((chi_square_survival(statistic, df) - 0.05).abs() < 1e-9, "df {df}");
    }
    for x in [0.5, 2.0, 7.0, 30.0] {
        assert!((chi_square_survival(x, 2) - (-x / 2.0).exp()).abs() < 1e-12);
    }
    assert_eq!(chi_square_survival(0.0, 4), 1.0);
    assert!(chi_square_survival(200.0, 11) < 1e-30);
    // A fair histogram fits; a biased one does not; impossible draws are reported.
    let uniform4 = [0.25; 4];
    assert!(chi_square(&[2500, 2480, 2530, 2490], &uniform4).p_value > 0.5);
    assert!(chi_square(&[2700, 2300, 2500, 2500], &uniform4).p_value < 1e-6);
    assert_eq!(chi_square(&[5, 5], &[1.0, 0.0]).impossible_draws, 5);
}

#[test]
fn processed_probs_match_the_sorting_reference() {
    for (index, case) in cases().iter().enumerate() {
        let history = case.history();
        let penalties = PenaltyContext::new(&history, case.prompt.len());
        for (row, vocab) in [(0u64, 12usize), (1, 12), (2, 100), (3, 3000)] {
            let logits = random_logits(7_000 + 10 * index as u64 + row, vocab, 2.0);
            let got = processed_probs(&logits, &case.params, Some(&penalties));
            let want = reference_probs(&logits, &case.params, &case.prompt, &case.output);
            for (token, (&g, &w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(g > 0.0, w > 0.0, "[{}] V={vocab} token {token}: support differs", case.name);
                assert!((f64::from(g) - w).abs() < 2e-6, "[{}] V={vocab} token {token}: {g} vs {w}", case.name);
            }
        }
    }
}

#[test]
fn argmax_drafts_emit_the_processed_target_at_every_position() {
    check_all_cases(DraftProposal::Argmax, false, |_, case, logits| Proposal::Fixed(argmax_like_drafts(case, logits)));
}

#[test]
fn sampled_drafts_emit_the_processed_target_at_every_position() {
    check_all_cases(DraftProposal::Sampled, true, |index, _, logits| {
        Proposal::Sampled(noisy_draft_distributions(500 + index as u64, logits))
    });
}

#[test]
fn unrelated_random_draft_distributions_still_emit_the_processed_target() {
    // vLLM's setting: q has nothing to do with p, so rejections dominate.
    check_all_cases(DraftProposal::Sampled, true, |index, _, _| {
        Proposal::Sampled(random_distributions(700 + index as u64, K))
    });
}

#[test]
fn sampled_mode_rows_without_draft_probs_verify_as_one_hot_proposals() {
    // A row whose drafter kept no distribution: rejection sampling with q = one-hot(draft).
    check_all_cases(DraftProposal::Sampled, false, |_, case, logits| Proposal::Fixed(argmax_like_drafts(case, logits)));
}

#[test]
fn bonus_only_rows_sample_the_processed_target() {
    let sampler = AcceptanceSampler::new(&config(DraftProposal::Argmax), K, V, None).unwrap();
    let mut failures = Vec::new();
    for (index, case) in cases().iter().enumerate() {
        let logits = random_logits(900 + index as u64, V, LOGIT_SCALE);
        let history = case.history();
        let mut counts = vec![0u64; V];
        let mut sequence = Vec::with_capacity(TRIALS as usize);
        for trial in 0..TRIALS {
            let row = VerifyRow::new(&[], &logits, &case.params, ROW_SEED_BASE + trial)
                .with_history(&history, case.prompt.len());
            let out = sampler.accept_row(&row).unwrap();
            assert!(out.next_is_bonus && out.tokens.len() == 1);
            counts[out.tokens[0] as usize] += 1;
            sequence.push(out.tokens[0]);
        }
        let target = reference_probs(&logits, &case.params, &case.prompt, &case.output);
        check_fit(&format!("[{}] bonus-only row", case.name), &counts, Some(&target), TRIALS, &mut failures);
        check_convergence(&format!("[{}] bonus-only row", case.name), &sequence, &target, &mut failures);
    }
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
}
