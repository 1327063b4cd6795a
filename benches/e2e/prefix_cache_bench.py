#!/usr/bin/env python3
"""What prefix caching saves: the default model with its shipped EAGLE-3 drafter, prefix
caching on and off, side by side in one process (the two engines take turns on every
workload, so a slow stretch of the shared machine falls on both alike).

Workloads (greedy unless said otherwise; the prefix cache is reset before each repetition,
so the first request of each starts cold):

* **multi-turn chat**: a four-turn conversation, each turn streamed; per turn the time to the
  first streamed token (TTFT) and the turn's wall time. From turn 2 on, the earlier turns
  are a cached prefix.
* **shared system prompt, batch 8**: eight chats with the same long system prompt and their
  own questions in one call, cold (nothing cached: the first prefills, the others wait a step
  and adopt its blocks) and warm (the system prompt cached by an earlier request, as on a
  server that has been running).
* **n = 4 samples** of one long prompt (temperature 0.8, seeded): the choices after the first
  adopt the prompt the first computed.

The greedy texts of both engines must be equal (the script fails otherwise). A dated Markdown
section goes to docs/BENCHMARKS.md (or ``--output``).

    python benches/e2e/prefix_cache_bench.py --repeats 5
    python benches/e2e/prefix_cache_bench.py --repeats 1 --output /tmp/p.md   # a quick look
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import run_benchmarks
from run_benchmarks import DEFAULT_MODEL, REPO_ROOT

SYSTEM_PROMPT = (
    "You are a patient assistant for a public library. Readers ask about books, opening hours, "
    "borrowing rules and research help. Answer in plain English, in at most three sentences, "
    "and never invent facts: when you do not know, say so and suggest asking a librarian at the "
    "front desk. The library opens from nine in the morning to eight in the evening on weekdays "
    "and from ten to four on Saturdays; it is closed on Sundays and public holidays. Readers may "
    "borrow up to twelve items for three weeks and renew them twice online unless someone else "
    "has reserved them. Late returns cost twenty cents a day per item, capped at five euros. "
    "The reading room on the second floor is silent; group study rooms on the first floor can "
    "be booked for two hours at a time. Printing costs ten cents a page in black and white and "
    "fifty cents in colour. Wireless internet is free: the network is called Library-Guest and "
    "needs no password. Children under twelve must be accompanied in the adult sections."
)
QUESTIONS = [
    "Can I borrow fifteen books at once?",
    "When are you open on Saturday?",
    "How much does it cost to print ten colour pages?",
    "What is the wireless network called?",
    "Can I bring my eight-year-old to the reading room alone?",
    "How long can I keep a book if I renew it twice?",
    "Where can my study group meet?",
    "What happens if I return a book a week late?",
]
TURNS = [
    "Plan a three-day trip to Lisbon for someone who likes museums and food.",
    "Which of those museums should I book in advance?",
    "Suggest a cheaper alternative for the second day's dinner.",
    "Summarise the whole plan in five bullet points.",
]


def system_chat(question: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": question}]


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def multi_turn(llm: Any, max_tokens: int) -> list[dict[str, Any]]:
    """Streams each turn of a conversation: per turn TTFT, wall seconds, prompt and cached tokens."""
    from spec_rs import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    conversation: list[dict[str, str]] = []
    turns = []
    for question in TURNS:
        conversation.append({"role": "user", "content": question})
        start = time.perf_counter()
        first_token = None
        text, last = "", None
        for delta in llm.stream(conversation, params):
            if first_token is None and delta.text:
                first_token = time.perf_counter() - start
            text += delta.text
            last = delta
        assert last is not None
        turns.append(
            {
                "ttft": first_token if first_token is not None else time.perf_counter() - start,
                "seconds": time.perf_counter() - start,
                "prompt_tokens": last.num_prompt_tokens,
                "cached_tokens": last.num_cached_tokens or 0,
                "text": text,
            }
        )
        conversation.append({"role": "assistant", "content": text})
    return turns


def shared_system_batch(llm: Any, max_tokens: int, warm: bool) -> dict[str, Any]:
    from spec_rs import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    if warm:
        llm.chat(system_chat("Hello."), params.model_copy(update={"max_tokens": 2}))
    seconds, outs = timed(lambda: llm.chat([system_chat(q) for q in QUESTIONS], params))
    return {
        "seconds": seconds,
        "tokens": sum(len(o.token_ids) for o in outs),
        "prompt_tokens": sum(o.num_prompt_tokens for o in outs),
        "cached_tokens": sum(o.num_cached_tokens or 0 for o in outs),
        "texts": [o.text for o in outs],
    }


def n_samples(llm: Any, max_tokens: int) -> dict[str, Any]:
    from spec_rs import SamplingParams

    params = SamplingParams(n=4, temperature=0.8, seed=7, max_tokens=max_tokens)
    seconds, outs = timed(lambda: llm.chat(system_chat(QUESTIONS[0]), params))
    return {
        "seconds": seconds,
        "tokens": sum(len(c.token_ids) for c in outs[0].outputs),
        "prompt_tokens": outs[0].num_prompt_tokens,
        "texts": [c.text for c in outs[0].outputs],
    }


def run(repeats: int, max_tokens: int) -> dict[str, Any]:
    from spec_rs import LLM

    engines = {
        "on": LLM(DEFAULT_MODEL, max_model_len=2048, enable_prefix_caching=True),
        "off": LLM(DEFAULT_MODEL, max_model_len=2048, enable_prefix_caching=False),
    }
    results: dict[str, dict[str, list[Any]]] = {k: {} for k in engines}
    workloads: dict[str, Callable[[Any], Any]] = {
        "multi_turn": lambda llm: multi_turn(llm, max_tokens),
        "batch_cold": lambda llm: shared_system_batch(llm, max_tokens // 2, warm=False),
        "batch_warm": lambda llm: shared_system_batch(llm, max_tokens // 2, warm=True),
        "n4": lambda llm: n_samples(llm, max_tokens // 2),
    }
    for llm in engines.values():
        llm.chat([{"role": "user", "content": "Say hello."}])  # untimed warm-up
    for rep in range(repeats):
        order = list(engines) if rep % 2 == 0 else list(reversed(engines))
        for name, workload in workloads.items():
            for key in order:
                engines[key].reset_prefix_cache()
                results[key].setdefault(name, []).append(workload(engines[key]))
    for name in ("multi_turn", "batch_cold", "batch_warm"):
        for on, off in zip(results["on"][name], results["off"][name], strict=True):
            texts = (
                ([t["text"] for t in on], [t["text"] for t in off])
                if name == "multi_turn"
                else (on["texts"], off["texts"])
            )
            if texts[0] != texts[1]:
                sys.exit(f"{name}: prefix caching changed the greedy text")
    return results


def report(results: dict[str, Any], repeats: int, command: str) -> str:
    on, off = results["on"], results["off"]
    med = statistics.median
    facts = run_benchmarks.machine_facts()

    def turn_median(runs: list[list[dict[str, Any]]], turn: int, field: str) -> float:
        return med(r[turn][field] for r in runs)

    lines = [
        f"## Prefix caching: {dt.datetime.now().strftime('%Y-%m-%d %H:%M')}",
        "",
        f"Command: `{command}`. Default model with its shipped EAGLE-3 drafter (prompt lookup "
        f"in front), prefix caching on and off in one process, taking turns; {repeats} "
        f"repetitions, medians; greedy texts equal with and without caching. {facts['cpu']}, "
        f"{facts['nproc']} cores, commit {facts['commit']}.",
        "",
        "| Multi-turn chat | prompt tokens | cached (on) | TTFT off | TTFT on | turn s off | turn s on |",
        "|---|---|---|---|---|---|---|",
    ]
    for t in range(len(TURNS)):
        on_turns, off_turns = on["multi_turn"], off["multi_turn"]
        lines.append(
            f"| turn {t + 1} | {turn_median(on_turns, t, 'prompt_tokens'):.0f} "
            f"| {turn_median(on_turns, t, 'cached_tokens'):.0f} "
            f"| {turn_median(off_turns, t, 'ttft') * 1e3:.0f} ms "
            f"| {turn_median(on_turns, t, 'ttft') * 1e3:.0f} ms "
            f"| {turn_median(off_turns, t, 'seconds'):.2f} | {turn_median(on_turns, t, 'seconds'):.2f} |"
        )
    lines += [
        "",
        "| Workload | prompt tokens | cached (on) | s off | s on | off / on |",
        "|---|---|---|---|---|---|",
    ]
    for name, label in (
        ("batch_cold", f"8 chats, shared {len(SYSTEM_PROMPT.split())}-word system prompt, cold"),
        ("batch_warm", "the same, system prompt cached by an earlier request"),
        ("n4", "n = 4 samples of one system-prompt chat"),
    ):
        s_off, s_on = med(r["seconds"] for r in off[name]), med(r["seconds"] for r in on[name])
        cached = med(r.get("cached_tokens", 0) for r in on[name])
        lines.append(
            f"| {label} | {med(r['prompt_tokens'] for r in on[name]):.0f} | "
            f"{cached if name != 'n4' else 'choices 1-3'} | {s_off:.2f} | {s_on:.2f} | {s_off / s_on:.2f}x |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--output", type=Path, default=REPO_ROOT / "docs" / "BENCHMARKS.md")
    args = parser.parse_args(argv)
    given = argv if argv is not None else sys.argv[1:]
    command = " ".join(["python benches/e2e/prefix_cache_bench.py", *given])
    results = run(args.repeats, args.max_tokens)
    section = report(results, args.repeats, command)
    with args.output.open("a") as f:
        f.write("\n" + section)
    print(section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
