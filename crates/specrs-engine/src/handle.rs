//! `EngineHandle`: the engine on its own thread, fed over a channel. Submitting returns a
//! stream of outputs; dropping the stream cancels the request. Used by the server (async) and
//! the Python API (blocking, with the GIL released).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use crate::detokenizer::FinishReason;
use crate::engine::Engine;
use crate::error::{EngineError, Result};
use crate::metrics::EngineMetrics;
use crate::pipeline::PipelineInfo;
use crate::request::{
    GenerationRequest, OutputStream, RequestId, RequestMetrics, RequestOutput, TokenLogprob, TraceStep,
};
use crate::tokenizer::TextTokenizer;

enum Command {
    Add {
        id: RequestId,
        request: GenerationRequest,
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
    pub max_num_seqs: usize,
}

pub struct EngineHandle {
    tx: mpsc::Sender<Command>,
    thread: Option<JoinHandle<()>>,
    metrics: Arc<EngineMetrics>,
    tokenizer: Arc<TextTokenizer>,
    info: EngineInfo,
    next_id: AtomicU64,
}

/// A finished request, collected from its stream.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct FinalOutput {
    pub request_id: RequestId,
    pub token_ids: Vec<u32>,
    pub text: String,
    pub finish_reason: FinishReason,
    pub metrics: RequestMetrics,
    pub logprobs: Vec<TokenLogprob>,
    pub trace: Vec<TraceStep>,
    pub error: Option<String>,
    pub num_prompt_tokens: usize,
}

impl FinalOutput {
    /// Folds a request's outputs into one.
    pub fn collect(outputs: impl IntoIterator<Item = RequestOutput>) -> Option<Self> {
        let mut acc: Option<Self> = None;
        for o in outputs {
            let a = acc.get_or_insert_with(|| Self {
                request_id: o.request_id,
                token_ids: Vec::new(),
                text: String::new(),
                finish_reason: FinishReason::Error,
                metrics: RequestMetrics::default(),
                logprobs: Vec::new(),
                trace: Vec::new(),
                error: None,
                num_prompt_tokens: o.num_prompt_tokens,
            });
            a.token_ids.extend(o.token_ids);
            a.text.push_str(&o.text);
            a.logprobs.extend(o.logprobs);
            a.trace.extend(o.trace);
            if let Some(r) = o.finish_reason {
                a.finish_reason = r;
                a.metrics = o.metrics.unwrap_or_default();
                a.error = o.error;
            }
        }
        acc
    }
}

impl EngineHandle {
    /// Moves the engine onto its own thread.
    pub fn spawn(engine: Engine, pipeline: Option<PipelineInfo>) -> Self {
        let (tx, rx) = mpsc::channel();
        let metrics = engine.metrics();
        let tokenizer = engine.tokenizer().clone();
        let info = EngineInfo {
            pipeline,
            max_model_len: engine.max_model_len(),
            vocab_size: engine.target().config().vocab_size,
            max_num_seqs: engine.max_num_seqs(),
        };
        let thread = std::thread::Builder::new()
            .name("specrs-engine".into())
            .spawn(move || run(engine, rx))
            .expect("spawning the engine thread");
        Self { tx, thread: Some(thread), metrics, tokenizer, info, next_id: AtomicU64::new(1) }
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

    fn send_add(&self, request: GenerationRequest) -> Result<(RequestId, OutputStream, oneshot::Receiver<Result<()>>)> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (sink, stream) = tokio::sync::mpsc::unbounded_channel();
        let (reply, admitted) = oneshot::channel();
        self.tx.send(Command::Add { id, request, sink, reply }).map_err(|_| EngineError::Shutdown)?;
        Ok((id, stream, admitted))
    }

    /// Submits a request from a blocking context; validation errors return here.
    pub fn submit(&self, request: GenerationRequest) -> Result<(RequestId, OutputStream)> {
        let (id, stream, admitted) = self.send_add(request)?;
        admitted.blocking_recv().map_err(|_| EngineError::Shutdown)??;
        Ok((id, stream))
    }

