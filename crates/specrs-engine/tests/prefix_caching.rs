//! Prefix caching (`enable_prefix_caching`): a request whose tokens start with blocks an earlier
//! one computed adopts their keys and values, the target's and the drafter's, and gets exactly
//! what it gets with caching off. Identical traces (every drafted token of every step) show the
//! drafter's cached KV is the KV it would have computed itself.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

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

const BLOCK_SIZE: usize = 4;

/// 13 tokens: three full blocks, each keyed together with the token after it.
const SHARED: [u32; 13] = [7, 3, 19, 4, 22, 8, 31, 2, 15, 40, 11, 6, 27];

fn engine(target: &Path, draft: Option<&Path>, spec: SpeculativeConfig, caching: bool) -> EngineHandle {
    let mut cfg = PipelineConfig::new(target.to_str().unwrap());
    cfg.draft_model = draft.map(|d| d.to_str().unwrap().to_string());
    cfg.dtype = ModelDType::F32;
    cfg.devices = vec![DeviceSpec::Cpu];
    cfg.speculative = spec;
    cfg.engine = EngineConfig {
        max_num_seqs: 8,
        kv_cache_bytes: 32 << 20,
        block_size: BLOCK_SIZE,
        // Every step verifies, so a row's steps do not depend on what else is running.
        enable_spec_decode_mixed_batches: true,
        enable_prefix_caching: caching,
        ..EngineConfig::default()
    };
    let (engine, info) = build_engine(&cfg).unwrap();
    EngineHandle::spawn(engine, Some(info))
}

/// Greedy or seeded sampling, traced.
fn request(prompt: Vec<u32>, i: usize) -> GenerationRequest {
    let params = SamplingParams {
        max_tokens: Some(16),
        ignore_eos: true,
        temperature: if i.is_multiple_of(2) { 0.0 } else { 0.9 },
        seed: Some(i as u64),
        ..SamplingParams::default()
    };
    let mut r = GenerationRequest::new(Prompt::Tokens(prompt), params);
    r.trace = true;
    r
}

fn run(h: &EngineHandle, requests: Vec<GenerationRequest>) -> Vec<FinalOutput> {
    let out = h.generate(requests).unwrap();
    for o in &out {
        assert!(o.error.is_none(), "{:?}", o.error);
    }
    let (free, total) = h.kv_blocks().unwrap();
    assert_eq!(free, total, "every KV block returns to the pool (cached ones parked)");
    out
}

fn prompts_after(first: &[FinalOutput]) -> Vec<Vec<u32>> {
    let with = |tail: &[u32]| [&SHARED[..], tail].concat();
    // The first wave's prompt 0, its conversation so far plus a new turn, a shorter shared
    // start, and something unrelated.
    let mut turn = with(&[1]);
    turn.extend(&first[0].token_ids);
    turn.extend([44, 45]);
    vec![with(&[1]), with(&[2, 9]), turn, SHARED[..9].iter().copied().chain([30, 31, 32]).collect(), vec![5, 6, 7]]
}

/// Two waves, the second after the first has finished: what each request gets.
fn two_waves(h: &EngineHandle) -> (Vec<FinalOutput>, Vec<FinalOutput>) {
    let first_prompts = [vec![1], vec![3, 4, 5]].map(|tail| [&SHARED[..], &tail[..]].concat());
    let first = run(h, first_prompts.into_iter().enumerate().map(|(i, p)| request(p, i)).collect());
    let second = run(h, prompts_after(&first).into_iter().enumerate().map(|(i, p)| request(p, i)).collect());
    (first, second)
}

struct Fixture {
    checkpoints: Checkpoints,
    soft_dflash: PathBuf,
}

fn fixture() -> Fixture {
    let checkpoints = Checkpoints::new();
    let soft_dflash = checkpoints.root().join("soft-dflash");
    let (c, t) =
        testing::dflash_speculators(&SHAPE, &BlockShape::default(), &[1, 2], SHAPE.vocab, &checkpoints.soft_target, 50)
            .unwrap();
    write(&soft_dflash, &c, &t);
    Fixture { checkpoints, soft_dflash }
}

