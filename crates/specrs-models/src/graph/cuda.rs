//! CUDA-graph capture and replay of fixed-shape steps (CUDA builds only).
//!
//! candle 0.11 has no public graph API, but it has what capture needs: one non-default
//! stream per device, a cache of kernel launch parameters and of small host uploads that a
//! warm-up run fills (`CudaDevice::enable_cuda_graph_htod_cache`), and refusals of
//! host/device copies while a capture is active. The capture here follows the pattern
//! candle-vllm and mistral.rs use on their forks:
//!
//! 1. warm up: run the step once eagerly under the cache guard; its output becomes the
//!    persistent output buffer (allocated outside the graph);
//! 2. capture: run the step again between `begin_capture` and `end_capture` and copy its
//!    result into the output buffer; every tensor allocated inside is also freed inside
//!    (stream-ordered allocation nodes), so the graph owns no memory between replays;
//! 3. replay: [`StepInputs::fill`](super::StepInputs::fill) rewrites the persistent inputs,
//!    one `cuGraphLaunch` re-runs every kernel, the output buffer holds the new logits.
//!
//! Requirements, checked where possible: event tracking must be off for every tensor the
//! step touches (cudarc otherwise makes each op wait on events recorded before the capture,
//! which CUDA rejects as a capture-isolation error): create the device with
//! [`graph_ready_device`] before loading weights. The device must support stream-ordered
//! allocation (every GPU since Pascal with a recent driver does).
//!
//! Status: compiled in CUDA builds; not yet run on a GPU (no GPU on the build machines).
//! `scripts/gpu-check.sh` runs the capture test that compares replayed logits with eager ones.

use std::collections::HashMap;

use candle_core::cuda_backend::cudarc::driver::{CudaGraph, sys};
use candle_core::{Device, Result, Tensor};

use super::{CapturePlan, GraphKey, StepInputs};
use crate::batch::ForwardBatch;
use crate::kv_cache::PagedKvCache;
use crate::models::CausalLm;

fn driver_error(what: &str, e: impl std::fmt::Debug) -> candle_core::Error {
    candle_core::Error::Msg(format!("CUDA graph {what}: {e:?}"))
}

/// A CUDA device whose tensors do not track their uses with events, as graph capture needs.
pub fn graph_ready_device(ordinal: usize) -> Result<Device> {
    let device = Device::new_cuda(ordinal)?;
    // SAFETY: event tracking only synchronises tensors used on several streams. Everything
    // spec-rs runs on a device goes through candle's single stream for that device, where
    // stream order already orders every use; no tensor exists yet whose tracking would be
    // left half-recorded.
    unsafe { device.as_cuda_device()?.disable_event_tracking() };
    Ok(device)
}

/// One captured step: its persistent inputs, its graph and its persistent output.
pub struct StepGraph {
    inputs: StepInputs,
    graph: CudaGraph,
    output: Tensor,
}

impl StepGraph {
    /// Captures `step` over `inputs` (already filled with a representative batch: the warm-up
    /// runs it for real). `step` must read step-varying data only from `inputs`.
    pub fn capture(device: &Device, inputs: StepInputs, step: impl Fn(&StepInputs) -> Result<Tensor>) -> Result<Self> {
        let cuda = device.as_cuda_device()?;
        if cuda.is_event_tracking() {
            candle_core::bail!(
                "CUDA graph capture needs a device without event tracking: create it with graph_ready_device"
            );
        }
        let _cache = cuda.enable_cuda_graph_htod_cache();
        // 1. Warm-up: fills candle's launch-parameter and upload caches; its result is the
        //    persistent output buffer.
        let output = step(&inputs)?.contiguous()?;
        device.synchronize()?;
        // 2. Capture. The stream must leave capture mode whatever the step did.
        let stream = cuda.cuda_stream();
        stream
            .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(|e| driver_error("begin capture", e))?;
        let recorded = step(&inputs).and_then(|y| output.slice_set(&y, 0, 0));
        let graph = stream.end_capture(sys::CUgraphInstantiate_flags(0)).map_err(|e| driver_error("end capture", e));
        recorded?;
        let graph = graph?.ok_or_else(|| driver_error("capture", "no work was recorded"))?;
        graph.upload().map_err(|e| driver_error("upload", e))?;
        Ok(Self { inputs, graph, output })
    }

    pub fn key(&self) -> GraphKey {
        self.inputs.key
    }

    pub fn inputs(&self) -> &StepInputs {
        &self.inputs
    }

    /// Writes `batch` into the persistent inputs and replays the step. The returned logits
    /// (`[B · (W + 1), V]`, see `graph::fixed_output_row`) are overwritten by the next replay.
    pub fn replay(&self, batch: &ForwardBatch) -> Result<&Tensor> {
        self.inputs.fill(batch)?;
        self.graph.launch().map_err(|e| driver_error("launch", e))?;
        Ok(&self.output)
    }
}

/// The captured decode/verify graphs of one model and KV cache.
pub struct GraphRunner {
    plan: CapturePlan,
    graphs: HashMap<GraphKey, StepGraph>,
}

impl GraphRunner {
    /// Captures every key of `plan` for `model` over `kv`, with a context capacity of
    /// `max_keys` per row; padding writes to `scratch_slot` (which no sequence may own).
    /// Each key is warmed up and captured on a dummy batch of padding rows only.
    pub fn capture(
        model: &CausalLm,
        kv: &PagedKvCache,
        plan: CapturePlan,
        max_keys: usize,
        scratch_slot: u32,
    ) -> Result<Self> {
        let mut graphs = HashMap::new();
        for key in plan.keys() {
            let inputs = StepInputs::new(key, max_keys, scratch_slot, model.device())?;
            inputs.fill(&ForwardBatch { block_size: kv.block_size(), ..Default::default() })?;
            let graph = StepGraph::capture(model.device(), inputs, |i| model.forward_fixed(i, kv))?;
            graphs.insert(key, graph);
        }
        Ok(Self { plan, graphs })
    }

    pub fn plan(&self) -> &CapturePlan {
        &self.plan
    }

    /// Replays the graph serving a decode step of `batch` (rows verifying `width` drafts at
    /// most), or `None` when no captured graph fits it (run it eagerly then).
    pub fn run(&self, batch: &ForwardBatch, width: usize) -> Result<Option<(GraphKey, &Tensor)>> {
        let Some(key) = self.plan.key_for(batch.rows.len(), width) else { return Ok(None) };
        let graph = &self.graphs[&key];
        if !graph.inputs().fits(batch) {
            return Ok(None);
        }
        Ok(Some((key, graph.replay(batch)?)))
    }
}
