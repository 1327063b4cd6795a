#!/usr/bin/env python3
"""spec-rs against its peers, end to end, on the same prompts in one run (issues 3, 5 and 7).

What one run measures, and writes as a dated Markdown section (appended to
docs/BENCHMARKS.md unless ``--output`` says otherwise) plus PNG plots:

* **spec-rs** through its Python API, every configuration in one subprocess, interleaved:
  each prompt and each batch is run by every configuration in turn (the order rotating), so
  ratios between them are measured side by side on a shared, noisy machine: plain decoding
  with f32, default (``auto``: the GGUF's quantization or q8_0) and q4_0 weights; EAGLE-3
  with the shipped draft head; n-gram (K=4); synthetic acceptance 0.7 with K=3. Single
  stream (one request at a time) on every prompt, and batch 8 / 32 (requests submitted
  together, aggregate tokens/s) for plain, EAGLE-3 and n-gram with adaptive verify widths.
* **Peers**, each installed on demand from PyPI into its own environment (see peers.py):
  llama.cpp through llama-cpp-python on the same GGUF (plain and prompt-lookup decoding),
  mistral.rs on the GGUF dequantized to f32 safetensors, HF transformers (plain,
  ``prompt_lookup_num_tokens`` and assisted generation when an assistant is given). With
  several repetitions the systems take turns: each repetition runs spec-rs, then every peer
  (``--no-interleave`` runs all of spec-rs's repetitions first).
* **Step costs** from the ``decode_speed`` example: forward steps/s at 1 and K+1 tokens per
  step, prefill tokens/s and batch 8 / 32 decode throughput, the f32 memory-bandwidth roofline
  and the speedup synthetic acceptance can reach given those step costs.

The work is the peer baseline's (shared/reference/peer-baseline.md): chat prompts wrapped in
the model's chat template, greedy, at most ``--max-tokens`` new tokens; tokens/s = generated
tokens / wall time including prefill, summed over a prompt set per repetition; the table
shows the median of ``--repeats`` repetitions. Each system generates once, untimed, before it
is measured. Every number written comes from a measurement of this run; a system that cannot
run records why in its row.

    python benches/e2e/run_benchmarks.py                    # everything, 3 repetitions
    python benches/e2e/run_benchmarks.py --quick --systems specrs --output /tmp/b.md
    python benches/e2e/run_benchmarks.py --dry-run          # print the commands, run nothing
    # a setting side by side with the shipped default and plain decoding, single stream:
    python benches/e2e/run_benchmarks.py --systems specrs --specrs-configs plain,eagle-lookup-batch \
        --specrs-extra 'cut0.1={"speculative_method": "eagle", "num_speculative_tokens": 3,
                                "draft_confidence_threshold": 0.1}' --output /tmp/b.md
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import peers

REPO_ROOT = peers.REPO_ROOT
DEFAULT_MODEL = "smollm2-135m-instruct"
#: ``draft_confidence_threshold`` of the shipped default (``default_draft.rs``).
SHIPPED_CONFIDENCE_THRESHOLD = 0.2
#: Where the shipped EAGLE-3 head for the default model is expected (override with
#: --eagle-draft or SPEC_RS_EAGLE_DRAFT).
SHIPPED_EAGLE_DRAFT = REPO_ROOT / "crates" / "specrs-engine" / "drafters" / "smollm2-135m-instruct-eagle3"
DEFAULT_EAGLE_DRAFT = Path(os.environ.get("SPEC_RS_EAGLE_DRAFT", SHIPPED_EAGLE_DRAFT))
PROMPTS_RS = REPO_ROOT / "crates" / "specrs-engine" / "src" / "train" / "prompts.rs"

#: The first 12 of ``held_out_prompts()`` (crates/specrs-engine/src/train/prompts.rs): the six
#: reference prompts of smollm2_transformers.json, then held-out topics no drafter trained on.
CHAT_PROMPTS = [
    "Write a Python function that checks whether a number is prime.",
    "Explain what a hash table is to a ten-year-old.",
    "Translate 'good morning, how are you?' into Spanish.",
    "Summarize the plot of Romeo and Juliet in two sentences.",
    "Give me a SQL query that counts rows in a table named users.",
    "Write a short story opening about a robot who learns to paint.",
    "Explain lighthouses in simple terms.",
    "What are three interesting facts about glaciers?",
    "Write a short paragraph about origami.",
    "Give me a list of five tips related to beekeeping.",
    "Describe the history of submarines briefly.",
    "What are the pros and cons of hot air balloons?",
]

#: Prompts whose answer quotes the prompt back (edit / repeat): the case prompt lookup is for.
QUOTE_PROMPTS = [
    "Repeat this Python code exactly, then add a docstring to the function:\n\n"
    "def moving_average(values, window):\n"
    "    result = []\n"
    "    for i in range(len(values) - window + 1):\n"
    "        chunk = values[i:i + window]\n"
    "        result.append(sum(chunk) / window)\n"
    "    return result",
    "Fix the spelling mistakes in this paragraph and return the whole corrected paragraph:\n\n"
    "The lighthouse keeper climbed the stairs evry evening to light the lamp. He cleaned the "
    "glas, checked the oil, and wrote the wether in his log book before the ships came past "
    "the rocks.",
    "Rewrite this SQL query with its keywords in upper case and return only the query:\n\n"
    "select name, email, created_at from users where active = 1 and country = 'FR' "
    "order by created_at desc limit 20;",
    "Copy this list and add a fourth item in the same style:\n"
    "1. Water the plants every morning.\n"
    "2. Open the windows for fresh air.\n"
    "3. Sweep the kitchen floor after dinner.",
]

SYSTEMS = ("specrs", "llama", "mistralrs", "hf", "steps")
SPECRS_CONFIGS = (
    "plain-f32",
    "plain",
    "plain-q4_0",
    "eagle",
    "eagle-batch",
    "eagle-lookup",
    "eagle-lookup-batch",
    "ngram",
    "ngram-batch",
    "suffix",
    "suffix-batch",
    "suffix-cached",
    "eagle-suffix-batch",
    "eagle-suffix-cached",
    "synthetic",
)
SYNTHETIC_RATE = 0.7
SYNTHETIC_K = 3


# --------------------------------------------------------------------------------------------
# Prompts
# --------------------------------------------------------------------------------------------


def prompt_items(num_chat: int, num_quote: int) -> list[dict[str, Any]]:
    """The prompt sets as ``{id, set, messages}`` records, the input every system gets."""
    items = [
        {"id": f"chat-{i}", "set": "chat", "messages": [{"role": "user", "content": p}]}
        for i, p in enumerate(CHAT_PROMPTS[:num_chat])
    ]
    items += [
        {"id": f"quote-{i}", "set": "quote", "messages": [{"role": "user", "content": p}]}
        for i, p in enumerate(QUOTE_PROMPTS[:num_quote])
    ]
    return items


def held_out_prompts_from_source(path: Path = PROMPTS_RS) -> list[str] | None:
    """``held_out_prompts()`` recomputed from the Rust source (the literal reference prompts,
    then each held-out topic in a task phrasing), or None if the source has changed shape."""
    try:
        src = path.read_text()
    except OSError:
        return None
    body = re.search(r"pub fn held_out_prompts\(\).*?vec!\[(.*?)\];", src, re.S)
    topics = re.search(r"const HELD_OUT_TOPICS: &\[&str\] = &\[(.*?)\];", src, re.S)
    tasks = re.search(r"const TASKS: &\[&str\] = &\[(.*?)\];", src, re.S)
    if not (body and topics and tasks):
        return None

    def literals(text: str) -> list[str]:
        return [json.loads(f'"{s}"') for s in re.findall(r'"((?:[^"\\]|\\.)*)"', text)]

    task_list = literals(tasks.group(1))
    out = literals(body.group(1))
    out += [task_list[i % len(task_list)].replace("{}", t) for i, t in enumerate(literals(topics.group(1)))]
    return out


def prompts_note(num_chat: int) -> str:
    """Which held-out prompts the chat set is, and whether CHAT_PROMPTS still matches the Rust
    ``held_out_prompts()``."""
    derived = held_out_prompts_from_source()
    if derived is None:
        return "could not re-derive held_out_prompts() from prompts.rs; using the copy in this script"
    if derived[: len(CHAT_PROMPTS)] != CHAT_PROMPTS:
        return "WARNING: CHAT_PROMPTS differ from held_out_prompts() in prompts.rs"
    return f"the first {num_chat} of held_out_prompts(), checked against prompts.rs"


# --------------------------------------------------------------------------------------------
# Machine facts
# --------------------------------------------------------------------------------------------


def memory_bandwidth_gbs(megabytes: int = 256, tries: int = 5) -> float:
    """Read bandwidth: the best of ``tries`` numpy sums over a ``megabytes`` float64 array."""
    import numpy as np

    a = np.ones(megabytes * 1_000_000 // 8)
    a.sum()
    best = min(_timed(a.sum) for _ in range(tries))
    return a.nbytes / best / 1e9


def gemm_gflops(n: int = 2048, tries: int = 3) -> float:
    """f32 SGEMM throughput: the best of ``tries`` numpy ``n``³ matrix products."""
    import numpy as np

    a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
    b = np.random.default_rng(1).standard_normal((n, n), dtype=np.float32)
    a @ b
    best = min(_timed(lambda: a @ b) for _ in range(tries))
    return 2 * n**3 / best / 1e9


def _timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _cpu_flags() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "?"
    m = re.search(r"^flags\s*:(.*)$", text, re.M)
    flags = set(m.group(1).split()) if m else set()
    return ", ".join(f for f in ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16") if f in flags) or "?"


def _mem_total_gib() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return float("nan")


def cpu_times() -> list[int] | None:
    """The aggregate ``cpu`` line of ``/proc/stat`` (user, nice, system, idle, iowait, irq,
    softirq, steal, ...), in clock ticks; ``None`` where there is none."""
    try:
        for line in Path("/proc/stat").read_text().splitlines():
            if line.startswith("cpu "):
                return [int(x) for x in line.split()[1:]]
    except (OSError, ValueError):
        pass
    return None


def steal_share(start: list[int] | None, end: list[int] | None) -> float | None:
    """Share of the CPU time between two :func:`cpu_times` readings that the hypervisor gave
    to other guests (the ``steal`` field). On a shared VM this is what makes one repetition
    slower than the next; a run with a large share has wide ranges even where its
    side-by-side ratios hold."""
    if start is None or end is None or len(start) < 8 or len(end) < 8:
        return None
    total = sum(end[:8]) - sum(start[:8])
    return (end[7] - start[7]) / total if total > 0 else None


def _git(*args: str) -> str:
    out = subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True)
    return out.stdout.strip()


def machine_facts() -> dict[str, Any]:
    """What the numbers depend on: cores, CPU, memory, measured bandwidth and GEMM, load."""
    commit = _git("rev-parse", "--short", "HEAD")
    dirty = bool(_git("status", "--porcelain", "--untracked-files=no"))
    return {
        "nproc": peers.nproc(),
        "cpu": _cpu_model(),
        "cpu_flags": _cpu_flags(),
        "mem_gib": _mem_total_gib(),
        "bandwidth_gbs": memory_bandwidth_gbs(),
        "gemm_gflops": gemm_gflops(),
        "loadavg_start": os.getloadavg(),
        "cpu_times_start": cpu_times(),
        "python": platform.python_version(),
        "kernel": platform.release(),
        "commit": commit + (" (with uncommitted changes)" if dirty else ""),
    }


# --------------------------------------------------------------------------------------------
# Records and rows
# --------------------------------------------------------------------------------------------


@dataclass
class Row:
    """One line of a results table: a system/method on one prompt set at one batch size."""

    key: str
    system: str
    method: str
    weights: str
    prompt_set: str
    batch: int = 1
    #: tokens/s of each repetition.
    tps: list[float] = field(default_factory=list)
    mean_tokens: float | None = None
    acceptance_length: float | None = None
    per_position: list[float] | None = None
    #: Fraction of decode steps (after the first token) that verified drafts.
    draft_step_fraction: float | None = None
    generated: int = 0
    requests: int = 0
    drafts: int = 0
    accepted: int = 0
    error: str | None = None
    #: Its repetitions ran in turn with every other system's (``run_interleaved``): the i-th
    #: repetitions of two such rows were measured minutes apart, not a whole run apart.
    interleaved: bool = False

    @property
    def median(self) -> float | None:
        return statistics.median(self.tps) if self.tps else None


def rows_from_runs(
    key: str, system: str, method: str, weights: str, runs: list[dict[str, Any]], sets: Iterable[str]
) -> list[Row]:
    """Aggregates per-(repetition, prompt) records into one row per prompt set and batch.

    tokens/s per repetition = Σ generated / Σ wall seconds over the set; speculative metrics
    are pooled over every request of every repetition.
    """
    rows = []
    batches = sorted({int(r.get("batch", 1)) for r in runs}) or [1]
    for batch in batches:
        for s in sets:
            mine = [r for r in runs if r["set"] == s and int(r.get("batch", 1)) == batch]
            if not mine:
                continue
            row = Row(key, system, method, weights, s, batch)
            # One sample per repetition, or per round of a repetition's batch workload.
            by_rep: dict[tuple[int, int], list[dict[str, Any]]] = {}
            for r in mine:
                by_rep.setdefault((int(r["repeat"]), int(r.get("round", 0))), []).append(r)
            row.tps = [
                sum(r["tokens"] for r in rs) / sum(r["seconds"] for r in rs)
                for _, rs in sorted(by_rep.items())
            ]
            row.requests = sum(int(r.get("requests", 1)) for r in mine)
            row.generated = sum(int(r["tokens"]) for r in mine)
            row.mean_tokens = row.generated / row.requests
            _pool_spec_metrics(row, mine)
            errors = {e for r in mine for e in r.get("errors", [])}
            if errors:
                row.error = "; ".join(sorted(errors))[:300]
            rows.append(row)
    return rows


def _pool_spec_metrics(row: Row, runs: list[dict[str, Any]]) -> None:
    metrics = [r["metrics"] for r in runs if r.get("metrics")]
    if not metrics:
        return
    row.drafts = sum(m["num_drafts"] for m in metrics)
    row.accepted = sum(m["num_accepted_tokens"] for m in metrics)
    if row.drafts:
        row.acceptance_length = (row.accepted + row.drafts) / row.drafts
        width = max(len(m["accepted_per_position"]) for m in metrics)
        counts = [
            sum(m["accepted_per_position"][i] for m in metrics if i < len(m["accepted_per_position"]))
            for i in range(width)
        ]
        row.per_position = [c / row.drafts for c in counts]
    decode_steps_tokens = row.generated - row.requests  # tokens after each request's first
    plain_steps = decode_steps_tokens - row.accepted - row.drafts
    if decode_steps_tokens > 0:
        row.draft_step_fraction = row.drafts / max(row.drafts + plain_steps, 1)


def error_rows(
    key: str,
    system: str,
    method: str,
    weights: str,
    sets: Iterable[str],
    reason: str,
    batches: Iterable[int] = (1,),
) -> list[Row]:
    return [Row(key, system, method, weights, s, b, error=reason) for b in batches for s in sets]


# --------------------------------------------------------------------------------------------
# spec-rs (in-process Python API, the configurations interleaved in one subprocess)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SpecJob:
    """One spec-rs configuration (its engine lives in the shared spec-rs subprocess)."""

    key: str
    method: str
    dtype: str
    speculative: dict[str, Any] | None = None
    draft: str | None = None
    #: 1 = single stream over every prompt; B > 1 = B chat requests submitted together.
    batches: tuple[int, ...] = (1,)
    #: Answer every prompt once, untimed, after the warm-up: the timed requests then repeat
    #: earlier ones (what suffix decoding's shared tree of outputs is for).
    primed: bool = False


def specrs_jobs(args: argparse.Namespace) -> list[SpecJob]:
    """The spec-rs configurations selected by ``--specrs-configs``."""
    draft = str(args.eagle_draft)
    big = tuple(args.batch_sizes)
    eagle = {"speculative_method": "eagle", "num_speculative_tokens": args.eagle_k}
    ngram = {"speculative_method": "ngram", "num_speculative_tokens": 4}
    suffix = {"speculative_method": "suffix"}
    shipped_suffix = {
        **eagle,
        "adaptive_speculative_widths": "all",
        "enable_suffix_decoding": True,
        "draft_confidence_threshold": SHIPPED_CONFIDENCE_THRESHOLD,
    }
    synthetic = {
        "speculative_method": args.synthetic_drafter,
        "num_speculative_tokens": SYNTHETIC_K,
        "synthetic_acceptance_rate": SYNTHETIC_RATE,
    }
    jobs = {
        "plain-f32": SpecJob("plain-f32", "plain", "f32"),
        "plain": SpecJob("plain", "plain", args.spec_dtype, batches=(1, *big)),
        "plain-q4_0": SpecJob("plain-q4_0", "plain", "q4_0"),
        "eagle": SpecJob("eagle", f"EAGLE-3 (K={args.eagle_k})", args.spec_dtype, eagle, draft),
        # Adaptive widths 1..K and plain steps (the shipped default without prompt lookup),
        # single stream and batched.
        "eagle-batch": SpecJob(
            "eagle-batch",
            f"EAGLE-3 (K={args.eagle_k}, adaptive widths)",
            args.spec_dtype,
            {**eagle, "adaptive_speculative_widths": "all"},
            draft,
            (1, *big),
        ),
        # Prompt lookup in front of the head (enable_prompt_lookup), fixed and adaptive widths;
        # the adaptive one, with drafts cut at the shipped confidence threshold, is the shipped
        # default of the default model.
        "eagle-lookup": SpecJob(
            "eagle-lookup",
            f"prompt lookup + EAGLE-3 (K={args.eagle_k})",
            args.spec_dtype,
            {**eagle, "enable_prompt_lookup": True},
            draft,
        ),
        "eagle-lookup-batch": SpecJob(
            "eagle-lookup-batch",
            f"prompt lookup + EAGLE-3 (K={args.eagle_k}, adaptive widths, confidence cut)",
            args.spec_dtype,
            {
                **eagle,
                "adaptive_speculative_widths": "all",
                "enable_prompt_lookup": True,
                "draft_confidence_threshold": SHIPPED_CONFIDENCE_THRESHOLD,
            },
            draft,
            (1, *big),
        ),
        "ngram": SpecJob("ngram", "n-gram (K=4)", args.spec_dtype, ngram),
        "ngram-batch": SpecJob(
            "ngram-batch",
            "n-gram (K=4, adaptive widths)",
            args.spec_dtype,
            {**ngram, "adaptive_speculative_widths": "all"},
            batches=big,
        ),
        # Suffix decoding on first-time requests: each request's own tree only, since the
        # engine outlives repetitions and batches cycle the chat prompts, so a shared tree
        # would draft them from answers already given. And on requests that repeat earlier
        # ones: every prompt answered once before the timed runs (agent loops, samples).
        "suffix": SpecJob(
            "suffix",
            "suffix decoding (own text only)",
            args.spec_dtype,
            {**suffix, "suffix_decoding_max_cached_requests": 0},
            batches=(1, *big),
        ),
        "suffix-batch": SpecJob(
            "suffix-batch",
            "suffix decoding (own text only, adaptive widths)",
            args.spec_dtype,
            {**suffix, "suffix_decoding_max_cached_requests": 0, "adaptive_speculative_widths": "all"},
            batches=big,
        ),
        "suffix-cached": SpecJob(
            "suffix-cached", "suffix decoding (repeated requests)", args.spec_dtype, suffix, primed=True
        ),
        # The shipped default with suffix decoding in front of the head instead of prompt
        # lookup: first-time requests (own trees only, as above) and repeated ones.
        "eagle-suffix-batch": SpecJob(
            "eagle-suffix-batch",
            f"suffix decoding + EAGLE-3 (K={args.eagle_k}, adaptive, confidence cut; own text only)",
            args.spec_dtype,
            {**shipped_suffix, "suffix_decoding_max_cached_requests": 0},
            draft,
            (1, *big),
        ),
        "eagle-suffix-cached": SpecJob(
            "eagle-suffix-cached",
            f"suffix decoding + EAGLE-3 (K={args.eagle_k}, adaptive, confidence cut; repeated requests)",
            args.spec_dtype,
            shipped_suffix,
            draft,
            primed=True,
        ),
        "synthetic": SpecJob(
            "synthetic",
            f"synthetic {SYNTHETIC_RATE} (K={SYNTHETIC_K}, {args.synthetic_drafter} drafts)",
            args.spec_dtype,
            synthetic,
            draft if args.synthetic_drafter == "eagle" else None,
        ),
    }
    extra = [
        SpecJob(name, _extra_label(name, spec), args.spec_dtype, spec, _draft_for(spec, draft))
        for name, spec in args.specrs_extra or []
    ]
    return [jobs[k] for k in args.specrs_configs] + extra


#: Methods whose draft model the benchmark has no checkpoint for (it has ``--eagle-draft``).
DRAFTS_NOT_AT_HAND = ("mtp", "dflash", "dflash2", "dspark")


def _extra_label(name: str, spec: dict[str, Any]) -> str:
    return f"{name}: {json.dumps(spec, sort_keys=True)}"


def _draft_for(spec: dict[str, Any], draft: str) -> str | None:
    return draft if spec.get("speculative_method") == "eagle" else None


def parse_extra_config(text: str) -> tuple[str, dict[str, Any]]:
    """``NAME=JSON`` of ``--specrs-extra``: a new configuration's key and its
    ``SpeculativeConfig`` fields."""
    name, sep, body = text.partition("=")
    name = name.strip()
    if not sep or not re.fullmatch(r"[a-z0-9][a-z0-9_.-]*", name):
        raise argparse.ArgumentTypeError(
            f"--specrs-extra takes NAME=JSON with a lower-case NAME (letters, digits, - _ .), got {text!r}"
        )
    if name in SPECRS_CONFIGS:
        raise argparse.ArgumentTypeError(
            f"--specrs-extra name {name!r} is a built-in configuration; "
            "pick another name or use --specrs-configs"
        )
    try:
        spec = json.loads(body)
    except json.JSONDecodeError as e:
        message = f"--specrs-extra {name}: the configuration is not JSON ({e})"
        raise argparse.ArgumentTypeError(message) from None
    if not isinstance(spec, dict) or not spec:
        raise argparse.ArgumentTypeError(
            f"--specrs-extra {name}: give a JSON object of SpeculativeConfig fields, e.g. "
            '\'{"speculative_method": "eagle", "num_speculative_tokens": 3}\''
        )
    return name, spec


def specrs_worker(
    jobs: list[SpecJob], items: list[dict[str, Any]], max_tokens: int, repeats: int, batch_rounds: int = 1
) -> dict[str, Any]:
    """Runs inside the subprocess: builds every configuration's engine, warms each up, then
    times the workloads with the configurations interleaved.

    Workloads: every prompt single stream (``LLM.chat`` on one conversation: wall time
    includes template, tokenization and prefill) and every batch size B (B chat conversations,
    the chat prompts cycled, in one ``LLM.chat`` call; aggregate tokens/s = their generated
    tokens over the call's wall time). Each workload is run by every configuration that
    measures it, one after another, the order rotating from workload to workload, so a slow
    stretch of a shared machine falls on all of them alike: ratios between configurations are
    measured side by side, not minutes apart. A configuration whose engine cannot be built
    records its error and the others go on.

    A batch workload is one call of several seconds, so a repetition has one sample of it
    where the prompt sets have dozens of calls; each repetition runs it ``batch_rounds`` times
    (in turns again), each round its own sample (``round`` in the record).
    """
    from spec_rs import LLM, SamplingParams, SpeculativeConfig

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, seed=0)
    engines: dict[str, Any] = {}
    results: dict[str, Any] = {}
    for job in jobs:
        t0 = time.perf_counter()
        # An explicit empty config: the default model would otherwise run its shipped draft.
        spec = SpeculativeConfig(**job.speculative) if job.speculative else SpeculativeConfig()
        try:
            llm = LLM(
                DEFAULT_MODEL,
                job.draft,
                speculative_config=spec,
                dtype=job.dtype,
                max_num_seqs=max(64, *job.batches),
                max_model_len=2048,
            )
            llm.chat(peers.WARMUP_MESSAGES, params.model_copy(update={"max_tokens": min(8, max_tokens)}))
            if job.primed:
                for item in items:
                    llm.chat(item["messages"], params)
        except Exception as e:  # one configuration failing must not lose the others
            results[job.key] = {"key": job.key, "error": f"{type(e).__name__}: {e}"}
            continue
        engines[job.key] = llm
        results[job.key] = {"key": job.key, "load_seconds": time.perf_counter() - t0, "runs": []}
    live = [job for job in jobs if job.key in engines]
    chat = [it for it in items if it["set"] == "chat"]
    workloads: list[tuple[int, list[dict[str, Any]]]] = [(1, [item]) for item in items]
    batch_sizes = sorted({b for job in live for b in job.batches if b > 1})
    workloads += [(b, [chat[i % len(chat)] for i in range(b)]) for b in batch_sizes]
    turn = 0
    for rep in range(repeats):
        for batch, convs in workloads:
            takers = [job for job in live if batch in job.batches]
            for round_ in range(batch_rounds if batch > 1 else 1):
                if not takers:
                    break
                turn += 1
                for job in takers[turn % len(takers) :] + takers[: turn % len(takers)]:
                    # Each call computes its prompts in full, as in records before prefix
                    # caching and as the peers here do for a prompt they have not just seen:
                    # repetitions of a prompt would otherwise skip its prefill.
                    # benches/e2e/prefix_cache_bench.py measures what caching saves.
                    engines[job.key].reset_prefix_cache()
                    t = time.perf_counter()
                    outs = engines[job.key].chat([c["messages"] for c in convs], params)
                    record = _record(rep, convs[0]["set"], batch, outs, time.perf_counter() - t)
                    results[job.key]["runs"].append({**record, "round": round_})
    plain_types = (str, int, float, bool, type(None), list, dict)
    for key, llm in engines.items():
        results[key]["info"] = {k: v for k, v in llm.info.items() if isinstance(v, plain_types)}
    return results


def _record(rep: int, prompt_set: str, batch: int, outs: list[Any], seconds: float) -> dict[str, Any]:
    """One timed call: tokens, seconds and the speculative metrics summed over its requests."""
    metrics = [o.metrics for o in outs if o.metrics is not None]
    summed = None
    if metrics:
        width = max(len(m.accepted_per_position) for m in metrics)
        summed = {
            "num_drafts": sum(m.num_drafts for m in metrics),
            "num_draft_tokens": sum(m.num_draft_tokens for m in metrics),
            "num_accepted_tokens": sum(m.num_accepted_tokens for m in metrics),
            "accepted_per_position": [
                sum(m.accepted_per_position[i] for m in metrics if i < len(m.accepted_per_position))
                for i in range(width)
            ],
        }
    return {
        "repeat": rep,
        "set": prompt_set,
        "batch": batch,
        "requests": len(outs),
        "tokens": sum(len(o.token_ids) for o in outs),
        "seconds": seconds,
        "metrics": summed,
        "errors": [o.error for o in outs if o.error],
    }


def specrs_worker_command(
    jobs: list[SpecJob], args: argparse.Namespace, prompts_file: Path, out: Path
) -> list[str]:
    """The subprocess that measures the spec-rs configurations, interleaved."""
    return [
        *(sys.executable, str(Path(__file__).resolve()), "_specrs-worker"),
        *("--jobs", json.dumps([asdict(job) for job in jobs])),
        *("--prompts", str(prompts_file), "--out", str(out)),
        *("--max-tokens", str(args.max_tokens), "--repeats", str(args.repeats)),
        *("--batch-rounds", str(args.batch_rounds)),
    ]


def run_specrs(
    args: argparse.Namespace, items: list[dict[str, Any]], prompts_file: Path, work: Path
) -> tuple[list[Row], dict[str, Any]]:
    """Runs every selected spec-rs configuration in one subprocess, side by side."""
    rows: list[Row] = []
    raw: dict[str, Any] = {}
    sets = _sets(items)

    def failed(job: SpecJob, reason: str) -> list[Row]:
        job_sets = sets if 1 in job.batches else ["chat"]
        return error_rows(job.key, "spec-rs", job.method, job.dtype, job_sets, reason, job.batches)

    jobs = []
    for job in specrs_jobs(args):
        if job.draft is not None and not Path(job.draft).is_dir():
            rows += failed(job, f"no draft: {job.draft} does not exist (--eagle-draft)")
        else:
            jobs.append(job)
            print(f"spec-rs {job.key}: {job.method}, dtype {job.dtype}, batches {job.batches}", flush=True)
    if not jobs:
        return rows, raw
    out = work / "specrs.json"
    # The configurations share one subprocess, so its limit is theirs together.
    argv = specrs_worker_command(jobs, args, prompts_file, out)
    error = _run(argv, args.job_timeout * len(jobs), work / "specrs.log")
    if error:
        return rows + [r for job in jobs for r in failed(job, error)], raw
    results = json.loads(out.read_text())
    for job in jobs:
        result = results[job.key]
        if "error" in result:
            rows += failed(job, result["error"])
            continue
        raw[job.key] = result
        rows += rows_from_runs(job.key, "spec-rs", job.method, job.dtype, result["runs"], sets)
    return rows, raw


def _run(argv: list[str], timeout: float, log: Path, env: dict[str, str] | None = None) -> str | None:
    """Runs a measurement subprocess; returns None, or the reason it failed (log tail)."""
    with log.open("w") as f:
        try:
            proc = subprocess.run(
                argv, stdout=f, stderr=subprocess.STDOUT, timeout=timeout, env={**os.environ, **(env or {})}
            )
        except subprocess.TimeoutExpired:
            return f"timed out after {timeout:.0f} s"
    if proc.returncode != 0:
        tail = [ln for ln in log.read_text(errors="replace").strip().splitlines() if ln.strip()][-1:]
        return f"exit {proc.returncode}: {tail[0][:240] if tail else '(no output)'}"
    return None


def _sets(items: list[dict[str, Any]]) -> list[str]:
    return list(dict.fromkeys(it["set"] for it in items))


# --------------------------------------------------------------------------------------------
# Peers
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PeerJob:
    key: str
    env: str
    system: str
    method: str
    weights: str
    worker_system: str
    mode: str


PEER_JOBS = {
    "llama": [
        PeerJob("llama", "llama", "llama.cpp (llama-cpp-python)", "plain", "gguf", "llama", "plain"),
        PeerJob(
            "llama-lookup",
            "llama",
            "llama.cpp (llama-cpp-python)",
            "prompt lookup (4)",
            "gguf",
            "llama",
            "lookup",
        ),
    ],
    "mistralrs": [PeerJob("mistralrs", "mistralrs", "mistral.rs", "plain", "f32", "mistralrs", "plain")],
    "hf": [
        PeerJob("hf", "hf", "HF transformers", "plain", "f32", "hf", "plain"),
        PeerJob("hf-lookup", "hf", "HF transformers", "prompt_lookup_num_tokens=4", "f32", "hf", "lookup"),
        PeerJob("hf-assisted", "hf", "HF transformers", "assisted generation", "f32", "hf", "assisted"),
    ],
}


NO_ASSISTANT = (
    "not run: no smaller assistant with this tokenizer is available offline (pass --hf-assistant DIR)"
)


def gguf_label(gguf_path: str) -> str:
    """ "GGUF Q4_1" for a file named like ``*.Q4_1.gguf``."""
    m = re.search(r"\.((?:I?Q\d\w*)|F16|BF16|F32)\.gguf$", gguf_path, re.I)
    return f"GGUF {m.group(1)}" if m else "GGUF"


def _short(path: Path) -> str:
    return str(path.relative_to(REPO_ROOT)) if path.is_relative_to(REPO_ROOT) else str(path)


def run_peers(
    args: argparse.Namespace,
    gguf_path: str,
    items: list[dict[str, Any]],
    prompts_file: Path,
    work: Path,
    notes: list[str],
) -> tuple[list[Row], dict[str, Any]]:
    """Installs (or reuses) each selected peer and measures it on the same prompts."""
    rows: list[Row] = []
    raw: dict[str, Any] = {}
    sets = _sets(items)
    specs = peers.env_specs(args.threads)
    selected = [s for s in ("llama", "mistralrs", "hf") if s in args.systems]
    hf_dir: Path | None = None
    hf_error: str | None = None
    if {"mistralrs", "hf"} & set(selected):
        tools = peers.ensure_env(specs["tools"])
        hf_dir, hf_error = peers.ensure_hf_f32(tools, gguf_path)
        if hf_dir is not None:
            conv = json.loads((hf_dir / "conversion.json").read_text())
            notes.append(
                f"f32 folder for mistral.rs / transformers: `{_short(hf_dir)}` (GGUF dequantized with "
                f"`gguf`, rope_theta {conv['rope_theta']:g}; tokenizer check: {conv['tokenizer_check']})"
            )
    for name in selected:
        status = peers.ensure_env(specs[name])
        for job in PEER_JOBS[name]:
            weights = gguf_label(gguf_path) if job.weights == "gguf" else job.weights

            def failed(reason: str, job: PeerJob = job, weights: str = weights) -> list[Row]:
                return error_rows(job.key, job.system, job.method, weights, sets, reason)

            if not status.ok:
                rows += failed(status.error or "not installed")
                continue
            if job.worker_system != "llama" and hf_dir is None:
                rows += failed(hf_error or "no f32 folder")
                continue
            if job.mode == "assisted" and not args.hf_assistant:
                rows += failed(NO_ASSISTANT)
                continue
            out = work / f"peer-{job.key}.json"
            argv = peer_worker_command(job, args, status.python, gguf_path, hf_dir, prompts_file, out)
            print(f"{job.key}: {job.system} {job.method}", flush=True)
            error = _run(argv, args.job_timeout, work / f"peer-{job.key}.log")
            if error:
                rows += failed(error)
                continue
            result = json.loads(out.read_text())
            raw[job.key] = result
            versions = ", ".join(f"{k} {v}" for k, v in result.get("versions", {}).items())
            rows += rows_from_runs(
                job.key, f"{job.system} ({versions})", job.method, weights, result["runs"], sets
            )
    return rows, raw


def peer_worker_command(
    job: PeerJob,
    args: argparse.Namespace,
    python: Path | None,
    gguf_path: str,
    hf_dir: Path | None,
    prompts_file: Path,
    out: Path,
) -> list[str]:
    """The command that measures one peer job inside its environment."""
    return peers.worker_command(
        python or peers.venv_python(job.env),
        job.worker_system,
        prompts=prompts_file,
        out=out,
        max_tokens=args.max_tokens,
        repeats=args.repeats,
        threads=args.threads,
        mode=job.mode,
        gguf=gguf_path if job.worker_system == "llama" else None,
        model_dir=hf_dir if job.worker_system != "llama" else None,
        assistant=args.hf_assistant,
    )


def _check_parses(parser: argparse.ArgumentParser, argv: list[str], what: str) -> list[str]:
    """[] if ``parser`` accepts ``argv`` (the command a worker would receive), else the problem."""
    try:
        parser.parse_args(argv)
    except SystemExit:
        return [f"{what}: the worker rejects its command line"]
    return []


def dry_run_peers(args: argparse.Namespace, gguf_path: str, prompts_file: Path, work: Path) -> list[str]:
    """Prints every install, conversion and worker command the peers would run, and checks
    what those commands need here (interpreter, compilers, disk, model file)."""
    problems = []
    specs = peers.env_specs(args.threads)
    selected = [s for s in ("llama", "mistralrs", "hf") if s in args.systems]
    if {"mistralrs", "hf"} & set(selected):
        peers.ensure_env(specs["tools"], dry_run=True)
        peers.ensure_hf_f32(peers.EnvStatus("tools"), gguf_path, dry_run=True)
    for name in selected:
        peers.ensure_env(specs[name], dry_run=True)
        for job in PEER_JOBS[name]:
            out = work / f"peer-{job.key}.json"
            argv = peer_worker_command(job, args, None, gguf_path, peers.HF_F32_DIR, prompts_file, out)
            print(f"[dry-run] {job.key}: {shlex.join(argv)}")
            problems += _check_parses(peers.build_parser(), argv[2:], job.key)
    if "llama" in selected:
        for tool in ("cc", "c++"):
            if shutil.which(tool) is None:
                problems.append(f"llama-cpp-python's source build needs `{tool}` on PATH")
    if not Path(gguf_path).is_file():
        problems.append(f"model file missing: {gguf_path}")
    free = shutil.disk_usage(REPO_ROOT).free / 1e9
    if free < 12:
        problems.append(f"only {free:.0f} GB free; torch from PyPI may need ~8 GB")
    return problems


# --------------------------------------------------------------------------------------------
# Step costs (decode_speed)
# --------------------------------------------------------------------------------------------

DECODE_SPEED_RE = re.compile(
    r"\((\d+) MB of weights\).*?prefill (\d+) x (\d+) tokens: ([\d.]+) tok/s; "
    r"batch (\d+) x (\d+) tokens/step: ([\d.]+) steps/s, ([\d.]+) rows/s",
    re.S,
)


def decode_speed_binary() -> Path:
    target = Path(os.environ.get("CARGO_TARGET_DIR", REPO_ROOT / "target"))
    return target / "release" / "examples" / "decode_speed"


def build_decode_speed(dry_run: bool) -> str | None:
    """``cargo build --release -p specrs-models --example decode_speed``; None or the error."""
    argv = ["cargo", "build", "--release", "-p", "specrs-models", "--example", "decode_speed"]
    if dry_run:
        print(f"[dry-run] steps: {shlex.join(argv)}")
        return None if shutil.which("cargo") else "cargo not on PATH"
    print("building decode_speed", flush=True)
    proc = subprocess.run(argv, cwd=REPO_ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        last = proc.stderr.strip().splitlines()[-1:] or [f"exit {proc.returncode}"]
        return f"cargo build failed: {last[0]}"
    return None


@dataclass
class StepCost:
    """Median decode_speed measurement of one (dtype, batch, tokens per step)."""

    dtype: str
    batch: int
    per_step: int
    weight_mb: int
    steps_per_s: float
    rows_per_s: float
    prefill_tok_s: float
    samples: list[float]


def measure_step_costs(args: argparse.Namespace) -> tuple[list[StepCost], list[str]]:
    """decode_speed for f32 and the default dtype: 1 and K+1 tokens per step at batch 1,
    and 1 token per step at each batch size; median of ``--repeats`` runs each."""
    errors: list[str] = []
    binary = decode_speed_binary()
    combos = []
    for dtype in ("f32", args.spec_dtype):
        combos += [(dtype, 1, 1), (dtype, 1, SYNTHETIC_K + 1)] + [(dtype, b, 1) for b in args.batch_sizes]
    costs = []
    for dtype, batch, per_step in combos:
        argv = [str(binary), DEFAULT_MODEL, dtype, str(args.step_tokens), str(batch), str(per_step)]
        if args.dry_run:
            print(f"[dry-run] steps: {shlex.join(argv)}")
            continue
        samples: list[tuple[int, float, float, float]] = []
        for _ in range(args.repeats):
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=args.job_timeout)
            m = DECODE_SPEED_RE.search(proc.stdout)
            if proc.returncode != 0 or not m:
                output = (proc.stderr or proc.stdout).strip()[-200:]
                errors.append(f"decode_speed {dtype} b{batch} x{per_step}: {output}")
                break
            samples.append((int(m.group(1)), float(m.group(4)), float(m.group(7)), float(m.group(8))))
        if samples:
            steps = [s[2] for s in samples]
            costs.append(
                StepCost(
                    dtype,
                    batch,
                    per_step,
                    samples[0][0],
                    statistics.median(steps),
                    statistics.median(s[3] for s in samples),
                    statistics.median(s[1] for s in samples),
                    steps,
                )
            )
    return costs, errors


def _cost(costs: list[StepCost], dtype: str, batch: int, per_step: int) -> StepCost | None:
    return next((c for c in costs if c.dtype == dtype and c.batch == batch and c.per_step == per_step), None)


# --------------------------------------------------------------------------------------------
# Analysis: ratios, bounds and goals
# --------------------------------------------------------------------------------------------


def find_row(rows: list[Row], key: str, prompt_set: str = "chat", batch: int = 1) -> Row | None:
    return next(
        (r for r in rows if r.key == key and r.prompt_set == prompt_set and r.batch == batch and r.median),
        None,
    )


#: The row each row's speedup is measured against ("its own plain decoding").
OWN_PLAIN = {
    "eagle": "plain",
    "eagle-batch": "plain",
    "eagle-lookup": "plain",
    "eagle-lookup-batch": "plain",
    "ngram": "plain",
    "ngram-batch": "plain",
    "suffix": "plain",
    "suffix-batch": "plain",
    "suffix-cached": "plain",
    "eagle-suffix-batch": "plain",
    "eagle-suffix-cached": "plain",
    "synthetic": "plain",
    "llama-lookup": "llama",
    "hf-lookup": "hf",
    "hf-assisted": "hf",
}


def own_plain_of(row: Row) -> str | None:
    """The key of the row ``row`` is measured against: spec-rs's plain decoding for every
    spec-rs speculative configuration, ``--specrs-extra`` ones included."""
    if row.key in OWN_PLAIN:
        return OWN_PLAIN[row.key]
    if row.system == "spec-rs" and row.key not in SPECRS_CONFIGS:
        return "plain"
    return None


def ratio(a: Row | None, b: Row | None) -> float | None:
    """`a`'s speed over `b`'s. Two rows whose repetitions ran side by side (two spec-rs
    configurations, interleaved prompt by prompt in one process, see ``specrs_worker``; or any
    two systems of a run that took turns repetition by repetition, see ``run_interleaved``):
    the median of their per-repetition ratios, so a slow stretch of the machine that hit both
    cancels out. Otherwise the ratio of the medians."""
    if a is None or b is None or not a.median or not b.median:
        return None
    side_by_side = a.system == b.system == "spec-rs" or (a.interleaved and b.interleaved)
    if side_by_side and len(a.tps) == len(b.tps):
        return statistics.median(x / y for x, y in zip(a.tps, b.tps, strict=True))
    return a.median / b.median


def synthetic_bound(rows: list[Row], costs: list[StepCost], spec_dtype: str) -> dict[str, Any] | None:
    """Issue 5: the speedup synthetic acceptance can reach given the measured step costs,
    (1 + K·rate) x t_decode / (t_verify + t_draft), against the measured speedup.

    t_decode and t_verify are decode_speed's batch-1 step times at 1 and K+1 tokens per step
    in the default dtype. t_draft is the drafter's time per step; for n-gram drafts it is a
    host-side suffix lookup that decode_speed does not measure, counted as 0 (so the bound
    is an upper bound). Because n-gram only drafts where the suffix recurs, a second bound
    uses the measured share of decode steps that verified drafts.
    """
    syn, plain = find_row(rows, "synthetic"), find_row(rows, "plain")
    dec, ver = _cost(costs, spec_dtype, 1, 1), _cost(costs, spec_dtype, 1, SYNTHETIC_K + 1)
    if not (syn and plain and dec and ver):
        return None
    t_decode, t_verify = 1 / dec.steps_per_s, 1 / ver.steps_per_s
    bound = (1 + SYNTHETIC_K * SYNTHETIC_RATE) * t_decode / t_verify
    measured = syn.median / plain.median  # type: ignore[operator]
    result = {
        "t_decode_ms": t_decode * 1e3,
        "t_verify_ms": t_verify * 1e3,
        "bound": bound,
        "measured": measured,
    }
    decode_tokens = syn.generated - syn.requests
    plain_steps = decode_tokens - syn.accepted - syn.drafts
    if decode_tokens > 0 and syn.drafts:
        result["bound_with_coverage"] = (
            decode_tokens * t_decode / (syn.drafts * t_verify + plain_steps * t_decode)
        )
        result["draft_step_fraction"] = syn.drafts / (syn.drafts + plain_steps)
        result["measured_rate"] = syn.accepted / (syn.drafts * SYNTHETIC_K)
    return result


@dataclass
class Goal:
    issue: str
    text: str
    measured: str
    met: bool | None


def goals(
    rows: list[Row],
    costs: list[StepCost],
    facts: dict[str, Any],
    bound: dict[str, Any] | None,
    spec_dtype: str,
) -> list[Goal]:
    """The issues' targets, each evaluated from this run's numbers (None = not measured)."""
    out: list[Goal] = []
    f32 = _cost(costs, "f32", 1, 1)
    if f32:
        roof = facts["bandwidth_gbs"] * 1e3 / f32.weight_mb
        pct = f32.steps_per_s / roof
        out.append(
            Goal(
                "3",
                "f32 decode ≥ 85% of the memory-bandwidth roofline (decode_speed)",
                f"{f32.steps_per_s:.1f} steps/s = {pct:.0%} of {roof:.1f}",
                pct >= 0.85,
            )
        )
    else:
        out.append(Goal("3", "f32 decode ≥ 85% of the memory-bandwidth roofline", "not measured", None))
    e2e_f32 = find_row(rows, "plain-f32")
    if e2e_f32 and f32:
        roof = facts["bandwidth_gbs"] * 1e3 / f32.weight_mb
        out.append(
            Goal(
                "3",
                "f32 decode ≥ 85% of the roofline, end to end (API, incl. prefill)",
                f"{e2e_f32.median:.1f} tok/s = {e2e_f32.median / roof:.0%}",
                e2e_f32.median / roof >= 0.85,
            )
        )  # type: ignore[operator]
    for key, name in (("mistralrs", "mistral.rs"), ("hf", "HF transformers")):
        r = ratio(e2e_f32, find_row(rows, key))
        out.append(
            Goal("3", f"f32 side by side: spec-rs plain f32 / {name} f32 (no target)", _fmt_ratio(r), None)
        )
    llama = find_row(rows, "llama")
    for key in ("plain", "plain-q4_0"):
        r = ratio(find_row(rows, key), llama)
        label = "default dtype" if key == "plain" else "q4_0"
        out.append(
            Goal(
                "3",
                f"quantized ({label}) decode ≥ llama.cpp plain",
                _fmt_ratio(r),
                None if r is None else r >= 1.0,
            )
        )
    if bound:
        share = bound["measured"] / bound["bound"]
        out.append(
            Goal(
                "5",
                "synthetic 0.7 (K=3) speedup within 15% of the step-cost bound",
                f"{bound['measured']:.2f}x vs {bound['bound']:.2f}x ({share:.0%})",
                abs(share - 1) <= 0.15,
            )
        )
    else:
        out.append(
            Goal("5", "synthetic 0.7 (K=3) speedup within 15% of the step-cost bound", "not measured", None)
        )
    eagle_rows = (
        ("eagle", "EAGLE-3 K=3"),
        ("eagle-batch", "EAGLE-3 adaptive widths"),
        ("eagle-lookup-batch", "prompt lookup + EAGLE-3 adaptive widths (shipped default)"),
    )
    for key, label in eagle_rows:
        own = ratio(find_row(rows, key), find_row(rows, "plain"))
        out.append(
            Goal(
                "7",
                f"{label} single stream ≥ 1.8x spec-rs plain",
                _fmt_ratio(own),
                None if own is None else own >= 1.8,
            )
        )
        vs_llama = ratio(find_row(rows, key), llama)
        out.append(
            Goal(
                "7",
                f"{label} single stream ≥ 1.5x llama.cpp plain",
                _fmt_ratio(vs_llama),
                None if vs_llama is None else vs_llama >= 1.5,
            )
        )
    for key, label in eagle_rows[1:]:
        big = max((r.batch for r in rows if r.key == key), default=None)
        at_big = ratio(find_row(rows, key, batch=big), find_row(rows, "plain", batch=big)) if big else None
        out.append(
            Goal(
                "7",
                f"{label} never slower than plain at batch {big or 32}",
                _fmt_ratio(at_big),
                None if at_big is None else at_big >= 1.0,
            )
        )
    return out


def _fmt_ratio(r: float | None) -> str:
    return "not measured" if r is None else f"{r:.2f}x"


# --------------------------------------------------------------------------------------------
# Markdown
# --------------------------------------------------------------------------------------------


def _num(x: float | None, fmt: str = ".1f") -> str:
    return "—" if x is None else format(x, fmt)


def _ratio_cell(x: float | None) -> str:
    return "—" if x is None else f"{x:.2f}x"


def _range(r: Row) -> str:
    return f"{min(r.tps):.1f}-{max(r.tps):.1f}" if r.tps else "—"


def _positions(p: list[float] | None) -> str:
    return "—" if not p else " / ".join(f"{x:.2f}" for x in p)


def md_row(*cells: object) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def md_header(*columns: str, right_from: int | None = None) -> list[str]:
    """A header row and its separator; columns from ``right_from`` on (numbers) are right-aligned."""
    first_right = len(columns) if right_from is None else right_from
    seps = ["---" if i < first_right else "---:" for i in range(len(columns))]
    return [md_row(*columns), md_row(*seps)]


def single_stream_table(rows: list[Row], prompt_set: str) -> list[str]:
    """Single-stream rows of one prompt set, with speedups over the system's own plain
    decoding and over llama.cpp's plain decoding."""
    llama = find_row(rows, "llama", prompt_set)
    lines = md_header(
        "system",
        "method",
        "weights",
        "tok/s (median)",
        "range",
        "mean tokens",
        "acceptance length",
        "acceptance per position",
        "x own plain",
        "x llama.cpp plain",
        right_from=3,
    )
    for r in rows:
        if r.prompt_set != prompt_set or r.batch != 1:
            continue
        if not r.median:
            lines.append(md_row(r.system, r.method, r.weights, "—", r.error or "no data", "", "", "", "", ""))
            continue
        own_key = own_plain_of(r)
        own = ratio(r, find_row(rows, own_key, prompt_set)) if own_key else None
        lines.append(
            md_row(
                r.system,
                r.method,
                r.weights,
                _num(r.median),
                _range(r),
                _num(r.mean_tokens),
                _num(r.acceptance_length, ".2f"),
                _positions(r.per_position),
                _ratio_cell(own),
                _ratio_cell(ratio(r, llama)),
            )
            + (f" ⚠ {r.error}" if r.error else "")
        )
    return lines


def batch_table(rows: list[Row]) -> list[str]:
    """spec-rs aggregate throughput by batch size, and the speedup over plain at that size."""
    lines = md_header(
        "method",
        "weights",
        "batch",
        "aggregate tok/s (median)",
        "range",
        "acceptance length",
        "x plain at this batch",
        right_from=2,
    )
    batched = sorted({r.batch for r in rows if r.system == "spec-rs" and r.batch > 1})
    for b in [1, *batched]:
        for r in rows:
            if r.system != "spec-rs" or r.batch != b or r.prompt_set != "chat":
                continue
            if b == 1 and r.key not in (
                "plain",
                "eagle",
                "eagle-batch",
                "eagle-lookup-batch",
                "ngram",
                "suffix",
                "suffix-cached",
                "eagle-suffix-batch",
                "eagle-suffix-cached",
            ):
                continue
            if not r.median:
                lines.append(md_row(r.method, r.weights, b, "—", r.error or "no data", "", ""))
                continue
            base = find_row(rows, "plain", "chat", b)
            lines.append(
                md_row(
                    r.method,
                    r.weights,
                    b,
                    _num(r.median),
                    _range(r),
                    _num(r.acceptance_length, ".2f"),
                    _ratio_cell(ratio(r, base)),
                )
            )
    return lines


def step_cost_table(costs: list[StepCost], facts: dict[str, Any], batch_sizes: Sequence[int]) -> list[str]:
    """decode_speed per weight dtype, with the bandwidth roofline and the share reached."""
    k1 = SYNTHETIC_K + 1
    lines = md_header(
        "weights",
        "MB",
        "decode steps/s (1 tok/step)",
        f"verify steps/s ({k1} tok/step)",
        "prefill tok/s (1x40)",
        f"prefill tok/s ({max(batch_sizes, default=1)}x40)",
        *(f"batch {b} tok/s" for b in batch_sizes),
        "roofline tok/s",
        "% of roofline",
        right_from=1,
    )
    for dtype in dict.fromkeys(c.dtype for c in costs):
        one, ver = _cost(costs, dtype, 1, 1), _cost(costs, dtype, 1, k1)
        if one is None:
            continue
        roof = facts["bandwidth_gbs"] * 1e3 / one.weight_mb
        batched = [_cost(costs, dtype, b, 1) for b in batch_sizes]
        lines.append(
            md_row(
                dtype,
                one.weight_mb,
                f"{one.steps_per_s:.1f}",
                _num(ver.steps_per_s if ver else None),
                f"{one.prefill_tok_s:.0f}",
                _num(batched[-1].prefill_tok_s if batched and batched[-1] else None, ".0f"),
                *(_num(c.rows_per_s if c else None) for c in batched),
                f"{roof:.1f}",
                f"{one.steps_per_s / roof:.0%}",
            )
        )
    return lines


def bound_section(bound: dict[str, Any], args: argparse.Namespace) -> list[str]:
    """Issue 5: measured synthetic speedup against the bound the step costs allow."""
    formula = "(1 + K·rate) x t_decode / (t_verify + t_draft)"
    return [
        "### Synthetic acceptance vs step costs (issue 5)",
        "",
        f"Bound = {formula} with K = {SYNTHETIC_K}, rate = {SYNTHETIC_RATE}, "
        f"t_decode = {bound['t_decode_ms']:.2f} ms, t_verify = {bound['t_verify_ms']:.2f} ms "
        f"(decode_speed, `{args.spec_dtype}`); t_draft = 0 for {args.synthetic_drafter} drafts "
        "(not measured separately, so the bound is an upper bound).",
        "",
        *md_header(
            "measured speedup (synthetic / plain, chat)",
            "bound",
            "measured / bound",
            "steps that verified drafts",
            "bound at that share",
            "measured per-draft acceptance",
            right_from=0,
        ),
        md_row(
            _ratio_cell(bound["measured"]),
            _ratio_cell(bound["bound"]),
            f"{bound['measured'] / bound['bound']:.0%}",
            _num(bound.get("draft_step_fraction"), ".0%"),
            _ratio_cell(bound.get("bound_with_coverage")),
            _num(bound.get("measured_rate"), ".2f"),
        ),
        "",
    ]


def header_lines(ctx: dict[str, Any]) -> list[str]:
    """Title, command line, machine facts and how the work was defined."""
    args, facts = ctx["args"], ctx["facts"]
    load_end = os.getloadavg()[0]
    steal = steal_share(facts["cpu_times_start"], cpu_times())
    stolen = "steal time unknown" if steal is None else f"{steal:.0%} of CPU time stolen by the hypervisor"
    machine = (
        f"Machine: {facts['nproc']} cores ({facts['cpu']}; {facts['cpu_flags']}), "
        f"{facts['mem_gib']:.0f} GiB; memory read {facts['bandwidth_gbs']:.1f} GB/s (numpy sum over "
        f"256 MB, best of 5); f32 SGEMM {facts['gemm_gflops']:.0f} GFLOP/s (numpy 2048³, best of 3); "
        f"load average {facts['loadavg_start'][0]:.1f} at start, {load_end:.1f} at end; "
        f"{stolen} over the run (/proc/stat); "
        f"Linux {facts['kernel']}, Python {facts['python']}; spec-rs {facts['commit']}."
    )
    work = (
        f"Work: {ctx['counts']['chat']} chat prompts ({ctx['prompts_note']}) and "
        f"{ctx['counts']['quote']} quote-back prompts (repeat / edit text given in the prompt), each "
        f"wrapped in the model's chat template; greedy, at most {args.max_tokens} new tokens; single "
        "stream = one request at a time; tokens/s = generated tokens / wall time including prefill, "
        f"summed over the prompt set; median of {args.repeats} repetition(s) (spec-rs batch rows: "
        f"{args.batch_rounds} timed calls per repetition, each a sample), range = min-max; one "
        "untimed warm-up generation per system. The spec-rs configurations run interleaved in one "
        "process (each prompt and batch by every configuration in turn), so their ratios to each "
        "other (x own plain, x plain at this batch) are medians of per-repetition ratios measured "
        "side by side; "
        + (
            "the peers take turns with them, repetition by repetition (each repetition runs spec-rs, "
            "then every peer), so ratios to a peer are medians of per-repetition ratios too. "
            if args.interleave and args.repeats > 1 and {"llama", "mistralrs", "hf"} & set(args.systems)
            else "peers run before or after them (ratios of medians). "
        )
        + f"Model: `{ctx['gguf']}`. spec-rs speculative rows use "
        f"dtype `{args.spec_dtype}`; EAGLE-3 draft: `{args.eagle_draft}`."
    )
    title = f"## {ctx['stamp']} — end-to-end benchmark{' (quick smoke run)' if args.quick else ''}"
    return [title, "", f"Command: `{ctx['command']}`", "", machine, "", work, ""]


def render_markdown(ctx: dict[str, Any]) -> str:
    """The dated section: command, machine, work, tables, step costs, goals, notes, plots."""
    args, rows, costs = ctx["args"], ctx["rows"], ctx["costs"]
    lines = header_lines(ctx)
    titles = {"chat": "Single stream — chat prompts", "quote": "Single stream — quote-back prompts"}
    for s in ctx["sets"]:
        if any(r.prompt_set == s and r.batch == 1 for r in rows):
            lines += [f"### {titles.get(s, s)}", "", *single_stream_table(rows, s), ""]
    if any(r.batch > 1 for r in rows):
        lines += [
            "### Batched decoding (spec-rs, chat prompts cycled)",
            "",
            "B requests submitted together in one `LLM.chat` call; aggregate tok/s = their generated "
            "tokens / the call's wall time. Batch 1 = the single-stream rows.",
            "",
            *batch_table(rows),
            "",
        ]
    if costs or ctx["step_errors"]:
        lines += [
            "### Step costs (`decode_speed`)",
            "",
            f"Raw forward passes, no engine: {args.step_tokens} steps after a 40-token prefill per "
            f"row, median of {args.repeats}; roofline = measured bandwidth / weight bytes (every "
            "weight read once per step).",
            "",
            *step_cost_table(costs, ctx["facts"], args.batch_sizes),
            "",
            *[f"- decode_speed failed: {e}" for e in ctx["step_errors"]],
        ]
    if ctx["bound"]:
        lines += bound_section(ctx["bound"], args)
    lines += ["### Goals (from this run)", "", *md_header("issue", "goal", "measured", "met")]
    for g in ctx["goals"]:
        lines.append(
            md_row(g.issue, g.text, g.measured, "—" if g.met is None else ("yes" if g.met else "no"))
        )
    lines.append("")
    if ctx["notes"]:
        lines += ["Notes:", "", *[f"- {n}" for n in ctx["notes"]], ""]
    out_dir = ctx["output"].parent
    lines += [f"![{name}]({os.path.relpath(path, out_dir)})" for name, path in ctx["plots"].items()]
    return "\n".join(lines).rstrip() + "\n"


def append_section(path: Path, section: str) -> None:
    """Appends ``section``, creating the file with a short preamble if needed."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(
            "# Benchmarks\n\nMeasured, dated sections appended by `benches/e2e/run_benchmarks.py` and "
            "`benches/e2e/server_bench.py`; each section says how it was measured.\n"
        )
    with path.open("a") as f:
        f.write("\n" + section)


# --------------------------------------------------------------------------------------------
# Plots (run with the tools environment's Python, which has matplotlib)
# --------------------------------------------------------------------------------------------


def make_plots(data: dict[str, Any], out_dir: Path, prefix: str) -> dict[str, str]:
    """tokens/s per system, acceptance per position, speedup vs batch size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [Row(**r) for r in data["rows"]]
    out_dir.mkdir(parents=True, exist_ok=True)
    paths: dict[str, str] = {}

    single = [r for r in rows if r.batch == 1 and r.prompt_set == "chat" and r.median]
    fig, ax = plt.subplots(figsize=(9, 0.45 * max(len(single), 2) + 1.5))
    labels = [f"{r.system.split(' (')[0]}: {r.method} [{r.weights}]" for r in single]
    colors = ["tab:blue" if r.system == "spec-rs" else "tab:gray" for r in single]
    med = [r.median or 0 for r in single]
    err = [
        [m - min(r.tps) for m, r in zip(med, single, strict=True)],
        [max(r.tps) - m for m, r in zip(med, single, strict=True)],
    ]
    ax.barh(labels, med, xerr=err, color=colors)
    ax.invert_yaxis()
    ax.set_xlabel("tokens/s (median, single stream, chat prompts)")
    ax.set_title(f"Generated tokens/s per system — {data['stamp']}")
    for i, m in enumerate(med):
        ax.text(m, i, f" {m:.1f}", va="center")
    paths["tokens/s per system"] = _save(fig, out_dir / f"{prefix}-tokens-per-s.png")

    fig, ax = plt.subplots(figsize=(7, 4))
    spec = [r for r in rows if r.system == "spec-rs" and r.batch == 1 and r.per_position]
    for r in spec:
        xs = list(range(1, len(r.per_position or []) + 1))
        ax.plot(
            xs,
            r.per_position,
            marker="o",
            linestyle="-" if r.prompt_set == "chat" else "--",
            label=f"{r.method} ({r.prompt_set})",
        )
    width = max((len(r.per_position or []) for r in spec), default=1)
    ax.set_xticks(range(1, width + 1))
    ax.set_xlabel("draft position")
    ax.set_ylabel("share of verify steps accepting it")
    ax.set_ylim(0, 1)
    ax.set_title("Acceptance per position (spec-rs, single stream)")
    if spec:
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "no speculative rows measured", ha="center", transform=ax.transAxes)
    paths["acceptance per position"] = _save(fig, out_dir / f"{prefix}-acceptance-per-position.png")

    fig, ax = plt.subplots(figsize=(7, 4))
    plotted = False
    for single_key, batch_key in (
        ("eagle", "eagle-batch"),
        ("eagle-lookup", "eagle-lookup-batch"),
        ("ngram", "ngram-batch"),
    ):
        pts = []
        # The adaptive configuration at every batch it ran; the fixed-width single-stream row
        # stands in at batch 1 only where the adaptive one did not run there.
        single_stand_in = find_row(rows, batch_key) is None
        for r in rows:
            if (
                r.prompt_set == "chat"
                and r.median
                and ((r.key == single_key and r.batch == 1 and single_stand_in) or r.key == batch_key)
            ):
                base = find_row(rows, "plain", "chat", r.batch)
                if base and base.median:
                    pts.append((r.batch, r.median / base.median, r.method))
        if pts:
            pts.sort()
            label = pts[0][2] if not single_stand_in else f"{pts[0][2]}; adaptive widths at batch > 1"
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
            plotted = True
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xscale("log", base=2)
    sizes = sorted({1, *(r.batch for r in rows)})
    ax.set_xticks(sizes, [str(b) for b in sizes])
    ax.set_xlabel("batch size (requests decoded together)")
    ax.set_ylabel("speedup over plain at the same batch")
    ax.set_title("Speculative speedup vs batch size (spec-rs)")
    if plotted:
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "no batched speculative rows measured", ha="center", transform=ax.transAxes)
    paths["speedup vs batch size"] = _save(fig, out_dir / f"{prefix}-speedup-vs-batch.png")
    return paths


