//! Block drafters (DFlash, DFlash2, DSpark) end to end on tiny checkpoints in their real
//! formats:
//! - wiring: on a "bigram" target, a drafter whose block reproduces the target's own next
//!   tokens is accepted at every position (acceptance length K + 1), and the trace shows each
//!   block's proposals, so any off-by-one in anchors, slots, positions or heads shows;
//! - the driver: with random drafters, every block the engine proposes equals the block a
//!   drafter computes from scratch on the whole committed prefix (incremental materialisation,
//!   overwritten rejections, rows packed into one forward);
//! - losslessness: random drafters never change the greedy output, alone or batched, with rows
//!   finishing mid-block, at the trained width, narrower and wider;
//! - structured outputs: a guided row's block keeps to its grammar, greedy or sampled;
//! - width rules, zero-draft skipping, speculator selection and config errors;
//! - every KV block returns to the pool.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use candle_core::{Device, Tensor};
use serde_json::{Value, json};
use specrs_core::SpeculativeConfig;
use specrs_core::config::{DraftProposal, SpeculativeMethod};
use specrs_core::sampling::SamplingParams;
use specrs_core::structured::StructuredOutputs;
use specrs_core::width::VerifyWidthRange;
use specrs_engine::proposer::block::{BlockProposer, checkpoint_draft_width, draft_skip_schedule};
use specrs_engine::{
    DeviceSpec, Engine, EngineConfig, EngineError, EngineHandle, EngineParts, FinalOutput, GenerationRequest,
    PipelineConfig, Prompt, build_engine,
};
use specrs_models::drafters::block::BlockBackbone;
use specrs_models::drafters::dflash::DFlashDraft;
use specrs_models::drafters::dflash2::DFlash2Draft;
use specrs_models::drafters::dspark::DSparkDraft;
use specrs_models::drafters::{BlockDraftModel, SlotSampler};
use specrs_models::testing::{self, BlockShape, TinyShape};
use specrs_models::{BatchRow, CausalLm, ForwardBatch, ModelDType, PagedKvCache, load_causal_lm};

const SHAPE: TinyShape =
    TinyShape { vocab: 48, hidden: 64, layers: 4, heads: 4, kv_heads: 2, head_dim: 16, intermediate: 64 };
const DRAFT: BlockShape = BlockShape { layers: 2, heads: 4, kv_heads: 2, head_dim: 16, block_size: 5 };

fn write(dir: &Path, cfg: &Value, tensors: &HashMap<String, Tensor>) {
    testing::write_checkpoint(dir, cfg, tensors).unwrap();
}

/// The device engines run on: `SPECRS_TEST_DEVICE` (`cpu` by default; `cuda` in a CUDA build
/// on a GPU machine, where scripts/gpu-check.sh runs the engine-level tests of this file).
fn device() -> DeviceSpec {
    std::env::var("SPECRS_TEST_DEVICE").map_or(DeviceSpec::Cpu, |d| d.parse().expect("SPECRS_TEST_DEVICE"))
}

fn pipeline(target: &Path, draft: Option<&Path>, spec: SpeculativeConfig) -> PipelineConfig {
    let mut cfg = PipelineConfig::new(target.to_str().unwrap());
    cfg.devices = vec![device()];
    cfg.draft_model = draft.map(|d| d.to_str().unwrap().to_string());
    cfg.dtype = ModelDType::F32;
    cfg.speculative = spec;
    cfg.engine = EngineConfig { max_num_seqs: 8, kv_cache_bytes: 64 << 20, block_size: 4, ..EngineConfig::default() };
    cfg
}

fn spec(method: Option<SpeculativeMethod>, k: Option<i64>) -> SpeculativeConfig {
    SpeculativeConfig { speculative_method: method, num_speculative_tokens: k, ..SpeculativeConfig::default() }
}

fn engine(target: &Path, draft: Option<&Path>, spec: SpeculativeConfig) -> EngineHandle {
    let (engine, info) = build_engine(&pipeline(target, draft, spec)).unwrap();
    EngineHandle::spawn(engine, Some(info))
}

