//! Building an engine from what a user names: a target (alias or path), an optional draft
//! checkpoint, a speculative config and runtime limits.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use candle_core::Device;
use specrs_core::config::SpeculativeMethod;
use specrs_core::ngram::NgramProposer as Lookup;
use specrs_core::registry::{
    BUILTIN_ARCHITECTURES, PipelineKind, builtin_speculators, canonical_draft_arch, select_speculator,
};
use specrs_core::suffix::{SuffixCache, SuffixCacheConfig};
use specrs_core::width::{AdaptiveWidthController, AdaptiveWidthParams, VerifyWidthSchedule};
use specrs_core::{ConfigError, DraftPlacement, SpeculativeConfig};
use specrs_models::drafters::dflash::DFlashDraft;
use specrs_models::drafters::dflash2::DFlash2Draft;
use specrs_models::drafters::dspark::DSparkDraft;
use specrs_models::drafters::eagle::EagleDraft;
use specrs_models::drafters::mtp::MtpDraft;
use specrs_models::drafters::{BlockDraftModel, SequentialDraftModel};
use specrs_models::weights::WeightSource;
use specrs_models::{CausalLm, ModelDType, WeightStore};

use crate::engine::{Engine, EngineConfig, EngineParts};
use crate::error::{EngineError, Result};
use crate::proposer::Proposer;
use crate::proposer::block::{BlockProposer, draft_skip_schedule, resolve_block_width};
use crate::proposer::confidence::DraftConfidence;
use crate::proposer::guided_first::GuidedFirstProposer;
use crate::proposer::lookup_first::LookupFirstProposer;
use crate::proposer::ngram::NgramProposer;
use crate::proposer::sequential::SequentialProposer;
use crate::proposer::suffix::SuffixProposer;
use crate::proposer::suffix_first::SuffixFirstProposer;
use crate::tokenizer::TextTokenizer;
use crate::width::{EngineWidthPolicy, WidthMode};

/// Which device the models run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeviceSpec {
    #[default]
    Cpu,
    Cuda(usize),
}

impl std::str::FromStr for DeviceSpec {
    type Err = EngineError;

    fn from_str(s: &str) -> Result<Self> {
        let s = s.trim().to_ascii_lowercase();
        if s == "cpu" {
            return Ok(Self::Cpu);
        }
        if s == "cuda" || s == "gpu" {
            return Ok(Self::Cuda(0));
        }
        if let Some(i) = s.strip_prefix("cuda:").and_then(|i| i.parse().ok()) {
            return Ok(Self::Cuda(i));
        }
        Err(ConfigError::field("device", format!("unknown device '{s}'; expected 'cpu', 'cuda' or 'cuda:N'")).into())
    }
}

impl std::fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Cpu => f.write_str("cpu"),
            Self::Cuda(i) => write!(f, "cuda:{i}"),
        }
    }
}

impl DeviceSpec {
    /// Parses one device or a comma-separated list (`cuda:0,cuda:1`): one data-parallel
    /// replica per entry, checked with [`check_replica_devices`].
    pub fn parse_list(s: &str) -> Result<Vec<Self>> {
        let devices = s.split(',').map(str::parse).collect::<Result<Vec<Self>>>()?;
        check_replica_devices(&devices)?;
        Ok(devices)
    }

    pub fn device(self) -> Result<Device> {
        self.device_for(false)
    }

    /// The device, ready for device-graph capture when `graph_capture` (CUDA builds: its
    /// tensors do not track uses with events, which capture needs; see
    /// `specrs_models::graph::cuda::graph_ready_device`).
    pub fn device_for(self, graph_capture: bool) -> Result<Device> {
        #[cfg(not(feature = "cuda"))]
        let _ = graph_capture;
        match self {
            Self::Cpu => Ok(Device::Cpu),
            #[cfg(feature = "cuda")]
            Self::Cuda(i) if graph_capture => specrs_models::graph::cuda::graph_ready_device(i).map_err(|e| {
                ConfigError::field("device", format!("cannot open CUDA device {i} for graph capture: {e}")).into()
            }),
            Self::Cuda(i) => Device::new_cuda(i).map_err(|e| {
                ConfigError::field(
                    "device",
                    format!(
                        "cannot open CUDA device {i}: {e}. spec-rs CPU builds run on device='cpu'; the CUDA build is a \
                         separate artifact (see README)"
                    ),
                )
                .into()
            }),
        }
    }
}

