//! Data-parallel replicas: one engine per device behind one `EngineHandle`, requests routed
//! to the replica that cached their prompt's start or else the least-loaded one, and the draft
//! head placed by `draft_head_parallelism`.
//!
//! The replicas here are two logical CPU devices (no GPU pair on the test machines), so
//! "device 0" and "replica i" are the same memory; what these tests prove is the wiring: every
//! request gets the outputs one engine would give it, under both head placements and every
//! drafter family, requests spread over the replicas, each replica keeps its own KV pool, and
//! aborts, refusals and metrics work across them.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use specrs_core::config::{DraftProposal, SpeculativeMethod};
use specrs_core::sampling::SamplingParams;
use specrs_core::{DraftPlacement, SpeculativeConfig};
use specrs_engine::{
    DeviceSpec, EngineConfig, EngineError, EngineHandle, FinalOutput, FinishReason, GenerationRequest, PipelineConfig,
    Prompt, build_engine, build_replicas,
};
use specrs_models::ModelDType;
use specrs_models::testing;

mod common;
use common::{Checkpoints, SHAPE, write};

/// The shared checkpoints plus a DFlash oracle.
struct Fixture {
    checkpoints: Checkpoints,
    dflash: PathBuf,
}

impl std::ops::Deref for Fixture {
    type Target = Checkpoints;

    fn deref(&self) -> &Checkpoints {
        &self.checkpoints
    }
}

fn fixture() -> Fixture {
    let checkpoints = Checkpoints::new();
    let dflash = checkpoints.root().join("dflash");
    let (c, t) = testing::dflash_oracle(&SHAPE, 4).unwrap();
    write(&dflash, &c, &t);
    Fixture { checkpoints, dflash }
}

fn pipeline(target: &Path, draft: Option<&Path>, spec: SpeculativeConfig, devices: usize) -> PipelineConfig {
    let mut cfg = PipelineConfig::new(target.to_str().unwrap());
    cfg.draft_model = draft.map(|d| d.to_str().unwrap().to_string());
    cfg.dtype = ModelDType::F32;
    cfg.devices = vec![DeviceSpec::Cpu; devices];
    cfg.speculative = spec;
    cfg.engine = EngineConfig {
        max_num_seqs: 8,
        kv_cache_bytes: 16 << 20,
        block_size: 4,
        // A row's steps (and its random streams) must not depend on which requests share its
        // batch, which differs between one engine and two.
        enable_spec_decode_mixed_batches: true,
        ..EngineConfig::default()
    };
    cfg
}

fn replicas(cfg: &PipelineConfig) -> EngineHandle {
    let (engines, info) = build_replicas(cfg).unwrap();
    EngineHandle::spawn_replicas(engines, Some(info)).unwrap()
}

fn spec(method: SpeculativeMethod, k: i64, head: DraftPlacement) -> SpeculativeConfig {
    SpeculativeConfig {
        speculative_method: Some(method),
        num_speculative_tokens: Some(k),
        draft_head_parallelism: head,
        ..SpeculativeConfig::default()
    }
}

/// Greedy and seeded sampled requests over several prompts.
fn requests(n: usize, max_tokens: usize) -> Vec<GenerationRequest> {
    let prompts: [&[u32]; 5] =
        [&[3, 9, 27], &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11], &[40], &[5, 5, 5, 5, 6, 7], &[12, 30]];
    (0..n)
        .map(|i| {
            let params = SamplingParams {
                temperature: if i % 2 == 0 { 0.0 } else { 0.9 },
                top_k: if i % 3 == 1 { 8 } else { 0 },
                seed: Some(i as u64 + 1),
                max_tokens: Some(max_tokens),
                ignore_eos: true,
                ..SamplingParams::default()
            };
            GenerationRequest::new(Prompt::Tokens(prompts[i % prompts.len()].to_vec()), params)
        })
        .collect()
}

