//! The engine's device paths: verification from device reductions, and the GPU test subset.
//!
//! Every test runs on `SPECRS_TEST_DEVICE` (`cpu` by default; `cuda` in a CUDA build on a GPU
//! machine, see scripts/gpu-check.sh). On CPU, `acceptance_on_device: Some(true)` forces the
//! reduction path that CUDA takes by default, so it is checked here against the host path.
//!
//! - reductions vs host copies: identical outputs (tokens, logprobs, traces) for greedy and
//!   seeded sampled requests, every acceptance rule, rows mixing both paths, and sampled
//!   drafts whose distributions go to the device for rejection sampling;
//! - lossless greedy: speculative output equals plain output for every sequential method;
//! - sampled speculative decoding follows the plain distribution;
//! - captured steps (`device_graph_capture`: device graphs on CUDA, the same fixed-shape steps
//!   run eagerly on CPU) give the ragged engine's outputs.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::Tensor;
use specrs_core::SpeculativeConfig;
use specrs_core::config::{DraftProposal, SpeculativeMethod};
use specrs_core::sampling::SamplingParams;
use specrs_engine::{
    DeviceSpec, EngineConfig, EngineHandle, FinalOutput, GenerationRequest, PipelineConfig, Prompt, build_engine,
};
use specrs_models::ModelDType;
use specrs_models::testing::{self, BlockShape};

mod common;
use common::{Checkpoints, SHAPE, spec, write};

fn device() -> DeviceSpec {
    std::env::var("SPECRS_TEST_DEVICE").map_or(DeviceSpec::Cpu, |d| d.parse().expect("SPECRS_TEST_DEVICE"))
}

/// The shared checkpoints plus drafters over a reduced draft vocabulary.
struct Fixture {
    checkpoints: Checkpoints,
    soft_eagle3_reduced: PathBuf,
    soft_dflash_reduced: PathBuf,
    soft_dspark_reduced: PathBuf,
    soft_dflash2: PathBuf,
}

impl std::ops::Deref for Fixture {
    type Target = Checkpoints;

    fn deref(&self) -> &Checkpoints {
        &self.checkpoints
    }
}

fn fixture() -> Fixture {
    let checkpoints = Checkpoints::new();
    let root = checkpoints.root();
    let written = |name: &str, checkpoint: (serde_json::Value, HashMap<String, Tensor>)| {
        let dir = root.join(name);
        write(&dir, &checkpoint.0, &checkpoint.1);
        dir
    };
    // A soft EAGLE-3 head with a reduced draft vocabulary (every other target id, through
    // `d2t`): sampled drafts are drawn over the draft vocabulary and their distributions
    // scattered to target ids.
    let (mut c, t) = testing::eagle3_oracle(&SHAPE, [1, 2, 3]).unwrap();
    let mut t = testing::randomized(t, 0.02, 300).unwrap();
    let draft_vocab = SHAPE.vocab / 2;
    t.insert("lm_head.weight".into(), testing::random_tensor(&[draft_vocab, SHAPE.hidden], 0.5, 399).unwrap());
    let d2t: Vec<i64> = (0..draft_vocab as i64).collect();
    t.insert("d2t".into(), Tensor::from_vec(d2t, draft_vocab, &candle_core::Device::Cpu).unwrap());
    c["draft_vocab_size"] = serde_json::json!(draft_vocab);
    let soft_eagle3_reduced = written("soft-eagle3-reduced", (c, t));
    let (block, taps, soft) = (BlockShape::default(), [1, 2], &checkpoints.soft_target);
    // Random block drafters over the same reduced vocabulary. DFlash's slots are chosen
    // independently; DSpark's Markov head corrects each slot by the token chosen before it, so
    // its slots are chosen one after another; DFlash2's selector walks each slot's candidate
    // list. All of them choose on the device when acceptance runs there.
    let soft_dflash_reduced = written(
        "soft-dflash-reduced",
        testing::dflash_speculators(&SHAPE, &block, &taps, draft_vocab, soft, 500).unwrap(),
    );
    let soft_dspark_reduced = written(
        "soft-dspark-reduced",
        testing::dspark_speculators(&SHAPE, &block, &taps, draft_vocab, 4, soft, 600).unwrap(),
    );
    let soft_dflash2 = written("soft-dflash2", testing::dflash2_zlab(&SHAPE, &block, &[0, 1], 700).unwrap());
    Fixture { checkpoints, soft_eagle3_reduced, soft_dflash_reduced, soft_dspark_reduced, soft_dflash2 }
}

