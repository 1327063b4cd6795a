//! The `spec-rs` command line, shared by the cargo binary and the Python console script.
//!
//! The speculative flags are generated from `SpeculativeConfig`'s fields
//! (`specrs_core::config::flags`), so the CLI, YAML files and Python accept the same names.

use std::ffi::OsString;
use std::path::PathBuf;

use clap::{Arg, ArgAction, ArgGroup, ArgMatches, Command, value_parser};
use serde_json::{Map, Value};
use specrs_core::SpeculativeConfig;
use specrs_core::config::file::{deep_merge, load_config_file};
use specrs_core::config::flags::{FlagKind, SPECULATIVE_FLAGS};
use specrs_core::config::vllm;
use specrs_core::model_alias::DEFAULT_MODEL_ALIAS;
use specrs_core::sampling::SamplingParams;
use specrs_core::structured::StructuredOutputs;
use specrs_engine::{DeviceSpec, EngineConfig, PipelineConfig};

use crate::reasoning::ReasoningParser;
use crate::tools::ToolCallParser;
use specrs_models::ModelDType;

/// What the user asked for.
#[derive(Debug, Clone)]
pub enum CliCommand {
    Serve { pipeline: PipelineArgs, server: ServerArgs },
    Generate { pipeline: PipelineArgs, generate: GenerateArgs },
    TrainDraft(Box<crate::train_cli::TrainDraftArgs>),
}

impl CliCommand {
    /// The log filter when `SPEC_RS_LOG` is unset: `generate` streams its text to the terminal,
    /// where the engine's periodic lines would break it up, so it logs warnings only.
    pub fn default_log_filter(&self) -> &'static str {
        match self {
            Self::Generate { .. } => "warn",
            Self::Serve { .. } | Self::TrainDraft(_) => "info",
        }
    }
}

/// Everything that builds a pipeline.
#[derive(Debug, Clone)]
pub struct PipelineArgs {
    pub model: String,
    pub draft_model: Option<String>,
    pub tokenizer: Option<String>,
    /// Speculative fields given on the command line (explicit values only).
    pub speculative: Map<String, Value>,
    /// `--speculative-config`, read into spec-rs fields (its `model`, vLLM's draft, is in
    /// `draft_model`).
    pub speculative_json: Map<String, Value>,
    pub config_file: Option<PathBuf>,
    pub section_name: Option<String>,
    pub dtype: ModelDType,
    /// One per data-parallel replica.
    pub devices: Vec<DeviceSpec>,
    pub engine: EngineConfig,
    pub custom_architectures: Option<String>,
    /// Whether the default model gets its shipped draft when nothing speculative is asked for.
    pub default_draft: bool,
}

#[derive(Debug, Clone)]
pub struct ServerArgs {
    pub host: String,
    pub port: u16,
    pub served_model_name: Option<String>,
    pub api_key: Option<String>,
    /// Requests admitted beyond the running batch before the server answers 429.
    pub max_pending: usize,
    /// Seconds in-flight requests get to finish on SIGINT/SIGTERM.
    pub shutdown_timeout: f64,
    /// The chat template used instead of the model's (`--chat-template`, its text).
    pub chat_template: Option<String>,
    /// How the model writes tool calls, for `tool_choice: "auto"`.
    pub auto_tool_parser: Option<ToolCallParser>,
    /// How a reasoning model marks its thinking, split into `reasoning_content`.
    pub reasoning_parser: Option<ReasoningParser>,
    /// Requests with `tool_choice: "none"` render no tools into the prompt
    /// (`--exclude-tools-when-tool-choice-none`).
    pub exclude_tools_when_tool_choice_none: bool,
    /// Render a `chat_template` a request sends (`--trust-request-chat-template`); refused by
    /// default, as in vLLM: a template is code the server runs.
    pub trust_request_chat_template: bool,
}

impl ServerArgs {
    /// The addresses `host` and `port` name: an IP address (IPv6 with or without brackets) or
    /// a name this machine resolves. Checked before the model loads, so a mistyped host is a
    /// usage error rather than a failed bind minutes later.
    pub fn listen_addrs(&self) -> Result<Vec<std::net::SocketAddr>, String> {
        use std::net::ToSocketAddrs;
        let host = self.host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(&self.host);
        let hint = "give an IP address (127.0.0.1, 0.0.0.0, ::1, ::) or a name this machine resolves";
        // Digits and dots alone are an IPv4 address or a typo, never a host name to look up.
        if host.chars().all(|c| c.is_ascii_digit() || c == '.') && host.parse::<std::net::Ipv4Addr>().is_err() {
            return Err(format!("host '{}' is not a valid IPv4 address; {hint}", self.host));
        }
        match (host, self.port).to_socket_addrs() {
            Ok(addrs) => {
                let addrs: Vec<_> = addrs.collect();
                if addrs.is_empty() {
                    return Err(format!("host '{}' resolves to no address; {hint}", self.host));
                }
                Ok(addrs)
            }
            Err(e) => Err(format!("host '{}' is not an address this machine can listen on ({e}); {hint}", self.host)),
        }
    }
}

