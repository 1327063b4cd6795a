//! `spec-rs train-draft`: trains an EAGLE-3 draft head for a target on CPU, from data the
//! target itself generates, and writes it in the speculators `eagle3` format the engine loads.
//!
//! 1. Prompts ([`prompts`]) → the target answers them greedily with its chat template through
//!    the engine's batched generation ([`data::generate_samples`], cached, resumable).
//! 2. The draft vocabulary is the most frequent answer tokens (`d2t` maps it to target ids).
//! 3. The target's taps (HF hidden_states `[2, L/2, L-3]` by default) and final hidden state
//!    are extracted once per sample ([`data::extract_features`], cached shards).
//! 4. Training-time-test unrolling over `ttt_steps`, soft cross-entropy against the target's
//!    distribution over the draft vocabulary on answer tokens, step weights `0.8^s`, AdamW,
//!    warmup + cosine schedule, gradient clipping; checkpoints to resume.
//! 5. Export ([`export`]) and held-out evaluation through the engine's EAGLE pipeline.

pub mod data;
pub mod eagle3;
pub mod export;
pub mod prompts;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use candle_core::{DType, Device, Tensor};
use candle_nn::{AdamW, Optimizer, ParamsAdamW, VarBuilder, VarMap};
use serde::{Deserialize, Serialize};
use specrs_models::models::transformer::LogitsHead;
use specrs_models::{CausalLm, ModelDType};

use crate::error::{EngineError, Result};
use crate::handle::EngineHandle;
use crate::pipeline::{PipelineConfig, build_engine};
use data::{Features, Sample};
use eagle3::{Eagle3Shape, TrainableEagle3, soft_cross_entropy};

/// Everything `train-draft` can be told.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainDraftConfig {
    /// Target: alias, GGUF file or checkpoint directory.
    pub model: String,
    /// Weights the target generates data with (what it will be served with).
    pub dtype: ModelDType,
    /// Where the trained draft (config.json + model.safetensors) is written.
    pub output: PathBuf,
    /// Cache of samples, features and checkpoints (resumable).
    pub work_dir: PathBuf,
    /// A speculators `eagle3` draft to continue training (its taps, vocabulary and weights);
    /// `None` starts from random weights and the target's head.
    #[serde(default)]
    pub init_from: Option<PathBuf>,
    /// Prompts at the head of the seeded shuffle to pass over, so a round continuing a draft
    /// (`init_from`) can train on prompts the earlier rounds never answered.
    #[serde(default)]
    pub skip_prompts: usize,
    /// A file of the user's own prompts ([`prompts::prompts_from_file`]) in place of the
    /// project's lists; `skip_prompts` and `num_prompts` select from it the same way.
    #[serde(default)]
    pub prompts_file: Option<PathBuf>,
    pub num_prompts: usize,
    pub max_new_tokens: usize,
    /// HF hidden_states indices to tap; default `[2, L/2, L-3]`.
    pub taps: Option<Vec<usize>>,
    /// Tokens of the draft vocabulary. With `init_from`, a size above the draft's grows its
    /// vocabulary (its trained rows kept); a smaller one keeps the draft's.
    pub draft_vocab_size: usize,
    pub intermediate_size: Option<usize>,
    /// Decoder layers of the head; `None` takes the `init_from` draft's (or 1). More than the
    /// `init_from` draft has grows it: the new layers start as identities (zero output
    /// projections), so training continues from the draft's own predictions.
    #[serde(default)]
    pub num_layers: Option<usize>,
    pub ttt_steps: usize,
    pub epochs: f64,
    pub learning_rate: f64,
    pub warmup_fraction: f64,
    /// Sequences per optimizer step.
    pub batch_size: usize,
    pub grad_clip: f64,
    /// Width written into the checkpoint's speculators config.
    pub num_speculative_tokens: usize,
    pub seed: u64,
    /// Generation batch (engine max_num_seqs).
    pub generation_batch: usize,
}

impl Default for TrainDraftConfig {
    fn default() -> Self {
        Self {
            model: specrs_core::model_alias::DEFAULT_MODEL_ALIAS.into(),
            dtype: ModelDType::Auto,
            output: PathBuf::from("draft-eagle3"),
            work_dir: PathBuf::from(".spec-rs-train"),
            init_from: None,
            skip_prompts: 0,
            prompts_file: None,
            num_prompts: 2000,
            max_new_tokens: 128,
            taps: None,
            draft_vocab_size: 8192,
            intermediate_size: None,
            num_layers: None,
            ttt_steps: 4,
            epochs: 3.0,
            learning_rate: 5e-4,
            warmup_fraction: 0.04,
            batch_size: 8,
            grad_clip: 1.0,
            num_speculative_tokens: 3,
            seed: 7,
            generation_batch: 64,
        }
    }
}

