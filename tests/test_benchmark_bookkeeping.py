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


def test_a_system_failing_the_same_way_every_repetition_reports_it_once(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def fake_peers(
        args: argparse.Namespace, gguf: str, items: Any, prompts: Path, work: Path, notes: Any
    ) -> Any:
        return rb.error_rows("hf-assisted", "HF", "assisted", "f32", ["chat", "quote"], rb.NO_ASSISTANT), {}

    monkeypatch.setattr(rb, "run_peers", fake_peers)
    args = argparse.Namespace(repeats=3, systems=["hf"])
    rows, _ = rb.run_interleaved(args, "model.gguf", [{"set": "chat"}], tmp_path / "p.json", tmp_path, [])
    assert [(r.prompt_set, r.error) for r in rows] == [("chat", rb.NO_ASSISTANT), ("quote", rb.NO_ASSISTANT)]


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


def test_each_round_of_a_batch_workload_is_a_sample_paired_with_plains_same_round() -> None:
    # Two repetitions of three rounds each; the machine's speed swings from round to round,
    # and speculation stays 1.1x plain in every round.
    swings = [1.0, 0.6, 1.3, 0.8, 1.0, 0.7]

    def runs(speedup: float) -> list[dict[str, Any]]:
        return [
            {
                "repeat": i // 3,
                "round": i % 3,
                "set": "chat",
                "batch": 32,
                "tokens": 3072,
                "seconds": 8.0 / (s * speedup),
            }
            for i, s in enumerate(swings)
        ]

    (plain,) = rb.rows_from_runs("plain", "spec-rs", "plain", "auto", runs(1.0), ["chat"])
    (spec,) = rb.rows_from_runs("eagle", "spec-rs", "EAGLE-3", "auto", runs(1.1), ["chat"])
    assert len(plain.tps) == len(swings), "one sample per round, not one per repetition"
    assert rb.ratio(spec, plain) == pytest.approx(1.1)


def test_the_worker_runs_batch_workloads_in_rounds_taking_turns(monkeypatch: pytest.MonkeyPatch) -> None:
    import spec_rs

    calls: list[tuple[str, int]] = []

    class FakeLLM:
        def __init__(self, model: str, draft: Any, speculative_config: Any, **kwargs: Any) -> None:
            self.name = "spec" if speculative_config.speculative_method else "plain"
            self.info: dict[str, Any] = {}

        def chat(self, conversations: list[Any], params: Any) -> list[Any]:
            calls.append((self.name, len(conversations)))
            return [argparse.Namespace(token_ids=[1, 2], metrics=None, error=None) for _ in conversations]

        def reset_prefix_cache(self) -> bool:
            calls.append((self.name, "reset"))
            return True

    monkeypatch.setattr(spec_rs, "LLM", FakeLLM)
    jobs = [
        rb.SpecJob("plain", "plain", "auto", {}, None, (1, 4)),
        rb.SpecJob("spec", "spec", "auto", {"speculative_method": "ngram"}, None, (1, 4)),
    ]
    items = [{"id": "chat-0", "set": "chat", "messages": [{"role": "user", "content": "hi"}]}]
    result = rb.specrs_worker(jobs, items, max_tokens=2, repeats=2, batch_rounds=3)
    # Every timed call starts from an empty prefix cache: its prompts are computed in full.
    timed = [i for i, (_, n) in enumerate(calls) if n != "reset" and i > 1]
    assert all(calls[i - 1] == (calls[i][0], "reset") for i in timed)
    batch_calls = [name for name, n in calls if n == 4]
    assert len(batch_calls) == 2 * 3 * 2, "2 repetitions x 3 rounds x 2 configurations"
    assert all(set(batch_calls[i : i + 2]) == {"plain", "spec"} for i in range(0, len(batch_calls), 2)), (
        "every round runs each configuration once, in turn"
    )
    rounds = [(r["repeat"], r["round"]) for r in result["plain"]["runs"] if r["batch"] == 4]
    assert rounds == [(rep, rnd) for rep in range(2) for rnd in range(3)]
    single = [r for r in result["plain"]["runs"] if r["batch"] == 1]
    assert [r["round"] for r in single] == [0, 0], "a single-stream prompt runs once per repetition"


def test_extra_configurations_run_beside_the_built_in_ones_and_compare_with_plain() -> None:
    args = rb.build_parser().parse_args(
        [
            "--specrs-configs",
            "plain",
            "--specrs-extra",
            'cut0.1={"speculative_method": "eagle", "num_speculative_tokens": 3, '
            '"draft_confidence_threshold": 0.1}',
            "--specrs-extra",
            'ngram2={"speculative_method": "ngram", "num_speculative_tokens": 2}',
        ]
    )
    jobs = {job.key: job for job in rb.specrs_jobs(args)}
    assert list(jobs) == ["plain", "cut0.1", "ngram2"]
    # EAGLE drafts with the shipped head; n-gram needs no draft model.
    assert jobs["cut0.1"].draft == str(args.eagle_draft)
    assert jobs["cut0.1"].speculative == {
        "speculative_method": "eagle",
        "num_speculative_tokens": 3,
        "draft_confidence_threshold": 0.1,
    }
    assert jobs["ngram2"].draft is None and jobs["ngram2"].batches == (1,)
    # Their speedup is measured against spec-rs plain, paired repetition by repetition.
    plain = rb.Row("plain", "spec-rs", "plain", "auto", "chat", tps=[100.0, 50.0])
    extra = rb.Row("cut0.1", "spec-rs", jobs["cut0.1"].method, "auto", "chat", tps=[130.0, 65.0])
    assert rb.own_plain_of(extra) == "plain"
    assert rb.ratio(extra, plain) == pytest.approx(1.3)
    assert rb.own_plain_of(rb.Row("llama", "llama.cpp", "plain", "GGUF", "chat")) is None


@pytest.mark.parametrize(
    ("value", "complaint"),
    [
        ('{"speculative_method": "eagle"}', "NAME=JSON"),
        ('Cut={"speculative_method": "eagle"}', "lower-case NAME"),
        ('plain={"speculative_method": "eagle"}', "built-in configuration"),
        ("cut={speculative_method: eagle}", "not JSON"),
        ("cut=[3]", "JSON object of SpeculativeConfig fields"),
    ],
)
def test_a_malformed_extra_configuration_is_refused_with_what_to_write(value: str, complaint: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=complaint):
        rb.parse_extra_config(value)


def test_an_extra_configuration_spec_rs_refuses_stops_the_run_before_it_starts(
    capsys: pytest.CaptureFixture[str],
) -> None:
    bad = '--specrs-extra=cut={"speculative_method": "eagle", "draft_confidence_threshold": 1.5}'
    with pytest.raises(SystemExit) as exit_info:
        rb.main(["--systems", "specrs", "--specrs-configs", "plain", bad, "--dry-run"])
    assert exit_info.value.code == 2
    assert "draft_confidence_threshold must be >= 0.0 and < 1.0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        rb.main(["--specrs-configs", "eagle", '--specrs-extra=c={"speculative_method": "eagle"}'])
    assert "add plain to --specrs-configs" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        rb.main(["--specrs-configs", "plain", '--specrs-extra=d={"speculative_method": "dflash"}'])
    assert "dflash needs its own" in capsys.readouterr().err