struct Setup<'a> {
    target: &'a Path,
    draft: Option<&'a Path>,
    spec: SpeculativeConfig,
    on_device: Option<bool>,
}

fn engine(s: &Setup) -> EngineHandle {
    engine_with(s, false)
}

fn engine_with(s: &Setup, device_graph_capture: bool) -> EngineHandle {
    engine_capturing(s, device_graph_capture.then_some(specrs_engine::MAX_CAPTURED_CONTEXT))
}

/// With `Some(n)`, device-graph capture of contexts up to `n` keys.
fn engine_capturing(s: &Setup, max_seq_len_to_capture: Option<usize>) -> EngineHandle {
    let mut cfg = PipelineConfig::new(s.target.to_str().unwrap());
    cfg.draft_model = s.draft.map(|d| d.to_str().unwrap().to_string());
    // f32 everywhere: lossless comparisons must not hinge on bf16 near-ties between GEMM shapes.
    cfg.dtype = ModelDType::F32;
    cfg.devices = vec![device()];
    cfg.speculative = s.spec.clone();
    cfg.engine = EngineConfig {
        max_num_seqs: 16,
        kv_cache_bytes: 64 << 20,
        block_size: 4,
        acceptance_on_device: s.on_device,
        // Steps that mix prefill and decode rows verify too, so a row's steps (and with them
        // its random streams) do not depend on when other requests arrive.
        enable_spec_decode_mixed_batches: true,
        device_graph_capture: max_seq_len_to_capture.is_some(),
        max_seq_len_to_capture: max_seq_len_to_capture.unwrap_or(specrs_engine::MAX_CAPTURED_CONTEXT),
        // Every request starts in the first step (the captured-step counts rely on it): with
        // prefix caching a repeated prompt waits a step to adopt the first one's blocks
        // (tests/prefix_caching.rs).
        enable_prefix_caching: false,
        ..EngineConfig::default()
    };
    let (engine, info) = build_engine(&cfg).unwrap();
    EngineHandle::spawn(engine, Some(info))
}

fn request(prompt: &[u32], params: SamplingParams, trace: bool) -> GenerationRequest {
    let mut r = GenerationRequest::new(Prompt::Tokens(prompt.to_vec()), params);
    r.trace = trace;
    r
}

fn prompts() -> Vec<Vec<u32>> {
    vec![
        vec![3, 9, 27],
        vec![1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11],
        vec![40],
        vec![5, 5, 5, 5, 6, 7],
        vec![12, 30, 12, 30],
    ]
}

/// Greedy, sampled (several truncations, seeded), a logprobs row and a min_tokens row (both
/// verified on host copies), traced.
fn mixed_requests(max_tokens: usize) -> Vec<GenerationRequest> {
    let base = SamplingParams { max_tokens: Some(max_tokens), ignore_eos: true, ..SamplingParams::default() };
    let variants = [
        SamplingParams { temperature: 0.0, ..base.clone() },
        SamplingParams { temperature: 0.8, seed: Some(1), ..base.clone() },
        SamplingParams { temperature: 1.0, top_k: 5, seed: Some(2), ..base.clone() },
        SamplingParams { temperature: 0.7, top_p: 0.8, min_p: 0.05, seed: Some(3), ..base.clone() },
        SamplingParams { temperature: 1.2, top_k: 12, top_p: 0.9, seed: Some(4), ..base.clone() },
        SamplingParams { temperature: 0.9, logprobs: Some(3), seed: Some(5), ..base.clone() },
        SamplingParams { temperature: 0.9, min_tokens: 4, ignore_eos: false, seed: Some(6), ..base.clone() },
    ];
    let prompts = prompts();
    variants.iter().enumerate().map(|(i, p)| request(&prompts[i % prompts.len()], p.clone(), true)).collect()
}