/// What training produced.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainReport {
    pub samples: usize,
    pub response_tokens: usize,
    pub steps: usize,
    pub final_loss: f64,
    /// Training top-1 agreement per TTT step over the last epoch.
    pub top1_per_step: Vec<f64>,
    pub output: PathBuf,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct CheckpointState {
    step: usize,
    config: TrainDraftConfig,
}

/// Reports progress (stage, done, total, message).
pub type Progress<'a> = &'a (dyn Fn(&str, usize, usize, &str) + Sync);

/// The frozen target pieces training reads.
struct TargetParts {
    /// `[V, H]` f32 embedding.
    embed: Tensor,
    /// The target's output head over the draft vocabulary, with its logit transforms (Phi's
    /// bias, Granite's divisor, Gemma 2's soft cap): the draft learns the target's ranking.
    head: LogitsHead,
    /// `[Vd, H]` f32 rows a fresh draft head starts from (scaled by Granite's divisor).
    head_rows: Tensor,
}

fn target_parts(target: &CausalLm, vocab: &[u32]) -> Result<TargetParts> {
    let embed = target.embed_tokens().dense(&Device::Cpu)?.to_dtype(DType::F32)?;
    let head = target.logits_head().rows(vocab, &Device::Cpu)?;
    let head_rows = head.scaled_weight(&Device::Cpu)?;
    Ok(TargetParts { embed, head, head_rows })
}

/// The output head of a draft whose vocabulary grew from `old_vocab` to `vocab` (both target
/// ids, ascending): the trained row of every token the draft had, the target's row
/// (`target_rows`, over `vocab`) for each new one.
fn grown_head_rows(old_head: &Tensor, old_vocab: &[u32], target_rows: &Tensor, vocab: &[u32]) -> Result<Tensor> {
    let old_len = old_vocab.len();
    let index: Vec<u32> = vocab
        .iter()
        .enumerate()
        .map(|(j, t)| match old_vocab.binary_search(t) {
            Ok(i) => i as u32,
            Err(_) => (old_len + j) as u32,
        })
        .collect();
    let both = Tensor::cat(&[old_head, &target_rows.to_dtype(old_head.dtype())?], 0)?;
    Ok(both.index_select(&Tensor::from_vec(index, vocab.len(), both.device())?, 0)?)
}

/// Per-sample training inputs derived from the features.
struct Example {
    tokens: Vec<u32>,
    taps: Tensor,
    /// `[n, Vd]` target probabilities over the draft vocabulary at every position.
    target_probs: Tensor,
    /// `[n]`: 1 where position p's next token is an answer token inside the draft vocabulary.
    mask: Tensor,
}

fn example(sample: &Sample, f: &Features, parts: &TargetParts, in_vocab: &[bool]) -> Result<Example> {
    let tokens = sample.tokens();
    let n = tokens.len();
    let fin = f.final_hidden.to_dtype(DType::F32)?;
    let logits = parts.head.forward(&fin)?;
    let target_probs = candle_nn::ops::softmax_last_dim(&logits)?;
    let p0 = sample.prompt_ids.len();
    let mask: Vec<f32> = (0..n)
        .map(|p| {
            let next = p + 1;
            let answer = next >= p0 && next < n;
            f32::from(u8::from(answer && in_vocab[tokens[next] as usize]))
        })
        .collect();
    Ok(Example {
        taps: f.taps.to_dtype(DType::F32)?,
        target_probs,
        mask: Tensor::from_vec(mask, n, &Device::Cpu)?,
        tokens,
    })
}

fn lr_at(step: usize, total: usize, cfg: &TrainDraftConfig) -> f64 {
    let warm = ((total as f64) * cfg.warmup_fraction).ceil().max(1.0) as usize;
    if step < warm {
        return cfg.learning_rate * (step + 1) as f64 / warm as f64;
    }
    let progress = (step - warm) as f64 / (total - warm).max(1) as f64;
    // Cosine down to a tenth of the peak.
    cfg.learning_rate * (0.1 + 0.9 * 0.5 * (1.0 + (std::f64::consts::PI * progress).cos()))
}

/// Checks the settings that depend on the target (reading only its config, not its
/// weights), so a bad one is refused before minutes of data generation: taps within its
/// hidden states, a draft vocabulary no larger than its own.
pub fn check_against_target(cfg: &TrainDraftConfig) -> Result<()> {
    let path = crate::pipeline::resolve_model_path(&cfg.model)?;
    let store = specrs_models::WeightStore::open(&path, Device::Cpu, cfg.dtype)?;
    check_against_target_config(cfg, &specrs_models::models::read_config(&store, &path)?)
}

