//! The engine: one step at a time, schedule → verify → accept → commit → roll back → propose.
//!
//! Each step runs one target forward over a ragged batch. Decode rows feed their last
//! committed token followed by the drafts to verify; prefill rows feed a chunk of prompt (or
//! of a preempted sequence being recomputed). Acceptance turns each row's logits into the
//! tokens it commits; stop conditions are checked token by token; KV reservations shrink back
//! to what was committed; then the proposer drafts for the next step.

use std::cell::Cell;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use candle_core::{Device, Tensor};
use specrs_core::SpeculativeConfig;
use specrs_core::acceptance::{AcceptanceSampler, ReducedPosition, ReducedRow, VerifyOutput, VerifyRow};
use specrs_core::kv_blocks::{KvBlockManager, SeqId};
use specrs_core::metrics::{SpecDecodeStats, format_log_line};
use specrs_core::prefix_cache::BlockHasher;
use specrs_core::sampling::{SamplingParams, argmax, logprobs_of, rank_of};
use specrs_core::scheduler::{Scheduler, SchedulerConfig, StepPlan};
use specrs_core::structured::{GuideCache, TokenVocabulary};
use specrs_core::width::adaptive::PARTIAL_PROBE_MIN_BATCH;
use specrs_models::graph::{CapturePlan, FixedSteps, StepOutputs, WidthSource};
use specrs_models::host::with_f32_slice;
use specrs_models::reductions::{self, PositionQuery};
use specrs_models::{BatchRow, CausalLm, ForwardBatch, ForwardOutput, PagedKvCache};

use crate::detokenizer::{FinishReason, OutputState};
use crate::error::{EngineError, Result};
use crate::metrics::EngineMetrics;
use crate::proposer::{DraftProbs, Proposal, ProposeRow, Proposer, StepTaps, TapRequest};
use crate::request::{GenerationRequest, OutputSink, Prompt, RequestFailure, TokenLogprob, TraceStep};
use crate::sequence::Sequence;
use crate::tokenizer::TextTokenizer;
use crate::width::{EngineWidthPolicy, WidthMode};

/// The default of [`EngineConfig::max_seq_len_to_capture`].
pub const MAX_CAPTURED_CONTEXT: usize = 4096;

/// Runtime limits of an engine.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineConfig {
    pub max_num_seqs: usize,
    /// Tokens one step may feed the target.
    pub max_num_batched_tokens: usize,
    /// Longest prefill chunk per sequence per step.
    pub max_prefill_chunk: usize,
    /// Tokens per KV block.
    pub block_size: usize,
    /// Bytes of KV storage (target plus drafter), sized into blocks by the memory planner.
    pub kv_cache_bytes: u64,
    /// Context length; `None` takes the model's.
    pub max_model_len: Option<usize>,
    pub enable_spec_decode_mixed_batches: bool,
    /// How often the speculative acceptance line is logged.
    pub log_interval: Duration,
    /// Verify from device reductions instead of host copies of the logits: `None` (the
    /// default) does so when the logits live off the host (CUDA); `Some(true)` forces it
    /// (exercises the device path on CPU), `Some(false)` always copies the logits.
    pub acceptance_on_device: Option<bool>,
    /// Runs pure decode/verify steps on fixed shapes, each batch padded up to a captured batch
    /// size and verify width (`specrs_models::graph`), where the architecture supports it
    /// (`supports_device_graph_capture`). On CUDA each shape is captured once as a device
    /// graph and replayed (MAX's `--device-graph-capture`); on the CPU the same fixed-shape
    /// steps run eagerly, which is slower and serves to test the path. Off by default: the
    /// engine's captured steps have not been run on a GPU yet (docs/CUDA.md).
    pub device_graph_capture: bool,
    /// The longest context a captured step attends over (vLLM's `max_seq_len_to_capture`).
    /// Every captured row gathers this many key slots, so the cap bounds the graphs' memory
    /// and the padded attention's work; rows with longer contexts run the ragged forward.
    pub max_seq_len_to_capture: usize,
    /// Reuses the KV of full blocks a new sequence's tokens start with, when an earlier
    /// sequence computed them (vLLM's and MAX's `enable_prefix_caching`, on by default):
    /// shared system prompts, multi-turn chats, a request's `n` choices. Drafter KV is cached
    /// with the target's, so drafts stay as good on a cached prefix.
    pub enable_prefix_caching: bool,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            max_num_seqs: 64,
            max_num_batched_tokens: 2048,
            max_prefill_chunk: 512,
            block_size: 16,
            kv_cache_bytes: 1 << 30,
            max_model_len: None,
            enable_spec_decode_mixed_batches: false,
            log_interval: Duration::from_secs(10),
            acceptance_on_device: None,
            device_graph_capture: false,
            max_seq_len_to_capture: MAX_CAPTURED_CONTEXT,
            enable_prefix_caching: true,
        }
    }
}

/// Everything an engine runs, assembled by the pipeline builder.
pub struct EngineParts {
    pub target: CausalLm,
    pub tokenizer: Arc<TextTokenizer>,
    pub proposer: Option<Box<dyn Proposer>>,
    /// The resolved speculative config (`num_speculative_tokens` set when enabled).
    pub spec: SpeculativeConfig,
    /// The architecture is per-row correct on mixed prefill+decode verify steps.
    pub supports_mixed_batches: bool,
    /// The architecture's steps may be captured as device graphs.
    pub supports_device_graph_capture: bool,
    /// Drafter weights already on the device, subtracted from nothing (reported only).
    pub drafter_weight_bytes: usize,
    /// Other replicas whose drafter KV lives on this engine's device (the first device under
    /// `draft_head_parallelism="device0"`). Each holds as many blocks as this engine would with
    /// its whole `kv_cache_bytes`; they are paid from this engine's budget, so the device holds
    /// no more than `kv_cache_bytes` of KV in all.
    pub guest_drafter_kv_replicas: usize,
}

pub struct Engine {
    target: CausalLm,
    kv: PagedKvCache,
    tokenizer: Arc<TextTokenizer>,
    proposer: Option<Box<dyn Proposer>>,
    taps: TapRequest,
    acceptance: AcceptanceSampler,
    width: EngineWidthPolicy,
    scheduler: Scheduler,
    seqs: HashMap<SeqId, Sequence>,
    metrics: Arc<EngineMetrics>,
    /// This engine's share of the gauges last published to `metrics` (running, waiting, free
    /// KV blocks): data-parallel replicas publish into one `EngineMetrics`, each adding the
    /// change in its own share.
    published_gauges: Cell<[usize; 3]>,
    spec: SpeculativeConfig,
    cfg: EngineConfig,
    max_model_len: usize,
    vocab_size: usize,
    next_seed: u64,
    window: SpecDecodeStats,
    last_log: Instant,
    /// Drafting done at the end of the last step for the next one (its catch-up left out);
    /// `None` when that drafting fed prefill rows, so the next step goes untimed.
    next_step_draft_time: Option<Duration>,
    /// The drafter's catch-up of positions kept through plain steps, done while drafting for
    /// the next step (reported to the adaptive controller with that step).
    next_step_catch_up: Duration,
    /// Sequences that finished this step, held until the drafter has fed their last positions
    /// (with prefix caching and a drafter), so their blocks are final there and cached.
    finishing: Vec<(SeqId, FinishReason)>,
    /// Fixed-shape (captured) decode steps, with `device_graph_capture`.
    fixed_steps: Option<FixedSteps>,
    /// Where sampled drafts' distributions are verified when not beside this engine's
    /// logits: the first device, for a later data-parallel replica under
    /// `draft_probs_layout="device0"` ([`Engine::with_draft_probs_on`]).
    draft_probs_device: Option<candle_core::Device>,
    /// Structured-output guides compiled for recent requests, over the tokenizer's byte
    /// vocabulary (built with the first guided request).
    guides: Option<GuideCache>,
}

/// Compiled structured-output constraints kept for reuse.
pub(crate) const GUIDE_CACHE_CAPACITY: usize = 32;

/// The byte vocabulary guides are compiled against: each token's bytes, the end-of-sequence
/// tokens, and the reasoning markers a guide may wait for.
pub(crate) fn guide_vocabulary(tokenizer: &TextTokenizer) -> TokenVocabulary {
    TokenVocabulary::new(tokenizer.token_bytes(), tokenizer.eos_token_ids().to_vec())
        .with_thinking_tokens(tokenizer.thinking_token_ids())
}

/// `a`, `a and b`, `a, b and c`.
fn list_fields(fields: &[&str]) -> String {
    match fields {
        [] => "masks".into(),
        [one] => (*one).into(),
        [rest @ .., last] => format!("{} and {last}", rest.join(", ")),
    }
}

/// What verification gives the rows of a step.
struct Verified {
    /// Each row's verify output: none for rows without logits.
    outputs: Vec<Option<VerifyOutput>>,
    /// Each row's logprobs and trace.
    extras: Vec<(Vec<TokenLogprob>, Option<TraceStep>)>,
}

