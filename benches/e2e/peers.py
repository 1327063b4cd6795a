#!/usr/bin/env python3
"""Benchmark peers of spec-rs, installed on demand from PyPI, and the workers that measure them.

This file has two halves and imports only the standard library at module level, so every
Python involved can run it:

* The installer half runs in the project's environment. :func:`ensure_env` creates one
  virtual environment per peer under ``.bench-cache/venvs/<name>`` (gitignored) and
  pip-installs pinned packages there, so the project environment stays clean:

  - ``tools``: numpy, gguf, safetensors, tokenizers, jinja2, matplotlib (GGUF conversion,
    plots);
  - ``llama``: llama-cpp-python built from source for this CPU (``-DGGML_NATIVE=ON``, AMX off), with
    the ``[server]`` extra for the server benchmark;
  - ``mistralrs``: the mistral.rs CPU wheel;
  - ``hf``: transformers + torch. torch from PyPI may pull several GB of CUDA wheels; an
    install that fails or exceeds its time or size budget is reported as "not installable
    here" instead of failing the benchmark.

  :func:`convert_gguf_to_hf` (run through the ``tools`` environment) turns the default GGUF
  into the float32 Hugging Face folder that mistral.rs and transformers load.

* The worker half runs inside a peer's environment as ``python peers.py worker <system> ...``:
  it loads the peer, generates greedily for every prompt (chat template, at most
  ``--max-tokens`` new tokens, one prompt at a time) and writes, per prompt and repetition,
  the generated token count and the wall time including prefill, which is how the peer
  baseline (shared/reference/peer-baseline.md) measured tokens/s.

``python benches/e2e/peers.py --help`` lists the commands (install, convert, worker).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
#: Everything the benchmarks install or convert lives here (gitignored).
CACHE_DIR = Path(os.environ.get("SPEC_RS_BENCH_CACHE", REPO_ROOT / ".bench-cache"))
VENVS_DIR = CACHE_DIR / "venvs"
LOGS_DIR = CACHE_DIR / "logs"
#: The default model dequantized to float32 as a Hugging Face folder.
HF_F32_DIR = CACHE_DIR / "models" / "smollm2-135m-instruct-f32"
#: transformers' own f32 greedy outputs on the default model (input ids of the chat-templated
#: prompts, outputs and their text): what the converted tokenizer must reproduce.
REFERENCE_JSON = REPO_ROOT / "tests" / "data" / "smollm2_transformers.json"

#: The model's end-of-turn token `<|im_end|>`.
IM_END_ID = 2
#: SmolLM2's rotary base (mistral.rs needs it in config.json).
SMOLLM2_ROPE_THETA = 100000.0
#: Marker file inside a venv recording what was installed there.
MARKER = ".bench-env.json"


def nproc() -> int:
    """CPU cores this process may use."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


# --------------------------------------------------------------------------------------------
# Installer half
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EnvSpec:
    """A peer environment: what to pip-install, how to check it, and its budget."""

    name: str
    packages: tuple[str, ...]
    #: Python run in the environment after installing; prints a JSON object of versions.
    check: str
    pip_args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    timeout_s: int = 1800
    #: Installed size above which the environment is removed and reported not installable.
    max_size_gb: float | None = None
    note: str = ""


def _versions_check(*imports: str) -> str:
    """Python that imports each ``module:distribution`` pair and prints the distributions'
    versions as JSON."""
    pairs = [tuple(i.split(":")) if ":" in i else (i, i) for i in imports]
    return (
        "import importlib, json\n"
        "from importlib.metadata import version\n"
        f"pairs = {pairs!r}\n"
        "for module, _ in pairs:\n"
        "    importlib.import_module(module)\n"
        "print(json.dumps({dist: version(dist) for _, dist in pairs}))"
    )


NO_AMX = "'-mno-amx-tile -mno-amx-int8 -mno-amx-bf16'"


