//! Every sequential method end to end on tiny checkpoints written in the real formats:
//! - wiring: on a "bigram" target, a drafter built to predict it exactly is accepted at every
//!   position (acceptance length K + 1), so any off-by-one in positions, taps or chaining shows;
//! - losslessness: random drafters never change the greedy output, alone or batched, with rows
//!   finishing at different steps;
//! - every KV block returns to the pool.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::Tensor;
use serde_json::json;
use specrs_core::SpeculativeConfig;
use specrs_core::config::SpeculativeMethod;
use specrs_core::sampling::SamplingParams;
use specrs_engine::{EngineConfig, EngineHandle, FinalOutput, GenerationRequest, PipelineConfig, Prompt, build_engine};
use specrs_models::ModelDType;
use specrs_models::config::Architecture;
use specrs_models::testing::{self, TinyShape};

const SHAPE: TinyShape =
    TinyShape { vocab: 48, hidden: 64, layers: 4, heads: 4, kv_heads: 2, head_dim: 16, intermediate: 64 };

fn write(dir: &Path, cfg: &serde_json::Value, tensors: &HashMap<String, Tensor>) {
    testing::write_checkpoint(dir, cfg, tensors).unwrap();
}

/// An engine over `target` (f32, 4-token KV blocks) with `draft` and exactly `speculative`.
fn engine_with(
    target: &Path,
    draft: Option<&Path>,
    speculative: SpeculativeConfig,
    max_num_seqs: usize,
) -> EngineHandle {
    let mut cfg = PipelineConfig::new(target.to_str().unwrap());
    cfg.draft_model = draft.map(|d| d.to_str().unwrap().to_string());
    cfg.dtype = ModelDType::F32;
    cfg.speculative = speculative;
    cfg.engine = EngineConfig { max_num_seqs, kv_cache_bytes: 64 << 20, block_size: 4, ..EngineConfig::default() };
    let (engine, info) = build_engine(&cfg).unwrap();
    EngineHandle::spawn(engine, Some(info))
}

/// `method` at a fixed width `k` (plain decoding for `None`), in batches of up to 8.
fn engine(target: &Path, draft: Option<&Path>, method: Option<SpeculativeMethod>, k: i64) -> EngineHandle {
    let speculative = SpeculativeConfig {
        speculative_method: method,
        num_speculative_tokens: method.map(|_| k),
        prompt_lookup_min: 1,
        ..SpeculativeConfig::default()
    };
    engine_with(target, draft, speculative, 8)
}

/// EAGLE up to `k` drafts, the controller choosing widths (plain steps included) from a batch of 1.
fn eagle_adaptive_at_every_batch_size(k: i64) -> SpeculativeConfig {
    SpeculativeConfig {
        speculative_method: Some(SpeculativeMethod::Eagle),
        num_speculative_tokens: Some(k),
        adaptive_speculative_widths: Some("all".into()),
        adaptive_speculative_min_batch_size: 1,
        ..SpeculativeConfig::default()
    }
}

/// Writes an EAGLE-3 (taps 1, 2, 3) or EAGLE-1 head in its real format with seeded random
/// weights into `dir`: a drafter that is almost never right.
fn random_head(dir: &Path, eagle3: bool, seed: u64) -> PathBuf {
    let (c, t) =
        if eagle3 { testing::eagle3_oracle(&SHAPE, [1, 2, 3]) } else { testing::eagle1_oracle(&SHAPE) }.unwrap();
    write(dir, &c, &testing::randomized(t, 0.3, seed).unwrap());
    dir.to_path_buf()
}

fn greedy(prompt: Vec<u32>, max_tokens: usize) -> GenerationRequest {
    GenerationRequest::new(
        Prompt::Tokens(prompt),
        SamplingParams {
            temperature: 0.0,
            max_tokens: Some(max_tokens),
            ignore_eos: true,
            ..SamplingParams::default()
        },
    )
}

fn prompts() -> Vec<Vec<u32>> {
    vec![vec![3, 9, 27], vec![1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11], vec![40], vec![5, 5, 5, 5, 6, 7]]
}

fn run(h: &EngineHandle, max_tokens: &[usize]) -> Vec<FinalOutput> {
    let out = h.generate(prompts().into_iter().zip(max_tokens).map(|(p, &m)| greedy(p, m)).collect()).unwrap();
    let (free, total) = h.kv_blocks().unwrap();
    assert_eq!(free, total, "every KV block returns to the pool");
    out
}

struct Fixture {
    _dir: tempfile::TempDir,
    bigram: PathBuf,
    mimo: PathBuf,
    random: PathBuf,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let bigram = dir.path().join("bigram");
    write(
        &bigram,
        &testing::target_config(Architecture::Llama, &SHAPE, false),
        &testing::bigram_target(Architecture::Llama, &SHAPE).unwrap(),
    );
    let mimo = dir.path().join("mimo");
    let mut mimo_cfg = testing::target_config(Architecture::Qwen2, &SHAPE, false);
    mimo_cfg["architectures"] = json!(["MiMoForCausalLM"]);
    mimo_cfg["num_nextn_predict_layers"] = json!(1);
    let mut mimo_tensors = testing::bigram_target(Architecture::Qwen2, &SHAPE).unwrap();
    mimo_tensors.extend(testing::mimo_mtp_oracle(&SHAPE).unwrap());
    write(&mimo, &mimo_cfg, &mimo_tensors);
    let random = dir.path().join("random");
    write(
        &random,
        &testing::target_config(Architecture::Llama, &SHAPE, true),
        &testing::random_target(Architecture::Llama, &SHAPE, true, 3).unwrap(),
    );
    Fixture { _dir: dir, bigram, mimo, random }
}

fn oracle_drafts(f: &Fixture) -> Vec<(SpeculativeMethod, Option<PathBuf>, PathBuf)> {
    let root = f.bigram.parent().unwrap();
    let e1 = root.join("eagle1");
    let (c, t) = testing::eagle1_oracle(&SHAPE).unwrap();
    write(&e1, &c, &t);
    let e3 = root.join("eagle3");
    let (c, t) = testing::eagle3_oracle(&SHAPE, [2, 2, 3]).unwrap();
    write(&e3, &c, &t);
    let mtp = root.join("mtp");
    let (c, t) = testing::mtp_oracle(&SHAPE).unwrap();
    write(&mtp, &c, &t);
    vec![
        (SpeculativeMethod::Eagle, Some(e1), f.bigram.clone()),
        (SpeculativeMethod::Eagle, Some(e3), f.bigram.clone()),
        (SpeculativeMethod::Mtp, Some(mtp), f.bigram.clone()),
        (SpeculativeMethod::Mtp, None, f.mimo.clone()),
        (SpeculativeMethod::Ngram, None, f.bigram.clone()),
        (SpeculativeMethod::Suffix, None, f.bigram.clone()),
    ]
}

