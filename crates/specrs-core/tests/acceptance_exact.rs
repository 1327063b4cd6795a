//! Exact behaviour of the acceptance rules: vLLM-style greedy tables, relaxed thinking
//! tables, penalties over history plus preceding drafts, reproducibility and batch
//! independence, and the errors of bad rows and bad configurations.

use specrs_core::acceptance::{AcceptanceSampler, VerifyError, VerifyOutput, VerifyRow};
use specrs_core::config::{AcceptanceRule, DraftProposal, SpeculativeConfig, SpeculativeMethod};
use specrs_core::sampling::{RngStream, SamplingParams, uniform};

const V: usize = 8;
const THINK_START: u32 = 6;
const THINK_END: u32 = 7;

fn config() -> SpeculativeConfig {
    SpeculativeConfig {
        speculative_method: Some(SpeculativeMethod::Eagle),
        num_speculative_tokens: Some(4),
        ..Default::default()
    }
}

fn greedy_config() -> SpeculativeConfig {
    SpeculativeConfig { use_greedy_acceptance: true, ..config() }
}

fn sampler(config: &SpeculativeConfig) -> AcceptanceSampler {
    AcceptanceSampler::new(config, 4, V, Some((THINK_START, THINK_END))).unwrap()
}

/// vLLM's construction: +100 at each position's argmax, -100 elsewhere (`[positions · V]`).
fn peaked_logits(argmaxes: &[u32]) -> Vec<f32> {
    let mut logits = vec![-100.0f32; argmaxes.len() * V];
    for (i, &a) in argmaxes.iter().enumerate() {
        logits[i * V + a as usize] = 100.0;
    }
    logits
}

/// Logits whose untempered softmax is `probs` (`[V]`).
fn logits_of_probs(probs: [f32; V]) -> Vec<f32> {
    probs.iter().map(|p| p.ln()).collect()
}

fn accept(sampler: &AcceptanceSampler, row: VerifyRow) -> VerifyOutput {
    sampler.accept_row(&row).unwrap()
}

#[test]
fn greedy_table_matches_vllm_cases_under_both_greedy_paths() {
    struct Case {
        name: &'static str,
        drafts: Vec<u32>,
        argmaxes: Vec<u32>,
        tokens: Vec<u32>,
        bonus: bool,
    }
    let cases = [
        Case {
            name: "all accepted + bonus",
            drafts: vec![1, 2, 3],
            argmaxes: vec![1, 2, 3, 4],
            tokens: vec![1, 2, 3, 4],
            bonus: true,
        },
        Case {
            name: "early mismatch",
            drafts: vec![1, 2, 3],
            argmaxes: vec![1, 5, 3, 4],
            tokens: vec![1, 5],
            bonus: false,
        },
        Case {
            name: "first position mismatch",
            drafts: vec![1, 2],
            argmaxes: vec![0, 2, 3],
            tokens: vec![0],
            bonus: false,
        },
        Case { name: "single draft", drafts: vec![5], argmaxes: vec![5, 6], tokens: vec![5, 6], bonus: true },
        Case { name: "no drafts: bonus only", drafts: vec![], argmaxes: vec![7], tokens: vec![7], bonus: true },
    ];
    // The greedy rule, and temperature-0 rows under the stochastic rule (both proposals).
    let samplers = [
        sampler(&greedy_config()),
        sampler(&config()),
        sampler(&SpeculativeConfig { draft_proposal: DraftProposal::Sampled, ..config() }),
    ];
    let greedy = SamplingParams::greedy();
    for s in &samplers {
        for case in &cases {
            let logits = peaked_logits(&case.argmaxes);
            let out = accept(s, VerifyRow::new(&case.drafts, &logits, &greedy, 0));
            assert_eq!(out.tokens, case.tokens, "{}: {}", s.describe(), case.name);
            assert_eq!(out.num_accepted, case.tokens.len() - 1, "{}", case.name);
            assert_eq!(out.next_is_bonus, case.bonus, "{}", case.name);
            assert_eq!(out.num_drafts, case.drafts.len());
            let flags: Vec<bool> = out.accepted_flags().collect();
            assert_eq!(flags.iter().filter(|&&f| f).count(), out.num_accepted);
            assert_eq!(flags.len(), case.drafts.len());
        }
    }
}