def env_specs(threads: int | None = None) -> dict[str, EnvSpec]:
    """The peer environments, pinned to the versions of the peer baseline."""
    jobs = str(threads or nproc())
    return {
        "tools": EnvSpec(
            "tools",
            ("numpy", "gguf==0.19.0", "safetensors", "tokenizers", "jinja2", "matplotlib"),
            _versions_check("numpy", "gguf", "safetensors", "tokenizers", "jinja2", "matplotlib"),
            timeout_s=900,
            note="GGUF conversion and plots",
        ),
        "llama": EnvSpec(
            "llama",
            ("llama-cpp-python[server]==0.3.36",),
            _versions_check("llama_cpp:llama-cpp-python"),
            # PyPI has the sdist only; build it for this CPU's instruction set, minus AMX: where
            # the kernel does not grant a process the AMX tile state (sandboxes, some VMs) the
            # first tile load dies with SIGILL, and where it does (checked 2026-12-02) 0.3.36's
            # AMX repack of this GGUF's q8_0 token_embd segfaults at load. AMX would only help
            # prompt-sized matmuls anyway.
            # GCC honours explicit -mno-* over -march=native whatever their order.
            # pip's wheel cache keys on the sdist alone, not on CMAKE_ARGS: never reuse a build.
            pip_args=("--no-binary", "llama-cpp-python", "--no-cache-dir"),
            env={
                "CMAKE_ARGS": f"-DGGML_NATIVE=ON -DCMAKE_C_FLAGS={NO_AMX} -DCMAKE_CXX_FLAGS={NO_AMX}",
                "FORCE_CMAKE": "1",
                "CMAKE_BUILD_PARALLEL_LEVEL": jobs,
            },
            timeout_s=3600,
            note="source build, about 6 minutes on 2 cores",
        ),
        "mistralrs": EnvSpec(
            "mistralrs",
            ("mistralrs==0.9.5",),
            _versions_check("mistralrs"),
            timeout_s=1200,
            note="PyPI CPU wheel",
        ),
        "hf": EnvSpec(
            "hf",
            ("torch==2.13.0", "transformers==5.24.0", "jinja2"),
            _versions_check("torch", "transformers", "jinja2"),
            # The size budget counts the environment; keep GBs of wheels out of pip's cache too.
            pip_args=("--no-cache-dir",),
            timeout_s=2400,
            max_size_gb=10.0,
            note="torch from PyPI (may pull CUDA wheels)",
        ),
    }


@dataclass
class EnvStatus:
    """The outcome of :func:`ensure_env`: a usable interpreter, or why there is none."""

    name: str
    python: Path | None = None
    versions: dict[str, str] = field(default_factory=dict)
    error: str | None = None
    install_seconds: float | None = None
    commands: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.python is not None and self.error is None


def venv_python(name: str) -> Path:
    return VENVS_DIR / name / "bin" / "python"


def install_commands(spec: EnvSpec) -> list[list[str]]:
    """The commands that create and fill the environment."""
    py = str(venv_python(spec.name))
    return [
        [sys.executable, "-m", "venv", str(VENVS_DIR / spec.name)],
        [py, "-m", "pip", "install", "--quiet", "--upgrade", "pip"],
        [py, "-m", "pip", "install", *spec.pip_args, *spec.packages],
    ]


def describe_command(argv: Sequence[str], env: dict[str, str] | None = None) -> str:
    """A shell-ready rendering of a command with its extra environment."""
    prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in (env or {}).items())
    return f"{prefix} {shlex.join(argv)}".strip()


def _dir_size_gb(path: Path) -> float:
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            p = Path(root) / f
            if not p.is_symlink():
                total += p.stat().st_size
    return total / 1e9


def _read_marker(spec: EnvSpec) -> dict[str, Any] | None:
    marker = VENVS_DIR / spec.name / MARKER
    if not marker.is_file():
        return None
    data: dict[str, Any] = json.loads(marker.read_text())
    # Build flags count too: a source build with other flags is another install.
    same = data.get("packages") == list(spec.packages) and data.get("env", {}) == spec.env
    return data if same else None


def check_env(spec: EnvSpec) -> dict[str, str]:
    """Imports the environment's packages; returns their versions (raises on failure)."""
    out = subprocess.run(
        [str(venv_python(spec.name)), "-c", spec.check], capture_output=True, text=True, timeout=300
    )
    if out.returncode != 0:
        raise RuntimeError(f"import check failed: {_tail(out.stderr)}")
    versions: dict[str, str] = json.loads(out.stdout.strip().splitlines()[-1])
    return versions


def _tail(text: str, lines: int = 3) -> str:
    return " | ".join(line.strip() for line in text.strip().splitlines()[-lines:])