/// Position queries reduced together on one device, with the sampled drafts' distributions
/// they read (`[positions, V]`: host rows uploaded together, device rows used where they are)
/// and, for a group away from the logits, which logit rows to gather there.
struct ReductionGroup<'a> {
    device: Device,
    queries: Vec<PositionQuery<'a>>,
    /// Distributions so far, in `q_row` order: pieces on `device`, then host rows not yet
    /// uploaded.
    q_parts: Vec<Tensor>,
    q_host: Vec<f32>,
    q_rows: usize,
    logit_rows: Vec<u32>,
}

impl<'a> ReductionGroup<'a> {
    fn new(device: &Device) -> Self {
        Self {
            device: device.clone(),
            queries: Vec::new(),
            q_parts: Vec::new(),
            q_host: Vec::new(),
            q_rows: 0,
            logit_rows: Vec::new(),
        }
    }

    /// Adds a verify row's `n + 1` positions (logit rows from `logits_start`), with the
    /// distributions of its `n` drafts if they were sampled. With `gather` the queries index
    /// the group's own gathered rows instead of the step's logits.
    fn push_row(
        &mut self,
        logits_start: usize,
        n: usize,
        q: Option<&DraftProbs>,
        v: usize,
        gather: bool,
        query: impl Fn(usize, usize, Option<usize>) -> PositionQuery<'a>,
    ) -> Result<()> {
        let q_first = self.q_rows;
        match q {
            Some(DraftProbs::Host(q)) => self.q_host.extend_from_slice(&q[..n * v]),
            Some(DraftProbs::Device(q)) => {
                self.upload_host_rows(v)?;
                self.q_parts.push(q.narrow(0, 0, n)?.to_device(&self.device)?);
            }
            None => {}
        }
        if q.is_some() {
            self.q_rows += n;
        }
        for pos in 0..=n {
            let row = if gather {
                self.logit_rows.push((logits_start + pos) as u32);
                self.logit_rows.len() - 1
            } else {
                logits_start + pos
            };
            self.queries.push(query(pos, row, (q.is_some() && pos < n).then_some(q_first + pos)));
        }
        Ok(())
    }

    /// One upload of the host rows gathered since the last device piece.
    fn upload_host_rows(&mut self, v: usize) -> Result<()> {
        if !self.q_host.is_empty() {
            let host = std::mem::take(&mut self.q_host);
            let rows = host.len() / v;
            self.q_parts.push(Tensor::from_vec(host, (rows, v), &self.device)?);
        }
        Ok(())
    }

    /// Reduces the group over `logits` (on the group's device).
    fn reduce(mut self, logits: &Tensor, v: usize) -> Result<Vec<ReducedPosition>> {
        self.upload_host_rows(v)?;
        let draft_probs = match self.q_parts.len() {
            0 => None,
            1 => self.q_parts.pop(),
            _ => Some(Tensor::cat(&self.q_parts, 0)?),
        };
        Ok(reductions::reduce(logits, &self.queries, draft_probs.as_ref())?)
    }
}

/// How a row of the step was fed.
#[derive(Debug, Clone, Copy)]
enum RowKind {
    /// Last committed token plus `width` drafts.
    Decode {
        width: usize,
    },
    Prefill {
        len: usize,
        completes: bool,
    },
}

#[derive(Debug, Clone, Copy)]
struct FedRow {
    seq: SeqId,
    kind: RowKind,
    /// Position of the first fed token.
    start: usize,
    flat_start: usize,
    /// First row of the step's logits for this row (when it has logits).
    logits_start: usize,
    /// Logit rows before `logits_start` that score the row's own prompt tokens
    /// (`prompt_logprobs`): row `k` predicts the token at `start + k + 1`.
    prompt_logit_rows: usize,
}

impl Engine {
    pub fn new(parts: EngineParts, cfg: EngineConfig) -> Result<Self> {
        let EngineParts {
            target,
            tokenizer,
            mut proposer,
            spec,
            supports_mixed_batches,
            supports_device_graph_capture,
            guest_drafter_kv_replicas,
            ..
        } = parts;
        let drafter_kv_bytes_per_token = proposer.as_ref().map_or(0, |p| p.kv_bytes_per_token());
        let model_cfg = target.config().clone();
        let vocab_size = model_cfg.vocab_size;
        let max_model_len = checked_max_model_len(cfg.max_model_len, model_cfg.max_position_embeddings)?;
        let k = proposer.as_ref().map_or(0, |p| p.num_speculative_tokens());
        let lookahead = proposer.as_ref().map_or(0, |p| p.draft_lookahead());
        let copy_width = proposer.as_ref().map_or(0, |p| p.copy_width());
        check_drafts_fit_context(&spec, k, lookahead, max_model_len)?;
        let dtype_bytes = target.dtype().size_in_bytes();
        let bytes_per_token = model_cfg.kv_bytes_per_token(dtype_bytes) + drafter_kv_bytes_per_token;
        let capture = cfg.device_graph_capture && supports_device_graph_capture;
        if cfg.device_graph_capture && !supports_device_graph_capture {
            tracing::warn!(
                "device_graph_capture has no effect: the architecture does not support device-graph capture"
            );
        }
        if capture && cfg.max_seq_len_to_capture == 0 {
            return Err(specrs_core::ConfigError::field(
                "max_seq_len_to_capture",
                "max_seq_len_to_capture must be at least 1 with device_graph_capture (e.g. 4096)",
            )
            .into());
        }
        if cfg.max_prefill_chunk == 0 {
            return Err(specrs_core::ConfigError::field(
                "max_prefill_chunk",
                "max_prefill_chunk must be at least 1 (prompt tokens a step prefills per sequence; default 512)",
            )
            .into());
        }
        // Captured steps write their padding rows' keys and values to one scratch block past
        // the planned ones, paid from the same budget, which the block manager never hands out.
        let scratch_blocks = usize::from(capture);
        let scratch_bytes = scratch_blocks as u64 * bytes_per_token * cfg.block_size as u64;
        // Room for a full-length sequence plus what a step verifies and drafts past it.
        let plan_within = |budget: u64| {
            specrs_core::kv_blocks::plan_kv_blocks(
                budget.saturating_sub(scratch_bytes),
                bytes_per_token,
                cfg.block_size,
                max_model_len + k + lookahead,
                cfg.max_num_seqs,
            )
        };
        let scratch_note = match scratch_blocks {
            0 => "",
            _ => " (the budget shown is after one block kept for device_graph_capture's padding)",
        };
        let mut plan = plan_within(cfg.kv_cache_bytes).map_err(|e| kv_plan_error(e, scratch_note))?;
        if guest_drafter_kv_replicas > 0 && drafter_kv_bytes_per_token > 0 {
            // Every other replica plans exactly what this one would with the whole budget.
            let guest_bytes = guest_drafter_kv_replicas as u64
                * (plan.num_blocks + scratch_blocks) as u64
                * cfg.block_size as u64
                * drafter_kv_bytes_per_token;
            plan = plan_within(cfg.kv_cache_bytes.saturating_sub(guest_bytes)).map_err(|e| {
                let note = format!(
                    "{scratch_note}: this device also holds the drafter KV of {guest_drafter_kv_replicas} other \
                     replica(s) under draft_head_parallelism=\"device0\" ({guest_bytes} bytes of the KV budget of \
                     {} bytes); raise the budget, lower max_num_seqs, or set draft_head_parallelism=\"replica\"",
                    cfg.kv_cache_bytes
                );
                kv_plan_error(e, &note)
            })?;
        }
        let usable_blocks = plan.num_blocks;
        let kv = target.new_kv_cache(usable_blocks + scratch_blocks, cfg.block_size)?;
        if let Some(p) = proposer.as_mut() {
            p.allocate(usable_blocks + scratch_blocks, cfg.block_size)?;
        }
        let manager = KvBlockManager::new(usable_blocks, cfg.block_size)
            .map_err(|e| kv_plan_error(e, ""))?
            .with_prefix_caching(cfg.enable_prefix_caching);
        let scheduler = Scheduler::new(
            SchedulerConfig {
                max_num_seqs: cfg.max_num_seqs,
                // Room for every row's drafts, and for the rows of a small batch copying past them
                // (`EngineWidthPolicy::copy_width`).
                max_num_batched_tokens: cfg
                    .max_num_batched_tokens
                    .max(cfg.max_num_seqs * (k + 1))
                    .max(cfg.max_num_seqs.min(PARTIAL_PROBE_MIN_BATCH - 1) * (copy_width + 1)),
                max_prefill_chunk: cfg.max_prefill_chunk,
                watermark_blocks: (plan.num_blocks / 100).max(1),
            },
            manager,
        );
        let width = crate::pipeline::width_policy(
            &spec,
            k,
            copy_width,
            cfg.max_num_seqs,
            cfg.enable_spec_decode_mixed_batches && supports_mixed_batches,
        )?;
        let acceptance = AcceptanceSampler::new(&spec, k.max(1), vocab_size, tokenizer.thinking_token_ids())?;
        if proposer.is_some() {
            tracing::info!("{}", acceptance.describe());
        }
        let taps = proposer.as_ref().map(|p| p.tap_request()).unwrap_or_default();
        let fixed_steps = if capture {
            let plan_keys = CapturePlan::new(true, cfg.max_num_seqs, width_source(&width));
            let max_keys = (max_model_len + k + lookahead).min(cfg.max_seq_len_to_capture);
            let scratch_slot = (usable_blocks * cfg.block_size) as u32;
            let outputs = StepOutputs { taps: taps.taps.clone(), want_final_hidden: taps.final_hidden };
            let started = Instant::now();
            let steps = FixedSteps::new(&target, &kv, plan_keys, max_keys, scratch_slot, outputs, true)?;
            tracing::info!(
                "{} {} decode step shapes (batch, width) up to {} keys per row in {:.1} s",
                if steps.is_captured() { "Captured" } else { "Built (eager, no device graphs on this device)" },
                steps.plan().keys().count(),
                max_keys,
                started.elapsed().as_secs_f64()
            );
            Some(steps)
        } else {
            None
        };
        let metrics = Arc::new(EngineMetrics::default());
        metrics.kv_total_blocks.store(usable_blocks, std::sync::atomic::Ordering::Relaxed);
        metrics.kv_free_blocks.store(usable_blocks, std::sync::atomic::Ordering::Relaxed);
        Ok(Self {
            target,
            kv,
            tokenizer,
            proposer,
            taps,
            acceptance,
            width,
            scheduler,
            seqs: HashMap::new(),
            metrics,
            published_gauges: Cell::new([0, 0, usable_blocks]),
            spec,
            cfg,
            max_model_len,
            vocab_size,
            next_seed: 0x5EED_0000,
            window: SpecDecodeStats::new(),
            last_log: Instant::now(),
            next_step_draft_time: Some(Duration::ZERO),
            next_step_catch_up: Duration::ZERO,
            finishing: Vec::new(),
            fixed_steps,
            draft_probs_device: None,
            guides: None,
        })
    }

