//! Device reductions against the host definitions, on CPU tensors: the same code runs on a
//! GPU (the `gpu-check` subset re-runs these tests there).

use candle_core::{Device, Tensor};
use specrs_core::acceptance::{AcceptanceSampler, ReducedPosition, ReducedRow, Reductions, VerifyRow};
use specrs_core::config::{DraftProposal, SpeculativeConfig, SpeculativeMethod};
use specrs_core::sampling::{self, RngStream, SamplingParams, uniform};

use super::*;

/// The device the tests run on: `SPECRS_TEST_DEVICE=cuda` runs them on GPU 0 (CUDA builds).
fn device() -> Device {
    match std::env::var("SPECRS_TEST_DEVICE").as_deref() {
        Ok("cuda") => Device::new_cuda(0).expect("SPECRS_TEST_DEVICE=cuda needs a CUDA build and a GPU"),
        _ => Device::Cpu,
    }
}

/// `[rows, v]` logits: peaked, flat, tied and degenerate rows, deterministic.
fn logits(rows: usize, v: usize, seed: u64) -> Vec<f32> {
    let mut out = Vec::with_capacity(rows * v);
    for r in 0..rows {
        let kind = r % 5;
        for i in 0..v {
            let u = uniform(seed, RngStream::Draft, (r * v + i) as u64) as f32;
            out.push(match kind {
                0 => 6.0 * u,
                1 => 20.0 * u - 10.0,
                // Heavy ties: 8 distinct levels.
                2 => (8.0 * u).floor(),
                3 => {
                    if i == (r * 7) % v {
                        9.0
                    } else {
                        2.0 * u
                    }
                }
                _ => {
                    if i % 11 == 3 {
                        f32::NAN
                    } else if i % 13 == 5 {
                        f32::NEG_INFINITY
                    } else {
                        u
                    }
                }
            });
        }
    }
    out
}

fn tensor(values: &[f32], rows: usize, v: usize) -> Tensor {
    Tensor::from_vec(values.to_vec(), (rows, v), &device()).unwrap()
}

#[test]
fn argmax_is_the_first_maximum_with_nan_skipped() {
    let (rows, v) = (40, 300);
    let x = logits(rows, v, 1);
    let got = argmax_rows(&tensor(&x, rows, v)).unwrap().to_vec1::<u32>().unwrap();
    for r in 0..rows {
        assert_eq!(got[r], sampling::argmax(&x[r * v..(r + 1) * v]), "row {r}");
    }
}

#[test]
fn top_k_rows_rank_best_first_with_ties_to_the_lower_index_and_nan_last() {
    let (rows, v, k) = (40, 300, 7);
    let x = logits(rows, v, 2);
    let (ids, values) = top_k_rows(&tensor(&x, rows, v), k).unwrap();
    let (ids, values) = (ids.to_vec2::<u32>().unwrap(), values.to_vec2::<f32>().unwrap());
    // NaN ranks with -inf at the bottom; equal ranks go to the lower index.
    let rank = |x: f32| if x.is_nan() { f32::MIN } else { x.clamp(f32::MIN, f32::MAX) };
    for r in 0..rows {
        let row = &x[r * v..(r + 1) * v];
        let mut order: Vec<usize> = (0..v).collect();
        order.sort_by(|&a, &b| rank(row[b]).total_cmp(&rank(row[a])).then(a.cmp(&b)));
        let want: Vec<u32> = order[..k].iter().map(|&i| i as u32).collect();
        assert_eq!(ids[r], want, "row {r}");
        for (&i, &got) in ids[r].iter().zip(&values[r]) {
            let raw = row[i as usize];
            assert!(got == raw || (got.is_nan() && raw.is_nan()), "row {r}: value of {i} is {got}, not {raw}");
        }
    }
    // k past the vocabulary gives every entry once.
    let (ids, _) = top_k_rows(&tensor(&[1.0, 3.0, 2.0], 1, 3), 5).unwrap();
    assert_eq!(ids.to_vec2::<u32>().unwrap(), vec![vec![1, 2, 0]]);
}

fn param_sets() -> Vec<SamplingParams> {
    let p =
        |temperature, top_k, top_p, min_p| SamplingParams { temperature, top_k, top_p, min_p, ..Default::default() };
    vec![
        p(1.0, 0, 1.0, 0.0),
        p(0.7, 0, 1.0, 0.0),
        p(1.0, 5, 1.0, 0.0),
        p(1.3, 40, 1.0, 0.0),
        p(1.0, 0, 0.9, 0.0),
        p(0.6, 0, 0.5, 0.0),
        p(1.0, 0, 1.0, 0.1),
        p(0.8, 20, 0.8, 0.05),
    ]
}