def _run_logged(argv: list[str], log_file: Any, env: dict[str, str], timeout: float) -> int | None:
    """Runs ``argv`` in its own process group, output to ``log_file``; its exit status, or
    None after killing that group (pip and the compilers a source build started) on timeout."""
    proc = subprocess.Popen(argv, stdout=log_file, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return None


def ensure_env(spec: EnvSpec, *, dry_run: bool = False, log: Callable[[str], None] = print) -> EnvStatus:
    """Creates and fills ``spec``'s environment unless an identical install is there.

    Never raises for install problems: the returned status carries the reason, which the
    benchmark records in the system's row.
    """
    status = EnvStatus(spec.name)
    commands = install_commands(spec)
    status.commands = [describe_command(c, spec.env if "install" in c else None) for c in commands]
    if dry_run:
        for line in status.commands:
            log(f"[dry-run] {spec.name}: {line}")
        status.error = "dry run: not installed"
        return status
    if _read_marker(spec) is not None:
        try:
            status.versions = check_env(spec)
            status.python = venv_python(spec.name)
            return status
        except (RuntimeError, subprocess.TimeoutExpired, json.JSONDecodeError) as e:
            log(f"{spec.name}: existing environment unusable ({e}); reinstalling")
    need_gb = (spec.max_size_gb or 2.0) + 1.0
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    free_gb = shutil.disk_usage(CACHE_DIR).free / 1e9
    if free_gb < need_gb:
        status.error = f"not installable here: {free_gb:.1f} GB free, budget needs {need_gb:.1f} GB"
        return status
    shutil.rmtree(VENVS_DIR / spec.name, ignore_errors=True)
    LOGS_DIR.mkdir(parents=True, exist_ok=True)
    log_path = LOGS_DIR / f"install-{spec.name}.log"
    log(f"{spec.name}: installing {' '.join(spec.packages)} ({spec.note}); log: {log_path}")
    t0 = time.monotonic()
    with log_path.open("w") as log_file:
        for argv in commands:
            remaining = spec.timeout_s - (time.monotonic() - t0)
            log_file.write(f"$ {describe_command(argv, spec.env)}\n")
            log_file.flush()
            returncode = _run_logged(argv, log_file, {**os.environ, **spec.env}, max(remaining, 1))
            if returncode is None:
                shutil.rmtree(VENVS_DIR / spec.name, ignore_errors=True)
                status.error = f"not installable here: install exceeded its {spec.timeout_s} s budget"
                return status
            if returncode != 0:
                status.error = f"not installable here: `{shlex.join(argv[-3:])}` failed: " + _tail(
                    log_path.read_text(errors="replace")
                )
                return status
    status.install_seconds = time.monotonic() - t0
    size = _dir_size_gb(VENVS_DIR / spec.name)
    if spec.max_size_gb is not None and size > spec.max_size_gb:
        shutil.rmtree(VENVS_DIR / spec.name, ignore_errors=True)
        status.error = f"not installable here: {size:.2f} GB installed, over the {spec.max_size_gb} GB budget"
        return status
    try:
        status.versions = check_env(spec)
    except (RuntimeError, subprocess.TimeoutExpired, json.JSONDecodeError) as e:
        status.error = f"not installable here: {e}"
        return status
    (VENVS_DIR / spec.name / MARKER).write_text(
        json.dumps(
            {"packages": list(spec.packages), "env": spec.env, "versions": status.versions, "size_gb": size}
        )
    )
    status.python = venv_python(spec.name)
    log(f"{spec.name}: installed in {status.install_seconds:.0f} s ({size:.1f} GB): {status.versions}")
    return status


def convert_command(tools_python: Path | str, gguf_path: str, out_dir: Path) -> list[str]:
    """The command that converts ``gguf_path`` into a float32 Hugging Face folder."""
    return [
        str(tools_python),
        str(Path(__file__).resolve()),
        "convert",
        "--gguf",
        gguf_path,
        "--out",
        str(out_dir),
    ]


def ensure_hf_f32(
    tools: EnvStatus, gguf_path: str, *, dry_run: bool = False, log: Callable[[str], None] = print
) -> tuple[Path | None, str | None]:
    """The converted float32 folder (converting once), or ``(None, reason)``."""
    done = HF_F32_DIR / "conversion.json"
    argv = convert_command(tools.python or venv_python("tools"), gguf_path, HF_F32_DIR)
    if dry_run:
        log(f"[dry-run] convert: {shlex.join(argv)}")
        return None, "dry run: not converted"
    if done.is_file() and json.loads(done.read_text()).get("source") == str(Path(gguf_path).resolve()):
        return HF_F32_DIR, None
    if not tools.ok:
        return None, f"no tools environment: {tools.error}"
    log(f"converting {gguf_path} to float32 safetensors in {HF_F32_DIR}")
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        return None, f"GGUF conversion failed: {_tail(proc.stderr)}"
    log(proc.stdout.strip())
    return HF_F32_DIR, None


# --------------------------------------------------------------------------------------------
# GGUF -> float32 Hugging Face folder (runs in the tools environment)
# --------------------------------------------------------------------------------------------

#: GGUF tensor names (per block after ``blk.N.``) -> Hugging Face Llama names.
_BLOCK_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_TOP_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


def _hf_name(gguf_name: str) -> str:
    if gguf_name in _TOP_NAMES:
        return _TOP_NAMES[gguf_name]
    parts = gguf_name.split(".", 2)
    if parts[0] != "blk" or parts[2] not in _BLOCK_NAMES:
        raise ValueError(f"unexpected tensor {gguf_name!r}")
    return f"model.layers.{parts[1]}.{_BLOCK_NAMES[parts[2]]}"


def _unpermute_rotary(weights: Any, n_head: int) -> Any:
    """Undoes the q/k row permutation llama.cpp's converter applies for its rotary layout
    (the same inverse transformers applies when it loads a Llama GGUF)."""
    dim = weights.shape[0] // n_head // 2
    w = weights.reshape(n_head, dim, 2, *weights.shape[1:])
    return w.swapaxes(2, 1).reshape(weights.shape)


def _field(reader: Any, key: str, default: Any = None) -> Any:
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def _tokenizer_json(tokens: list[str], merges: list[str], token_types: list[int], pre: str) -> dict[str, Any]:
    """A `tokenizers` JSON document for GGUF byte-level BPE metadata (the same pipeline
    spec-rs builds from GGUF: SmolLM's digit split, then GPT-2 bytes)."""
    if pre in ("smollm", "starcoder", "refact"):
        pre_tokenizer: dict[str, Any] = {
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Digits", "individual_digits": True},
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
            ],
        }
    elif pre in ("gpt2", "gpt-2", "default"):
        pre_tokenizer = {
            "type": "ByteLevel",
            "add_prefix_space": False,
            "trim_offsets": True,
            "use_regex": True,
        }
    else:
        raise ValueError(f"GGUF pre-tokenizer {pre!r} is not handled by this converter")
    added = [
        {
            "id": i,
            "content": tok,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for i, (tok, kind) in enumerate(zip(tokens, token_types, strict=True))
        if kind in (3, 4)  # control, user-defined
    ]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": {tok: i for i, tok in enumerate(tokens)},
            "merges": merges,
        },
    }


