//! Where forward passes run: on a worker of rayon's global pool.
//!
//! A step interleaves short serial stretches (norms, small tensor ops, sampling) with parallel
//! kernels. Driven from a thread outside the pool, every parallel kernel wakes the workers and
//! the caller waits; between kernels the idle workers spin and yield on the very cores the
//! caller needs for its serial stretch. Running the whole step on a pool worker makes the
//! caller one of the workers: on the 2-core machine a q8_0 decode step of the default model
//! ran 25–45% faster and a 4-token verify step ~23% faster (docs/BENCHMARKS.md).

/// Runs `f` on a worker of rayon's global pool (inline when already on one) and returns its
/// result.
///
/// `rayon::scope` called from outside the pool hands its closure to a pool worker and blocks
/// the caller until it returns (the documented contrast with `rayon::in_place_scope`, which
/// stays on the calling thread).
pub fn on_compute_pool<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    if rayon::current_thread_index().is_some() { f() } else { rayon::scope(|_| f()) }
}

/// An `[m, n]` f32 output written by several parallel tasks of a CPU kernel, each to its own
/// columns (`skinny`, `skinny_quant`, `packed_quant`).
#[derive(Clone, Copy)]
pub(crate) struct ColumnOutput {
    pub(crate) ptr: *mut f32,
    pub(crate) n: usize,
}

// SAFETY: the kernels' tasks write disjoint columns of the buffer, which outlives them.
unsafe impl Send for ColumnOutput {}
// SAFETY: as above; no task reads what another writes.
unsafe impl Sync for ColumnOutput {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_the_closure_on_a_pool_worker_and_returns_its_result() {
        assert_eq!(rayon::current_thread_index(), None, "tests start outside the pool");
        let (worker, value) = on_compute_pool(|| (rayon::current_thread_index(), 41 + 1));
        assert!(worker.is_some(), "the closure ran outside the pool");
        assert_eq!(value, 42);
        // Nested calls stay on the worker they are made from.
        let nested = on_compute_pool(|| {
            let outer = rayon::current_thread_index();
            (outer, on_compute_pool(rayon::current_thread_index))
        });
        assert_eq!(nested.0, nested.1);
    }
}