/// The devices of data-parallel replicas are valid: at least one, all CPU or all CUDA, and no
/// GPU twice. Several `cpu` entries are allowed: replicas sharing the host's cores gain no
/// speed, but run the data-parallel paths where no GPU pair exists (tests).
pub fn check_replica_devices(devices: &[DeviceSpec]) -> Result<()> {
    if devices.is_empty() {
        return Err(ConfigError::field(
            "device",
            "no device given; pass 'cpu', 'cuda:N' or a list like 'cuda:0,cuda:1'",
        )
        .into());
    }
    let cuda: Vec<usize> =
        devices.iter().filter_map(|d| if let DeviceSpec::Cuda(i) = d { Some(*i) } else { None }).collect();
    if !cuda.is_empty() && cuda.len() != devices.len() {
        return Err(ConfigError::field(
            "device",
            format!(
                "data-parallel replicas must all run on CUDA or all on the CPU, got {}",
                devices.iter().map(ToString::to_string).collect::<Vec<_>>().join(",")
            ),
        )
        .into());
    }
    if let Some((_, i)) = cuda.iter().enumerate().find(|&(k, i)| cuda[..k].contains(i)) {
        return Err(ConfigError::field(
            "device",
            format!("cuda:{i} is listed twice; each data-parallel replica needs a device of its own"),
        )
        .into());
    }
    Ok(())
}

/// Everything needed to build a pipeline.
#[derive(Debug, Clone)]
pub struct PipelineConfig {
    /// A model alias (`smollm2-135m-instruct`), a GGUF file, or a checkpoint directory.
    pub model: String,
    /// Draft checkpoint for eagle/dflash/dflash2/dspark (and speculators-format mtp).
    pub draft_model: Option<String>,
    /// A directory holding `tokenizer.json` (and its configs), or that file, whose tokenizer
    /// replaces the model's, as vLLM's `--tokenizer`: for GGUF files whose tokenizer spec-rs
    /// cannot build (neither byte-level nor SentencePiece BPE) and checkpoints that ship
    /// `tokenizer.model` only.
    pub tokenizer: Option<String>,
    pub speculative: SpeculativeConfig,
    pub dtype: ModelDType,
    /// One device per data-parallel replica (usually one). Each replica holds the target and
    /// its KV cache (`engine.kv_cache_bytes` and `engine.max_num_seqs` each) and serves its own
    /// requests; where the draft head runs follows `speculative.draft_head_parallelism`.
    pub devices: Vec<DeviceSpec>,
    pub engine: EngineConfig,
}

impl PipelineConfig {
    pub fn new(model: impl Into<String>) -> Self {
        Self {
            model: model.into(),
            draft_model: None,
            tokenizer: None,
            speculative: SpeculativeConfig::default(),
            dtype: ModelDType::Auto,
            devices: vec![DeviceSpec::Cpu],
            engine: EngineConfig::default(),
        }
    }
}

/// The resolved identity of a pipeline, for startup logs and `/v1/models`.
#[derive(Debug, Clone, PartialEq)]
pub struct PipelineInfo {
    pub model_path: PathBuf,
    pub architecture: String,
    /// The derived (fused) architecture name, or the target's for plain decoding.
    pub pipeline_name: String,
    pub kind: PipelineKind,
    pub method: Option<SpeculativeMethod>,
    pub num_speculative_tokens: Option<usize>,
    pub acceptance_rule: String,
}

/// Reads the target's Hugging Face architecture name from its checkpoint.
pub fn target_architecture(store: &WeightStore, config: &specrs_models::DecoderConfig, path: &Path) -> String {
    if let WeightSource::Safetensors(_) = store.source() {
        let dir = if path.is_dir() { path } else { path.parent().unwrap_or(Path::new(".")) };
        if let Some(name) = std::fs::read_to_string(dir.join("config.json"))
            .ok()
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
            .and_then(|v| v["architectures"][0].as_str().map(str::to_string))
        {
            return name;
        }
    }
    config.architecture.hf_name().to_string()
}

/// Refuses a draft model that `method` would not use: with no method the pipeline decodes
/// plainly and would drop it without a word, and n-gram and suffix decoding draft from the
/// text itself.
pub fn check_draft_model_use(method: Option<SpeculativeMethod>, has_draft_model: bool) -> Result<()> {
    if !has_draft_model {
        return Ok(());
    }
    let drafting: Vec<&str> =
        SpeculativeMethod::ALL.iter().filter(|m| !m.is_model_free()).map(|m| m.as_str()).collect();
    let drafting = drafting.join(", ");
    let unused = match method {
        None => format!(
            "a draft model is given but no speculative_method, and its config.json names no drafter spec-rs \
             knows: set speculative_method to the method the draft was trained for ({drafting}), or leave the \
             draft model out to decode plainly"
        ),
        Some(m) if m.is_model_free() => format!(
            "speculative_method='{}' drafts from the text itself and takes no draft model: leave the draft \
             model out, or pick a method that drafts with one ({drafting})",
            m.as_str()
        ),
        Some(_) => return Ok(()),
    };
    Err(ConfigError::field("draft_model", unused).into())
}