#[test]
fn cached_prefixes_give_every_method_the_outputs_and_drafts_of_an_uncached_engine() {
    let f = fixture();
    let c = &f.checkpoints;
    let cases: Vec<(&str, &Path, Option<&Path>, SpeculativeConfig)> = vec![
        ("plain", &c.random, None, SpeculativeConfig::default()),
        ("random eagle1", &c.random, Some(&c.random_eagle1), spec(SpeculativeMethod::Eagle, 3, |_| {})),
        (
            "random eagle1 behind prompt lookup",
            &c.random,
            Some(&c.random_eagle1),
            spec(SpeculativeMethod::Eagle, 3, |c| c.enable_prompt_lookup = true),
        ),
        (
            "soft eagle1, sampled drafts",
            &c.soft,
            Some(&c.soft_eagle1),
            spec(SpeculativeMethod::Eagle, 3, |c| c.draft_proposal = DraftProposal::Sampled),
        ),
        ("mtp", &c.bigram, Some(&c.mtp), spec(SpeculativeMethod::Mtp, 2, |_| {})),
        ("soft dflash", &c.soft, Some(&f.soft_dflash), spec(SpeculativeMethod::Dflash, 4, |_| {})),
        ("ngram", &c.random, None, spec(SpeculativeMethod::Ngram, 3, |_| {})),
    ];
    for (name, target, draft, config) in cases {
        let (cold_first, cold) = two_waves(&engine(target, draft, config.clone(), false));
        let cached_engine = engine(target, draft, config, true);
        let (warm_first, warm) = two_waves(&cached_engine);
        for (i, (a, b)) in cold_first.iter().chain(&cold).zip(warm_first.iter().chain(&warm)).enumerate() {
            assert_eq!(a.token_ids, b.token_ids, "{name}: request {i} tokens");
            assert_eq!(a.trace, b.trace, "{name}: request {i} drafts and acceptance, step by step");
            assert_eq!(a.metrics.num_cached_tokens, 0, "{name}: nothing is cached with caching off");
        }
        let cached: Vec<usize> = warm.iter().map(|o| o.metrics.num_cached_tokens).collect();
        // The repeated prompt (14 tokens) and the other shared one: three blocks each; the new
        // turn also reuses the blocks the first wave generated; 9 shared tokens: two blocks.
        assert_eq!([cached[0], cached[1], cached[3], cached[4]], [12, 12, 8, 0], "{name}: cached tokens");
        // A finishing sequence whose drafter is at most a step behind is fed its last
        // positions, so the new turn reuses every full block of the first exchange: its 14
        // prompt and 16 generated tokens, less the last (block 7 ends inside the new text).
        // Prompt lookup copied drafts for this random model at almost every step, so the
        // drafter fell behind and only the prompt's blocks were final in its KV.
        let expected = if name.contains("prompt lookup") { 12 } else { 28 };
        assert_eq!(cached[2], expected, "{name}: the new turn's cached tokens ({cached:?})");
        // In the first wave the second prompt waits a step for the first's prefill and adopts
        // its three shared blocks.
        assert_eq!(warm_first[1].metrics.num_cached_tokens, 12, "{name}");
        let metrics = cached_engine.metrics();
        assert_eq!(metrics.prefix_cache_hits.load(Ordering::Relaxed), 12 + cached.iter().sum::<usize>() as u64);
        assert!(cached_engine.num_cached_blocks().unwrap() > 0);
    }
}

#[test]
fn a_requests_choices_compute_their_shared_prompt_once() {
    let c = Checkpoints::new();
    let prompt: Vec<u32> = SHARED.iter().chain(&[9, 9, 9, 9, 9, 9, 9]).copied().collect(); // 20 tokens
    let params = SamplingParams {
        n: 4,
        temperature: 0.8,
        seed: Some(11),
        max_tokens: Some(12),
        ignore_eos: true,
        ..SamplingParams::default()
    };
    let choices = |caching: bool| {
        let h = engine(&c.random, Some(&c.random_eagle1), spec(SpeculativeMethod::Eagle, 3, |_| {}), caching);
        let out = run(&h, vec![GenerationRequest::new(Prompt::Tokens(prompt.clone()), params.clone())]);
        (out, h.metrics().prefix_cache_hits.load(Ordering::Relaxed))
    };
    let (uncached, no_hits) = choices(false);
    let (cached, hits) = choices(true);
    assert_eq!(no_hits, 0);
    // Choices 1..4 wait one step for choice 0's prefill, then adopt its four keyed blocks.
    assert_eq!(hits, 3 * 16);
    assert_eq!(cached.iter().map(|o| o.metrics.num_cached_tokens).collect::<Vec<_>>(), [0, 16, 16, 16]);
    let tokens = |outs: &[FinalOutput]| outs.iter().map(|o| o.token_ids.clone()).collect::<Vec<_>>();
    assert_eq!(tokens(&cached), tokens(&uncached), "each choice's seeded sample is unchanged");
}

