//! Engine-wide metrics, shared with the server's `/metrics` endpoint: request and token
//! counters, queue gauges, KV occupancy, latencies, and the speculative counters under vLLM's
//! names plus MAX's acceptance histograms.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use specrs_core::metrics::{AcceptanceHistograms, Histogram, SpecDecodeCounters, SpecDecodeStats};

use crate::detokenizer::FinishReason;

/// Latency buckets in seconds.
const LATENCY_BUCKETS: &[f64] =
    &[0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 30.0, 60.0];

#[derive(Default)]
struct Finished {
    stop: u64,
    length: u64,
    abort: u64,
    error: u64,
}

pub struct EngineMetrics {
    pub prompt_tokens: AtomicU64,
    pub generation_tokens: AtomicU64,
    pub num_running: AtomicUsize,
    pub num_waiting: AtomicUsize,
    pub kv_free_blocks: AtomicUsize,
    pub kv_total_blocks: AtomicUsize,
    pub num_preemptions: AtomicU64,
    /// Prompt tokens of sequences admitted (vLLM's `prefix_cache_queries`), and how many of
    /// them a cached prefix covered (`prefix_cache_hits`).
    pub prefix_cache_queries: AtomicU64,
    pub prefix_cache_hits: AtomicU64,
    pub steps: AtomicU64,
    /// Steps whose target forward ran on a captured shape (`device_graph_capture`).
    pub captured_steps: AtomicU64,
    /// Verify positions of sampled drafts reduced on the first device, their logit rows
    /// gathered there from a later replica (`draft_probs_layout="device0"`).
    pub draft_probs_device0_positions: AtomicU64,
    finished: Mutex<Finished>,
    spec: Mutex<(SpecDecodeCounters, AcceptanceHistograms)>,
    latency: Mutex<(Histogram, Histogram)>,
}

impl Default for EngineMetrics {
    fn default() -> Self {
        Self {
            prompt_tokens: AtomicU64::new(0),
            generation_tokens: AtomicU64::new(0),
            num_running: AtomicUsize::new(0),
            num_waiting: AtomicUsize::new(0),
            kv_free_blocks: AtomicUsize::new(0),
            kv_total_blocks: AtomicUsize::new(0),
            num_preemptions: AtomicU64::new(0),
            prefix_cache_queries: AtomicU64::new(0),
            prefix_cache_hits: AtomicU64::new(0),
            steps: AtomicU64::new(0),
            captured_steps: AtomicU64::new(0),
            draft_probs_device0_positions: AtomicU64::new(0),
            finished: Mutex::new(Finished::default()),
            spec: Mutex::new((SpecDecodeCounters::new(), AcceptanceHistograms::new())),
            latency: Mutex::new((Histogram::new(LATENCY_BUCKETS), Histogram::new(LATENCY_BUCKETS))),
        }
    }
}

impl EngineMetrics {
    pub fn record_step(&self, step: &SpecDecodeStats) {
        self.steps.fetch_add(1, Ordering::Relaxed);
        if step.is_empty() {
            return;
        }
        let mut spec = self.spec.lock().expect("metrics lock");
        spec.0.add(step);
        spec.1.observe_step(step);
    }

    pub fn record_finished(&self, reason: FinishReason, ttft: Option<f64>, latency: f64) {
        {
            let mut f = self.finished.lock().expect("metrics lock");
            match reason {
                FinishReason::Stop => f.stop += 1,
                FinishReason::Length => f.length += 1,
                FinishReason::Abort => f.abort += 1,
                FinishReason::Error => f.error += 1,
            }
        }
        let mut l = self.latency.lock().expect("metrics lock");
        if let Some(t) = ttft {
            l.0.observe(t);
        }
        l.1.observe(latency);
    }

    /// Cumulative speculative totals (what `/metrics` reports under vLLM's names).
    pub fn spec_totals(&self) -> SpecDecodeStats {
        self.spec.lock().expect("metrics lock").0.totals().clone()
    }

    pub fn num_finished(&self) -> u64 {
        let f = self.finished.lock().expect("metrics lock");
        f.stop + f.length + f.abort + f.error
    }