fn run(h: &EngineHandle, requests: Vec<GenerationRequest>) -> Vec<FinalOutput> {
    let outs = h.generate(requests).unwrap();
    for (i, o) in outs.iter().enumerate() {
        assert!(o.error.is_none(), "request {i} failed: {:?}", o.error);
    }
    let (free, total) = h.kv_blocks().unwrap();
    assert_eq!(free, total, "every replica's KV blocks return to its pool");
    outs
}

fn tokens(outs: &[FinalOutput]) -> Vec<Vec<u32>> {
    outs.iter().map(|o| o.token_ids.clone()).collect()
}

#[test]
fn two_replicas_give_every_request_what_one_engine_gives_it() {
    let f = fixture();
    let cases: Vec<(&str, &Path, Option<&Path>, Option<SpeculativeConfig>)> = vec![
        ("plain", &f.random, None, None),
        (
            "eagle3, head on device 0",
            &f.bigram,
            Some(&f.eagle3),
            Some(spec(SpeculativeMethod::Eagle, 3, DraftPlacement::Device0)),
        ),
        (
            "eagle3, head per replica",
            &f.bigram,
            Some(&f.eagle3),
            Some(spec(SpeculativeMethod::Eagle, 3, DraftPlacement::Replica)),
        ),
        (
            "random eagle1 (rejections), head on device 0",
            &f.random,
            Some(&f.random_eagle1),
            Some(spec(SpeculativeMethod::Eagle, 3, DraftPlacement::Device0)),
        ),
        (
            "mtp, head on device 0",
            &f.bigram,
            Some(&f.mtp),
            Some(spec(SpeculativeMethod::Mtp, 2, DraftPlacement::Device0)),
        ),
        (
            "dflash, head on device 0",
            &f.bigram,
            Some(&f.dflash),
            Some(spec(SpeculativeMethod::Dflash, 3, DraftPlacement::Device0)),
        ),
        (
            "dflash, head per replica",
            &f.bigram,
            Some(&f.dflash),
            Some(spec(SpeculativeMethod::Dflash, 3, DraftPlacement::Replica)),
        ),
    ];
    for (name, target, draft, spec) in cases {
        let spec = spec.unwrap_or_default();
        let one = {
            let (engine, info) = build_engine(&pipeline(target, draft, spec.clone(), 1)).unwrap();
            run(&EngineHandle::spawn(engine, Some(info)), requests(9, 12))
        };
        let two = replicas(&pipeline(target, draft, spec, 2));
        assert_eq!(two.info().num_replicas, 2);
        let outs = run(&two, requests(9, 12));
        assert_eq!(tokens(&outs), tokens(&one), "{name}: outputs differ between one engine and two replicas");
        if draft.is_some() {
            let accepted: u64 = outs.iter().map(|o| o.metrics.num_accepted_tokens).sum();
            let drafted: u64 = outs.iter().map(|o| o.metrics.num_draft_tokens).sum();
            assert!(drafted > 0, "{name}: the replicas drafted nothing");
            // Oracle drafters predict the bigram target exactly; the random head is rejected,
            // so its rows emit recovered tokens.
            if target == f.bigram.as_path() {
                assert_eq!(accepted, drafted, "{name}: an oracle's drafts are all accepted");
            } else {
                assert!(accepted < drafted, "{name}: a random head's drafts are rejected");
            }
        }
    }
}