fn build_error(target: &Path, draft: Option<&Path>, spec: SpeculativeConfig) -> String {
    match build_engine(&pipeline(target, draft, spec)) {
        Ok(_) => panic!("the pipeline should not build"),
        Err(e) => e.to_string(),
    }
}

fn request(prompt: Vec<u32>, max_tokens: usize, temperature: f32) -> GenerationRequest {
    let mut r = GenerationRequest::new(
        Prompt::Tokens(prompt),
        SamplingParams {
            temperature,
            max_tokens: Some(max_tokens),
            ignore_eos: true,
            seed: Some(11),
            ..SamplingParams::default()
        },
    );
    r.trace = true;
    r
}

fn prompts() -> Vec<Vec<u32>> {
    vec![vec![3, 9, 27], vec![1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11], vec![40], vec![5, 5, 5, 5, 6, 7]]
}

fn run(h: &EngineHandle, max_tokens: &[usize]) -> Vec<FinalOutput> {
    let out = h.generate(prompts().into_iter().zip(max_tokens).map(|(p, &m)| request(p, m, 0.0)).collect()).unwrap();
    let (free, total) = h.kv_blocks().unwrap();
    assert_eq!(free, total, "every KV block returns to the pool");
    out
}

struct Fixture {
    _dir: tempfile::TempDir,
    root: PathBuf,
    /// Bigram targets, Llama and Qwen3.
    llama: PathBuf,
    qwen3: PathBuf,
    /// A random Llama target with tied embeddings.
    random: PathBuf,
    random_tensors: HashMap<String, Tensor>,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    let mut paths = Vec::new();
    for arch in [specrs_models::Architecture::Llama, specrs_models::Architecture::Qwen3] {
        let path = root.join(format!("bigram-{arch:?}"));
        write(&path, &testing::target_config(arch, &SHAPE, false), &testing::bigram_target(arch, &SHAPE).unwrap());
        paths.push(path);
    }
    let random = root.join("random");
    let random_tensors = testing::random_target(specrs_models::Architecture::Llama, &SHAPE, true, 3).unwrap();
    write(&random, &testing::target_config(specrs_models::Architecture::Llama, &SHAPE, true), &random_tensors);
    let qwen3 = paths.pop().unwrap();
    let llama = paths.pop().unwrap();
    Fixture { _dir: dir, root, llama, qwen3, random, random_tensors }
}

/// The oracle drafts: (method, checkpoint, trained width).
fn oracles(f: &Fixture) -> Vec<(SpeculativeMethod, PathBuf, usize)> {
    let mut out = Vec::new();
    for (method, name, (cfg, tensors), k) in [
        (SpeculativeMethod::Dflash, "dflash", testing::dflash_oracle(&SHAPE, 5).unwrap(), 4),
        (SpeculativeMethod::Dflash2, "dflash2", testing::dflash2_oracle(&SHAPE, 4).unwrap(), 3),
        (SpeculativeMethod::Dspark, "dspark", testing::dspark_oracle(&SHAPE, 4).unwrap(), 4),
    ] {
        let path = f.root.join(format!("oracle-{name}"));
        write(&path, &cfg, &tensors);
        out.push((method, path, k));
    }
    out
}

/// Every traced step verified the block's first `k` proposals (fewer only where the row's
/// room ran out), each the target's own choice, all accepted: a full-width step commits
/// `k + 1` tokens.
fn assert_perfect_trace(out: &FinalOutput, k: usize, what: &str) {
    for step in &out.trace {
        assert!(step.drafted.len() <= k, "{what}: {step:?}");
        assert_eq!(
            step.drafted[..],
            step.target[..step.drafted.len()],
            "{what}: the block's proposals at {}",
            step.position
        );
        assert_eq!(step.num_accepted, step.drafted.len(), "{what}: {step:?}");
    }
    // Steps before a request's neighbours finished prefilling verify nothing (mixed steps), and
    // the last step may be cut by max_tokens; the rest verify the whole width.
    let full = out.trace.iter().filter(|t| t.drafted.len() == k).count();
    assert!(full >= 2, "{what}: {} of {} steps verified K={k}: {:?}", full, out.trace.len(), out.trace);
}

