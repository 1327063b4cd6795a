"""The architecture registry: which pipeline runs a checkpoint, and which speculator runs a
speculative method on it.

Follows Modular MAX's ``arch_lookup``. A :class:`SupportedArchitecture` describes a target
architecture, named after the Hugging Face class in its ``config.json`` (``architectures[0]``).
A :class:`Speculator` is one speculative variant of a target: a bounded delta that
:meth:`Speculator.derive` applies on top of it, so the fused architecture inherits everything
it does not name. :class:`ArchLookup` indexes both; :data:`ARCH_LOOKUP` is the process-wide
instance, holding the built-ins (declared in :mod:`spec_rs.architectures` from the Rust tables
and imported on first lookup) and whatever users register or load with
:meth:`ArchLookup.load_custom_architectures`.

The selection rule itself lives in Rust (``specrs_core::registry``):
:meth:`ArchLookup.select_speculator` calls it, so the ``spec-rs`` binary and Python choose the
same speculator and fail with the same message.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from types import ModuleType
from typing import Any, NamedTuple, TypeAlias

from . import _spec_rs
from .config import SpeculativeConfig, SpeculativeMethod
from .errors import ConfigError


class WeightsFormat(StrEnum):
    """How a checkpoint stores its weights."""

    SAFETENSORS = "safetensors"
    GGUF = "gguf"


WeightsAdapter: TypeAlias = Callable[[list[str]], dict[str, str]]
"""Maps a checkpoint's tensor names onto the Hugging Face names the engine loads.

Called with every tensor name in the checkpoint; returns ``{checkpoint_name: hf_name}`` for
the tensors to rename. Names left out load under their own name, so an adapter only spells
out what differs (for example, an MTP adapter that pulls the draft head's tensors out of the
target's state dict, or a GGUF adapter mapping ``blk.0.attn_q.weight`` to
``model.layers.0.self_attn.q_proj.weight``).
"""

PipelineModelType: TypeAlias = type[Any]
"""The pipeline class an architecture runs (a ``spec_rs._spec_rs`` pipeline class for the
built-ins)."""

CheckpointDraftWidth: TypeAlias = Callable[[SpeculativeConfig, Any, Any], int]
"""``(speculative_config, target_hf_config, draft_hf_config) -> draft width`` the drafter was
trained for."""

TEXT_GENERATION = "text_generation"

#: Weight dtypes the engine loads (``LLM(dtype=...)``); mirrors ``specrs_models::ModelDType``.
ENGINE_ENCODINGS = frozenset({"auto", "f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q4k", "q6k"})


@dataclass
class SupportedArchitecture:
    """A target architecture the engine runs.

    Mutable so that a package can adjust a declaration before registering it; a
    :class:`Speculator` never mutates its base, it derives a copy.
    """

    name: str
    """The Hugging Face class name, as in ``config.json``'s ``architectures[0]``."""
    pipeline_model: PipelineModelType
    """The pipeline class that runs checkpoints of this architecture."""
    example_repo_ids: list[str] = field(default_factory=list)
    """Checkpoints known to load; used by tests and generated docs."""
    default_weights_format: WeightsFormat = WeightsFormat.SAFETENSORS
    supported_encodings: set[str] = field(default_factory=lambda: set(ENGINE_ENCODINGS))
    default_encoding: str = "auto"
    """``"auto"`` lets the engine pick from the device and checkpoint."""
    task: str = TEXT_GENERATION
    """Architectures of the same name may be registered once per task."""
    tokenizer: Callable[..., Any] | None = None
    """Builds the tokenizer; ``None`` uses the one shipped with the checkpoint
    (``tokenizer.json`` or the GGUF vocabulary)."""
    weight_adapters: dict[WeightsFormat, WeightsAdapter] = field(default_factory=dict)
    """Tensor renames per weights format; formats left out load Hugging Face names as is."""
    multi_gpu_supported: bool = False
    required_arguments: dict[str, bool | int | float] = field(default_factory=dict)
    """Engine arguments this architecture forces, by name."""
    checkpoint_draft_width: CheckpointDraftWidth | None = None
    """Returns the draft width fixed by the draft checkpoint (block drafters); ``None`` when
    ``num_speculative_tokens`` decides."""
    supports_overlap_scheduler: bool = True
    supports_device_graph_capture: bool = True
    supports_spec_decode_mixed_batches: bool = False
    """Whether prefill and decode rows may share a verify step and stay per-row correct."""
    memory_planner: type[Any] | None = None
    """Estimates weight and activation memory; ``None`` infers no batch size."""
    cascade_pipeline_factory: Callable[..., Any] | None = None
    batching: type[Any] | None = None
    """The batch processor bound to the pipeline; ``None`` uses the engine's own."""
    config: type[Any] | None = None
    """The architecture config class (sizes the KV cache); ``None`` reads the HF config."""
    reasoning_parser: str | None = None
    tool_parser: str | Callable[..., str] | None = None