fn check_against_target_config(cfg: &TrainDraftConfig, target: &specrs_models::DecoderConfig) -> Result<()> {
    let layers = target.num_hidden_layers;
    if let Some(&tap) = cfg.taps.iter().flatten().find(|&&t| t > layers) {
        return Err(specrs_core::ConfigError::field(
            "taps",
            format!(
                "tap {tap} is past the target's hidden states: a {layers}-layer model has HF hidden_states \
                 0..={layers} (the default taps are {:?})",
                target.default_eagle3_taps()
            ),
        )
        .into());
    }
    if cfg.draft_vocab_size > target.vocab_size {
        return Err(specrs_core::ConfigError::field(
            "draft_vocab_size",
            format!(
                "draft_vocab_size {} exceeds the target's vocabulary of {} tokens",
                cfg.draft_vocab_size, target.vocab_size
            ),
        )
        .into());
    }
    Ok(())
}

/// Trains (or resumes) and exports a draft; returns the report.
pub fn train_draft(cfg: &TrainDraftConfig, progress: Progress<'_>) -> Result<TrainReport> {
    check_against_target(cfg)?;
    std::fs::create_dir_all(&cfg.work_dir)
        .map_err(|e| EngineError::Internal(format!("{}: {e}", cfg.work_dir.display())))?;
    // 1. Self-distilled answers.
    let prompts = training_prompts(cfg)?;
    let samples_path = cfg.work_dir.join("samples.jsonl");
    let mut pipeline = PipelineConfig::new(cfg.model.clone());
    pipeline.dtype = cfg.dtype;
    pipeline.engine.max_num_seqs = cfg.generation_batch;
    pipeline.engine.max_num_batched_tokens = 4096;
    let samples = {
        let (engine, info) = build_engine(&pipeline)?;
        let handle = EngineHandle::spawn(engine, Some(info));
        let s = data::generate_samples(
            &handle,
            &prompts,
            cfg.max_new_tokens,
            cfg.generation_batch,
            &samples_path,
            &|d, t| progress("generate", d, t, ""),
        )?;
        handle.shutdown(std::time::Duration::from_secs(1));
        s
    };
    let samples: Vec<Sample> = samples.into_iter().filter(|s| !s.response_ids.is_empty()).collect();
    // Features and training run on a compute-pool worker (see `specrs_models::compute`);
    // generation above runs on the engine's own thread, which hands its steps to the pool.
    specrs_models::on_compute_pool(|| train_on_samples(cfg, &samples, progress))
}

/// The prompts of this round: the project's seeded lists, or the user's file with the
/// held-out prompts taken out (acceptance measured on them stays acceptance on unseen
/// requests).
fn training_prompts(cfg: &TrainDraftConfig) -> Result<Vec<String>> {
    let Some(path) = &cfg.prompts_file else {
        return Ok(prompts::training_prompts_from(cfg.skip_prompts, cfg.num_prompts, cfg.seed));
    };
    let all = prompts::prompts_from_file(path).map_err(EngineError::Request)?;
    let held_out: std::collections::HashSet<String> = prompts::held_out_prompts().into_iter().collect();
    let chosen: Vec<String> = all
        .iter()
        .skip(cfg.skip_prompts)
        .take(cfg.num_prompts)
        .filter(|p| !held_out.contains(p.as_str()))
        .cloned()
        .collect();
    if chosen.is_empty() {
        return Err(EngineError::Request(format!(
            "--prompts {}: no training prompts left ({} in the file, --skip-prompts {}, held-out prompts removed)",
            path.display(),
            all.len(),
            cfg.skip_prompts
        )));
    }
    Ok(chosen)
}