fn tokens(outs: &[FinalOutput]) -> Vec<Vec<u32>> {
    outs.iter().map(|o| o.token_ids.clone()).collect()
}

fn run(h: &EngineHandle, requests: Vec<GenerationRequest>) -> Vec<FinalOutput> {
    let out = h.generate(requests).unwrap();
    for (i, o) in out.iter().enumerate() {
        assert!(
            o.error.is_none(),
            "request {i} failed ({:?}): {}",
            o.finish_reason,
            o.error.as_ref().map_or(String::new(), |e| e.message.clone())
        );
    }
    let (free, total) = h.kv_blocks().unwrap();
    assert_eq!(free, total, "every KV block returns to the pool");
    out
}

#[test]
fn device_reductions_verify_exactly_like_host_copies() {
    let f = fixture();
    let cases: Vec<(&str, &Path, Option<&Path>, SpeculativeConfig)> = vec![
        ("eagle3 target-sample", &f.bigram, Some(&f.eagle3), spec(SpeculativeMethod::Eagle, 3, |_| {})),
        (
            "mtp greedy rule",
            &f.bigram,
            Some(&f.mtp),
            spec(SpeculativeMethod::Mtp, 2, |c| c.use_greedy_acceptance = true),
        ),
        (
            "mtp behind prompt lookup",
            &f.bigram,
            Some(&f.mtp),
            spec(SpeculativeMethod::Mtp, 2, |c| c.enable_prompt_lookup = true),
        ),
        ("random eagle1", &f.random, Some(&f.random_eagle1), spec(SpeculativeMethod::Eagle, 3, |_| {})),
        (
            // Top-1 probabilities for the cut computed where the draft logits are.
            "random eagle1 with a confidence cut",
            &f.random,
            Some(&f.random_eagle1),
            spec(SpeculativeMethod::Eagle, 3, |c| c.draft_confidence_threshold = 0.5),
        ),
        (
            "random eagle1 one-hot rejection",
            &f.random,
            Some(&f.random_eagle1),
            spec(SpeculativeMethod::Eagle, 3, |c| c.draft_proposal = DraftProposal::Sampled),
        ),
        (
            // Copied drafts (no distribution) and sampled model drafts in the same steps.
            "random eagle1 sampled drafts behind prompt lookup",
            &f.random,
            Some(&f.random_eagle1),
            spec(SpeculativeMethod::Eagle, 3, |c| {
                c.draft_proposal = DraftProposal::Sampled;
                c.enable_prompt_lookup = true;
                c.prompt_lookup_min = 1;
            }),
        ),
        (
            "soft sampled drafts (rejection reads q on the device)",
            &f.soft,
            Some(&f.soft_eagle1),
            spec(SpeculativeMethod::Eagle, 3, |c| c.draft_proposal = DraftProposal::Sampled),
        ),
        (
            "soft sampled drafts over a reduced draft vocabulary",
            &f.soft,
            Some(&f.soft_eagle3_reduced),
            spec(SpeculativeMethod::Eagle, 3, |c| c.draft_proposal = DraftProposal::Sampled),
        ),
        (
            "soft dflash, argmax slots cut by confidence",
            &f.soft,
            Some(&f.soft_dflash_reduced),
            spec(SpeculativeMethod::Dflash, 4, |c| c.draft_confidence_threshold = 0.3),
        ),
        (
            "soft dflash, sampled slots",
            &f.soft,
            Some(&f.soft_dflash_reduced),
            spec(SpeculativeMethod::Dflash, 4, |c| c.draft_proposal = DraftProposal::Sampled),
        ),
        (
            "soft dspark, argmax slots cut by confidence",
            &f.soft,
            Some(&f.soft_dspark_reduced),
            spec(SpeculativeMethod::Dspark, 4, |c| c.draft_confidence_threshold = 0.3),
        ),
        (
            "soft dspark, sampled slots",
            &f.soft,
            Some(&f.soft_dspark_reduced),
            spec(SpeculativeMethod::Dspark, 4, |c| c.draft_proposal = DraftProposal::Sampled),
        ),
        ("soft dflash2, candidate lists", &f.soft, Some(&f.soft_dflash2), spec(SpeculativeMethod::Dflash2, 4, |_| {})),
        ("ngram", &f.random, None, spec(SpeculativeMethod::Ngram, 3, |_| {})),
        (
            "ngram synthetic",
            &f.random,
            None,
            spec(SpeculativeMethod::Ngram, 3, |c| c.synthetic_acceptance_rate = Some(0.5)),
        ),
    ];
    for (name, target, draft, config) in cases {
        let outputs: Vec<Vec<FinalOutput>> = [Some(false), Some(true)]
            .into_iter()
            .map(|on_device| {
                run(&engine(&Setup { target, draft, spec: config.clone(), on_device }), mixed_requests(12))
            })
            .collect();
        let (host, device) = (&outputs[0], &outputs[1]);
        for (h, d) in host.iter().zip(device) {
            assert_eq!(h.token_ids, d.token_ids, "{name}: tokens");
            assert_eq!(h.trace, d.trace, "{name}: traces");
            // Logprobs come from host copies on both paths; the logits themselves move in the
            // last float bits with the batch a row shares (GEMM shapes), hence the tolerance.
            assert_eq!(h.logprobs.len(), d.logprobs.len(), "{name}: logprobs");
            for (a, b) in h.logprobs.iter().zip(&d.logprobs) {
                assert_eq!(a.token, b.token, "{name}: logprob token");
                assert!((a.logprob - b.logprob).abs() < 1e-4, "{name}: logprob {a:?} vs {b:?}");
                let ids = |t: &[(u32, f32)]| t.iter().map(|x| x.0).collect::<Vec<_>>();
                assert_eq!(ids(&a.top), ids(&b.top), "{name}: top logprobs");
            }
            assert_eq!(h.metrics.num_accepted_tokens, d.metrics.num_accepted_tokens, "{name}: acceptance");
        }
        let drafted: u64 = device.iter().map(|o| o.metrics.num_draft_tokens).sum();
        assert!(drafted > 0, "{name}: nothing was drafted");
    }
}

