"""The end-to-end benchmark's bookkeeping (benches/e2e/run_benchmarks.py), without measuring
anything: systems taking turns repetition by repetition, the ratios that follow from it, and
the hypervisor's steal share in the machine line."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benches" / "e2e"))

import run_benchmarks as rb


def _runs(seconds: float, batch: int = 1) -> list[dict[str, Any]]:
    """One repetition's records of a system that generated 100 tokens in `seconds`."""
    return [{"repeat": 0, "set": "chat", "tokens": 100, "seconds": seconds, "batch": batch}]


def test_systems_take_turns_and_each_repetition_keeps_its_own_index(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    calls: list[tuple[str, int, str]] = []
    # The machine slows down by 2x per repetition; spec-rs stays 1.5x llama.cpp throughout.
    slowdown = {0: 1.0, 1: 2.0, 2: 4.0}

    def fake_specrs(args: argparse.Namespace, items: Any, prompts: Path, work: Path) -> Any:
        rep = sum(1 for c in calls if c[0] == "specrs")
        calls.append(("specrs", args.repeats, work.name))
        raw = {"plain": {"runs": _runs(1.0 * slowdown[rep])}}
        return rb.rows_from_runs("plain", "spec-rs", "plain", "auto", raw["plain"]["runs"], ["chat"]), raw

    def fake_peers(
        args: argparse.Namespace, gguf: str, items: Any, prompts: Path, work: Path, notes: Any
    ) -> Any:
        rep = sum(1 for c in calls if c[0] == "peers")
        calls.append(("peers", args.repeats, work.name))
        raw = {"llama": {"versions": {"llama_cpp": "0"}, "runs": _runs(1.5 * slowdown[rep])}}
        return rb.rows_from_runs("llama", "llama.cpp", "plain", "GGUF", raw["llama"]["runs"], ["chat"]), raw

    monkeypatch.setattr(rb, "run_specrs", fake_specrs)
    monkeypatch.setattr(rb, "run_peers", fake_peers)
    args = argparse.Namespace(repeats=3, systems=["specrs", "llama"])
    rows, raw = rb.run_interleaved(args, "model.gguf", [{"set": "chat"}], tmp_path / "p.json", tmp_path, [])

    assert calls == [(system, 1, f"repeat-{rep}") for rep in range(3) for system in ("specrs", "peers")], (
        "each repetition runs every system once, spec-rs first"
    )
    assert sorted(r["repeat"] for r in raw["llama"]["runs"]) == [0, 1, 2]
    plain, llama = rows
    assert plain.interleaved and llama.interleaved
    assert plain.tps == [100.0, 50.0, 25.0]
    # Per-repetition ratios: exactly 1.5 however the machine drifted between repetitions.
    assert rb.ratio(plain, llama) == pytest.approx(1.5)


def test_a_system_failing_in_any_repetition_reports_the_failure(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    reps = iter(range(2))

    def fake_specrs(args: argparse.Namespace, items: Any, prompts: Path, work: Path) -> Any:
        if next(reps) == 1:
            return rb.error_rows("plain", "spec-rs", "plain", "auto", ["chat"], "exit 1: boom"), {}
        raw = {"plain": {"runs": _runs(1.0)}}
        return rb.rows_from_runs("plain", "spec-rs", "plain", "auto", raw["plain"]["runs"], ["chat"]), raw

    monkeypatch.setattr(rb, "run_specrs", fake_specrs)
    args = argparse.Namespace(repeats=2, systems=["specrs"])
    rows, _ = rb.run_interleaved(args, "model.gguf", [{"set": "chat"}], tmp_path / "p.json", tmp_path, [])
    assert [r.error for r in rows] == ["exit 1: boom"], "no median from the repetitions that ran"


def test_rows_measured_apart_compare_by_their_medians() -> None:
    a = rb.Row("a", "spec-rs", "plain", "auto", "chat", tps=[100.0, 50.0, 90.0])
    b = rb.Row("b", "llama.cpp", "plain", "GGUF", "chat", tps=[60.0, 60.0, 60.0])
    assert rb.ratio(a, b) == pytest.approx(90.0 / 60.0)
    a.interleaved = b.interleaved = True
    assert rb.ratio(a, b) == pytest.approx(1.5)


def test_steal_share_is_the_stolen_part_of_all_cpu_time_between_two_readings() -> None:
    # user, nice, system, idle, iowait, irq, softirq, steal, guest, guest_nice
    start = [1000, 0, 100, 500, 0, 0, 0, 50, 0, 0]
    end = [1600, 0, 200, 700, 0, 0, 0, 150, 0, 0]
    assert rb.steal_share(start, end) == pytest.approx(100 / 1000)
    assert rb.steal_share(start, start) is None
    assert rb.steal_share(None, end) is None
    assert rb.steal_share(start[:4], end[:4]) is None