#[test]
fn oracle_block_drafters_are_accepted_at_every_position() {
    let f = fixture();
    for (method, draft, k) in oracles(&f) {
        for target in [&f.llama, &f.qwen3] {
            let what = format!("{method} on {}", target.file_name().unwrap().to_string_lossy());
            // One prefill token, then up to six blocks of K accepted drafts plus the bonus token.
            let len = 1 + 6 * (k + 1);
            let plain = run(&engine(target, None, spec(None, None)), &[len; 4]);
            let h = engine(target, Some(&draft), spec(Some(method), None));
            assert_eq!(h.info().pipeline.as_ref().unwrap().num_speculative_tokens, Some(k), "{what}: trained width");
            let out = run(&h, &[len; 4]);
            for (p, s) in plain.iter().zip(&out) {
                assert_eq!(p.token_ids, s.token_ids, "{what}: speculative output differs from plain");
                assert!(s.metrics.num_draft_tokens > 0, "{what}: nothing was drafted");
                assert_eq!(s.metrics.num_accepted_tokens, s.metrics.num_draft_tokens, "{what}");
                assert_perfect_trace(s, k, &what);
            }
        }
    }
}

#[test]
fn explicit_widths_verify_a_prefix_or_widen_the_block() {
    let f = fixture();
    let (_, dflash, trained) = oracles(&f).remove(0);
    // Narrower than the block: a prefix of each block is verified, all of it accepted.
    let out = run(&engine(&f.llama, Some(&dflash), spec(Some(SpeculativeMethod::Dflash), Some(2))), &[13; 4]);
    for s in &out {
        assert_perfect_trace(s, 2, "K=2");
    }
    // Wider than trained: honoured (a warning is logged); the oracle knows only `trained`
    // offsets, so drafts past them are rejected, and the output stays the target's.
    let plain = run(&engine(&f.llama, None, spec(None, None)), &[20; 4]);
    let wide = run(&engine(&f.llama, Some(&dflash), spec(Some(SpeculativeMethod::Dflash), Some(6))), &[20; 4]);
    for (p, s) in plain.iter().zip(&wide) {
        assert_eq!(p.token_ids, s.token_ids);
        assert!(s.trace.iter().any(|t| t.drafted.len() == 6), "{:?}", s.trace);
        for t in &s.trace {
            assert!(t.num_accepted >= trained.min(t.drafted.len()), "{t:?}");
        }
    }
    // Below one is refused.
    let e = build_error(&f.llama, Some(&dflash), spec(Some(SpeculativeMethod::Dflash), Some(0)));
    assert!(e.contains("num_speculative_tokens"), "{e}");
}

/// Random drafts of every block format against the random target.
fn random_drafts(f: &Fixture) -> Vec<(SpeculativeMethod, PathBuf)> {
    let t = &f.random_tensors;
    let l = SHAPE.layers as i64;
    let drafts = [
        (SpeculativeMethod::Dflash, "dflash", testing::dflash_zlab(&SHAPE, &DRAFT, &[0, l - 2], 50).unwrap()),
        (
            SpeculativeMethod::Dflash,
            "dflash-speculators",
            testing::dflash_speculators(&SHAPE, &DRAFT, &[1, l - 1], 24, t, 51).unwrap(),
        ),
        (SpeculativeMethod::Dflash2, "dflash2", testing::dflash2_zlab(&SHAPE, &DRAFT, &[1, 2], 52).unwrap()),
        (SpeculativeMethod::Dspark, "dspark", testing::dspark_deepspec(&SHAPE, &DRAFT, &[-1, 2], 6, t, 53).unwrap()),
        (
            SpeculativeMethod::Dspark,
            "dspark-speculators",
            testing::dspark_speculators(&SHAPE, &DRAFT, &[1, 3], 24, 6, t, 54).unwrap(),
        ),
    ];
    drafts
        .into_iter()
        .map(|(method, name, (mut cfg, tensors))| {
            if name == "dflash" {
                // One sliding (causal, windowed) layer in the mix.
                cfg["layer_types"] = json!(["sliding_attention", "full_attention"]);
                cfg["sliding_window"] = json!(6);
            }
            let path = f.root.join(format!("random-{name}"));
            write(&path, &cfg, &tensors);
            (method, path)
        })
        .collect()
}