#[test]
fn greedy_speculative_decoding_is_lossless_for_every_method() {
    let f = fixture();
    let greedy =
        |len| SamplingParams { temperature: 0.0, max_tokens: Some(len), ignore_eos: true, ..Default::default() };
    let requests = |len| prompts().iter().map(|p| request(p, greedy(len), false)).collect::<Vec<_>>();
    for (target, draft, method, prompt_lookup) in [
        (&f.bigram, Some(f.eagle3.as_path()), SpeculativeMethod::Eagle, false),
        (&f.bigram, Some(f.eagle3.as_path()), SpeculativeMethod::Eagle, true),
        (&f.bigram, Some(f.mtp.as_path()), SpeculativeMethod::Mtp, false),
        (&f.bigram, Some(f.mtp.as_path()), SpeculativeMethod::Mtp, true),
        (&f.random, Some(f.random_eagle1.as_path()), SpeculativeMethod::Eagle, false),
        (&f.random, Some(f.random_eagle1.as_path()), SpeculativeMethod::Eagle, true),
        (&f.random, None, SpeculativeMethod::Ngram, false),
    ] {
        let plain = run(
            &engine(&Setup { target, draft: None, spec: SpeculativeConfig::default(), on_device: None }),
            requests(24),
        );
        let config = spec(method, 3, |c| c.enable_prompt_lookup = prompt_lookup);
        let spec = run(&engine(&Setup { target, draft, spec: config, on_device: None }), requests(24));
        let finish = |outs: &[FinalOutput]| outs.iter().map(|o| o.finish_reason).collect::<Vec<_>>();
        assert_eq!(
            tokens(&plain),
            tokens(&spec),
            "{method} {draft:?} prompt lookup {prompt_lookup}; finish reasons plain {:?}, speculative {:?}",
            finish(&plain),
            finish(&spec)
        );
    }
}