/// A draft checkpoint's `architectures[0]` (rewritten as MAX does for one-layer EAGLE drafts).
pub fn draft_architecture(method: SpeculativeMethod, draft: &Path) -> Result<String> {
    check_draft_model_use(Some(method), true)?;
    let json = read_draft_config(draft)?;
    let name = json["architectures"][0].as_str().unwrap_or_default().to_string();
    let has_draft_vocab = json.get("draft_vocab_size").is_some() || json.get("truncated_vocab_size").is_some();
    Ok(canonical_draft_arch(method, &name, has_draft_vocab))
}

/// The method a draft checkpoint was trained for, read from its config, for a draft given
/// without a `speculative_method` (vLLM infers it the same way); `None` when the config does
/// not say ([`specrs_models::drafters::trained_method`]).
pub fn draft_method(draft: &Path) -> Result<Option<SpeculativeMethod>> {
    Ok(specrs_models::drafters::trained_method(&read_draft_config(draft)?))
}

/// `cfg` running its own method, else its draft checkpoint's (logged) when a draft is given.
pub fn with_draft_method(cfg: &PipelineConfig) -> Result<PipelineConfig> {
    let mut cfg = cfg.clone();
    if let (None, Some(draft)) = (cfg.speculative.speculative_method, &cfg.draft_model)
        && let Some(method) = draft_method(&resolve_model_path(draft)?)?
    {
        tracing::info!("speculative_method '{}' read from the draft checkpoint {draft}", method.as_str());
        cfg.speculative.speculative_method = Some(method);
    }
    Ok(cfg)
}

fn read_draft_config(draft: &Path) -> Result<serde_json::Value> {
    let cfg_path = if draft.is_dir() { draft.join("config.json") } else { draft.with_file_name("config.json") };
    let text = std::fs::read_to_string(&cfg_path).map_err(|e| {
        specrs_models::ModelError::file(
            &cfg_path,
            format!(
                "cannot read the draft model's config ({e}); the draft model must be a checkpoint directory \
                 holding config.json and its safetensors weights"
            ),
        )
    })?;
    Ok(serde_json::from_str(&text)
        .map_err(|e| specrs_models::ModelError::file(&cfg_path, format!("invalid JSON: {e}")))?)
}

/// Picks the built-in speculator for the target and method, as the `spec-rs` binary does.
/// (The Python registry makes the same choice through the same rule.)
pub fn select_builtin(target_arch: &str, method: SpeculativeMethod, draft_arch: Option<&str>) -> Result<PipelineKind> {
    if !BUILTIN_ARCHITECTURES.iter().any(|a| a.name == target_arch) {
        return Err(EngineError::Request(format!(
            "architecture '{target_arch}' has no speculators declared; supported targets: {}",
            BUILTIN_ARCHITECTURES.iter().map(|a| a.name).collect::<Vec<_>>().join(", ")
        )));
    }
    let specs: Vec<_> = builtin_speculators().into_iter().filter(|s| s.base == target_arch).collect();
    let declared: Vec<(&str, Option<&str>)> = specs.iter().map(|s| (s.method.as_str(), s.draft_arch)).collect();
    let idx = select_speculator(target_arch, method.as_str(), draft_arch, &declared)
        .map_err(|e| EngineError::Request(e.to_string()))?
        .expect("built-in targets declare speculators");
    Ok(specs[idx].pipeline)
}