#[test]
fn greedy_batch_of_rows_with_different_widths() {
    let s = sampler(&greedy_config());
    let greedy = SamplingParams::greedy();
    let rows_data = [
        (vec![1u32, 2, 3], peaked_logits(&[1, 2, 3, 4])),
        (vec![4u32], peaked_logits(&[3, 2])),
        (vec![], peaked_logits(&[0])),
        (vec![5u32, 6], peaked_logits(&[5, 1, 2])),
    ];
    let rows: Vec<VerifyRow> = rows_data.iter().map(|(d, l)| VerifyRow::new(d, l, &greedy, 0)).collect();
    let tokens: Vec<Vec<u32>> = s.accept_batch(&rows).into_iter().map(|o| o.unwrap().tokens).collect();
    assert_eq!(tokens, vec![vec![1, 2, 3, 4], vec![3], vec![0], vec![5, 1]]);
}

#[test]
fn greedy_rule_ignores_temperature_and_takes_the_argmax() {
    let s = sampler(&greedy_config());
    let hot = SamplingParams { temperature: 5.0, ..Default::default() };
    // Close logits: sampling at T=5 would often disagree with the argmax.
    let mut logits = vec![0.0f32; 2 * V];
    logits[3] = 0.1;
    logits[V + 2] = 0.1;
    for seed in 0..50 {
        assert_eq!(accept(&s, VerifyRow::new(&[3], &logits, &hot, seed)).tokens, vec![3, 2]);
    }
}

/// Relaxed config: strict positions of the rows below are deterministic because `top_k = 1`
/// makes the processed target one-hot, while the rows stay non-greedy (temperature 1).
fn relaxed_sampler(topk: i64, delta: f64) -> AcceptanceSampler {
    sampler(&SpeculativeConfig {
        use_relaxed_acceptance_for_thinking: true,
        relaxed_topk: topk,
        relaxed_delta: delta,
        ..config()
    })
}

fn strict_top1() -> SamplingParams {
    SamplingParams { top_k: 1, ..Default::default() }
}

/// Untempered probabilities 0.4, 0.3, 0.2, 0.05, ... for tokens 0, 1, 2, 3, ...
const THINKING_PROBS: [f32; V] = [0.4, 0.3, 0.2, 0.05, 0.03, 0.01, 0.005, 0.005];

#[test]
fn relaxed_table() {
    let params = strict_top1();
    let flat = logits_of_probs(THINKING_PROBS);
    let twice: Vec<f32> = flat.iter().chain(&flat).chain(&flat).copied().collect();
    struct Case {
        name: &'static str,
        topk: i64,
        delta: f64,
        in_thinking: bool,
        drafts: Vec<u32>,
        tokens: Vec<u32>,
        relaxed: usize,
    }
    let cases = [
        Case {
            name: "delta 0 accepts only the top token",
            topk: 3,
            delta: 0.0,
            in_thinking: true,
            drafts: vec![0, 1],
            tokens: vec![0, 0],
            relaxed: 0,
        },
        Case {
            name: "delta 1 accepts anything in the top 3",
            topk: 3,
            delta: 1.0,
            in_thinking: true,
            drafts: vec![2, 1],
            tokens: vec![2, 1, 0],
            relaxed: 2,
        },
        Case {
            name: "rank 4 is outside the top 3 whatever delta",
            topk: 3,
            delta: 1.0,
            in_thinking: true,
            drafts: vec![1, 3],
            tokens: vec![1, 0],
            relaxed: 1,
        },
        Case {
            name: "delta 0.15 admits p=0.3 but not p=0.2",
            topk: 3,
            delta: 0.15,
            in_thinking: true,
            drafts: vec![1, 2],
            tokens: vec![1, 0],
            relaxed: 1,
        },
        Case {
            name: "topk 1 is strict greedy whatever delta",
            topk: 1,
            delta: 1.0,
            in_thinking: true,
            drafts: vec![0, 1],
            tokens: vec![0, 0],
            relaxed: 0,
        },
        Case {
            name: "outside the span the strict rule holds",
            topk: 3,
            delta: 1.0,
            in_thinking: false,
            drafts: vec![1, 2],
            tokens: vec![0],
            relaxed: 0,
        },
    ];
    for case in &cases {
        let s = relaxed_sampler(case.topk, case.delta);
        let row = VerifyRow::new(&case.drafts, &twice, &params, 11).with_thinking(case.in_thinking);
        let out = accept(&s, row);
        assert_eq!(out.tokens, case.tokens, "{}", case.name);
        assert_eq!(out.num_relaxed_accepted, case.relaxed, "{}", case.name);
        assert_eq!(out.in_thinking_after, case.in_thinking, "{}", case.name);
    }
}

