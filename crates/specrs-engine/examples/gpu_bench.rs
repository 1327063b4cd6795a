//! Decode throughput at several batch sizes, plain and speculative, against the
//! memory-bandwidth roofline.
//!
//! ```text
//! gpu_bench --model DIR [--draft DIR] [--device cuda] [--batches 1,32,128] [--k 4]
//!           [--acceptance 0.7] [--prompt-len 128] [--gen 128] [--bandwidth 4.8e12] [--out FILE]
//! gpu_bench --model smollm2-135m-instruct --shipped-draft [--dtype bf16] [--batches ...] [--gen N]
//! either form: [--device-graph-capture]
//! ```
//!
//! Speculative runs use synthetic acceptance (`--acceptance`, the mean joint acceptance rate
//! of MAX's benchmark mode): a random-weight model has nothing to accept, and a fixed rate
//! measures the system's cost independently of draft quality. With `--draft` the drafter is an
//! EAGLE-1 head (`scripts/make_random_llama.py --eagle1`), so drafting costs what a real head
//! costs; without it the n-gram proposer stands in.
//!
//! Decode throughput is `batch · (gen − 1)` tokens over the time after prefill, where prefill
//! is timed by the same batch generating one token. The roofline bounds a step by the bytes
//! it must read (every weight once, plus each row's KV cache) at `--bandwidth` bytes/s; a
//! speculative step commits `1 + Σ aⁱ` tokens per row in expectation (`a` the calibrated
//! per-position rate), so its roofline is that many times the plain one (drafting excluded).
//! Results are printed as a table and written as JSON lines to `--out`.
//!
//! `--shipped-draft` measures a real model with its real drafter instead: the speculative mode
//! is the configuration `LLM(model)` gets by default (the shipped head, adaptive widths,
//! prompt lookup, confidence cut), acceptance is whatever the head earns, the prompts are the
//! held-out chat prompts (cycled to the batch size) and rows stop at EOS. Each speculative
//! row's tokens are compared with the plain row's: greedy speculative decoding must return
//! the plain tokens (rows that differ are counted; half-precision batched matmuls can round
//! differently at different verify widths, so a difference is reported, not hidden).
//!
//! `--device-graph-capture` runs both modes' decode steps on captured shapes (CUDA graphs on a
//! GPU; the same padded steps eagerly on CPU), to compare with a run without it.

use std::path::{Path, PathBuf};
use std::time::Instant;

use specrs_core::SpeculativeConfig;
use specrs_core::acceptance::calibrate_per_position_rate;
use specrs_core::config::SpeculativeMethod;
use specrs_core::model_alias::resolve_model;
use specrs_core::sampling::SamplingParams;
use specrs_engine::train::prompts::held_out_prompts;
use specrs_engine::{
    ChatMessage, DeviceSpec, EngineConfig, EngineHandle, GenerationRequest, PipelineConfig, Prompt,
    apply_default_draft, build_engine,
};
use specrs_models::ModelDType;

struct Args {
    model: PathBuf,
    draft: Option<PathBuf>,
    device: DeviceSpec,
    dtype: ModelDType,
    batches: Vec<usize>,
    k: usize,
    acceptance: f64,
    prompt_len: usize,
    new_tokens: usize,
    bandwidth: f64,
    out: Option<PathBuf>,
    /// Speculate with the model's shipped drafter on real prompts (real acceptance).
    shipped_draft: bool,
    /// `EngineConfig::device_graph_capture`.
    device_graph_capture: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        model: PathBuf::new(),
        draft: None,
        device: DeviceSpec::Cuda(0),
        dtype: ModelDType::Auto,
        batches: vec![1, 32, 128],
        k: 4,
        acceptance: 0.7,
        prompt_len: 128,
        new_tokens: 128,
        bandwidth: 4.8e12,
        out: None,
        shipped_draft: false,
        device_graph_capture: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        let bad = |e: &dyn std::fmt::Display| format!("{flag}: {e}");
        match flag.as_str() {
            "--model" => a.model = PathBuf::from(value()?),
            "--draft" => a.draft = Some(PathBuf::from(value()?)),
            "--device" => a.device = value()?.parse().map_err(|e| bad(&e))?,
            "--dtype" => a.dtype = value()?.parse().map_err(|e| bad(&e))?,
            "--batches" => {
                a.batches =
                    value()?.split(',').map(|b| b.trim().parse().map_err(|e| bad(&e))).collect::<Result<_, _>>()?
            }
            "--k" => a.k = value()?.parse().map_err(|e| bad(&e))?,
            "--acceptance" => a.acceptance = value()?.parse().map_err(|e| bad(&e))?,
            "--prompt-len" => a.prompt_len = value()?.parse().map_err(|e| bad(&e))?,
            "--gen" => a.new_tokens = value()?.parse().map_err(|e| bad(&e))?,
            "--bandwidth" => a.bandwidth = value()?.parse().map_err(|e| bad(&e))?,
            "--out" => a.out = Some(PathBuf::from(value()?)),
            "--shipped-draft" => a.shipped_draft = true,
            "--device-graph-capture" => a.device_graph_capture = true,
            other => return Err(format!("unknown flag {other}")),
        }
    }
    if a.model.as_os_str().is_empty() {
        return Err("--model DIR is required".into());
    }
    if a.new_tokens < 2 {
        return Err("--gen must be at least 2".into());
    }
    if a.shipped_draft && a.draft.is_some() {
        return Err("--shipped-draft uses the model's own drafter; drop --draft".into());
    }
    Ok(a)
}