#[test]
fn oracle_drafters_are_accepted_at_every_position() {
    let f = fixture();
    let k = 3;
    for (method, draft, target) in oracle_drafts(&f) {
        // Prompt lookup and suffix trees need the bigram cycle (47 tokens) to repeat before
        // they can copy it.
        let copies = method.is_model_free();
        let len = if copies { 150 } else { 20 };
        let plain = run(&engine(&target, None, None, 0), &[len; 4]);
        let spec = run(&engine(&target, draft.as_deref(), Some(method), k), &[len; 4]);
        let mut drafted = 0;
        let mut accepted = 0;
        for (p, s) in plain.iter().zip(&spec) {
            assert_eq!(p.token_ids, s.token_ids, "{method} {draft:?}: speculative output differs from plain");
            drafted += s.metrics.num_draft_tokens;
            accepted += s.metrics.num_accepted_tokens;
        }
        assert!(drafted > 0, "{method} {draft:?}: nothing was drafted");
        if copies {
            // Copies are proposed only once the cycle has repeated in the context.
            assert!(accepted * 2 >= drafted, "{method}: {accepted}/{drafted} accepted");
        } else {
            assert_eq!(accepted, drafted, "{method} {draft:?}: a perfect drafter must be accepted everywhere");
            for s in &spec {
                let len = s.metrics.acceptance_length;
                assert!(len > k as f64, "{method} {draft:?}: acceptance length {len} for K={k}");
            }
        }
    }
}

/// A draft checkpoint given with no `speculative_method` runs the method its config names (as
/// vLLM infers it): each oracle head is accepted everywhere; a full language model as "draft"
/// is refused, naming the missing method.
#[test]
fn a_draft_without_a_method_runs_the_method_its_config_names() {
    let f = fixture();
    let no_method = SpeculativeConfig { num_speculative_tokens: Some(3), ..SpeculativeConfig::default() };
    let plain = run(&engine(&f.bigram, None, None, 0), &[20; 4]);
    for (method, draft, target) in oracle_drafts(&f) {
        let Some(draft) = draft else { continue };
        let h = engine_with(&target, Some(&draft), no_method.clone(), 8);
        let pipeline = h.info().pipeline.clone().unwrap();
        assert_eq!(pipeline.method, Some(method), "{draft:?}");
        let spec = run(&h, &[20; 4]);
        for (p, s) in plain.iter().zip(&spec) {
            assert_eq!(p.token_ids, s.token_ids, "{draft:?}");
            assert!(s.metrics.num_draft_tokens > 0, "{draft:?}: nothing was drafted");
            assert_eq!(s.metrics.num_accepted_tokens, s.metrics.num_draft_tokens, "{draft:?}");
        }
    }
    let mut cfg = PipelineConfig::new(f.bigram.to_str().unwrap());
    cfg.draft_model = Some(f.random.to_str().unwrap().to_string());
    cfg.speculative = no_method;
    let e = build_engine(&cfg).err().unwrap().to_string();
    assert!(e.contains("no speculative_method") && e.contains("names no drafter"), "{e}");
}

#[test]
fn random_drafters_never_change_greedy_output_in_batches() {
    let f = fixture();
    let root = f.random.parent().unwrap();
    // Random heads of every format against a random target: few drafts are accepted, and
    // the output must still be exactly the plain greedy output.
    let e1 = random_head(&root.join("rand-eagle1"), false, 100);
    let e3 = random_head(&root.join("rand-eagle3"), true, 200);
    let lengths = [17, 5, 30, 9];
    let plain = run(&engine(&f.random, None, None, 0), &lengths);
    for (method, draft) in [
        (SpeculativeMethod::Eagle, Some(&e1)),
        (SpeculativeMethod::Eagle, Some(&e3)),
        (SpeculativeMethod::Ngram, None),
        (SpeculativeMethod::Suffix, None),
    ] {
        for k in [1, 4] {
            let spec = run(&engine(&f.random, draft.map(|d| d.as_path()), Some(method), k), &lengths);
            for (p, s) in plain.iter().zip(&spec) {
                assert_eq!(p.token_ids, s.token_ids, "{method} {draft:?} K={k}");
                assert_eq!(
                    s.token_ids.len(),
                    lengths[plain.iter().position(|x| x.request_id == p.request_id).unwrap()]
                );
            }
        }
    }
}

/// Suffix decoding on the bigram target, asked for less than its 47-token cycle so that no
/// answer repeats itself: a request asked again is drafted from the first answer, kept in the
/// shared tree, and accepted everywhere; after `reset_suffix_cache`, or with
/// `suffix_decoding_max_cached_requests = 0`, a repeat gains nothing.
#[test]
fn suffix_decoding_drafts_a_repeated_request_from_the_earlier_answer() {
    let f = fixture();
    let ask = |h: &EngineHandle| {
        let out = h.generate(vec![greedy(vec![40], 40)]).unwrap();
        out.into_iter().next().unwrap()
    };
    let plain = ask(&engine(&f.bigram, None, None, 0));
    let suffix = |max_cached_requests| SpeculativeConfig {
        speculative_method: Some(SpeculativeMethod::Suffix),
        num_speculative_tokens: Some(8),
        suffix_decoding_max_cached_requests: max_cached_requests,
        ..SpeculativeConfig::default()
    };
    let cached = engine_with(&f.bigram, None, suffix(16), 8);
    let (first, second) = (ask(&cached), ask(&cached));
    assert_eq!(cached.reset_suffix_cache().unwrap(), 2, "both answers were kept");
    let after_reset = ask(&cached);
    let uncached = engine_with(&f.bigram, None, suffix(0), 8);
    let (alone, again) = (ask(&uncached), ask(&uncached));
    for out in [&first, &second, &after_reset, &alone, &again] {
        assert_eq!(out.token_ids, plain.token_ids, "suffix drafts never change the greedy output");
    }
    let distinct: std::collections::HashSet<u32> = plain.token_ids.iter().copied().collect();
    assert_eq!(distinct.len(), plain.token_ids.len(), "the answer never repeats itself");
    assert_eq!(first.metrics.num_accepted_tokens, 0, "nothing to copy the first time: {:?}", first.metrics);
    let second = &second.metrics;
    assert!(second.num_draft_tokens >= 30, "the repeat drafts most of its answer: {second:?}");
    assert_eq!(second.num_accepted_tokens, second.num_draft_tokens, "its drafts are the first answer: {second:?}");
    assert!(second.acceptance_length > 4.0, "{second:?}");
    assert_eq!(
        (after_reset.metrics.num_draft_tokens, after_reset.metrics.num_accepted_tokens),
        (first.metrics.num_draft_tokens, 0),
        "the reset forgot the earlier answers: the repeat drafts as the first time did"
    );
    assert_eq!(
        (again.metrics.num_draft_tokens, again.metrics.num_accepted_tokens),
        (alone.metrics.num_draft_tokens, alone.metrics.num_accepted_tokens),
        "without the shared tree a repeat drafts exactly as the first time"
    );
}