def convert_gguf_to_hf(gguf_path: str, out_dir: Path, rope_theta: float | None = None) -> dict[str, Any]:
    """Writes ``config.json``, ``model.safetensors`` (every tensor dequantized to float32),
    ``tokenizer.json``, ``tokenizer_config.json`` (with the chat template) and
    ``generation_config.json`` for a Llama-architecture GGUF. Returns a summary."""
    import gguf  # type: ignore[import-not-found]
    import numpy as np
    from gguf.quants import dequantize  # type: ignore[import-not-found]
    from safetensors.numpy import save_file  # type: ignore[import-not-found]

    reader = gguf.GGUFReader(gguf_path)
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise ValueError(f"only llama GGUFs are converted, got {arch!r}")
    n_head = int(_field(reader, "llama.attention.head_count"))
    n_kv = int(_field(reader, "llama.attention.head_count_kv", n_head))
    tokens = list(_field(reader, "tokenizer.ggml.tokens"))
    theta = rope_theta or float(_field(reader, "llama.rope.freq_base", SMOLLM2_ROPE_THETA))
    bos_id = int(_field(reader, "tokenizer.ggml.bos_token_id", 1))
    eos_id = int(_field(reader, "tokenizer.ggml.eos_token_id", IM_END_ID))
    hidden = int(_field(reader, "llama.embedding_length"))
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": int(_field(reader, "llama.feed_forward_length")),
        "num_hidden_layers": int(_field(reader, "llama.block_count")),
        "num_attention_heads": n_head,
        "num_key_value_heads": n_kv,
        "head_dim": hidden // n_head,
        "hidden_act": "silu",
        "rms_norm_eps": float(_field(reader, "llama.attention.layer_norm_rms_epsilon", 1e-5)),
        "rope_theta": theta,
        "max_position_embeddings": int(_field(reader, "llama.context_length", 2048)),
        "vocab_size": len(tokens),
        "tie_word_embeddings": not any(t.name == "output.weight" for t in reader.tensors),
        "attention_bias": False,
        "mlp_bias": False,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "torch_dtype": "float32",
    }
    tensors: dict[str, Any] = {}
    quant_types: dict[str, int] = {}
    for t in reader.tensors:
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        w = np.ascontiguousarray(dequantize(t.data, t.tensor_type).reshape(shape).astype(np.float32))
        if ".attn_q." in t.name:
            w = _unpermute_rotary(w, n_head)
        elif ".attn_k." in t.name:
            w = _unpermute_rotary(w, n_kv)
        tensors[_hf_name(t.name)] = np.ascontiguousarray(w)
        quant_types[t.tensor_type.name] = quant_types.get(t.tensor_type.name, 0) + 1
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    (out_dir / "config.json").write_text(json.dumps(config, indent=1))
    token_types = [int(x) for x in _field(reader, "tokenizer.ggml.token_type", [1] * len(tokens))]
    tok_json = _tokenizer_json(
        tokens,
        list(_field(reader, "tokenizer.ggml.merges")),
        token_types,
        _field(reader, "tokenizer.ggml.pre", "gpt2"),
    )
    (out_dir / "tokenizer.json").write_text(json.dumps(tok_json, ensure_ascii=False))
    unk = _field(reader, "tokenizer.ggml.unknown_token_id")
    tok_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": tokens[bos_id],
        "eos_token": tokens[eos_id],
        "pad_token": tokens[int(_field(reader, "tokenizer.ggml.padding_token_id", eos_id))],
        "unk_token": tokens[int(unk)] if unk is not None else None,
        "add_bos_token": bool(_field(reader, "tokenizer.ggml.add_bos_token", False)),
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": config["max_position_embeddings"],
        "chat_template": _field(reader, "tokenizer.chat_template"),
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=1, ensure_ascii=False))
    (out_dir / "generation_config.json").write_text(
        json.dumps({"bos_token_id": bos_id, "eos_token_id": eos_id, "pad_token_id": eos_id}, indent=1)
    )
    weight_bytes = sum(int(w.nbytes) for w in tensors.values())
    summary = {
        "source": str(Path(gguf_path).resolve()),
        "tensors": len(tensors),
        "source_types": quant_types,
        "f32_weight_bytes": weight_bytes,
        "rope_theta": theta,
        "tokenizer_check": check_converted_tokenizer(out_dir),
    }
    (out_dir / "conversion.json").write_text(json.dumps(summary, indent=1))
    return summary