#[test]
fn a_confidence_threshold_keeps_sure_blocks_whole_and_never_changes_output() {
    let f = fixture();
    let lengths = [17, 5, 30, 9];
    let with_threshold =
        |method, threshold| SpeculativeConfig { draft_confidence_threshold: threshold, ..spec(Some(method), None) };
    // The oracles draft the target's own choice with near certainty: nothing is cut.
    for (method, draft, k) in oracles(&f).into_iter().filter(|(m, ..)| *m != SpeculativeMethod::Dflash2) {
        let len = 1 + 6 * (k + 1);
        let out = run(&engine(&f.llama, Some(&draft), with_threshold(method, 0.9)), &[len; 4]);
        for s in &out {
            assert_perfect_trace(s, k, &format!("{method} at threshold 0.9"));
        }
    }
    // Random drafts: cutting never changes the output, and never verifies more.
    let plain = run(&engine(&f.random, None, spec(None, None)), &lengths);
    for (method, draft) in random_drafts(&f).into_iter().filter(|(m, _)| *m != SpeculativeMethod::Dflash2) {
        let cut = run(&engine(&f.random, Some(&draft), with_threshold(method, 0.9)), &lengths);
        let uncut = run(&engine(&f.random, Some(&draft), with_threshold(method, 0.0)), &lengths);
        for ((p, c), u) in plain.iter().zip(&cut).zip(&uncut) {
            assert_eq!(p.token_ids, c.token_ids, "{method} {draft:?} cut");
            assert_eq!(p.token_ids, u.token_ids, "{method} {draft:?} uncut");
        }
        let drafted = |o: &[FinalOutput]| o.iter().map(|o| o.metrics.num_draft_tokens).sum::<u64>();
        assert!(drafted(&cut) <= drafted(&uncut), "{method}: cutting verified more");
    }
}

#[test]
fn random_block_drafters_never_change_greedy_output_in_batches() {
    let f = fixture();
    // Rows of different lengths finish mid-block at different steps.
    let lengths = [17, 5, 30, 9];
    let plain = run(&engine(&f.random, None, spec(None, None)), &lengths);
    for (method, draft) in random_drafts(&f) {
        for k in [None, Some(2), Some(7)] {
            let out = run(&engine(&f.random, Some(&draft), spec(Some(method), k)), &lengths);
            for ((p, s), &len) in plain.iter().zip(&out).zip(&lengths) {
                assert_eq!(p.token_ids, s.token_ids, "{method} {draft:?} K={k:?}");
                assert_eq!(s.token_ids.len(), len);
                assert!(s.metrics.num_draft_tokens > 0 || len < 3, "{method} {draft:?}: nothing drafted");
            }
        }
        // Prompt lookup in front: copied drafts and block drafts in the same steps, rows the
        // lookup served skipping the block forward.
        let lookup = SpeculativeConfig { enable_prompt_lookup: true, prompt_lookup_min: 1, ..spec(Some(method), None) };
        let out = run(&engine(&f.random, Some(&draft), lookup), &lengths);
        for (p, s) in plain.iter().zip(&out) {
            assert_eq!(p.token_ids, s.token_ids, "{method} {draft:?} behind prompt lookup");
        }
        assert!(out.iter().map(|o| o.metrics.num_draft_tokens).sum::<u64>() > 0, "{method}: nothing drafted");
        // Alone, a row decodes the same as in the batch.
        let h = engine(&f.random, Some(&draft), spec(Some(method), None));
        let alone = h.generate(vec![request(prompts()[2].clone(), lengths[2], 0.0)]).unwrap();
        assert_eq!(alone[0].token_ids, plain[2].token_ids, "{method} {draft:?} alone");
    }
}