#[test]
fn relaxed_phase_follows_start_and_end_tokens_inside_one_accepted_run() {
    let s = relaxed_sampler(3, 0.15);
    let params = strict_top1();
    let flat = logits_of_probs(THINKING_PROBS);
    let mut end_on_top = THINKING_PROBS;
    end_on_top.swap(0, THINK_END as usize);
    // pos 0: strict (not thinking yet), START is the argmax -> accepted;
    // pos 1: thinking, draft 1 (p = 0.3 >= 0.4 - 0.15) -> relaxed acceptance;
    // pos 2: thinking, END is the top token -> accepted, leaves the span;
    // pos 3: strict again, draft 1 is not the argmax -> rejected, 0 recovered.
    let logits: Vec<f32> =
        [peaked_logits(&[THINK_START]), flat.clone(), logits_of_probs(end_on_top), flat.clone(), flat].concat();
    let drafts = [THINK_START, 1, THINK_END, 1];
    let out = accept(&s, VerifyRow::new(&drafts, &logits, &params, 3));
    assert_eq!(out.tokens, vec![THINK_START, 1, THINK_END, 0]);
    assert_eq!(out.num_accepted, 3);
    assert_eq!(out.num_relaxed_accepted, 1);
    assert!(!out.in_thinking_after);
    assert!(!out.next_is_bonus);

    // The same drafts without the end marker stay relaxed to the bonus position.
    let drafts = [THINK_START, 1, 2, 1];
    let logits: Vec<f32> = [
        peaked_logits(&[THINK_START]),
        logits_of_probs(THINKING_PROBS),
        logits_of_probs(THINKING_PROBS),
        logits_of_probs(THINKING_PROBS),
        peaked_logits(&[5]),
    ]
    .concat();
    let out = accept(&relaxed_sampler(3, 1.0), VerifyRow::new(&drafts, &logits, &params, 3));
    assert_eq!(out.tokens, vec![THINK_START, 1, 2, 1, 5]);
    assert_eq!(out.num_relaxed_accepted, 3);
    assert!(out.in_thinking_after && out.next_is_bonus);
}

#[test]
fn recovered_and_bonus_tokens_advance_the_phase() {
    let s = relaxed_sampler(3, 0.5);
    let params = strict_top1();
    // Rejected draft, recovered START: the request enters the span.
    let out = accept(&s, VerifyRow::new(&[2], &peaked_logits(&[THINK_START, 0]), &params, 0));
    assert_eq!(out.tokens, vec![THINK_START]);
    assert!(out.in_thinking_after);
    // Bonus END (strictly sampled even inside the span): the request leaves it.
    let logits = [logits_of_probs(THINKING_PROBS), peaked_logits(&[THINK_END])].concat();
    let out = accept(&s, VerifyRow::new(&[0], &logits, &params, 0).with_thinking(true));
    assert_eq!(out.tokens, vec![0, THINK_END]);
    assert!(!out.in_thinking_after);
}

