//! `EngineHandle`: the engine on its own thread, fed over a channel. Submitting returns a
//! stream of outputs; dropping the stream cancels the request. Used by the server (async) and
//! the Python API (blocking, with the GIL released).
//!
//! Before a request reaches an engine thread, the handle prepares it on the caller's thread
//! (a blocking task for async callers): the prompt is rendered and tokenized and its output
//! constraint compiled (a large schema's automaton takes milliseconds or more), so the engine
//! threads only schedule and compute, and a heavy request never stalls the others' steps.
//!
//! With data parallelism the handle runs one engine thread per replica and sends each new
//! request to the replica with the fewest requests (vLLM's data-parallel load balancing);
//! the replicas share one `EngineMetrics`, so `/metrics` reads the sum.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use specrs_core::structured::GuideCache;
use tokio::sync::oneshot;

use crate::detokenizer::{FinishReason, StopReason};
use crate::engine::{Engine, GUIDE_CACHE_CAPACITY, guide_vocabulary};
use crate::error::{EngineError, Result};
use crate::metrics::EngineMetrics;
use crate::pipeline::PipelineInfo;
use crate::request::{
    GenerationRequest, OutputStream, Prompt, RequestFailure, RequestId, RequestMetrics, RequestOutput, TokenLogprob,
    TraceStep,
};
use crate::routing::{SentPrefixes, choose_replica, prefix_chunks};
use crate::tokenizer::TextTokenizer;

enum Command {
    Add {
        id: RequestId,
        // Boxed: a request (its sampling parameters) dwarfs every other command.
        request: Box<GenerationRequest>,
        sink: crate::request::OutputSink,
        reply: oneshot::Sender<Result<()>>,
    },
    /// Requests admitted together, between two steps, so they start in the same step.
    AddMany(Vec<PendingAdd>, oneshot::Sender<Vec<Result<()>>>),
    Abort(RequestId),
    AbortAll,
    /// Stop accepting work; finish running requests for up to `grace`, then cancel the rest.
    Shutdown {
        grace: Duration,
    },
    /// Free KV blocks and total blocks, for tests and health checks.
    KvStats(oneshot::Sender<(usize, usize)>),
    /// Forget every cached prefix; replies with how many blocks were cached.
    ResetPrefixCache(oneshot::Sender<usize>),
    /// Forget suffix decoding's finished outputs; replies with how many went.
    ResetSuffixCache(oneshot::Sender<usize>),
    /// Blocks holding cached prefixes.
    CachedBlocks(oneshot::Sender<usize>),
}

/// Static facts about the running pipeline.
struct PendingAdd {
    id: RequestId,
    request: GenerationRequest,
    sink: crate::request::OutputSink,
}

#[derive(Debug, Clone)]
pub struct EngineInfo {
    pub pipeline: Option<PipelineInfo>,
    pub max_model_len: usize,
    pub vocab_size: usize,
    /// Over all replicas.
    pub max_num_seqs: usize,
    pub num_replicas: usize,
}

/// One engine thread and what routing needs to know of it.
struct Replica {
    tx: mpsc::Sender<Command>,
    thread: Option<JoinHandle<()>>,
    /// Requests the replica holds: counted up when one is routed here, set to the engine's
    /// own count after every step.
    load: Arc<AtomicUsize>,
    /// The prompt starts sent here, for routing by cached prefix.
    sent: std::sync::Mutex<SentPrefixes>,
}

