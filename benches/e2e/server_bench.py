#!/usr/bin/env python3
"""Serving benchmark (issue 6): request throughput and tokens/s of `spec-rs serve` at several
concurrency levels, with and without speculative decoding, side by side with llama.cpp's
server as llama-cpp-python ships it (``python -m llama_cpp.server``) on the same GGUF.

For each server and each concurrency level C, a fixed workload of ``--requests-per-level`` x C
chat requests is sent with at most C in flight (a closed loop: a new request starts when one
finishes). Each request is a prompt drawn from the benchmark prompts with a ``max_tokens``
drawn from ``[--min-tokens, --max-tokens]``, both from a seeded RNG, so every server gets
exactly the same requests. Requests stream through the ``openai`` client, greedy.

Measured per level: requests/s and generated tokens/s over the level's wall time; time to
first token (TTFT, first content chunk) and inter-token latency (ITL, the gap between content
chunks; a speculative server may send several tokens in one chunk) as p50 / p99; mean time per
output token after the first (TPOT). Generated tokens come from the stream's ``usage`` where
the server sends it, else one per content chunk (llama-cpp-python streams one token per chunk).

Every server this script starts binds 127.0.0.1 and is stopped (SIGTERM, then SIGKILL) before
it exits, also on errors and Ctrl-C. A dated Markdown section is appended to
docs/BENCHMARKS.md (or ``--output``).

    python benches/e2e/server_bench.py                       # spec-rs plain/ngram/EAGLE-3 + llama.cpp
    python benches/e2e/server_bench.py --quick --systems specrs --output /tmp/s.md
    python benches/e2e/server_bench.py --dry-run             # print the server commands only
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import datetime as dt
import json
import os
import random
import re
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import peers
from run_benchmarks import (
    CHAT_PROMPTS,
    DEFAULT_EAGLE_DRAFT,
    DEFAULT_MODEL,
    QUOTE_PROMPTS,
    REPO_ROOT,
    append_section,
    machine_facts,
    md_header,
    md_row,
)

LISTENING = re.compile(r"spec-rs listening on (http://127\.0\.0\.1:\d+)")
SYSTEMS = ("specrs", "llama")
SPECRS_CONFIGS = ("plain", "ngram", "eagle")


# --------------------------------------------------------------------------------------------
# Servers
# --------------------------------------------------------------------------------------------


@dataclass
class ServerSpec:
    """A server to start: its command, how to tell it is up, and what to call it."""

    key: str
    label: str
    speculative: str
    argv: list[str]
    #: Regex on stdout giving the base URL (spec-rs), or None to poll ``url``/v1/models.
    url: str | None = None
    error: str | None = None
    usage_in_stream: bool = True


class RunningServer:
    """A started server process; :meth:`stop` ends it (and only it)."""

    def __init__(self, spec: ServerSpec, log_dir: Path, startup_timeout: float) -> None:
        self.spec = spec
        self.log_path = log_dir / f"server-{spec.key}.log"
        self._log = self.log_path.open("w")
        self.proc = subprocess.Popen(
            spec.argv,
            stdout=subprocess.PIPE,
            stderr=self._log,
            stdin=subprocess.DEVNULL,
            text=True,
            env={**os.environ, "SPEC_RS_LOG": "warn"},
        )
        _RUNNING.append(self)
        self.base_url = self._wait_ready(startup_timeout)

    def _wait_ready(self, timeout: float) -> str:
        found: list[str] = []
        ready = threading.Event()

        def drain() -> None:
            # Keeps reading stdout for the server's lifetime so the pipe never fills.
            assert self.proc.stdout is not None
            for line in self.proc.stdout:
                self._log.write(line)
                if not ready.is_set() and (m := LISTENING.search(line)):
                    found.append(m.group(1))
                    ready.set()

        threading.Thread(target=drain, daemon=True).start()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"exited with {self.proc.returncode}: {self._tail()}")
            if self.spec.url is None and ready.wait(0.2):
                return found[0]
            if self.spec.url is not None:
                if _http_ok(self.spec.url + "/v1/models"):
                    return self.spec.url
                time.sleep(0.5)
        raise RuntimeError(f"not ready after {timeout:.0f} s: {self._tail()}")

    def _tail(self) -> str:
        self._log.flush()
        lines = [ln for ln in self.log_path.read_text(errors="replace").splitlines() if ln.strip()]
        return " | ".join(lines[-3:])[-400:]

    def stop(self) -> int:
        """SIGTERM, then SIGKILL after 20 s; returns the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        if self in _RUNNING:
            _RUNNING.remove(self)
        self._log.close()
        return int(self.proc.returncode)


