//! Single-stream decode speed of a checkpoint: `cargo run --release -p specrs-models --example
//! decode_speed -- <model.gguf|dir> [dtype] [new_tokens] [batch]`.

use std::time::Instant;

use candle_core::Device;
use specrs_core::model_alias::resolve_model;
use specrs_models::{BatchRow, ForwardBatch, ModelDType, load_causal_lm};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let path = resolve_model(args.get(1).map_or("smollm2-135m-instruct", String::as_str))?;
    let dtype: ModelDType = args.get(2).map_or("auto", String::as_str).parse()?;
    let new_tokens: usize = args.get(3).map_or(Ok(128), |s| s.parse())?;
    let batch_size: usize = args.get(4).map_or(Ok(1), |s| s.parse())?;
    // Tokens each row feeds per step: 1 for decoding, K + 1 for verifying K drafts.
    let per_step: usize = args.get(5).map_or(Ok(1), |s| s.parse())?;
    let t0 = Instant::now();
    let (model, _) = load_causal_lm(&path, &Device::Cpu, dtype)?;
    println!(
        "loaded {} as {dtype} in {:.2}s ({} MB of weights)",
        path.display(),
        t0.elapsed().as_secs_f64(),
        model.weight_bytes() / 1_000_000
    );
    let block = 16;
    let prompt_len = 40;
    let per_seq_blocks = (prompt_len + new_tokens * per_step).div_ceil(block);
    let kv = model.new_kv_cache(per_seq_blocks * batch_size, block)?;
    let tables: Vec<u32> = (0..(per_seq_blocks * batch_size) as u32).collect();
    let make = |tokens_per_row: usize, cached: usize| {
        let mut b = ForwardBatch { block_size: block, block_tables: tables.clone(), ..Default::default() };
        for r in 0..batch_size {
            let start = b.input_ids.len();
            for j in 0..tokens_per_row {
                let pos = cached + j;
                b.input_ids.push(((r * 7 + pos * 13) % 4000 + 100) as u32);
                b.positions.push(pos as u32);
                b.slot_mapping.push(((r * per_seq_blocks + pos / block) * block + pos % block) as u32);
            }
            b.rows.push(BatchRow {
                query_start: start,
                query_len: tokens_per_row,
                context_len: cached + tokens_per_row,
                block_table_start: r * per_seq_blocks,
                block_table_len: per_seq_blocks,
            });
            b.logits_indices.extend((start..start + tokens_per_row).map(|i| i as u32));
        }
        b
    };
    let t0 = Instant::now();
    specrs_models::on_compute_pool(|| model.forward(&make(prompt_len, 0), &kv))?;
    let prefill = t0.elapsed().as_secs_f64();
    let t0 = Instant::now();
    // Like the engine, run the steps on a compute-pool worker (specrs_models::compute).
    specrs_models::on_compute_pool(|| -> anyhow::Result<()> {
        for step in 0..new_tokens {
            model.forward(&make(per_step, prompt_len + step * per_step), &kv)?;
        }
        Ok(())
    })?;
    let decode = t0.elapsed().as_secs_f64();
    println!(
        "prefill {} x {prompt_len} tokens: {:.1} tok/s; batch {batch_size} x {per_step} tokens/step: {:.1} steps/s, {:.1} rows/s",
        batch_size,
        (batch_size * prompt_len) as f64 / prefill,
        new_tokens as f64 / decode,
        (new_tokens * batch_size) as f64 / decode
    );
    Ok(())
}