impl Replica {
    fn sent(&self) -> std::sync::MutexGuard<'_, SentPrefixes> {
        // A panic while holding the lock leaves a set that is still consistent.
        self.sent.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

pub struct EngineHandle {
    replicas: Vec<Replica>,
    metrics: Arc<EngineMetrics>,
    tokenizer: Arc<TextTokenizer>,
    preparation: Preparation,
    info: EngineInfo,
    next_id: AtomicU64,
    /// Where the replicas cache prefixes: how many more sequences than the lightest replica
    /// the one holding a request's prefix may carry and still get it.
    prefix_routing: Option<usize>,
}

/// One finished choice of a request (the only one with `n = 1`), collected from its stream.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct FinalOutput {
    pub request_id: RequestId,
    /// The choice's index among the request's `n`.
    pub index: usize,
    pub token_ids: Vec<u32>,
    pub text: String,
    pub finish_reason: FinishReason,
    /// The stop token id or stop string that ended the choice (vLLM's `stop_reason`).
    pub stop_reason: Option<StopReason>,
    pub metrics: RequestMetrics,
    pub logprobs: Vec<TokenLogprob>,
    pub prompt_logprobs: Vec<Option<TokenLogprob>>,
    pub prompt_token_ids: Vec<u32>,
    pub trace: Vec<TraceStep>,
    pub error: Option<RequestFailure>,
    pub num_prompt_tokens: usize,
}

impl FinalOutput {
    /// Folds the outputs of a request with one choice into one.
    pub fn collect(outputs: impl IntoIterator<Item = RequestOutput>) -> Option<Self> {
        Self::collect_choices(outputs).into_iter().next()
    }

    /// Folds a request's outputs into one per choice, in index order.
    pub fn collect_choices(outputs: impl IntoIterator<Item = RequestOutput>) -> Vec<Self> {
        let mut choices: Vec<Option<Self>> = Vec::new();
        for o in outputs {
            if choices.len() <= o.index {
                choices.resize(o.index + 1, None);
            }
            let a = choices[o.index].get_or_insert_with(|| Self {
                request_id: o.request_id,
                index: o.index,
                token_ids: Vec::new(),
                text: String::new(),
                finish_reason: FinishReason::Error,
                stop_reason: None,
                metrics: RequestMetrics::default(),
                logprobs: Vec::new(),
                prompt_logprobs: Vec::new(),
                prompt_token_ids: Vec::new(),
                trace: Vec::new(),
                error: None,
                num_prompt_tokens: o.num_prompt_tokens,
            });
            a.token_ids.extend(o.token_ids);
            a.text.push_str(&o.text);
            a.logprobs.extend(o.logprobs);
            a.prompt_logprobs.extend(o.prompt_logprobs);
            a.prompt_token_ids.extend(o.prompt_token_ids);
            a.trace.extend(o.trace);
            if let Some(r) = o.finish_reason {
                a.finish_reason = r;
                a.stop_reason = o.stop_reason;
                a.metrics = o.metrics.unwrap_or_default();
                a.error = o.error;
            }
        }
        choices.into_iter().flatten().collect()
    }
}

impl EngineHandle {
    /// Moves the engine onto its own thread.
    pub fn spawn(engine: Engine, pipeline: Option<PipelineInfo>) -> Self {
        Self::spawn_replicas(vec![engine], pipeline).expect("one engine is a valid replica set")
    }