#: Servers started and not yet stopped, so that every exit path can stop them.
_RUNNING: list[RunningServer] = []


def stop_all_servers() -> None:
    for server in list(_RUNNING):
        server.stop()


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return False


def free_port() -> int:
    """A port free on 127.0.0.1 right now (for servers that cannot bind port 0 and say so)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def specrs_servers(args: argparse.Namespace, max_concurrency: int) -> list[ServerSpec]:
    """`spec-rs serve` configurations: plain, n-gram and EAGLE-3 (adaptive verify widths)."""
    base = [sys.executable, "-m", "spec_rs.cli", "serve", "--host", "127.0.0.1", "--port", "0"]
    base += [
        "--model",
        args.model,
        "--max-num-seqs",
        str(max(64, max_concurrency)),
        "--max-model-len",
        "2048",
    ]
    adaptive = ["--adaptive-speculative-widths", "all"]
    configs = {
        # --no-default-draft: the default model would otherwise serve its shipped draft.
        "plain": ServerSpec("specrs-plain", "spec-rs serve", "off", [*base, "--no-default-draft"]),
        "ngram": ServerSpec(
            "specrs-ngram",
            "spec-rs serve",
            "n-gram (K=4, adaptive widths)",
            [*base, "--speculative-method", "ngram", "--num-speculative-tokens", "4", *adaptive],
        ),
        "eagle": ServerSpec(
            "specrs-eagle",
            "spec-rs serve",
            f"EAGLE-3 (K={args.eagle_k}, adaptive widths)",
            [
                *base,
                *("--speculative-method", "eagle", "--draft-model", str(args.eagle_draft)),
                *("--num-speculative-tokens", str(args.eagle_k), *adaptive),
            ],
        ),
    }
    if not Path(args.eagle_draft).is_dir():
        configs["eagle"].error = f"no draft: {args.eagle_draft} does not exist (--eagle-draft)"
    return [configs[k] for k in args.specrs_configs]


def llama_server(args: argparse.Namespace, gguf_path: str, python: Path) -> ServerSpec:
    """llama-cpp-python's OpenAI server on the same GGUF (it serves one request at a time)."""
    port = free_port()
    argv = [str(python), "-m", "llama_cpp.server", "--model", gguf_path, "--model_alias", args.model]
    argv += ["--n_threads", str(args.threads), "--n_threads_batch", str(args.threads), "--n_ctx", "4096"]
    # By default a new request interrupts the stream being served; queue them instead.
    argv += ["--interrupt_requests", "False"]
    argv += ["--host", "127.0.0.1", "--port", str(port)]
    return ServerSpec("llama", "llama-cpp-python server", "off", argv, url=f"http://127.0.0.1:{port}")


# --------------------------------------------------------------------------------------------
# Workload and client
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    prompt: str
    max_tokens: int


def workload(level: int, per_level: int, min_tokens: int, max_tokens: int, seed: int) -> list[Request]:
    """``per_level`` x ``level`` requests, the same for every server (seeded per level)."""
    rng = random.Random(seed * 1000 + level)
    prompts = CHAT_PROMPTS + QUOTE_PROMPTS
    return [
        Request(rng.choice(prompts), rng.randint(min_tokens, max_tokens)) for _ in range(per_level * level)
    ]


