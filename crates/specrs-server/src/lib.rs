//! spec-rs server and command line: the OpenAI-compatible HTTP API (`spec-rs serve`) and
//! one-shot generation (`spec-rs generate`), for the cargo binary and the Python console
//! script alike.

pub mod cli;
pub mod error;
pub mod generate;
pub mod message;
pub mod openai;
pub mod reasoning;
pub mod responses;
pub mod server;
pub mod tokenize;
pub mod tools;
pub mod train_cli;

use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use specrs_engine::{EngineHandle, PipelineConfig, PipelineInfo};

use crate::cli::{CliCommand, CliError, ServerArgs};

/// Exit status for bad input (as argparse and clap use).
pub const EXIT_USAGE: i32 = 2;

/// Builds an engine for the command line's pipeline arguments (the binary uses the built-in
/// registry; the Python console script passes its own, which knows custom architectures).
pub type EngineFactory<'a> = &'a dyn Fn(&cli::PipelineArgs) -> Result<Arc<EngineHandle>, String>;

/// Builds and starts the engine, with a spinner while weights load.
pub fn start_engine(cfg: &PipelineConfig) -> Result<EngineHandle, String> {
    let spinner = indicatif::ProgressBar::new_spinner();
    spinner.set_style(
        indicatif::ProgressStyle::with_template("{spinner} {msg} [{elapsed}]")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
    );
    spinner.set_message(format!("loading {}", cfg.model));
    spinner.enable_steady_tick(Duration::from_millis(120));
    let built = specrs_engine::build_replicas(cfg);
    spinner.finish_and_clear();
    let (engines, info) = built.map_err(|e| e.to_string())?;
    EngineHandle::spawn_replicas(engines, Some(info)).map_err(|e| e.to_string())
}

fn log_pipeline(info: &PipelineInfo, dtype: &str) {
    match info.method {
        Some(method) => tracing::info!(
            "model {} ({}) as {}: method {}, {} draft tokens per step, acceptance rule {}, dtype {}",
            info.model_path.display(),
            info.architecture,
            info.pipeline_name,
            method,
            info.num_speculative_tokens.unwrap_or(0),
            info.acceptance_rule,
            dtype
        ),
        None => tracing::info!(
            "model {} ({}): plain decoding, dtype {}",
            info.model_path.display(),
            info.architecture,
            dtype
        ),
    }
}

/// Runs the HTTP server on an already built engine until a shutdown signal.
pub fn serve_blocking(handle: Arc<EngineHandle>, model_name: &str, args: &ServerArgs) -> Result<(), String> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("starting the async runtime: {e}"))?;
    let mut names = vec![args.served_model_name.clone().unwrap_or_else(|| model_name.to_string())];
    if !names.contains(&model_name.to_string()) {
        names.push(model_name.to_string());
    }
    let state = Arc::new(server::AppState {
        handle: handle.clone(),
        model_names: names,
        api_key: args.api_key.clone(),
        max_pending: args.max_pending,
        in_flight: AtomicUsize::new(0),
        created: std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs()),
        chat_template: args.chat_template.clone(),
        auto_tool_parser: args.auto_tool_parser,
        reasoning_parser: args.reasoning_parser,
        exclude_tools_when_tool_choice_none: args.exclude_tools_when_tool_choice_none,
        trust_request_chat_template: args.trust_request_chat_template,
        responses: Default::default(),
    });
    let addrs = args.listen_addrs()?;
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(&addrs[..])
            .await
            .map_err(|e| format!("cannot listen on {}:{}: {e}", args.host, args.port))?;
        let local = listener.local_addr().map_err(|e| e.to_string())?;
        tracing::info!("serving the OpenAI API on http://{local}/v1 (model '{}')", state.model_names[0]);
        // Tests and launchers read this line to learn the port.
        println!("spec-rs listening on http://{local}");
        server::serve(listener, state, Duration::from_secs_f64(args.shutdown_timeout)).await.map_err(|e| e.to_string())
    })?;
    if let Ok(h) = Arc::try_unwrap(handle) {
        h.shutdown(Duration::from_secs(1));
    }
    Ok(())
}

/// Logs to stderr through `SPEC_RS_LOG` (a `tracing` filter), or `default_filter` when it is
/// unset. A no-op when a subscriber is already installed.
pub fn init_logging(default_filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("SPEC_RS_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_ansi(ansi).with_writer(std::io::stderr).try_init();
}

fn builtin_factory(args: &cli::PipelineArgs) -> Result<Arc<EngineHandle>, String> {
    let cfg = args.pipeline_config().map_err(|e| e.to_string())?;
    start_engine(&cfg).map(Arc::new)
}

/// Runs a parsed command; returns the process exit status.
pub fn run(cmd: CliCommand, factory: Option<EngineFactory<'_>>) -> i32 {
    let factory: EngineFactory<'_> = factory.unwrap_or(&builtin_factory);
    let start = |args: &cli::PipelineArgs| -> Result<Arc<EngineHandle>, String> {
        let handle = factory(args)?;
        if let Some(info) = &handle.info().pipeline {
            log_pipeline(info, args.dtype.as_str());
        }
        Ok(handle)
    };
    let result = match cmd {
        CliCommand::Serve { pipeline, server } => start(&pipeline)
            .map_err(|e| (EXIT_USAGE, e))
            .and_then(|h| serve_blocking(h, &pipeline.model, &server).map_err(|e| (1, e))),
        CliCommand::Generate { pipeline, generate } => {
            start(&pipeline).map_err(|e| (EXIT_USAGE, e)).and_then(|h| generate::run(&h, &generate).map_err(|e| (1, e)))
        }
        CliCommand::TrainDraft(args) => train_cli::check_against_target(&args)
            .map_err(|e| (EXIT_USAGE, e))
            .and_then(|()| train_cli::run(&args).map_err(|e| (1, e))),
    };
    match result {
        Ok(()) => 0,
        Err((code, message)) => {
            eprintln!("error: {message}");
            code
        }
    }
}

/// Parses `args` (without the program name) and runs them.
pub fn main_with_args<I, T>(args: I, factory: Option<EngineFactory<'_>>) -> i32
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    match cli::parse(args) {
        Ok(cmd) => {
            init_logging(cmd.default_log_filter());
            run(cmd, factory)
        }
        Err(CliError::Clap(e)) => {
            let code = if e.use_stderr() { EXIT_USAGE } else { 0 };
            let _ = e.print();
            code
        }
        Err(e) => {
            eprintln!("error: {e}");
            EXIT_USAGE
        }
    }
}