/// Suffix decoding in front of a random EAGLE head (almost never accepted) on the bigram
/// target: the first answer is drafted by the head, a repeat of the request copies the first
/// answer once its match is long enough to score, as far as the trees reach (past K), and the
/// output never changes (the head catches up on the copied positions). `reset_suffix_cache`
/// reaches the trees through the proposer wrappers: a repeat after it is drafted by the head
/// again.
#[test]
fn suffix_decoding_in_front_of_a_draft_model_copies_a_repeated_answer() {
    let f = fixture();
    let head = random_head(&f.bigram.parent().unwrap().join("rand-eagle1-suffix"), false, 400);
    let ask = |h: &EngineHandle| h.generate(vec![greedy(vec![40], 40)]).unwrap().into_iter().next().unwrap();
    let plain = ask(&engine(&f.bigram, None, None, 0));
    let speculative = SpeculativeConfig {
        speculative_method: Some(SpeculativeMethod::Eagle),
        num_speculative_tokens: Some(2),
        enable_suffix_decoding: true,
        ..SpeculativeConfig::default()
    };
    let h = engine_with(&f.bigram, Some(&head), speculative, 8);
    let (first, second) = (ask(&h), ask(&h));
    assert_eq!(h.reset_suffix_cache().unwrap(), 2);
    let after_reset = ask(&h);
    for out in [&first, &second, &after_reset] {
        assert_eq!(out.token_ids, plain.token_ids);
    }
    let (first, second, after_reset) = (&first.metrics, &second.metrics, &after_reset.metrics);
    assert!(first.num_draft_tokens >= 20, "the head drafts the first answer: {first:?}");
    assert!(first.num_accepted_tokens * 4 < first.num_draft_tokens, "and is rarely right: {first:?}");
    assert!(second.num_accepted_tokens >= 20, "the repeat copies most of the first answer: {second:?}");
    assert!(second.accepted_per_position.len() >= 8, "copies run far past K = 2: {second:?}");
    assert!(second.acceptance_length > 3.0, "more than K = 2 drafts can give (3 tokens a step): {second:?}");
    assert_eq!(
        (after_reset.num_draft_tokens, &after_reset.accepted_per_position),
        (first.num_draft_tokens, &first.accepted_per_position),
        "after the reset the head drafts the repeat exactly as it drafted the first answer"
    );
}

#[test]
fn adaptive_plain_steps_stop_drafting_for_a_rejected_head_and_stay_lossless() {
    let f = fixture();
    let e1 = random_head(&f.random.parent().unwrap().join("rand-eagle1-adaptive"), false, 300);
    let lengths = [60, 60, 60, 60];
    let plain = run(&engine(&f.random, None, None, 0), &lengths);
    let adaptive_widths = eagle_adaptive_at_every_batch_size(4);
    let adaptive = run(&engine_with(&f.random, Some(&e1), adaptive_widths, 8), &lengths);

    for (p, a) in plain.iter().zip(&adaptive) {
        assert_eq!(p.token_ids, a.token_ids, "plain steps interleaved with verify steps change nothing");
    }
    // A random head is almost never accepted, so after the first choice (5 steps) the controller
    // runs plain steps, apart from a probe of the widest width every 50 steps: most tokens come
    // from steps that verified, and drafted, nothing.
    let verify_steps: u64 = adaptive.iter().map(|o| o.metrics.num_drafts).sum();
    let tokens: usize = adaptive.iter().map(|o| o.token_ids.len()).sum();
    assert!(
        (verify_steps as f64) < 0.4 * tokens as f64,
        "{verify_steps} of the steps behind {tokens} tokens still verified drafts"
    );
}

#[test]
fn large_batches_at_plain_steps_probe_with_a_quarter_of_their_rows_and_stay_lossless() {
    let f = fixture();
    let e3 = random_head(&f.random.parent().unwrap().join("rand-eagle3-partial-probes"), true, 400);
    // Twelve rows of 120 tokens: a bucket (8-15) that starts at plain steps.
    let requests =
        || -> Vec<GenerationRequest> { prompts().into_iter().cycle().take(12).map(|p| greedy(p, 120)).collect() };
    let plain = engine_with(&f.random, None, SpeculativeConfig::default(), 16).generate(requests()).unwrap();
    let adaptive_widths = eagle_adaptive_at_every_batch_size(3);
    let adaptive = engine_with(&f.random, Some(&e3), adaptive_widths, 16);
    let out = adaptive.generate(requests()).unwrap();
    for (p, a) in plain.iter().zip(&out) {
        assert_eq!(p.token_ids, a.token_ids, "rows verifying drafts beside rows verifying none change nothing");
    }
    // The bucket starts plain; its fifth decode step probes with 3 of the 12 rows (the first
    // in batch order). Whatever the controller then chooses from the timings, all rows verify
    // alike or a partial probe again favours the first three, so they stay ahead.
    let drafted: Vec<u64> = out.iter().map(|o| o.metrics.num_drafts).collect();
    let (probed, rest) = drafted.split_at(3);
    assert!(probed.iter().min() > rest.iter().max(), "verify steps per row: {drafted:?}");
    let (free, total) = adaptive.kv_blocks().unwrap();
    assert_eq!(free, total);
}

#[test]
fn prompt_lookup_before_a_random_head_with_adaptive_widths_is_lossless_and_copies_deep() {
    let f = fixture();
    let root = f.random.parent().unwrap();
    let head = random_head(&root.join("rand-eagle3-lookup"), true, 300);
    // A head that is never right drives the controller to narrow widths and plain steps; in a
    // batch of three the copies of the bigram cycle go past them (up to K) and must still be
    // exact.
    let lookup_and_head = SpeculativeConfig {
        speculative_method: Some(SpeculativeMethod::Eagle),
        num_speculative_tokens: Some(3),
        adaptive_speculative_widths: Some("all".into()),
        enable_prompt_lookup: true,
        prompt_lookup_min: 1,
        ..SpeculativeConfig::default()
    };
    let spec_engine = |target: &Path| engine_with(target, Some(&head), lookup_and_head.clone(), 8);
    for (target, lengths) in [(&f.random, &[17, 5, 30, 9][..]), (&f.bigram, &[150; 3][..])] {
        let plain = run(&engine(target, None, None, 0), lengths);
        let spec = run(&spec_engine(target), lengths);
        for (p, s) in plain.iter().zip(&spec) {
            assert_eq!(p.token_ids, s.token_ids, "{target:?}: lookup + adaptive widths changed the output");
        }
        if target == &f.bigram {
            // Once the 47-token cycle repeats, every step copies three drafts that are right.
            let deep: u64 = spec.iter().map(|s| s.metrics.accepted_per_position.get(2).copied().unwrap_or(0)).sum();
            let generated: usize = spec.iter().map(|s| s.token_ids.len()).sum();
            assert!(deep * 4 * 2 >= generated as u64, "{deep} steps accepted three drafts of {generated} tokens");
        }
    }
    // From PARTIAL_PROBE_MIN_BATCH rows up the copies keep to the planned width: still exact.
    for target in [&f.random, &f.bigram] {
        let lengths = [40, 33, 60, 51];
        let plain = run(&engine(target, None, None, 0), &lengths);
        for (p, s) in plain.iter().zip(&run(&spec_engine(target), &lengths)) {
            assert_eq!(p.token_ids, s.token_ids, "{target:?}: a batch of four changed the output");
        }
    }
}