/// The model's file when it is a GGUF file (an alias resolves to one), else `None`.
fn gguf_file(model: &Path) -> Option<PathBuf> {
    let path = resolve_model(&model.to_string_lossy()).ok()?;
    (path.extension().is_some_and(|x| x == "gguf") && path.is_file()).then_some(path)
}

fn gguf_content(path: &Path) -> Result<candle_core::quantized::gguf_file::Content, String> {
    let mut f = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    candle_core::quantized::gguf_file::Content::read(&mut f).map_err(|e| format!("{}: {e}", path.display()))
}

/// Bytes of the weights a step reads: the checkpoint's tensors on disk, or for a GGUF file
/// loaded dense (`--dtype bf16`/`f16`/`f32`), its element count at that width.
fn weight_bytes(model: &Path, dense_bytes: Option<u64>) -> Result<u64, String> {
    if let Some(path) = gguf_file(model) {
        return Ok(match dense_bytes {
            Some(width) => {
                gguf_content(&path)?.tensor_infos.values().map(|t| t.shape.elem_count() as u64).sum::<u64>() * width
            }
            None => std::fs::metadata(&path).map_err(|e| e.to_string())?.len(),
        });
    }
    Ok(std::fs::read_dir(model)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok())
                .filter(|e| e.path().extension().is_some_and(|x| x == "safetensors" || x == "gguf"))
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0))
}

/// KV bytes per token of the target, from its config.json or GGUF metadata.
fn kv_bytes_per_token(model: &Path, dtype_bytes: u64) -> Result<u64, String> {
    if let Some(path) = gguf_file(model) {
        let content = gguf_content(&path)?;
        let arch = content.metadata.get("general.architecture").and_then(|v| v.to_string().ok()).cloned();
        let arch = arch.unwrap_or_else(|| "llama".into());
        let get = |k: &str| -> u64 {
            content
                .metadata
                .get(&format!("{arch}.{k}"))
                .and_then(|v| v.to_u64().ok().or(v.to_u32().ok().map(u64::from)))
                .unwrap_or(0)
        };
        let heads = get("attention.head_count").max(1);
        let head_dim = get("embedding_length") / heads;
        let kv_heads = match get("attention.head_count_kv") {
            0 => heads,
            n => n,
        };
        return Ok(2 * get("block_count") * kv_heads * head_dim * dtype_bytes);
    }
    let cfg: serde_json::Value = std::fs::read_to_string(model.join("config.json"))
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_default();
    let get = |k: &str| cfg[k].as_u64().unwrap_or(0);
    let head_dim = cfg["head_dim"].as_u64().unwrap_or_else(|| get("hidden_size") / get("num_attention_heads").max(1));
    Ok(2 * get("num_hidden_layers") * get("num_key_value_heads") * head_dim * dtype_bytes)
}

struct Mode {
    name: &'static str,
    spec: SpeculativeConfig,
    draft: Option<PathBuf>,
    /// Take the model's shipped drafter and its default configuration.
    shipped: bool,
}

fn engine(args: &Args, mode: &Mode, kv_bytes: u64) -> Result<EngineHandle, String> {
    let mut cfg = PipelineConfig::new(args.model.to_string_lossy());
    cfg.draft_model = mode.draft.as_ref().map(|d| d.to_string_lossy().into_owned());
    cfg.devices = vec![args.device];
    cfg.dtype = args.dtype;
    cfg.speculative = mode.spec.clone();
    if mode.shipped && !apply_default_draft(&mut cfg).map_err(|e| e.to_string())? {
        return Err(format!("{} has no shipped drafter", args.model.display()));
    }
    let max_batch = *args.batches.iter().max().unwrap_or(&1);
    cfg.engine = EngineConfig {
        max_num_seqs: max_batch,
        max_num_batched_tokens: (max_batch * args.prompt_len).max(2048),
        max_prefill_chunk: args.prompt_len,
        kv_cache_bytes: kv_bytes,
        max_model_len: Some(max_model_len(args)),
        device_graph_capture: args.device_graph_capture,
        ..EngineConfig::default()
    };
    let (engine, info) = build_engine(&cfg).map_err(|e| e.to_string())?;
    Ok(EngineHandle::spawn(engine, Some(info)))
}