/// The width policy of a resolved config with `k` drafts per step, whose rows may copy up to
/// `copy_width` ([`crate::proposer::Proposer::copy_width`]).
pub fn width_policy(
    spec: &SpeculativeConfig,
    k: usize,
    copy_width: usize,
    max_batch: usize,
    mixed_enabled: bool,
) -> Result<EngineWidthPolicy> {
    let mode = if !spec.is_enabled() || k == 0 {
        WidthMode::Off
    } else if let Some(widths) = spec.adaptive_widths()? {
        if let Some(&w) = widths.iter().find(|&&w| w > k) {
            return Err(ConfigError::field(
                "adaptive_speculative_widths",
                format!("Verify widths [{w}] are outside 1..{k}"),
            )
            .into());
        }
        WidthMode::Adaptive(Box::new(
            AdaptiveWidthController::new(
                widths,
                AdaptiveWidthParams {
                    min_batch_size: spec.adaptive_speculative_min_batch_size.max(1) as usize,
                    ..AdaptiveWidthParams::default()
                },
            )?
            // Plain steps (width 0) are ours, beyond MAX: where verification costs more than the
            // drafts return (large, compute-bound batches), the controller stops speculating.
            .with_plain_steps(),
        ))
    } else if let Some(ranges) = &spec.num_speculative_tokens_per_batch_size {
        WidthMode::Schedule(VerifyWidthSchedule::build(ranges, max_batch.max(1), k)?)
    } else {
        WidthMode::Fixed(k)
    };
    if spec.num_speculative_tokens_mixed_batch.is_some() && !mixed_enabled && spec.is_enabled() {
        tracing::warn!(
            "num_speculative_tokens_mixed_batch has no effect: mixed prefill+decode steps verify nothing without \
             --enable-spec-decode-mixed-batches (on an architecture that supports it)"
        );
    }
    Ok(EngineWidthPolicy {
        mode,
        max_width: k,
        max_copy_width: copy_width.max(k),
        mixed_enabled,
        mixed_width: spec.num_speculative_tokens_mixed_batch.map(|m| (m.max(0) as usize).min(k)),
        planned: None,
        copied: 0,
        widened_from: None,
        drafted_nothing: 0,
    })
}

/// Opens a tokenizer for a checkpoint: embedded in a GGUF, or tokenizer.json beside it.
pub fn load_tokenizer(store: &WeightStore, path: &Path) -> Result<TextTokenizer> {
    match store.source() {
        WeightSource::Gguf(g) => TextTokenizer::from_gguf(g.metadata()),
        WeightSource::Safetensors(_) => {
            let dir = if path.is_dir() { path } else { path.parent().unwrap_or(Path::new(".")) };
            TextTokenizer::from_dir(dir)
        }
    }
}

/// Opens the tokenizer a pipeline was told to use instead of its model's: a directory holding
/// `tokenizer.json`, or that file.
pub fn load_tokenizer_from(tokenizer: &str) -> Result<TextTokenizer> {
    let path = Path::new(tokenizer);
    let named_file = path.is_file();
    let dir = if named_file { path.parent().unwrap_or(Path::new(".")) } else { path };
    if named_file && path.file_name().is_some_and(|n| n != "tokenizer.json") {
        return Err(EngineError::Config(ConfigError::field(
            "tokenizer",
            format!("'{tokenizer}' is not a tokenizer.json: pass the directory holding tokenizer.json or that file"),
        )));
    }
    if !dir.join("tokenizer.json").is_file() {
        return Err(EngineError::Config(ConfigError::field(
            "tokenizer",
            format!(
                "'{tokenizer}' holds no tokenizer.json: pass a directory holding tokenizer.json (and its \
                 tokenizer_config.json) or the file itself"
            ),
        )));
    }
    TextTokenizer::from_dir(dir)
}

/// Resolves the model argument to a file or directory.
pub fn resolve_model_path(model: &str) -> Result<PathBuf> {
    let path = specrs_core::model_alias::resolve_model(model)?;
    if !path.exists() {
        return Err(EngineError::ModelNotFound(format!(
            "model '{model}' is neither a known alias ({}) nor an existing file or directory",
            specrs_core::model_alias::ALIASES.iter().map(|a| a.alias).collect::<Vec<_>>().join(", ")
        )));
    }
    Ok(path)
}

/// A loaded draft model and the device it runs on: what replicas share when the head runs on
/// the first device (`draft_head_parallelism="device0"`).
#[derive(Clone)]
enum LoadedDraft {
    Sequential(Arc<dyn SequentialDraftModel>, Device),
    Block(Arc<dyn BlockDraftModel>, Device),
}

/// A pipeline's proposer (none for plain decoding) and the draft model it loaded or shared.
type BuiltProposer = (Option<Box<dyn Proposer>>, Option<LoadedDraft>);