@dataclass
class Outcome:
    """One streamed request: when its content chunks arrived, and how many tokens it made."""

    start: float
    chunk_times: list[float] = field(default_factory=list)
    tokens: int = 0
    error: str | None = None

    @property
    def ttft(self) -> float | None:
        return self.chunk_times[0] - self.start if self.chunk_times else None


async def one_request(client: Any, model: str, req: Request, usage_in_stream: bool) -> Outcome:
    """Streams one greedy chat completion, timing each content chunk."""
    out = Outcome(time.perf_counter())
    extra: dict[str, Any] = {"stream_options": {"include_usage": True}} if usage_in_stream else {}
    chunks = 0
    try:
        stream = await client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": req.prompt}],
            max_tokens=req.max_tokens,
            temperature=0.0,
            stream=True,
            **extra,
        )
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta and chunk.choices[0].delta.content:
                out.chunk_times.append(time.perf_counter())
                chunks += 1
            if getattr(chunk, "usage", None) is not None:
                out.tokens = int(chunk.usage.completion_tokens)
    except Exception as e:  # any client or server failure is recorded in the results, not raised
        out.error = f"{type(e).__name__}: {e}"[:200]
    if not out.tokens:
        out.tokens = chunks
    return out


async def run_level(
    base_url: str, model: str, requests: list[Request], concurrency: int, usage: bool
) -> dict[str, Any]:
    """Sends ``requests`` with at most ``concurrency`` in flight; returns the level's stats."""
    import openai

    client = openai.AsyncOpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0, timeout=1800)
    gate = asyncio.Semaphore(concurrency)

    async def gated(req: Request) -> Outcome:
        async with gate:
            return await one_request(client, model, req, usage)

    t0 = time.perf_counter()
    outcomes = await asyncio.gather(*(gated(r) for r in requests))
    wall = time.perf_counter() - t0
    await client.close()
    return summarize(outcomes, wall, concurrency)


def _pct(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))]


def summarize(outcomes: list[Outcome], wall: float, concurrency: int) -> dict[str, Any]:
    ok = [o for o in outcomes if o.error is None]
    ttft = [o.ttft for o in ok if o.ttft is not None]
    itl = [b - a for o in ok for a, b in zip(o.chunk_times, o.chunk_times[1:], strict=False)]
    tpot = [
        (o.chunk_times[-1] - o.chunk_times[0]) / (o.tokens - 1) for o in ok if o.tokens > 1 and o.chunk_times
    ]
    tokens = sum(o.tokens for o in ok)
    return {
        "concurrency": concurrency,
        "requests": len(outcomes),
        "errors": len(outcomes) - len(ok),
        "first_error": next((o.error for o in outcomes if o.error), None),
        "wall_s": wall,
        "req_per_s": len(ok) / wall,
        "tok_per_s": tokens / wall,
        "tokens": tokens,
        "ttft_p50": _pct(ttft, 50),
        "ttft_p99": _pct(ttft, 99),
        "itl_p50": _pct(itl, 50),
        "itl_p99": _pct(itl, 99),
        "tpot_mean": statistics.fmean(tpot) if tpot else None,
    }


# --------------------------------------------------------------------------------------------
# Running one server through every level
# --------------------------------------------------------------------------------------------