    /// Moves each data-parallel replica (`crate::build_replicas`) onto a thread of its own.
    /// The replicas must serve the same model: same vocabulary and context length.
    pub fn spawn_replicas(engines: Vec<Engine>, pipeline: Option<PipelineInfo>) -> Result<Self> {
        let Some(first) = engines.first() else {
            return Err(EngineError::Request("no engine to spawn: a replica set needs at least one".into()));
        };
        let vocab_size = first.target().config().vocab_size;
        let max_model_len = first.max_model_len();
        if let Some(i) = engines
            .iter()
            .position(|e| e.target().config().vocab_size != vocab_size || e.max_model_len() != max_model_len)
        {
            return Err(EngineError::Request(format!(
                "replica {i} serves a different model than replica 0 (vocabulary or context length differ)"
            )));
        }
        let info = EngineInfo {
            pipeline,
            max_model_len,
            vocab_size,
            max_num_seqs: engines.iter().map(Engine::max_num_seqs).sum(),
            num_replicas: engines.len(),
        };
        let tokenizer = first.tokenizer().clone();
        let prefix_routing = engines.iter().all(Engine::caches_prefixes).then(|| (first.max_num_seqs() / 4).max(1));
        let metrics = if engines.len() == 1 { first.metrics() } else { Arc::new(EngineMetrics::default()) };
        let replicas = engines
            .into_iter()
            .enumerate()
            .map(|(i, engine)| {
                let engine = if info.num_replicas == 1 { engine } else { engine.with_shared_metrics(metrics.clone()) };
                let (tx, rx) = mpsc::channel();
                let load = Arc::new(AtomicUsize::new(0));
                let thread_load = load.clone();
                let thread = std::thread::Builder::new()
                    .name(if info.num_replicas == 1 { "specrs-engine".into() } else { format!("specrs-engine-{i}") })
                    .spawn(move || run(engine, rx, &thread_load))
                    .expect("spawning an engine thread");
                Replica { tx, thread: Some(thread), load, sent: Default::default() }
            })
            .collect();
        let preparation = Preparation { tokenizer: tokenizer.clone(), guides: Arc::default() };
        Ok(Self { replicas, metrics, tokenizer, preparation, info, next_id: AtomicU64::new(1), prefix_routing })
    }

    pub fn metrics(&self) -> &Arc<EngineMetrics> {
        &self.metrics
    }

    pub fn tokenizer(&self) -> &Arc<TextTokenizer> {
        &self.tokenizer
    }

    pub fn info(&self) -> &EngineInfo {
        &self.info
    }

    /// The replica a new request goes to ([`crate::routing`]): where the replicas cache
    /// prefixes, the one it sent the longest start of this prompt to, unless that one holds
    /// more than a quarter of a replica's sequences above the lightest; otherwise the one
    /// holding the fewest (the first on ties). Counted up at once, so requests routed together
    /// spread out.
    fn route(&self, request: &GenerationRequest) -> usize {
        if self.replicas.len() == 1 {
            return 0;
        }
        let loads: Vec<usize> = self.replicas.iter().map(|r| r.load.load(Ordering::Relaxed)).collect();
        let chunks = if self.prefix_routing.is_some() { prefix_chunks(&request.prompt) } else { Vec::new() };
        let matched: Vec<usize> = self.replicas.iter().map(|r| r.sent().matched(&chunks)).collect();
        let index = choose_replica(&loads, &matched, self.prefix_routing.unwrap_or(0));
        let replica = &self.replicas[index];
        replica.sent().record(&chunks);
        replica.load.fetch_add(request.params.n.max(1), Ordering::Relaxed);
        index
    }

    /// A new request's id; a request with `n` choices takes `n` ids (one per choice
    /// sequence), the first of which names it.
    fn reserve_id(&self, request: &GenerationRequest) -> RequestId {
        self.next_id.fetch_add(request.params.n.max(1) as RequestId, Ordering::Relaxed)
    }

    fn send_add(&self, request: GenerationRequest) -> Result<(RequestId, OutputStream, oneshot::Receiver<Result<()>>)> {
        let id = self.reserve_id(&request);
        let (sink, stream) = tokio::sync::mpsc::unbounded_channel();
        let (reply, admitted) = oneshot::channel();
        self.replicas[self.route(&request)]
            .tx
            .send(Command::Add { id, request: Box::new(request), sink, reply })
            .map_err(|_| EngineError::Shutdown)?;
        Ok((id, stream, admitted))
    }

    /// Submits a request from a blocking context; validation errors return here.
    pub fn submit(&self, request: GenerationRequest) -> Result<(RequestId, OutputStream)> {
        let request = self.preparation.prepare(request)?;
        let (id, stream, admitted) = self.send_add(request)?;
        admitted.blocking_recv().map_err(|_| EngineError::Shutdown)??;
        Ok((id, stream))
    }