/// Features, training and export on self-distilled `samples`.
fn train_on_samples(cfg: &TrainDraftConfig, samples: &[Sample], progress: Progress<'_>) -> Result<TrainReport> {
    let response_tokens: usize = samples.iter().map(|s| s.response_ids.len()).sum();
    // 2. Target and draft vocabulary.
    let path = crate::pipeline::resolve_model_path(&cfg.model)?;
    let (target, store) = specrs_models::load_causal_lm(&path, &Device::Cpu, cfg.dtype)?;
    let tokenizer = crate::pipeline::load_tokenizer(&store, &path)?;
    let tc = target.config().clone();
    let init = cfg.init_from.as_deref().map(export::read_speculators_eagle3).transpose()?;
    let taps = match (&init, &cfg.taps) {
        (Some(init), Some(taps)) if &init.taps != taps => {
            return Err(EngineError::Request(format!(
                "--taps {taps:?} differ from the --init-from draft's {:?}; drop --taps to keep the draft's",
                init.taps
            )));
        }
        (Some(init), _) => init.taps.clone(),
        (None, taps) => taps.clone().unwrap_or_else(|| tc.default_eagle3_taps().to_vec()),
    };
    let vocab = match &init {
        Some(init) => {
            if init.hidden != tc.hidden_size || init.vocab.iter().any(|&t| t as usize >= tc.vocab_size) {
                return Err(EngineError::Request(format!(
                    "--init-from draft (hidden size {}) was not trained for this target (hidden size {}, {} tokens)",
                    init.hidden, tc.hidden_size, tc.vocab_size
                )));
            }
            if cfg.draft_vocab_size > init.vocab.len() {
                // Grow: every token the draft was trained on stays, and the most frequent
                // answer tokens it lacks join (their head rows start as the target's).
                data::draft_vocabulary(samples, cfg.draft_vocab_size.min(tc.vocab_size), &init.vocab)
            } else {
                init.vocab.clone()
            }
        }
        None => data::draft_vocabulary(samples, cfg.draft_vocab_size.min(tc.vocab_size), tokenizer.eos_token_ids()),
    };
    let mut in_vocab = vec![false; tc.vocab_size];
    for &t in &vocab {
        in_vocab[t as usize] = true;
    }
    // 3. Features.
    let shard = 64;
    let shards = data::extract_features(&target, samples, &taps, &cfg.work_dir.join("features"), shard, &|d, t| {
        progress("features", d, t, "")
    })?;
    let features = data::load_features(&shards, shard, samples.len())?;
    let parts = target_parts(&target, &vocab)?;
    drop(target);
    // 4. Model, optimizer, resume.
    let num_layers = match (&init, cfg.num_layers) {
        (Some(init), Some(n)) if n < init.num_layers => {
            return Err(EngineError::Request(format!(
                "--draft-layers {n} is fewer than the --init-from draft's {} layers; a head can grow, not shrink",
                init.num_layers
            )));
        }
        (_, Some(0)) => return Err(EngineError::Request("--draft-layers must be at least 1".into())),
        (_, Some(n)) => n,
        (Some(init), None) => init.num_layers,
        (None, None) => 1,
    };
    let shape = Eagle3Shape {
        hidden: tc.hidden_size,
        num_taps: taps.len(),
        heads: tc.num_attention_heads,
        kv_heads: tc.num_key_value_heads,
        head_dim: tc.head_dim,
        intermediate: init
            .as_ref()
            .map(|init| init.intermediate)
            .or(cfg.intermediate_size)
            .unwrap_or(tc.intermediate_size),
        num_layers,
        draft_vocab: vocab.len(),
        rms_norm_eps: tc.rms_norm_eps,
        rope_theta: tc.rope_theta,
        max_positions: tc.max_position_embeddings,
    };
    let mut varmap = VarMap::new();
    let model = TrainableEagle3::new(VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu), shape.clone())?;
    let ckpt = cfg.work_dir.join("checkpoint.safetensors");
    let state_path = cfg.work_dir.join("checkpoint.json");
    let mut start_step = 0;
    if ckpt.exists() && state_path.exists() {
        let state: CheckpointState = serde_json::from_str(&std::fs::read_to_string(&state_path).unwrap_or_default())
            .map_err(|e| EngineError::Internal(format!("{}: {e}", state_path.display())))?;
        varmap.load(&ckpt)?;
        start_step = state.step;
    } else if let Some(init) = &init {
        let data = varmap.data().lock().expect("varmap lock");
        for (name, var) in data.iter() {
            // Layers the draft did not have keep their identity start.
            let grown = name
                .strip_prefix("layers.")
                .and_then(|rest| rest.split('.').next())
                .and_then(|i| i.parse::<usize>().ok())
                .is_some_and(|i| i >= init.num_layers);
            if grown {
                continue;
            }
            let weight = init.tensors.get(name).ok_or_else(|| {
                EngineError::Request(format!(
                    "--init-from draft has no {name}; it is not an EAGLE-3 head of this shape"
                ))
            })?;
            if name == "lm_head.weight" && init.vocab.len() < vocab.len() {
                var.set(&grown_head_rows(weight, &init.vocab, &parts.head_rows, &vocab)?)?;
                continue;
            }
            if weight.dims() != var.dims() {
                return Err(EngineError::Request(format!(
                    "--init-from draft's {name} is {:?}, this head's is {:?}",
                    weight.dims(),
                    var.dims()
                )));
            }
            var.set(weight)?;
        }
    } else {
        // The draft head starts as the target's head over the draft vocabulary.
        let data = varmap.data().lock().expect("varmap lock");
        data.get("lm_head.weight").expect("created above").set(&parts.head_rows)?;
    }
    let mut opt = AdamW::new(
        varmap.all_vars(),
        ParamsAdamW { lr: cfg.learning_rate, beta1: 0.9, beta2: 0.95, eps: 1e-8, weight_decay: 0.0 },
    )?;
    let steps_per_epoch = samples.len().div_ceil(cfg.batch_size);
    let total_steps = ((steps_per_epoch as f64) * cfg.epochs).ceil() as usize;
    let mut order: Vec<usize> = (0..samples.len()).collect();
    let mut rng = cfg.seed | 1;
    let mut shuffle = |order: &mut Vec<usize>| {
        for i in (1..order.len()).rev() {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            order.swap(i, (rng % (i as u64 + 1)) as usize);
        }
    };
    let weights: Vec<f64> = (0..cfg.ttt_steps).map(|s| 0.8f64.powi(s as i32)).collect();
    let mut agree = vec![0f64; cfg.ttt_steps];
    let mut counted = vec![0f64; cfg.ttt_steps];
    let mut last_loss = f64::NAN;
    let started = Instant::now();
    for epoch_step in 0..total_steps {
        let epoch = epoch_step / steps_per_epoch;
        if epoch_step % steps_per_epoch == 0 {
            shuffle(&mut order);
            if epoch_step >= start_step {
                agree.iter_mut().for_each(|a| *a = 0.0);
                counted.iter_mut().for_each(|c| *c = 0.0);
            }
        }
        if epoch_step < start_step {
            continue;
        }
        let in_epoch = epoch_step % steps_per_epoch;
        let batch = &order[in_epoch * cfg.batch_size..((in_epoch + 1) * cfg.batch_size).min(order.len())];
        let mut total: Option<Tensor> = None;
        for &i in batch {
            let ex = example(&samples[i], &features[i], &parts, &in_vocab)?;
            // Chains anchored before this predict only prompt tokens at every step.
            let first_anchor = samples[i].prompt_ids.len().saturating_sub(cfg.ttt_steps + 1);
            let outs = model.forward_ttt(&ex.taps, &ex.tokens, &parts.embed, cfg.ttt_steps, first_anchor)?;
            for (s, logits) in outs.iter().enumerate() {
                let rows = logits.dim(0)?;
                // Chain at anchor t, step s: the target's distribution at position t + s + 1.
                let probs = ex.target_probs.narrow(0, first_anchor + s + 1, rows)?;
                let mask = ex.mask.narrow(0, first_anchor + s + 1, rows)?;
                let (loss, a, c) = soft_cross_entropy(logits, &probs, &mask)?;
                agree[s] += a;
                counted[s] += c;
                let term = (loss * (weights[s] / batch.len() as f64))?;
                total = Some(match total {
                    Some(t) => (t + term)?,
                    None => term,
                });
            }
        }
        let Some(loss) = total else { continue };
        last_loss = loss.to_scalar::<f32>()? as f64;
        let mut grads = loss.backward()?;
        // Clip the global gradient norm.
        let vars = varmap.all_vars();
        let mut sq = 0f64;
        for v in &vars {
            if let Some(g) = grads.get(v) {
                sq += g.sqr()?.sum_all()?.to_scalar::<f32>()? as f64;
            }
        }
        let norm = sq.sqrt();
        if norm > cfg.grad_clip {
            let scale = cfg.grad_clip / norm;
            for v in &vars {
                if let Some(g) = grads.remove(v) {
                    grads.insert(v, (g * scale)?);
                }
            }
        }
        opt.set_learning_rate(lr_at(epoch_step, total_steps, cfg));
        opt.step(&grads)?;
        let top1: Vec<String> = agree.iter().zip(&counted).map(|(a, c)| format!("{:.3}", a / c.max(1.0))).collect();
        progress(
            "train",
            epoch_step + 1,
            total_steps,
            &format!(
                "epoch {} loss {last_loss:.4} top1 [{}] {:.0}s",
                epoch + 1,
                top1.join(", "),
                started.elapsed().as_secs_f64()
            ),
        );
        if (epoch_step + 1) % 10 == 0 {
            tracing::info!(
                "train step {}/{total_steps}: loss {last_loss:.4}, grad norm {norm:.3}, lr {:.2e}, top-1 per TTT step [{}]",
                epoch_step + 1,
                lr_at(epoch_step, total_steps, cfg),
                top1.join(", ")
            );
        }
        if (epoch_step + 1) % 50 == 0 || epoch_step + 1 == total_steps {
            varmap.save(&ckpt)?;
            let state = CheckpointState { step: epoch_step + 1, config: cfg.clone() };
            std::fs::write(&state_path, serde_json::to_string_pretty(&state).expect("state serialises"))
                .map_err(|e| EngineError::Internal(format!("{}: {e}", state_path.display())))?;
        }
    }
    // 5. Export.
    export::write_speculators_eagle3(
        &cfg.output,
        &varmap,
        &shape,
        &taps,
        &vocab,
        &tc,
        cfg.num_speculative_tokens,
        &cfg.model,
    )?;
    Ok(TrainReport {
        samples: samples.len(),
        response_tokens,
        steps: total_steps,
        final_loss: last_loss,
        top1_per_step: agree.iter().zip(&counted).map(|(a, c)| a / c.max(1.0)).collect(),
        output: cfg.output.clone(),
    })
}

