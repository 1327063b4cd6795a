"""The ``spec-rs`` console script.

Argument parsing, serving and generation are the Rust command line's (the same code as the
``spec-rs`` cargo binary); Python supplies the pipeline, built through
:data:`~spec_rs.registry.ARCH_LOOKUP` so that ``--custom-architectures`` modules take part.
"""

from __future__ import annotations

import json
import signal
import sys
from collections.abc import Sequence
from typing import Any

from . import _spec_rs
from .config import SpeculativeConfig
from .registry import ARCH_LOOKUP


def _build_pipeline(args_json: str) -> Any:
    from .llm import build_pipeline

    args = json.loads(args_json)
    if args["custom_architectures"]:
        ARCH_LOOKUP.load_custom_architectures(args["custom_architectures"])
    return build_pipeline(
        args["model"],
        args["draft_model"],
        SpeculativeConfig.model_validate(args["speculative_config"]),
        dtype=args["dtype"],
        device=args["device"],
        max_num_seqs=args["max_num_seqs"],
        max_model_len=args["max_model_len"],
        max_num_batched_tokens=args["max_num_batched_tokens"],
        kv_cache_memory=args["kv_cache_bytes"],
        block_size=args["block_size"],
        enable_spec_decode_mixed_batches=args["enable_spec_decode_mixed_batches"],
        device_graph_capture=args.get("device_graph_capture", False),
        max_seq_len_to_capture=args.get("max_seq_len_to_capture", 4096),
        enable_prefix_caching=args.get("enable_prefix_caching", True),
        tokenizer=args.get("tokenizer"),
    ).pipeline


def main(argv: Sequence[str] | None = None) -> int:
    """Runs ``spec-rs``; returns (and, as a script, exits with) its status."""
    # SIGINT/SIGTERM belong to the Rust command (graceful shutdown of `serve`); Python's own
    # handler would turn the same Ctrl-C into a KeyboardInterrupt once the command returns.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    code: int = _spec_rs.cli_main(list(sys.argv[1:] if argv is None else argv), _build_pipeline)
    return code


if __name__ == "__main__":
    sys.exit(main())
