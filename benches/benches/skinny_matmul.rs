//! Skinny quantized matmuls `x [m, k] · wᵀ` at the default model's shapes (SmolLM2-135M:
//! hidden 576, intermediate 1536, vocab 49152), for the row counts of decoding (m = 1) and of
//! verifying drafts (m = K + 1): candle's `QMatMul::forward` against
//! `specrs_models::skinny_quant::matmul_t` (GGUF layout) and `specrs_models::packed_quant`
//! (tiles of 16 rows: AVX-512 VNNI where the CPU has it, AVX2 otherwise), with Q8_0, Q4_0 and
//! Q4_1 weights.
//!
//! Decoding streams the whole model (about 145 MB in Q8_0) from memory every step, far more than
//! the 32 MB L3, so each iteration uses the next of enough copies of the weight to stay out of
//! the caches too. Throughput is weight bytes per second.

use std::borrow::Cow;
use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use candle_core::quantized::{GgmlDType, QMatMul, QStorage, QTensor};
use candle_core::{Device, Module, Tensor};
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use specrs_models::packed_quant::PackedQ;
use specrs_models::skinny_quant;

/// `(name, n, k)` of `w [n, k]`.
const SHAPES: [(&str, usize, usize); 5] = [
    ("qkv", 960, 576),
    ("o_proj", 576, 576),
    ("gate_up", 3072, 576),
    ("down_proj", 576, 1536),
    ("lm_head", 49_152, 576),
];

const ROWS: [usize; 6] = [1, 2, 4, 5, 8, 16];

/// Bytes of weight copies cycled through, so that reads come from DRAM.
const COLD_BYTES: usize = 128 << 20;

/// Copies of `w [n, k]` quantized to `dtype`, `COLD_BYTES` in all (at least two).
fn cold_copies(dtype: GgmlDType, n: usize, k: usize) -> Vec<Arc<QTensor>> {
    let w = Tensor::randn(0f32, 1.0, (n, k), &Device::Cpu).expect("random weight");
    let bytes = QTensor::quantize(&w, dtype).expect("quantize").data().expect("cpu bytes").into_owned();
    (0..(COLD_BYTES / bytes.len()).max(2))
        .map(|_| {
            let storage = QStorage::from_data(Cow::Borrowed(&bytes), &Device::Cpu, dtype).expect("storage");
            Arc::new(QTensor::new(storage, (n, k)).expect("qtensor"))
        })
        .collect()
}

fn skinny_matmul(c: &mut Criterion) {
    for dtype in [GgmlDType::Q8_0, GgmlDType::Q4_0, GgmlDType::Q4_1] {
        for (name, n, k) in SHAPES {
            let weights = cold_copies(dtype, n, k);
            let packed: Vec<PackedQ> = weights.iter().filter_map(|w| PackedQ::pack(w).expect("pack")).collect();
            let candle: Vec<QMatMul> = weights.iter().map(|w| QMatMul::from_arc(w.clone()).expect("qmatmul")).collect();
            let mut group = c.benchmark_group(format!("{dtype:?}/{name} {n}x{k}"));
            group.throughput(Throughput::Bytes(weights[0].storage_size_in_bytes() as u64));
            for m in ROWS {
                let x = Tensor::randn(0f32, 1.0, (m, k), &Device::Cpu).expect("random activations");
                group.bench_with_input(BenchmarkId::new("candle", m), &x, |b, x| {
                    let mut next = (0..candle.len()).cycle();
                    b.iter(|| black_box(candle[next.next().unwrap_or(0)].forward(x).expect("candle matmul")))
                });
                group.bench_with_input(BenchmarkId::new("skinny", m), &x, |b, x| {
                    let mut next = (0..weights.len()).cycle();
                    b.iter(|| {
                        let w = &weights[next.next().unwrap_or(0)];
                        black_box(skinny_quant::matmul_t(x, w).expect("skinny matmul").expect("served"))
                    })
                });
                if !packed.is_empty() {
                    group.bench_with_input(BenchmarkId::new("packed", m), &x, |b, x| {
                        let mut next = (0..packed.len()).cycle();
                        b.iter(|| {
                            let w = &packed[next.next().unwrap_or(0)];
                            black_box(w.matmul_t(x).expect("packed matmul").expect("served"))
                        })
                    });
                }
            }
            group.finish();
        }
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(1))
        .sample_size(20);
    targets = skinny_matmul
}
criterion_main!(benches);