def check_converted_tokenizer(out_dir: Path, reference: Path = REFERENCE_JSON) -> str:
    """Renders the reference prompts with the converted chat template and tokenizes them with
    the converted tokenizer.json; they must give the reference input ids (transformers'
    own encoding of the same prompts)."""
    if not reference.is_file():
        return f"skipped: {reference} not found"
    from jinja2.sandbox import ImmutableSandboxedEnvironment  # type: ignore[import-not-found]
    from tokenizers import Tokenizer  # type: ignore[import-not-found]

    tok = Tokenizer.from_file(str(out_dir / "tokenizer.json"))
    template_text = json.loads((out_dir / "tokenizer_config.json").read_text())["chat_template"]
    template = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True).from_string(template_text)
    cases = json.loads(reference.read_text())["cases"]
    for case in cases:
        text = template.render(
            messages=[{"role": "user", "content": case["prompt"]}], add_generation_prompt=True
        )
        ids = tok.encode(text, add_special_tokens=False).ids
        if ids != case["input_ids"]:
            raise ValueError(f"converted tokenizer disagrees with the reference on {case['prompt']!r}")
        if tok.decode(case["greedy_ids"], skip_special_tokens=False) != case["greedy_text"]:
            raise ValueError(f"converted tokenizer decodes {case['prompt']!r}'s output differently")
    return f"ok: {len(cases)} reference prompts encode and decode identically"


# --------------------------------------------------------------------------------------------
# Worker half (runs inside a peer environment)
# --------------------------------------------------------------------------------------------

