"""Type stub of the ``spec_rs._spec_rs`` extension (crates/specrs-py), checked against the
built module by ``python -m mypy.stubtest spec_rs._spec_rs``."""

from collections.abc import Callable, Sequence
from typing import Any, Literal, Protocol, Self, TypedDict, final

from typing_extensions import disjoint_base

__all__ = [
    "AdaptiveWidthController",
    "DFlash2Pipeline",
    "DFlashPipeline",
    "DSparkPipeline",
    "EaglePipeline",
    "MtpPipeline",
    "NgramPipeline",
    "Pipeline",
    "PlainPipeline",
    "RequestStream",
    "SuffixPipeline",
    "__version__",
    "acceptance_rule",
    "builtin_architectures",
    "builtin_speculators",
    "canonical_draft_arch",
    "canonical_dtype",
    "check_pipeline_combinations",
    "checkpoint_draft_width",
    "cli_main",
    "default_draft",
    "draft_architecture",
    "draft_method",
    "load_config_file",
    "merge_config",
    "parse_adaptive_widths",
    "peek_architecture",
    "resolve_model",
    "schedule_lookup",
    "select_speculator",
    "speculative_flags",
    "translate_vllm_speculative_config",
    "validate_sampling_params",
    "validate_speculative_config",
]

__version__: str

# Configuration rules (crates/specrs-py/src/config.rs). Configs cross as JSON text so that
# the Rust and pydantic models share one wire format.

def validate_speculative_config(config_json: str) -> str: ...
def validate_sampling_params(params_json: str) -> None: ...
def check_pipeline_combinations(config_json: str) -> None: ...
def acceptance_rule(config_json: str) -> Literal["synthetic", "stochastic", "greedy"]: ...
def load_config_file(path: str, section_name: str | None = None) -> str: ...
def merge_config(base_json: str, overrides_json: str) -> str: ...
def translate_vllm_speculative_config(
    dialect_json: str, spec_fields: list[str]
) -> tuple[str, str | None]: ...

class _FlagRow(TypedDict):
    field: str
    flag: str
    negated_flag: str | None
    kind: Literal["bool", "int", "float", "str", "choice", "json"]
    choices: list[str] | None
    help: str

def speculative_flags() -> list[_FlagRow]: ...
def parse_adaptive_widths(value: str, limit: int | None = None) -> list[int]: ...
def schedule_lookup(ranges: list[tuple[int, int, int]], max_batch_size: int, max_width: int) -> list[int]: ...

@final
class AdaptiveWidthController:
    def __new__(
        cls,
        widths: list[int],
        *,
        ema_alpha: float = 0.2,
        update_interval: int = 5,
        probe_interval: int = 50,
        margin: float = 0.02,
        min_batch_size: int = 1,
    ) -> AdaptiveWidthController: ...
    @property
    def widths(self) -> list[int]: ...
    def next_step_width(self, batch_size: int) -> int: ...
    def chosen_width(self, batch_size: int) -> int: ...
    def record_step(
        self,
        batch_size: int,
        width: int,
        accepted_per_position: list[int],
        num_verifications: int,
        step_time_s: float | None = None,
    ) -> tuple[int, int] | None: ...
    def acceptance_estimate(self) -> list[float]: ...

# Registry (crates/specrs-py/src/registry.rs).

class _ArchitectureRow(TypedDict):
    name: str
    example_repo_ids: list[str]
    default_weights_format: str
    pipeline: str
    supports_spec_decode_mixed_batches: bool
    supports_device_graph_capture: bool

class _SpeculatorRow(TypedDict):
    name: str
    base: str
    draft_arch: str | None
    method: Literal["eagle", "mtp", "dflash", "dflash2", "dspark", "ngram", "suffix"]
    pipeline: str
    supports_spec_decode_mixed_batches: bool | None
    supports_device_graph_capture: bool | None
    checkpoint_draft_width: bool
    example_repo_ids: list[str] | None