    /// Submits a request from async code (in a tokio runtime: it is prepared on a blocking
    /// task, off the runtime's workers).
    pub async fn submit_async(&self, request: GenerationRequest) -> Result<(RequestId, OutputStream)> {
        let preparation = self.preparation.clone();
        let request = tokio::task::spawn_blocking(move || preparation.prepare(request))
            .await
            .map_err(|_| EngineError::Shutdown)??;
        let (id, stream, admitted) = self.send_add(request)?;
        admitted.await.map_err(|_| EngineError::Shutdown)??;
        Ok((id, stream))
    }

    /// Cancels a request. Every replica is told: the one holding it drops it, the others
    /// find nothing to do.
    pub fn abort(&self, id: RequestId) {
        for r in &self.replicas {
            let _ = r.tx.send(Command::Abort(id));
        }
    }

    /// Cancels every request (shutdown after the grace period).
    pub fn abort_all(&self) {
        for r in &self.replicas {
            let _ = r.tx.send(Command::AbortAll);
        }
    }

    /// Every engine thread is running.
    pub fn is_alive(&self) -> bool {
        self.replicas.iter().all(|r| r.thread.as_ref().is_some_and(|t| !t.is_finished()))
    }

    /// `(free, total)` KV blocks over all replicas.
    pub fn kv_blocks(&self) -> Result<(usize, usize)> {
        Ok(self.replica_kv_blocks()?.into_iter().fold((0, 0), |(f, t), (rf, rt)| (f + rf, t + rt)))
    }

    /// `(free, total)` KV blocks of each replica, in device order.
    pub fn replica_kv_blocks(&self) -> Result<Vec<(usize, usize)>> {
        self.ask_every_replica(Command::KvStats)
    }

    /// Forgets every cached prefix on every replica (vLLM's `reset_prefix_cache`): later
    /// requests compute their prompts afresh. Blocks running requests hold stay theirs.
    /// Returns how many blocks were cached, over all replicas.
    pub fn reset_prefix_cache(&self) -> Result<usize> {
        Ok(self.ask_every_replica(Command::ResetPrefixCache)?.into_iter().sum())
    }

    /// Forgets the finished requests' outputs suffix decoding drafts from, on every replica
    /// ([`Engine::reset_suffix_cache`]): a request asked again is drafted as the first time.
    /// Returns how many outputs went, over all replicas.
    pub fn reset_suffix_cache(&self) -> Result<usize> {
        Ok(self.ask_every_replica(Command::ResetSuffixCache)?.into_iter().sum())
    }

    /// Blocks holding cached prefixes (in use or parked), over all replicas.
    pub fn num_cached_blocks(&self) -> Result<usize> {
        Ok(self.ask_every_replica(Command::CachedBlocks)?.into_iter().sum())
    }

    /// Sends each replica the command `ask` makes around a reply channel; their replies in
    /// device order.
    fn ask_every_replica<T>(&self, ask: impl Fn(oneshot::Sender<T>) -> Command) -> Result<Vec<T>> {
        let pending = self
            .replicas
            .iter()
            .map(|r| {
                let (reply, rx) = oneshot::channel();
                r.tx.send(ask(reply)).map_err(|_| EngineError::Shutdown)?;
                Ok(rx)
            })
            .collect::<Result<Vec<_>>>()?;
        pending.into_iter().map(|rx| rx.blocking_recv().map_err(|_| EngineError::Shutdown)).collect()
    }