    pub fn metrics(&self) -> Arc<EngineMetrics> {
        self.metrics.clone()
    }

    fn guide_cache(&mut self) -> &mut GuideCache {
        let tokenizer = &self.tokenizer;
        self.guides.get_or_insert_with(|| GuideCache::new(Arc::new(guide_vocabulary(tokenizer)), GUIDE_CACHE_CAPACITY))
    }

    /// Publishes into `metrics` from now on, shared with other engines (data-parallel
    /// replicas): its gauges become the sum over the engines. Call it before the engine
    /// serves anything; counters recorded until then stay behind.
    pub fn with_shared_metrics(mut self, metrics: Arc<EngineMetrics>) -> Self {
        use std::sync::atomic::Ordering::Relaxed;
        metrics.kv_total_blocks.fetch_add(self.metrics.kv_total_blocks.load(Relaxed), Relaxed);
        let [running, waiting, free] = self.published_gauges.get();
        metrics.num_running.fetch_add(running, Relaxed);
        metrics.num_waiting.fetch_add(waiting, Relaxed);
        metrics.kv_free_blocks.fetch_add(free, Relaxed);
        self.metrics = metrics;
        self
    }

    /// Keeps this engine's sampled-draft distributions on `device` (the first replica's, under
    /// `draft_probs_layout="device0"`): rows verified from device reductions gather their
    /// logit rows there and the rejection numbers are computed next to the distributions.
    pub fn with_draft_probs_on(mut self, device: candle_core::Device) -> Self {
        self.draft_probs_device = Some(device);
        self
    }

    pub fn tokenizer(&self) -> &Arc<TextTokenizer> {
        &self.tokenizer
    }

    pub fn target(&self) -> &CausalLm {
        &self.target
    }

    pub fn spec(&self) -> &SpeculativeConfig {
        &self.spec
    }

    pub fn max_num_seqs(&self) -> usize {
        self.cfg.max_num_seqs
    }

    /// Whether finished prompts' KV stays cached for later requests that share their start.
    pub fn caches_prefixes(&self) -> bool {
        self.cfg.enable_prefix_caching
    }

    pub fn max_model_len(&self) -> usize {
        self.max_model_len
    }

    pub fn num_free_blocks(&self) -> usize {
        self.scheduler.kv().num_free_blocks()
    }

    pub fn num_total_blocks(&self) -> usize {
        self.scheduler.kv().num_total_blocks()
    }

    pub fn has_work(&self) -> bool {
        self.scheduler.has_work()
    }

    pub fn num_requests(&self) -> usize {
        self.seqs.len()
    }

