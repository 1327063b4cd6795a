//! Suffix decoding's host-side cost per decode step and per request, on text-like token
//! streams: sequences are phrases of 3-12 tokens drawn from a pool of 400 (Zipf-like, so some
//! repeat often), over the default model's vocabulary. Measured:
//!
//! - a request's own tree from a 2048-token prompt (paid once, when the request starts);
//! - one step of a running request: append its new token to its own tree and to a shared tree
//!   holding 1000 earlier outputs of 256 tokens, then speculate (both trees, depth 24);
//! - one eviction: removing a 256-token output from that shared tree.
//!
//! The setup prints the shared tree's nodes per stored token (its memory, at ~48 bytes a node).

use std::hint::black_box;

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use specrs_core::sampling::{RngStream, uniform};
use specrs_core::suffix::{SuffixCache, SuffixCacheConfig, SuffixTree};

const VOCAB: u32 = 49_152;
const PHRASES: usize = 400;
const DEPTH: usize = 24;

fn phrase_pool() -> Vec<Vec<u32>> {
    (0..PHRASES as u64)
        .map(|p| {
            let len = 3 + (uniform(p, RngStream::Synthetic, 0) * 10.0) as usize;
            (0..len as u64).map(|i| (uniform(p, RngStream::Draft, i) * f64::from(VOCAB)) as u32).collect()
        })
        .collect()
}

/// `len` tokens of phrases, phrase `i` drawn with weight `1 / (i + 1)`.
fn text(pool: &[Vec<u32>], seed: u64, len: usize) -> Vec<u32> {
    let harmonic: f64 = (1..=pool.len()).map(|i| 1.0 / i as f64).sum();
    let mut out = Vec::with_capacity(len + 12);
    let mut draw = 0;
    while out.len() < len {
        let mut u = uniform(seed, RngStream::Verdict, draw) * harmonic;
        draw += 1;
        let pick = (0..pool.len())
            .find(|&i| {
                u -= 1.0 / (i + 1) as f64;
                u <= 0.0
            })
            .unwrap_or(pool.len() - 1);
        out.extend(&pool[pick]);
    }
    out.truncate(len);
    out
}

fn config() -> SuffixCacheConfig {
    SuffixCacheConfig { max_tree_depth: DEPTH, max_cached_requests: 1000, max_spec_factor: 1.0, min_token_prob: 0.1 }
}

fn bench_suffix(c: &mut Criterion) {
    let pool = phrase_pool();
    let prompt = text(&pool, 1, 2048);
    c.bench_function("suffix/own tree from a 2048-token prompt", |b| {
        b.iter(|| {
            let mut cache = SuffixCache::new(SuffixCacheConfig { max_cached_requests: 0, ..config() });
            cache.start_request(0, black_box(&prompt));
            cache
        })
    });

    let mut cache = SuffixCache::new(config());
    for request in 1..=1000u64 {
        cache.start_request(request, &[]);
        cache.add_output(request, &text(&pool, 100 + request, 256));
        cache.stop_request(request);
    }
    let mut shared = SuffixTree::new(DEPTH);
    for request in 1..=1000u64 {
        shared.extend(request, &text(&pool, 100 + request, 256));
    }
    eprintln!(
        "shared tree: {} outputs, {} tokens, {} nodes ({:.2} per token)",
        cache.num_cached(),
        shared.num_tokens(),
        shared.num_nodes(),
        shared.num_nodes() as f64 / shared.num_tokens() as f64
    );

    let running = 5000u64;
    let answer = text(&pool, 7, 4096);
    let mut context = prompt[..512].to_vec();
    cache.start_request(running, &context);
    let mut step = 0;
    c.bench_function("suffix/decode step: append one token, speculate over own + 1000 outputs", |b| {
        b.iter(|| {
            let token = answer[step % answer.len()];
            step += 1;
            context.push(token);
            cache.add_output(running, &[token]);
            black_box(cache.speculate(running, &context, DEPTH))
        })
    });

    let output = text(&pool, 9, 256);
    c.bench_function("suffix/evict a 256-token output from 1000", |b| {
        b.iter_batched(
            || {
                let mut tree = shared.clone();
                tree.extend(0, &output);
                tree
            },
            |mut tree| {
                tree.remove(black_box(0));
                tree
            },
            BatchSize::LargeInput,
        )
    });
}

criterion_group!(benches, bench_suffix);
criterion_main!(benches);
