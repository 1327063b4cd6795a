#!/usr/bin/env python3
"""What a new request's preparation costs the requests already running: a streamed answer
on the server, and while it streams, a request whose JSON schema (a fresh one each trial, so
no cache helps) takes tens of milliseconds to compile. Where that compile runs on the engine
thread, every running sequence waits for it; where the handle prepares requests on the
caller's side, they do not.

Per trial the streamed answer's gaps between chunks are recorded; the table gives, over the
trials, the median of the largest gap while the guided request is admitted, and the median
gap of the quiet stretch before it. Run it against another build by pointing ``PYTHONPATH``
at that build's ``python`` directory.

    python benches/e2e/admission_stall_bench.py --trials 7
"""

from __future__ import annotations

import argparse
import datetime as dt
import itertools
import json
import re
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from run_benchmarks import REPO_ROOT

LISTENING = re.compile(r"listening on (http://\S+)")
MODEL = "smollm2-135m-instruct"


def start_server() -> tuple[subprocess.Popen[str], str]:
    cmd = [sys.executable, "-m", "spec_rs.cli", "serve", "--host", "127.0.0.1", "--port", "0"]
    cmd += ["--model", MODEL]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    deadline = time.monotonic() + 120
    for line in proc.stdout:
        if m := LISTENING.search(line):
            threading.Thread(target=lambda: [None for _ in proc.stdout or []], daemon=True).start()
            return proc, m.group(1)
        if time.monotonic() > deadline:
            break
    proc.kill()
    raise SystemExit("the server did not start")


def post(url: str, body: dict[str, Any]) -> urllib.request.Request:
    return urllib.request.Request(
        f"{url}/v1/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )


def fresh_schema(trial: int) -> dict[str, Any]:
    """Fourteen optional string properties, named apart per trial: ~100 ms of DFA building."""
    props = {f"t{trial}_field_{i}": {"type": "string", "maxLength": 30} for i in range(14)}
    return {"type": "object", "properties": props, "required": [f"t{trial}_field_0"]}


def trial(url: str, index: int) -> tuple[float, float]:
    """The largest chunk gap while the guided request is admitted, and the quiet median."""
    stream = post(
        url,
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "Write a long story about a lighthouse keeper."}],
            "temperature": 0,
            "max_tokens": 400,
            "stream": True,
            "ignore_eos": True,
        },
    )
    arrivals: list[float] = []
    guided_window: list[float] = []

    def send_guided() -> None:
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": "Fill the form as JSON."}],
            "temperature": 0,
            "max_tokens": 1,
            "response_format": {"type": "json_schema", "json_schema": {"schema": fresh_schema(index)}},
        }
        guided_window.append(time.perf_counter())
        with urllib.request.urlopen(post(url, body), timeout=60) as r:
            r.read()
        guided_window.append(time.perf_counter())

    sender = None
    with urllib.request.urlopen(stream, timeout=120) as r:
        for line in r:
            if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                continue
            arrivals.append(time.perf_counter())
            if len(arrivals) == 100 and sender is None:
                sender = threading.Thread(target=send_guided)
                sender.start()
    if sender is not None:
        sender.join()
    start, end = guided_window
    gaps = [(b, b - a) for a, b in itertools.pairwise(arrivals)]
    during = [g for at, g in gaps if start <= at <= end + 0.05]
    quiet = [g for at, g in gaps if at < start]
    return max(during, default=0.0), statistics.median(quiet)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trials", type=int, default=7)
    parser.add_argument("--label", default="this build")
    parser.add_argument("--output", type=Path, default=REPO_ROOT / "docs" / "BENCHMARKS.md")
    args = parser.parse_args()
    proc, url = start_server()
    try:
        trial(url, -1)  # warm-up: the vocabulary's byte trie is built with the first guide
        results = [trial(url, i) for i in range(args.trials)]
    finally:
        proc.terminate()
        proc.wait(30)
    stall = statistics.median(r[0] for r in results) * 1000
    quiet = statistics.median(r[1] for r in results) * 1000
    stamp = dt.datetime.now().strftime("%Y-%m-%d %H:%M")
    section = (
        f"\n### Admission stall ({args.label}): {stamp}\n\n"
        f"`python benches/e2e/admission_stall_bench.py --trials {args.trials}`: a streamed answer's largest "
        f"gap while a request with a fresh 14-property schema is admitted, median over {args.trials} "
        f"trials: **{stall:.1f} ms** (its usual gap between chunks: {quiet:.1f} ms).\n"
    )
    print(section)
    with args.output.open("a") as f:
        f.write(section)


if __name__ == "__main__":
    sys.exit(main())