# Speculator fields that replace the base's value when set (not None); everything else is
# inherited from the base.
_OVERRIDES_WHEN_SET = (
    "batching",
    "example_repo_ids",
    "supports_device_graph_capture",
    "supports_spec_decode_mixed_batches",
    "config",
    "memory_planner",
    "checkpoint_draft_width",
)


@dataclass(frozen=True)
class Speculator:
    """One speculative variant of a target architecture.

    A bounded delta on its base, not an architecture of its own: :meth:`derive` applies the
    fields below and inherits everything else (tokenizer, encodings, parsers, ...). It is never
    registered under its own name; :class:`ArchLookup` indexes it against ``base.name``.
    """

    name: str
    """Identifies the fused architecture in logs and generated docs."""
    base: SupportedArchitecture
    """The target architecture this speculator applies to."""
    draft_arch: str | None
    """The draft checkpoint's ``architectures[0]``; ``None`` when the draft heads ship inside
    the target checkpoint (MTP) or the method needs no draft model (ngram)."""
    method: SpeculativeMethod
    """The mechanism this speculator runs, matched against ``speculative_method``."""
    pipeline_model: PipelineModelType
    """The fused pipeline, running target and drafter together."""
    batching: type[Any] | None = None
    weight_adapters: Mapping[WeightsFormat, WeightsAdapter] = field(default_factory=dict)
    """Replace the base's adapters when non-empty."""
    example_repo_ids: list[str] | None = None
    """Replace the target's example repos (when a different checkpoint exercises the fused
    graph)."""
    opt_out_cascade: bool = False
    """Clear the base's ``cascade_pipeline_factory``: the fused graph has no cascade path."""
    supports_device_graph_capture: bool | None = None
    """Override whether the fused graph can be captured; ``None`` inherits."""
    config: type[Any] | None = None
    """Replace the base's config class when the drafter keeps a KV cache of its own."""
    memory_planner: type[Any] | None = None
    """Replace the base's planner when the fused graph loads weights the base does not count."""
    checkpoint_draft_width: CheckpointDraftWidth | None = None
    """Returns the draft width the drafter was trained for; ``None`` inherits."""
    supports_spec_decode_mixed_batches: bool | None = None
    """Override per-row correctness on mixed prefill+decode verify batches; ``None`` inherits."""

    def derive(self) -> SupportedArchitecture:
        """The fused architecture: ``base`` with this speculator's set fields applied."""
        changes: dict[str, Any] = {"name": self.name, "pipeline_model": self.pipeline_model}
        if self.weight_adapters:
            changes["weight_adapters"] = dict(self.weight_adapters)
        if self.opt_out_cascade:
            changes["cascade_pipeline_factory"] = None
        for name in _OVERRIDES_WHEN_SET:
            value = getattr(self, name)
            if value is not None:
                changes[name] = value
        return dataclasses.replace(self.base, **changes)


#: The module declaring the built-ins; ARCH_LOOKUP imports it on the first lookup of one.
_BUILTINS_MODULE = "spec_rs.architectures"


class _LazyRegistration(NamedTuple):
    """Where to import a declaration from when it is first looked up."""

    module: str
    symbol: str
    package: str | None

    def resolve(self) -> Any:
        return getattr(importlib.import_module(self.module, self.package), self.symbol)