#[test]
fn greedy_rows_are_never_relaxed() {
    let s = relaxed_sampler(3, 1.0);
    let logits = [logits_of_probs(THINKING_PROBS), peaked_logits(&[4])].concat();
    let out = accept(&s, VerifyRow::new(&[1], &logits, &SamplingParams::greedy(), 0).with_thinking(true));
    assert_eq!(out.tokens, vec![0]);
    assert_eq!(out.num_relaxed_accepted, 0);
}

#[test]
fn relaxed_needs_thinking_ids_and_argmax_proposals() {
    let relaxed = SpeculativeConfig { use_relaxed_acceptance_for_thinking: true, ..config() };
    let err = AcceptanceSampler::new(&relaxed, 4, V, None).unwrap_err();
    assert_eq!(err.field.as_deref(), Some("use_relaxed_acceptance_for_thinking"));
    assert!(err.message.contains("reasoning start/end token ids"), "{}", err.message);
    let sampled = SpeculativeConfig { draft_proposal: DraftProposal::Sampled, ..relaxed.clone() };
    assert_eq!(
        AcceptanceSampler::new(&sampled, 4, V, Some((6, 7))).unwrap_err().field.as_deref(),
        Some("draft_proposal")
    );
    let greedy = SpeculativeConfig { use_greedy_acceptance: true, ..relaxed };
    assert_eq!(
        AcceptanceSampler::new(&greedy, 4, V, Some((6, 7))).unwrap_err().field.as_deref(),
        Some("use_greedy_acceptance")
    );
}

#[test]
fn construction_rejects_impossible_pipelines() {
    assert_eq!(
        AcceptanceSampler::new(&config(), 0, V, None).unwrap_err().field.as_deref(),
        Some("num_speculative_tokens")
    );
    assert!(AcceptanceSampler::new(&config(), 4, 0, None).is_err());
    let err = AcceptanceSampler::new(&config(), 4, V, Some((6, V as u32))).unwrap_err();
    assert!(err.message.contains("outside the vocabulary"), "{}", err.message);
    let bad_rate = SpeculativeConfig { synthetic_acceptance_rate: Some(1.5), ..config() };
    assert_eq!(
        AcceptanceSampler::new(&bad_rate, 4, V, None).unwrap_err().field.as_deref(),
        Some("synthetic_acceptance_rate")
    );
}

#[test]
fn rule_precedence_and_startup_line() {
    let s = sampler(&config());
    assert_eq!(s.rule(), AcceptanceRule::Stochastic);
    assert_eq!(s.describe(), "Speculative acceptance rule: stochastic (draft_proposal=argmax, relaxed=off)");
    assert_eq!(sampler(&greedy_config()).rule(), AcceptanceRule::Greedy);
    assert_eq!(
        relaxed_sampler(10, 0.6).describe(),
        "Speculative acceptance rule: stochastic (draft_proposal=argmax, relaxed=on, topk=10, delta=0.6)"
    );
    let synthetic = sampler(&SpeculativeConfig { synthetic_acceptance_rate: Some(0.5), ..config() });
    assert_eq!(synthetic.rule(), AcceptanceRule::Synthetic);
    assert!(synthetic.describe().starts_with("Speculative acceptance rule: synthetic"));
    assert!(synthetic.describe().contains("Benchmark only"));
}