def _save(fig: Any, path: Path) -> str:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return str(path)


def plots_via_tools_env(
    args: argparse.Namespace, data_file: Path, plots_dir: Path, prefix: str, notes: list[str]
) -> dict[str, str]:
    """Draws the plots with the tools environment (matplotlib lives there, not in the project)."""
    tools = peers.ensure_env(peers.env_specs()["tools"], dry_run=args.dry_run)
    argv = [
        str(peers.venv_python("tools")),
        str(Path(__file__).resolve()),
        "_plot",
        "--data",
        str(data_file),
        "--out-dir",
        str(plots_dir),
        "--prefix",
        prefix,
    ]
    if args.dry_run:
        print(f"[dry-run] plots: {shlex.join(argv)}")
        return {}
    if not tools.ok:
        notes.append(f"plots not drawn: {tools.error}")
        return {}
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        notes.append(f"plots failed: {proc.stderr.strip()[-300:]}")
        return {}
    paths: dict[str, str] = json.loads(proc.stdout.strip().splitlines()[-1])
    return paths


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------


def _csv(choices: Sequence[str]) -> Callable[[str], list[str]]:
    def parse(text: str) -> list[str]:
        items = [t.strip() for t in text.split(",") if t.strip()]
        bad = [t for t in items if t not in choices]
        if bad:
            raise argparse.ArgumentTypeError(f"unknown {bad}; choose from {', '.join(choices)}")
        return items

    return parse


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--systems",
        type=_csv(SYSTEMS),
        default=list(SYSTEMS),
        help=f"comma-separated subset of {','.join(SYSTEMS)} (default: all)",
    )
    p.add_argument("--skip", type=_csv(SYSTEMS), default=[], help="systems to leave out")
    p.add_argument(
        "--specrs-configs",
        type=_csv(SPECRS_CONFIGS),
        default=list(SPECRS_CONFIGS),
        help=f"spec-rs configurations (default: all of {','.join(SPECRS_CONFIGS)})",
    )
    p.add_argument(
        "--specrs-extra",
        type=parse_extra_config,
        action="append",
        metavar="NAME=JSON",
        help="one more spec-rs configuration, single stream, side by side with the others: a name and a "
        "JSON object of SpeculativeConfig fields (eagle drafts with --eagle-draft); repeatable, "
        'e.g. \'cut0.1={"speculative_method":"eagle","num_speculative_tokens":3,'
        '"draft_confidence_threshold":0.1}\'',
    )
    p.add_argument("--repeats", type=int, default=3, help="repetitions; tables show medians (default 3)")
    p.add_argument("--max-tokens", type=int, default=96, help="new tokens per request (default 96)")
    p.add_argument(
        "--prompts", type=int, default=12, help=f"chat prompts, at most {len(CHAT_PROMPTS)} (default 12)"
    )
    p.add_argument(
        "--quote-prompts", type=int, default=len(QUOTE_PROMPTS), help="quote-back prompts (default all)"
    )
    p.add_argument("--batch-sizes", type=lambda s: [int(x) for x in s.split(",")], default=[8, 32])
    p.add_argument(
        "--batch-rounds",
        type=int,
        default=3,
        help="timed calls of each spec-rs batch workload per repetition, each a sample (default 3)",
    )
    p.add_argument(
        "--model", default=DEFAULT_MODEL, help="GGUF (alias or path) shared by spec-rs and the peers"
    )
    p.add_argument(
        "--spec-dtype", default="auto", help="dtype of spec-rs plain/speculative rows (default auto)"
    )
    p.add_argument("--eagle-draft", type=Path, default=DEFAULT_EAGLE_DRAFT, help="the shipped EAGLE-3 head")
    p.add_argument("--eagle-k", type=int, default=3, help="EAGLE-3 draft tokens per step (default 3)")
    p.add_argument("--synthetic-drafter", choices=["ngram", "eagle"], default="ngram")
    p.add_argument("--hf-assistant", help="assistant model folder for transformers' assisted generation")
    p.add_argument(
        "--threads", type=int, default=peers.nproc(), help="threads for the peers (default: all cores)"
    )
    p.add_argument("--step-tokens", type=int, default=64, help="decode_speed steps per measurement")
    p.add_argument("--no-build", action="store_true", help="use the existing decode_speed binary")
    p.add_argument(
        "--interleave",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="with peers and several repetitions, run every system once per repetition in turn, so "
        "ratios to a peer are medians of per-repetition ratios (default: on)",
    )
    p.add_argument("--job-timeout", type=float, default=3600, help="seconds per measurement subprocess")
    p.add_argument(
        "--output",
        type=Path,
        default=REPO_ROOT / "docs" / "BENCHMARKS.md",
        help="Markdown file the dated section is appended to",
    )
    p.add_argument(
        "--plots-dir", type=Path, help="default: docs/bench, or <output dir>/bench for another --output"
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: 2 chat + 1 quote prompt, 16 tokens, 1 repetition, 16 decode_speed steps",
    )
    p.add_argument(
        "--dry-run", action="store_true", help="print and check every command; run and write nothing"
    )
    return p