struct Argmax;

impl SlotSampler for Argmax {
    fn choose(&mut self, _row: usize, _slot: usize, logits: &[f32], map: Option<&[u32]>) -> u32 {
        let i = specrs_core::sampling::argmax(logits);
        map.map_or(i, |m| m[i as usize])
    }
}

fn load_block_draft(method: SpeculativeMethod, dir: &Path, target: &CausalLm) -> Box<dyn BlockDraftModel> {
    let (cpu, f32) = (&Device::Cpu, ModelDType::F32);
    match method {
        SpeculativeMethod::Dflash => Box::new(DFlashDraft::load(dir, target, cpu, f32).unwrap()),
        SpeculativeMethod::Dflash2 => Box::new(DFlash2Draft::load(dir, target, cpu, f32).unwrap()),
        _ => Box::new(DSparkDraft::load(dir, target, cpu, f32).unwrap()),
    }
}

/// The drafts for `tokens` computed from scratch: one target forward over every committed
/// position for the taps, all of them materialised at once, one block at the last token.
fn drafts_from_scratch(target: &CausalLm, model: &dyn BlockDraftModel, tokens: &[u32], k: usize) -> Vec<u32> {
    const BS: usize = 4;
    let a = tokens.len() - 1;
    let s = model.block_size().max(k + usize::from(!model.samples_from_anchor()));
    let blocks = (a + s).div_ceil(BS);
    let table: Vec<u32> = (0..blocks as u32).collect();
    let row = |len: usize, ctx: usize| BatchRow {
        query_start: 0,
        query_len: len,
        context_len: ctx,
        block_table_start: 0,
        block_table_len: blocks,
    };
    let positions: Vec<u32> = (0..a as u32).collect();
    let prefix = ForwardBatch {
        input_ids: tokens[..a].to_vec(),
        positions: positions.clone(),
        rows: vec![row(a, a)],
        slot_mapping: positions.clone(),
        block_tables: table.clone(),
        block_size: BS,
        taps: model.inputs().taps,
        ..Default::default()
    };
    let taps = target.forward(&prefix, &target.new_kv_cache(blocks, BS).unwrap()).unwrap().taps;
    let kv = model.new_kv_cache(blocks, BS).unwrap();
    let flat = Tensor::from_vec(positions.clone(), a, &Device::Cpu).unwrap();
    model.materialize(&taps, &flat, &positions, &positions, &kv).unwrap();
    let block_positions: Vec<u32> = (a as u32..(a + s) as u32).collect();
    let mut ids = vec![tokens[a]];
    ids.extend(std::iter::repeat_n(model.mask_token_id(), s - 1));
    let block = ForwardBatch {
        input_ids: ids,
        positions: block_positions.clone(),
        rows: vec![row(s, a + s)],
        slot_mapping: block_positions,
        block_tables: table,
        block_size: BS,
        ..Default::default()
    };
    let hidden = model.forward_block(&block, &kv).unwrap();
    let first = usize::from(!model.samples_from_anchor());
    let drafting = hidden.narrow(0, first, k).unwrap();
    model.head(&drafting, &[tokens[a]], &mut Argmax).unwrap().remove(0)
}

#[test]
fn engine_drafts_equal_drafts_computed_from_scratch() {
    // The driver materialises a few positions per step, overwrites what rejected blocks left
    // and packs rows into one block forward; the proposals must be exactly those of a drafter
    // given the whole committed prefix at once.
    let f = fixture();
    let (target, _) = load_causal_lm(&f.random, &Device::Cpu, ModelDType::F32).unwrap();
    for (method, draft) in random_drafts(&f) {
        let model = load_block_draft(method, &draft, &target);
        let k = model.trained_width();
        let h = engine(&f.random, Some(&draft), spec(Some(method), None));
        let out = h.generate(prompts()[..3].iter().map(|p| request(p.clone(), 14, 0.0)).collect()).unwrap();
        for (prompt, o) in prompts().iter().zip(&out) {
            let tokens: Vec<u32> = prompt.iter().chain(&o.token_ids).copied().collect();
            assert!(!o.trace.is_empty(), "{method} {draft:?}: no verify step");
            for step in &o.trace {
                let want = drafts_from_scratch(&target, model.as_ref(), &tokens[..step.position], k);
                assert_eq!(step.drafted[..], want[..step.drafted.len()], "{method} {draft:?} at {}", step.position);
            }
        }
    }
}