def bench_server(spec: ServerSpec, args: argparse.Namespace, log_dir: Path) -> list[dict[str, Any]]:
    """Starts the server, warms it up, runs every concurrency level, stops it."""
    if spec.error:
        return [{"concurrency": c, "error": spec.error} for c in args.concurrency]
    print(f"{spec.key}: starting {shlex.join(spec.argv)}", flush=True)
    try:
        server = RunningServer(spec, log_dir, args.startup_timeout)
    except RuntimeError as e:
        stop_all_servers()
        return [{"concurrency": c, "error": f"server did not start: {e}"} for c in args.concurrency]
    results = []
    try:
        warm = Request(CHAT_PROMPTS[0], 8)
        model = args.model
        check = asyncio.run(run_level(server.base_url, model, [warm], 1, spec.usage_in_stream))
        if check["errors"] and spec.usage_in_stream:
            spec.usage_in_stream = False  # a server that rejects stream_options: count chunks
            check = asyncio.run(run_level(server.base_url, model, [warm], 1, False))
        if check["errors"]:
            return [
                {"concurrency": c, "error": f"warm-up failed: {check['first_error']}"}
                for c in args.concurrency
            ]
        for level in args.concurrency:
            reqs = workload(level, args.requests_per_level, args.min_tokens, args.max_tokens, args.seed)
            print(f"{spec.key}: concurrency {level}, {len(reqs)} requests", flush=True)
            stats = asyncio.run(run_level(server.base_url, model, reqs, level, spec.usage_in_stream))
            stats["token_count"] = "usage" if spec.usage_in_stream else "chunks"
            results.append(stats)
    finally:
        code = server.stop()
    if code != 0:
        results.append({"concurrency": "—", "error": f"server exited with status {code} when stopped"})
    return results


# --------------------------------------------------------------------------------------------
# Markdown
# --------------------------------------------------------------------------------------------


def _ms(x: float | None) -> str:
    return "—" if x is None else f"{x * 1e3:.0f}"


def results_table(results: list[tuple[ServerSpec, list[dict[str, Any]]]]) -> list[str]:
    plain = {
        r["concurrency"]: r
        for spec, rs in results
        if spec.key == "specrs-plain"
        for r in rs
        if "tok_per_s" in r
    }
    lines = md_header(
        "server",
        "speculative decoding",
        "concurrency",
        "requests",
        "req/s",
        "tok/s",
        "x spec-rs plain tok/s",
        "TTFT p50 / p99 (ms)",
        "ITL p50 / p99 (ms)",
        "TPOT mean (ms)",
        "errors",
        right_from=2,
    )
    for spec, rs in results:
        for r in rs:
            if "tok_per_s" not in r:
                lines.append(
                    md_row(spec.label, spec.speculative, r["concurrency"], "—", r["error"], *[""] * 6)
                )
                continue
            base = plain.get(r["concurrency"])
            speedup = f"{r['tok_per_s'] / base['tok_per_s']:.2f}x" if base and base["tok_per_s"] else "—"
            errors = str(r["errors"]) + (f" ({r['first_error']})" if r["errors"] else "")
            lines.append(
                md_row(
                    spec.label,
                    spec.speculative,
                    r["concurrency"],
                    r["requests"],
                    f"{r['req_per_s']:.2f}",
                    f"{r['tok_per_s']:.1f}" + ("" if r["token_count"] == "usage" else " (chunks)"),
                    speedup,
                    f"{_ms(r['ttft_p50'])} / {_ms(r['ttft_p99'])}",
                    f"{_ms(r['itl_p50'])} / {_ms(r['itl_p99'])}",
                    _ms(r["tpot_mean"]),
                    errors,
                )
            )
    return lines


def render_markdown(
    args: argparse.Namespace, argv: list[str], facts: dict[str, Any], results: Any, notes: list[str]
) -> str:
    stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    command = "python " + shlex.join([os.path.relpath(__file__, REPO_ROOT), *argv])
    machine = (
        f"Machine: {facts['nproc']} cores ({facts['cpu']}), memory read {facts['bandwidth_gbs']:.1f} "
        f"GB/s (numpy); load average {facts['loadavg_start'][0]:.1f} at start, "
        f"{os.getloadavg()[0]:.1f} at end; spec-rs {facts['commit']}."
    )
    work = (
        f"Workload per concurrency level C: {args.requests_per_level} x C streamed chat requests, at "
        f"most C in flight; prompt and max_tokens (uniform in [{args.min_tokens}, {args.max_tokens}]) "
        f"drawn from random.Random(seed={args.seed}) per level, identical for every server; greedy; one "
        "untimed warm-up request per server. req/s and tok/s over the level's wall time; TTFT = time "
        "to the first content chunk; ITL = gap between content chunks; TPOT = (last chunk - first "
        "chunk) / (tokens - 1), averaged over requests. Tokens from the stream's usage; '(chunks)' = "
        "counted as one per chunk."
    )
    title = f"## {stamp} — serving benchmark{' (quick smoke run)' if args.quick else ''}"
    return "\n".join(
        [
            title,
            "",
            f"Command: `{command}`",
            "",
            machine,
            "",
            work,
            "",
            *results_table(results),
            "",
            *(["Notes:", "", *[f"- {n}" for n in notes], ""] if notes else []),
        ]
    )


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------