/// The context length the engines run with: the longest prompt this benchmark sends (chat
/// prompts are templated, so at least 512 tokens are allowed) plus what it generates.
fn max_model_len(args: &Args) -> usize {
    args.prompt_len.max(512) + args.new_tokens + 4 * args.k + 16
}

fn requests(args: &Args, batch: usize, max_tokens: usize, vocab: u32) -> Vec<GenerationRequest> {
    if args.shipped_draft {
        // Real prompts, real stops: the held-out chat prompts, cycled.
        let prompts = held_out_prompts();
        return (0..batch)
            .map(|r| {
                let params =
                    SamplingParams { temperature: 0.0, max_tokens: Some(max_tokens), ..SamplingParams::default() };
                let chat = vec![ChatMessage::new("user", prompts[r % prompts.len()].clone())];
                GenerationRequest::new(Prompt::Chat(chat.into()), params)
            })
            .collect();
    }
    (0..batch)
        .map(|r| {
            // Distinct pseudo-random prompts, so no two rows share a prefix.
            let prompt = (0..args.prompt_len).map(|i| ((r * 7919 + i * 104_729 + 13) as u32) % (vocab - 1)).collect();
            let params = SamplingParams {
                temperature: 0.0,
                max_tokens: Some(max_tokens),
                ignore_eos: true,
                ..SamplingParams::default()
            };
            GenerationRequest::new(Prompt::Tokens(prompt), params)
        })
        .collect()
}

fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("gpu_bench: {e}");
            std::process::exit(2);
        }
    };
    if let Err(e) = run(&args) {
        eprintln!("gpu_bench: {e}");
        std::process::exit(1);
    }
}