#[test]
fn sampled_block_proposals_run_and_return_their_kv() {
    let f = fixture();
    for (method, draft) in random_drafts(&f) {
        let mut s = spec(Some(method), None);
        s.draft_proposal = DraftProposal::Sampled;
        let h = engine(&f.random, Some(&draft), s);
        let out = h.generate(prompts().into_iter().map(|p| request(p, 12, 0.9)).collect()).unwrap();
        assert!(out.iter().all(|o| o.token_ids.len() == 12), "{method} {draft:?}");
        assert!(out.iter().map(|o| o.metrics.num_draft_tokens).sum::<u64>() > 0);
        let (free, total) = h.kv_blocks().unwrap();
        assert_eq!(free, total);
    }
}

#[test]
fn a_guided_rows_blocks_keep_to_its_grammar_greedy_or_sampled() {
    let f = fixture();
    // Words of one width, so no token's text is another's prefix: `w00` .. `w46`.
    testing::write_word_tokenizer(&f.llama, (0..SHAPE.vocab - 1).map(|i| format!("w{i:02}"))).unwrap();
    // The target counts down (w11, w10, ...); the grammar lets it to w07 (or w30), then
    // jumps to w29 where the target wants w06, and ends after w26.
    let grammar = StructuredOutputs { regex: Some("w10w09w08(w07|w30)w29w28w27w26".into()), ..Default::default() };
    let eos = SHAPE.vocab as u32 - 1;
    let paths = [[10, 9, 8, 7, 29, 28, 27, 26, eos], [10, 9, 8, 30, 29, 28, 27, 26, eos]];
    let guided = |temperature: f32| {
        let params = SamplingParams {
            temperature,
            seed: Some(5),
            max_tokens: Some(16),
            structured_outputs: Some(grammar.clone()),
            ..SamplingParams::default()
        };
        GenerationRequest { trace: true, ..GenerationRequest::new(Prompt::Tokens(vec![11]), params) }
    };
    let keeps_to_a_path = |tokens: &[u32]| paths.iter().any(|p| p.starts_with(tokens));
    let plain = engine(&f.llama, None, spec(None, None)).generate(vec![guided(0.0)]).unwrap().remove(0);
    assert_eq!(plain.token_ids, paths[0], "the grammar's path nearest the target's");
    for (method, draft, _) in oracles(&f) {
        let h = engine(&f.llama, Some(&draft), spec(Some(method), None));
        let greedy = h.generate(vec![guided(0.0)]).unwrap().remove(0);
        assert_eq!(greedy.token_ids, plain.token_ids, "{method}: guided speculation is lossless");
        // Unguided, the blocks would draft w06 after w07; guided, they draft w29 and on.
        assert!(greedy.metrics.num_draft_tokens > 0, "{method}");
        assert_eq!(greedy.metrics.num_accepted_tokens, greedy.metrics.num_draft_tokens, "{method}: {:?}", greedy.trace);

        let mut sampled_spec = spec(Some(method), None);
        sampled_spec.draft_proposal = DraftProposal::Sampled;
        let h = engine(&f.llama, Some(&draft), sampled_spec);
        let sampled = h.generate(vec![guided(1.0)]).unwrap().remove(0);
        assert!(keeps_to_a_path(&sampled.token_ids), "{method}: {:?}", sampled.token_ids);
        for step in &sampled.trace {
            let output = &sampled.token_ids[..step.position - sampled.num_prompt_tokens];
            let drafted = [output, &step.drafted[..]].concat();
            assert!(keeps_to_a_path(&drafted), "{method}: drafts {:?} after {output:?}", step.drafted);
        }
        let (free, total) = h.kv_blocks().unwrap();
        assert_eq!(free, total);
    }
}