#[test]
fn prompt_logprobs_score_every_prompt_token_even_when_its_prefix_is_cached() {
    let c = Checkpoints::new();
    let h = engine(&c.random, None, SpeculativeConfig::default(), true);
    let prompt = [&SHARED[..], &[1]].concat();
    run(&h, vec![request(prompt.clone(), 0)]);
    let mut scored = request(prompt.clone(), 0);
    scored.params.prompt_logprobs = Some(1);
    let out = run(&h, vec![scored, request(prompt.clone(), 0)]);
    assert_eq!(out[0].metrics.num_cached_tokens, 0);
    assert_eq!(out[0].prompt_logprobs.len(), prompt.len());
    assert!(out[0].prompt_logprobs[1..].iter().all(Option::is_some));
    assert_eq!(out[1].metrics.num_cached_tokens, 12);
    assert_eq!(out[0].token_ids, out[1].token_ids);
}

#[test]
fn a_reset_forgets_cached_prefixes() {
    let c = Checkpoints::new();
    let h = engine(&c.random, Some(&c.random_eagle1), spec(SpeculativeMethod::Eagle, 3, |_| {}), true);
    let prompt = [&SHARED[..], &[1]].concat();
    run(&h, vec![request(prompt.clone(), 0)]);
    let cached = h.num_cached_blocks().unwrap();
    assert!(cached >= 3);
    assert_eq!(h.reset_prefix_cache().unwrap(), cached);
    assert_eq!(h.num_cached_blocks().unwrap(), 0);
    let out = run(&h, vec![request(prompt, 0)]);
    assert_eq!(out[0].metrics.num_cached_tokens, 0);
}

#[test]
fn evicting_cached_blocks_under_pressure_keeps_outputs_and_returns_every_block() {
    let c = Checkpoints::new();
    // 48 blocks of 4 tokens: the waves below need more, so parked blocks are evicted and running
    // sequences preempted; outputs still match an uncached engine with room to spare.
    let small = |caching: bool| {
        let mut cfg = PipelineConfig::new(c.random.to_str().unwrap());
        cfg.draft_model = Some(c.random_eagle1.to_str().unwrap().to_string());
        cfg.dtype = ModelDType::F32;
        cfg.speculative = spec(SpeculativeMethod::Eagle, 3, |_| {});
        // K and V, f32, of the target's layers and the head's one.
        let per_token = 2 * SHAPE.kv_heads * SHAPE.head_dim * 4 * (SHAPE.layers + 1);
        cfg.engine = EngineConfig {
            max_num_seqs: 6,
            block_size: BLOCK_SIZE,
            kv_cache_bytes: (per_token * BLOCK_SIZE * 48) as u64,
            max_model_len: Some(64),
            enable_spec_decode_mixed_batches: true,
            enable_prefix_caching: caching,
            ..EngineConfig::default()
        };
        let (engine, info) = build_engine(&cfg).unwrap();
        EngineHandle::spawn(engine, Some(info))
    };
    let waves: Vec<Vec<GenerationRequest>> = (0..3)
        .map(|wave| {
            (0..6)
                .map(|i| {
                    let tail: Vec<u32> = (0..(i % 3) as u32 + 1).map(|t| (t + wave * 7 + i as u32) % 48).collect();
                    let mut r = request([&SHARED[..], &tail].concat(), i);
                    r.params.max_tokens = Some(24);
                    r
                })
                .collect()
        })
        .collect();
    let outputs = |h: &EngineHandle| waves.iter().flat_map(|w| run(h, w.clone())).collect::<Vec<_>>();
    let cold = outputs(&small(false));
    let warm_engine = small(true);
    let warm = outputs(&warm_engine);
    for (i, (a, b)) in cold.iter().zip(&warm).enumerate() {
        assert_eq!(a.token_ids, b.token_ids, "request {i}");
    }
    assert!(warm.iter().any(|o| o.metrics.num_cached_tokens > 0));
    assert!(warm_engine.metrics().num_preemptions.load(Ordering::Relaxed) > 0, "the pool was under pressure");
}

#[test]
fn a_plain_request_that_ends_in_its_prefill_step_still_caches_its_prompt() {
    let c = Checkpoints::new();
    let h = engine(&c.random, None, SpeculativeConfig::default(), true);
    let prompt = [&SHARED[..], &[1]].concat();
    let mut one_token = request(prompt.clone(), 0);
    one_token.params.max_tokens = Some(1);
    run(&h, vec![one_token]);
    assert_eq!(h.num_cached_blocks().unwrap(), 3);
    assert_eq!(run(&h, vec![request(prompt, 0)])[0].metrics.num_cached_tokens, 12);
}