/// Builds the proposer of a pipeline kind, loading its draft model beside `target` or taking
/// `shared` (replica 0's, on the first device). Returns the loaded draft too, for sharing.
/// `max_batch_size` and `mixed_steps_verify` decide whether a block drafter may skip its
/// forward on steps that verify nothing.
#[allow(clippy::too_many_arguments)]
fn build_proposer(
    kind: PipelineKind,
    spec: &SpeculativeConfig,
    target: &CausalLm,
    target_store: &WeightStore,
    draft: Option<&Path>,
    dtype: ModelDType,
    max_batch_size: usize,
    mixed_steps_verify: bool,
    shared: Option<&LoadedDraft>,
    acceptance_on_device: Option<bool>,
) -> Result<BuiltProposer> {
    let need_draft = |what: &str| -> Result<&Path> {
        draft.ok_or_else(|| {
            EngineError::Request(format!(
                "speculative_method='{what}' needs a draft checkpoint: pass draft_model / --draft-model"
            ))
        })
    };
    let device = target.device();
    let sequential = |load: &dyn Fn() -> Result<Arc<dyn SequentialDraftModel>>| -> Result<LoadedDraft> {
        Ok(match shared {
            Some(LoadedDraft::Sequential(model, on)) => LoadedDraft::Sequential(model.clone(), on.clone()),
            _ => LoadedDraft::Sequential(load()?, device.clone()),
        })
    };
    let block = |load: &dyn Fn() -> Result<Arc<dyn BlockDraftModel>>| -> Result<LoadedDraft> {
        Ok(match shared {
            Some(LoadedDraft::Block(model, on)) => LoadedDraft::Block(model.clone(), on.clone()),
            _ => LoadedDraft::Block(load()?, device.clone()),
        })
    };
    let loaded = match kind {
        PipelineKind::Plain => return Ok((None, None)),
        PipelineKind::Ngram => {
            let lookup = Lookup::from_config(spec)?;
            return Ok((Some(Box::new(NgramProposer::new(lookup))), None));
        }
        PipelineKind::Suffix => {
            let cache = SuffixCache::new(SuffixCacheConfig::from_config(spec));
            return Ok((Some(Box::new(SuffixProposer::new(cache, spec.draft_width()?))), None));
        }
        PipelineKind::Eagle => {
            let dir = need_draft("eagle")?;
            sequential(&|| Ok(Arc::new(EagleDraft::load(dir, target, device, dtype)?)))?
        }
        PipelineKind::Mtp => sequential(&|| {
            Ok(Arc::new(match draft {
                Some(dir) => MtpDraft::load_speculators(dir, target, device, dtype)?,
                None => MtpDraft::load_from_target(target_store, target)?,
            }))
        })?,
        PipelineKind::DFlash | PipelineKind::DFlash2 | PipelineKind::DSpark => {
            let method = kind.method().expect("block pipelines run a method");
            let dir = need_draft(method.as_str())?;
            block(&|| {
                Ok(match kind {
                    PipelineKind::DFlash => Arc::new(DFlashDraft::load(dir, target, device, dtype)?),
                    PipelineKind::DFlash2 => Arc::new(DFlash2Draft::load(dir, target, device, dtype)?),
                    _ => Arc::new(DSparkDraft::load(dir, target, device, dtype)?),
                })
            })?
        }
    };
    let vocab = target.config().vocab_size;
    let confidence = DraftConfidence::new(spec.draft_confidence_threshold);
    // Drafts are chosen where the engine verifies: off the host, or on the CPU when device
    // acceptance is forced (the tests' way onto that path).
    let draws_on_device = |on: &Device| acceptance_on_device.unwrap_or(!on.is_cpu());
    let model: Box<dyn Proposer> = match &loaded {
        LoadedDraft::Sequential(model, on) => Box::new(
            SequentialProposer::new(model.clone(), spec.draft_width()?, spec.draft_proposal, vocab, on.clone())
                .with_confidence(confidence)
                .with_draws_on_device(draws_on_device(on)),
        ),
        LoadedDraft::Block(model, on) => {
            let k = resolve_block_width(spec.num_speculative_tokens, model.trained_width(), model.name())?;
            let mut proposer = BlockProposer::new(model.clone(), k, spec.draft_proposal, vocab, on.clone())
                .with_confidence(confidence)
                .with_draws_on_device(draws_on_device(on));
            if let Some(schedule) = draft_skip_schedule(spec, k, max_batch_size, mixed_steps_verify)? {
                proposer = proposer.with_draft_skipping(schedule);
            }
            Box::new(proposer)
        }
    };
    if spec.enable_suffix_decoding {
        let cache = SuffixCache::new(SuffixCacheConfig::from_config(spec));
        let proposer = SuffixFirstProposer::with_cache(cache, spec.suffix_decoding_min_score_ratio, model);
        return Ok((Some(Box::new(proposer)), Some(loaded)));
    }
    if !spec.enable_prompt_lookup {
        return Ok((Some(model), Some(loaded)));
    }
    // Validated: 1 <= prompt_lookup_min <= prompt_lookup_max.
    let (min_n, max_n) = (spec.prompt_lookup_min as usize, spec.prompt_lookup_max as usize);
    Ok((Some(Box::new(LookupFirstProposer::with_lookup(min_n, max_n, model)?)), Some(loaded)))
}

