"""Type stub of the ``spec_rs._spec_rs`` extension (crates/specrs-py), checked against the
built module by ``python -m mypy.stubtest spec_rs._spec_rs``."""

from collections.abc import Sequence
from typing import Literal, TypedDict, final

__all__ = [
    "AdaptiveWidthController",
    "__version__",
    "acceptance_rule",
    "builtin_architectures",
    "builtin_speculators",
    "canonical_draft_arch",
    "check_pipeline_combinations",
    "load_config_file",
    "merge_config",
    "parse_adaptive_widths",
    "schedule_lookup",
    "select_speculator",
    "speculative_flags",
    "validate_speculative_config",
]

__version__: str

# Configuration rules (crates/specrs-py/src/config.rs). Configs cross as JSON text so that
# the Rust and pydantic models share one wire format.

def validate_speculative_config(config_json: str) -> str: ...
def check_pipeline_combinations(config_json: str) -> None: ...
def acceptance_rule(config_json: str) -> Literal["synthetic", "stochastic", "greedy"]: ...
def load_config_file(path: str, section_name: str | None = None) -> str: ...
def merge_config(base_json: str, overrides_json: str) -> str: ...

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
    method: Literal["eagle", "mtp", "dflash", "dflash2", "dspark", "ngram"]
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