#[test]
fn processed_distributions_match_the_host() {
    let (rows, v) = (40, 300);
    let x = logits(rows, v, 2);
    let sets = param_sets();
    let params: Vec<&SamplingParams> = (0..rows).map(|r| &sets[r % sets.len()]).collect();
    let t = sanitize(&tensor(&x, rows, v)).unwrap();
    let got = processed_probs(&t, &params).unwrap().to_vec2::<f32>().unwrap();
    for r in 0..rows {
        let want = sampling::processed_probs(&x[r * v..(r + 1) * v], params[r], None);
        for i in 0..v {
            // Same support (the thresholds are exact) and the same values up to f32 rounding.
            assert_eq!(got[r][i] > 0.0, want[i] > 0.0, "row {r} token {i}: {} vs {}", got[r][i], want[i]);
            assert!((got[r][i] - want[i]).abs() <= 1e-5 * want[i].max(1e-3), "row {r} token {i}");
        }
    }
}

/// The host's cumulative weight just before and at `token`, in f64.
fn cdf_around(weights: &[f32], token: usize) -> (f64, f64) {
    let positive = |w: &f32| if *w > 0.0 { f64::from(*w) } else { 0.0 };
    let before: f64 = weights[..token].iter().map(positive).sum();
    (before, before + positive(&weights[token]))
}

#[test]
fn draws_match_the_host_inverse_cdf_up_to_f32_rounding_at_boundaries() {
    // Wider than one CDF block, not a multiple of it, with zero runs and NaN.
    let (rows, v) = (64, 1000);
    let mut w = logits(rows, v, 3).iter().map(|x| if x.is_finite() { x.max(0.0) } else { 0.0 }).collect::<Vec<_>>();
    for r in (0..rows).step_by(4) {
        w[r * v..r * v + 600].fill(0.0);
    }
    let us: Vec<f64> = (0..rows).map(|r| uniform(9, RngStream::TargetSample, r as u64)).collect();
    let got = sample_rows(&tensor(&w, rows, v), &us).unwrap();
    let mut exact = 0;
    for r in 0..rows {
        let row = &w[r * v..(r + 1) * v];
        let want = sampling::sample_inverse_cdf(row, us[r]);
        if got[r] == want {
            exact += 1;
            continue;
        }
        // A different token only where u · total sits on (f32 rounding of) a CDF boundary.
        let total: f64 = row.iter().map(|&x| f64::from(x.max(0.0))).sum();
        let target = us[r] * total;
        let (lo, hi) = cdf_around(row, got[r] as usize);
        let slack = 1e-5 * total;
        assert!(row[got[r] as usize] > 0.0 && lo - slack <= target && target <= hi + slack, "row {r}");
    }
    assert!(exact >= rows - 1, "{exact} of {rows} draws match the host exactly");
    // Degenerate rows: no mass gives token 0, as on the host.
    let zeros = Tensor::zeros((1, 300), candle_core::DType::F32, &device()).unwrap();
    assert_eq!(sample_rows(&zeros, &[0.5]).unwrap(), vec![0]);
}

#[test]
fn draws_follow_the_distribution() {
    // 20k draws from one 50-token distribution; total variation from p below 0.02.
    let v = 50;
    let p: Vec<f32> = (0..v).map(|i| ((i % 7) as f32 + 0.5) * if i % 9 == 0 { 0.0 } else { 1.0 }).collect();
    let total: f32 = p.iter().sum();
    let n = 20_000;
    let rows: Vec<f32> = (0..n).flat_map(|_| p.iter().copied()).collect();
    let us: Vec<f64> = (0..n).map(|i| uniform(77, RngStream::TargetSample, i as u64)).collect();
    let draws = sample_rows(&tensor(&rows, n, v), &us).unwrap();
    let mut counts = vec![0usize; v];
    for d in draws {
        counts[d as usize] += 1;
    }
    let tv: f64 = (0..v).map(|i| (counts[i] as f64 / n as f64 - f64::from(p[i] / total)).abs()).sum::<f64>() / 2.0;
    assert!(tv < 0.02, "total variation {tv}");
    assert!((0..v).all(|i| p[i] > 0.0 || counts[i] == 0), "a zero-weight token was drawn");
}

fn config(f: impl FnOnce(&mut SpeculativeConfig)) -> SpeculativeConfig {
    let mut c = SpeculativeConfig {
        speculative_method: Some(SpeculativeMethod::Eagle),
        num_speculative_tokens: Some(4),
        ..Default::default()
    };
    f(&mut c);
    c
}