#[test]
fn malformed_rows_are_errors_and_fail_alone_in_a_batch() {
    let s = sampler(&config());
    let params = SamplingParams::default();
    let logits = vec![0.0f32; 2 * V];
    assert!(matches!(
        s.accept_row(&VerifyRow::new(&[1, 2], &logits, &params, 0)),
        Err(VerifyError::LogitsLen { got: 16, expected: 24, .. })
    ));
    assert!(matches!(
        s.accept_row(&VerifyRow::new(&[V as u32], &logits, &params, 0)),
        Err(VerifyError::DraftOutOfVocab { position: 0, token: 8, .. })
    ));
    let q = vec![0.0f32; V - 1];
    assert!(matches!(
        s.accept_row(&VerifyRow::new(&[1], &logits, &params, 0).with_draft_probs(&q)),
        Err(VerifyError::DraftProbsLen { .. })
    ));
    let good = VerifyRow::new(&[1], &logits, &params, 0);
    let bad = VerifyRow::new(&[], &logits, &params, 0);
    let results = s.accept_batch(&[good, bad]);
    assert!(results[0].is_ok(), "a malformed row fails alone");
    let err = results[1].clone().unwrap_err();
    assert!(matches!(err, VerifyError::LogitsLen { got: 16, expected: 8, .. }));
    assert!(err.to_string().starts_with("logits hold 16 values"), "{err}");
}

fn penalized(frequency: f32, presence: f32, repetition: f32) -> SamplingParams {
    SamplingParams {
        frequency_penalty: frequency,
        presence_penalty: presence,
        repetition_penalty: repetition,
        ..SamplingParams::greedy()
    }
}

/// `[positions · V]` logits with token 5 at 2.0, token 1 at 1.5 and 0 elsewhere.
fn five_over_one(positions: usize) -> Vec<f32> {
    let mut row = [0.0f32; V];
    row[5] = 2.0;
    row[1] = 1.5;
    row.repeat(positions)
}

#[test]
fn frequency_penalty_counts_history_and_preceding_drafts() {
    let s = sampler(&config());
    let params = penalized(0.4, 0.0, 1.0);
    let logits = five_over_one(3);
    // Prompt [3], output [5]. Position 0: 2.0 - 0.4 = 1.6 > 1.5, accepted. Position 1 also
    // counts draft 0: 2.0 - 0.8 = 1.2 < 1.5, so token 1 is recovered.
    let history = [3, 5];
    let out = accept(&s, VerifyRow::new(&[5, 5], &logits, &params, 0).with_history(&history, 1));
    assert_eq!(out.tokens, vec![5, 1]);
    // With 5 only in the prompt it is not counted: both drafts pass (2.0, then 1.6) and the
    // bonus position sees the two accepted drafts (1.2), so token 1 is the bonus.
    let out = accept(&s, VerifyRow::new(&[5, 5], &logits, &params, 0).with_history(&[5], 1));
    assert_eq!(out.tokens, vec![5, 5, 1]);
}

#[test]
fn presence_penalty_applies_once_per_token() {
    let s = sampler(&config());
    let logits = five_over_one(2);
    let history = [5, 5, 5];
    // 2.0 - 0.4 = 1.6 > 1.5 however often 5 occurred; frequency at 0.4 would give 0.8.
    let out = accept(&s, VerifyRow::new(&[5], &logits, &penalized(0.0, 0.4, 1.0), 0).with_history(&history, 0));
    assert_eq!(out.tokens, vec![5, 5]);
    let out = accept(&s, VerifyRow::new(&[5], &logits, &penalized(0.4, 0.0, 1.0), 0).with_history(&history, 0));
    assert_eq!(out.tokens, vec![1]);
}

#[test]
fn repetition_penalty_covers_prompt_tokens_and_negative_logits() {
    let s = sampler(&config());
    let params = penalized(0.0, 0.0, 2.0);
    // Token 5 in the prompt: 2.0 / 2 = 1.0 < 1.5.
    let out = accept(&s, VerifyRow::new(&[], &five_over_one(1), &params, 0).with_history(&[5], 1));
    assert_eq!(out.tokens, vec![1]);
    // Negative logits are multiplied: -0.1 · 2 = -0.2 < -0.15.
    let mut logits = [-1.0f32; V];
    logits[2] = -0.1;
    logits[4] = -0.15;
    let out = accept(&s, VerifyRow::new(&[], &logits, &params, 0).with_history(&[2], 1));
    assert_eq!(out.tokens, vec![4]);
}