#: ``generate(messages, max_tokens) -> generated token count``.
Generate = Callable[[list[dict[str, str]], int], int]

#: The untimed warm-up request: not one of the measured prompts, so that no engine starts the
#: measurement with a measured prompt already in a prefix cache.
WARMUP_MESSAGES = [{"role": "user", "content": "Say hello."}]


def measure(
    generate: Generate, items: list[dict[str, Any]], max_tokens: int, repeats: int
) -> list[dict[str, Any]]:
    """Times ``generate`` on every prompt, ``repeats`` times, after one untimed warm-up.

    One record per (repetition, prompt): generated tokens and wall seconds including prefill.
    """
    generate(WARMUP_MESSAGES, min(8, max_tokens))
    runs = []
    for r in range(repeats):
        for item in items:
            t0 = time.perf_counter()
            n = generate(item["messages"], max_tokens)
            seconds = time.perf_counter() - t0
            runs.append({"repeat": r, "id": item["id"], "set": item["set"], "tokens": n, "seconds": seconds})
    return runs


def llama_generator(gguf_path: str, mode: str, threads: int, num_pred_tokens: int, n_ctx: int) -> Generate:
    """llama.cpp through llama-cpp-python on the GGUF itself: the chat template from the
    file, greedy (temperature 0), plain or its prompt-lookup decoding."""
    from llama_cpp import Llama  # type: ignore[import-not-found]

    kwargs: dict[str, Any] = {}
    if mode == "lookup":
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding  # type: ignore[import-not-found]

        kwargs["draft_model"] = LlamaPromptLookupDecoding(num_pred_tokens=num_pred_tokens)
    llm = Llama(
        model_path=gguf_path, n_threads=threads, n_threads_batch=threads, n_ctx=n_ctx, verbose=False, **kwargs
    )

    def generate(messages: list[dict[str, str]], max_tokens: int) -> int:
        out = llm.create_chat_completion(
            messages=messages, max_tokens=max_tokens, temperature=0.0, top_k=1, repeat_penalty=1.0
        )
        return int(out["usage"]["completion_tokens"])

    return generate


def mistralrs_generator(model_dir: str) -> Generate:
    """mistral.rs (``mistralrs`` Runner) on the float32 safetensors folder, greedy.

    Its prefix cache is turned off: every prompt is repeated ``--repeats`` times, and a cache
    hit on an identical earlier prompt would skip prefill, which no other system here does.
    """
    import mistralrs  # type: ignore[import-not-found]

    plain_kwargs: dict[str, Any] = {"model_id": model_dir}
    if hasattr(mistralrs, "ModelDType") and hasattr(mistralrs.ModelDType, "F32"):
        plain_kwargs["dtype"] = mistralrs.ModelDType.F32
    try:
        which = mistralrs.Which.Plain(**plain_kwargs)
    except TypeError:
        which = mistralrs.Which.Plain(model_id=model_dir, arch=mistralrs.Architecture.Llama)
    runner = mistralrs.Runner(which=which, prefix_cache_n=0)

    def generate(messages: list[dict[str, str]], max_tokens: int) -> int:
        res = runner.send_chat_completion_request(
            mistralrs.ChatCompletionRequest(
                model="default", messages=messages, max_tokens=max_tokens, temperature=0.0, top_k=1
            )
        )
        return int(res.usage.completion_tokens)

    return generate


def hf_generator(
    model_dir: str, mode: str, threads: int, num_pred_tokens: int, assistant: str | None
) -> Generate:
    """HF transformers ``generate`` on the float32 folder: greedy, plain, prompt lookup
    (``prompt_lookup_num_tokens``) or assisted generation with ``assistant``."""
    import torch  # type: ignore[import-not-found]
    from transformers import AutoModelForCausalLM, AutoTokenizer  # type: ignore[import-not-found]

    torch.set_num_threads(threads)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    extra: dict[str, Any] = {}
    if mode == "lookup":
        extra["prompt_lookup_num_tokens"] = num_pred_tokens
    elif mode == "assisted":
        if not assistant:
            raise ValueError("assisted generation needs --assistant DIR")
        extra["assistant_model"] = AutoModelForCausalLM.from_pretrained(assistant, dtype=torch.float32).eval()

    def generate(messages: list[dict[str, str]], max_tokens: int) -> int:
        ids = tok.apply_chat_template(
            messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
        )
        with torch.inference_mode():
            out = model.generate(
                **ids, do_sample=False, max_new_tokens=max_tokens, pad_token_id=IM_END_ID, **extra
            )
        return int(out.shape[1] - ids["input_ids"].shape[1])

    return generate


