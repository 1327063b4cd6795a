//! Pipeline classes: the Rust pipelines the registry's `pipeline_model` names. Each class
//! builds an engine of its kind on its own thread; calls release the GIL while they wait.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use pyo3::exceptions::{PyStopIteration, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use specrs_core::SpeculativeConfig;
use specrs_core::registry::PipelineKind;
use specrs_core::sampling::SamplingParams;
use specrs_engine::request::OutputStream;
use specrs_engine::{
    ChatEnding, ChatMessage, Conversation, DeviceSpec, EngineConfig, EngineError, EngineHandle, GenerationRequest,
    PipelineConfig, PipelineInfo, Prompt, text_messages,
};
use specrs_models::ModelDType;

use crate::errors::{config_error, raise};

/// Converts an engine error into the `spec_rs.errors` class that fits it.
pub fn engine_error(e: EngineError) -> PyErr {
    match e {
        EngineError::Config(c) => config_error(c),
        EngineError::ModelNotInstalled(m) => raise("ModelNotInstalledError", m.to_string(), &[]),
        EngineError::ModelNotFound(m) => raise("ModelNotInstalledError", m, &[]),
        EngineError::Model(m) => raise("ModelLoadError", m.to_string(), &[]),
        EngineError::Request(m) | EngineError::Tokenizer(m) => raise("RequestError", m, &[]),
        other => raise("EngineError", other.to_string(), &[]),
    }
}

/// Converts an error from loading a model: a tokenizer (or chat template) that cannot be built
/// is the checkpoint's fault, a `ModelLoadError`, where at request time it is the request's.
pub fn load_error(e: EngineError) -> PyErr {
    match e {
        EngineError::Tokenizer(m) => raise("ModelLoadError", format!("tokenizer: {m}"), &[]),
        other => engine_error(other),
    }
}

fn json_err(e: serde_json::Error) -> PyErr {
    PyValueError::new_err(format!("invalid JSON: {e}"))
}

/// A conversation as the Python layer sends it: `{"chat": [messages], "add_generation_prompt",
/// "continue_final_message", "tools", "chat_template", "chat_template_kwargs"}`.
fn conversation(prompt: &serde_json::Value) -> PyResult<Conversation> {
    let messages = prompt["chat"]
        .as_array()
        .ok_or_else(|| PyValueError::new_err("messages must be a list of {\"role\": ..., \"content\": ...} dicts"))?
        .iter()
        .enumerate()
        .map(|(i, message)| {
            serde_json::from_value::<ChatMessage>(message.clone()).map_err(|e| {
                PyValueError::new_err(format!(
                    "messages[{i}]: {e}; a message is {{\"role\": ..., \"content\": ...}} (tool calls and \
                     tool results as in OpenAI's chat API)"
                ))
            })
        })
        .collect::<PyResult<Vec<ChatMessage>>>()?;
    let flag = |name: &str, default: bool| prompt.get(name).and_then(|f| f.as_bool()).unwrap_or(default);
    let ending = ChatEnding::from_flags(flag("add_generation_prompt", true), flag("continue_final_message", false))
        .map_err(|message| raise("RequestError", message, &[]))?;
    let field = |name: &str| prompt.get(name).filter(|v| !v.is_null()).cloned();
    let tools = field("tools").map(serde_json::from_value::<Vec<serde_json::Value>>).transpose().map_err(json_err)?;
    let chat_template = field("chat_template").map(serde_json::from_value::<String>).transpose().map_err(json_err)?;
    let chat_template_kwargs =
        field("chat_template_kwargs").map(serde_json::from_value).transpose().map_err(json_err)?.unwrap_or_default();
    Ok(Conversation { messages, ending, tools, chat_template, chat_template_kwargs })
}