/// Loads everything and builds the engine for an explicitly chosen pipeline kind (the Python
/// registry chooses it; [`build_engine`] chooses it from the built-in registry). One device
/// only: several are data-parallel replicas, built by [`build_replicas_with`].
pub fn build_engine_with(cfg: &PipelineConfig, kind: PipelineKind) -> Result<(Engine, PipelineInfo)> {
    check_replica_devices(&cfg.devices)?;
    if cfg.devices.len() > 1 {
        return Err(EngineError::Request(format!(
            "{} devices make {} data-parallel replicas: build them with build_replicas and run them with \
             EngineHandle::spawn_replicas",
            cfg.devices.len(),
            cfg.devices.len()
        )));
    }
    let (engine, info, _) = build_replica(cfg, kind, cfg.devices[0], None, 0)?;
    Ok((engine, info))
}

/// Builds one engine per device of `cfg.devices`: data-parallel replicas of the pipeline, for
/// [`crate::EngineHandle::spawn_replicas`]. Under `draft_head_parallelism="device0"` the draft
/// model is loaded once, on the first device, and every replica drafts with it (moving its
/// hidden states there); under `"replica"` each replica loads its own beside its target.
/// Under `draft_probs_layout="device0"` the later replicas verify their sampled drafts on the
/// first device, where the distributions stay; under `"replica"` beside their own logits.
pub fn build_replicas_with(cfg: &PipelineConfig, kind: PipelineKind) -> Result<(Vec<Engine>, PipelineInfo)> {
    check_replica_devices(&cfg.devices)?;
    let mut engines: Vec<Engine> = Vec::with_capacity(cfg.devices.len());
    let mut first: Option<(PipelineInfo, Option<LoadedDraft>)> = None;
    for &device in &cfg.devices {
        let shared = match (&first, cfg.speculative.draft_head_parallelism) {
            (Some((_, draft)), DraftPlacement::Device0) => draft.as_ref(),
            _ => None,
        };
        // The first device holds every replica's drafter KV when it holds the only head.
        let guests = match (&first, cfg.speculative.draft_head_parallelism) {
            (None, DraftPlacement::Device0) => cfg.devices.len() - 1,
            _ => 0,
        };
        let (mut engine, info, draft) = build_replica(cfg, kind, device, shared, guests)?;
        if let (Some(device0), DraftPlacement::Device0) = (engines.first(), cfg.speculative.draft_probs_layout) {
            engine = engine.with_draft_probs_on(device0.target().device().clone());
        }
        engines.push(engine);
        first.get_or_insert((info, draft));
    }
    let (info, _) = first.expect("check_replica_devices: at least one device");
    Ok((engines, info))
}

/// [`build_replicas_with`], choosing the pipeline from the built-in registry.
/// A draft given without a method runs the method its config names ([`with_draft_method`]).
pub fn build_replicas(cfg: &PipelineConfig) -> Result<(Vec<Engine>, PipelineInfo)> {
    let cfg = with_draft_method(cfg)?;
    build_replicas_with(&cfg, builtin_kind(&cfg)?)
}