    /// Runs `requests` to completion and returns their choices in submission order (one
    /// output per request with `n = 1`; a request's `n` choices in index order). They are admitted
    /// in one command per replica, so each replica schedules its share together from its next
    /// step on (one at a time, each would wait a step for the one before it). When any is
    /// refused, the others are aborted and the first refusal is returned.
    pub fn generate(&self, requests: Vec<GenerationRequest>) -> Result<Vec<FinalOutput>> {
        let mut adds: Vec<Vec<PendingAdd>> = self.replicas.iter().map(|_| Vec::new()).collect();
        let mut placed = Vec::with_capacity(requests.len());
        let mut streams = Vec::with_capacity(requests.len());
        let requests = requests.into_iter().map(|r| self.preparation.prepare(r)).collect::<Result<Vec<_>>>()?;
        for request in requests {
            let id = self.reserve_id(&request);
            let (sink, stream) = tokio::sync::mpsc::unbounded_channel();
            let replica = self.route(&request);
            placed.push(replica);
            adds[replica].push(PendingAdd { id, request, sink });
            streams.push((id, stream));
        }
        let mut replies = Vec::with_capacity(self.replicas.len());
        for (replica, batch) in self.replicas.iter().zip(adds) {
            if batch.is_empty() {
                replies.push(None);
                continue;
            }
            let (reply, admitted) = oneshot::channel();
            replica.tx.send(Command::AddMany(batch, reply)).map_err(|_| EngineError::Shutdown)?;
            replies.push(Some(admitted));
        }
        let per_replica: Vec<Vec<Result<()>>> = replies
            .into_iter()
            .map(|r| match r {
                Some(admitted) => admitted.blocking_recv().map_err(|_| EngineError::Shutdown),
                None => Ok(Vec::new()),
            })
            .collect::<Result<_>>()?;
        let mut per_replica: Vec<std::vec::IntoIter<Result<()>>> =
            per_replica.into_iter().map(Vec::into_iter).collect();
        let results: Vec<Result<()>> = placed
            .iter()
            .map(|&replica| per_replica[replica].next().expect("one admission result per request"))
            .collect();
        if let Some(refused) = results.iter().position(Result::is_err) {
            for ((id, _), r) in streams.iter().zip(&results) {
                if r.is_ok() {
                    self.abort(*id);
                }
            }
            return Err(results.into_iter().nth(refused).expect("a refusal at this index").unwrap_err());
        }
        let mut finals = Vec::with_capacity(streams.len());
        for (_, mut s) in streams {
            let mut outs = Vec::new();
            while let Some(o) = s.blocking_recv() {
                let done = o.is_finished();
                outs.push(o);
                if done {
                    break;
                }
            }
            let choices = FinalOutput::collect_choices(outs);
            if choices.is_empty() {
                return Err(EngineError::Shutdown);
            }
            finals.extend(choices);
        }
        Ok(finals)
    }

    /// Stops accepting requests, lets running ones finish for up to `grace`, cancels the rest
    /// and joins the engine threads.
    pub fn shutdown(mut self, grace: Duration) {
        self.stop(grace);
    }

    fn stop(&mut self, grace: Duration) {
        for r in &self.replicas {
            let _ = r.tx.send(Command::Shutdown { grace });
        }
        for r in &mut self.replicas {
            if let Some(t) = r.thread.take() {
                let _ = t.join();
            }
        }
    }
}

impl Drop for EngineHandle {
    fn drop(&mut self) {
        self.stop(Duration::ZERO);
    }
}

/// What the handle does to a request before an engine takes it.
#[derive(Clone)]
struct Preparation {
    tokenizer: Arc<TextTokenizer>,
    /// Recently compiled constraints, shared by every caller and replica (built with the first
    /// guided request).
    guides: Arc<Mutex<Option<GuideCache>>>,
}

impl Preparation {
    /// The request with its prompt as tokens and its constraint compiled; errors are the
    /// request's (a template that fails, a constraint that cannot guide).
    fn prepare(&self, mut request: GenerationRequest) -> Result<GenerationRequest> {
        request.prompt = match request.prompt {
            Prompt::Text(text) => Prompt::Tokens(self.tokenizer.encode(&text, true)?),
            Prompt::Chat(conversation) => {
                let text = self.tokenizer.render_conversation(&conversation)?;
                Prompt::Tokens(self.tokenizer.encode_chat(&text)?)
            }
            tokens @ Prompt::Tokens(_) => tokens,
        };
        let params = &mut request.params;
        if !params.bad_words.is_empty() && params.bad_word_ids.is_empty() {
            // Tokenized here, off the engine thread: a long list must not stall running requests.
            params.bad_word_ids = specrs_core::sampling::bad_word_token_ids(&params.bad_words, |word| {
                self.tokenizer.encode(word, false)
            })?;
        }
        if let Some(constraint) = &params.structured_outputs
            && params.guide.is_none()
        {
            // Compiled outside the lock: a request whose constraint is kept need not wait for
            // another's compile (two requests bringing the same new one both compile it).
            let (kept, vocabulary) = self.with_guides(|cache| (cache.lookup(constraint), cache.vocabulary().clone()));
            params.guide = Some(match kept {
                Some(guide) => guide,
                None => {
                    let guide = constraint.compile(&vocabulary)?;
                    self.with_guides(|cache| cache.insert(constraint, guide.clone()));
                    guide
                }
            });
        }
        Ok(request)
    }

