//! Self-distillation data: the target answers the training prompts through the engine's
//! batched generation (greedy, with the model's chat template), and its hidden-state taps and
//! final hidden state over prompt + answer are extracted once. Both stages cache to disk and
//! resume where they stopped.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use serde::{Deserialize, Serialize};
use specrs_core::sampling::SamplingParams;
use specrs_models::{BatchRow, CausalLm, ForwardBatch};

use crate::chat_template::ChatMessage;
use crate::error::{EngineError, Result};
use crate::handle::EngineHandle;
use crate::request::{GenerationRequest, Prompt};

/// One self-distilled conversation: the chat-formatted prompt and the target's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sample {
    pub prompt: String,
    pub prompt_ids: Vec<u32>,
    pub response_ids: Vec<u32>,
}

impl Sample {
    pub fn tokens(&self) -> Vec<u32> {
        let mut t = self.prompt_ids.clone();
        t.extend_from_slice(&self.response_ids);
        t
    }
}

fn io(path: &Path, e: std::io::Error) -> EngineError {
    EngineError::Internal(format!("{}: {e}", path.display()))
}

/// Reads the samples generated so far (one JSON object per line).
pub fn read_samples(path: &Path) -> Result<Vec<Sample>> {
    if !path.exists() {
        return Ok(Vec::new());
    }
    let file = File::open(path).map_err(|e| io(path, e))?;
    let mut out = Vec::new();
    for line in BufReader::new(file).lines() {
        let line = line.map_err(|e| io(path, e))?;
        // A line cut short by an interrupted run is dropped and regenerated.
        if let Ok(s) = serde_json::from_str::<Sample>(&line) {
            out.push(s);
        }
    }
    Ok(out)
}

/// Answers every prompt not yet in `path` with the target (greedy, chat template), appending
/// each finished batch so an interrupted run resumes.
pub fn generate_samples(
    handle: &EngineHandle,
    prompts: &[String],
    max_new_tokens: usize,
    batch: usize,
    path: &Path,
    progress: &dyn Fn(usize, usize),
) -> Result<Vec<Sample>> {
    let mut samples = read_samples(path)?;
    let done: std::collections::HashSet<String> = samples.iter().map(|s| s.prompt.clone()).collect();
    let todo: Vec<&String> = prompts.iter().filter(|p| !done.contains(*p)).collect();
    let mut file = OpenOptions::new().create(true).append(true).open(path).map_err(|e| io(path, e))?;
    progress(samples.len(), prompts.len());
    for chunk in todo.chunks(batch.max(1)) {
        let requests: Vec<GenerationRequest> = chunk
            .iter()
            .map(|p| {
                let mut r = GenerationRequest::new(
                    Prompt::Chat(vec![ChatMessage::new("user", p.as_str())].into()),
                    SamplingParams { temperature: 0.0, max_tokens: Some(max_new_tokens), ..SamplingParams::default() },
                );
                r.trace = false;
                r
            })
            .collect();
        let outs = handle.generate(requests)?;
        for (p, out) in chunk.iter().zip(outs) {
            let text = handle.tokenizer().apply_chat_template(&[ChatMessage::new("user", p.as_str())], true)?;
            let prompt_ids = handle.tokenizer().encode_chat(&text)?;
            let s = Sample { prompt: (*p).clone(), prompt_ids, response_ids: out.token_ids };
            writeln!(file, "{}", serde_json::to_string(&s).expect("samples serialise")).map_err(|e| io(path, e))?;
            samples.push(s);
        }
        file.flush().map_err(|e| io(path, e))?;
        progress(samples.len(), prompts.len());
    }
    Ok(samples)
}

/// The draft vocabulary: `always` (the EOS ids, so a draft can propose the end of an answer,
/// or a vocabulary being grown) filled up to `size` with the most frequent response tokens,
/// sorted by id.
pub fn draft_vocabulary(samples: &[Sample], size: usize, always: &[u32]) -> Vec<u32> {
    let mut counts: HashMap<u32, u64> = HashMap::new();
    for s in samples {
        for &t in &s.response_ids {
            *counts.entry(t).or_default() += 1;
        }
    }
    let mut by_count: Vec<(u32, u64)> = counts.into_iter().collect();
    by_count.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let mut vocab: Vec<u32> = always.to_vec();
    let mut chosen: std::collections::HashSet<u32> = always.iter().copied().collect();
    for (t, _) in by_count {
        if vocab.len() >= size {
            break;
        }
        if chosen.insert(t) {
            vocab.push(t);
        }
    }
    vocab.sort_unstable();
    vocab.truncate(size);
    vocab
}