/// A Phi-3 config over `SHAPE`: fused projections, LongRoPE past a 16-token pretrained window,
/// half of each head rotated and a 6-key sliding window shorter than every output here.
fn phi3_config() -> serde_json::Value {
    let mut c = testing::target_config(Architecture::Phi3, &SHAPE, false);
    c["partial_rotary_factor"] = json!(0.5);
    c["original_max_position_embeddings"] = json!(16);
    c["sliding_window"] = json!(6);
    c["rope_scaling"] =
        json!({"type": "longrope", "short_factor": [1.0, 1.2, 1.5, 2.0], "long_factor": [2.0, 3.0, 4.0, 6.0]});
    c
}

/// Plain greedy decoding straight on the model, one token per forward, through EOS as the
/// engine's requests here (`ignore_eos`): what the engine's batched, windowed steps must
/// reproduce.
fn model_greedy(target: &Path, prompt: &[u32], max_tokens: usize) -> Vec<u32> {
    let (model, _) = specrs_models::load_causal_lm(target, &candle_core::Device::Cpu, ModelDType::F32).unwrap();
    let block = 4;
    let kv = model.new_kv_cache((prompt.len() + max_tokens).div_ceil(block) + 1, block).unwrap();
    let mut tokens = prompt.to_vec();
    let mut fed = 0;
    let mut out = Vec::new();
    while out.len() < max_tokens {
        let ctx = tokens.len();
        let batch = testing::single_sequence_batch(&tokens[fed..], fed, block, vec![(ctx - fed - 1) as u32]);
        let logits = model.forward(&batch, &kv).unwrap().logits.unwrap().get(0).unwrap().to_vec1::<f32>().unwrap();
        let next = (0..logits.len()).max_by(|&a, &b| logits[a].total_cmp(&logits[b])).unwrap() as u32;
        fed = ctx;
        tokens.push(next);
        out.push(next);
    }
    out
}

/// The engine's plain greedy outputs for `prompts()` equal the model's own token-by-token loop
/// (`model_greedy`), and a random EAGLE-3 head (written to `head` with `seed`) and n-gram
/// lookup at K = 3, in batches of four, return them unchanged.
fn decodes_as_its_model_and_speculates_losslessly(target: &Path, head: &Path, seed: u64, family: &str) {
    let lengths = [17, 5, 30, 9];
    let plain = run(&engine(target, None, None, 0), &lengths);
    // `generate` answers in request order.
    for (i, out) in plain.iter().enumerate() {
        assert_eq!(
            out.token_ids,
            model_greedy(target, &prompts()[i], lengths[i]),
            "{family} request {i}: engine vs model"
        );
    }
    let e3 = random_head(head, true, seed);
    for (method, draft) in [(SpeculativeMethod::Eagle, Some(&e3)), (SpeculativeMethod::Ngram, None)] {
        let spec = run(&engine(target, draft.map(|d| d.as_path()), Some(method), 3), &lengths);
        for (p, s) in plain.iter().zip(&spec) {
            assert_eq!(p.token_ids, s.token_ids, "{method} on {family}");
        }
    }
}

#[test]
fn a_phi3_target_decodes_as_its_model_and_speculates_losslessly() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("phi3");
    let tensors = testing::random_target(Architecture::Llama, &SHAPE, false, 21).unwrap();
    write(&target, &phi3_config(), &testing::fused_as_phi3(tensors, &SHAPE).unwrap());
    decodes_as_its_model_and_speculates_losslessly(&target, &dir.path().join("eagle3"), 300, "Phi-3");
}

#[test]
fn an_oracle_eagle3_head_on_a_phi3_target_is_accepted_at_every_position() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("phi3-bigram");
    let tensors = testing::bigram_target(Architecture::Llama, &SHAPE).unwrap();
    write(&target, &phi3_config(), &testing::fused_as_phi3(tensors, &SHAPE).unwrap());
    let head = dir.path().join("eagle3");
    let (c, t) = testing::eagle3_oracle(&SHAPE, [2, 2, 3]).unwrap();
    write(&head, &c, &t);
    let spec = run(&engine(&target, Some(&head), Some(SpeculativeMethod::Eagle), 3), &[20; 4]);
    let plain = run(&engine(&target, None, None, 0), &[20; 4]);
    for (p, s) in plain.iter().zip(&spec) {
        assert_eq!(p.token_ids, s.token_ids);
        assert_eq!(s.metrics.num_accepted_tokens, s.metrics.num_draft_tokens, "taps of a fused target feed the head");
    }
}

#[test]
fn a_qwen3_moe_target_speculates_losslessly() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("qwen3-moe");
    let moe = testing::TinyMoe { dense_layers: vec![0], ..testing::TinyMoe::routed(4, 2) };
    write(
        &target,
        &testing::moe_target_config(Architecture::Qwen3Moe, &SHAPE, &moe),
        &testing::random_moe_target(Architecture::Qwen3Moe, &SHAPE, &moe, 23).unwrap(),
    );
    decodes_as_its_model_and_speculates_losslessly(&target, &dir.path().join("eagle3"), 301, "Qwen3-MoE");
}

/// A GLM-4.5 config over `SHAPE`: 8 experts in 4 groups, `dense` leading dense layers.
fn glm45(dense: usize) -> (serde_json::Value, testing::TinyMoe) {
    let moe = testing::TinyMoe {
        shared_intermediate: Some(32),
        dense_layers: (0..dense).collect(),
        groups: (4, 2, 2.5),
        ..testing::TinyMoe::routed(8, 2)
    };
    let mut cfg = testing::moe_target_config(Architecture::Glm4Moe, &SHAPE, &moe);
    cfg["num_nextn_predict_layers"] = json!(1);
    (cfg, moe)
}

#[test]
fn glm45_mtp_heads_inside_the_checkpoint_are_accepted_at_every_position() {
    // A bigram target as GLM-4.5 (every layer dense, biased attention) with its MTP head at
    // layer 4, built to predict it exactly.
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("glm45-bigram");
    let (cfg, _) = glm45(SHAPE.layers);
    let mut tensors = testing::bigram_target(Architecture::Qwen2, &SHAPE).unwrap();
    tensors.extend(testing::glm_mtp_layout(&SHAPE, testing::mtp_oracle(&SHAPE).unwrap().1, SHAPE.layers).unwrap());
    write(&target, &cfg, &tensors);
    let plain = run(&engine(&target, None, None, 0), &[20; 4]);
    let spec = run(&engine(&target, None, Some(SpeculativeMethod::Mtp), 3), &[20; 4]);
    for (p, s) in plain.iter().zip(&spec) {
        assert_eq!(p.token_ids, s.token_ids);
        assert!(s.metrics.num_draft_tokens > 0);
        assert_eq!(s.metrics.num_accepted_tokens, s.metrics.num_draft_tokens, "the GLM MTP head predicts exactly");
    }
}