#[test]
fn sampled_drafts_verify_the_same_under_both_draft_probs_layouts() {
    let f = fixture();
    let sampled = |layout: DraftPlacement| SpeculativeConfig {
        draft_proposal: DraftProposal::Sampled,
        draft_probs_layout: layout,
        ..spec(SpeculativeMethod::Eagle, 3, DraftPlacement::Device0)
    };
    // Rejection numbers from device reductions (the path where the layout matters).
    let on_device = |mut cfg: PipelineConfig| {
        cfg.engine.acceptance_on_device = Some(true);
        cfg
    };
    let one = {
        let cfg = on_device(pipeline(&f.soft, Some(&f.soft_eagle1), sampled(DraftPlacement::Device0), 1));
        let (engine, info) = build_engine(&cfg).unwrap();
        run(&EngineHandle::spawn(engine, Some(info)), requests(9, 12))
    };
    let rejected: u64 = one.iter().map(|o| o.metrics.num_draft_tokens - o.metrics.num_accepted_tokens).sum();
    assert!(rejected > 0, "the soft head's sampled drafts are sometimes rejected");
    for layout in [DraftPlacement::Device0, DraftPlacement::Replica] {
        let h = replicas(&on_device(pipeline(&f.soft, Some(&f.soft_eagle1), sampled(layout), 2)));
        let outs = run(&h, requests(9, 12));
        assert_eq!(
            tokens(&outs),
            tokens(&one),
            "draft_probs_layout={}: outputs differ from one engine",
            layout.as_str()
        );
        let moved = h.metrics().draft_probs_device0_positions.load(Relaxed);
        match layout {
            // The second replica's sampled rows are reduced where the distributions stay.
            DraftPlacement::Device0 => assert!(moved > 0, "no positions were verified on the first device"),
            DraftPlacement::Replica => assert_eq!(moved, 0, "the replica layout moved positions to device 0"),
        }
    }
}

#[test]
fn requests_spread_over_the_replicas_each_with_its_own_kv_pool() {
    let f = fixture();
    let single = {
        let (engine, info) = build_engine(&pipeline(&f.random, None, SpeculativeConfig::default(), 1)).unwrap();
        EngineHandle::spawn(engine, Some(info))
    };
    let (_, single_total) = single.kv_blocks().unwrap();
    let h = replicas(&pipeline(&f.random, None, SpeculativeConfig::default(), 2));
    assert_eq!(h.info().max_num_seqs, 16, "each replica serves max_num_seqs of its own");
    let per_replica = h.replica_kv_blocks().unwrap();
    assert_eq!(per_replica, vec![(single_total, single_total); 2]);
    assert_eq!(h.kv_blocks().unwrap(), (2 * single_total, 2 * single_total));

    // Two long requests submitted one after the other land on different replicas.
    let long = |prompt: u32| {
        let params = SamplingParams { max_tokens: Some(400), ignore_eos: true, ..SamplingParams::default() };
        GenerationRequest::new(Prompt::Tokens(vec![prompt, 7, 9]), params)
    };
    let (id_a, mut a) = h.submit(long(1)).unwrap();
    let (_, mut b) = h.submit(long(2)).unwrap();
    a.blocking_recv().expect("first output of request a");
    b.blocking_recv().expect("first output of request b");
    let busy = h.replica_kv_blocks().unwrap();
    assert!(busy.iter().all(|&(free, total)| free < total), "both replicas hold a request: {busy:?}");
    assert_eq!(h.metrics().num_running.load(Relaxed), 2, "the running gauge sums the replicas");

    // Aborting one reaches the replica holding it; the other request runs on.
    h.abort(id_a);
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last = None;
    while let Some(o) = a.blocking_recv() {
        assert!(Instant::now() < deadline, "the abort took effect within a minute");
        if o.is_finished() {
            last = o.finish_reason;
            break;
        }
    }
    assert_eq!(last, Some(FinishReason::Abort));
    let mut generated_b = 1;
    let mut reason_b = None;
    while let Some(o) = b.blocking_recv() {
        generated_b += o.token_ids.len();
        if o.is_finished() {
            reason_b = o.finish_reason;
            break;
        }
    }
    assert_eq!(reason_b, Some(FinishReason::Length));
    assert!(generated_b >= 400, "request b ran to its length ({generated_b} tokens)");
    assert_eq!(h.kv_blocks().unwrap(), (2 * single_total, 2 * single_total));
    assert_eq!(h.metrics().num_running.load(Relaxed), 0);
    assert_eq!(h.metrics().kv_free_blocks.load(Relaxed), 2 * single_total, "the free-block gauge sums the replicas");
    assert_eq!(h.metrics().kv_total_blocks.load(Relaxed), 2 * single_total);
}