    /// Tokenizes and validates a request; on success it is queued. A request with `n` choices
    /// runs as `n` sequences with ids `id..id + n` (the caller keeps them free: the handle
    /// reserves them); their outputs carry `id` and a choice index, and [`Self::abort`] of
    /// `id` cancels them all. Errors describe what the client must change.
    pub fn add_request(&mut self, id: SeqId, request: GenerationRequest, sink: OutputSink) -> Result<()> {
        let GenerationRequest { prompt, mut params, trace } = request;
        // The handle tokenizes them before the request reaches this thread; an engine driven
        // directly tokenizes them here.
        if !params.bad_words.is_empty() && params.bad_word_ids.is_empty() {
            params.bad_word_ids = specrs_core::sampling::bad_word_token_ids(&params.bad_words, |word| {
                self.tokenizer.encode(word, false)
            })?;
        }
        params.validate(self.vocab_size)?;
        if let Some(constraint) = &params.structured_outputs {
            if self.acceptance.rule() == specrs_core::AcceptanceRule::Synthetic {
                return Err(specrs_core::ConfigError::field(
                    "structured_outputs",
                    "structured outputs need the target's logits, which synthetic acceptance (a benchmarking mode) \
                     ignores; drop synthetic_acceptance_rate",
                )
                .into());
            }
            // The handle compiles it before the request reaches this thread; an engine driven
            // directly compiles it here.
            if params.guide.is_none() {
                params.guide = Some(self.guide_cache().get(constraint)?);
            }
        }
        let n = params.n;
        if n > self.max_num_seqs() {
            return Err(EngineError::Request(format!(
                "n = {n} choices exceed max_num_seqs = {}, the most sequences this engine runs at once; \
                 lower n or raise max_num_seqs",
                self.max_num_seqs()
            )));
        }
        let ids = id..id
            .checked_add(n as SeqId)
            .ok_or_else(|| EngineError::Request(format!("request id {id} leaves no room for its {n} choices")))?;
        if let Some(taken) = ids.clone().find(|i| self.seqs.contains_key(i)) {
            return Err(EngineError::Request(format!("request id {taken} is already running")));
        }
        if self.proposer.is_some() && params.has_penalties() && !self.spec.logit_penalties {
            return Err(EngineError::Request(
                "repetition/frequency/presence penalties under speculative decoding need logit_penalties=True \
                 in the speculative config (they are applied at every draft position)"
                    .into(),
            ));
        }
        let mut tokens = match prompt {
            Prompt::Tokens(t) => t,
            Prompt::Text(text) => self.tokenizer.encode(&text, true)?,
            Prompt::Chat(conversation) => {
                let text = self.tokenizer.render_conversation(&conversation)?;
                self.tokenizer.encode_chat(&text)?
            }
        };
        if let Some(keep) = params.truncate_prompt_tokens
            && tokens.len() > keep
        {
            // Left truncation, as vLLM's `truncate_prompt_tokens`: the latest tokens stay.
            tokens.drain(..tokens.len() - keep);
        }
        if tokens.is_empty() {
            return Err(EngineError::Request("the prompt is empty".into()));
        }
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= self.vocab_size) {
            return Err(EngineError::Request(format!(
                "prompt token id {bad} is outside the vocabulary of {} tokens",
                self.vocab_size
            )));
        }
        if tokens.len() >= self.max_model_len {
            return Err(EngineError::Request(format!(
                "the prompt has {} tokens but the model's context holds {}; shorten the prompt",
                tokens.len(),
                self.max_model_len
            )));
        }
        let room = self.max_model_len - tokens.len();
        if params.max_tokens_must_fit
            && let Some(max_tokens) = params.max_tokens.filter(|&m| m > room)
        {
            return Err(EngineError::Request(format!(
                "max_tokens is {max_tokens}, but the model's context holds {} tokens and the prompt takes {}, \
                 leaving {room}; lower max_tokens (or leave it unset to run to the end of the context)",
                self.max_model_len,
                tokens.len()
            )));
        }
        let max_tokens = params.max_tokens.map_or(room, |m| m.min(room));
        if max_tokens == 0 {
            return Err(EngineError::Request("max_tokens must be at least 1".into()));
        }
        self.check_first_token_allowed(&params, &tokens)?;
        let arrival = Instant::now();
        for (index, seq_id) in ids.enumerate() {
            let params = params.for_choice(index);
            let seed = params.seed.unwrap_or_else(|| {
                self.next_seed = self.next_seed.wrapping_mul(6364136223846793005).wrapping_add(seq_id | 1);
                self.next_seed
            });
            let prompt_len = tokens.len();
            self.metrics.prompt_tokens.fetch_add(prompt_len as u64, std::sync::atomic::Ordering::Relaxed);
            let mut block_hasher = BlockHasher::default();
            if self.cfg.enable_prefix_caching {
                let hashes = block_hasher.update(&tokens, self.cfg.block_size).to_vec();
                // Prompt logprobs score every prompt position: such a sequence computes them all.
                let reuse = params.prompt_logprobs.is_none();
                self.scheduler.add_with_prefix(seq_id, prompt_len, hashes, reuse);
            } else {
                self.scheduler.add(seq_id, prompt_len);
            }
            let output = OutputState::new(&params, self.tokenizer.eos_token_ids(), max_tokens);
            self.seqs.insert(
                seq_id,
                Sequence {
                    id: seq_id,
                    request_id: id,
                    index,
                    tokens: tokens.clone(),
                    prompt_len,
                    params,
                    seed,
                    output,
                    drafts: Vec::new(),
                    draft_probs: None,
                    in_thinking: false,
                    stats: SpecDecodeStats::new(),
                    trace: trace.then(Vec::new),
                    pending_logprobs: Vec::new(),
                    pending_prompt_logprobs: Vec::new(),
                    prompt_scored: 0,
                    sink: sink.clone(),
                    arrival,
                    first_token: None,
                    unsent_from: 0,
                    prompt_sent: false,
                    block_hasher,
                    num_cached_tokens: None,
                },
            );
        }
        self.update_gauges();
        Ok(())
    }

    /// Refuses a request whose own masks leave no token to generate first (e.g. only EOS
    /// allowed under `min_tokens`, every allowed token a bad word, allowed tokens the
    /// structured-output constraint cannot start with); later dead ends end the request when
    /// verification reaches them.
    fn check_first_token_allowed(&self, params: &SamplingParams, prompt: &[u32]) -> Result<()> {
        if !params.masks_tokens() {
            return Ok(());
        }
        let holds_back_stops = params.min_tokens > 0;
        let held_back = if holds_back_stops { self.stop_ids_of(params) } else { Vec::new() };
        if specrs_core::sampling::first_token_allowed(params, prompt, self.vocab_size, &held_back) {
            return Ok(());
        }
        let fields = params.masking_fields(holds_back_stops);
        Err(specrs_core::ConfigError::field(
            fields.first().copied().unwrap_or("allowed_token_ids"),
            format!(
                "this request's {} leave no token of the vocabulary to generate first, so nothing could be \
                 generated; loosen one of them",
                list_fields(&fields)
            ),
        )
        .into())
    }

    /// Cancels a request (every choice of it): its outputs stop and its KV blocks return to
    /// the pool at once.
    pub fn abort(&mut self, id: SeqId) -> bool {
        let choices: Vec<SeqId> = self.seqs.values().filter(|s| s.request_id == id).map(|s| s.id).collect();
        for &choice in &choices {
            self.finish(choice, FinishReason::Abort, None);
        }
        !choices.is_empty()
    }

    /// Aborts every request (shutdown).
    pub fn abort_all(&mut self) {
        let ids: Vec<SeqId> = self.seqs.keys().copied().collect();
        for id in ids {
            self.finish(id, FinishReason::Abort, None);
        }
    }

    /// Ends every request with `FinishReason::Error` and `message`: a step failed in a way
    /// the engine cannot attribute to single rows, and the clients must learn why.
    pub fn fail_all(&mut self, message: &str) {
        self.finishing.clear();
        let ids: Vec<SeqId> = self.seqs.keys().copied().collect();
        for id in ids {
            self.finish(id, FinishReason::Error, Some(RequestFailure::engine(message)));
        }
    }

    fn forget(&mut self, id: SeqId, reason: FinishReason, seq: &Sequence) {
        // What it computed stays for later sequences with the same prefix.
        self.cache_final_blocks(id);
        self.scheduler.remove(id);
        if let Some(p) = self.proposer.as_mut() {
            p.release(id);
        }
        self.metrics.record_finished(
            reason,
            seq.first_token.map(|t| t.duration_since(seq.arrival).as_secs_f64()),
            seq.arrival.elapsed().as_secs_f64(),
        );
        self.update_gauges();
    }

    /// Ends one sequence (one choice) with `reason` and sends its last output.
    fn finish(&mut self, id: SeqId, reason: FinishReason, error: Option<RequestFailure>) {
        if let Some(mut seq) = self.seqs.remove(&id) {
            let last_choice = !self.seqs.values().any(|s| s.request_id == seq.request_id);
            // Counted before the last output goes out: a client that reads /metrics right
            // after its response must find its request there.
            self.forget(id, reason, &seq);
            seq.send(Some(reason), error, last_choice);
        }
    }

    /// Caches the full blocks of `id` whose keys and values are final in the target's KV and
    /// the drafter's (a drafter may not have fed every committed position yet).
    fn cache_final_blocks(&mut self, id: SeqId) {
        let computed = self.scheduler.num_computed(id);
        let final_len = self.proposer.as_ref().map_or(computed, |p| p.kv_final_len(id, computed));
        self.scheduler.cache_blocks(id, final_len);
    }

    /// Forgets every cached prefix (vLLM's `reset_prefix_cache`), e.g. after swapping weights
    /// or to measure without reuse. Returns how many blocks were cached.
    pub fn reset_prefix_cache(&mut self) -> usize {
        let cached = self.scheduler.reset_prefix_cache();
        self.update_gauges();
        cached
    }

    /// Forgets the outputs of finished requests that suffix decoding drafts from (its shared
    /// tree), e.g. to measure first-time requests after repeated ones; running requests keep
    /// theirs. Returns how many outputs went (0 without suffix decoding).
    pub fn reset_suffix_cache(&mut self) -> usize {
        self.proposer.as_mut().map_or(0, |p| p.forget_cached_outputs())
    }

    /// Blocks holding cached prefixes (in use or parked).
    pub fn num_cached_blocks(&self) -> usize {
        self.scheduler.kv().num_cached_blocks()
    }

    fn update_gauges(&self) {
        use std::sync::atomic::Ordering::Relaxed;
        let now = [self.scheduler.num_running(), self.scheduler.num_waiting(), self.scheduler.kv().num_free_blocks()];
        let gauges = [&self.metrics.num_running, &self.metrics.num_waiting, &self.metrics.kv_free_blocks];
        for ((gauge, was), is) in gauges.into_iter().zip(self.published_gauges.get()).zip(now) {
            if is >= was {
                gauge.fetch_add(is - was, Relaxed);
            } else {
                gauge.fetch_sub(was - is, Relaxed);
            }
        }
        self.published_gauges.set(now);
    }

    /// Token ids that end a request: EOS (unless ignored) and its stop ids.
    fn stop_ids_of(&self, params: &SamplingParams) -> Vec<u32> {
        let mut ids = params.stop_token_ids.clone();
        if !params.ignore_eos {
            ids.extend_from_slice(self.tokenizer.eos_token_ids());
        }
        ids.retain(|&t| (t as usize) < self.vocab_size);
        ids
    }

    /// Cancels requests whose client went away (closed output stream).
    fn reap_disconnected(&mut self) {
        let gone: Vec<SeqId> = self.seqs.values().filter(|s| s.sink.is_closed()).map(|s| s.id).collect();
        for id in gone {
            self.finish(id, FinishReason::Abort, None);
        }
    }

    /// Runs one step. Returns the number of rows it ran.
    ///
    /// The step runs on a worker of the compute pool (see `specrs_models::compute`), so its
    /// serial stretches do not compete with idle workers for the cores.
    pub fn step(&mut self) -> Result<usize> {
        specrs_models::on_compute_pool(|| self.step_here())
    }

    fn step_here(&mut self) -> Result<usize> {
        let started = Instant::now();
        self.reap_disconnected();
        let plan = self.scheduler.schedule(&mut self.width);
        for (id, err) in &plan.rejected {
            self.finish(
                *id,
                FinishReason::Error,
                Some(RequestFailure::request(format!(
                    "the request needs more KV cache than the whole pool holds: {err}"
                ))),
            );
        }
        for &id in &plan.preempted {
            self.metrics.num_preemptions.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if let Some(seq) = self.seqs.get_mut(&id) {
                seq.drafts.clear();
                seq.draft_probs = None;
            }
            if let Some(p) = self.proposer.as_mut() {
                p.release(id);
            }
        }
        self.record_admissions(&plan);
        if plan.is_empty() {
            self.update_gauges();
            return Ok(0);
        }
        let (batch, rows) = self.build_batch(&plan)?;
        let target_started = Instant::now();
        let forward = match self.run_target(&plan, &batch) {
            Ok(f) => f,
            Err(e) => {
                // A failed forward fails the rows it ran; the engine keeps serving others.
                let msg = format!("target forward failed: {e}");
                tracing::error!("{msg}");
                for r in &rows {
                    self.finish(r.seq, FinishReason::Error, Some(RequestFailure::engine(msg.clone())));
                }
                return Ok(0);
            }
        };
        let target_time = target_started.elapsed();
        let step_stats = self.accept_and_commit(&rows, &forward)?;
        // A step's cost is its own forward plus the drafting done for it at the end of the
        // step before. It is recorded before drafting for the next step, which plans that
        // step's width from the choice this step may change.
        let forward_time = started.elapsed();
        let charged = self.next_step_draft_time.take().map(|d| forward_time + d);
        tracing::debug!(
            rows = rows.len(),
            tokens = batch.num_tokens(),
            decode_rows = plan.decode.len(),
            mixed = plan.mixed,
            width = plan.verify_width,
            forward_ms = forward_time.as_secs_f64() * 1e3,
            target_ms = target_time.as_secs_f64() * 1e3,
            charged_ms = charged.map(|t| t.as_secs_f64() * 1e3),
            "step"
        );
        self.record_step(&plan, &step_stats, charged);
        let proposing = Instant::now();
        let proposed = self.propose(&rows, &forward);
        // Sequences that finished this step end now, whether or not drafting succeeded.
        for (id, reason) in std::mem::take(&mut self.finishing) {
            self.finish(id, reason, None);
        }
        proposed?;
        for r in &rows {
            if self.seqs.contains_key(&r.seq) {
                self.cache_final_blocks(r.seq);
            }
        }
        // Drafting at the end of a step with prefill rows fed whole prompts to the drafter: the
        // next step is left untimed rather than charged for it.
        let drafted = self.draft_time_since(proposing);
        self.next_step_draft_time = plan.prefill.is_empty().then_some(drafted);
        self.update_gauges();
        Ok(rows.len())
    }

    /// Counts each admitted sequence's prompt tokens and how many a cached prefix covered.
    fn record_admissions(&mut self, plan: &StepPlan) {
        use std::sync::atomic::Ordering::Relaxed;
        for &(id, cached) in &plan.admitted {
            let Some(seq) = self.seqs.get_mut(&id) else { continue };
            seq.num_cached_tokens.get_or_insert(cached);
            self.metrics.prefix_cache_queries.fetch_add(seq.tokens.len() as u64, Relaxed);
            self.metrics.prefix_cache_hits.fetch_add(cached as u64, Relaxed);
        }
    }

    /// The step's target forward: on a captured shape when `device_graph_capture` holds one
    /// for this pure decode step, else the ragged forward.
    fn run_target(&self, plan: &StepPlan, batch: &ForwardBatch) -> candle_core::Result<ForwardOutput> {
        if let Some(steps) = &self.fixed_steps
            && plan.prefill.is_empty()
        {
            // Rows that copied lookup drafts past the planned width need a wider shape.
            let width = batch.rows.iter().map(|r| r.query_len).max().unwrap_or(1).saturating_sub(1);
            match steps.run(&self.target, &self.kv, batch, width)? {
                Ok((_, out)) => {
                    self.metrics.captured_steps.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    return Ok(out);
                }
                Err(why) => tracing::debug!(rows = batch.rows.len(), width, ?why, "step runs eagerly"),
            }
        }
        self.target.forward(batch, &self.kv)
    }

    fn build_batch(&self, plan: &StepPlan) -> Result<(ForwardBatch, Vec<FedRow>)> {
        let kv = self.scheduler.kv();
        let mut batch = ForwardBatch {
            block_size: kv.block_size(),
            taps: self.taps.taps.clone(),
            want_final_hidden: self.taps.final_hidden,
            // Named here too so a captured step's inputs carry it (`StepInputs::fill`).
            sliding_window: self.target.config().uniform_sliding_window(),
            ..Default::default()
        };
        let mut rows = Vec::with_capacity(plan.decode.len() + plan.prefill.len());
        let mut push_row = |batch: &mut ForwardBatch,
                            seq: SeqId,
                            tokens: &[u32],
                            start: usize,
                            kind: RowKind,
                            logits: usize,
                            prompt_logit_rows: usize|
         -> Result<()> {
            let flat_start = batch.input_ids.len();
            let logits_start = batch.logits_indices.len() + prompt_logit_rows;
            let logits = logits + prompt_logit_rows;
            batch.input_ids.extend_from_slice(tokens);
            batch.positions.extend((start..start + tokens.len()).map(|p| p as u32));
            batch.slot_mapping.extend(kv.slots(seq, start..start + tokens.len())?);
            let table = kv.block_table(seq);
            batch.rows.push(BatchRow {
                query_start: flat_start,
                query_len: tokens.len(),
                context_len: start + tokens.len(),
                block_table_start: batch.block_tables.len(),
                block_table_len: table.len(),
            });
            batch.block_tables.extend_from_slice(table);
            let first_logit = flat_start + tokens.len() - logits;
            batch.logits_indices.extend((first_logit..flat_start + tokens.len()).map(|i| i as u32));
            rows.push(FedRow { seq, kind, start, flat_start, logits_start, prompt_logit_rows });
            Ok(())
        };
        for &id in &plan.decode {
            let seq = &self.seqs[&id];
            let start = seq.tokens.len() - 1;
            // Never verify more drafts than the row could commit.
            let room = seq.output.remaining().saturating_sub(1).min(self.max_model_len - seq.tokens.len());
            let width = plan.verify_width.min(seq.drafts.len()).min(room);
            let mut fed = Vec::with_capacity(width + 1);
            fed.push(seq.tokens[start]);
            fed.extend_from_slice(&seq.drafts[..width]);
            push_row(&mut batch, id, &fed, start, RowKind::Decode { width }, width + 1, 0)?;
        }
        for chunk in &plan.prefill {
            let seq = &self.seqs[&chunk.seq];
            let tokens = &seq.tokens[chunk.start..chunk.start + chunk.len];
            let kind = RowKind::Prefill { len: chunk.len, completes: chunk.completes };
            let sampled = usize::from(chunk.completes);
            // Every fed position whose next token is a prompt token not yet scored scores it
            // (a recompute after preemption feeds the prompt again, and the output after it).
            let scored = if seq.params.prompt_logprobs.is_some() && seq.prompt_scored < seq.prompt_len {
                (chunk.len - sampled).min(seq.prompt_len.saturating_sub(chunk.start + 1))
            } else {
                0
            };
            push_row(&mut batch, chunk.seq, tokens, chunk.start, kind, sampled, scored)?;
        }
        Ok((batch, rows))
    }

    fn accept_and_commit(&mut self, rows: &[FedRow], forward: &ForwardOutput) -> Result<SpecDecodeStats> {
        let mut step_stats = SpecDecodeStats::new();
        let Some(logits) = &forward.logits else {
            // Only non-final prefill chunks ran: record their progress.
            for r in rows {
                if let RowKind::Prefill { len, .. } = r.kind {
                    let n = self.seqs[&r.seq].tokens.len();
                    self.scheduler.commit(r.seq, n, r.start + len)?;
                }
            }
            return Ok(step_stats);
        };
        self.score_prompts(rows, logits)?;
        let on_device = self.cfg.acceptance_on_device.unwrap_or(!logits.device().is_cpu());
        let Verified { outputs, extras } = if !on_device {
            let starts: Vec<Option<usize>> = rows.iter().map(|r| Some(r.logits_start)).collect();
            with_f32_slice(logits, |all| self.verify(rows, all, &starts, &[]))??
        } else {
            self.verify_on_device(rows, logits)?
        };

        for ((r, out), (logprobs, trace)) in rows.iter().zip(outputs).zip(extras) {
            let Some(out) = out else {
                if let RowKind::Prefill { len, .. } = r.kind {
                    let n = self.seqs[&r.seq].tokens.len();
                    self.scheduler.commit(r.seq, n, r.start + len)?;
                }
                continue;
            };
            let tokenizer = self.tokenizer.clone();
            let seq = self.seqs.get_mut(&r.seq).expect("scheduled sequences are known");
            let (num_computed, width) = match r.kind {
                RowKind::Decode { width } => (r.start + 1 + out.num_accepted, width),
                RowKind::Prefill { len, .. } => (r.start + len, 0),
            };
            if width > 0 {
                seq.stats.record_row_with_relaxed(width, out.num_accepted, out.num_relaxed_accepted);
                step_stats.record_row_with_relaxed(width, out.num_accepted, out.num_relaxed_accepted);
            }
            let outcome = seq.output.commit(&tokenizer, &out.tokens)?;
            let kept = &out.tokens[..outcome.kept];
            seq.tokens.extend_from_slice(kept);
            if self.cfg.enable_prefix_caching {
                let new_keys = seq.block_hasher.update(&seq.tokens, self.cfg.block_size);
                self.scheduler.extend_block_hashes(r.seq, new_keys);
            }
            seq.in_thinking = out.in_thinking_after;
            seq.drafts.clear();
            seq.draft_probs = None;
            if seq.first_token.is_none() && !kept.is_empty() {
                seq.first_token = Some(Instant::now());
            }
            seq.pending_logprobs.extend(logprobs.into_iter().take(outcome.kept));
            if let (Some(t), Some(traces)) = (trace, seq.trace.as_mut()) {
                traces.push(t);
            }
            self.metrics.generation_tokens.fetch_add(outcome.kept as u64, std::sync::atomic::Ordering::Relaxed);
            let finish =
                outcome.finish.or_else(|| (seq.tokens.len() >= self.max_model_len).then_some(FinishReason::Length));
            let (n_tokens, id) = (seq.tokens.len(), seq.id);
            if out.dead_end && finish.is_none() {
                // The request's masks leave nothing after the drafts just committed, which did
                // not finish it: it ends here, with them, as plain decoding would.
                let failure = RequestFailure::request(Self::nothing_allowed_message(seq));
                self.finish(id, FinishReason::Error, Some(failure));
                continue;
            }
            match finish {
                Some(reason) if self.cfg.enable_prefix_caching => {
                    // The step's keys and values are final for the target: record them so the
                    // prefix cache keeps them, e.g. for the conversation's next turn. A drafter
                    // feeds them first (see `Self::propose`); the sequence finishes after that.
                    self.scheduler.commit(id, n_tokens, num_computed.min(n_tokens - 1))?;
                    match self.proposer {
                        Some(_) => self.finishing.push((id, reason)),
                        None => self.finish(id, reason, None),
                    }
                }
                Some(reason) => self.finish(id, reason, None),
                None => {
                    self.scheduler.commit(id, n_tokens, num_computed.min(n_tokens - 1))?;
                    let seq = self.seqs.get_mut(&id).expect("still running");
                    if !seq.send(None, None, false) {
                        // The client went away: free everything now.
                        self.finish(id, FinishReason::Abort, None);
                    }
                }
            }
        }
        Ok(step_stats)
    }

    /// Why a request whose masks leave no token after its committed output ends: the fields
    /// that masked, and where in the output.
    fn nothing_allowed_message(seq: &Sequence) -> String {
        let index = seq.num_generated();
        let fields = seq.params.masking_fields(index < seq.params.min_tokens);
        format!(
            "no token may be generated at output token {index}: this request's {} leave no token of the \
             vocabulary there; loosen one of them",
            list_fields(&fields)
        )
    }

    /// How many drafts a row verifies this step (`Some(0)` for a completing prefill chunk),
    /// or `None` when it has no logits (a prefill chunk that does not complete).
    fn verified_drafts(r: &FedRow) -> Option<usize> {
        match r.kind {
            RowKind::Decode { width } => Some(width),
            RowKind::Prefill { completes: true, .. } => Some(0),
            RowKind::Prefill { completes: false, .. } => None,
        }
    }

    /// `prompt_logprobs`: each prefill row's scoring rows give the logprob (and top-n) of the
    /// prompt token they predict; a prompt's first token, which nothing predicts, gets `None`.
    /// Only these rows cross to the host, and only for requests that ask.
    fn score_prompts(&mut self, rows: &[FedRow], logits: &Tensor) -> Result<()> {
        let v = self.vocab_size;
        for r in rows.iter().filter(|r| matches!(r.kind, RowKind::Prefill { .. })) {
            let seq = self.seqs.get_mut(&r.seq).expect("scheduled sequences are known");
            let Some(top) = seq.params.prompt_logprobs else { continue };
            if r.start == 0 && seq.prompt_scored == 0 {
                seq.pending_prompt_logprobs.push(None);
                seq.prompt_scored = 1;
            }
            if r.prompt_logit_rows == 0 {
                continue;
            }
            let first = r.logits_start - r.prompt_logit_rows;
            let scores: Vec<f32> = logits
                .narrow(0, first, r.prompt_logit_rows)?
                .to_dtype(candle_core::DType::F32)?
                .flatten_all()?
                .to_vec1()?;
            for (k, row) in scores.chunks_exact(v).enumerate() {
                // Positions a recompute feeds again were scored the first time.
                let at = r.start + k + 1;
                if at != seq.prompt_scored {
                    continue;
                }
                let token = seq.tokens[at];
                let (logprob, top) = logprobs_of(row, token, top);
                let rank = rank_of(row, token);
                seq.pending_prompt_logprobs.push(Some(TokenLogprob { token, logprob, rank, top }));
                seq.prompt_scored += 1;
            }
        }
        Ok(())
    }

    /// Whether a row reads its logit rows themselves rather than device reductions: penalties,
    /// `min_tokens` masking and logprobs need the values. (Sampled drafts do not: their
    /// distributions go to the device instead, for the reductions' rejection numbers.)
    fn needs_host_logits(&self, seq: &Sequence) -> bool {
        self.acceptance.reductions_for(&seq.params).is_none()
            || seq.num_generated() < seq.params.min_tokens
            || seq.params.logprobs.is_some()
    }

    /// Verification where the logits live off the host: rows that need their logits get a
    /// copy of just their rows; every other row is verified from `[positions]`-sized device
    /// reductions (`specrs_models::reductions`), never copying `V`-wide rows to the host.
    fn verify_on_device(&self, rows: &[FedRow], logits: &Tensor) -> Result<Verified> {
        let v = self.vocab_size;
        let mut host_rows: Vec<u32> = Vec::new();
        let mut starts: Vec<Option<usize>> = vec![None; rows.len()];
        // Rows with sampled drafts go where their distributions live: beside the logits
        // (`draft_probs_layout="replica"`, or the first replica), or on the first device.
        let mut beside_logits = ReductionGroup::new(logits.device());
        let mut on_probs_device = ReductionGroup::new(self.draft_probs_device.as_ref().unwrap_or(logits.device()));
        // Per reduced row: (row of the step, whether on the probs device, its first query).
        let mut query_rows: Vec<(usize, bool, usize)> = Vec::new();
        for (i, r) in rows.iter().enumerate() {
            let Some(n) = Self::verified_drafts(r) else { continue };
            let seq = &self.seqs[&r.seq];
            if self.needs_host_logits(seq) {
                starts[i] = Some(host_rows.len());
                host_rows.extend((r.logits_start..=r.logits_start + n).map(|x| x as u32));
                continue;
            }
            let wants = self.acceptance.reductions_for(&seq.params).expect("checked by needs_host_logits");
            let q = seq.draft_probs.as_ref().filter(|_| n > 0);
            let moved = q.is_some() && self.draft_probs_device.is_some();
            let group = if moved { &mut on_probs_device } else { &mut beside_logits };
            query_rows.push((i, moved, group.queries.len()));
            group.push_row(r.logits_start, n, q, v, moved, |pos, row, q_row| PositionQuery {
                row,
                params: &seq.params,
                seed: seq.step_seed(),
                index: pos,
                draft: seq.drafts.get(pos).copied().filter(|_| pos < n),
                q_row,
                wants,
            })?;
        }
        let host: Vec<f32> = if host_rows.is_empty() {
            Vec::new()
        } else {
            let idx = Tensor::from_vec(host_rows.clone(), host_rows.len(), logits.device())?;
            logits.index_select(&idx, 0)?.flatten_all()?.to_vec1::<f32>()?
        };
        debug_assert_eq!(host.len(), host_rows.len() * v);
        let reduced_beside = beside_logits.reduce(logits, v)?;
        let reduced_moved = match &self.draft_probs_device {
            Some(device) if !on_probs_device.queries.is_empty() => {
                // `draft_probs_layout="device0"`: the distributions stay on the first device
                // and these rows' logits go there ([positions, V], device to device).
                let idx = Tensor::from_vec(
                    on_probs_device.logit_rows.clone(),
                    on_probs_device.logit_rows.len(),
                    logits.device(),
                )?;
                let gathered = logits.index_select(&idx, 0)?.to_device(device)?;
                self.metrics
                    .draft_probs_device0_positions
                    .fetch_add(on_probs_device.queries.len() as u64, std::sync::atomic::Ordering::Relaxed);
                on_probs_device.reduce(&gathered, v)?
            }
            _ => Vec::new(),
        };
        let mut reduced: Vec<Option<Vec<ReducedPosition>>> = vec![None; rows.len()];
        for &(i, moved, first) in &query_rows {
            let n = Self::verified_drafts(&rows[i]).expect("a reduced row has logits");
            let all = if moved { &reduced_moved } else { &reduced_beside };
            reduced[i] = Some(all[first..=first + n].to_vec());
        }
        self.verify(rows, &host, &starts, &reduced)
    }

    /// Verifies every row with logits: from host logit rows (`all`, the rows of row `i`
    /// starting at row `starts[i]`) or from device reductions (`reduced[i]`). Returns each
    /// row's output with its logprobs and trace.
    fn verify(
        &self,
        rows: &[FedRow],
        all: &[f32],
        starts: &[Option<usize>],
        reduced: &[Option<Vec<ReducedPosition>>],
    ) -> Result<Verified> {
        // `reduced` is empty when every row has host logits.
        let v = self.vocab_size;
        let host_logits = |i: usize, n: usize| starts[i].map(|s| &all[s * v..(s + n + 1) * v]);
        // Rows still under `min_tokens` must not end: their stop tokens are masked at the
        // positions that would emit one too early (a copy of just those rows' logits).
        let masked: Vec<Option<Vec<f32>>> = rows
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let seq = &self.seqs[&r.seq];
                let n = Self::verified_drafts(r)?;
                let generated = seq.num_generated();
                if generated >= seq.params.min_tokens {
                    return None;
                }
                let mut copy = host_logits(i, n)?.to_vec();
                let stops: Vec<u32> = self.stop_ids_of(&seq.params);
                for pos in 0..=n {
                    if generated + pos < seq.params.min_tokens {
                        for &t in &stops {
                            copy[pos * v + t as usize] = f32::NEG_INFINITY;
                        }
                    }
                }
                Some(copy)
            })
            .collect();
        // Sampled drafts' distributions of the rows verified on host logits: as drawn on the
        // host, or copied from the drafter's device.
        let mut host_q: Vec<Option<std::borrow::Cow<'_, [f32]>>> = vec![None; rows.len()];
        for (i, r) in rows.iter().enumerate() {
            if let (Some(n), Some(_)) = (Self::verified_drafts(r), starts[i])
                && let Some(q) = &self.seqs[&r.seq].draft_probs
            {
                host_q[i] = Some(q.host_rows(n, v)?);
            }
        }
        let verify_rows: Vec<(usize, VerifyRow<'_>)> = rows
            .iter()
            .enumerate()
            .filter_map(|(i, r)| {
                let seq = &self.seqs[&r.seq];
                let n = Self::verified_drafts(r)?;
                let row_logits = match &masked[i] {
                    Some(copy) => copy.as_slice(),
                    None => host_logits(i, n)?,
                };
                let mut row = VerifyRow::new(&seq.drafts[..n], row_logits, &seq.params, seq.step_seed())
                    .with_history(&seq.tokens, seq.prompt_len)
                    .with_thinking(seq.in_thinking);
                if let Some(q) = &host_q[i] {
                    row = row.with_draft_probs(q);
                }
                Some((i, row))
            })
            .collect();
        let accepted = self.acceptance.accept_batch(&verify_rows.iter().map(|(_, r)| *r).collect::<Vec<_>>());
        let mut outputs: Vec<Option<VerifyOutput>> = vec![None; rows.len()];
        for ((i, _), result) in verify_rows.into_iter().zip(accepted) {
            outputs[i] = Some(result.map_err(|e| EngineError::Internal(format!("verifying row {i}: {e}")))?);
        }
        for (i, r) in rows.iter().enumerate() {
            let (Some(positions), Some(n)) = (reduced.get(i).and_then(Option::as_ref), Self::verified_drafts(r)) else {
                continue;
            };
            let seq = &self.seqs[&r.seq];
            let row = ReducedRow {
                drafts: &seq.drafts[..n],
                positions,
                params: &seq.params,
                seed: seq.step_seed(),
                in_thinking: seq.in_thinking,
            };
            let out = self.acceptance.accept_reduced_row(&row).map_err(|e| EngineError::Internal(e.to_string()))?;
            outputs[i] = Some(out);
        }

        // Logprobs and traces read the logits (or their argmaxes), so they are gathered before
        // commit. Rows asking for logprobs always have host logits.
        let extras: Vec<(Vec<TokenLogprob>, Option<TraceStep>)> = rows
            .iter()
            .enumerate()
            .zip(&outputs)
            .map(|((i, r), out)| {
                let (Some(out), Some(seq)) = (out, self.seqs.get(&r.seq)) else {
                    return (Vec::new(), None);
                };
                let n = out.num_drafts;
                let at = |pos: usize| host_logits(i, n).map(|l| &l[pos * v..(pos + 1) * v]);
                let logprobs = match (seq.params.logprobs, host_logits(i, n)) {
                    (Some(top), Some(_)) => out
                        .tokens
                        .iter()
                        .enumerate()
                        .map(|(pos, &t)| {
                            let row = at(pos).expect("host row");
                            let (logprob, top) = logprobs_of(row, t, top);
                            TokenLogprob { token: t, logprob, rank: rank_of(row, t), top }
                        })
                        .collect(),
                    _ => Vec::new(),
                };
                let argmax_at = |pos: usize| match (reduced.get(i).and_then(Option::as_ref), at(pos)) {
                    (Some(positions), _) => positions[pos].argmax,
                    (None, Some(l)) => argmax(l),
                    (None, None) => unreachable!("a verified row has host logits or reductions"),
                };
                let trace = match (r.kind, &seq.trace) {
                    (RowKind::Decode { width }, Some(_)) if width > 0 => Some(TraceStep {
                        position: r.start + 1,
                        drafted: seq.drafts[..width].to_vec(),
                        target: (0..=width).map(argmax_at).collect(),
                        num_accepted: out.num_accepted,
                    }),
                    _ => None,
                };
                (logprobs, trace)
            })
            .collect();
        Ok(Verified { outputs, extras })
    }

    /// Time drafting took since `proposing`, less any catch-up of positions kept through plain
    /// steps (a one-off cost of those steps, not of the next step's width).
    fn draft_time_since(&mut self, proposing: Instant) -> Duration {
        let catch_up = self.proposer.as_mut().map_or(Duration::ZERO, |p| p.take_catch_up_time());
        self.next_step_catch_up = catch_up;
        proposing.elapsed().saturating_sub(catch_up)
    }

    fn propose(&mut self, rows: &[FedRow], forward: &ForwardOutput) -> Result<()> {
        let Some(proposer) = self.proposer.as_mut() else {
            return Ok(());
        };
        let lookahead = proposer.draft_lookahead();
        let finishing: Vec<SeqId> = self.finishing.iter().map(|&(id, _)| id).collect();
        // A finishing row is fed its last positions only when the drafter is at most a step
        // behind (a row one token from its limit drafts nothing in its last step): a row kept
        // plain under load would cost a catch-up of its whole backlog, for blocks no later
        // request may ever read. Its prompt was fed (and cached) already.
        let one_step = proposer.num_speculative_tokens() + 1;
        let fed_up_to_step = |r: &FedRow| proposer.kv_final_len(r.seq, r.start) + one_step >= r.start;
        let will_decode = |scheduler: &Scheduler, seq: &Sequence, id: SeqId| {
            scheduler.num_computed(id) + 1 == seq.tokens.len() && seq.output.remaining() > 1 && !finishing.contains(&id)
        };
        let decode_rows = self.seqs.iter().filter(|&(&id, seq)| will_decode(&self.scheduler, seq, id)).count();
        // A width planned now (the adaptive controller with plain steps) is all the drafts the
        // next step can verify: none for a plain step, fewer than K for a narrow one.
        let num_drafts = self.width.plan_next_pure_step(decode_rows).unwrap_or(proposer.num_speculative_tokens());
        // Copies (prompt lookup) are free to make: in a small batch every decoding row may
        // take some past the planned width.
        let copy_width = self.width.copy_width(decode_rows, proposer.copy_width());
        // A partial probe drafts for its first few rows only; the others verify nothing.
        let mut drafting_rows_left = self.width.planned_drafting_rows().unwrap_or(usize::MAX);
        let mut wants = Vec::with_capacity(rows.len());
        for r in rows {
            let Some(seq) = self.seqs.get(&r.seq) else {
                wants.push((0, 0));
                continue;
            };
            let decodes = will_decode(&self.scheduler, seq, r.seq);
            let want = num_drafts > 0 && drafting_rows_left > 0 && decodes;
            let copies = copy_width > 0 && decodes;
            // Drafting writes past the committed tokens: reserve for it without preempting.
            let reserved = (want || copies) && self.scheduler.reserve(r.seq, seq.tokens.len() + lookahead);
            drafting_rows_left -= usize::from(want && reserved);
            wants
                .push((if want && reserved { num_drafts } else { 0 }, if copies && reserved { copy_width } else { 0 }));
        }
        let propose_rows: Vec<ProposeRow<'_>> = rows
            .iter()
            .zip(&wants)
            .filter_map(|(r, &(num_drafts, num_copies))| {
                let seq = self.seqs.get(&r.seq)?;
                let num_valid = self.scheduler.num_computed(r.seq).saturating_sub(r.start).min(match r.kind {
                    RowKind::Decode { width } => width + 1,
                    RowKind::Prefill { len, .. } => len,
                });
                Some(ProposeRow {
                    seq: r.seq,
                    tokens: &seq.tokens,
                    prompt_len: seq.prompt_len,
                    fed_start: r.start,
                    num_valid,
                    flat_start: r.flat_start,
                    num_drafts,
                    num_copies,
                    catch_up_now: false,
                    // Under prefix caching a block is cached once final in the drafter's KV too:
                    // prompt chunks and caught-up finishing sequences are fed now, not kept.
                    feed_now: self.cfg.enable_prefix_caching
                        && (matches!(r.kind, RowKind::Prefill { .. })
                            || (finishing.contains(&r.seq) && fed_up_to_step(r))),
                    params: &seq.params,
                    seed: seq.step_seed(),
                    guide_state: crate::proposer::guide_state_after(&seq.tokens, seq.prompt_len, &seq.params),
                })
            })
            .collect();
        // A drafter on another device (the first one, under data parallelism with
        // `draft_head_parallelism="device0"`) reads the hidden states there; on the same
        // device the moves are clones of the handles.
        let (moved_taps, moved_final) = match proposer.input_device() {
            Some(device) => (
                Some(forward.taps.iter().map(|t| t.to_device(device)).collect::<candle_core::Result<Vec<_>>>()?),
                forward.final_hidden.as_ref().map(|h| h.to_device(device)).transpose()?,
            ),
            None => (None, None),
        };
        let taps = StepTaps {
            taps: moved_taps.as_deref().unwrap_or(&forward.taps),
            final_hidden: moved_final.as_ref().or(forward.final_hidden.as_ref()),
        };
        let proposals: Vec<Proposal> = proposer.propose(&propose_rows, &taps, &self.scheduler)?;
        let wanting: Vec<(SeqId, usize)> =
            propose_rows.iter().filter(|r| r.may_draft()).map(|r| (r.seq, r.num_drafts)).collect();
        drop(propose_rows);
        let mut copied = 0;
        let mut drafted_nothing = 0;
        for ((id, num_drafts), p) in wanting.into_iter().zip(proposals) {
            if let Some(seq) = self.seqs.get_mut(&id) {
                // Only copies go past the drafts a row asked the model for.
                if p.drafts.len() > num_drafts {
                    copied = copied.max(p.drafts.len());
                }
                drafted_nothing += usize::from(num_drafts > 0 && p.drafts.is_empty());
                seq.drafts = p.drafts;
                seq.draft_probs = p.probs;
            }
        }
        // The next step verifies every row's copies, even past the width planned for it.
        self.width.copied = copied;
        self.width.drafted_nothing = drafted_nothing;
        // Drafting reservations shrink back to the committed tokens.
        for r in rows {
            if let Some(seq) = self.seqs.get(&r.seq) {
                let (n, c) = (seq.tokens.len(), self.scheduler.num_computed(r.seq));
                self.scheduler.commit(r.seq, n, c)?;
            }
        }
        Ok(())
    }

    /// Feeds the step to the metrics and the adaptive controller; `elapsed` is `None` for a
    /// step whose cost is not its width's (see [`Self::step_here`]).
    fn record_step(&mut self, plan: &StepPlan, stats: &SpecDecodeStats, elapsed: Option<Duration>) {
        self.metrics.record_step(stats);
        // A step widened for copied drafts teaches the controller the acceptance of the width
        // it chose, but its cost is not that width's: it is left untimed.
        let (width, elapsed) = match self.width.widened_from.take() {
            Some(chosen) => (chosen, None),
            None => (plan.verify_width, elapsed),
        };
        let (accepted_per_position, rows_drafted) = self.width.controller_observation(stats, width);
        let catch_up = std::mem::take(&mut self.next_step_catch_up);
        // The controller logs each switch it makes.
        if let Some(c) = self.width.controller()
            && !plan.mixed
            && !plan.decode.is_empty()
        {
            if !catch_up.is_zero() {
                c.record_catch_up(plan.decode.len(), catch_up.as_secs_f64());
            }
            c.record_step(
                plan.decode.len(),
                width,
                &accepted_per_position,
                rows_drafted,
                elapsed.map(|e| e.as_secs_f64()),
            );
        }
        self.window.merge(stats);
        if self.last_log.elapsed() >= self.cfg.log_interval && !self.window.is_empty() {
            let k = self.proposer.as_ref().map_or(0, |p| p.num_speculative_tokens());
            tracing::info!("{}", format_log_line(&self.window, k));
            self.window = SpecDecodeStats::new();
            self.last_log = Instant::now();
        }
    }
}

