//! `spec-rs train-draft`: the command line of `specrs_engine::train`.

use std::path::PathBuf;

use clap::{Arg, ArgMatches, Command, value_parser};
use specrs_core::model_alias::DEFAULT_MODEL_ALIAS;
use specrs_engine::train::{TrainDraftConfig, evaluate_draft, prompts, train_draft};

use crate::cli::CliError;

pub fn command() -> Command {
    let d = TrainDraftConfig::default();
    Command::new("train-draft")
        .about("Train an EAGLE-3 draft head for a target on CPU from data the target generates (speculators eagle3 format)")
        .arg(Arg::new("model").long("model").default_value(DEFAULT_MODEL_ALIAS).help("Target: alias, GGUF file or checkpoint directory"))
        .arg(Arg::new("output").long("output").value_parser(value_parser!(PathBuf)).required(true).help("Directory the draft is written to"))
        .arg(Arg::new("work-dir").long("work-dir").value_parser(value_parser!(PathBuf)).default_value(".spec-rs-train").help(
            "Cache of generated samples, features and checkpoints; rerunning resumes from it",
        ))
        .arg(Arg::new("init-from").long("init-from").value_parser(value_parser!(PathBuf)).help(
            "A speculators eagle3 draft (e.g. one train-draft wrote) to continue training: its taps, draft vocabulary and weights",
        ))
        .arg(Arg::new("dtype").long("dtype").default_value("auto").help("Target weights used to generate data (serve with the same)"))
        .arg(Arg::new("skip-prompts").long("skip-prompts").value_parser(value_parser!(usize)).default_value("0").help(
            "Prompts at the head of the seeded list to pass over (earlier rounds' --num-prompts), so --init-from trains on new ones",
        ))
        .arg(Arg::new("prompts").long("prompts").value_parser(value_parser!(PathBuf)).help(
            "Your own prompts instead of the built-in lists: a JSON array of strings, or JSON Lines of strings or {\"prompt\": ...} objects",
        ))
        .arg(Arg::new("num-prompts").long("num-prompts").value_parser(value_parser!(usize)).default_value(d.num_prompts.to_string()))
        .arg(Arg::new("max-new-tokens").long("max-new-tokens").value_parser(value_parser!(usize)).default_value(d.max_new_tokens.to_string()))
        .arg(Arg::new("taps").long("taps").help("Comma-separated HF hidden_states indices to tap (default: 2, L/2, L-3)"))
        .arg(Arg::new("draft-vocab-size").long("draft-vocab-size").value_parser(value_parser!(usize)).default_value(d.draft_vocab_size.to_string()).help(
            "Tokens of the draft vocabulary (the most frequent answer tokens); above an --init-from draft's it grows that vocabulary, keeping its trained rows",
        ))
        .arg(Arg::new("intermediate-size").long("intermediate-size").value_parser(value_parser!(usize)).help("MLP width of the draft layer (default: the target's)"))
        .arg(Arg::new("draft-layers").long("draft-layers").value_parser(value_parser!(usize)).help(
            "Decoder layers of the head (default: the --init-from draft's, or 1); more than --init-from has grows it, the new layers starting as identities",
        ))
        .arg(Arg::new("ttt-steps").long("ttt-steps").value_parser(value_parser!(usize)).default_value(d.ttt_steps.to_string()))
        // Negative values parse as values, so the rule below can say what is wrong.
        .arg(Arg::new("epochs").long("epochs").value_parser(value_parser!(f64)).allow_negative_numbers(true).default_value(d.epochs.to_string()))
        .arg(Arg::new("learning-rate").long("learning-rate").value_parser(value_parser!(f64)).allow_negative_numbers(true).default_value(d.learning_rate.to_string()))
        .arg(Arg::new("batch-size").long("batch-size").value_parser(value_parser!(usize)).default_value(d.batch_size.to_string()))
        .arg(Arg::new("num-speculative-tokens").long("num-speculative-tokens").value_parser(value_parser!(usize)).default_value(d.num_speculative_tokens.to_string()))
        .arg(Arg::new("generation-batch").long("generation-batch").value_parser(value_parser!(usize)).default_value(d.generation_batch.to_string()).help(
            "Sequences the target answers at once while generating data",
        ))
        .arg(Arg::new("seed").long("seed").value_parser(value_parser!(u64)).default_value(d.seed.to_string()))
        .arg(Arg::new("eval-max-tokens").long("eval-max-tokens").value_parser(value_parser!(usize)).default_value("96").help(
            "Tokens per held-out prompt when measuring acceptance after training (0 skips it)",
        ))
}

#[derive(Debug, Clone)]
pub struct TrainDraftArgs {
    pub config: TrainDraftConfig,
    pub eval_max_tokens: usize,
}

/// Bound on `--num-prompts` and `--skip-prompts` over the seeded prompt list: a million
/// answers is far past a CPU's reach.
const MAX_PROMPTS: usize = 1_000_000;
/// Bound on `--epochs`.
const MAX_EPOCHS: f64 = 10_000.0;