#[test]
fn a_request_goes_to_the_replica_that_cached_its_prompts_start_though_another_is_idle() {
    let f = fixture();
    let h = replicas(&pipeline(&f.random, None, SpeculativeConfig::default(), 2));
    let params = |max_tokens| SamplingParams { max_tokens: Some(max_tokens), ignore_eos: true, ..Default::default() };
    let shared: Vec<u32> = (1..=40).collect();
    let ask = |tail: u32| GenerationRequest::new(Prompt::Tokens([&shared[..], &[tail]].concat()), params(4));

    // Both replicas idle: the first gets it, and caches the shared start.
    let first = h.generate(vec![ask(41)]).unwrap().remove(0);
    assert_eq!(first.metrics.num_cached_tokens, 0);
    h.replica_kv_blocks().unwrap(); // the replicas have reported their loads
    // An unrelated long request makes the first replica the busier one.
    let (busy_id, mut busy) = h.submit(GenerationRequest::new(Prompt::Tokens(vec![45, 3]), params(400))).unwrap();
    // The second replica is idle, but the first holds the prompt's start and is one request
    // busier: the second request reuses its cache.
    let second = h.generate(vec![ask(42)]).unwrap().remove(0);
    assert!(second.metrics.num_cached_tokens >= 32, "{} prompt tokens cached", second.metrics.num_cached_tokens);

    h.abort(busy_id);
    while let Some(o) = busy.blocking_recv() {
        if o.is_finished() {
            break;
        }
    }
    let (free, total) = h.kv_blocks().unwrap();
    assert_eq!(free, total);
}

#[test]
fn the_first_device_pays_for_every_replicas_drafter_kv_under_device0_head_placement() {
    let f = fixture();
    // KV bytes per token (f32 keys and values): the target's layers, and the oracle head's one
    // layer with one KV head as wide as the hidden state.
    let target = (SHAPE.layers * 2 * SHAPE.kv_heads * SHAPE.head_dim * 4) as u64;
    let (draft, block) = ((2 * SHAPE.hidden * 4) as u64, 4);
    let budgeted = |head: DraftPlacement, bytes: u64| {
        let mut cfg = pipeline(&f.bigram, Some(&f.eagle3), spec(SpeculativeMethod::Eagle, 3, head), 2);
        cfg.engine.kv_cache_bytes = bytes;
        cfg.engine.max_model_len = Some(64);
        cfg
    };
    let blocks = |cfg: &PipelineConfig| -> Vec<usize> {
        build_replicas(cfg).unwrap().0.iter().map(|e| e.num_total_blocks()).collect()
    };
    // A budget the plan is limited by (not max_num_seqs): 100 blocks of target and draft KV.
    let budget = 100 * block * (target + draft);
    let mut one = budgeted(DraftPlacement::Replica, budget);
    one.devices.truncate(1);
    assert_eq!(build_engine(&one).unwrap().0.num_total_blocks(), 100, "the test's byte counts are the engine's");

    assert_eq!(blocks(&budgeted(DraftPlacement::Replica, budget)), vec![100, 100], "each replica holds its own head");
    let device0 = blocks(&budgeted(DraftPlacement::Device0, budget));
    assert_eq!(device0[1], 100, "a replica whose drafter KV lives elsewhere still plans its whole budget");
    let held = device0[0] as u64 * block * (target + draft) + device0[1] as u64 * block * draft;
    assert!(held <= budget, "device 0 holds {held} bytes of KV, over kv_cache_bytes={budget}");
    assert!(held + block * (target + draft) > budget, "device 0 keeps every block it can afford: {device0:?}");

    // Outputs do not depend on the smaller pool of the first replica.
    let h = replicas(&budgeted(DraftPlacement::Device0, budget));
    let reference = {
        let (engine, info) = build_engine(&one).unwrap();
        EngineHandle::spawn(engine, Some(info))
    };
    assert_eq!(tokens(&run(&h, requests(6, 12))), tokens(&run(&reference, requests(6, 12))));

    // A budget each replica can live with alone but device 0 cannot with its guest's head KV.
    let tight = 20 * block * (target + draft);
    blocks(&budgeted(DraftPlacement::Replica, tight));
    let err =
        build_replicas(&budgeted(DraftPlacement::Device0, tight)).err().expect("device 0 over budget").to_string();
    assert!(err.contains("drafter KV of 1 other replica"), "{err}");
    assert!(err.contains("draft_head_parallelism=\"replica\""), "{err}");
}