#[test]
fn sampled_speculative_decoding_follows_the_plain_distribution() {
    // The second generated token of 600 seeded requests, plain vs EAGLE (random drafter,
    // target-sample match, device reductions): the two empirical distributions over the
    // vocabulary agree within sampling noise.
    let f = fixture();
    let n = 600;
    let requests = || {
        (0..n)
            .map(|i| {
                let params = SamplingParams {
                    temperature: 1.0,
                    top_k: 6,
                    max_tokens: Some(3),
                    ignore_eos: true,
                    seed: Some(i as u64 * 7 + 1),
                    ..Default::default()
                };
                request(&[3, 9, 27], params, false)
            })
            .collect::<Vec<_>>()
    };
    let histogram = |outs: &[FinalOutput]| {
        let mut h = vec![0f64; SHAPE.vocab];
        for o in outs {
            h[o.token_ids[1] as usize] += 1.0 / outs.len() as f64;
        }
        h
    };
    let plain = run(
        &engine(&Setup { target: &f.random, draft: None, spec: SpeculativeConfig::default(), on_device: None }),
        requests(),
    );
    let spec_out = run(
        &engine(&Setup {
            target: &f.random,
            draft: Some(&f.random_eagle1),
            spec: spec(SpeculativeMethod::Eagle, 3, |_| {}),
            on_device: Some(true),
        }),
        requests(),
    );
    let (hp, hs) = (histogram(&plain), histogram(&spec_out));
    let tv: f64 = hp.iter().zip(&hs).map(|(a, b)| (a - b).abs()).sum::<f64>() / 2.0;
    // Two samples of 600 over <= 6 likely tokens: TV noise is ~0.05; a biased rule moves mass
    // between tokens far beyond that.
    assert!(tv < 0.12, "total variation {tv} between plain and speculative second tokens");
    assert!(spec_out.iter().map(|o| o.metrics.num_draft_tokens).sum::<u64>() > 0);
}

#[test]
fn captured_steps_give_the_ragged_engines_outputs() {
    let f = fixture();
    let cases: Vec<(&str, &Path, Option<&Path>, SpeculativeConfig)> = vec![
        ("plain", &f.random, None, SpeculativeConfig::default()),
        // Taps [1, 2, 3] feed the head from every captured step.
        ("eagle3", &f.bigram, Some(&f.eagle3), spec(SpeculativeMethod::Eagle, 3, |_| {})),
        // Rows copying lookup drafts past the head's take a wider captured shape.
        (
            "random eagle1 behind prompt lookup",
            &f.random,
            Some(&f.random_eagle1),
            spec(SpeculativeMethod::Eagle, 3, |c| c.enable_prompt_lookup = true),
        ),
        ("mtp", &f.bigram, Some(&f.mtp), spec(SpeculativeMethod::Mtp, 2, |_| {})),
        (
            "soft dspark, argmax slots cut by confidence",
            &f.soft,
            Some(&f.soft_dspark_reduced),
            spec(SpeculativeMethod::Dspark, 4, |c| c.draft_confidence_threshold = 0.3),
        ),
        (
            "soft dspark, sampled slots",
            &f.soft,
            Some(&f.soft_dspark_reduced),
            spec(SpeculativeMethod::Dspark, 4, |c| c.draft_proposal = DraftProposal::Sampled),
        ),
        ("soft dflash2, candidate lists", &f.soft, Some(&f.soft_dflash2), spec(SpeculativeMethod::Dflash2, 4, |_| {})),
        ("ngram", &f.random, None, spec(SpeculativeMethod::Ngram, 3, |_| {})),
    ];
    for (name, target, draft, config) in cases {
        let setup = Setup { target, draft, spec: config, on_device: None };
        let eager = run(&engine(&setup), mixed_requests(12));
        let captured_engine = engine_with(&setup, true);
        let captured = run(&captured_engine, mixed_requests(12));
        // Every step but the one prefilling the requests together ran on a captured shape.
        let all = captured_engine.metrics().steps.load(std::sync::atomic::Ordering::Relaxed);
        assert_eq!(captured_steps(&captured_engine), all - 1, "{name}: captured steps of {all}");
        for (e, c) in eager.iter().zip(&captured) {
            assert_eq!(e.token_ids, c.token_ids, "{name}: tokens");
            assert_eq!(e.trace, c.trace, "{name}: traces");
            assert_eq!(e.metrics.num_accepted_tokens, c.metrics.num_accepted_tokens, "{name}: acceptance");
            // Padding changes the GEMM shapes, so logits move in the last float bits.
            for (a, b) in e.logprobs.iter().zip(&c.logprobs) {
                assert_eq!(a.token, b.token, "{name}: logprob token");
                assert!((a.logprob - b.logprob).abs() < 1e-4, "{name}: logprob {a:?} vs {b:?}");
            }
        }
    }
}