/// Acceptance of a trained draft on held-out prompts: mean acceptance length and
/// per-position acceptance for each width in `widths`, greedy.
pub fn evaluate_draft(
    model: &str,
    draft: &Path,
    dtype: ModelDType,
    widths: &[usize],
    prompts: &[String],
    max_tokens: usize,
) -> Result<Vec<(usize, f64, Vec<f64>)>> {
    let mut out = Vec::new();
    for &k in widths {
        let mut cfg = PipelineConfig::new(model.to_string());
        cfg.dtype = dtype;
        cfg.draft_model = Some(draft.display().to_string());
        cfg.speculative = specrs_core::SpeculativeConfig {
            speculative_method: Some(specrs_core::SpeculativeMethod::Eagle),
            num_speculative_tokens: Some(k as i64),
            ..Default::default()
        };
        let (engine, info) = build_engine(&cfg)?;
        let handle = Arc::new(EngineHandle::spawn(engine, Some(info)));
        let requests = prompts
            .iter()
            .map(|p| {
                crate::request::GenerationRequest::new(
                    crate::request::Prompt::Chat(
                        vec![crate::chat_template::ChatMessage::new("user", p.as_str())].into(),
                    ),
                    specrs_core::sampling::SamplingParams {
                        temperature: 0.0,
                        max_tokens: Some(max_tokens),
                        ..Default::default()
                    },
                )
            })
            .collect();
        let outs = handle.generate(requests)?;
        let mut stats = specrs_core::metrics::SpecDecodeStats::new();
        for o in &outs {
            let m = &o.metrics;
            let s = specrs_core::metrics::SpecDecodeStats {
                num_drafts: m.num_drafts,
                num_draft_tokens: m.num_draft_tokens,
                num_accepted_tokens: m.num_accepted_tokens,
                accepted_per_position: m.accepted_per_position.clone(),
                num_relaxed_accepted: 0,
            };
            stats.merge(&s);
        }
        out.push((k, stats.mean_acceptance_length().unwrap_or(1.0), stats.acceptance_rate_per_position()));
    }
    Ok(out)
}