#[test]
fn stochastic_rows_penalize_the_bonus_position_with_every_accepted_draft() {
    let s = sampler(&config());
    // top_k = 1 makes the target sample the penalised argmax.
    let params = SamplingParams { top_k: 1, frequency_penalty: 0.3, ..Default::default() };
    // Positions 0 and 1 accept 5 (2.0 - 0 and 2.0 - 0.3 beat 1.5); the bonus position sees
    // 5 twice: 2.0 - 0.6 = 1.4 < 1.5.
    let out = accept(&s, VerifyRow::new(&[5, 5], &five_over_one(3), &params, 9));
    assert_eq!(out.tokens, vec![5, 5, 1]);
    assert!(out.next_is_bonus);
}

/// Deterministic pseudo-random rows for the reproducibility checks.
struct RowData {
    drafts: Vec<u32>,
    logits: Vec<f32>,
    draft_probs: Vec<f32>,
    params: SamplingParams,
    seed: u64,
}

fn random_rows(count: usize, vocab: usize) -> Vec<RowData> {
    (0..count)
        .map(|r| {
            let key = 1000 + r as u64;
            let n = r % 4;
            let u = |c: usize| uniform(key, RngStream::Draft, c as u64);
            let logits = (0..(n + 1) * vocab).map(|c| (3.0 * u(c)) as f32).collect();
            let mut draft_probs: Vec<f32> = (0..n * vocab).map(|c| u(10_000 + c) as f32).collect();
            for q in draft_probs.chunks_mut(vocab) {
                let total: f32 = q.iter().sum();
                q.iter_mut().for_each(|x| *x /= total);
            }
            let drafts = (0..n).map(|i| (u(20_000 + i) * vocab as f64) as u32).collect();
            let params = SamplingParams {
                temperature: if r % 5 == 4 { 0.0 } else { 0.9 },
                top_p: 0.9,
                frequency_penalty: if r % 3 == 0 { 0.2 } else { 0.0 },
                ..Default::default()
            };
            RowData { drafts, logits, draft_probs, params, seed: key.wrapping_mul(31) }
        })
        .collect()
}

fn rows_of(data: &[RowData]) -> Vec<VerifyRow<'_>> {
    data.iter()
        .map(|d| {
            VerifyRow::new(&d.drafts, &d.logits, &d.params, d.seed)
                .with_draft_probs(&d.draft_probs)
                .with_history(&d.drafts, 0)
        })
        .collect()
}

fn every_rule(vocab: usize) -> Vec<AcceptanceSampler> {
    let configs = [
        config(),
        SpeculativeConfig { draft_proposal: DraftProposal::Sampled, ..config() },
        SpeculativeConfig { synthetic_acceptance_rate: Some(0.6), ..config() },
        greedy_config(),
    ];
    configs.iter().map(|c| AcceptanceSampler::new(c, 4, vocab, None).unwrap()).collect()
}

#[test]
fn seeded_rows_are_bit_identical_across_repetitions() {
    let data = random_rows(12, 64);
    let rows = rows_of(&data);
    for s in every_rule(64) {
        let first = s.accept_batch(&rows);
        assert!(first.iter().all(Result::is_ok));
        for _ in 0..20 {
            assert_eq!(s.accept_batch(&rows), first, "{}", s.describe());
        }
        // Different seeds do change stochastic outcomes somewhere in the batch.
        if s.rule() != AcceptanceRule::Greedy {
            let reseeded: Vec<VerifyRow> = rows.iter().map(|r| VerifyRow { seed: r.seed + 1, ..*r }).collect();
            assert_ne!(s.accept_batch(&reseeded), first, "{}", s.describe());
        }
    }
}