#[test]
fn a_glm45_target_with_its_routed_mtp_head_speculates_losslessly() {
    // Sparse layers 1..4 and a random MTP head whose decoder layer routes to experts too (the
    // random target's fifth layer, past num_hidden_layers).
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("glm45");
    let (cfg, moe) = glm45(1);
    let five = TinyShape { layers: SHAPE.layers + 1, ..SHAPE };
    let mut tensors = testing::random_moe_target(Architecture::Glm4Moe, &five, &moe, 31).unwrap();
    let mtp = format!("model.layers.{}", SHAPE.layers);
    let h = SHAPE.hidden;
    for (name, shape, seed) in
        [("enorm.weight", vec![h], 1), ("hnorm.weight", vec![h], 2), ("shared_head.norm.weight", vec![h], 3)]
    {
        tensors.insert(format!("{mtp}.{name}"), (testing::random_tensor(&shape, 0.2, seed).unwrap() + 1.0).unwrap());
    }
    tensors.insert(format!("{mtp}.eh_proj.weight"), testing::random_tensor(&[h, 2 * h], 0.1, 4).unwrap());
    write(&target, &cfg, &tensors);
    let lengths = [17, 5, 30, 9];
    let plain = run(&engine(&target, None, None, 0), &lengths);
    for (i, out) in plain.iter().enumerate() {
        assert_eq!(out.token_ids, model_greedy(&target, &prompts()[i], lengths[i]), "request {i}: engine vs model");
    }
    for k in [1, 3] {
        let spec = run(&engine(&target, None, Some(SpeculativeMethod::Mtp), k), &lengths);
        for (p, s) in plain.iter().zip(&spec) {
            assert_eq!(p.token_ids, s.token_ids, "GLM-4.5 MTP K={k}");
        }
    }
}

#[test]
fn a_gemma3_target_with_local_and_global_layers_speculates_losslessly() {
    // Layers 0, 2 and 3 attend within 5 keys (shorter than every output here) with their own
    // RoPE, layer 1 to everything.
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("gemma3");
    write(
        &target,
        &testing::gemma3_config(&SHAPE, &[true, false, true, true], 5),
        &testing::random_gemma3(&SHAPE, 41).unwrap(),
    );
    decodes_as_its_model_and_speculates_losslessly(&target, &dir.path().join("eagle3"), 302, "Gemma 3");
}

#[test]
fn a_gemma2_target_with_soft_caps_speculates_losslessly() {
    // Sliding (5 keys) and full layers alternating, scores capped at 1.5 and logits at 2.0:
    // caps that bend most scores and logits, so verification must apply them as decoding does.
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("gemma2");
    write(
        &target,
        &testing::gemma2_config(&SHAPE, &[true, false, true, false], 5, (1.5, 2.0)),
        &testing::random_gemma2(&SHAPE, 43).unwrap(),
    );
    decodes_as_its_model_and_speculates_losslessly(&target, &dir.path().join("eagle3"), 303, "Gemma 2");
}

#[test]
fn a_gpt_oss_target_with_sinks_and_mxfp4_experts_speculates_losslessly() {
    // The released layout: MXFP4 experts (placed as Q8_0 on the CPU), sinks, sliding layers
    // of 5 keys between full ones.
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("gpt-oss");
    let (_, mxfp4) = testing::random_gpt_oss(&SHAPE, 4, 47).unwrap();
    write(&target, &testing::gpt_oss_config(&SHAPE, 4, 2, &[true, false, true, false], 5, 7.0), &mxfp4);
    decodes_as_its_model_and_speculates_losslessly(&target, &dir.path().join("eagle3"), 304, "gpt-oss");
}

#[test]
fn a_glm4_target_with_interleaved_rope_decodes_as_its_model_and_speculates_losslessly() {
    // Its q/k rows are reordered at load and its norms renamed: the engine's batched steps
    // must compute what the model does token by token.
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("glm4");
    write(&target, &testing::glm4_config(&SHAPE), &testing::random_glm4(&SHAPE, 49).unwrap());
    decodes_as_its_model_and_speculates_losslessly(&target, &dir.path().join("eagle3"), 305, "GLM-4");
}

#[test]
fn an_olmo2_target_with_output_norms_decodes_as_its_model_and_speculates_losslessly() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("olmo2");
    write(
        &target,
        &testing::target_config(Architecture::Olmo2, &SHAPE, false),
        &testing::random_olmo2(&SHAPE, 53).unwrap(),
    );
    decodes_as_its_model_and_speculates_losslessly(&target, &dir.path().join("eagle3"), 306, "OLMo 2");
}

#[test]
fn a_smollm3_target_with_nope_layers_decodes_as_its_model_and_speculates_losslessly() {
    // Layers 1 and 3 attend without RoPE: positions reach them only through the mask.
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("smollm3");
    let mut config = testing::target_config(Architecture::SmolLm3, &SHAPE, true);
    config["no_rope_layers"] = serde_json::json!([1, 0, 1, 0]);
    write(&target, &config, &testing::random_target(Architecture::Llama, &SHAPE, true, 59).unwrap());
    decodes_as_its_model_and_speculates_losslessly(&target, &dir.path().join("eagle3"), 307, "SmolLM3");
}

#[test]
fn an_olmo3_target_with_sliding_layers_decodes_as_its_model_and_speculates_losslessly() {
    // Layers 0-2 attend within 5 keys (shorter than every output here), layer 3 to everything.
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("olmo3");
    let mut config = testing::target_config(Architecture::Olmo3, &SHAPE, false);
    config["sliding_window"] = serde_json::json!(5);
    write(&target, &config, &testing::random_olmo2(&SHAPE, 61).unwrap());
    decodes_as_its_model_and_speculates_losslessly(&target, &dir.path().join("eagle3"), 308, "OLMo 3");
}

#[test]
fn a_deepseek_v3_target_with_latent_attention_and_its_mtp_head_speculates_losslessly() {
    // Latent attention (values narrower than keys, the query bottleneck), a dense first layer,
    // grouped-sigmoid experts after it, and a random MTP head past the last layer whose layer
    // attends and routes the same way: the engine's batched steps compute what the model does
    // token by token, and EAGLE-3, n-gram and MTP drafts leave the greedy output unchanged.
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("deepseek-v3");
    let (_, moe) = glm45(1);
    let mla = testing::TinyMla {
        q_lora_rank: Some(24),
        kv_lora_rank: 16,
        qk_nope_head_dim: 12,
        qk_rope_head_dim: 8,
        v_head_dim: 10,
    };
    let mut cfg = testing::deepseek_config(Architecture::DeepseekV3, &SHAPE, &mla, &moe);
    cfg["num_nextn_predict_layers"] = json!(1);
    let five = TinyShape { layers: SHAPE.layers + 1, ..SHAPE };
    let mut tensors = testing::random_deepseek(Architecture::DeepseekV3, &five, &mla, &moe, 67).unwrap();
    let mtp = format!("model.layers.{}", SHAPE.layers);
    let h = SHAPE.hidden;
    for (name, seed) in [("enorm.weight", 1), ("hnorm.weight", 2), ("shared_head.norm.weight", 3)] {
        tensors.insert(format!("{mtp}.{name}"), (testing::random_tensor(&[h], 0.2, seed).unwrap() + 1.0).unwrap());
    }
    tensors.insert(format!("{mtp}.eh_proj.weight"), testing::random_tensor(&[h, 2 * h], 0.1, 4).unwrap());
    write(&target, &cfg, &tensors);
    decodes_as_its_model_and_speculates_losslessly(&target, &dir.path().join("eagle3"), 309, "DeepSeek-V3");
    let lengths = [17, 5, 30, 9];
    let plain = run(&engine(&target, None, None, 0), &lengths);
    for k in [1, 3] {
        let spec = run(&engine(&target, None, Some(SpeculativeMethod::Mtp), k), &lengths);
        for (p, s) in plain.iter().zip(&spec) {
            assert_eq!(p.token_ids, s.token_ids, "DeepSeek-V3 MTP K={k}");
            assert!(s.metrics.num_draft_tokens > 0, "the MTP head drafts");
        }
    }
}