    /// Submits a request from async code.
    pub async fn submit_async(&self, request: GenerationRequest) -> Result<(RequestId, OutputStream)> {
        let (id, stream, admitted) = self.send_add(request)?;
        admitted.await.map_err(|_| EngineError::Shutdown)??;
        Ok((id, stream))
    }

    pub fn abort(&self, id: RequestId) {
        let _ = self.tx.send(Command::Abort(id));
    }

    /// Cancels every request (shutdown after the grace period).
    pub fn abort_all(&self) {
        let _ = self.tx.send(Command::AbortAll);
    }

    /// The engine thread is running.
    pub fn is_alive(&self) -> bool {
        self.thread.as_ref().is_some_and(|t| !t.is_finished())
    }

    /// `(free, total)` KV blocks.
    pub fn kv_blocks(&self) -> Result<(usize, usize)> {
        let (reply, rx) = oneshot::channel();
        self.tx.send(Command::KvStats(reply)).map_err(|_| EngineError::Shutdown)?;
        rx.blocking_recv().map_err(|_| EngineError::Shutdown)
    }

    /// Runs requests to completion and returns them in submission order.
    /// Runs `requests` to completion. They are admitted in one command, so the engine
    /// schedules them together from its next step on (one at a time, each would wait a step
    /// for the one before it). When any is refused, the others are aborted and the first
    /// refusal is returned.
    pub fn generate(&self, requests: Vec<GenerationRequest>) -> Result<Vec<FinalOutput>> {
        let mut adds = Vec::with_capacity(requests.len());
        let mut streams = Vec::with_capacity(requests.len());
        for request in requests {
            let id = self.next_id.fetch_add(1, Ordering::Relaxed);
            let (sink, stream) = tokio::sync::mpsc::unbounded_channel();
            adds.push(PendingAdd { id, request, sink });
            streams.push((id, stream));
        }
        let (reply, admitted) = oneshot::channel();
        self.tx.send(Command::AddMany(adds, reply)).map_err(|_| EngineError::Shutdown)?;
        let results = admitted.blocking_recv().map_err(|_| EngineError::Shutdown)?;
        if let Some(refused) = results.iter().position(Result::is_err) {
            for ((id, _), r) in streams.iter().zip(&results) {
                if r.is_ok() {
                    self.abort(*id);
                }
            }
            return Err(results.into_iter().nth(refused).expect("a refusal at this index").unwrap_err());
        }
        let streams = streams.into_iter().map(|(_, s)| s);
        streams
            .into_iter()
            .map(|mut s| {
                let mut outs = Vec::new();
                while let Some(o) = s.blocking_recv() {
                    let done = o.is_finished();
                    outs.push(o);
                    if done {
                        break;
                    }
                }
                FinalOutput::collect(outs).ok_or(EngineError::Shutdown)
            })
            .collect()
    }

    /// Stops accepting requests, lets running ones finish for up to `grace`, cancels the rest
    /// and joins the engine thread.
    pub fn shutdown(mut self, grace: Duration) {
        let _ = self.tx.send(Command::Shutdown { grace });
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for EngineHandle {
    fn drop(&mut self) {
        if let Some(t) = self.thread.take() {
            let _ = self.tx.send(Command::Shutdown { grace: Duration::ZERO });
            let _ = t.join();
        }
    }
}

fn run(mut engine: Engine, rx: mpsc::Receiver<Command>) {
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
    }
}

fn handle(engine: &mut Engine, cmd: Command, shutdown: &mut Option<Instant>) {
    match cmd {
        Command::Add { id, request, sink, reply } => {
            let result =
                if shutdown.is_some() { Err(EngineError::Shutdown) } else { engine.add_request(id, request, sink) };
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
    }
}