#[test]
fn captured_steps_follow_the_adaptive_controllers_widths_losslessly() {
    // The controller's widths follow measured step times, so its traces differ from run to
    // run; greedy tokens do not. Every width it may pick, plain steps included, is captured.
    let f = fixture();
    let greedy = SamplingParams { temperature: 0.0, max_tokens: Some(24), ignore_eos: true, ..Default::default() };
    let requests = || prompts().iter().map(|p| request(p, greedy.clone(), false)).collect::<Vec<_>>();
    let plain = run(
        &engine(&Setup { target: &f.random, draft: None, spec: SpeculativeConfig::default(), on_device: None }),
        requests(),
    );
    let config = spec(SpeculativeMethod::Eagle, 3, |c| {
        c.enable_prompt_lookup = true;
        c.adaptive_speculative_widths = Some("all".into());
    });
    let setup = Setup { target: &f.random, draft: Some(&f.random_eagle1), spec: config, on_device: None };
    let captured_engine = engine_with(&setup, true);
    let captured = run(&captured_engine, requests());
    assert_eq!(tokens(&plain), tokens(&captured));
    assert!(captured_steps(&captured_engine) > 0, "no step ran on a captured shape");
}

#[test]
fn rows_past_max_seq_len_to_capture_run_the_ragged_forward_with_the_same_outputs() {
    // Contexts grow from 1-11 prompt tokens to 23 + the drafts: under a 16-key cap the early
    // decode steps run captured and the later ones, once a row holds more keys, ragged.
    let f = fixture();
    let setup = Setup {
        target: &f.bigram,
        draft: Some(&f.eagle3),
        spec: spec(SpeculativeMethod::Eagle, 3, |_| {}),
        on_device: None,
    };
    let eager_engine = engine(&setup);
    let eager = run(&eager_engine, mixed_requests(12));
    let capped_engine = engine_capturing(&setup, Some(16));
    let capped = run(&capped_engine, mixed_requests(12));
    // The padding rows' scratch block comes on top of the planned pool, not out of it.
    assert_eq!(capped_engine.kv_blocks().unwrap().1, eager_engine.kv_blocks().unwrap().1);
    let all = capped_engine.metrics().steps.load(std::sync::atomic::Ordering::Relaxed);
    let captured = captured_steps(&capped_engine);
    assert!(captured > 0 && captured < all - 1, "{captured} of {all} steps captured under a 16-key cap");
    for (e, c) in eager.iter().zip(&capped) {
        assert_eq!(e.token_ids, c.token_ids);
        assert_eq!(e.trace, c.trace);
    }
}

fn captured_steps(h: &EngineHandle) -> u64 {
    h.metrics().captured_steps.load(std::sync::atomic::Ordering::Relaxed)
}