#[test]
fn a_deepseek_v2_target_decodes_as_its_model_and_speculates_losslessly() {
    // V2-Lite's attention (one q_proj) and V2's softmax routing within the best groups.
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("deepseek-v2");
    let (_, moe) = glm45(1);
    let moe = testing::TinyMoe { norm_topk_prob: false, ..moe };
    let mla = testing::TinyMla {
        q_lora_rank: None,
        kv_lora_rank: 16,
        qk_nope_head_dim: 12,
        qk_rope_head_dim: 8,
        v_head_dim: 12,
    };
    write(
        &target,
        &testing::deepseek_config(Architecture::DeepseekV2, &SHAPE, &mla, &moe),
        &testing::random_deepseek(Architecture::DeepseekV2, &SHAPE, &mla, &moe, 71).unwrap(),
    );
    decodes_as_its_model_and_speculates_losslessly(&target, &dir.path().join("eagle3"), 310, "DeepSeek-V2");
}

#[test]
fn cohere_targets_with_parallel_blocks_decode_as_their_model_and_speculate_losslessly() {
    // Command R+'s shape (per-head q/k LayerNorms) and Command R7B's (three sliding layers with
    // RoPE, windows of 5 keys shorter than every output here, to each full layer without).
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("cohere");
    write(
        &target,
        &testing::cohere_config(Architecture::Cohere, &SHAPE, true),
        &testing::random_cohere(&SHAPE, true, 73).unwrap(),
    );
    decodes_as_its_model_and_speculates_losslessly(&target, &dir.path().join("eagle3"), 311, "Cohere");
    let target = dir.path().join("cohere2");
    let mut config = testing::cohere_config(Architecture::Cohere2, &SHAPE, false);
    config["sliding_window"] = json!(5);
    write(&target, &config, &testing::random_cohere(&SHAPE, false, 79).unwrap());
    decodes_as_its_model_and_speculates_losslessly(&target, &dir.path().join("eagle3-2"), 312, "Cohere 2");
}

#[test]
fn an_olmoe_target_with_whole_width_qk_norms_and_experts_speculates_losslessly() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("olmoe");
    let moe = testing::TinyMoe { norm_topk_prob: false, ..testing::TinyMoe::routed(4, 2) };
    write(&target, &testing::olmoe_config(&SHAPE, &moe), &testing::random_olmoe(&SHAPE, &moe, 83).unwrap());
    decodes_as_its_model_and_speculates_losslessly(&target, &dir.path().join("eagle3"), 313, "OLMoE");
}

#[test]
fn a_dots1_target_with_qwen3_attention_and_deepseek_v3_experts_speculates_losslessly() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("dots1");
    let moe = testing::TinyMoe {
        shared_intermediate: Some(32),
        dense_layers: vec![0],
        groups: (4, 2, 2.5),
        ..testing::TinyMoe::routed(8, 2)
    };
    let tensors = testing::random_moe_target(Architecture::Dots1, &SHAPE, &moe, 103).unwrap();
    write(&target, &testing::moe_target_config(Architecture::Dots1, &SHAPE, &moe), &tensors);
    decodes_as_its_model_and_speculates_losslessly(&target, &dir.path().join("eagle3"), 347, "dots.llm1");
}

#[test]
fn an_exaone4_target_with_output_norms_and_nope_full_layers_speculates_losslessly() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("exaone4");
    let mut tensors = testing::random_olmo2(&SHAPE, 107).unwrap();
    for i in 0..SHAPE.layers {
        for (name, seed) in [("q_norm", 200), ("k_norm", 300)] {
            let norm = (testing::random_tensor(&[SHAPE.head_dim], 0.2, seed + i as u64).unwrap() + 1.0).unwrap();
            tensors.insert(format!("model.layers.{i}.self_attn.{name}.weight"), norm);
        }
    }
    let mut config = testing::target_config(Architecture::Exaone4, &SHAPE, false);
    config["sliding_window"] = json!(5);
    config["sliding_window_pattern"] = json!(4);
    write(&target, &config, &tensors);
    decodes_as_its_model_and_speculates_losslessly(&target, &dir.path().join("eagle3"), 349, "EXAONE 4.0");
}

#[test]
fn a_hunyuan_dense_target_with_qk_norms_after_rope_speculates_losslessly() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("hunyuan");
    let tensors: std::collections::HashMap<String, candle_core::Tensor> =
        testing::random_target(Architecture::Qwen3, &SHAPE, true, 109)
            .unwrap()
            .into_iter()
            .map(|(n, t)| (n.replace(".q_norm.", ".query_layernorm.").replace(".k_norm.", ".key_layernorm."), t))
            .collect();
    let mut config = testing::target_config(Architecture::HunYuanDense, &SHAPE, true);
    config["rope_scaling"] = json!({"alpha": 50.0, "factor": 1.0, "type": "dynamic"});
    write(&target, &config, &tensors);
    decodes_as_its_model_and_speculates_losslessly(&target, &dir.path().join("eagle3"), 353, "HunYuan dense");
}

#[test]
fn a_minimax_m2_target_with_biased_sigmoid_experts_speculates_losslessly() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("minimax-m2");
    let moe = testing::TinyMoe::routed(4, 2);
    let tensors = testing::as_minimax_m2(testing::random_minimax_m2(&SHAPE, &moe, 97).unwrap());
    write(&target, &testing::minimax_m2_config(&SHAPE, &moe, SHAPE.head_dim / 2), &tensors);
    decodes_as_its_model_and_speculates_losslessly(&target, &dir.path().join("eagle3"), 331, "MiniMax-M2");
}

#[test]
fn an_ernie4_5_moe_target_with_biased_softmax_experts_speculates_losslessly() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("ernie4_5-moe");
    let moe =
        testing::TinyMoe { shared_intermediate: Some(32), dense_layers: vec![0], ..testing::TinyMoe::routed(4, 2) };
    let tensors = testing::as_ernie4_5_moe(testing::random_ernie4_5_moe(&SHAPE, &moe, 101).unwrap()).unwrap();
    write(&target, &testing::ernie4_5_moe_config(&SHAPE, &moe), &tensors);
    decodes_as_its_model_and_speculates_losslessly(&target, &dir.path().join("eagle3"), 337, "ERNIE 4.5 MoE");
}