/// One replica on `device_spec`, drafting with `shared` where given, whose device also holds
/// the drafter KV of `guest_drafter_kv_replicas` others.
fn build_replica(
    cfg: &PipelineConfig,
    kind: PipelineKind,
    device_spec: DeviceSpec,
    shared: Option<&LoadedDraft>,
    guest_drafter_kv_replicas: usize,
) -> Result<(Engine, PipelineInfo, Option<LoadedDraft>)> {
    check_draft_model_use(cfg.speculative.speculative_method, cfg.draft_model.is_some())?;
    let path = resolve_model_path(&cfg.model)?;
    let device = device_spec.device_for(cfg.engine.device_graph_capture)?;
    let store = WeightStore::open(&path, device, cfg.dtype)?;
    let model_config = specrs_models::models::read_config(&store, &path)?.serve_context(cfg.engine.max_model_len);
    let architecture = target_architecture(&store, &model_config, &path);
    let target = CausalLm::load(&store, model_config)?;
    let tokenizer = Arc::new(match &cfg.tokenizer {
        Some(t) => load_tokenizer_from(t)?,
        None => load_tokenizer(&store, &path)?,
    });
    let mut spec = cfg.speculative.clone().validated()?;
    spec.check_pipeline_combinations()?;
    if kind.method() != spec.speculative_method {
        return Err(EngineError::Request(format!(
            "pipeline {kind} runs method {:?}, the config asks for {:?}",
            kind.method().map(|m| m.as_str()),
            spec.speculative_method.map(|m| m.as_str())
        )));
    }
    let draft_path = match &cfg.draft_model {
        Some(d) => Some(resolve_model_path(d)?),
        None => None,
    };
    let builtin = BUILTIN_ARCHITECTURES.iter().find(|a| a.name == architecture);
    let supports_mixed = builtin.is_some_and(|a| a.supports_spec_decode_mixed_batches);
    let supports_device_graph_capture = builtin.is_some_and(|a| a.supports_device_graph_capture);
    let mixed_steps_verify = cfg.engine.enable_spec_decode_mixed_batches
        && supports_mixed
        && spec.num_speculative_tokens_mixed_batch != Some(0);
    let (proposer, draft) = build_proposer(
        kind,
        &spec,
        &target,
        &store,
        draft_path.as_deref(),
        draft_dtype(cfg.dtype, &target),
        cfg.engine.max_num_seqs,
        mixed_steps_verify,
        shared,
        cfg.engine.acceptance_on_device,
    )?;
    // Structured outputs' forced text goes in front of whatever drafts the rest.
    let proposer =
        proposer.map(|p| Box::new(GuidedFirstProposer::with_tokenizer(p, tokenizer.clone())) as Box<dyn Proposer>);
    let k = proposer.as_ref().map(|p| p.num_speculative_tokens());
    if let Some(k) = k {
        spec.num_speculative_tokens = Some(k as i64);
    }
    let info = PipelineInfo {
        model_path: path,
        pipeline_name: match kind {
            PipelineKind::Plain => architecture.clone(),
            _ => builtin_speculators()
                .into_iter()
                .find(|s| s.base == architecture && s.pipeline == kind)
                .map_or_else(|| format!("{kind}[{architecture}]"), |s| s.name),
        },
        architecture,
        kind,
        method: spec.speculative_method,
        num_speculative_tokens: k,
        acceptance_rule: spec.acceptance_rule().as_str().to_string(),
    };
    let engine = Engine::new(
        EngineParts {
            target,
            tokenizer,
            proposer,
            spec,
            supports_mixed_batches: supports_mixed,
            supports_device_graph_capture,
            drafter_weight_bytes: 0,
            guest_drafter_kv_replicas,
        },
        cfg.engine.clone(),
    )?;
    Ok((engine, info, draft))
}

/// The weight format of a draft checkpoint: what the user asked for, except that `auto` beside
/// a quantized target on the CPU quantizes the draft too ([`auto_draft_dtype`]). A draft runs
/// up to K times per step, so an f32 head beside a q4 target would cost as much as the target
/// it is meant to save.
fn draft_dtype(requested: ModelDType, target: &CausalLm) -> ModelDType {
    match requested {
        ModelDType::Auto if target.device().is_cpu() => auto_draft_dtype(target.layer_bits_per_weight()),
        _ => requested,
    }
}

/// The CPU draft format for a target whose layers hold `bits_per_weight`: q4_0 beside 4- and
/// 5-bit targets, q8_0 beside other quantized ones, `auto` (f32) beside float ones. A draft
/// forward of one token streams its weights, so q4_0 halves what q8_0 costs; the shipped head
/// for the Q4_1 default model accepted as much at q4_0 as at q8_0 (held-out acceptance length
/// 1.74 against 1.73 at K = 3) and ran 2-4% faster end to end.
fn auto_draft_dtype(bits_per_weight: f64) -> ModelDType {
    if bits_per_weight < 6.0 {
        ModelDType::Q4_0
    } else if bits_per_weight < 16.0 {
        ModelDType::Q8_0
    } else {
        ModelDType::Auto
    }
}

/// Builds the engine choosing the pipeline from the built-in registry. A draft given without
/// a method runs the method its config names ([`with_draft_method`]).
pub fn build_engine(cfg: &PipelineConfig) -> Result<(Engine, PipelineInfo)> {
    let cfg = with_draft_method(cfg)?;
    build_engine_with(&cfg, builtin_kind(&cfg)?)
}

/// The built-in registry's pipeline for the target, method and draft of `cfg`.
fn builtin_kind(cfg: &PipelineConfig) -> Result<PipelineKind> {
    Ok(match cfg.speculative.speculative_method {
        None => PipelineKind::Plain,
        Some(method) => {
            let path = resolve_model_path(&cfg.model)?;
            let target_arch = peek_architecture(&path)?;
            let draft_arch = match &cfg.draft_model {
                Some(d) => Some(draft_architecture(method, &resolve_model_path(d)?)?),
                None => None,
            };
            select_builtin(&target_arch, method, draft_arch.as_deref())?
        }
    })
}