/// A request as the Python layer sends it: `{"prompt": {"text"|"tokens"|"chat": ...},
/// "params": {...SamplingParams...}, "trace": bool}`.
fn parse_request(json: &str) -> PyResult<GenerationRequest> {
    let v: serde_json::Value = serde_json::from_str(json).map_err(json_err)?;
    let prompt = &v["prompt"];
    let prompt = if let Some(t) = prompt.get("text").and_then(|t| t.as_str()) {
        Prompt::Text(t.to_string())
    } else if let Some(ids) = prompt.get("tokens") {
        Prompt::Tokens(serde_json::from_value(ids.clone()).map_err(json_err)?)
    } else if prompt.get("chat").is_some() {
        Prompt::Chat(conversation(prompt)?)
    } else {
        return Err(PyValueError::new_err("a request needs prompt.text, prompt.tokens or prompt.chat"));
    };
    let params: SamplingParams = match v.get("params") {
        Some(p) => serde_json::from_value(p.clone()).map_err(json_err)?,
        None => SamplingParams::default(),
    };
    let mut req = GenerationRequest::new(prompt, params);
    req.trace = v.get("trace").and_then(|t| t.as_bool()).unwrap_or(false);
    Ok(req)
}

/// The base class of every pipeline.
#[pyclass(subclass, module = "spec_rs._spec_rs", name = "Pipeline")]
pub struct PyPipeline {
    pub handle: Arc<EngineHandle>,
    info: PipelineInfo,
}

#[allow(clippy::too_many_arguments)]
fn build(
    py: Python<'_>,
    kind: PipelineKind,
    model: String,
    draft_model: Option<String>,
    speculative_config: Option<&str>,
    dtype: &str,
    device: &str,
    max_num_seqs: usize,
    max_model_len: Option<usize>,
    max_num_batched_tokens: usize,
    kv_cache_bytes: u64,
    block_size: usize,
    enable_spec_decode_mixed_batches: bool,
    device_graph_capture: bool,
    max_seq_len_to_capture: usize,
    enable_prefix_caching: bool,
    tokenizer: Option<String>,
) -> PyResult<PyPipeline> {
    let speculative = match speculative_config {
        Some(json) => {
            SpeculativeConfig::from_json(&serde_json::from_str(json).map_err(json_err)?).map_err(config_error)?
        }
        None => SpeculativeConfig::default(),
    };
    let dtype = parse_dtype(dtype)?;
    let devices = DeviceSpec::parse_list(device).map_err(engine_error)?;
    let cfg = PipelineConfig {
        model,
        draft_model,
        tokenizer,
        speculative,
        dtype,
        devices,
        engine: EngineConfig {
            max_num_seqs,
            max_model_len,
            max_num_batched_tokens,
            kv_cache_bytes,
            block_size,
            enable_spec_decode_mixed_batches,
            device_graph_capture,
            max_seq_len_to_capture,
            enable_prefix_caching,
            ..EngineConfig::default()
        },
    };
    let (engines, info) = py.detach(|| specrs_engine::build_replicas_with(&cfg, kind)).map_err(load_error)?;
    let handle = Arc::new(EngineHandle::spawn_replicas(engines, Some(info.clone())).map_err(load_error)?);
    Ok(PyPipeline { handle, info })
}