#[test]
fn a_granite_moe_target_with_stacked_experts_and_a_shared_mlp_speculates_losslessly() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("granite-moe");
    let moe = testing::TinyMoe { shared_intermediate: Some(32), ..testing::TinyMoe::routed(4, 2) };
    let tensors = testing::random_moe_target(Architecture::GraniteMoe, &SHAPE, &moe, 89).unwrap();
    write(
        &target,
        &testing::granite_moe_config(&SHAPE, &moe, [12.0, 0.22, 0.125, 8.0]),
        &testing::as_granite_moe(tensors, &SHAPE, &moe).unwrap(),
    );
    decodes_as_its_model_and_speculates_losslessly(&target, &dir.path().join("eagle3"), 314, "Granite MoE");
}

#[test]
fn a_seed_oss_target_with_qkv_and_output_biases_speculates_losslessly() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("seed-oss");
    let mut config = testing::target_config(Architecture::SeedOss, &SHAPE, false);
    config["attention_out_bias"] = json!(true);
    write(&target, &config, &testing::random_target(Architecture::SeedOss, &SHAPE, false, 97).unwrap());
    decodes_as_its_model_and_speculates_losslessly(&target, &dir.path().join("eagle3"), 315, "Seed-OSS");
}

#[test]
fn an_ernie45_target_with_interleaved_rope_decodes_as_its_model_and_speculates_losslessly() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("ernie4_5");
    write(
        &target,
        &testing::target_config(Architecture::Ernie4_5, &SHAPE, true),
        &testing::random_target(Architecture::Llama, &SHAPE, true, 101).unwrap(),
    );
    decodes_as_its_model_and_speculates_losslessly(&target, &dir.path().join("eagle3"), 316, "ERNIE 4.5");
}

#[test]
fn a_llama4_image_text_target_with_chunked_attention_speculates_losslessly() {
    // Chunks of 8 and a temperature from position 7: decode and verify steps cross both.
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("llama4");
    let moe =
        testing::TinyMoe { shared_intermediate: Some(32), norm_topk_prob: false, ..testing::TinyMoe::routed(4, 1) };
    let tensors = testing::random_llama4(&SHAPE, &moe, 2, 103).unwrap();
    let text = testing::llama4_config(&SHAPE, &moe, 2, 8, 8.0);
    let stored = testing::as_llama4(&tensors, moe.experts, true).unwrap();
    write(&target, &testing::llama4_image_text_config(&text), &stored);
    decodes_as_its_model_and_speculates_losslessly(&target, &dir.path().join("eagle3"), 347, "Llama 4");
}

#[test]
fn a_hunyuan_a13b_target_with_softmax_experts_and_a_shared_mlp_speculates_losslessly() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("hunyuan-moe");
    let moe = testing::TinyMoe { shared_intermediate: Some(48), ..testing::TinyMoe::routed(4, 2) };
    let mut tensors = testing::random_moe_target(Architecture::HunYuanMoe, &SHAPE, &moe, 107).unwrap();
    tensors.remove("lm_head.weight");
    write(&target, &testing::hunyuan_moe_config(&SHAPE, &moe, 50.0), &testing::as_hunyuan(&tensors));
    decodes_as_its_model_and_speculates_losslessly(&target, &dir.path().join("eagle3"), 359, "Hunyuan-A13B");
}

#[test]
fn an_arcee_target_with_an_ungated_relu_squared_mlp_speculates_losslessly() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("arcee");
    let mut tensors = testing::random_target(Architecture::Llama, &SHAPE, false, 113).unwrap();
    tensors.retain(|name, _| !name.ends_with("mlp.gate_proj.weight"));
    let mut config = testing::target_config(Architecture::Arcee, &SHAPE, false);
    config["hidden_act"] = json!("relu2");
    write(&target, &config, &tensors);
    decodes_as_its_model_and_speculates_losslessly(&target, &dir.path().join("eagle3"), 367, "Arcee");
}

#[test]
fn an_apertus_target_with_a_learned_xielu_per_layer_speculates_losslessly() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("apertus");
    let tensors = testing::random_apertus(&SHAPE, 1009).unwrap();
    write(&target, &testing::apertus_config(&SHAPE), &testing::as_apertus(&tensors));
    decodes_as_its_model_and_speculates_losslessly(&target, &dir.path().join("eagle3"), 1013, "Apertus");
}

#[test]
fn a_starcoder2_target_with_biases_layer_norms_and_a_gelu_mlp_speculates_losslessly() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("starcoder2");
    let tensors = testing::random_starcoder2(&SHAPE, 373).unwrap();
    write(&target, &testing::starcoder2_config(&SHAPE, Some(6)), &testing::as_starcoder2(&tensors));
    decodes_as_its_model_and_speculates_losslessly(&target, &dir.path().join("eagle3"), 379, "StarCoder2");
}

#[test]
fn a_stablelm_2_target_with_per_head_qk_norms_and_parallel_blocks_speculates_losslessly() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("stablelm");
    let tensors = testing::random_stablelm(&SHAPE, false, true, true, 383).unwrap();
    let config = testing::stablelm_config(&SHAPE, 0.25, false, true, true);
    write(&target, &config, &testing::as_stablelm(&tensors).unwrap());
    decodes_as_its_model_and_speculates_losslessly(&target, &dir.path().join("eagle3"), 389, "StableLM 2");
}

#[test]
fn a_phi2_target_with_biases_everywhere_and_parallel_blocks_speculates_losslessly() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("phi2");
    let tensors = testing::random_phi(&SHAPE, false, 397).unwrap();
    write(&target, &testing::phi_config(&SHAPE, 0.5, false), &testing::as_phi(&tensors));
    decodes_as_its_model_and_speculates_losslessly(&target, &dir.path().join("eagle3"), 401, "Phi-2");
}

#[test]
fn a_phi_3_5_moe_target_with_sparsemixer_routing_speculates_losslessly() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("phimoe");
    let moe = testing::TinyMoe { norm_topk_prob: false, ..testing::TinyMoe::routed(4, 2) };
    let tensors = testing::random_phimoe(&SHAPE, &moe, 409).unwrap();
    write(&target, &testing::phimoe_config(&SHAPE, &moe, 0.3), &testing::as_mixtral(tensors));
    decodes_as_its_model_and_speculates_losslessly(&target, &dir.path().join("eagle3"), 419, "Phi-3.5-MoE");
}

#[test]
fn an_olmo_1_target_with_weightless_layer_norms_and_clamped_qkv_speculates_losslessly() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("olmo");
    write(&target, &testing::olmo_config(&SHAPE, Some(0.5)), &testing::random_olmo(&SHAPE, 421).unwrap());
    decodes_as_its_model_and_speculates_losslessly(&target, &dir.path().join("eagle3"), 431, "OLMo 1");
}

