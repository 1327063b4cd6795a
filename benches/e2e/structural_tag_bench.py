#!/usr/bin/env python3
"""What a structural tag costs: chat on the default model with and without a tool-call
structural tag (xgrammar's ``triggered_tags``: free text, and a ``<function=name>{...}
</function>`` call held to its tool's schema wherever the model writes the trigger), in one run.

Configurations (greedy, one request at a time, six prompts, ``max_tokens`` 128), each for
spec-rs plain (no drafter) and default (the shipped EAGLE-3 head):

* **free**: no constraint.
* **tagged**: the structural tag. The answers never write the trigger, so the text must equal
  the free text token for token (checked): the difference is the guide's cost per step (the
  mask of every position, drafts included, and a trie walk per new automaton state).
* **one call** (``at_least_one`` and ``stop_after_first``): the output is exactly one call,
  for the acceptance length of a forced call's arguments.

Configurations take turns on every repetition, so a slow stretch of the shared machine falls
on all of them. Tokens per second are completion tokens over wall time, medians over
repetitions. A dated Markdown section goes to docs/BENCHMARKS.md (or ``--output``).

    python benches/e2e/structural_tag_bench.py --repeats 5
"""

from __future__ import annotations

import argparse
import datetime as dt
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from run_benchmarks import DEFAULT_MODEL, REPO_ROOT

MAX_TOKENS = 128

PROMPTS = [
    "Explain how a rainbow forms.",
    "Write a short story about a lighthouse keeper.",
    "What are the benefits of regular exercise?",
    "Give me three tips for learning a new language.",
    "What is the weather usually like in Paris in spring?",
    "Describe how to make a cup of tea.",
]


def function_tag(name: str, parameters: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "tag",
        "begin": f"<function={name}>",
        "content": {"type": "json_schema", "json_schema": parameters},
        "end": "</function>",
    }


TOOLS = [
    function_tag(
        "get_weather",
        {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24}}, "required": ["city"]},
    ),
    function_tag(
        "get_time",
        {"type": "object", "properties": {"timezone": {"type": "string"}}, "required": ["timezone"]},
    ),
]
# The schema layout may pad the inside of the braces with one space.
CALL = re.compile(r'<function=(get_weather|get_time)>\{ ?"(city|timezone)": "[^"]*" ?\}</function>')


def structural_tag(one_call: bool) -> dict[str, Any]:
    return {
        "type": "structural_tag",
        "format": {
            "type": "triggered_tags",
            "triggers": ["<function="],
            "tags": TOOLS,
            "at_least_one": one_call,
            "stop_after_first": one_call,
        },
    }


def run(llm: Any, tag: dict[str, Any] | None) -> tuple[list[list[int]], int, float, int, int]:
    from spec_rs import SamplingParams, StructuredOutputsParams

    constraint = StructuredOutputsParams(structural_tag=tag) if tag else None
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, structured_outputs=constraint)
    outputs, tokens, wall, steps, accepted = [], 0, 0.0, 0, 0
    for prompt in PROMPTS:
        llm.reset_prefix_cache()
        start = time.perf_counter()
        out = llm.chat([{"role": "user", "content": prompt}], params)[0]
        wall += time.perf_counter() - start
        outputs.append(out.token_ids)
        tokens += len(out.token_ids)
        if tag and tag["format"]["at_least_one"] and not CALL.fullmatch(out.text):
            raise SystemExit(f"a forced call that is not one: {out.text!r}")
        if out.metrics is not None:
            steps += out.metrics.num_drafts
            accepted += out.metrics.num_accepted_tokens
    return outputs, tokens, wall, steps, accepted


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--output", type=Path, default=REPO_ROOT / "docs" / "BENCHMARKS.md")
    args = parser.parse_args()

    from spec_rs import LLM, SpeculativeConfig

    plain = LLM(DEFAULT_MODEL, speculative_config=SpeculativeConfig())
    engines = {"plain": plain, "default": LLM(DEFAULT_MODEL)}
    tags = {"free": None, "tagged": structural_tag(one_call=False), "one call": structural_tag(one_call=True)}
    speeds: dict[tuple[str, str], list[float]] = {}
    acceptance: dict[tuple[str, str], float] = {}
    tokens_per_run: dict[tuple[str, str], int] = {}
    for rep in range(args.repeats):
        for engine, llm in engines.items():
            texts: dict[str, list[list[int]]] = {}
            for label, tag in tags.items():
                outputs, tokens, wall, steps, accepted = run(llm, tag)
                texts[label] = outputs
                speeds.setdefault((engine, label), []).append(tokens / wall)
                tokens_per_run[(engine, label)] = tokens
                if steps:
                    acceptance[(engine, label)] = 1 + accepted / steps
            if texts["free"] != texts["tagged"]:
                raise SystemExit(f"{engine}: the structural tag changed an answer that never calls a tool")
        latest = ", ".join(f"{engine} {label} {v[-1]:.1f}" for (engine, label), v in speeds.items())
        print(f"repetition {rep + 1}/{args.repeats}: {latest}")

    stamp = dt.datetime.now().strftime("%Y-%m-%d %H:%M")
    lines = [
        f"\n## Structural tags (tool calls in free text): {stamp}\n",
        f"`python benches/e2e/structural_tag_bench.py --repeats {args.repeats}` ({len(PROMPTS)} chats, "
        f"greedy, max_tokens {MAX_TOKENS}, medians of {args.repeats}; tagged and free answers are the "
        "same tokens).\n",
        "| engine | constraint | tokens per run | tok/s | x the engine free | acceptance length |",
        "|---|---|---|---|---|---|",
    ]
    for (engine, label), values in speeds.items():
        median = statistics.median(values)
        free = statistics.median(speeds[(engine, "free")])
        al = f"{acceptance[(engine, label)]:.2f}" if (engine, label) in acceptance else "n/a"
        tokens = tokens_per_run[(engine, label)]
        lines.append(f"| {engine} | {label} | {tokens} | {median:.1f} | {median / free:.2f}x | {al} |")
    section = "\n".join(lines) + "\n"
    print(section)
    with args.output.open("a") as f:
        f.write(section)


if __name__ == "__main__":
    sys.exit(main())