#[pymethods]
impl PyPipeline {
    /// The resolved pipeline: architecture, fused name, method, width, acceptance rule.
    #[getter]
    fn info<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("model_path", self.info.model_path.display().to_string())?;
        d.set_item("architecture", &self.info.architecture)?;
        d.set_item("pipeline_name", &self.info.pipeline_name)?;
        d.set_item("pipeline_class", self.info.kind.class_name())?;
        d.set_item("method", self.info.method.map(|m| m.as_str()))?;
        d.set_item("num_speculative_tokens", self.info.num_speculative_tokens)?;
        d.set_item("acceptance_rule", &self.info.acceptance_rule)?;
        d.set_item("max_model_len", self.handle.info().max_model_len)?;
        d.set_item("vocab_size", self.handle.info().vocab_size)?;
        d.set_item("num_replicas", self.handle.info().num_replicas)?;
        Ok(d)
    }

    /// Runs requests (JSON strings) to completion; returns their outputs as JSON strings.
    fn generate(&self, py: Python<'_>, requests: Vec<String>) -> PyResult<Vec<String>> {
        let requests = requests.iter().map(|r| parse_request(r)).collect::<PyResult<Vec<_>>>()?;
        let outs = py.detach(|| self.handle.generate(requests)).map_err(engine_error)?;
        outs.iter().map(|o| serde_json::to_string(o).map_err(json_err)).collect()
    }

    /// Submits one request and returns an iterator over its output deltas (JSON strings).
    /// Dropping the iterator cancels the request.
    fn submit(&self, py: Python<'_>, request: &str) -> PyResult<PyRequestStream> {
        let request = parse_request(request)?;
        let (id, stream) = py.detach(|| self.handle.submit(request)).map_err(engine_error)?;
        Ok(PyRequestStream { id, stream: Mutex::new(Some(stream)), handle: self.handle.clone() })
    }

    /// `(free, total)` KV-cache blocks.
    fn kv_blocks(&self, py: Python<'_>) -> PyResult<(usize, usize)> {
        py.detach(|| self.handle.kv_blocks()).map_err(engine_error)
    }

    /// Forgets every cached prefix; returns how many KV blocks were cached.
    fn reset_prefix_cache(&self, py: Python<'_>) -> PyResult<usize> {
        py.detach(|| self.handle.reset_prefix_cache()).map_err(engine_error)
    }

    /// Forgets the finished outputs suffix decoding drafts from; returns how many went.
    fn reset_suffix_cache(&self, py: Python<'_>) -> PyResult<usize> {
        py.detach(|| self.handle.reset_suffix_cache()).map_err(engine_error)
    }

    /// Prometheus text of the engine's metrics.
    fn metrics_text(&self) -> String {
        self.handle.metrics().render_prometheus("specrs")
    }

    /// Token ids of `text` (special tokens in the text are recognised).
    #[pyo3(signature = (text, add_special_tokens=true))]
    fn tokenize(&self, text: &str, add_special_tokens: bool) -> PyResult<Vec<u32>> {
        self.handle.tokenizer().encode(text, add_special_tokens).map_err(engine_error)
    }

    /// The text of `token_ids`; an id outside the model's vocabulary is a `ValueError` (the
    /// tokenizer would drop it without a word).
    #[pyo3(signature = (token_ids, skip_special_tokens=true))]
    fn detokenize(&self, token_ids: Vec<i64>, skip_special_tokens: bool) -> PyResult<String> {
        let vocab_size = self.handle.info().vocab_size;
        let ids = token_ids
            .iter()
            .enumerate()
            .map(|(i, &id)| {
                u32::try_from(id).ok().filter(|&id| (id as usize) < vocab_size).ok_or_else(|| {
                    PyValueError::new_err(format!(
                        "token_ids[{i}] = {id} is not a token id of this model (0 to {})",
                        vocab_size - 1
                    ))
                })
            })
            .collect::<PyResult<Vec<u32>>>()?;
        self.handle.tokenizer().decode(&ids, skip_special_tokens).map_err(engine_error)
    }

    /// Renders a conversation (the JSON of a request's `prompt`: `{"chat": [...], ...}`) with
    /// its chat template, the model's unless it brings one.
    fn apply_chat_template(&self, conversation: &str) -> PyResult<String> {
        let prompt: serde_json::Value = serde_json::from_str(conversation).map_err(json_err)?;
        let conversation = self::conversation(&prompt)?;
        text_messages(&conversation.messages).map_err(|e| raise("RequestError", e.to_string(), &[]))?;
        self.handle.tokenizer().render_conversation(&conversation).map_err(engine_error)
    }

    /// Serves the OpenAI API on this pipeline until SIGINT/SIGTERM. `tool_call_parser` turns on
    /// `tool_choice: "auto"` (the CLI's `--enable-auto-tool-choice --tool-call-parser`);
    /// `reasoning_parser` splits thinking into `reasoning_content` (`--reasoning-parser`);
    /// `exclude_tools_when_tool_choice_none` leaves tools out of the prompt of a request whose
    /// `tool_choice` is `"none"` (`--exclude-tools-when-tool-choice-none`);
    /// `trust_request_chat_template` renders a `chat_template` a request sends
    /// (`--trust-request-chat-template`).
    #[pyo3(signature = (host="127.0.0.1", port=8000, served_model_name=None, api_key=None, max_pending=256, shutdown_timeout=10.0, chat_template=None, tool_call_parser=None, reasoning_parser=None, exclude_tools_when_tool_choice_none=false, trust_request_chat_template=false))]
    #[allow(clippy::too_many_arguments)]
    fn serve(
        &self,
        py: Python<'_>,
        host: &str,
        port: u16,
        served_model_name: Option<String>,
        api_key: Option<String>,
        max_pending: usize,
        shutdown_timeout: f64,
        chat_template: Option<String>,
        tool_call_parser: Option<String>,
        reasoning_parser: Option<String>,
        exclude_tools_when_tool_choice_none: bool,
        trust_request_chat_template: bool,
    ) -> PyResult<()> {
        let invalid = |message: String| PyValueError::new_err(message);
        let args = specrs_server::cli::ServerArgs {
            host: host.to_string(),
            port,
            served_model_name,
            api_key: specrs_server::cli::check_api_key(api_key).map_err(invalid)?,
            max_pending,
            shutdown_timeout: specrs_server::cli::check_shutdown_timeout(shutdown_timeout).map_err(invalid)?,
            chat_template: chat_template
                .map(|t| specrs_server::cli::chat_template_arg(&t).map_err(|e| invalid(e.to_string())))
                .transpose()?,
            auto_tool_parser: tool_call_parser
                .map(|name| specrs_server::tools::ToolCallParser::parse(&name).map_err(invalid))
                .transpose()?,
            reasoning_parser: reasoning_parser
                .map(|name| specrs_server::reasoning::ReasoningParser::parse(&name).map_err(invalid))
                .transpose()?,
            exclude_tools_when_tool_choice_none,
            trust_request_chat_template,
        };
        args.listen_addrs().map_err(invalid)?;
        let name = self.info.model_path.display().to_string();
        py.detach(|| specrs_server::serve_blocking(self.handle.clone(), &name, &args))
            .map_err(|e| raise("EngineError", e, &[]))
    }
}