#[test]
fn a_gemma_target_with_its_norms_and_geglu_speculates_losslessly() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("gemma");
    write(&target, &testing::gemma_config(&SHAPE), &testing::random_gemma(&SHAPE, 433).unwrap());
    decodes_as_its_model_and_speculates_losslessly(&target, &dir.path().join("eagle3"), 439, "Gemma");
}

#[test]
fn a_nemotron_target_with_layer_norm_1p_and_a_relu_squared_mlp_speculates_losslessly() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("nemotron");
    write(&target, &testing::nemotron_config(&SHAPE), &testing::random_nemotron(&SHAPE, 443).unwrap());
    decodes_as_its_model_and_speculates_losslessly(&target, &dir.path().join("eagle3"), 449, "Nemotron");
}

#[test]
fn a_gpt_neox_target_with_per_head_fused_qkv_and_parallel_blocks_speculates_losslessly() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("gpt-neox");
    // GPT-NeoX's heads span the hidden size and share nothing.
    let shape = TinyShape { kv_heads: SHAPE.heads, ..SHAPE };
    let tensors = testing::random_gpt_neox(&shape, 457).unwrap();
    let on_disk = testing::as_gpt_neox(&tensors, &shape).unwrap();
    write(&target, &testing::gpt_neox_config(&shape, 0.25, true), &on_disk);
    decodes_as_its_model_and_speculates_losslessly(&target, &dir.path().join("eagle3"), 461, "GPT-NeoX");
}

#[test]
fn falcon_targets_with_grouped_fused_qkv_and_parallel_blocks_speculate_losslessly() {
    // Falcon-40B's KV groups with ln_attn / ln_mlp, and Falcon-7B's multi-query with one norm.
    for (seed, kv_heads, two_norms) in [(463, 2, true), (467, 1, false)] {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("falcon");
        let shape = TinyShape { kv_heads, ..SHAPE };
        let layout =
            testing::FalconLayout { new_decoder_architecture: two_norms, parallel_attn: true, two_norms, bias: false };
        let tensors = testing::random_falcon(&shape, layout, seed).unwrap();
        write(&target, &testing::falcon_config(&shape, layout), &testing::as_falcon(&tensors, &shape, layout).unwrap());
        decodes_as_its_model_and_speculates_losslessly(&target, &dir.path().join("eagle3"), seed + 2, "Falcon");
    }
}

#[test]
fn a_gpt_bigcode_target_with_learned_positions_and_multi_query_speculates_losslessly() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("gpt-bigcode");
    let shape = TinyShape { kv_heads: 1, ..SHAPE };
    let tensors = testing::random_gpt_bigcode(&shape, 512, 479).unwrap();
    write(&target, &testing::gpt_bigcode_config(&shape, 512), &testing::as_gpt_bigcode(&tensors, &shape).unwrap());
    decodes_as_its_model_and_speculates_losslessly(&target, &dir.path().join("eagle3"), 487, "GPT-BigCode");
}

#[test]
fn a_gpt2_target_with_conv1d_weights_and_learned_positions_speculates_losslessly() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("gpt2");
    let shape = TinyShape { kv_heads: SHAPE.heads, ..SHAPE };
    let tensors = testing::random_gpt_bigcode(&shape, 512, 491).unwrap();
    write(&target, &testing::gpt2_config(&shape, 512), &testing::as_gpt2(&tensors, &shape, "transformer.").unwrap());
    decodes_as_its_model_and_speculates_losslessly(&target, &dir.path().join("eagle3"), 499, "GPT-2");
}

#[test]
fn alibi_targets_bloom_and_falcon_rw_speculate_losslessly() {
    // BLOOM: ALiBi after the score scale, a LayerNorm over the embeddings, names without
    // `transformer.` as BigScience saved them.
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("bloom");
    let shape = TinyShape { kv_heads: SHAPE.heads, intermediate: 4 * SHAPE.hidden, ..SHAPE };
    let tensors = testing::random_bloom(&shape, 503).unwrap();
    write(&target, &testing::bloom_config(&shape), &testing::as_bloom(&tensors, &shape, "").unwrap());
    decodes_as_its_model_and_speculates_losslessly(&target, &dir.path().join("eagle3"), 509, "BLOOM");
    // Falcon-RW: ALiBi before the scale, per-head q/k/v, biased, one block after the other.
    let target = dir.path().join("falcon-rw");
    let shape = TinyShape { kv_heads: SHAPE.heads, ..SHAPE };
    let layout =
        testing::FalconLayout { new_decoder_architecture: false, parallel_attn: false, two_norms: false, bias: true };
    let tensors = testing::random_falcon(&shape, layout, 521).unwrap();
    let mut config = testing::falcon_config(&shape, layout);
    config["alibi"] = serde_json::json!(true);
    write(&target, &config, &testing::as_falcon(&tensors, &shape, layout).unwrap());
    decodes_as_its_model_and_speculates_losslessly(&target, &dir.path().join("eagle3-rw"), 523, "Falcon-RW");
}

#[test]
fn an_mpt_target_with_alibi_and_clamped_qkv_speculates_losslessly() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("mpt");
    let shape = TinyShape { kv_heads: SHAPE.heads, ..SHAPE };
    let tensors = testing::random_mpt(&shape, 541).unwrap();
    write(&target, &testing::mpt_config(&shape, 8.0, Some(0.5)), &testing::as_mpt(&tensors, &shape).unwrap());
    decodes_as_its_model_and_speculates_losslessly(&target, &dir.path().join("eagle3"), 547, "MPT");
}

#[test]
fn baichuan_targets_with_a_stacked_w_pack_speculate_losslessly() {
    // Baichuan-7B turns RoPE; a 13B-class model (any width but 4096) adds ALiBi.
    for (class, seed) in [("BaiChuanForCausalLM", 557), ("BaichuanForCausalLM", 563)] {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("baichuan");
        let shape = TinyShape { kv_heads: SHAPE.heads, ..SHAPE };
        let tensors = testing::random_target(Architecture::Llama, &shape, false, seed).unwrap();
        write(&target, &testing::baichuan_config(&shape, class), &testing::as_baichuan(&tensors, &shape).unwrap());
        decodes_as_its_model_and_speculates_losslessly(&target, &dir.path().join("eagle3"), seed + 2, class);
    }
}

#[test]
fn glm_and_chatglm_targets_speculate_losslessly() {
    // GlmForCausalLM's layer, and ChatGLM's: stacked query_key_value over KV groups, RoPE's
    // base scaled by rope_ratio.
    let dir = tempfile::tempdir().unwrap();
    let tensors = testing::random_glm(&SHAPE, 569).unwrap();
    let glm = dir.path().join("glm");
    write(&glm, &testing::glm_config(&SHAPE), &tensors);
    decodes_as_its_model_and_speculates_losslessly(&glm, &dir.path().join("eagle3-glm"), 571, "GLM");
    let chatglm = dir.path().join("chatglm");
    write(&chatglm, &testing::chatglm_config(&SHAPE, 50.0), &testing::as_chatglm(&tensors, &SHAPE).unwrap());
    decodes_as_its_model_and_speculates_losslessly(&chatglm, &dir.path().join("eagle3-chatglm"), 577, "ChatGLM");
}