class ArchLookup:
    """Architectures by name (and task) and speculators by target name."""

    def __init__(self) -> None:
        self._by_name: dict[str, SupportedArchitecture] = {}
        self._by_name_and_task: dict[tuple[str, str], SupportedArchitecture] = {}
        self._speculators: dict[str, list[Speculator]] = {}
        self._lazy: dict[str, list[_LazyRegistration]] = {}
        self._lazy_speculators: dict[str, list[_LazyRegistration]] = {}

    @classmethod
    def with_builtins(cls) -> ArchLookup:
        """A lookup holding every built-in architecture and speculator, imported from
        :mod:`spec_rs.architectures` on first lookup."""
        lookup = cls()
        for row in _spec_rs.builtin_architectures():
            lookup.register_lazy(row["name"], _BUILTINS_MODULE, row["name"])
        for spec in _spec_rs.builtin_speculators():
            lookup.register_lazy(spec["name"], _BUILTINS_MODULE, spec["name"], speculates_on=spec["base"])
        return lookup

    def register(self, item: SupportedArchitecture | Speculator, allow_override: bool = False) -> None:
        """Registers an architecture, or a speculator under its target's name.

        Raises :class:`~spec_rs.errors.ConfigError` when an architecture of the same name and
        task is already registered, unless ``allow_override``.
        """
        if isinstance(item, Speculator):
            declared = self._speculators.setdefault(item.base.name, [])
            if not any(existing is item for existing in declared):
                declared.append(item)
            return
        if not isinstance(item, SupportedArchitecture):
            raise TypeError(f"Expected a SupportedArchitecture or a Speculator, got {item!r}")
        key = (item.name, item.task)
        replaced = self._by_name_and_task.get(key)
        if replaced is not None and not allow_override:
            raise ConfigError(
                f"Architecture {item.name!r} is already registered for task {item.task!r}; "
                "pass allow_override=True to replace it"
            )
        self._by_name_and_task[key] = item
        # A bare name resolves to the first task registered under it, or to its replacement.
        if item.name not in self._by_name or self._by_name[item.name] is replaced:
            self._by_name[item.name] = item

    def register_lazy(
        self,
        name: str,
        module: str,
        symbol: str,
        package: str | None = None,
        speculates_on: str | None = None,
    ) -> None:
        """Registers ``module.symbol`` without importing it until it is looked up.

        With ``speculates_on``, the symbol is a :class:`Speculator` of that target, imported by
        :meth:`speculators_for`; otherwise an architecture named ``name``, imported by
        :meth:`find`, where an architecture registered eagerly under the same name and task
        wins over it.
        """
        registration = _LazyRegistration(module, symbol, package)
        if speculates_on is None:
            self._lazy.setdefault(name, []).append(registration)
        else:
            self._lazy_speculators.setdefault(speculates_on, []).append(registration)

    def find(self, name: str, task: str | None = None) -> SupportedArchitecture | None:
        """The architecture registered as ``name`` (for ``task``, when given), or ``None``."""
        for registration in self._lazy.pop(name, []):
            item = registration.resolve()
            # An architecture registered eagerly (a custom one) wins over a lazy declaration.
            if isinstance(item, SupportedArchitecture) and (item.name, item.task) in self._by_name_and_task:
                continue
            self.register(item)
        if task is None:
            return self._by_name.get(name)
        return self._by_name_and_task.get((name, task))

    def speculators_for(self, target: str) -> list[Speculator]:
        """The speculators declared for ``target``, in declaration order."""
        for registration in self._lazy_speculators.pop(target, []):
            self.register(registration.resolve())
        return list(self._speculators.get(target, []))

    def select_speculator(self, target: str, method: str, draft_arch: str | None) -> Speculator | None:
        """The first speculator of ``target`` running ``method`` with a draft checkpoint of
        architecture ``draft_arch`` (``None``: no draft model).

        Returns ``None`` when ``target`` declares no speculators. Raises
        :class:`~spec_rs.errors.SpeculatorSelectionError` when none matches both.
        """
        speculators = self.speculators_for(target)
        declared = [(s.method, s.draft_arch) for s in speculators]
        index = _spec_rs.select_speculator(target, method, draft_arch, declared)
        return None if index is None else speculators[index]

    def load_custom_architectures(
        self, spec: str | os.PathLike[str]
    ) -> list[SupportedArchitecture | Speculator]:
        """Imports a module of declarations and registers every item of its ``ARCHITECTURES``.

        ``spec`` is a path to a ``.py`` file, or ``dir:module`` to import ``module`` with
        ``dir`` on ``sys.path`` (it stays there, so the module can import its siblings later).
        Returns the registered items.
        """
        module = _import_custom_module(os.fspath(spec))
        items = getattr(module, "ARCHITECTURES", None)
        if items is None:
            raise ConfigError(
                f"Custom architectures module {module.__name__!r} ({spec}) has no ARCHITECTURES "
                "list of SupportedArchitecture and Speculator declarations"
            )
        for item in items:
            self.register(item)
        return list(items)


def _import_custom_module(spec: str) -> ModuleType:
    if spec.endswith(".py"):
        return _import_file(Path(spec))
    directory, colon, module_name = spec.rpartition(":")
    if not colon or not directory or not module_name:
        raise ConfigError(f"Custom architectures {spec!r}: expected a path to a .py file or 'dir:module'")
    if not Path(directory).is_dir():
        raise FileNotFoundError(f"Custom architectures directory {directory!r} does not exist")
    if directory not in sys.path:
        sys.path.insert(0, directory)
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        # Only the module asked for is reported as missing; a missing dependency it imports
        # keeps its own error.
        if err.name is None or not (module_name == err.name or module_name.startswith(f"{err.name}.")):
            raise
        raise ModuleNotFoundError(
            f"No module {module_name!r} in custom architectures directory {directory!r}", name=module_name
        ) from err


def _import_file(path: Path) -> ModuleType:
    if not path.is_file():
        raise FileNotFoundError(f"Custom architectures file {str(path)!r} does not exist")
    module_name = f"_spec_rs_custom_{path.stem}"
    module_spec = importlib.util.spec_from_file_location(module_name, path)
    if module_spec is None or module_spec.loader is None:
        raise ImportError(f"Cannot import custom architectures file {str(path)!r}")
    module = importlib.util.module_from_spec(module_spec)
    # Dataclasses resolve their annotations through sys.modules, so the module must be there
    # while it executes.
    sys.modules[module_name] = module
    try:
        module_spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[module_name]
        raise
    return module


ARCH_LOOKUP = ArchLookup.with_builtins()
"""The process-wide registry the engine resolves checkpoints against."""

__all__ = [
    "ARCH_LOOKUP",
    "ENGINE_ENCODINGS",
    "TEXT_GENERATION",
    "ArchLookup",
    "CheckpointDraftWidth",
    "PipelineModelType",
    "Speculator",
    "SupportedArchitecture",
    "WeightsAdapter",
    "WeightsFormat",
]