#[test]
fn a_rows_result_does_not_depend_on_its_batch() {
    let data = random_rows(16, 64);
    let rows = rows_of(&data);
    for s in every_rule(64) {
        let alone: Vec<Result<VerifyOutput, VerifyError>> = rows.iter().map(|r| s.accept_row(r)).collect();
        assert!(alone.iter().all(Result::is_ok));
        for rotation in [0usize, 3, 7] {
            // Rotate, then reverse every other rotation: rows meet different neighbours.
            let mut order: Vec<usize> = (0..rows.len()).map(|i| (i + rotation) % rows.len()).collect();
            if rotation % 2 == 1 {
                order.reverse();
            }
            let batch: Vec<VerifyRow> = order.iter().map(|&i| rows[i]).collect();
            let outputs = s.accept_batch(&batch);
            for (out, &i) in outputs.iter().zip(&order) {
                assert_eq!(out, &alone[i], "{}: row {i}", s.describe());
            }
            // Sub-batches too.
            let half = s.accept_batch(&batch[..batch.len() / 2]);
            for (out, &i) in half.iter().zip(&order) {
                assert_eq!(out, &alone[i]);
            }
        }
    }
}

/// A guided request (structured outputs) over an 8-token vocabulary: EOS is 0, tokens 1-5
/// are "a", "b", "c", "ab", "x", and the thinking markers have no bytes.
fn guided(params: SamplingParams, regex: &str) -> SamplingParams {
    use specrs_core::structured::{StructuredOutputs, TokenVocabulary};
    let bytes = [None, Some("a"), Some("b"), Some("c"), Some("ab"), Some("x"), None, None]
        .map(|t| t.map(|t: &str| t.as_bytes().to_vec()))
        .to_vec();
    let vocabulary = std::sync::Arc::new(TokenVocabulary::new(bytes, vec![0]));
    let constraint = StructuredOutputs { regex: Some(regex.into()), ..Default::default() };
    SamplingParams {
        guide: Some(constraint.compile(&vocabulary).unwrap()),
        structured_outputs: Some(constraint),
        ..params
    }
}

#[test]
fn guided_rows_reject_drafts_the_grammar_forbids_and_recover_from_the_masked_target() {
    // Raw argmaxes are peaked; below them higher ids score higher, so a masked position
    // falls back to its highest allowed id.
    let logits = |argmaxes: &[u32]| {
        let mut l = peaked_logits(argmaxes);
        for (i, x) in l.iter_mut().enumerate() {
            *x += (i % V) as f32 * 0.1;
        }
        l
    };
    let params = guided(SamplingParams::greedy(), "a(b|c)c");
    let s = sampler(&greedy_config());
    // "x" after "a" leaves the grammar: rejected, and the masked argmax ("c") recovers.
    let out = accept(&s, VerifyRow::new(&[1, 5], &logits(&[1, 5, 5]), &params, 0));
    assert_eq!((out.num_accepted, out.tokens.clone()), (1, vec![1, 3]));
    // Allowed drafts that are the masked argmax are accepted; the bonus is masked too.
    let out = accept(&s, VerifyRow::new(&[1, 2], &logits(&[1, 2, 5]), &params, 0));
    assert_eq!((out.num_accepted, out.tokens.clone(), out.next_is_bonus), (2, vec![1, 2, 3], true));
    // The history's output moves the guide: after "abc" only EOS is left.
    let history = [7, 1, 2, 3];
    let peaked = logits(&[5, 5]);
    let row = VerifyRow { history: &history, prompt_len: 1, ..VerifyRow::new(&[5], &peaked, &params, 0) };
    assert_eq!(accept(&s, row).tokens, [0]);
    // A multi-byte token counts by its bytes: "ab" then "c".
    let out = accept(&s, VerifyRow::new(&[4], &logits(&[4, 5]), &params, 0));
    assert_eq!(out.tokens, [4, 3]);

    // Sampled: "x" has no probability, so it is always rejected, and the recovered token is
    // drawn from the two tokens that may start the output, "a" and "ab", both seen.
    let sampled = guided(SamplingParams { temperature: 1.0, ..Default::default() }, "a(b|c)c");
    let stochastic = sampler(&config());
    let flat = vec![0.0f32; 3 * V];
    let mut seen = std::collections::BTreeSet::new();
    for seed in 0..200 {
        let out = accept(&stochastic, VerifyRow::new(&[5, 1], &flat, &sampled, seed));
        assert_eq!(out.num_accepted, 0, "seed {seed}");
        seen.insert(out.tokens[0]);
    }
    assert_eq!(seen.into_iter().collect::<Vec<_>>(), [1, 4]);
}