def _csv(choices: Sequence[str]) -> Any:
    def parse(text: str) -> list[str]:
        items = [t.strip() for t in text.split(",") if t.strip()]
        if bad := [t for t in items if t not in choices]:
            raise argparse.ArgumentTypeError(f"unknown {bad}; choose from {', '.join(choices)}")
        return items

    return parse


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--systems", type=_csv(SYSTEMS), default=list(SYSTEMS), help="specrs,llama (default both)")
    p.add_argument("--specrs-configs", type=_csv(SPECRS_CONFIGS), default=list(SPECRS_CONFIGS))
    p.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8, 32])
    p.add_argument(
        "--requests-per-level", type=int, default=3, help="requests = this x concurrency (default 3)"
    )
    p.add_argument("--min-tokens", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model", default=DEFAULT_MODEL, help="GGUF (alias or path) both servers load")
    p.add_argument("--eagle-draft", type=Path, default=DEFAULT_EAGLE_DRAFT)
    p.add_argument("--eagle-k", type=int, default=3)
    p.add_argument(
        "--threads", type=int, default=peers.nproc(), help="llama.cpp threads (default: all cores)"
    )
    p.add_argument("--startup-timeout", type=float, default=300)
    p.add_argument("--output", type=Path, default=REPO_ROOT / "docs" / "BENCHMARKS.md")
    p.add_argument(
        "--quick", action="store_true", help="smoke run: concurrency 1,8; 1 x C requests; 8-16 tokens"
    )
    p.add_argument("--dry-run", action="store_true", help="print the server commands; start nothing")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    if args.quick:
        args.concurrency, args.requests_per_level, args.min_tokens, args.max_tokens = [1, 8], 1, 8, 16
    from spec_rs.models import resolve_model

    gguf_path = resolve_model(args.model)
    servers: list[ServerSpec] = []
    notes: list[str] = []
    if "specrs" in args.systems:
        servers += specrs_servers(args, max(args.concurrency))
    if "llama" in args.systems:
        status = peers.ensure_env(peers.env_specs(args.threads)["llama"], dry_run=args.dry_run)
        spec = llama_server(args, gguf_path, status.python or peers.venv_python("llama"))
        if not status.ok and not args.dry_run:
            spec.error = status.error
        servers.append(spec)
        notes.append(
            "llama-cpp-python's server runs one request at a time (no batching); queued requests wait"
        )
    if args.dry_run:
        for s in servers:
            print(f"[dry-run] {s.key}: {shlex.join(s.argv)}" + (f"  ({s.error})" if s.error else ""))
        print("[dry-run] nothing was started")
        return 0
    atexit.register(stop_all_servers)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    facts = machine_facts()
    results = []
    with tempfile.TemporaryDirectory(prefix="specrs-serve-bench-") as tmp:
        log_dir = peers.CACHE_DIR / "logs" if peers.CACHE_DIR.is_dir() else Path(tmp)
        log_dir.mkdir(parents=True, exist_ok=True)
        try:
            for spec in servers:
                results.append((spec, bench_server(spec, args, log_dir)))
        finally:
            stop_all_servers()
    section = render_markdown(args, argv, facts, results, notes)
    append_section(args.output, section)
    print(section)
    print(f"appended to {args.output}")
    raw = peers.CACHE_DIR / "results" / f"server-{dt.datetime.now(dt.UTC):%Y%m%d-%H%M}.json"
    raw.parent.mkdir(parents=True, exist_ok=True)
    raw.write_text(json.dumps([{"server": s.key, "argv": s.argv, "levels": r} for s, r in results], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