#[derive(Debug, Clone)]
pub struct GenerateArgs {
    pub prompt: String,
    pub max_tokens: usize,
    pub temperature: f32,
    pub top_p: f32,
    pub top_k: i64,
    pub seed: Option<u64>,
    /// Independent samples of the prompt (vLLM's `n`; sampling only).
    pub n: usize,
    pub chat: bool,
    pub trace: bool,
    /// `--json-schema`, `--json-object`, `--regex`, `--choice`, `--grammar` or
    /// `--structural-tag`, and the flag it came from.
    pub structured_outputs: Option<(StructuredOutputs, &'static str)>,
}

impl GenerateArgs {
    pub fn sampling_params(&self) -> SamplingParams {
        SamplingParams {
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            seed: self.seed,
            n: self.n,
            max_tokens: Some(self.max_tokens),
            structured_outputs: self.structured_outputs.as_ref().map(|(c, _)| c.clone()),
            ..SamplingParams::default()
        }
    }
}

/// The output constraint of `spec-rs generate`, from whichever of its flags was given (clap
/// allows one). `--json-schema`, `--grammar` and `--structural-tag` take their text, or `@path`
/// to a file holding it.
fn generate_constraint(m: &ArgMatches) -> Result<Option<(StructuredOutputs, &'static str)>, CliError> {
    let text_or_file = |flag: &str, value: &String| match value.strip_prefix('@') {
        Some(path) => {
            std::fs::read_to_string(path).map_err(|e| CliError::Invalid(format!("--{flag}: cannot read '{path}': {e}")))
        }
        None => Ok(value.clone()),
    };
    if let Some(schema) = m.get_one::<String>("json-schema") {
        let text = text_or_file("json-schema", schema)?;
        let constraint = StructuredOutputs { json: Some(Value::String(text)), ..Default::default() };
        return Ok(Some((constraint, "json-schema")));
    }
    if let Some(grammar) = m.get_one::<String>("grammar") {
        let constraint = StructuredOutputs { grammar: Some(text_or_file("grammar", grammar)?), ..Default::default() };
        return Ok(Some((constraint, "grammar")));
    }
    if let Some(tag) = m.get_one::<String>("structural-tag") {
        let text = text_or_file("structural-tag", tag)?;
        let constraint = StructuredOutputs { structural_tag: Some(Value::String(text)), ..Default::default() };
        return Ok(Some((constraint, "structural-tag")));
    }
    if m.get_flag("json-object") {
        return Ok(Some((StructuredOutputs { json_object: Some(true), ..Default::default() }, "json-object")));
    }
    if let Some(regex) = m.get_one::<String>("regex") {
        return Ok(Some((StructuredOutputs { regex: Some(regex.clone()), ..Default::default() }, "regex")));
    }
    Ok(m.get_many::<String>("choice").map(|choices| {
        (StructuredOutputs { choice: Some(choices.cloned().collect()), ..Default::default() }, "choice")
    }))
}

fn pipeline_args(cmd: Command) -> Command {
    let mut cmd = cmd
        .arg(Arg::new("model").long("model").default_value(DEFAULT_MODEL_ALIAS).help(
            "Target model: an alias (smollm2-135m-instruct), a GGUF file, or a Hugging Face checkpoint directory",
        ))
        .arg(
            Arg::new("draft-model")
                .long("draft-model")
                .help("Draft checkpoint directory (eagle, dflash, dflash2, dspark; speculators mtp)"),
        )
        .arg(Arg::new("tokenizer").long("tokenizer").value_name("PATH").help(
            "Directory holding tokenizer.json (or the file) to use instead of the model's: for checkpoints \
             without tokenizer.json and GGUF files whose tokenizer spec-rs does not build",
        ))
        .arg(
            Arg::new("no-default-draft")
                .long("no-default-draft")
                .action(ArgAction::SetTrue)
                .help("Decode the default model without its shipped EAGLE-3 draft (plain decoding)"),
        )
        .arg(Arg::new("speculative-config").long("speculative-config").value_name("JSON").help(
            "Speculative settings as a JSON object (or a file), in spec-rs's field names or vLLM's: \
             '{\"method\": \"eagle3\", \"model\": \"<draft dir>\", \"num_speculative_tokens\": 3}'; \
             it overrides --config-file, and flags given explicitly override it",
        ))
        .arg(
            Arg::new("config-file")
                .long("config-file")
                .value_parser(value_parser!(PathBuf))
                .help("YAML file with speculative settings; flags given explicitly override it"),
        )
        .arg(
            Arg::new("section-name")
                .long("section-name")
                .help("Top-level section of --config-file to read (e.g. speculative)"),
        )
        .arg(
            Arg::new("dtype")
                .long("dtype")
                .default_value("auto")
                .help("Weight dtype: auto, f32, f16, bf16 (CUDA), q8_0, q4_0, q4_1, q4k, q6k"),
        )
        .arg(Arg::new("device").long("device").default_value("cpu").help(
            "cpu, cuda or cuda:N; a comma-separated list (cuda:0,cuda:1) runs one data-parallel replica per device",
        ))
        .arg(
            Arg::new("max-num-seqs")
                .long("max-num-seqs")
                .value_parser(value_parser!(usize))
                .default_value("64")
                .help("Sequences decoded together"),
        )
        .arg(
            Arg::new("max-model-len")
                .long("max-model-len")
                .value_parser(value_parser!(usize))
                .help("Context length (default: the model's)"),
        )
        .arg(
            Arg::new("max-num-batched-tokens")
                .long("max-num-batched-tokens")
                .value_parser(value_parser!(usize))
                .default_value("2048"),
        )
        .arg(
            Arg::new("kv-cache-memory")
                .long("kv-cache-memory")
                .value_parser(value_parser!(u64))
                .default_value("1073741824")
                .help("Bytes of KV cache (target and drafter)"),
        )
        .arg(Arg::new("block-size").long("block-size").value_parser(value_parser!(usize)).default_value("16"))
        .arg(
            Arg::new("enable-spec-decode-mixed-batches")
                .long("enable-spec-decode-mixed-batches")
                .action(ArgAction::SetTrue)
                .help("Verify drafts on steps that also prefill (architectures that support it)"),
        )
        .arg(Arg::new("device-graph-capture").long("device-graph-capture").action(ArgAction::SetTrue).help(
            "Run decode steps on captured shapes: CUDA graphs replayed on a GPU, the same padded steps eagerly on CPU",
        ))
        .arg(
            Arg::new("max-seq-len-to-capture")
                .long("max-seq-len-to-capture")
                .value_parser(value_parser!(usize))
                .default_value("4096")
                .help("Longest context a captured step attends over; rows past it run uncaptured"),
        )
        .arg(
            Arg::new("enable-prefix-caching")
                .long("enable-prefix-caching")
                .action(ArgAction::SetTrue)
                .overrides_with("no-enable-prefix-caching")
                .help("Reuse the KV blocks (target and drafter) of prompt prefixes earlier requests computed (the default)"),
        )
        .arg(
            Arg::new("no-enable-prefix-caching")
                .long("no-enable-prefix-caching")
                .action(ArgAction::SetTrue)
                .overrides_with("enable-prefix-caching")
                .help("Compute every prompt in full instead of reusing cached prefixes"),
        )
        .arg(
            Arg::new("custom-architectures")
                .long("custom-architectures")
                .help("Python module (path.py or dir:module) exposing ARCHITECTURES; needs the Python console script"),
        );
    for f in SPECULATIVE_FLAGS {
        let long = f.field.replace('_', "-");
        let arg = Arg::new(f.field).long(long.clone()).help(f.help);
        cmd = match f.kind {
            FlagKind::Bool => {
                let neg_id = format!("no_{}", f.field);
                cmd.arg(arg.action(ArgAction::SetTrue).overrides_with(neg_id.clone())).arg(
                    Arg::new(neg_id)
                        .long(format!("no-{long}"))
                        .action(ArgAction::SetTrue)
                        .overrides_with(f.field)
                        .hide(true),
                )
            }
            FlagKind::Int => cmd.arg(arg.value_parser(value_parser!(i64)).allow_negative_numbers(true)),
            FlagKind::Float => cmd.arg(arg.value_parser(value_parser!(f64)).allow_negative_numbers(true)),
            FlagKind::Str | FlagKind::Json => cmd.arg(arg),
            FlagKind::Choice(choices) => cmd.arg(
                arg.value_parser(clap::builder::PossibleValuesParser::new(choices.iter().copied())).ignore_case(true),
            ),
        };
    }
    cmd
}

/// The full command tree.
pub fn command() -> Command {
    Command::new("spec-rs")
        .version(env!("CARGO_PKG_VERSION"))
        .about("Speculative-decoding LLM inference: EAGLE, MTP, DFlash, DFlash2, DSpark and n-gram drafters on a Rust core")
        .subcommand_required(true)
        .arg_required_else_help(true)
        .subcommand(
            pipeline_args(Command::new("serve").about("Serve the OpenAI-compatible API (chat and completions, streaming, /metrics)"))
                .arg(Arg::new("host").long("host").default_value("127.0.0.1"))
                .arg(Arg::new("port").long("port").value_parser(value_parser!(u16)).default_value("8000"))
                .arg(Arg::new("served-model-name").long("served-model-name").help("Model name clients send (default: the --model value)"))
                .arg(Arg::new("api-key").long("api-key").env("SPEC_RS_API_KEY").help("Require 'Authorization: Bearer KEY' on every endpoint but /health (an empty key is refused: leave it unset to serve without one)"))
                .arg(Arg::new("max-pending").long("max-pending").value_parser(value_parser!(usize)).help(
                    "Requests queued beyond the running batch before answering 429 (default: 4 x --max-num-seqs)",
                ))
                .arg(Arg::new("shutdown-timeout").long("shutdown-timeout").value_parser(grace_seconds).default_value("10").help(
                    "Seconds running requests get to finish after SIGINT/SIGTERM (0 to 86400)",
                ))
                .arg(Arg::new("chat-template").long("chat-template").help(
                    "A Jinja chat template (a file, or the template itself) used instead of the model's",
                ))
                .arg(Arg::new("enable-auto-tool-choice").long("enable-auto-tool-choice").action(ArgAction::SetTrue).help(
                    "Let requests with tools use tool_choice 'auto' (the model calls tools when it decides to); needs --tool-call-parser",
                ))
                .arg(
                    Arg::new("exclude-tools-when-tool-choice-none")
                        .long("exclude-tools-when-tool-choice-none")
                        .action(ArgAction::SetTrue)
                        .help("Leave a request's tools out of its prompt when its tool_choice is 'none' (by default the template still sees them)"),
                )
                .arg(
                    Arg::new("trust-request-chat-template")
                        .long("trust-request-chat-template")
                        .action(ArgAction::SetTrue)
                        .help("Render a chat_template a request sends (refused by default: a template is code the server runs)"),
                )
                .arg(Arg::new("reasoning-parser").long("reasoning-parser").value_parser(ReasoningParser::NAMES).help(
                    "Split a reasoning model's thinking into reasoning_content: deepseek_r1 / minimax_m2 (up to </think>), qwen3 (a <think> block the output opens with), openai_gptoss (gpt-oss's analysis channel) or seed_oss (up to </seed:think>)",
                ))
                .arg(Arg::new("tool-call-parser").long("tool-call-parser").value_parser(ToolCallParser::NAMES).help(
                    "How the model writes tool calls, read for tool_choice 'auto': hermes (<tool_call>{...}</tool_call>, Qwen) llama3_json / llama4_json (<|python_tag|>{...}; {...}, Llama 3), mistral ([TOOL_CALLS][...]), granite (<|tool_call|>[...], IBM Granite), pythonic / llama4_pythonic ([f(a=1), g()], Llama 3.2 / 4), qwen3_coder / qwen3_xml (<function=f><parameter=a>1</parameter></function>), seed_oss (the same in <seed:tool_call> blocks), minimax_m2 (<minimax:tool_call><invoke name=\"f\"><parameter name=\"a\">1</parameter></invoke>...), glm45 / glm47 (<tool_call>f<arg_key>a</arg_key><arg_value>1</arg_value></tool_call>, GLM), deepseek_v3 / deepseek_v31 (<｜tool▁calls▁begin｜>...), kimi_k2 (<|tool_calls_section_begin|>...), jamba / hunyuan_a13b / minimax (<tool_calls>...</tool_calls>), longcat (<longcat_tool_call>{...}</longcat_tool_call>), internlm (<|action_start|><|plugin|>{...}<|action_end|>), phi4_mini_json (functools[...]), granite-20b-fc (<function_call> {...} before each call), ernie45 (Hermes's blocks, ERNIE 4.5), xlam ([{...}] bare, fenced, after [TOOL_CALLS] or in <tool_call>), step3 (<steptml:invoke name=\"f\"><steptml:parameter name=\"a\">1</steptml:parameter></steptml:invoke> in Step 3's call markers), olmo3 (<function_calls> with a Python-style call a line, OLMo 3) or openai (gpt-oss's harmony: <|channel|>commentary to=functions.f<|message|>{...})",
                )),
        )
        .subcommand(
            pipeline_args(Command::new("generate").about("Generate once, streaming text and live acceptance statistics"))
                .arg(Arg::new("prompt").required(true).help("The prompt (a user message unless --no-chat)"))
                .arg(Arg::new("max-tokens").long("max-tokens").value_parser(value_parser!(usize)).default_value("128"))
                // Negative values parse as values, so the sampling rules can say what is wrong.
                .arg(
                    Arg::new("temperature")
                        .long("temperature")
                        .value_parser(value_parser!(f32))
                        .allow_negative_numbers(true)
                        .default_value("0"),
                )
                .arg(
                    Arg::new("top-p")
                        .long("top-p")
                        .value_parser(value_parser!(f32))
                        .allow_negative_numbers(true)
                        .default_value("1"),
                )
                .arg(
                    Arg::new("top-k")
                        .long("top-k")
                        .value_parser(value_parser!(i64))
                        .allow_negative_numbers(true)
                        .default_value("0"),
                )
                .arg(Arg::new("seed").long("seed").value_parser(value_parser!(u64)))
                .arg(Arg::new("n").long("n").value_parser(value_parser!(usize)).default_value("1").help(
                    "Independent samples of the prompt, each printed when it finishes (needs --temperature > 0)",
                ))
                .arg(Arg::new("no-chat").long("no-chat").action(ArgAction::SetTrue).help("Send the prompt as raw text, without the chat template"))
                .arg(Arg::new("trace").long("trace").action(ArgAction::SetTrue).help(
                    "Print per step the drafted tokens, the target's tokens there, and how many were accepted",
                ))
                .arg(Arg::new("json-schema").long("json-schema").value_name("SCHEMA").help(
                    "Structured output: a JSON schema the output follows (its JSON text, or @file)",
                ))
                .arg(
                    Arg::new("json-object")
                        .long("json-object")
                        .action(ArgAction::SetTrue)
                        .help("Structured output: any JSON object"),
                )
                .arg(Arg::new("regex").long("regex").help("Structured output: a regex the whole output matches"))
                .arg(
                    Arg::new("choice")
                        .long("choice")
                        .action(ArgAction::Append)
                        .help("Structured output: one of these strings (repeat the flag)"),
                )
                .arg(Arg::new("grammar").long("grammar").value_name("EBNF").help(
                    "Structured output: a context-free grammar, EBNF (`root ::= ...`) or Lark (`start: ...`) (its text, or @file)",
                ))
                .arg(Arg::new("structural-tag").long("structural-tag").value_name("JSON").help(
                    "Structured output: a structural tag, free text with constrained regions ({\"type\": \"structural_tag\", \"format\": ...}; its JSON, or @file)",
                ))
                .group(ArgGroup::new("structured-output").args([
                    "json-schema",
                    "json-object",
                    "regex",
                    "choice",
                    "grammar",
                    "structural-tag",
                ])),
        )
        .subcommand(crate::train_cli::command())
}

/// A command-line error; the binary prints it and exits with status 2.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error(transparent)]
    Clap(#[from] clap::Error),
    #[error("{0}")]
    Invalid(String),
}

/// Longest `--shutdown-timeout`: a day.
const MAX_GRACE_SECONDS: f64 = 86_400.0;

/// A shutdown grace period: finite seconds in `[0, MAX_GRACE_SECONDS]` (`inf` would overflow
/// the shutdown deadline, NaN would mean nothing).
pub fn check_shutdown_timeout(seconds: f64) -> Result<f64, String> {
    if !(0.0..=MAX_GRACE_SECONDS).contains(&seconds) {
        return Err(format!("shutdown_timeout must be between 0 and {MAX_GRACE_SECONDS} seconds, got {seconds}"));
    }
    Ok(seconds)
}

/// An API key, refused when empty: no client could send a bearer token that matches it.
pub fn check_api_key(key: Option<String>) -> Result<Option<String>, String> {
    match key {
        Some(k) if k.trim().is_empty() => {
            Err("api_key is empty: no client could authenticate; give a key, or leave it out to serve without one"
                .into())
        }
        key => Ok(key),
    }
}

/// `--shutdown-timeout` (clap exits with code 2 on an error).
fn grace_seconds(text: &str) -> Result<f64, String> {
    let seconds: f64 = text.trim().parse().map_err(|_| format!("'{text}' is not a number of seconds"))?;
    check_shutdown_timeout(seconds)
}

fn speculative_values(m: &ArgMatches) -> Result<Map<String, Value>, CliError> {
    let mut out = Map::new();
    for f in SPECULATIVE_FLAGS {
        let value = match f.kind {
            FlagKind::Bool => {
                if m.get_flag(f.field) {
                    Some(Value::Bool(true))
                } else if m.get_flag(&format!("no_{}", f.field)) {
                    Some(Value::Bool(false))
                } else {
                    None
                }
            }
            FlagKind::Int => m.get_one::<i64>(f.field).map(|v| Value::from(*v)),
            FlagKind::Float => match m.get_one::<f64>(f.field) {
                // JSON has no NaN or infinity: `Value::from` would make them null, i.e. unset.
                Some(v) if !v.is_finite() => {
                    return Err(CliError::Invalid(format!(
                        "--{} must be a finite number, got {v}",
                        f.field.replace('_', "-")
                    )));
                }
                v => v.map(|v| Value::from(*v)),
            },
            FlagKind::Str => m.get_one::<String>(f.field).map(|v| Value::String(v.clone())),
            FlagKind::Choice(_) => m.get_one::<String>(f.field).map(|v| Value::String(v.to_lowercase())),
            FlagKind::Json => match m.get_one::<String>(f.field) {
                None => None,
                Some(text) => Some(parse_json_flag(f.field, text)?),
            },
        };
        if let Some(v) = value {
            out.insert(f.field.to_string(), v);
        }
    }
    Ok(out)
}

/// A JSON flag: inline JSON (starting with `[` or `{`) or a path to a YAML/JSON file.
fn parse_json_flag(field: &str, text: &str) -> Result<Value, CliError> {
    let trimmed = text.trim_start();
    let flag = format!("--{}", field.replace('_', "-"));
    if trimmed.starts_with('[') || trimmed.starts_with('{') {
        return serde_json::from_str(trimmed).map_err(|e| CliError::Invalid(format!("{flag}: invalid JSON: {e}")));
    }
    let content = std::fs::read_to_string(text)
        .map_err(|e| CliError::Invalid(format!("{flag}: '{text}' is neither inline JSON nor a readable file: {e}")))?;
    serde_yaml::from_str::<Value>(&content).map_err(|e| CliError::Invalid(format!("{flag}: {text}: {e}")))
}

/// `--speculative-config`: spec-rs fields, and the draft checkpoint when it is in vLLM's spelling
/// (`model`).
fn speculative_config_json(m: &ArgMatches) -> Result<(Map<String, Value>, Option<String>), CliError> {
    let Some(text) = m.get_one::<String>("speculative-config") else {
        return Ok((Map::new(), None));
    };
    let invalid = |message: String| CliError::Invalid(format!("--speculative-config: {message}"));
    let Value::Object(values) = parse_json_flag("speculative_config", text)? else {
        return Err(invalid("must be a JSON object of field names to values".into()));
    };
    let (mut fields, dialect) = vllm::split_dialect(values);
    let names: Vec<&str> = fields.keys().map(String::as_str).collect();
    let translated = vllm::translate(&dialect, &names).map_err(|e| invalid(e.message))?;
    fields.extend(translated.fields);
    Ok((fields, translated.draft_model))
}

fn pipeline_from(m: &ArgMatches) -> Result<PipelineArgs, CliError> {
    let invalid = |e: specrs_engine::EngineError| CliError::Invalid(e.to_string());
    let engine = EngineConfig {
        max_num_seqs: *m.get_one::<usize>("max-num-seqs").expect("default"),
        max_num_batched_tokens: *m.get_one::<usize>("max-num-batched-tokens").expect("default"),
        kv_cache_bytes: *m.get_one::<u64>("kv-cache-memory").expect("default"),
        block_size: *m.get_one::<usize>("block-size").expect("default"),
        max_model_len: m.get_one::<usize>("max-model-len").copied(),
        enable_spec_decode_mixed_batches: m.get_flag("enable-spec-decode-mixed-batches"),
        device_graph_capture: m.get_flag("device-graph-capture"),
        max_seq_len_to_capture: *m.get_one::<usize>("max-seq-len-to-capture").expect("default"),
        enable_prefix_caching: !m.get_flag("no-enable-prefix-caching"),
        ..EngineConfig::default()
    };
    if engine.max_num_seqs == 0 || engine.block_size == 0 || engine.max_seq_len_to_capture == 0 {
        return Err(CliError::Invalid(
            "--max-num-seqs, --block-size and --max-seq-len-to-capture must be at least 1".into(),
        ));
    }
    let (speculative_json, json_draft) = speculative_config_json(m)?;
    let draft_model = match (m.get_one::<String>("draft-model").cloned(), json_draft) {
        (Some(flag), Some(json)) if std::path::Path::new(&flag) != std::path::Path::new(&json) => {
            return Err(CliError::Invalid(format!(
                "--draft-model '{flag}' and --speculative-config's model '{json}' name different drafts: give one"
            )));
        }
        (flag, json) => flag.or(json),
    };
    Ok(PipelineArgs {
        model: m.get_one::<String>("model").expect("default").clone(),
        draft_model,
        tokenizer: m.get_one::<String>("tokenizer").cloned(),
        speculative: speculative_values(m)?,
        speculative_json,
        config_file: m.get_one::<PathBuf>("config-file").cloned(),
        section_name: m.get_one::<String>("section-name").cloned(),
        dtype: m
            .get_one::<String>("dtype")
            .expect("default")
            .parse()
            .map_err(|e: specrs_models::ModelError| CliError::Invalid(format!("--dtype: {e}")))?,
        devices: DeviceSpec::parse_list(m.get_one::<String>("device").expect("default")).map_err(invalid)?,
        engine,
        custom_architectures: m.get_one::<String>("custom-architectures").cloned(),
        default_draft: !m.get_flag("no-default-draft"),
    })
}

/// `--chat-template`: a file's text, or the template itself (as vLLM reads it); checked now,
/// so a broken template exits with 2 before the model loads.
pub fn chat_template_arg(value: &str) -> Result<String, CliError> {
    let text = match std::fs::read_to_string(value) {
        Ok(text) => text,
        Err(_) if value.contains("{{") || value.contains("{%") => value.to_string(),
        Err(e) => {
            return Err(CliError::Invalid(format!(
                "--chat-template: cannot read '{value}' ({e}), and it is not a Jinja template itself"
            )));
        }
    };
    specrs_engine::ChatTemplate::new(text.clone()).map_err(|e| CliError::Invalid(format!("--chat-template: {e}")))?;
    Ok(text)
}

/// The parser for `tool_choice: "auto"`: both flags, or neither.
fn auto_tool_parser(m: &ArgMatches) -> Result<Option<ToolCallParser>, CliError> {
    let parser = m.get_one::<String>("tool-call-parser").map(|name| ToolCallParser::parse(name)).transpose();
    let parser = parser.map_err(CliError::Invalid)?;
    match (m.get_flag("enable-auto-tool-choice"), parser) {
        (true, None) => Err(CliError::Invalid(format!(
            "--enable-auto-tool-choice needs --tool-call-parser to say how the model writes its calls ({})",
            ToolCallParser::NAMES.join(", ")
        ))),
        (true, parser) => Ok(parser),
        // A parser alone serves no request: "auto" stays off until it is enabled.
        (false, _) => Ok(None),
    }
}

/// Parses arguments (without the program name) into a command.
pub fn parse<I, T>(args: I) -> Result<CliCommand, CliError>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let matches = command()
        .try_get_matches_from(std::iter::once(OsString::from("spec-rs")).chain(args.into_iter().map(Into::into)))?;
    match matches.subcommand() {
        Some(("serve", m)) => {
            let pipeline = pipeline_from(m)?;
            let max_num_seqs = pipeline.engine.max_num_seqs;
            let server = ServerArgs {
                host: m.get_one::<String>("host").expect("default").clone(),
                port: *m.get_one::<u16>("port").expect("default"),
                served_model_name: m.get_one::<String>("served-model-name").cloned(),
                api_key: check_api_key(m.get_one::<String>("api-key").cloned())
                    .map_err(|e| CliError::Invalid(format!("--api-key: {e}")))?,
                max_pending: m.get_one::<usize>("max-pending").copied().unwrap_or(4 * max_num_seqs),
                shutdown_timeout: *m.get_one::<f64>("shutdown-timeout").expect("default"),
                chat_template: m.get_one::<String>("chat-template").map(|t| chat_template_arg(t)).transpose()?,
                auto_tool_parser: auto_tool_parser(m)?,
                reasoning_parser: m
                    .get_one::<String>("reasoning-parser")
                    .map(|name| ReasoningParser::parse(name))
                    .transpose()
                    .map_err(CliError::Invalid)?,
                exclude_tools_when_tool_choice_none: m.get_flag("exclude-tools-when-tool-choice-none"),
                trust_request_chat_template: m.get_flag("trust-request-chat-template"),
            };
            server.listen_addrs().map_err(|e| CliError::Invalid(format!("--host: {e}")))?;
            Ok(CliCommand::Serve { pipeline, server })
        }
        Some(("generate", m)) => {
            let generate = GenerateArgs {
                prompt: m.get_one::<String>("prompt").expect("required").clone(),
                max_tokens: *m.get_one::<usize>("max-tokens").expect("default"),
                temperature: *m.get_one::<f32>("temperature").expect("default"),
                top_p: *m.get_one::<f32>("top-p").expect("default"),
                top_k: *m.get_one::<i64>("top-k").expect("default"),
                seed: m.get_one::<u64>("seed").copied(),
                n: *m.get_one::<usize>("n").expect("default"),
                chat: !m.get_flag("no-chat"),
                trace: m.get_flag("trace"),
                structured_outputs: generate_constraint(m)?,
            };
            // Checked before a model loads: a typo costs no load time and exits with 2.
            generate.sampling_params().validate(usize::MAX).map_err(|e| {
                let flag = match (e.field.as_deref(), &generate.structured_outputs) {
                    (Some("structured_outputs"), Some((_, flag))) => format!("--{flag}: "),
                    (field, _) => field.map_or_else(String::new, |f| format!("--{}: ", f.replace('_', "-"))),
                };
                CliError::Invalid(format!("{flag}{}", e.message))
            })?;
            Ok(CliCommand::Generate { pipeline: pipeline_from(m)?, generate })
        }
        Some(("train-draft", m)) => Ok(CliCommand::TrainDraft(Box::new(crate::train_cli::parse(m)?))),
        _ => unreachable!("a subcommand is required"),
    }
}