#[test]
fn a_generate_call_spreads_its_requests_and_counts_tokens_once() {
    let f = fixture();
    let cfg = pipeline(&f.bigram, Some(&f.eagle3), spec(SpeculativeMethod::Eagle, 3, DraftPlacement::Device0), 2);
    let h = replicas(&cfg);
    let outs = run(&h, requests(6, 10));
    assert_eq!(outs.len(), 6);
    let generated: usize = outs.iter().map(|o| o.token_ids.len()).sum();
    assert_eq!(h.metrics().generation_tokens.load(Relaxed), generated as u64);
    let prompt: usize = outs.iter().map(|o| o.num_prompt_tokens).sum();
    assert_eq!(h.metrics().prompt_tokens.load(Relaxed), prompt as u64);

    // A refused request fails the call and aborts the others, on whichever replica they went to.
    let mut bad = requests(4, 50);
    bad[3] = GenerationRequest::new(Prompt::Tokens(vec![1, SHAPE.vocab as u32]), SamplingParams::default());
    let err = h.generate(bad).unwrap_err().to_string();
    assert!(err.contains("outside the vocabulary"), "{err}");
    let (free, total) = h.kv_blocks().unwrap();
    assert_eq!(free, total, "the admitted requests were aborted and their KV freed");
}

#[test]
fn replica_devices_are_checked_with_errors_that_say_what_to_pass() {
    let err = |s: &str| {
        let e = DeviceSpec::parse_list(s).unwrap_err();
        assert!(matches!(&e, EngineError::Config(c) if c.field.as_deref() == Some("device")), "{s}: {e:?}");
        e.to_string()
    };
    assert_eq!(DeviceSpec::parse_list("cuda:0,cuda:1").unwrap(), vec![DeviceSpec::Cuda(0), DeviceSpec::Cuda(1)]);
    assert_eq!(DeviceSpec::parse_list("cpu,cpu").unwrap(), vec![DeviceSpec::Cpu; 2]);
    assert!(err("cuda:0,cuda:0").contains("cuda:0 is listed twice"), "{}", err("cuda:0,cuda:0"));
    assert!(err("cpu,cuda:1").contains("all run on CUDA or all on the CPU"), "{}", err("cpu,cuda:1"));
    assert!(err("cuda:0,tpu").contains("unknown device 'tpu'"), "{}", err("cuda:0,tpu"));
    let no_devices = specrs_engine::check_replica_devices(&[]).unwrap_err().to_string();
    assert!(no_devices.contains("no device given"), "{no_devices}");

    let f = fixture();
    let two = pipeline(&f.random, None, SpeculativeConfig::default(), 2);
    let msg = match build_engine(&two) {
        Ok(_) => panic!("build_engine builds one engine"),
        Err(e) => e.to_string(),
    };
    assert!(msg.contains("build_replicas"), "{msg}");
    let msg = match EngineHandle::spawn_replicas(Vec::new(), None) {
        Ok(_) => panic!("no engines, no handle"),
        Err(e) => e.to_string(),
    };
    assert!(msg.contains("at least one"), "{msg}");
}