/// The verify widths a captured plan must cover, from the engine's width policy.
fn width_source(policy: &EngineWidthPolicy) -> WidthSource<'_> {
    match &policy.mode {
        WidthMode::Off => WidthSource::Fixed(0),
        WidthMode::Fixed(k) => WidthSource::Fixed(*k),
        WidthMode::Schedule(s) => WidthSource::Schedule(s),
        WidthMode::Adaptive(c) => WidthSource::Adaptive(c),
    }
}

/// The context a sequence may fill: `requested`, or the model's own when unset. Longer than the
/// model was trained for is refused rather than cut silently, as vLLM does.
fn checked_max_model_len(requested: Option<usize>, model_context: usize) -> Result<usize> {
    match requested {
        None => Ok(model_context),
        Some(n) if n < 2 => Err(specrs_core::ConfigError::field(
            "max_model_len",
            format!("max_model_len must be at least 2 (a prompt token and a generated one), got {n}"),
        )
        .into()),
        Some(n) if n > model_context => Err(specrs_core::ConfigError::field(
            "max_model_len",
            format!(
                "max_model_len {n} exceeds the model's context of {model_context} tokens \
                 (max_position_embeddings); lower it or leave it unset"
            ),
        )
        .into()),
        Some(n) => Ok(n),
    }
}

