"""spec-rs: speculative decoding on a Rust core.

Load a target model and a drafter (EAGLE, MTP, DFlash, DFlash2, DSpark or n-gram) and get the
same text as plain decoding, faster.
"""

from __future__ import annotations

from . import _spec_rs
from .config import SpeculativeConfig, VerifyWidthRange
from .errors import (
    ConfigError,
    EngineError,
    ModelLoadError,
    ModelNotInstalledError,
    RequestError,
    SpecRsError,
    SpeculatorSelectionError,
)
from .llm import (
    LLM,
    CompletionOutput,
    GuidedDecodingParams,
    RequestOutput,
    SamplingParams,
    SpecDecodeMetrics,
    StructuredOutputsParams,
    TraceStep,
)
from .models import DEFAULT_MODEL
from .registry import ARCH_LOOKUP, ArchLookup, Speculator, SupportedArchitecture, WeightsFormat

__version__: str = _spec_rs.__version__

__all__ = [
    "ARCH_LOOKUP",
    "DEFAULT_MODEL",
    "LLM",
    "ArchLookup",
    "CompletionOutput",
    "ConfigError",
    "EngineError",
    "GuidedDecodingParams",
    "ModelLoadError",
    "ModelNotInstalledError",
    "RequestError",
    "RequestOutput",
    "SamplingParams",
    "SpecDecodeMetrics",
    "SpecRsError",
    "SpeculativeConfig",
    "Speculator",
    "SpeculatorSelectionError",
    "StructuredOutputsParams",
    "SupportedArchitecture",
    "TraceStep",
    "VerifyWidthRange",
    "WeightsFormat",
    "__version__",
]