#[test]
fn a_position_whose_masks_leave_no_token_ends_its_row_alone_after_its_accepted_drafts() {
    // The guide allows "a" then only "b"/"c"; the request also allows only "a" and "x" (and
    // EOS): after "a" nothing is left.
    let restricted = |params: SamplingParams| SamplingParams { allowed_token_ids: Some(vec![0, 1, 5]), ..params };
    let flat = vec![0.0f32; 3 * V];
    for (s, params) in [
        (sampler(&greedy_config()), SamplingParams::greedy()),
        (sampler(&config()), SamplingParams { temperature: 1.0, ..Default::default() }),
    ] {
        let params = restricted(guided(params, "a(b|c)c"));
        // The draft "a" is allowed and the target agrees (it is the only allowed token), so the
        // walk reaches position 1, where nothing is.
        let dead = VerifyRow::new(&[1, 2], &flat, &params, 3);
        // The accepted draft is kept: the request ends after it (or stops, if it finishes it).
        let out = s.accept_row(&dead).unwrap();
        assert_eq!((out.dead_end_position(), out.tokens.clone()), (Some(1), vec![1]), "{}", s.describe());
        assert_eq!(out.next_token(), None);
        // A plain decode step after "a" fails at its only (bonus) position.
        let history = [7, 1];
        let after_a = VerifyRow { history: &history, prompt_len: 1, ..VerifyRow::new(&[], &flat[..V], &params, 3) };
        let out = s.accept_row(&after_a).unwrap();
        assert_eq!((out.dead_end_position(), out.tokens), (Some(0), vec![]));
        // The rows around it in a batch are verified as alone.
        let unrestricted = guided(SamplingParams::greedy(), "a(b|c)c");
        let fine = VerifyRow::new(&[1, 2], &flat, &unrestricted, 3);
        let results = s.accept_batch(&[fine, dead, fine]);
        assert_eq!(results[1], s.accept_row(&dead));
        assert_eq!(results[0], s.accept_row(&fine));
        assert_eq!(results[2], s.accept_row(&fine));
        assert!(!results[0].as_ref().unwrap().dead_end);
    }
}

#[test]
fn bad_words_and_the_engines_own_masks_count_toward_a_dead_end() {
    let s = sampler(&greedy_config());
    // Every allowed token is a single-token bad word.
    let params = SamplingParams {
        allowed_token_ids: Some(vec![2, 3]),
        bad_word_ids: vec![vec![2], vec![3]],
        ..SamplingParams::greedy()
    };
    let logits = peaked_logits(&[2]);
    assert_eq!(s.accept_row(&VerifyRow::new(&[], &logits, &params, 0)).unwrap().dead_end_position(), Some(0));
    // The only allowed token is EOS, which the engine masked (`-inf`) while `min_tokens` is unmet.
    let eos_only = SamplingParams { allowed_token_ids: Some(vec![0]), ..SamplingParams::greedy() };
    let mut held_back = peaked_logits(&[0]);
    held_back[0] = f32::NEG_INFINITY;
    assert_eq!(s.accept_row(&VerifyRow::new(&[], &held_back, &eos_only, 0)).unwrap().dead_end_position(), Some(0));
    // One allowed token left is enough, however unlikely the model finds it.
    let mut unlikely = vec![-1e30f32; V];
    unlikely[1] = 100.0;
    let one_left =
        SamplingParams { allowed_token_ids: Some(vec![1, 2]), bad_word_ids: vec![vec![1]], ..SamplingParams::greedy() };
    assert_eq!(accept(&s, VerifyRow::new(&[], &unlikely, &one_left, 0)).tokens, [2]);
}