    fn with_guides<T>(&self, f: impl FnOnce(&mut GuideCache) -> T) -> T {
        // A panic while the lock was held left the cache consistent: still usable.
        let mut guides = self.guides.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        f(guides
            .get_or_insert_with(|| GuideCache::new(Arc::new(guide_vocabulary(&self.tokenizer)), GUIDE_CACHE_CAPACITY)))
    }
}

fn run(mut engine: Engine, rx: mpsc::Receiver<Command>, load: &AtomicUsize) {
    let mut shutdown_deadline: Option<Instant> = None;
    loop {
        // Block while idle; otherwise take whatever arrived and keep stepping.
        if !engine.has_work() && shutdown_deadline.is_none() {
            match rx.recv() {
                Ok(cmd) => handle(&mut engine, cmd, &mut shutdown_deadline),
                Err(_) => break,
            }
        }
        loop {
            match rx.try_recv() {
                Ok(cmd) => handle(&mut engine, cmd, &mut shutdown_deadline),
                Err(mpsc::TryRecvError::Empty) => break,
                Err(mpsc::TryRecvError::Disconnected) => {
                    shutdown_deadline.get_or_insert_with(Instant::now);
                    break;
                }
            }
        }
        load.store(engine.num_requests(), Ordering::Relaxed);
        if let Some(deadline) = shutdown_deadline {
            if !engine.has_work() {
                break;
            }
            if Instant::now() >= deadline {
                engine.abort_all();
                break;
            }
        }
        if engine.has_work()
            && let Err(e) = engine.step()
        {
            tracing::error!("engine step failed: {e}; failing running requests");
            engine.fail_all(&format!("engine step failed: {e}"));
        }
        load.store(engine.num_requests(), Ordering::Relaxed);
    }
}

fn handle(engine: &mut Engine, cmd: Command, shutdown: &mut Option<Instant>) {
    match cmd {
        Command::Add { id, request, sink, reply } => {
            let result =
                if shutdown.is_some() { Err(EngineError::Shutdown) } else { engine.add_request(id, *request, sink) };
            let _ = reply.send(result);
        }
        Command::AddMany(adds, reply) => {
            let results = adds
                .into_iter()
                .map(|a| {
                    if shutdown.is_some() {
                        Err(EngineError::Shutdown)
                    } else {
                        engine.add_request(a.id, a.request, a.sink)
                    }
                })
                .collect();
            let _ = reply.send(results);
        }
        Command::Abort(id) => {
            engine.abort(id);
        }
        Command::AbortAll => engine.abort_all(),
        Command::Shutdown { grace } => {
            shutdown.get_or_insert_with(|| Instant::now() + grace);
        }
        Command::KvStats(reply) => {
            let _ = reply.send((engine.num_free_blocks(), engine.num_total_blocks()));
        }
        Command::ResetPrefixCache(reply) => {
            let _ = reply.send(engine.reset_prefix_cache());
        }
        Command::ResetSuffixCache(reply) => {
            let _ = reply.send(engine.reset_suffix_cache());
        }
        Command::CachedBlocks(reply) => {
            let _ = reply.send(engine.num_cached_blocks());
        }
    }
}