fn run(args: &Args) -> Result<(), String> {
    let dense_bytes = match args.dtype {
        ModelDType::BF16 | ModelDType::F16 => Some(2),
        ModelDType::F32 => Some(4),
        _ => None,
    };
    let weights = weight_bytes(&args.model, dense_bytes)?;
    // The KV cache holds activations' dtype: f32 for an f32 model, half precision otherwise.
    let kv_per_token = kv_bytes_per_token(&args.model, if args.dtype == ModelDType::F32 { 4 } else { 2 })?;
    let max_batch = *args.batches.iter().max().unwrap_or(&1) as u64;
    // Every sequence must fit the pool alone, so the context is capped near what runs here.
    let max_model_len = max_model_len(args);
    let kv_bytes = (max_batch * (args.prompt_len + args.new_tokens + 2 * args.k + 8) as u64 * kv_per_token * 5 / 4)
        .max(max_model_len as u64 * kv_per_token * 5 / 4)
        .max(64 << 20);
    let synthetic = SpeculativeConfig {
        speculative_method: Some(if args.draft.is_some() {
            SpeculativeMethod::Eagle
        } else {
            SpeculativeMethod::Ngram
        }),
        num_speculative_tokens: Some(args.k as i64),
        synthetic_acceptance_rate: Some(args.acceptance),
        ..SpeculativeConfig::default()
    };
    let modes = if args.shipped_draft {
        [
            Mode { name: "plain", spec: SpeculativeConfig::default(), draft: None, shipped: false },
            Mode { name: "shipped-draft", spec: SpeculativeConfig::default(), draft: None, shipped: true },
        ]
    } else {
        [
            Mode { name: "plain", spec: SpeculativeConfig::default(), draft: None, shipped: false },
            Mode { name: "speculative", spec: synthetic, draft: args.draft.clone(), shipped: false },
        ]
    };
    let a = calibrate_per_position_rate(args.acceptance, args.k);
    let expected_tokens_per_step = 1.0 + (1..=args.k).map(|i| a.powi(i as i32)).sum::<f64>();
    let mut out = args.out.as_ref().map(|p| std::fs::File::create(p).map_err(|e| e.to_string())).transpose()?;
    if args.shipped_draft {
        println!(
            "{}: weights {:.3} GB, KV {} B/token, bandwidth {:.2} TB/s, shipped drafter (real acceptance), held-out chat prompts",
            args.model.display(),
            weights as f64 / 1e9,
            kv_per_token,
            args.bandwidth / 1e12,
        );
    } else {
        println!(
            "weights {:.2} GB, KV {} B/token, bandwidth {:.2} TB/s, K={}, synthetic acceptance {} (a={a:.3}, {:.2} tokens/step)",
            weights as f64 / 1e9,
            kv_per_token,
            args.bandwidth / 1e12,
            args.k,
            args.acceptance,
            expected_tokens_per_step
        );
    }
    if args.device_graph_capture {
        println!("decode steps on captured shapes (--device-graph-capture)");
    }
    println!(
        "| mode | batch | decode tok/s | roofline tok/s | of roofline | accepted/drafted | tokens/step | same as plain | prefill s |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    // Plain token ids per batch size, to check each speculative row against.
    let mut plain_tokens: Vec<Vec<Vec<u32>>> = Vec::new();
    for mode in &modes {
        let started = Instant::now();
        let handle = engine(args, mode, kv_bytes)?;
        let load_s = started.elapsed().as_secs_f64();
        let vocab = handle.tokenizer().vocab_size() as u32;
        // Warm-up: kernels are compiled (PTX JIT) and cuBLAS picks its algorithms.
        handle.generate(requests(args, 1, 4, vocab)).map_err(|e| e.to_string())?;
        for (b, &batch) in args.batches.iter().enumerate() {
            let t0 = Instant::now();
            handle.generate(requests(args, batch, 1, vocab)).map_err(|e| e.to_string())?;
            let prefill = t0.elapsed().as_secs_f64();
            let t1 = Instant::now();
            let outs = handle.generate(requests(args, batch, args.new_tokens, vocab)).map_err(|e| e.to_string())?;
            let total = t1.elapsed().as_secs_f64();
            if let Some(err) = outs.iter().find_map(|o| o.error.clone()) {
                return Err(format!("{} batch {batch}: {err}", mode.name));
            }
            let generated: u64 = outs.iter().map(|o| o.token_ids.len() as u64).sum();
            let decoded = outs.iter().map(|o| o.token_ids.len().saturating_sub(1) as u64).sum::<u64>() as f64;
            let tok_s = decoded / (total - prefill).max(1e-9);
            let drafted: u64 = outs.iter().map(|o| o.metrics.num_draft_tokens).sum();
            let accepted: u64 = outs.iter().map(|o| o.metrics.num_accepted_tokens).sum();
            // Every step commits one token per row plus the drafts it accepted.
            let measured_per_step = generated as f64 / (generated.saturating_sub(accepted)).max(1) as f64;
            // Bytes per step: weights once, every row's KV at the mean context of the run.
            let mean_ctx = (args.prompt_len + args.new_tokens / 2) as f64;
            let step_bytes = weights as f64 + batch as f64 * mean_ctx * kv_per_token as f64;
            let per_step = match mode.name {
                "plain" => 1.0,
                _ if args.shipped_draft => measured_per_step,
                _ => expected_tokens_per_step,
            };
            let roofline = batch as f64 * per_step * args.bandwidth / step_bytes;
            let tokens: Vec<Vec<u32>> = outs.iter().map(|o| o.token_ids.clone()).collect();
            let same_as_plain = if mode.name == "plain" {
                plain_tokens.push(tokens);
                None
            } else if args.shipped_draft {
                plain_tokens.get(b).map(|plain| plain.iter().zip(&tokens).filter(|(p, s)| p == s).count())
            } else {
                None // random weights with synthetic acceptance: the tokens are not comparable
            };
            let same = same_as_plain.map_or("-".to_string(), |n| format!("{n}/{batch}"));
            println!(
                "| {} | {batch} | {tok_s:.1} | {roofline:.1} | {:.1}% | {accepted}/{drafted} | {measured_per_step:.2} | {same} | {prefill:.3} |",
                mode.name,
                100.0 * tok_s / roofline
            );
            if let Some(f) = out.as_mut() {
                use std::io::Write;
                let line = serde_json::json!({
                    "model": args.model.to_string_lossy(), "mode": mode.name, "batch": batch,
                    "decode_tok_s": tok_s, "roofline_tok_s": roofline,
                    "fraction_of_roofline": tok_s / roofline, "drafted": drafted, "accepted": accepted,
                    "generated": generated, "tokens_per_step": measured_per_step, "same_as_plain_rows": same_as_plain,
                    "prefill_s": prefill, "decode_s": total - prefill, "load_s": load_s, "k": args.k,
                    "acceptance": if args.shipped_draft { serde_json::Value::Null } else { args.acceptance.into() },
                    "prompt_len": args.prompt_len, "gen": args.new_tokens,
                    "weight_bytes": weights, "kv_bytes_per_token": kv_per_token, "bandwidth": args.bandwidth,
                    "device_graph_capture": args.device_graph_capture,
                });
                writeln!(f, "{line}").map_err(|e| e.to_string())?;
            }
        }
        handle.shutdown(std::time::Duration::from_secs(5));
    }
    Ok(())
}