impl PipelineArgs {
    /// The speculative config: the file (or its section) as base, explicit flags on top,
    /// validated by the shared rules.
    pub fn speculative_config(&self) -> Result<SpeculativeConfig, CliError> {
        let mut values = match &self.config_file {
            Some(path) => {
                load_config_file(path, self.section_name.as_deref()).map_err(|e| CliError::Invalid(e.to_string()))?
            }
            None if self.section_name.is_some() => {
                return Err(CliError::Invalid("--section-name needs --config-file".into()));
            }
            None => Map::new(),
        };
        deep_merge(&mut values, &self.speculative_json);
        deep_merge(&mut values, &self.speculative);
        SpeculativeConfig::from_json(&Value::Object(values))
            .and_then(SpeculativeConfig::validated)
            .map_err(|e| CliError::Invalid(e.message))
    }

    /// The draft checkpoint and speculative config to run: the ones asked for, or the model's
    /// shipped draft when nothing speculative was asked for (no draft, flags or config file).
    pub fn speculation(&self) -> Result<(Option<String>, SpeculativeConfig), CliError> {
        let spec = self.speculative_config()?;
        let asked_nothing = self.draft_model.is_none()
            && self.config_file.is_none()
            && self.speculative.is_empty()
            && self.speculative_json.is_empty();
        if self.default_draft && asked_nothing {
            let shipped = specrs_engine::default_draft(&self.model).map_err(|e| CliError::Invalid(e.to_string()))?;
            if let Some(draft) = shipped {
                tracing::info!(
                    "running {} with its shipped EAGLE-3 draft ({}); --no-default-draft decodes plainly",
                    self.model,
                    draft.path.display()
                );
                return Ok((Some(draft.path.to_string_lossy().into_owned()), draft.speculative));
            }
        }
        Ok((self.draft_model.clone(), spec))
    }

