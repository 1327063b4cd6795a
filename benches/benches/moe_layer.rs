//! One sparse feed-forward (`specrs_models::moe::SparseMoe`) at Qwen3-30B-A3B's expert shape
//! (hidden 2048, experts 768 wide, top-8 of the router's softmax, renormalised) with Q4_0
//! experts, the format CPU users run that model in: the rows of a decode step (1), of a verify
//! step (K + 1 = 4) and of batches (8, 32). 32 experts (85 MB of weights, well past the 32 MB
//! L3) keep each step's expert reads coming from memory, as the model's 128 do.
//!
//! The floor is the experts a step touches, read once: 8 of them (2.6 MB) for one token, up to
//! all 32 for a batch. Throughput below is those bytes per second, so the gap to the machine's
//! ~28 GB/s is what routing, gathering rows and scattering them back cost.

use std::hint::black_box;
use std::time::Duration;

use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{Device, Tensor};
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use specrs_models::MoeConfig;
use specrs_models::linear::{FusedLinear, Linear, LinearWeight};
use specrs_models::models::transformer::Mlp;
use specrs_models::moe::SparseMoe;

const HIDDEN: usize = 2048;
const EXPERT: usize = 768;
const EXPERTS: usize = 32;
const TOP_K: usize = 8;

fn q4(rows: usize, cols: usize, seed: f64) -> LinearWeight {
    let w =
        (Tensor::randn(0f32, 1.0, (rows, cols), &Device::Cpu).expect("weight") * (0.02 + seed * 1e-4)).expect("scale");
    let q = QTensor::quantize(&w, GgmlDType::Q4_0).expect("quantize");
    LinearWeight::Quantized(QMatMul::from_qtensor(q).expect("qmatmul")).packed_for_cpu().expect("pack")
}

fn mixture() -> SparseMoe {
    let experts = (0..EXPERTS)
        .map(|e| {
            let gate_up = Linear::new(q4(2 * EXPERT, HIDDEN, e as f64), None, 2 * EXPERT, HIDDEN);
            let down = Linear::new(q4(HIDDEN, EXPERT, e as f64), None, HIDDEN, EXPERT);
            Mlp::new(FusedLinear::stacked(gate_up, vec![EXPERT, EXPERT]).expect("split"), down)
        })
        .collect();
    let router = Tensor::randn(0f32, 1.0, (EXPERTS, HIDDEN), &Device::Cpu).expect("router");
    let config = MoeConfig::softmax_everywhere(EXPERTS, TOP_K, EXPERT, true);
    SparseMoe::from_parts(Linear::new(LinearWeight::Dense(router), None, EXPERTS, HIDDEN), experts, None, config)
}

fn moe_layer(c: &mut Criterion) {
    let moe = mixture();
    let expert_bytes = moe.size_in_bytes() / EXPERTS;
    let mut group = c.benchmark_group(format!("Q4_0 experts {EXPERTS}x({HIDDEN}->{EXPERT}), top-{TOP_K}"));
    for rows in [1usize, 4, 8, 32] {
        // Bytes of the experts the rows can touch at most: the floor a step reads.
        group.throughput(Throughput::Bytes((expert_bytes * (rows * TOP_K).min(EXPERTS)) as u64));
        let inputs: Vec<Tensor> =
            (0..16).map(|_| Tensor::randn(0f32, 1.0, (rows, HIDDEN), &Device::Cpu).expect("activations")).collect();
        group.bench_with_input(BenchmarkId::new("forward", rows), &inputs, |b, inputs| {
            let mut next = inputs.iter().cycle();
            b.iter(|| black_box(moe.forward(next.next().expect("cycle")).expect("forward")))
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(4));
    targets = moe_layer
}
criterion_main!(benches);