pub fn parse(m: &ArgMatches) -> Result<TrainDraftArgs, CliError> {
    let taps = match m.get_one::<String>("taps") {
        None => None,
        Some(s) => Some(
            s.split(',')
                .map(|t| {
                    t.trim()
                        .parse::<usize>()
                        .map_err(|_| CliError::Invalid(format!("--taps: '{t}' is not a layer index")))
                })
                .collect::<Result<Vec<_>, _>>()?,
        ),
    };
    let config = TrainDraftConfig {
        model: m.get_one::<String>("model").expect("default").clone(),
        output: m.get_one::<PathBuf>("output").expect("required").clone(),
        work_dir: m.get_one::<PathBuf>("work-dir").expect("default").clone(),
        init_from: m.get_one::<PathBuf>("init-from").cloned(),
        dtype: m
            .get_one::<String>("dtype")
            .expect("default")
            .parse()
            .map_err(|e: specrs_models::ModelError| CliError::Invalid(format!("--dtype: {e}")))?,
        skip_prompts: *m.get_one::<usize>("skip-prompts").expect("default"),
        prompts_file: m.get_one::<PathBuf>("prompts").cloned(),
        num_prompts: *m.get_one::<usize>("num-prompts").expect("default"),
        max_new_tokens: *m.get_one::<usize>("max-new-tokens").expect("default"),
        taps,
        draft_vocab_size: *m.get_one::<usize>("draft-vocab-size").expect("default"),
        intermediate_size: m.get_one::<usize>("intermediate-size").copied(),
        num_layers: m.get_one::<usize>("draft-layers").copied(),
        ttt_steps: *m.get_one::<usize>("ttt-steps").expect("default"),
        epochs: *m.get_one::<f64>("epochs").expect("default"),
        learning_rate: *m.get_one::<f64>("learning-rate").expect("default"),
        batch_size: *m.get_one::<usize>("batch-size").expect("default"),
        num_speculative_tokens: *m.get_one::<usize>("num-speculative-tokens").expect("default"),
        seed: *m.get_one::<u64>("seed").expect("default"),
        generation_batch: *m.get_one::<usize>("generation-batch").expect("default"),
        ..TrainDraftConfig::default()
    };
    for (name, v) in [
        ("--num-prompts", config.num_prompts),
        ("--ttt-steps", config.ttt_steps),
        ("--batch-size", config.batch_size),
        ("--draft-vocab-size", config.draft_vocab_size),
        ("--num-speculative-tokens", config.num_speculative_tokens),
        ("--draft-layers", config.num_layers.unwrap_or(1)),
        ("--intermediate-size", config.intermediate_size.unwrap_or(1)),
        ("--max-new-tokens", config.max_new_tokens),
        ("--generation-batch", config.generation_batch),
    ] {
        if v == 0 {
            return Err(CliError::Invalid(format!("{name} must be at least 1")));
        }
    }
    if let Some(dir) = &config.init_from
        && !dir.join("config.json").is_file()
    {
        return Err(CliError::Invalid(format!(
            "--init-from {}: no config.json there; pass a draft directory train-draft wrote",
            dir.display()
        )));
    }
    if let Some(file) = &config.prompts_file {
        prompts::prompts_from_file(file).map_err(CliError::Invalid)?;
    }
    // Past these the seeded list could never be built (a --prompts file is only read so far).
    for (name, v) in [("--num-prompts", config.num_prompts), ("--skip-prompts", config.skip_prompts)] {
        if config.prompts_file.is_none() && v > MAX_PROMPTS {
            return Err(CliError::Invalid(format!("{name} must be at most {MAX_PROMPTS}, got {v}")));
        }
    }
    if !(config.epochs > 0.0 && config.epochs <= MAX_EPOCHS) {
        return Err(CliError::Invalid(format!("--epochs must be in (0, {MAX_EPOCHS}], got {}", config.epochs)));
    }
    if !(config.learning_rate > 0.0 && config.learning_rate.is_finite()) {
        return Err(CliError::Invalid(format!(
            "--learning-rate must be a positive finite number, got {}",
            config.learning_rate
        )));
    }
    Ok(TrainDraftArgs { config, eval_max_tokens: *m.get_one::<usize>("eval-max-tokens").expect("default") })
}

/// Checks the flags that depend on the target (its config only), before anything is generated.
pub fn check_against_target(args: &TrainDraftArgs) -> Result<(), String> {
    specrs_engine::train::check_against_target(&args.config).map_err(|e| match e {
        specrs_engine::EngineError::Config(c) => match c.field {
            Some(field) => format!("--{}: {}", field.replace('_', "-"), c.message),
            None => c.message,
        },
        other => other.to_string(),
    })
}

/// Runs training with a progress bar, then measures acceptance on held-out prompts.
pub fn run(args: &TrainDraftArgs) -> Result<(), String> {
    let bar = indicatif::ProgressBar::new(0);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{prefix:>9} [{bar:30}] {pos}/{len} {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    let progress = |stage: &str, done: usize, total: usize, msg: &str| {
        bar.set_prefix(stage.to_string());
        bar.set_length(total as u64);
        bar.set_position(done as u64);
        bar.set_message(msg.to_string());
    };
    let report = train_draft(&args.config, &progress).map_err(|e| e.to_string())?;
    bar.finish();
    eprintln!(
        "trained on {} samples ({} answer tokens), {} steps, final loss {:.4}, top-1 per step {:?}; wrote {}",
        report.samples,
        report.response_tokens,
        report.steps,
        report.final_loss,
        report.top1_per_step,
        report.output.display()
    );
    if args.eval_max_tokens > 0 {
        let held = prompts::held_out_prompts();
        let results = evaluate_draft(
            &args.config.model,
            &args.config.output,
            args.config.dtype,
            &[1, 2, 3, 4, 5],
            &held,
            args.eval_max_tokens,
        )
        .map_err(|e| e.to_string())?;
        eprintln!("held-out acceptance ({} prompts, greedy):", held.len());
        for (k, len, per_pos) in results {
            let pp: Vec<String> = per_pos.iter().map(|p| format!("{:.0}%", 100.0 * p)).collect();
            eprintln!("  K={k}: acceptance length {len:.2}, per position [{}]", pp.join(", "));
        }
    }
    Ok(())
}