    /// Prometheus text exposition of every metric, names prefixed with `prefix` (e.g. "specrs").
    pub fn render_prometheus(&self, prefix: &str) -> String {
        let mut out = String::new();
        let counter = |out: &mut String, name: &str, help: &str, v: u64| {
            out.push_str(&format!(
                "# HELP {prefix}_{name} {help}\n# TYPE {prefix}_{name} counter\n{prefix}_{name} {v}\n"
            ));
        };
        let gauge = |out: &mut String, name: &str, help: &str, v: usize| {
            out.push_str(&format!(
                "# HELP {prefix}_{name} {help}\n# TYPE {prefix}_{name} gauge\n{prefix}_{name} {v}\n"
            ));
        };
        {
            let f = self.finished.lock().expect("metrics lock");
            out.push_str(&format!(
                "# HELP {prefix}_request_success_total Finished requests by finish reason.\n# TYPE {prefix}_request_success_total counter\n"
            ));
            for (reason, v) in [("stop", f.stop), ("length", f.length), ("abort", f.abort), ("error", f.error)] {
                out.push_str(&format!("{prefix}_request_success_total{{finished_reason=\"{reason}\"}} {v}\n"));
            }
        }
        counter(
            &mut out,
            "prompt_tokens_total",
            "Prompt tokens processed.",
            self.prompt_tokens.load(Ordering::Relaxed),
        );
        counter(
            &mut out,
            "generation_tokens_total",
            "Tokens generated.",
            self.generation_tokens.load(Ordering::Relaxed),
        );
        counter(
            &mut out,
            "num_preemptions_total",
            "Sequences preempted for recompute.",
            self.num_preemptions.load(Ordering::Relaxed),
        );
        counter(
            &mut out,
            "prefix_cache_queries_total",
            "Prompt tokens looked up in the prefix cache when their sequence was admitted.",
            self.prefix_cache_queries.load(Ordering::Relaxed),
        );
        counter(
            &mut out,
            "prefix_cache_hits_total",
            "Prompt tokens a cached prefix covered (their KV was reused, not computed).",
            self.prefix_cache_hits.load(Ordering::Relaxed),
        );
        counter(&mut out, "engine_steps_total", "Engine steps run.", self.steps.load(Ordering::Relaxed));
        counter(
            &mut out,
            "engine_captured_steps_total",
            "Engine steps whose target forward ran on a captured (device-graph) shape.",
            self.captured_steps.load(Ordering::Relaxed),
        );
        counter(
            &mut out,
            "spec_decode_draft_probs_device0_positions_total",
            "Verify positions of sampled drafts checked on the first device with logits gathered from another replica (draft_probs_layout=device0).",
            self.draft_probs_device0_positions.load(Ordering::Relaxed),
        );
        gauge(&mut out, "num_requests_running", "Requests running.", self.num_running.load(Ordering::Relaxed));
        gauge(&mut out, "num_requests_waiting", "Requests waiting.", self.num_waiting.load(Ordering::Relaxed));
        gauge(&mut out, "kv_cache_free_blocks", "Free KV-cache blocks.", self.kv_free_blocks.load(Ordering::Relaxed));
        gauge(
            &mut out,
            "kv_cache_total_blocks",
            "KV-cache blocks in the pool.",
            self.kv_total_blocks.load(Ordering::Relaxed),
        );
        {
            let l = self.latency.lock().expect("metrics lock");
            render_histogram(&mut out, &format!("{prefix}_time_to_first_token_seconds"), "Time to first token.", &l.0);
            render_histogram(
                &mut out,
                &format!("{prefix}_e2e_request_latency_seconds"),
                "End-to-end request latency.",
                &l.1,
            );
        }
        let spec = self.spec.lock().expect("metrics lock");
        let spec_prefix = format!("{prefix}_");
        out.push_str(&spec.0.render_prometheus(&spec_prefix));
        out.push_str(&spec.1.render_prometheus(&spec_prefix));
        out
    }
}

fn render_histogram(out: &mut String, name: &str, help: &str, h: &Histogram) {
    out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} histogram\n"));
    for (le, c) in h.cumulative_buckets() {
        let le = if le.is_infinite() { "+Inf".to_string() } else { format!("{le}") };
        out.push_str(&format!("{name}_bucket{{le=\"{le}\"}} {c}\n"));
    }
    out.push_str(&format!("{name}_sum {}\n{name}_count {}\n", h.sum(), h.count()));
}