/// A drafter that counts its block forwards.
struct Counting {
    inner: DFlashDraft,
    forwards: Arc<AtomicUsize>,
}

impl BlockDraftModel for Counting {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn backbone(&self) -> &BlockBackbone {
        self.inner.backbone()
    }

    fn head(
        &self,
        hidden: &Tensor,
        anchors: &[u32],
        sampler: &mut dyn SlotSampler,
    ) -> candle_core::Result<Vec<Vec<u32>>> {
        self.inner.head(hidden, anchors, sampler)
    }

    fn forward_block(&self, batch: &ForwardBatch, kv: &PagedKvCache) -> candle_core::Result<Tensor> {
        self.forwards.fetch_add(1, Ordering::Relaxed);
        self.inner.forward_block(batch, kv)
    }
}

/// An engine over the oracle DFlash draft whose schedule verifies nothing for a lone row and
/// 4 drafts for two or more; returns it with its block-forward counter.
fn counting_engine(f: &Fixture, draft: &Path, skip: bool) -> (EngineHandle, Arc<AtomicUsize>) {
    let (target, store) = load_causal_lm(&f.llama, &Device::Cpu, ModelDType::F32).unwrap();
    let tokenizer = Arc::new(specrs_engine::pipeline::load_tokenizer(&store, &f.llama).unwrap());
    let inner = DFlashDraft::load(draft, &target, &Device::Cpu, ModelDType::F32).unwrap();
    let forwards = Arc::new(AtomicUsize::new(0));
    let model = Arc::new(Counting { inner, forwards: forwards.clone() });
    let mut s = spec(Some(SpeculativeMethod::Dflash), Some(4));
    s.num_speculative_tokens_per_batch_size =
        Some(vec![VerifyWidthRange::new(1, 1, 0), VerifyWidthRange::new(2, 8, 4)]);
    let mut proposer = BlockProposer::new(model, 4, DraftProposal::Argmax, SHAPE.vocab, Device::Cpu);
    if skip {
        proposer = proposer.with_draft_skipping(draft_skip_schedule(&s, 4, 8, false).unwrap().expect("a zero range"));
    }
    let parts = EngineParts {
        target,
        tokenizer,
        proposer: Some(Box::new(proposer)),
        spec: s,
        supports_mixed_batches: true,
        supports_device_graph_capture: true,
        drafter_weight_bytes: 0,
        guest_drafter_kv_replicas: 0,
    };
    let cfg = EngineConfig { max_num_seqs: 8, kv_cache_bytes: 64 << 20, block_size: 4, ..EngineConfig::default() };
    (EngineHandle::spawn(Engine::new(parts, cfg).unwrap(), None), forwards)
}

#[test]
fn schedule_width_zero_skips_the_block_forward() {
    let f = fixture();
    let (_, dflash, _) = oracles(&f).remove(0);
    let plain = run(&engine(&f.llama, None, spec(None, None)), &[16; 4]);
    // A lone row verifies nothing: with skipping, the drafter never runs a block.
    let (h, forwards) = counting_engine(&f, &dflash, true);
    let alone = h.generate(vec![request(prompts()[0].clone(), 16, 0.0)]).unwrap();
    assert_eq!(alone[0].token_ids, plain[0].token_ids);
    assert_eq!(alone[0].metrics.num_draft_tokens, 0);
    assert_eq!(forwards.load(Ordering::Relaxed), 0, "no block forward for zero-width steps");
    // Two rows verify 4: blocks run and are accepted whole.
    let two = h.generate(prompts()[..2].iter().map(|p| request(p.clone(), 16, 0.0)).collect()).unwrap();
    assert!(forwards.load(Ordering::Relaxed) > 0);
    for (p, s) in plain.iter().zip(&two) {
        assert_eq!(p.token_ids, s.token_ids);
        assert!(s.metrics.num_draft_tokens > 0);
        assert_eq!(s.metrics.num_accepted_tokens, s.metrics.num_draft_tokens);
    }
    // Without skipping the same lone row runs a block every step, for nothing.
    let (h, forwards) = counting_engine(&f, &dflash, false);
    let alone = h.generate(vec![request(prompts()[0].clone(), 16, 0.0)]).unwrap();
    assert_eq!(alone[0].token_ids, plain[0].token_ids);
    assert_eq!(alone[0].metrics.num_draft_tokens, 0);
    assert!(forwards.load(Ordering::Relaxed) > 0);
}

