"""spec-rs: speculative decoding on a Rust core.

Load a target model and a drafter, get the same text as plain decoding, faster.
"""

from __future__ import annotations

from . import _spec_rs
from .config import SpeculativeConfig, VerifyWidthRange
from .errors import ConfigError, SpecRsError

__version__: str = _spec_rs.__version__

__all__ = ["ConfigError", "SpecRsError", "SpeculativeConfig", "VerifyWidthRange", "__version__"]
