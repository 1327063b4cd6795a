#!/usr/bin/env python3
"""Structured outputs' speed: JSON-schema-guided chat on the default model, spec-rs against
llama.cpp's grammar-constrained decoding on the same GGUF, in one run.

Configurations (greedy, one request at a time, the same eight prompts each with its own
schema, ``max_tokens`` 128):

* **spec-rs plain, guided**: no drafter; every position masked by the schema's automaton.
* **spec-rs default, guided**: the shipped EAGLE-3 head with prompt lookup, and the grammar's
  forced text (keys, punctuation) drafted whole in front of it.
* **spec-rs default, free**: the same prompts without a schema, for what guidance costs.
* **llama.cpp, guided**: llama-cpp-python's ``response_format={"type": "json_object",
  "schema": ...}`` (its GBNF grammar sampler), in the peer environment
  ``.bench-cache/venvs/llama`` that ``run_benchmarks.py`` installs.

With ``--constraint grammar`` each schema is first turned into a GBNF grammar by llama.cpp's
own converter (``llama_cpp.llama_grammar.json_schema_to_gbnf``), and both systems get that
same grammar text: spec-rs as ``structured_outputs.grammar`` (its context-free recogniser),
llama.cpp as ``grammar=`` (its grammar sampler).

Systems take turns on every repetition, so a slow stretch of the shared machine falls on all
of them. Every guided output is checked (parsed, required keys present); the two spec-rs
guided configurations must return the same text. Tokens per second are completion tokens over
wall time, medians over repetitions. A dated Markdown section goes to docs/BENCHMARKS.md (or
``--output``).

    python benches/e2e/structured_bench.py --repeats 3
    python benches/e2e/structured_bench.py --repeats 3 --constraint grammar
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import peers
from run_benchmarks import DEFAULT_MODEL, REPO_ROOT

MAX_TOKENS = 128


def obj(properties: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(properties)}


STR = {"type": "string", "maxLength": 40}
INT = {"type": "integer", "minimum": 0}
NUM = {"type": "number"}
BOOL = {"type": "boolean"}

CASES: list[tuple[str, dict[str, Any]]] = [
    ("Describe a fictional software engineer as JSON.", obj({"name": STR, "age": INT, "city": STR})),
    ("Recommend a science fiction novel, as JSON.", obj({"title": STR, "author": STR, "year": INT})),
    (
        "Give a simple pancake recipe as JSON.",
        obj({"dish": STR, "servings": INT, "ingredients": {"type": "array", "items": STR, "maxItems": 6}}),
    ),
    (
        "Describe the city of Paris as JSON.",
        obj({"city": STR, "country": STR, "population": INT, "is_capital": BOOL}),
    ),
    (
        "Invent a laptop product listing as JSON.",
        obj({"product": STR, "brand": STR, "price": NUM, "in_stock": BOOL}),
    ),
    (
        "Describe tomorrow's weather in London as JSON.",
        obj(
            {"city": STR, "temperature_c": NUM, "condition": {"enum": ["sunny", "cloudy", "rainy", "snowy"]}}
        ),
    ),
    (
        "Plan a team meeting as JSON.",
        obj(
            {
                "title": STR,
                "day": {"enum": ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday"]},
                "duration_minutes": INT,
            }
        ),
    ),
    ("Describe a famous painting as JSON.", obj({"title": STR, "artist": STR, "year": INT, "museum": STR})),
]

LLAMA_WORKER = r"""
import json, sys, time
from llama_cpp import Llama, LlamaGrammar
job = json.load(sys.stdin)
llm = Llama(model_path=job["gguf"], n_ctx=2048, n_threads=job["threads"], verbose=False, seed=0)
results = []
for i, (prompt, schema) in enumerate(job["cases"]):
    if job["grammars"]:
        constraint = {"grammar": LlamaGrammar.from_string(job["grammars"][i], verbose=False)}
    else:
        constraint = {"response_format": {"type": "json_object", "schema": schema}}
    start = time.perf_counter()
    out = llm.create_chat_completion(
        messages=[{"role": "user", "content": prompt}],
        temperature=0.0, max_tokens=job["max_tokens"], **constraint,
    )
    wall = time.perf_counter() - start
    text = out["choices"][0]["message"]["content"]
    results.append({"text": text, "tokens": out["usage"]["completion_tokens"], "wall": wall})