    /// The arguments as JSON for the Python console script, with the speculative config
    /// already merged from the file and validated.
    pub fn to_json(&self) -> Result<Value, CliError> {
        let (draft_model, speculative) = self.speculation()?;
        let device = self.devices.iter().map(ToString::to_string).collect::<Vec<_>>().join(",");
        Ok(serde_json::json!({
            "model": self.model,
            "draft_model": draft_model,
            "tokenizer": self.tokenizer,
            "speculative_config": speculative.to_json(),
            "dtype": self.dtype.as_str(),
            "device": device,
            "max_num_seqs": self.engine.max_num_seqs,
            "max_model_len": self.engine.max_model_len,
            "max_num_batched_tokens": self.engine.max_num_batched_tokens,
            "kv_cache_bytes": self.engine.kv_cache_bytes,
            "block_size": self.engine.block_size,
            "enable_spec_decode_mixed_batches": self.engine.enable_spec_decode_mixed_batches,
            "device_graph_capture": self.engine.device_graph_capture,
            "max_seq_len_to_capture": self.engine.max_seq_len_to_capture,
            "enable_prefix_caching": self.engine.enable_prefix_caching,
            "custom_architectures": self.custom_architectures,
        }))
    }

    /// The pipeline configuration (built-in architectures only).
    pub fn pipeline_config(&self) -> Result<PipelineConfig, CliError> {
        if self.custom_architectures.is_some() {
            return Err(CliError::Invalid(
                "--custom-architectures loads a Python module: run the Python console script (pip install spec-rs; spec-rs ...)".into(),
            ));
        }
        let (draft_model, speculative) = self.speculation()?;
        Ok(PipelineConfig {
            model: self.model.clone(),
            draft_model,
            tokenizer: self.tokenizer.clone(),
            speculative,
            dtype: self.dtype,
            devices: self.devices.clone(),
            engine: self.engine.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn serve(args: &[&str]) -> PipelineArgs {
        let mut v = vec!["serve"];
        v.extend_from_slice(args);
        match parse(v).unwrap() {
            CliCommand::Serve { pipeline, .. } => pipeline,
            other => panic!("{other:?}"),
        }
    }

    fn server(args: &[&str]) -> Result<ServerArgs, CliError> {
        match parse([&["serve"], args].concat())? {
            CliCommand::Serve { server, .. } => Ok(server),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn hosts_that_name_no_address_are_usage_errors_and_ipv6_literals_bind() {
        for host in ["999.1.1.1", "1.2.3", "127.0.0.1.5"] {
            let e = server(&["--host", host]).unwrap_err().to_string();
            assert!(e.contains("--host") && e.contains(host) && e.contains("not a valid IPv4 address"), "{e}");
        }
        let e = server(&["--host", "bad host!"]).unwrap_err().to_string();
        assert!(e.contains("not an address this machine can listen on"), "{e}");
        for (host, want) in
            [("127.0.0.1", "127.0.0.1:0"), ("::1", "[::1]:0"), ("[::1]", "[::1]:0"), ("0.0.0.0", "0.0.0.0:0")]
        {
            let addrs = server(&["--host", host, "--port", "0"]).unwrap().listen_addrs().unwrap();
            assert_eq!(addrs[0].to_string(), want, "{host}");
        }
    }

    #[test]
    fn speculative_flags_become_explicit_config_values() {
        let p = serve(&[
            "--speculative-method",
            "EAGLE",
            "--num-speculative-tokens",
            "3",
            "--use-greedy-acceptance",
            "--num-speculative-tokens-per-batch-size",
            r#"[{"batch_start":1,"batch_end":4,"num_tokens":2}]"#,
        ]);
        let cfg = p.speculative_config().unwrap();
        assert_eq!(cfg.speculative_method, Some(specrs_core::SpeculativeMethod::Eagle));
        assert_eq!(cfg.num_speculative_tokens, Some(3));
        assert!(cfg.use_greedy_acceptance);
        assert_eq!(cfg.verify_width_schedule(), Some(vec![(1, 4, 2)]));
        assert!(!p.speculative.contains_key("relaxed_topk"), "unset flags stay unset");
    }

    fn server_args(args: &[&str]) -> Result<ServerArgs, CliError> {
        match parse(std::iter::once("serve").chain(args.iter().copied()))? {
            CliCommand::Serve { server, .. } => Ok(server),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn tool_flags_turn_on_auto_only_together_and_chat_templates_are_read_and_checked() {
        let both = server_args(&["--enable-auto-tool-choice", "--tool-call-parser", "hermes"]).unwrap();
        assert_eq!(both.auto_tool_parser, Some(ToolCallParser::Hermes));
        assert_eq!(server_args(&["--tool-call-parser", "hermes"]).unwrap().auto_tool_parser, None);
        let e = server_args(&["--enable-auto-tool-choice"]).unwrap_err().to_string();
        assert!(e.contains("needs --tool-call-parser"), "{e}");
        assert!(server_args(&["--tool-call-parser", "no_such_parser"]).is_err(), "not a parser spec-rs has");
        assert!(!both.exclude_tools_when_tool_choice_none, "vLLM's default: the tools are rendered");
        assert!(server_args(&["--exclude-tools-when-tool-choice-none"]).unwrap().exclude_tools_when_tool_choice_none);
        assert!(!both.trust_request_chat_template, "vLLM's default: request templates are refused");
        assert!(server_args(&["--trust-request-chat-template"]).unwrap().trust_request_chat_template);

        let inline = "{% for m in messages %}{{ m.content }}{% endfor %}";
        assert_eq!(server_args(&["--chat-template", inline]).unwrap().chat_template.as_deref(), Some(inline));
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("t.jinja");
        std::fs::write(&file, inline).unwrap();
        let read = server_args(&["--chat-template", file.to_str().unwrap()]).unwrap();
        assert_eq!(read.chat_template.as_deref(), Some(inline));
        let missing = server_args(&["--chat-template", "/nonexistent/t.jinja"]).unwrap_err().to_string();
        assert!(missing.contains("cannot read '/nonexistent/t.jinja'"), "{missing}");
        let broken = server_args(&["--chat-template", "{% for %}"]).unwrap_err().to_string();
        assert!(broken.contains("invalid chat template"), "{broken}");
    }

    #[test]
    fn boolean_flags_pair_with_their_negation() {
        let p = serve(&["--logit-penalties", "--no-logit-penalties"]);
        assert_eq!(p.speculative.get("logit_penalties"), Some(&Value::Bool(false)));
    }

    #[test]
    fn prefix_caching_is_on_unless_the_last_flag_turns_it_off() {
        let caching = |args: &[&str]| serve(args).engine.enable_prefix_caching;
        assert!(caching(&[]));
        assert!(!caching(&["--no-enable-prefix-caching"]));
        assert!(caching(&["--no-enable-prefix-caching", "--enable-prefix-caching"]));
        assert!(!caching(&["--enable-prefix-caching", "--no-enable-prefix-caching"]));
        let json = serve(&["--no-enable-prefix-caching"]).to_json().unwrap();
        assert_eq!(json["enable_prefix_caching"], Value::Bool(false), "the console script gets it too");
    }

    #[test]
    fn rule_violations_are_cli_errors() {
        let p = serve(&["--speculative-method", "eagle", "--synthetic-acceptance-rate", "1.5"]);
        let e = p.speculative_config().unwrap_err().to_string();
        assert!(e.contains("synthetic_acceptance_rate must be between 0.0 and 1.0"), "{e}");
        assert!(parse(["serve", "--speculative-method", "medusa"]).is_err());
        // JSON has no NaN or infinity: they must not become an unset value.
        for bad in ["inf", "NaN", "infinity"] {
            let e = parse(["serve", "--synthetic-acceptance-rate", bad]).unwrap_err().to_string();
            assert!(e.contains("--synthetic-acceptance-rate must be a finite number"), "{bad}: {e}");
        }
        assert!(parse(["serve", "--port", "-1"]).is_err());
        // A grace period that would overflow the shutdown deadline, or mean nothing.
        for bad in ["inf", "1e20", "NaN", "-1", "soon"] {
            assert!(server_args(&["--shutdown-timeout", bad]).is_err(), "{bad}");
        }
        assert_eq!(server_args(&["--shutdown-timeout", "2.5"]).unwrap().shutdown_timeout, 2.5);
        for empty in ["", "  "] {
            let e = server_args(&["--api-key", empty]).unwrap_err().to_string();
            assert!(e.contains("--api-key: api_key is empty: no client could authenticate"), "{e}");
        }
        assert_eq!(server_args(&["--api-key", "k"]).unwrap().api_key.as_deref(), Some("k"));
    }

    #[test]
    fn generate_sampling_flags_are_checked_before_a_model_loads() {
        for (args, needle) in [
            (&["--temperature", "-1"][..], "--temperature: temperature must be a finite number >= 0"),
            (&["--top-p", "2"][..], "--top-p: top_p must be in (0, 1]"),
            (&["--max-tokens", "0"][..], "--max-tokens: max_tokens must be >= 1"),
            (&["--n", "2"][..], "--n: n must be 1 when decoding greedily"),
        ] {
            let mut v = vec!["generate", "hi"];
            v.extend_from_slice(args);
            match parse(v) {
                Err(CliError::Invalid(e)) => assert!(e.contains(needle), "{e}"),
                other => panic!("{args:?}: {other:?}"),
            }
        }
        match parse(["generate", "hi", "--top-k", "-1", "--temperature", "0.5"]).unwrap() {
            CliCommand::Generate { generate, .. } => assert_eq!((generate.top_k, generate.temperature), (-1, 0.5)),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn generate_takes_one_output_constraint_and_checks_it_before_a_model_loads() {
        let constraint = |args: &[&str]| match parse([&["generate", "hi"][..], args].concat()).unwrap() {
            CliCommand::Generate { generate, .. } => generate.sampling_params().structured_outputs,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            constraint(&["--choice", "yes", "--choice", "no"]).unwrap().choice,
            Some(vec!["yes".into(), "no".into()])
        );
        assert_eq!(constraint(&["--json-object"]).unwrap().json_object, Some(true));
        assert_eq!(constraint(&["--regex", "[0-9]+"]).unwrap().regex.as_deref(), Some("[0-9]+"));
        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(f.path(), r#"{"type": "object", "properties": {"a": {"type": "integer"}}}"#).unwrap();
        let from_file = format!("@{}", f.path().display());
        assert!(constraint(&["--json-schema", &from_file]).unwrap().json.is_some());
        let grammar = r#"root ::= "(" [a-z]* ")""#;
        assert_eq!(constraint(&["--grammar", grammar]).unwrap().grammar.as_deref(), Some(grammar));
        std::fs::write(f.path(), grammar).unwrap();
        assert_eq!(constraint(&["--grammar", &from_file]).unwrap().grammar.as_deref(), Some(grammar));
        let tag = r#"{"type": "structural_tag", "format": {"type": "const_string", "value": "ok"}}"#;
        assert_eq!(constraint(&["--structural-tag", tag]).unwrap().structural_tag, Some(Value::String(tag.into())));
        assert!(constraint(&[]).is_none());
        for (args, needle) in [
            (&["--regex", "("][..], "--regex: structured_outputs.regex is not a valid regex"),
            (&["--json-schema", r#"{"type": "number", "maximum": 3}"#][..], "--json-schema: "),
            (&["--json-schema", "@/no/such/schema.json"][..], "--json-schema: cannot read"),
            (&["--grammar", "root ::= item"][..], "--grammar: structured_outputs.grammar: rule `item` is used"),
            (&["--grammar", "@/no/such/grammar.ebnf"][..], "--grammar: cannot read"),
            (
                &["--structural-tag", r#"{"type": "structural_tag", "format": {"type": "token"}}"#][..],
                "--structural-tag: structured_outputs.structural_tag at format: the token-level format",
            ),
        ] {
            match parse([&["generate", "hi"][..], args].concat()) {
                Err(CliError::Invalid(e)) => assert!(e.contains(needle), "{e}"),
                other => panic!("{args:?}: {other:?}"),
            }
        }
        assert!(matches!(parse(["generate", "hi", "--regex", "a", "--json-object"]), Err(CliError::Clap(_))));
    }

    #[test]
    fn vllm_speculative_config_json_runs_with_its_draft_between_file_and_flags() {
        let p = serve(&[
            "--speculative-config",
            r#"{"method": "eagle3", "model": "/ckpt/eagle3", "num_speculative_tokens": 5}"#,
            "--num-speculative-tokens",
            "2",
        ]);
        assert_eq!(p.draft_model.as_deref(), Some("/ckpt/eagle3"));
        let (draft, cfg) = p.speculation().unwrap();
        assert_eq!(draft.as_deref(), Some("/ckpt/eagle3"));
        assert_eq!(cfg.speculative_method, Some(specrs_core::SpeculativeMethod::Eagle));
        assert_eq!(cfg.num_speculative_tokens, Some(2), "an explicit flag overrides the JSON");

        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(f.path(), "speculative_method: ngram\nprompt_lookup_max: 6\nnum_speculative_tokens: 6\n")
            .unwrap();
        let path = f.path().to_str().unwrap();
        let cfg = serve(&["--config-file", path, "--speculative-config", r#"{"num_speculative_tokens": 3}"#])
            .speculative_config()
            .unwrap();
        assert_eq!((cfg.prompt_lookup_max, cfg.num_speculative_tokens), (6, Some(3)), "the JSON overrides the file");
    }

    #[test]
    fn bad_speculative_config_json_is_a_usage_error_naming_the_flag() {
        let err = |args: &[&str]| {
            let mut v = vec!["serve"];
            v.extend_from_slice(args);
            parse(v).unwrap_err().to_string()
        };
        let e = err(&["--speculative-config", r#"{"method": "medusa"}"#]);
        assert!(e.starts_with("--speculative-config: ") && e.contains("medusa"), "{e}");
        let e = err(&["--speculative-config", "{not json"]);
        assert!(e.contains("--speculative-config") && e.contains("invalid JSON"), "{e}");
        let e = err(&["--speculative-config", "[1, 2]"]);
        assert!(e.contains("JSON object"), "{e}");
        let e = err(&["--draft-model", "/a", "--speculative-config", r#"{"method": "eagle", "model": "/b"}"#]);
        assert!(e.contains("name different drafts"), "{e}");
        // The same draft named twice is no conflict.
        let p = serve(&["--draft-model", "/a", "--speculative-config", r#"{"method": "eagle", "model": "/a/"}"#]);
        assert_eq!(p.draft_model.as_deref(), Some("/a"));
    }

    #[test]
    fn config_file_section_is_the_base_and_flags_override() {
        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(f.path(), "speculative:\n  speculative_method: ngram\n  num_speculative_tokens: 6\n").unwrap();
        let path = f.path().to_str().unwrap();
        let p = serve(&["--config-file", path, "--section-name", "speculative", "--num-speculative-tokens", "2"]);
        let cfg = p.speculative_config().unwrap();
        assert_eq!(cfg.speculative_method, Some(specrs_core::SpeculativeMethod::Ngram));
        assert_eq!(cfg.num_speculative_tokens, Some(2));
        let p = serve(&["--config-file", path, "--section-name", "runtime"]);
        assert!(p.speculative_config().unwrap_err().to_string().contains("sections present: speculative"));
        // Loosely typed YAML reads as the Python config reads it (MAX's non-strict model).
        std::fs::write(f.path(), "speculative_method: Ngram\nnum_speculative_tokens: \"3\"\n").unwrap();
        let cfg = serve(&["--config-file", path]).speculative_config().unwrap();
        assert_eq!(
            (cfg.speculative_method, cfg.num_speculative_tokens),
            (Some(specrs_core::SpeculativeMethod::Ngram), Some(3))
        );
    }

    #[test]
    fn help_lists_every_speculative_flag() {
        let mut serve = command().find_subcommand("serve").unwrap().clone();
        let help = serve.render_long_help().to_string();
        for f in SPECULATIVE_FLAGS {
            assert!(help.contains(&format!("--{}", f.field.replace('_', "-"))), "{}", f.field);
        }
    }

    #[test]
    fn default_model_without_speculative_flags_gets_the_shipped_draft() {
        let (draft, spec) = serve(&[]).speculation().unwrap();
        assert!(draft.unwrap().contains("smollm2-135m-instruct-eagle3"));
        assert_eq!(spec.speculative_method, Some(specrs_core::SpeculativeMethod::Eagle));
        assert_eq!(spec.num_speculative_tokens, Some(3));
    }

    #[test]
    fn any_speculative_choice_or_the_opt_out_keeps_the_shipped_draft_away() {
        let (draft, spec) = serve(&["--no-default-draft"]).speculation().unwrap();
        assert_eq!((draft, spec.speculative_method), (None, None));
        let (draft, spec) = serve(&["--speculative-method", "ngram"]).speculation().unwrap();
        assert_eq!((draft, spec.speculative_method), (None, Some(specrs_core::SpeculativeMethod::Ngram)));
        let (draft, spec) = serve(&["--model", "/models/other.gguf"]).speculation().unwrap();
        assert_eq!((draft, spec.speculative_method), (None, None));
    }

    #[test]
    fn suffix_decoding_flags_reach_the_config_under_vllms_names() {
        let p = serve(&[
            "--speculative-method",
            "suffix",
            "--suffix-decoding-max-tree-depth",
            "32",
            "--suffix-decoding-max-cached-requests",
            "0",
            "--suffix-decoding-min-token-prob",
            "0.25",
        ]);
        let (draft, spec) = p.speculation().unwrap();
        assert_eq!((draft, spec.speculative_method), (None, Some(specrs_core::SpeculativeMethod::Suffix)));
        assert_eq!(
            (
                spec.suffix_decoding_max_tree_depth,
                spec.suffix_decoding_max_cached_requests,
                spec.num_speculative_tokens
            ),
            (32, 0, Some(32))
        );
        assert_eq!(spec.suffix_decoding_min_token_prob, 0.25);
        let err = serve(&["--speculative-method", "eagle", "--suffix-decoding-max-tree-depth", "8"])
            .speculative_config()
            .unwrap_err();
        assert!(err.to_string().contains("speculative_method='suffix'"), "{err}");
    }
}