/// First drafts whose target probability fell in `[lower, upper)`, and how many the target
/// accepted.
#[derive(Debug, Clone, PartialEq)]
pub struct ConfidenceBucket {
    pub lower: f64,
    pub upper: f64,
    pub drafts: usize,
    pub accepted: usize,
}

/// Buckets first drafts by the probability the target gave the token it chose at the drafted
/// position (its own confidence there), with `edges` (ascending, from 0 to 1) bounding the
/// buckets. Each request is its verify `trace`, its `logprobs` (one per output token, greedy,
/// so the chosen token is the target's top-1) and its prompt length.
pub fn first_drafts_by_confidence<'a>(
    requests: impl IntoIterator<Item = (&'a [crate::request::TraceStep], &'a [crate::request::TokenLogprob], usize)>,
    edges: &[f64],
) -> Vec<ConfidenceBucket> {
    let mut buckets: Vec<ConfidenceBucket> =
        edges.windows(2).map(|w| ConfidenceBucket { lower: w[0], upper: w[1], drafts: 0, accepted: 0 }).collect();
    for (trace, logprobs, prompt_len) in requests {
        for step in trace.iter().filter(|s| !s.drafted.is_empty()) {
            let Some(lp) = step.position.checked_sub(prompt_len).and_then(|i| logprobs.get(i)) else { continue };
            let p = (lp.logprob as f64).exp();
            let last = buckets.len() - 1;
            let Some(b) = buckets.iter().position(|b| p < b.upper).or((p >= 1.0).then_some(last)) else { continue };
            buckets[b].drafts += 1;
            buckets[b].accepted += usize::from(step.num_accepted > 0);
        }
    }
    buckets
}