#[test]
fn selection_fails_for_a_mismatched_method_and_draft() {
    let f = fixture();
    let o = oracles(&f);
    let (dflash, dflash2, dspark) = (&o[0].1, &o[1].1, &o[2].1);
    for (method, draft, arch) in [
        (SpeculativeMethod::Dflash, dspark, "Qwen3DSparkModel"),
        (SpeculativeMethod::Dspark, dflash, "DFlashDraftModel"),
        (SpeculativeMethod::Dflash2, dflash, "DFlashDraftModel"),
        (SpeculativeMethod::Dflash, dflash2, "DFlash2DraftModel"),
    ] {
        let e = build_error(&f.llama, Some(draft), spec(Some(method), None));
        assert!(
            e.contains("No speculator for LlamaForCausalLM") && e.contains(&format!("'{method}'")) && e.contains(arch),
            "{e}"
        );
    }
    // No draft at all: no speculator runs dspark without one.
    let e = build_error(&f.llama, None, spec(Some(SpeculativeMethod::Dspark), None));
    assert!(e.contains("runs 'dspark' with draft architecture 'None'"), "{e}");
}

#[test]
fn draft_config_errors_surface_when_the_pipeline_is_built() {
    let f = fixture();
    let (mut cfg, tensors) = testing::dspark_oracle(&SHAPE, 4).unwrap();
    cfg["markov_head_type"] = json!("gated");
    let bad = f.root.join("gated");
    write(&bad, &cfg, &tensors);
    let e = build_error(&f.llama, Some(&bad), spec(Some(SpeculativeMethod::Dspark), None));
    assert!(e.contains("markov_head_type") && e.contains("gated"), "{e}");
}

#[test]
fn checkpoint_draft_width_reads_the_trained_width_and_applies_the_rules() {
    let f = fixture();
    let target: Value = serde_json::from_str(&std::fs::read_to_string(f.llama.join("config.json")).unwrap()).unwrap();
    let read = |path: &Path| -> Value {
        serde_json::from_str(&std::fs::read_to_string(path.join("config.json")).unwrap()).unwrap()
    };
    for (method, draft, trained) in oracles(&f) {
        let draft = read(&draft);
        assert_eq!(checkpoint_draft_width(&spec(Some(method), None), &target, &draft).unwrap(), trained, "{method}");
        assert_eq!(checkpoint_draft_width(&spec(Some(method), Some(2)), &target, &draft).unwrap(), 2);
        assert_eq!(checkpoint_draft_width(&spec(Some(method), Some(9)), &target, &draft).unwrap(), 9);
        let e = checkpoint_draft_width(&spec(Some(method), Some(0)), &target, &draft).unwrap_err();
        assert!(matches!(&e, EngineError::Config(c) if c.field.as_deref() == Some("num_speculative_tokens")), "{e}");
        // A target without a Hugging Face config (GGUF) is described by the draft config.
        assert_eq!(checkpoint_draft_width(&spec(Some(method), None), &json!({}), &draft).unwrap(), trained);
    }
    let dflash = read(&oracles(&f)[0].1);
    let e = checkpoint_draft_width(&spec(Some(SpeculativeMethod::Eagle), None), &target, &dflash).unwrap_err();
    assert!(matches!(&e, EngineError::Config(c) if c.field.as_deref() == Some("speculative_method")), "{e}");
    let mut broken = dflash;
    broken["block_size"] = json!(1);
    let e = checkpoint_draft_width(&spec(Some(SpeculativeMethod::Dflash), None), &target, &broken).unwrap_err();
    assert!(e.to_string().contains("block_size"), "{e}");
}