/// The target architecture name without loading weights.
pub fn peek_architecture(path: &Path) -> Result<String> {
    let store = WeightStore::open(path, Device::Cpu, ModelDType::Auto)?;
    let config = specrs_models::models::read_config(&store, path)?;
    Ok(target_architecture(&store, &config, path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tokenizer_override_replaces_the_models_and_names_what_it_lacks() {
        use specrs_models::config::Architecture;
        use specrs_models::testing::{self, TinyShape};
        let dir = tempfile::tempdir().unwrap();
        let shape = TinyShape::default();
        let target = dir.path().join("target");
        testing::write_checkpoint(
            &target,
            &testing::target_config(Architecture::Llama, &shape, false),
            &testing::random_target(Architecture::Llama, &shape, false, 1).unwrap(),
        )
        .unwrap();
        // A checkpoint that ships no tokenizer.json (as InternLM2's ship tokenizer.model only).
        std::fs::remove_file(target.join("tokenizer.json")).unwrap();
        let mut cfg = PipelineConfig::new(target.to_str().unwrap());
        cfg.dtype = ModelDType::F32;
        cfg.engine.kv_cache_bytes = 8 << 20;
        let Err(e) = build_engine(&cfg) else { panic!("built without a tokenizer") };
        assert!(e.to_string().contains("tokenizer.json"), "{e}");
        // A word tokenizer elsewhere, named by its directory or its file.
        let words = dir.path().join("words");
        std::fs::create_dir_all(&words).unwrap();
        testing::write_word_tokenizer(&words, (0..shape.vocab - 1).map(|i| format!("w{i}"))).unwrap();
        for named in [words.clone(), words.join("tokenizer.json")] {
            cfg.tokenizer = Some(named.to_str().unwrap().to_string());
            let (engine, _) = build_engine(&cfg).unwrap();
            assert_eq!(engine.tokenizer().encode("w3 w7", false).unwrap(), vec![3, 7]);
        }
        cfg.tokenizer = Some(target.join("config.json").to_str().unwrap().to_string());
        let Err(e) = build_engine(&cfg) else { panic!("config.json was read as a tokenizer") };
        assert!(e.to_string().contains("is not a tokenizer.json"), "{e}");
        cfg.tokenizer = Some(dir.path().join("target").to_str().unwrap().to_string());
        let Err(e) = build_engine(&cfg) else { panic!("a directory without tokenizer.json was accepted") };
        assert!(e.to_string().contains("tokenizer") && e.to_string().contains("holds no tokenizer.json"), "{e}");
    }

    #[test]
    fn a_draft_model_the_method_would_not_use_is_refused_naming_draft_model() {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = PipelineConfig::new("smollm2-135m-instruct");
        cfg.draft_model = Some(dir.path().to_str().unwrap().to_string());
        // Without a method the draft's config is read for one first.
        let Err(e) = build_engine(&cfg) else { panic!("a draft without config.json loaded") };
        assert!(e.to_string().contains("cannot read the draft model's config"), "{e}");
        // A language model's config names no drafter.
        let language_model = serde_json::json!({"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 30});
        std::fs::write(dir.path().join("config.json"), language_model.to_string()).unwrap();
        for method in [None, Some(SpeculativeMethod::Ngram), Some(SpeculativeMethod::Suffix)] {
            cfg.speculative.speculative_method = method;
            let Err(EngineError::Config(e)) = build_engine(&cfg) else { panic!("{method:?}: the draft was dropped") };
            assert_eq!(e.field.as_deref(), Some("draft_model"), "{method:?}: {e}");
            let hint = if method.is_none() { "set speculative_method" } else { "takes no draft model" };
            assert!(e.to_string().contains(hint), "{method:?}: {e}");
        }
        assert!(check_draft_model_use(Some(SpeculativeMethod::Eagle), true).is_ok());
        assert!(check_draft_model_use(None, false).is_ok());
    }

    #[cfg(not(feature = "cuda"))]
    #[test]
    fn a_cuda_device_in_a_cpu_build_is_a_config_error_naming_device() {
        let Err(EngineError::Config(e)) = DeviceSpec::Cuda(0).device_for(false) else { panic!("opened CUDA") };
        assert_eq!(e.field.as_deref(), Some("device"));
        assert!(e.to_string().contains("CPU builds run on device='cpu'"), "{e}");
    }

    #[test]
    fn an_auto_draft_beside_a_quantized_target_is_quantized_to_its_class() {
        // Bits per weight of GGUF blocks: Q4_0 and Q4_K 4.5, Q4_1 5, Q6_K 6.5625, Q8_0 8.5.
        for bits in [4.5, 5.0] {
            assert_eq!(auto_draft_dtype(bits), ModelDType::Q4_0, "{bits} bits");
        }
        for bits in [6.5625, 8.5] {
            assert_eq!(auto_draft_dtype(bits), ModelDType::Q8_0, "{bits} bits");
        }
        for bits in [16.0, 32.0] {
            assert_eq!(auto_draft_dtype(bits), ModelDType::Auto, "{bits} bits: float targets keep float drafts");
        }
    }
}