def run_worker(args: argparse.Namespace) -> int:
    """Builds the peer named by ``args.system``, measures it and writes the records."""
    items = json.loads(Path(args.prompts).read_text())
    t0 = time.perf_counter()
    if args.system == "llama":
        generate = llama_generator(args.gguf, args.mode, args.threads, args.num_pred_tokens, args.n_ctx)
        import llama_cpp  # type: ignore[import-not-found]

        versions = {"llama_cpp": llama_cpp.__version__}
    elif args.system == "mistralrs":
        generate = mistralrs_generator(args.model_dir)
        versions = {"mistralrs": _dist_version("mistralrs")}
    else:
        generate = hf_generator(args.model_dir, args.mode, args.threads, args.num_pred_tokens, args.assistant)
        versions = {"torch": _dist_version("torch"), "transformers": _dist_version("transformers")}
    load_seconds = time.perf_counter() - t0
    runs = measure(generate, items, args.max_tokens, args.repeats)
    result = {
        "system": args.system,
        "mode": args.mode,
        "versions": versions,
        "load_seconds": load_seconds,
        "runs": runs,
    }
    Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


def _dist_version(name: str) -> str:
    from importlib.metadata import version

    return version(name)


def worker_command(
    python: Path | str,
    system: str,
    *,
    prompts: Path,
    out: Path,
    max_tokens: int,
    repeats: int,
    threads: int,
    mode: str = "plain",
    gguf: str | None = None,
    model_dir: Path | None = None,
    num_pred_tokens: int = 4,
    assistant: str | None = None,
) -> list[str]:
    """The command that runs one peer measurement in its environment."""
    argv = [str(python), str(Path(__file__).resolve()), "worker", system, "--mode", mode]
    argv += ["--prompts", str(prompts), "--out", str(out), "--max-tokens", str(max_tokens)]
    argv += ["--repeats", str(repeats), "--threads", str(threads), "--num-pred-tokens", str(num_pred_tokens)]
    if gguf:
        argv += ["--gguf", gguf]
    if model_dir:
        argv += ["--model-dir", str(model_dir)]
    if assistant:
        argv += ["--assistant", assistant]
    return argv


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    inst = sub.add_parser("install", help="create (or reuse) peer environments under .bench-cache/venvs")
    inst.add_argument("names", nargs="+", choices=sorted(env_specs()))
    inst.add_argument("--dry-run", action="store_true", help="print the commands without running them")
    conv = sub.add_parser("convert", help="GGUF -> float32 Hugging Face folder (run with the tools env)")
    conv.add_argument("--gguf", required=True)
    conv.add_argument("--out", type=Path, default=HF_F32_DIR)
    conv.add_argument("--rope-theta", type=float, default=None, help="default: the GGUF's rope.freq_base")
    work = sub.add_parser("worker", help="measure one peer (run with that peer's environment)")
    work.add_argument("system", choices=["llama", "mistralrs", "hf"])
    work.add_argument("--mode", choices=["plain", "lookup", "assisted"], default="plain")
    work.add_argument("--prompts", required=True, help="JSON list of {id, set, messages}")
    work.add_argument("--out", required=True)
    work.add_argument("--max-tokens", type=int, default=96)
    work.add_argument("--repeats", type=int, default=3)
    work.add_argument("--threads", type=int, default=nproc())
    work.add_argument("--num-pred-tokens", type=int, default=4)
    work.add_argument("--n-ctx", type=int, default=2048)
    work.add_argument("--gguf")
    work.add_argument("--model-dir")
    work.add_argument("--assistant")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "install":
        specs = env_specs()
        failed = 0
        for name in args.names:
            status = ensure_env(specs[name], dry_run=args.dry_run)
            if not status.ok and not args.dry_run:
                print(f"{name}: {status.error}", file=sys.stderr)
                failed += 1
        return 1 if failed else 0
    if args.command == "convert":
        summary = convert_gguf_to_hf(args.gguf, args.out, args.rope_theta)
        print(json.dumps(summary))
        return 0
    return run_worker(args)


if __name__ == "__main__":
    sys.exit(main())