/// Extracted target features of one sample.
pub struct Features {
    /// `[len, taps * hidden]` f16: the tapped residual streams, concatenated low to high.
    pub taps: Tensor,
    /// `[len, hidden]` f16: the final normed hidden state (target logits = lm_head of it).
    pub final_hidden: Tensor,
}

/// Runs the target over every sample (many per forward) and stores taps and final hidden
/// states in safetensors shards under `dir`; shards already written are reused.
pub fn extract_features(
    target: &CausalLm,
    samples: &[Sample],
    taps: &[usize],
    dir: &Path,
    shard_size: usize,
    progress: &dyn Fn(usize, usize),
) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
    let block = 16;
    let mut shards = Vec::new();
    for (shard_idx, shard) in samples.chunks(shard_size).enumerate() {
        let path = dir.join(format!("features-{shard_idx:05}.safetensors"));
        shards.push(path.clone());
        if path.exists() {
            progress((shard_idx + 1) * shard_size, samples.len());
            continue;
        }
        let mut tensors: HashMap<String, Tensor> = HashMap::new();
        // A few sequences per forward keeps matmuls wide without a huge KV cache.
        for (group_idx, group) in shard.chunks(8).enumerate() {
            let seqs: Vec<Vec<u32>> = group.iter().map(Sample::tokens).collect();
            let blocks: Vec<usize> = seqs.iter().map(|s| s.len().div_ceil(block)).collect();
            let kv = target.new_kv_cache(blocks.iter().sum(), block)?;
            let mut batch =
                ForwardBatch { block_size: block, taps: taps.to_vec(), want_final_hidden: true, ..Default::default() };
            let mut first_block = 0u32;
            for (s, &nb) in seqs.iter().zip(&blocks) {
                let start = batch.input_ids.len();
                batch.input_ids.extend_from_slice(s);
                batch.positions.extend(0..s.len() as u32);
                batch.slot_mapping.extend((0..s.len() as u32).map(|p| first_block * block as u32 + p));
                batch.rows.push(BatchRow {
                    query_start: start,
                    query_len: s.len(),
                    context_len: s.len(),
                    block_table_start: batch.block_tables.len(),
                    block_table_len: nb,
                });
                batch.block_tables.extend(first_block..first_block + nb as u32);
                first_block += nb as u32;
            }
            let out = target.forward(&batch, &kv)?;
            let cat = Tensor::cat(&out.taps, 1)?.to_dtype(DType::F16)?;
            let fin = out.final_hidden.expect("asked for").to_dtype(DType::F16)?;
            for (i, row) in batch.rows.iter().enumerate() {
                let id = group_idx * 8 + i;
                tensors.insert(format!("{id}.taps"), cat.narrow(0, row.query_start, row.query_len)?.contiguous()?);
                tensors.insert(format!("{id}.final"), fin.narrow(0, row.query_start, row.query_len)?.contiguous()?);
            }
        }
        let tmp = path.with_extension("tmp");
        candle_core::safetensors::save(&tensors, &tmp)?;
        std::fs::rename(&tmp, &path).map_err(|e| io(&path, e))?;
        progress(((shard_idx + 1) * shard_size).min(samples.len()), samples.len());
    }
    Ok(shards)
}

/// Loads every sample's features from the shards written by [`extract_features`].
pub fn load_features(shards: &[PathBuf], shard_size: usize, count: usize) -> Result<Vec<Features>> {
    let mut out = Vec::with_capacity(count);
    for (shard_idx, path) in shards.iter().enumerate() {
        let map = candle_core::safetensors::load(path, &Device::Cpu)?;
        let n = shard_size.min(count - shard_idx * shard_size);
        for id in 0..n {
            let get = |k: &str| {
                map.get(&format!("{id}.{k}")).cloned().ok_or_else(|| {
                    EngineError::Internal(format!(
                        "{}: missing {id}.{k}; delete the shard to regenerate it",
                        path.display()
                    ))
                })
            };
            out.push(Features { taps: get("taps")?, final_hidden: get("final")? });
        }
    }
    Ok(out)
}
