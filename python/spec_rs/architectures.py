"""The built-in target architectures and speculators, declared from the Rust tables.

``specrs_core::registry`` is the one list of what the engine runs; this module turns its rows
into :class:`~spec_rs.registry.SupportedArchitecture` and
:class:`~spec_rs.registry.Speculator` objects. :data:`~spec_rs.registry.ARCH_LOOKUP` registers
each of them lazily as a symbol of this module (resolved by the module ``__getattr__`` below),
so nothing here is imported before a lookup needs it.
"""

from __future__ import annotations

from . import _spec_rs
from .registry import PipelineModelType, Speculator, SupportedArchitecture, WeightsFormat


def pipeline_class(class_name: str) -> PipelineModelType:
    """The extension's pipeline class ``class_name``."""
    cls: PipelineModelType = getattr(_spec_rs, class_name)
    return cls


def declare_architectures() -> dict[str, SupportedArchitecture]:
    """Every built-in target architecture, by name."""
    return {
        row["name"]: SupportedArchitecture(
            name=row["name"],
            pipeline_model=pipeline_class(row["pipeline"]),
            example_repo_ids=list(row["example_repo_ids"]),
            default_weights_format=WeightsFormat(row["default_weights_format"]),
            supports_spec_decode_mixed_batches=row["supports_spec_decode_mixed_batches"],
            supports_device_graph_capture=row["supports_device_graph_capture"],
        )
        for row in _spec_rs.builtin_architectures()
    }


def declare_speculators(targets: dict[str, SupportedArchitecture]) -> dict[str, Speculator]:
    """Every built-in speculator, by name, each based on its target in ``targets``."""
    # Block drafters run at the width their checkpoint was trained for, read from the draft
    # config by the engine's rule (`checkpoint_draft_width(config, target_hf_config, draft_hf_config)`).
    width_from_checkpoint = _spec_rs.checkpoint_draft_width
    return {
        row["name"]: Speculator(
            name=row["name"],
            base=targets[row["base"]],
            draft_arch=row["draft_arch"],
            method=row["method"],
            pipeline_model=pipeline_class(row["pipeline"]),
            example_repo_ids=row["example_repo_ids"],
            supports_device_graph_capture=row["supports_device_graph_capture"],
            supports_spec_decode_mixed_batches=row["supports_spec_decode_mixed_batches"],
            checkpoint_draft_width=width_from_checkpoint if row["checkpoint_draft_width"] else None,
        )
        for row in _spec_rs.builtin_speculators()
    }


BUILTIN_ARCHITECTURES: dict[str, SupportedArchitecture] = declare_architectures()
BUILTIN_SPECULATORS: dict[str, Speculator] = declare_speculators(BUILTIN_ARCHITECTURES)


def __getattr__(name: str) -> SupportedArchitecture | Speculator:
    # Lazy registrations name each declaration as a symbol of this module; fused speculator
    # names such as "UnifiedEagleLlamaForCausalLM[LlamaForCausalLMEagle3]" are not
    # identifiers, so they are looked up here rather than defined as globals.
    declaration = BUILTIN_ARCHITECTURES.get(name) or BUILTIN_SPECULATORS.get(name)
    if declaration is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return declaration


__all__ = [
    "BUILTIN_ARCHITECTURES",
    "BUILTIN_SPECULATORS",
    "declare_architectures",
    "declare_speculators",
    "pipeline_class",
]