json.dump(results, sys.stdout)
"""


GBNF_WORKER = r"""
import json, sys
from llama_cpp.llama_grammar import json_schema_to_gbnf
json.dump([json_schema_to_gbnf(json.dumps(schema)) for schema in json.load(sys.stdin)], sys.stdout)
"""


def gbnf_grammars() -> list[str]:
    """Each case's schema as llama.cpp's converter writes it in GBNF."""
    python = peers.venv_python("llama")
    if not python.exists():
        raise SystemExit("--constraint grammar needs the llama.cpp environment: run run_benchmarks.py once")
    schemas = json.dumps([schema for _, schema in CASES])
    proc = subprocess.run(
        [str(python), "-c", GBNF_WORKER], input=schemas, capture_output=True, text=True, timeout=300
    )
    if proc.returncode != 0:
        raise SystemExit(f"llama.cpp's schema converter failed: {proc.stderr[-2000:]}")
    grammars: list[str] = json.loads(proc.stdout)
    return grammars


def check(text: str, schema: dict[str, Any], label: str) -> None:
    value = json.loads(text)
    missing = set(schema["required"]) - set(value)
    if missing:
        raise SystemExit(f"{label}: output {text!r} lacks {sorted(missing)}")


#: Per spec-rs configuration: verify steps with drafts and drafts accepted (last repetition).
ACCEPTANCE: dict[bool, tuple[int, int]] = {}


def run_specrs(llm: Any, guided: bool, grammars: list[str] | None) -> tuple[list[str], int, float]:
    from spec_rs import SamplingParams, StructuredOutputsParams

    texts, tokens, wall = [], 0, 0.0
    steps = accepted = 0
    for i, (prompt, schema) in enumerate(CASES):
        constraint = None
        if guided:
            by_grammar = StructuredOutputsParams(grammar=grammars[i]) if grammars else None
            constraint = by_grammar or StructuredOutputsParams(json=schema)
        params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, structured_outputs=constraint)
        llm.reset_prefix_cache()
        start = time.perf_counter()
        out = llm.chat([{"role": "user", "content": prompt}], params)[0]
        wall += time.perf_counter() - start
        texts.append(out.text)
        tokens += len(out.token_ids)
        if out.metrics is not None:
            steps += out.metrics.num_drafts
            accepted += out.metrics.num_accepted_tokens
        if guided:
            check(out.text, schema, "spec-rs")
    ACCEPTANCE[guided] = (steps, accepted)
    return texts, tokens, wall


def run_llama(gguf: str, threads: int, grammars: list[str] | None) -> tuple[list[str], int, float] | None:
    python = peers.venv_python("llama")
    if not python.exists():
        print("llama.cpp skipped: run benches/e2e/run_benchmarks.py once to install its environment")
        return None
    job = {"gguf": gguf, "threads": threads, "cases": CASES, "max_tokens": MAX_TOKENS, "grammars": grammars}
    proc = subprocess.run(
        [str(python), "-c", LLAMA_WORKER], input=json.dumps(job), capture_output=True, text=True, timeout=1800
    )
    if proc.returncode != 0:
        raise SystemExit(f"llama.cpp worker failed: {proc.stderr[-2000:]}")
    results = json.loads(proc.stdout)
    for r, (_, schema) in zip(results, CASES, strict=True):
        check(r["text"], schema, "llama.cpp")
    return [r["text"] for r in results], sum(r["tokens"] for r in results), sum(r["wall"] for r in results)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=peers.nproc())
    parser.add_argument("--output", type=Path, default=REPO_ROOT / "docs" / "BENCHMARKS.md")
    parser.add_argument(
        "--constraint",
        choices=["schema", "grammar"],
        default="schema",
        help="give each system the JSON schema, or the same GBNF grammar llama.cpp's converter writes for it",
    )
    args = parser.parse_args()
    grammars = gbnf_grammars() if args.constraint == "grammar" else None

    from spec_rs import LLM, SpeculativeConfig
    from spec_rs.models import resolve_model

    plain = LLM(DEFAULT_MODEL, speculative_config=SpeculativeConfig())
    default = LLM(DEFAULT_MODEL)
    gguf = str(resolve_model(DEFAULT_MODEL))
    speeds: dict[str, list[float]] = {}
    tokens_per_run: dict[str, int] = {}
    samples: dict[str, str] = {}

    def record(name: str, result: tuple[list[str], int, float] | None) -> None:
        if result is None:
            return
        texts, tokens, wall = result
        speeds.setdefault(name, []).append(tokens / wall)
        tokens_per_run[name] = tokens
        samples.setdefault(name, texts[0])

    for rep in range(args.repeats):
        guided_plain = run_specrs(plain, guided=True, grammars=grammars)
        guided_spec = run_specrs(default, guided=True, grammars=grammars)
        if guided_plain[0] != guided_spec[0]:
            raise SystemExit("spec-rs: guided speculation changed the text")
        record("spec-rs plain, guided", guided_plain)
        record("spec-rs default, guided", guided_spec)
        record("spec-rs default, free", run_specrs(default, guided=False, grammars=None))
        record("llama.cpp, guided", run_llama(gguf, args.threads, grammars))
        print(
            f"repetition {rep + 1}/{args.repeats}: "
            + ", ".join(f"{k} {v[-1]:.1f}" for k, v in speeds.items())
        )

    base = statistics.median(speeds["spec-rs plain, guided"])
    llama = statistics.median(speeds["llama.cpp, guided"]) if "llama.cpp, guided" in speeds else None
    stamp = dt.datetime.now().strftime("%Y-%m-%d %H:%M")
    notes: list[str] = []
    kind = "GBNF grammars from JSON schemas" if grammars else "JSON schemas"
    lines = [
        f"\n## Structured outputs ({kind}): {stamp}\n",
        f"`python benches/e2e/structured_bench.py --repeats {args.repeats} --constraint {args.constraint}` "
        f"({args.threads} threads; {len(CASES)} guided chats, greedy, max_tokens {MAX_TOKENS}, "
        f"medians of {args.repeats}).\n",
        "| configuration | tokens per run | tok/s | x spec-rs plain guided | x llama.cpp guided |",
        "|---|---|---|---|---|",
    ]
    for guided, (steps, accepted) in ACCEPTANCE.items():
        if steps:
            label = "guided" if guided else "free"
            notes.append(f"default, {label}: acceptance length {1 + accepted / steps:.2f} over {steps} steps")
    for name, values in speeds.items():
        median = statistics.median(values)
        vs_llama = f"{median / llama:.2f}x" if llama else "n/a"
        lines.append(
            f"| {name} | {tokens_per_run[name]} | {median:.1f} | {median / base:.2f}x | {vs_llama} |"
        )
    lines.append("")
    lines.append("; ".join(notes) + ".")
    lines.append("")
    lines.append(f"First guided output (spec-rs): `{samples['spec-rs default, guided']}`")
    if "llama.cpp, guided" in samples:
        lines.append(f"First guided output (llama.cpp): `{samples['llama.cpp, guided']}`")
    section = "\n".join(lines) + "\n"
    print(section)
    with args.output.open("a") as f:
        f.write(section)


if __name__ == "__main__":
    sys.exit(main())