/// A dtype name in any spelling the engine reads (`bfloat16`, `Q4_K_M`, ...), or a
/// `ConfigError` naming `dtype`.
pub fn parse_dtype(name: &str) -> PyResult<ModelDType> {
    name.parse()
        .map_err(|e: specrs_models::ModelError| raise("ConfigError", e.to_string(), &[("field", Some("dtype".into()))]))
}

/// An iterator over one request's output deltas (JSON strings).
#[pyclass(module = "spec_rs._spec_rs", name = "RequestStream")]
pub struct PyRequestStream {
    id: u64,
    stream: Mutex<Option<OutputStream>>,
    handle: Arc<EngineHandle>,
}

#[pymethods]
impl PyRequestStream {
    #[getter]
    fn request_id(&self) -> u64 {
        self.id
    }

    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&self, py: Python<'_>) -> PyResult<String> {
        let mut taken = self.stream.lock().map_err(|_| PyValueError::new_err("stream poisoned"))?.take();
        let Some(mut stream) = taken.take() else {
            return Err(PyStopIteration::new_err(()));
        };
        let out = py.detach(|| {
            // Wake up now and then so Ctrl-C reaches Python while we wait.
            loop {
                match stream.try_recv() {
                    Ok(o) => return Some(o),
                    Err(tokio::sync::mpsc::error::TryRecvError::Disconnected) => return None,
                    Err(tokio::sync::mpsc::error::TryRecvError::Empty) => std::thread::sleep(Duration::from_millis(1)),
                }
            }
        });
        match out {
            Some(o) => {
                let finished = o.is_finished();
                if !finished {
                    *self.stream.lock().map_err(|_| PyValueError::new_err("stream poisoned"))? = Some(stream);
                }
                serde_json::to_string(&o).map_err(json_err)
            }
            None => Err(PyStopIteration::new_err(())),
        }
    }

    /// Cancels the request; its KV blocks are freed at once.
    fn cancel(&self) {
        self.handle.abort(self.id);
        if let Ok(mut s) = self.stream.lock() {
            s.take();
        }
    }
}