def check_extra_configs(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Rejects, before anything runs, a ``--specrs-extra`` that spec-rs's own rules refuse, a name
    given twice, or extras whose ratio would have no plain row to be measured against."""
    extras = args.specrs_extra or []
    if not extras:
        return
    from spec_rs import SpeculativeConfig

    names = [name for name, _ in extras]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        parser.error(f"--specrs-extra names must differ: {', '.join(twice)} given more than once")
    if "specrs" not in args.systems:
        parser.error("--specrs-extra adds spec-rs configurations; keep specrs in --systems")
    if "plain" not in args.specrs_configs:
        parser.error("--specrs-extra rows are measured against spec-rs plain: add plain to --specrs-configs")
    for name, spec in extras:
        if spec.get("speculative_method") in DRAFTS_NOT_AT_HAND:
            parser.error(
                f"--specrs-extra {name}: the benchmark drafts with one checkpoint, the EAGLE-3 head of "
                f"--eagle-draft; {spec['speculative_method']} needs its own (use eagle, ngram or "
                "synthetic_acceptance_rate)"
            )
        try:
            SpeculativeConfig(**spec)
        except (ValueError, TypeError) as e:
            parser.error(f"--specrs-extra {name}: spec-rs refuses this configuration: {e}")


def apply_quick(args: argparse.Namespace) -> None:
    if args.quick:
        args.prompts, args.quote_prompts, args.max_tokens, args.repeats, args.step_tokens = 2, 1, 16, 1, 16
        args.batch_rounds = 1


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["_specrs-worker"]:
        return _worker_main(argv[1:])
    if argv[:1] == ["_plot"]:
        return _plot_main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    apply_quick(args)
    args.systems = [s for s in args.systems if s not in args.skip]
    check_extra_configs(parser, args)
    from spec_rs.models import resolve_model

    gguf_path = resolve_model(args.model)
    items = prompt_items(args.prompts, args.quote_prompts)
    if args.dry_run:
        with tempfile.TemporaryDirectory(prefix="specrs-bench-dry-") as tmp:
            return dry_run(args, gguf_path, items, Path(tmp))
    return run_all(args, argv, gguf_path, items)


def run_systems(
    args: argparse.Namespace,
    gguf_path: str,
    items: list[dict[str, Any]],
    prompts_file: Path,
    work: Path,
    notes: list[str],
) -> tuple[list[Row], dict[str, Any]]:
    """Every selected system, ``args.repeats`` repetitions each: spec-rs, then the peers."""
    rows: list[Row] = []
    raw: dict[str, Any] = {}
    if "specrs" in args.systems:
        r, w = run_specrs(args, items, prompts_file, work)
        rows, raw = rows + r, {**raw, **w}
    if {"llama", "mistralrs", "hf"} & set(args.systems):
        r, w = run_peers(args, gguf_path, items, prompts_file, work, notes)
        rows, raw = rows + r, {**raw, **w}
    return rows, raw


def run_interleaved(
    args: argparse.Namespace,
    gguf_path: str,
    items: list[dict[str, Any]],
    prompts_file: Path,
    work: Path,
    notes: list[str],
) -> tuple[list[Row], dict[str, Any]]:
    """Every selected system once per repetition, in turn: spec-rs (its configurations
    interleaved as ever), then each peer, then the next repetition.

    On a shared machine a peer measured a whole run after spec-rs can meet a different
    neighbour: the ratio of medians then carries that difference (on one 2-core VM the
    hypervisor took 30% of the CPU time during a measurement and under 1% minutes before,
    see the steal share in the machine line). Taking turns keeps a
    repetition's measurements minutes apart, and the ratios to a peer become medians of
    per-repetition ratios. Each repetition loads every system again, which costs seconds.
    """
    once = argparse.Namespace(**{**vars(args), "repeats": 1})
    merged: dict[str, dict[str, Any]] = {}
    first_rows: dict[str, Row] = {}
    failures: dict[str, list[Row]] = {}
    for rep in range(args.repeats):
        rep_dir = work / f"repeat-{rep}"
        rep_dir.mkdir(parents=True, exist_ok=True)
        print(f"repetition {rep + 1} of {args.repeats}", flush=True)
        rows, raw = run_systems(once, gguf_path, items, prompts_file, rep_dir, notes if rep == 0 else [])
        for row in rows:
            first_rows.setdefault(row.key, row)
            if row.error:
                # One line per prompt set and batch, however many repetitions failed the same way.
                seen = failures.setdefault(row.key, [])
                where = (row.prompt_set, row.batch, row.error)
                if not any((r.prompt_set, r.batch, r.error) == where for r in seen):
                    seen.append(row)
        for key, result in raw.items():
            runs = [{**run, "repeat": rep} for run in result["runs"]]
            if key in merged:
                merged[key]["runs"] += runs
            else:
                merged[key] = {**result, "runs": runs}
    sets = _sets(items)
    out: list[Row] = []
    for key, first in first_rows.items():
        if key in failures or key not in merged:
            # A system that failed in any repetition reports that failure, not a partial median.
            out += failures.get(key, [first])
            continue
        system = first.system
        for row in rows_from_runs(key, system, first.method, first.weights, merged[key]["runs"], sets):
            row.interleaved = True
            out.append(row)
    return out, merged


def run_all(args: argparse.Namespace, argv: list[str], gguf_path: str, items: list[dict[str, Any]]) -> int:
    """The measured run: every selected system, then the Markdown section and the plots."""
    now = dt.datetime.now(dt.UTC)
    stamp, prefix = now.strftime("%Y-%m-%d %H:%M UTC"), now.strftime("%Y%m%d-%H%M%S")
    work = peers.CACHE_DIR / "results" / prefix
    work.mkdir(parents=True, exist_ok=True)
    prompts_file = work / "prompts.json"
    prompts_file.write_text(json.dumps(items, indent=1))
    notes: list[str] = []
    print(f"measuring machine facts; raw results go to {work}", flush=True)
    facts = machine_facts()
    with_peers = bool({"llama", "mistralrs", "hf"} & set(args.systems))
    run = run_interleaved if args.interleave and with_peers and args.repeats > 1 else run_systems
    rows, raw = run(args, gguf_path, items, prompts_file, work, notes)
    costs: list[StepCost] = []
    step_errors: list[str] = []
    if "steps" in args.systems:
        build_error = None if args.no_build else build_decode_speed(False)
        if build_error:
            step_errors.append(build_error)
        elif not decode_speed_binary().is_file():
            step_errors.append(f"{decode_speed_binary()} not built")
        else:
            costs, step_errors = measure_step_costs(args)
    bound = synthetic_bound(rows, costs, args.spec_dtype)
    if "specrs" in args.systems and "synthetic" in args.specrs_configs and args.synthetic_drafter == "ngram":
        notes.append(
            "synthetic acceptance uses n-gram drafts, which exist only where a suffix recurs, so not "
            "every step verifies K drafts"
            + ("; the issue-5 table gives the share that did and the bound at that share" if bound else "")
        )
    data = {
        "stamp": stamp,
        "facts": facts,
        "rows": [asdict(r) for r in rows],
        "costs": [asdict(c) for c in costs],
        "bound": bound,
        "raw": raw,
        "args": {k: str(v) for k, v in vars(args).items()},
    }
    data_file = work / "results.json"
    data_file.write_text(json.dumps(data, indent=1))
    plots = plots_via_tools_env(args, data_file, plots_dir(args), prefix, notes)
    ctx = {
        "args": args,
        "facts": facts,
        "rows": rows,
        "costs": costs,
        "bound": bound,
        "plots": plots,
        "output": args.output.resolve(),
        "stamp": stamp,
        "sets": _sets(items),
        "gguf": gguf_path,
        "command": "python " + shlex.join([os.path.relpath(__file__, REPO_ROOT), *argv]),
        "counts": {s: sum(1 for it in items if it["set"] == s) for s in ("chat", "quote")},
        "prompts_note": prompts_note(sum(1 for it in items if it["set"] == "chat")),
        "goals": goals(rows, costs, facts, bound, args.spec_dtype),
        "notes": notes,
        "step_errors": step_errors,
    }
    section = render_markdown(ctx)
    append_section(args.output, section)
    print(section)
    print(f"appended to {args.output}; raw results in {data_file}")
    return 0


def plots_dir(args: argparse.Namespace) -> Path:
    """docs/bench for docs/BENCHMARKS.md; <output dir>/bench for any other --output."""
    if args.plots_dir:
        return Path(args.plots_dir)
    if args.output.resolve() == (REPO_ROOT / "docs" / "BENCHMARKS.md").resolve():
        return REPO_ROOT / "docs" / "bench"
    return Path(args.output.resolve().parent / "bench")


def dry_run(args: argparse.Namespace, gguf_path: str, items: list[dict[str, Any]], work: Path) -> int:
    """Prints every command the run would execute and checks it: worker command lines parse,
    spec-rs configurations validate, and what installs and builds need is present."""
    problems: list[str] = []
    prompts_file = work / "prompts.json"
    prompts_file.write_text(json.dumps(items))
    if "specrs" in args.systems:
        problems += dry_run_specrs(args, prompts_file, work)
    if {"llama", "mistralrs", "hf"} & set(args.systems):
        problems += dry_run_peers(args, gguf_path, prompts_file, work)
    if "steps" in args.systems:
        err = None if args.no_build else build_decode_speed(True)
        if err:
            problems.append(err)
        measure_step_costs(args)
    plots_via_tools_env(args, work / "results.json", plots_dir(args), "PREFIX", [])
    for p in problems:
        print(f"[dry-run] check: {p}")
    verdict = "no problems found" if not problems else f"{len(problems)} problem(s)"
    print(f"[dry-run] {verdict}; nothing was run")
    return 0


def dry_run_specrs(args: argparse.Namespace, prompts_file: Path, work: Path) -> list[str]:
    """Prints the spec-rs worker commands; validates each configuration with spec-rs's own
    rules and checks that the worker accepts its command line."""
    from spec_rs import SpeculativeConfig

    problems = []
    jobs = specrs_jobs(args)
    argv = specrs_worker_command(jobs, args, prompts_file, work / "specrs.json")
    print(f"[dry-run] spec-rs {', '.join(job.key for job in jobs)}: {shlex.join(argv)}")
    problems += _check_parses(_worker_parser(), argv[3:], "spec-rs")
    for job in jobs:
        try:
            if job.speculative:
                SpeculativeConfig(**job.speculative)
        except ValueError as e:
            problems.append(f"spec-rs {job.key}: invalid configuration: {e}")
        if job.draft is not None and not Path(job.draft).is_dir():
            problems.append(
                f"spec-rs {job.key}: EAGLE-3 draft {job.draft} is absent; its rows will read 'no draft'"
            )
    return problems


def _worker_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="run_benchmarks.py _specrs-worker")
    p.add_argument("--jobs", required=True, help="a JSON list of SpecJobs")
    p.add_argument("--prompts", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--max-tokens", type=int, required=True)
    p.add_argument("--repeats", type=int, required=True)
    p.add_argument("--batch-rounds", type=int, default=1)
    return p


def _worker_main(argv: list[str]) -> int:
    a = _worker_parser().parse_args(argv)
    jobs = [SpecJob(**{**fields, "batches": tuple(fields["batches"])}) for fields in json.loads(a.jobs)]
    items = json.loads(Path(a.prompts).read_text())
    result = specrs_worker(jobs, items, a.max_tokens, a.repeats, a.batch_rounds)
    Path(a.out).write_text(json.dumps(result, indent=1))
    return 0


def _plot_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="run_benchmarks.py _plot")
    p.add_argument("--data", type=Path, required=True)
    p.add_argument("--out-dir", type=Path, required=True)
    p.add_argument("--prefix", required=True)
    a = p.parse_args(argv)
    print(json.dumps(make_plots(json.loads(a.data.read_text()), a.out_dir, a.prefix)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