/// [`first_drafts_by_confidence`] for a draft's first drafts (K = 1, greedy) on `prompts`:
/// where the target is sure of its next token and the draft still misses, the draft, not the
/// target's own uncertainty, limits acceptance.
pub fn evaluate_first_drafts_by_confidence(
    model: &str,
    draft: &Path,
    dtype: ModelDType,
    prompts: &[String],
    max_tokens: usize,
    edges: &[f64],
) -> Result<Vec<ConfidenceBucket>> {
    let mut cfg = PipelineConfig::new(model.to_string());
    cfg.dtype = dtype;
    cfg.draft_model = Some(draft.display().to_string());
    cfg.speculative = specrs_core::SpeculativeConfig {
        speculative_method: Some(specrs_core::SpeculativeMethod::Eagle),
        num_speculative_tokens: Some(1),
        ..Default::default()
    };
    let (engine, info) = build_engine(&cfg)?;
    let handle = EngineHandle::spawn(engine, Some(info));
    let requests = prompts
        .iter()
        .map(|p| {
            let mut r = crate::request::GenerationRequest::new(
                crate::request::Prompt::Chat(vec![crate::chat_template::ChatMessage::new("user", p.as_str())].into()),
                specrs_core::sampling::SamplingParams {
                    temperature: 0.0,
                    max_tokens: Some(max_tokens),
                    logprobs: Some(1),
                    ..Default::default()
                },
            );
            r.trace = true;
            r
        })
        .collect();
    let outs = handle.generate(requests)?;
    Ok(first_drafts_by_confidence(
        outs.iter().map(|o| (o.trace.as_slice(), o.logprobs.as_slice(), o.num_prompt_tokens)),
        edges,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_draft_learns_the_targets_logits_over_its_vocabulary_with_the_heads_bias() {
        use specrs_models::testing::{self, TinyShape};
        let s = TinyShape { vocab: 40, hidden: 40, layers: 1, heads: 4, kv_heads: 4, head_dim: 10, intermediate: 56 };
        let dir = tempfile::tempdir().unwrap();
        let tensors = testing::random_phi(&s, false, 5).unwrap();
        testing::write_checkpoint(dir.path(), &testing::phi_config(&s, 0.4, false), &testing::as_phi(&tensors))
            .unwrap();
        let (target, _) = specrs_models::load_causal_lm(dir.path(), &Device::Cpu, ModelDType::F32).unwrap();
        let vocab = [3u32, 7, 20, 39];
        let parts = target_parts(&target, &vocab).unwrap();
        let normed = testing::random_tensor(&[5, s.hidden], 0.5, 9).unwrap();
        let ids = Tensor::new(&vocab, &Device::Cpu).unwrap();
        let want = target.logits_head().forward(&normed).unwrap().index_select(&ids, 1).unwrap();
        let got = parts.head.forward(&normed).unwrap();
        assert!(testing::max_abs_diff(&got, &want).unwrap() < 1e-5, "the draft vocabulary's target logits");
        let bare = normed.matmul(&parts.head_rows.t().unwrap()).unwrap();
        assert!(testing::max_abs_diff(&bare, &want).unwrap() > 1e-3, "Phi's head bias is part of the target");
    }

    #[test]
    fn taps_past_the_targets_layers_and_a_draft_vocabulary_past_its_own_are_refused() {
        let target = specrs_models::DecoderConfig::from_hf_json(&serde_json::json!({
            "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
            "vocab_size": 1000, "rms_norm_eps": 1e-5, "max_position_embeddings": 512
        }))
        .unwrap();
        let ok = TrainDraftConfig { taps: Some(vec![0, 2, 4]), draft_vocab_size: 1000, ..TrainDraftConfig::default() };
        check_against_target_config(&ok, &target).unwrap();
        for (cfg, field, needle) in [
            (TrainDraftConfig { taps: Some(vec![1, 5]), ..ok.clone() }, "taps", "tap 5 is past"),
            (TrainDraftConfig { draft_vocab_size: 1001, ..ok.clone() }, "draft_vocab_size", "1001 exceeds"),
        ] {
            match check_against_target_config(&cfg, &target).unwrap_err() {
                EngineError::Config(e) => {
                    assert_eq!(e.field.as_deref(), Some(field));
                    assert!(e.message.contains(needle), "{}", e.message);
                }
                other => panic!("{other:?}"),
            }
        }
    }

    fn config_with_prompt_file(
        dir: &tempfile::TempDir,
        prompts: &[String],
        skip: usize,
        count: usize,
    ) -> (TrainDraftConfig, PathBuf) {
        let path = dir.path().join(format!("prompts-{skip}-{count}.json"));
        std::fs::write(&path, serde_json::to_string(prompts).unwrap()).unwrap();
        let cfg = TrainDraftConfig {
            prompts_file: Some(path.clone()),
            skip_prompts: skip,
            num_prompts: count,
            ..TrainDraftConfig::default()
        };
        (cfg, path)
    }

    #[test]
    fn first_drafts_are_bucketed_by_the_targets_own_probability_of_its_token() {
        use crate::request::{TokenLogprob, TraceStep};
        let lp = |p: f32| TokenLogprob { token: 0, logprob: p.ln(), rank: 1, top: Vec::new() };
        // Prompt of 3 tokens; output tokens 0..4 with target probabilities 0.95, 0.2, 0.95, 0.5.
        let logprobs = [lp(0.95), lp(0.2), lp(0.95), lp(0.5)];
        let step = |position: usize, accepted: usize| TraceStep {
            position,
            drafted: vec![7],
            target: vec![7],
            num_accepted: accepted,
        };
        // Drafts at outputs 1 (p 0.2, rejected), 2 (p 0.95, accepted), 3 (p 0.5, accepted);
        // a step that drafted nothing and one past the output are left out.
        let mut empty = step(4, 0);
        empty.drafted.clear();
        let trace = [step(4, 0), step(5, 1), step(6, 1), empty, step(9, 1)];
        let buckets = first_drafts_by_confidence([(&trace[..], &logprobs[..], 3)], &[0.0, 0.3, 0.9, 1.0]);
        let counts: Vec<(usize, usize)> = buckets.iter().map(|b| (b.drafts, b.accepted)).collect();
        assert_eq!(counts, [(1, 0), (1, 1), (1, 1)]);
        assert_eq!((buckets[2].lower, buckets[2].upper), (0.9, 1.0));
    }

    #[test]
    fn a_grown_vocabulary_keeps_trained_rows_and_starts_new_tokens_from_the_target() {
        let dev = Device::Cpu;
        // Old vocabulary: target ids 3, 7, 9 with rows 30, 70, 90; the target's row of id t is t.
        let old_vocab = [3u32, 7, 9];
        let old_head = Tensor::new(&[[30f32, 30.5], [70., 70.5], [90., 90.5]], &dev).unwrap();
        let vocab = [1u32, 3, 5, 7, 9, 11];
        let target_rows = Tensor::new(&[[1f32, 1.], [3., 3.], [5., 5.], [7., 7.], [9., 9.], [11., 11.]], &dev).unwrap();
        let grown = grown_head_rows(&old_head, &old_vocab, &target_rows, &vocab).unwrap();
        let expected = [[1f32, 1.], [30., 30.5], [5., 5.], [70., 70.5], [90., 90.5], [11., 11.]];
        assert_eq!(grown.to_vec2::<f32>().unwrap(), expected);
    }

    #[test]
    fn a_grown_draft_vocabulary_keeps_every_old_token_and_adds_the_most_frequent() {
        let sample = |ids: &[u32]| Sample { prompt: String::new(), prompt_ids: vec![1], response_ids: ids.to_vec() };
        // Token 8 is the most frequent, then 6; 2 appears once.
        let samples = [sample(&[8, 8, 8, 6, 6, 2]), sample(&[8, 6, 4, 4])];
        let old = [2u32, 40];
        assert_eq!(data::draft_vocabulary(&samples, 4, &old), [2, 6, 8, 40]);
        assert_eq!(data::draft_vocabulary(&samples, 5, &old), [2, 4, 6, 8, 40]);
    }

    #[test]
    fn a_prompt_file_is_selected_like_the_lists_and_loses_its_held_out_prompts() {
        let dir = tempfile::tempdir().unwrap();
        let held_out = prompts::held_out_prompts();
        let mine: Vec<String> = (0..6).map(|i| format!("My request number {i}.")).collect();
        let file = vec![mine[0].clone(), mine[1].clone(), held_out[0].clone(), mine[2].clone(), mine[3].clone()];
        let (cfg, _) = config_with_prompt_file(&dir, &file, 1, 3);
        // Skip one, take three (one of them held out, so dropped).
        assert_eq!(training_prompts(&cfg).unwrap(), [mine[1].clone(), mine[2].clone()]);
        let (cfg, path) = config_with_prompt_file(&dir, &file, 5, 3);
        let err = training_prompts(&cfg).unwrap_err().to_string();
        assert!(err.contains(&path.display().to_string()) && err.contains("no training prompts left"), "{err}");
    }

    #[test]
    fn without_a_prompt_file_the_seeded_lists_are_used() {
        let cfg = TrainDraftConfig { skip_prompts: 10, num_prompts: 5, ..TrainDraftConfig::default() };
        assert_eq!(training_prompts(&cfg).unwrap(), prompts::training_prompts_from(10, 5, cfg.seed));
    }
}