macro_rules! pipeline_class {
    ($rust:ident, $name:literal, $kind:expr, $doc:literal) => {
        #[doc = $doc]
        #[pyclass(extends = PyPipeline, module = "spec_rs._spec_rs", name = $name)]
        pub struct $rust;

        #[pymethods]
        impl $rust {
            #[new]
            #[pyo3(signature = (model, draft_model=None, speculative_config=None, *, dtype="auto", device="cpu",
                        max_num_seqs=64, max_model_len=None, max_num_batched_tokens=2048, kv_cache_bytes=1073741824,
                        block_size=16, enable_spec_decode_mixed_batches=false,
                        device_graph_capture=false, max_seq_len_to_capture=4096,
                        enable_prefix_caching=true, tokenizer=None))]
            #[allow(clippy::too_many_arguments)]
            fn new(
                py: Python<'_>,
                model: String,
                draft_model: Option<String>,
                speculative_config: Option<&str>,
                dtype: &str,
                device: &str,
                max_num_seqs: usize,
                max_model_len: Option<usize>,
                max_num_batched_tokens: usize,
                kv_cache_bytes: u64,
                block_size: usize,
                enable_spec_decode_mixed_batches: bool,
                device_graph_capture: bool,
                max_seq_len_to_capture: usize,
                enable_prefix_caching: bool,
                tokenizer: Option<String>,
            ) -> PyResult<PyClassInitializer<Self>> {
                let base = build(
                    py,
                    $kind,
                    model,
                    draft_model,
                    speculative_config,
                    dtype,
                    device,
                    max_num_seqs,
                    max_model_len,
                    max_num_batched_tokens,
                    kv_cache_bytes,
                    block_size,
                    enable_spec_decode_mixed_batches,
                    device_graph_capture,
                    max_seq_len_to_capture,
                    enable_prefix_caching,
                    tokenizer,
                )?;
                Ok(PyClassInitializer::from(base).add_subclass($rust))
            }
        }
    };
}

pipeline_class!(PlainPipeline, "PlainPipeline", PipelineKind::Plain, "Plain (non-speculative) decoding of a target.");
pipeline_class!(NgramPipeline, "NgramPipeline", PipelineKind::Ngram, "Prompt-lookup (n-gram) speculative decoding.");
pipeline_class!(
    SuffixPipeline,
    "SuffixPipeline",
    PipelineKind::Suffix,
    "Suffix decoding: drafts from suffix trees over the request's text and earlier outputs."
);
pipeline_class!(EaglePipeline, "EaglePipeline", PipelineKind::Eagle, "EAGLE-1 / EAGLE-3 draft heads.");
pipeline_class!(MtpPipeline, "MtpPipeline", PipelineKind::Mtp, "Multi-token-prediction heads.");
pipeline_class!(DFlashPipeline, "DFlashPipeline", PipelineKind::DFlash, "DFlash block drafters.");
pipeline_class!(DFlash2Pipeline, "DFlash2Pipeline", PipelineKind::DFlash2, "DFlash2 block drafters.");
pipeline_class!(DSparkPipeline, "DSparkPipeline", PipelineKind::DSpark, "DSpark block drafters.");

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyPipeline>()?;
    m.add_class::<PyRequestStream>()?;
    m.add_class::<PlainPipeline>()?;
    m.add_class::<NgramPipeline>()?;
    m.add_class::<SuffixPipeline>()?;
    m.add_class::<EaglePipeline>()?;
    m.add_class::<MtpPipeline>()?;
    m.add_class::<DFlashPipeline>()?;
    m.add_class::<DFlash2Pipeline>()?;
    m.add_class::<DSparkPipeline>()?;
    Ok(())
}