def builtin_architectures() -> list[_ArchitectureRow]: ...
def builtin_speculators() -> list[_SpeculatorRow]: ...
def select_speculator(
    target: str, method: str, draft_arch: str | None, declared: Sequence[tuple[str, str | None]]
) -> int | None: ...
def canonical_draft_arch(method: str, draft_arch: str, has_draft_vocab: bool) -> str: ...

# Drafters (crates/specrs-py/src/drafters.rs).

class _DumpsJson(Protocol):
    def model_dump_json(self) -> str: ...

def checkpoint_draft_width(
    config: _DumpsJson | str, target_hf_config: dict[str, Any] | str, draft_hf_config: dict[str, Any] | str
) -> int: ...

# Pipelines (crates/specrs-py/src/pipeline.rs). Requests and outputs cross as JSON text; the
# typed API is ``spec_rs.LLM``.

def peek_architecture(path: str) -> str: ...
def draft_architecture(method: str, path: str) -> str: ...
def draft_method(path: str) -> str | None: ...
def canonical_dtype(name: str) -> str: ...
def resolve_model(name: str) -> str: ...
def default_draft(model: str) -> tuple[str, str] | None: ...
def cli_main(argv: list[str], factory: Callable[[str], Pipeline] | None = None) -> int: ...

class _PipelineInfo(TypedDict):
    model_path: str
    architecture: str
    pipeline_name: str
    pipeline_class: str
    method: str | None
    num_speculative_tokens: int | None
    acceptance_rule: Literal["synthetic", "stochastic", "greedy"]
    max_model_len: int
    vocab_size: int
    num_replicas: int

@disjoint_base
class Pipeline:
    @property
    def info(self) -> _PipelineInfo: ...
    def generate(self, requests: list[str]) -> list[str]: ...
    def submit(self, request: str) -> RequestStream: ...
    def kv_blocks(self) -> tuple[int, int]: ...
    def reset_prefix_cache(self) -> int: ...
    def reset_suffix_cache(self) -> int: ...
    def metrics_text(self) -> str: ...
    def tokenize(self, text: str, add_special_tokens: bool = True) -> list[int]: ...
    def detokenize(self, token_ids: list[int], skip_special_tokens: bool = True) -> str: ...
    def apply_chat_template(self, conversation: str) -> str: ...
    def serve(
        self,
        host: str = "127.0.0.1",
        port: int = 8000,
        served_model_name: str | None = None,
        api_key: str | None = None,
        max_pending: int = 256,
        shutdown_timeout: float = 10.0,
        chat_template: str | None = None,
        tool_call_parser: str | None = None,
        reasoning_parser: str | None = None,
        exclude_tools_when_tool_choice_none: bool = False,
        trust_request_chat_template: bool = False,
    ) -> None: ...

@final
class RequestStream:
    @property
    def request_id(self) -> int: ...
    def __iter__(self) -> RequestStream: ...
    def __next__(self) -> str: ...
    def cancel(self) -> None: ...

class _PipelineClass(Pipeline):
    def __new__(
        cls,
        model: str,
        draft_model: str | None = None,
        speculative_config: str | None = None,
        *,
        dtype: str = "auto",
        device: str = "cpu",
        max_num_seqs: int = 64,
        max_model_len: int | None = None,
        max_num_batched_tokens: int = 2048,
        kv_cache_bytes: int = 1073741824,
        block_size: int = 16,
        enable_spec_decode_mixed_batches: bool = False,
        device_graph_capture: bool = False,
        max_seq_len_to_capture: int = 4096,
        enable_prefix_caching: bool = True,
        tokenizer: str | None = None,
    ) -> Self: ...

@final
class PlainPipeline(_PipelineClass): ...

@final
class NgramPipeline(_PipelineClass): ...

@final
class SuffixPipeline(_PipelineClass): ...

@final
class EaglePipeline(_PipelineClass): ...

@final
class MtpPipeline(_PipelineClass): ...

@final
class DFlashPipeline(_PipelineClass): ...

@final
class DFlash2Pipeline(_PipelineClass): ...

@final
class DSparkPipeline(_PipelineClass): ...