/// End to end: acceptance from device reductions equals acceptance on the logits, for every
/// rule, over rows whose drafts are often right.
#[test]
fn acceptance_from_device_reductions_equals_acceptance_on_logits() {
    const K: usize = 4;
    let (rows, v) = (30, 257);
    let sets = param_sets();
    let greedy = SamplingParams::greedy();
    let configs = [
        config(|c| c.use_greedy_acceptance = true),
        config(|_| {}),
        config(|c| {
            c.use_relaxed_acceptance_for_thinking = true;
            c.relaxed_topk = 4;
            c.relaxed_delta = 0.4;
        }),
        config(|c| c.draft_proposal = DraftProposal::Sampled),
        config(|c| c.synthetic_acceptance_rate = Some(0.5)),
    ];
    for (ci, cfg) in configs.iter().enumerate() {
        let sampler = AcceptanceSampler::new(cfg, K, v, Some((250, 251))).unwrap();
        let x = logits(rows * (K + 1), v, 10 + ci as u64);
        let logits_t = tensor(&x, rows * (K + 1), v);
        let with_q = cfg.draft_proposal == DraftProposal::Sampled;
        let q_host: Vec<f32> = logits(rows * K, v, 99)
            .chunks(v)
            .flat_map(|row| sampling::processed_probs(row, &SamplingParams::default(), None))
            .collect();
        let q_t = tensor(&q_host, rows * K, v);
        let mut expected = Vec::new();
        let mut queries = Vec::new();
        let mut drafts_all = Vec::new();
        for r in 0..rows {
            let params = if r % 6 == 5 { &greedy } else { &sets[r % sets.len()] };
            let row_logits = &x[r * (K + 1) * v..(r + 1) * (K + 1) * v];
            // Drafts: the host target sample (often accepted) or a wrong guess.
            let drafts: Vec<u32> = (0..K)
                .map(|i| {
                    let pos = &row_logits[i * v..(i + 1) * v];
                    if (r + i) % 3 == 2 { (r * 31 + i) as u32 % v as u32 } else { sampling::argmax(pos) }
                })
                .collect();
            let seed = 1000 + r as u64;
            let mut row = VerifyRow::new(&drafts, row_logits, params, seed).with_thinking(r % 2 == 0);
            if with_q {
                row = row.with_draft_probs(&q_host[r * K * v..(r + 1) * K * v]);
            }
            expected.push(sampler.accept_row(&row).unwrap());
            let wants = sampler.reductions_for(params).unwrap();
            for i in 0..=K {
                queries.push((r, i, params, seed, drafts.get(i).copied(), wants));
            }
            drafts_all.push(drafts);
        }
        let qs: Vec<PositionQuery> = queries
            .iter()
            .map(|&(r, i, params, seed, draft, wants)| PositionQuery {
                row: r * (K + 1) + i,
                params,
                seed,
                index: i,
                draft,
                q_row: (with_q && i < K).then_some(r * K + i),
                wants,
            })
            .collect();
        let reduced = reduce(&logits_t, &qs, Some(&q_t)).unwrap();
        for r in 0..rows {
            let positions: Vec<ReducedPosition> = reduced[r * (K + 1)..(r + 1) * (K + 1)].to_vec();
            let (_, _, params, seed, _, _) = queries[r * (K + 1)];
            let row =
                ReducedRow { drafts: &drafts_all[r], positions: &positions, params, seed, in_thinking: r % 2 == 0 };
            assert_eq!(sampler.accept_reduced_row(&row).unwrap(), expected[r], "config {ci} row {r}");
            // And position by position against the host reductions.
            for (i, pos) in positions.iter().enumerate() {
                let q = (with_q && i < K).then(|| &q_host[(r * K + i) * v..(r * K + i + 1) * v]);
                let host = ReducedPosition::from_logits(
                    &x[(r * (K + 1) + i) * v..(r * (K + 1) + i + 1) * v],
                    params,
                    seed,
                    i,
                    drafts_all[r].get(i).copied(),
                    q,
                    qs[r * (K + 1) + i].wants,
                );
                assert_positions_agree(pos, &host, &format!("config {ci} row {r} position {i}"));
            }
        }
    }
}

fn assert_positions_agree(got: &ReducedPosition, want: &ReducedPosition, at: &str) {
    assert_eq!(got.argmax, want.argmax, "{at}: argmax");
    assert_eq!(got.target_sample, want.target_sample, "{at}: target sample");
    assert_eq!(got.residual_sample, want.residual_sample, "{at}: residual sample");
    let close = |a: Option<f32>, b: Option<f32>| match (a, b) {
        (Some(a), Some(b)) => (a - b).abs() <= 1e-5 * b.abs().max(1e-3),
        (a, b) => a == b,
    };
    assert!(close(got.draft_p, want.draft_p), "{at}: p(d) {:?} vs {:?}", got.draft_p, want.draft_p);
    assert!(close(got.draft_q, want.draft_q), "{at}: q(d)");
    match (got.relaxed, want.relaxed) {
        (Some(g), Some(w)) => {
            assert_eq!((g.top, g.ahead), (w.top, w.ahead), "{at}: relaxed ranks");
            assert!(g.draft_logit == w.draft_logit || (g.draft_logit.is_nan() && w.draft_logit.is_nan()));
            assert!((g.logsumexp - w.logsumexp).abs() < 1e-4, "{at}: logsumexp");
        }
        (g, w) => assert_eq!(g, w, "{at}: relaxed"),
    }
}

#[test]
fn reductions_refuse_rows_with_penalties() {
    let penalized = SamplingParams { frequency_penalty: 0.5, ..Default::default() };
    let q = PositionQuery {
        row: 0,
        params: &penalized,
        seed: 0,
        index: 0,
        draft: None,
        q_row: None,
        wants: Reductions { target_sample: true, ..Default::default() },
    };
    assert!(reduce(&tensor(&[0.0; 8], 1, 8), &[q], None).is_err());
}
