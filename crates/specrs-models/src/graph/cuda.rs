//! CUDA-graph capture and replay of fixed-shape steps (CUDA builds only).
//!
//! candle 0.11 has no public graph API, but it has what capture needs: one non-default
//! stream per device, a cache of kernel launch parameters and of small host uploads that a
//! warm-up run fills (`CudaDevice::enable_cuda_graph_htod_cache`), and refusals of
//! host/device copies while a capture is active. The capture here follows the pattern
//! candle-vllm and mistral.rs use on their forks:
//!
//! 1. warm up: run the step once eagerly under the cache guard; its outputs become the
//!    persistent output buffers (allocated outside the graph);
//! 2. capture: run the step again between `begin_capture` and `end_capture` and copy its
//!    results into the output buffers; every tensor allocated inside is also freed inside
//!    (stream-ordered allocation nodes), so the graph owns no memory between replays;
//! 3. replay: [`StepInputs::fill`](super::StepInputs::fill) rewrites the persistent inputs,
//!    one `cuGraphLaunch` re-runs every kernel, the output buffers hold the new logits and
//!    hidden states.
//!
//! Requirements, checked where possible: event tracking must be off for every tensor the
//! step touches (cudarc otherwise makes each op wait on events recorded before the capture,
//! which CUDA rejects as a capture-isolation error): create the device with
//! [`graph_ready_device`] before loading weights. The device must support stream-ordered
//! allocation (every GPU since Pascal with a recent driver does).
//!
//! Status: the capture test (replayed logits equal eager ones) passed on an H200 on
//! 2026-12-04; the engine's use through [`super::FixedSteps`] has not run on a GPU yet.
//! `scripts/gpu-check.sh` runs both.

use candle_core::cuda_backend::cudarc::driver::{CudaGraph, sys};
use candle_core::{Device, Result, Tensor};

use super::{GraphKey, StepInputs};
use crate::batch::ForwardBatch;

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

/// One captured step: its persistent inputs, its graph and its persistent outputs.
pub struct StepGraph {
    inputs: StepInputs,
    graph: CudaGraph,
    outputs: Vec<Tensor>,
}

// SAFETY: CUDA graph objects may be used from any thread but not from two at once (the
// driver does not synchronise them). A `StepGraph` is owned by one engine, which moves
// between its own thread and its compute pool but runs one step at a time, so every use is
// serialised; it is deliberately not `Sync`. `CudaGraph::launch` binds the device's context
// to the calling thread before launching.
unsafe impl Send for StepGraph {}

impl StepGraph {
    /// Captures `step` over `inputs` (already filled with a representative batch: the warm-up
    /// runs it for real). `step` must read step-varying data only from `inputs`, and return
    /// the same number of tensors of the same shapes every time.
    pub fn capture(
        device: &Device,
        inputs: StepInputs,
        step: impl Fn(&StepInputs) -> Result<Vec<Tensor>>,
    ) -> Result<Self> {
        let cuda = device.as_cuda_device()?;
        if cuda.is_event_tracking() {
            candle_core::bail!(
                "CUDA graph capture needs a device without event tracking: create it with graph_ready_device"
            );
        }
        let _cache = cuda.enable_cuda_graph_htod_cache();
        // 1. Warm-up: fills candle's launch-parameter and upload caches; its results are the
        //    persistent output buffers.
        let outputs = step(&inputs)?.into_iter().map(|t| t.contiguous()).collect::<Result<Vec<_>>>()?;
        device.synchronize()?;
        // 2. Capture. The stream must leave capture mode whatever the step did.
        let stream = cuda.cuda_stream();
        stream
            .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(|e| driver_error("begin capture", e))?;
        let recorded = step(&inputs).and_then(|ys| {
            if ys.len() != outputs.len() {
                candle_core::bail!("the captured step returned {} tensors, its warm-up {}", ys.len(), outputs.len());
            }
            ys.iter().zip(&outputs).try_for_each(|(y, out)| out.slice_set(y, 0, 0))
        });
        let graph = stream.end_capture(sys::CUgraphInstantiate_flags(0)).map_err(|e| driver_error("end capture", e));
        recorded?;
        let graph = graph?.ok_or_else(|| driver_error("capture", "no work was recorded"))?;
        graph.upload().map_err(|e| driver_error("upload", e))?;
        Ok(Self { inputs, graph, outputs })
    }

    pub fn key(&self) -> GraphKey {
        self.inputs.key
    }

    pub fn inputs(&self) -> &StepInputs {
        &self.inputs
    }

    /// Writes `batch` into the persistent inputs and replays the step. The returned outputs
    /// (rows in the fixed layout, see `graph::fixed_output_row`) are overwritten by the next
    /// replay.
    pub fn replay(&self, batch: &ForwardBatch) -> Result<&[Tensor]> {
        self.inputs.fill(batch)?;
        self.graph.launch().map_err(|e| driver_error("launch", e))?;
        Ok(&self.outputs)
    }
}
