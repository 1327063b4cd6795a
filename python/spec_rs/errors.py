"""Exceptions raised by spec-rs.

Every error derives from :class:`SpecRsError`. Errors about bad input also derive from the
built-in class a Python user would expect (``ValueError``, ``FileNotFoundError``), so
``except ValueError`` keeps working and pydantic turns configuration errors raised inside
validators into ``ValidationError``.
"""

from __future__ import annotations


class SpecRsError(Exception):
    """Base class of every spec-rs error."""


class ConfigError(SpecRsError, ValueError):
    """A configuration rule was broken.

    ``field`` names the offending field when one is to blame.
    """

    field: str | None = None


class ModelNotInstalledError(SpecRsError, FileNotFoundError):
    """A model alias resolved to nothing installed (the message says how to install it), or a
    model path names no file or directory."""


class ModelLoadError(SpecRsError, ValueError):
    """A checkpoint could not be loaded: a missing or misshapen tensor, an unknown
    architecture, a truncated file."""


class SpeculatorSelectionError(SpecRsError, ValueError):
    """No declared speculator of the target runs the configured method with the draft's
    architecture."""


class RequestError(SpecRsError, ValueError):
    """A generation request is invalid (bad sampling parameters, prompt too long)."""


class EngineError(SpecRsError, RuntimeError):
    """The engine failed while running a request."""


__all__ = [
    "ConfigError",
    "EngineError",
    "ModelLoadError",
    "ModelNotInstalledError",
    "RequestError",
    "SpecRsError",
    "SpeculatorSelectionError",
]
