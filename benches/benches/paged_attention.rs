//! CPU paged attention at the default model's shape (SmolLM2-135M: 9 heads over 3 kv heads,
//! head dim 64) for the steps of decoding (1 query per row) and of verifying drafts (K + 1
//! queries per row), at contexts of 256 and 1024 keys.
//!
//! A decode step walks the attention of all 30 layers, whose caches together outgrow the
//! caches of the CPU once the context is long, so each iteration attends over the next of 30
//! layer caches, as a forward does. Throughput is key/value bytes read per second (each key
//! and value of a row read once per step).

use std::hint::black_box;
use std::time::Duration;

use candle_core::{DType, Device, Tensor};
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use specrs_models::attention::{AttentionShape, paged_attention};
use specrs_models::{BatchRow, ForwardBatch, PagedKvCache};

const LAYERS: usize = 30;
const BLOCK: usize = 16;
const SHAPE: AttentionShape = AttentionShape::new(9, 3, 64, 0.125);

/// `rows` rows of `queries` query tokens each, every row with `context` keys (the queries
/// included) in blocks scattered over the cache in reverse order, as a busy cache holds them.
fn batch(rows: usize, queries: usize, context: usize) -> ForwardBatch {
    let blocks_per_row = context.div_ceil(BLOCK);
    let total_blocks = rows * blocks_per_row;
    let mut b = ForwardBatch {
        block_size: BLOCK,
        block_tables: (0..total_blocks as u32).rev().collect(),
        ..Default::default()
    };
    for r in 0..rows {
        let start = b.input_ids.len();
        b.input_ids.extend(std::iter::repeat_n(0, queries));
        b.positions.extend((context - queries..context).map(|p| p as u32));
        b.slot_mapping.extend(std::iter::repeat_n(0, queries));
        b.rows.push(BatchRow {
            query_start: start,
            query_len: queries,
            context_len: context,
            block_table_start: r * blocks_per_row,
            block_table_len: blocks_per_row,
        });
    }
    b
}

fn paged(c: &mut Criterion) {
    let d = SHAPE.head_dim;
    for context in [256, 1024] {
        let mut group = c.benchmark_group(format!("paged_attention/context {context}"));
        for (rows, queries) in [(1, 1), (1, 4), (8, 1), (8, 4)] {
            let b = batch(rows, queries, context);
            let blocks = rows * context.div_ceil(BLOCK);
            let cache = PagedKvCache::new(LAYERS, blocks, BLOCK, SHAPE.num_kv_heads, d, DType::F32, &Device::Cpu)
                .expect("cache");
            for layer in 0..LAYERS {
                let (k, v) = cache.layer(layer);
                let slots = blocks * BLOCK;
                let shape = (slots, SHAPE.num_kv_heads * d);
                k.slice_set(&Tensor::randn(0f32, 1.0, shape, &Device::Cpu).expect("keys"), 0, 0).expect("set");
                v.slice_set(&Tensor::randn(0f32, 1.0, shape, &Device::Cpu).expect("values"), 0, 0).expect("set");
            }
            let q = Tensor::randn(0f32, 1.0, (rows * queries, SHAPE.num_heads, d), &Device::Cpu).expect("queries");
            group.throughput(Throughput::Bytes((rows * context * SHAPE.num_kv_heads * d * 2 * 4) as u64));
            group.bench_with_input(
                BenchmarkId::new(format!("{rows} rows x {queries} queries"), context),
                &q,
                |bench, q| {
                    let mut layer = (0..LAYERS).cycle();
                    bench.iter(|| {
                        let (k, v) = cache.layer(layer.next().unwrap_or(0));
                        black_box(paged_attention(q, k, v, &b, &SHAPE).expect("attention"))
                    })
                },
            );
        }
        group.finish();
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(1))
        .sample_size(20);
    targets = paged
}
criterion_main!(benches);