/// A KV plan that cannot be made, as the configuration error it is, naming the setting to
/// change (`kv_cache_bytes` for a budget too small or too large to address). A zero size per
/// token is the model's, not a setting: an internal error.
fn kv_plan_error(e: specrs_core::kv_blocks::KvError, note: &str) -> EngineError {
    use specrs_core::kv_blocks::KvError;
    let field = match &e {
        KvError::ZeroParameter { name } if *name != "bytes_per_token" => *name,
        KvError::BudgetTooSmall { .. } | KvError::TooManySlots { .. } => "kv_cache_bytes",
        _ => return EngineError::Internal(format!("{e}{note}")),
    };
    specrs_core::ConfigError::field(field, format!("{e}{note}")).into()
}

/// Refuses drafts longer than the whole context (`k` drafts verified per step, `lookahead`
/// positions written past a row's tokens while drafting), naming the setting that asked for
/// them: no step could ever verify them, and the KV plan would blame `max_model_len`.
fn check_drafts_fit_context(spec: &SpeculativeConfig, k: usize, lookahead: usize, max_model_len: usize) -> Result<()> {
    let suffix_depth = usize::try_from(spec.suffix_decoding_max_tree_depth).unwrap_or(usize::MAX);
    let uses_suffix = spec.is_suffix() || spec.enable_suffix_decoding;
    // Suffix trees copy continuations up to their depth, past `k` in small batches.
    let longest = k.max(lookahead.saturating_sub(1)).max(if uses_suffix { suffix_depth } else { 0 });
    if longest < max_model_len {
        return Ok(());
    }
    let field = if uses_suffix && suffix_depth >= longest {
        "suffix_decoding_max_tree_depth"
    } else {
        "num_speculative_tokens"
    };
    Err(specrs_core::ConfigError::field(
        field,
        format!(
            "{field} asks for drafts of up to {longest} tokens a step, which do not fit in max_model_len \
             {max_model_len}: lower {field} well below the context"
        ),
    )
    .into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drafts_longer_than_the_context_are_refused_by_the_setting_that_asked_for_them() {
        let suffix = SpeculativeConfig {
            speculative_method: Some(specrs_core::SpeculativeMethod::Suffix),
            suffix_decoding_max_tree_depth: 1 << 40,
            ..SpeculativeConfig::default()
        };
        let ngram = SpeculativeConfig {
            speculative_method: Some(specrs_core::SpeculativeMethod::Ngram),
            ..SpeculativeConfig::default()
        };
        let shallow = SpeculativeConfig { suffix_decoding_max_tree_depth: 24, ..suffix.clone() };
        assert!(check_drafts_fit_context(&ngram, 4, 5, 8192).is_ok());
        assert!(check_drafts_fit_context(&shallow, 24, 25, 8192).is_ok());
        for (spec, k, lookahead, field) in [
            (&suffix, 1 << 40, (1 << 40) + 1, "suffix_decoding_max_tree_depth"),
            // Trees copy up to their depth whatever the width: a depth past the context is refused.
            (&suffix, 24, 25, "suffix_decoding_max_tree_depth"),
            (&ngram, 8192, 8193, "num_speculative_tokens"),
            (&ngram, usize::MAX, usize::MAX, "num_speculative_tokens"),
        ] {
            match check_drafts_fit_context(spec, k, lookahead, 8192).unwrap_err() {
                EngineError::Config(e) => {
                    assert_eq!(e.field.as_deref(), Some(field));
                    assert!(e.message.contains("do not fit in max_model_len 8192"), "{}", e.message);
                }
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn max_model_len_defaults_to_the_models_context_and_refuses_more_or_too_little() {
        assert_eq!(checked_max_model_len(None, 8192).unwrap(), 8192);
        assert_eq!(checked_max_model_len(Some(512), 8192).unwrap(), 512);
        assert_eq!(checked_max_model_len(Some(8192), 8192).unwrap(), 8192);
        for (asked, needle) in [(Some(8193), "exceeds the model's context of 8192"), (Some(1), "at least 2")] {
            match checked_max_model_len(asked, 8192).unwrap_err() {
                EngineError::Config(e) => {
                    assert_eq!(e.field.as_deref(), Some("max_model_len"));
                    assert!(e.message.contains(needle), "{}", e.message);
                }
                other => panic!("{other:?}"),
            }
        }
    }
}
