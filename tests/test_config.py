"""SpeculativeConfig: the shared case table, pydantic model behaviour, YAML files, the
verify-width schedule, the adaptive width controller and the generated CLI flags."""

from __future__ import annotations

import json
import types
import typing
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from spec_rs import ConfigError, SpeculativeConfig, VerifyWidthRange, _spec_rs

CASES = json.loads((Path(__file__).parent / "data" / "speculative_config_cases.json").read_text())
CONSTRUCTION_CASES = CASES["construction"]
PIPELINE_CASES = CASES["pipeline"]

FILE_FIELDS = {"config_file", "section_name"}


def blamed_fields(err: ValidationError) -> set[str]:
    """Fields a ValidationError blames: pydantic's own location, or the field a Rust rule named."""
    fields = set()
    for detail in err.errors():
        if detail["loc"]:
            fields.add(str(detail["loc"][0]))
        cause = detail.get("ctx", {}).get("error")
        if isinstance(cause, ConfigError) and cause.field is not None:
            fields.add(cause.field)
    return fields


# --- the shared case table (also run by `cargo test -p specrs-core --test config_cases`) ---


@pytest.mark.parametrize("case", CONSTRUCTION_CASES, ids=[c["name"] for c in CONSTRUCTION_CASES])
def test_construction_case_table(case: dict[str, Any]) -> None:
    if "expect" in case:
        dumped = SpeculativeConfig(**case["input"]).model_dump(mode="json")
        for field, expected in case["expect"].items():
            assert dumped[field] == expected, field
    else:
        with pytest.raises(ValidationError) as excinfo:
            SpeculativeConfig(**case["input"])
        assert case["error"]["contains"] in str(excinfo.value)
        assert case["error"]["field"] in blamed_fields(excinfo.value)


@pytest.mark.parametrize("case", PIPELINE_CASES, ids=[c["name"] for c in PIPELINE_CASES])
def test_pipeline_combination_case_table(case: dict[str, Any]) -> None:
    config = SpeculativeConfig(**case["input"])
    if case["contains"] is None:
        config.check_pipeline_combinations()
    else:
        with pytest.raises(ConfigError, match=case["contains"]):
            config.check_pipeline_combinations()


# --- model behaviour ---


def test_assignment_after_construction_raises() -> None:
    config = SpeculativeConfig(speculative_method="eagle")
    with pytest.raises(ValidationError, match="frozen"):
        config.num_speculative_tokens = 4
    assert config.num_speculative_tokens == 2


def test_unknown_fields_are_rejected_and_known_ones_accepted() -> None:
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        SpeculativeConfig(num_draft_tokens=3)
    assert SpeculativeConfig(num_speculative_tokens=3).num_speculative_tokens == 3


def test_string_values_are_coerced() -> None:
    config = SpeculativeConfig(
        speculative_method="EAGLE",
        num_speculative_tokens="3",
        use_greedy_acceptance="true",
        relaxed_delta="0.5",
        draft_proposal=" Argmax ",
    )
    assert config.speculative_method == "eagle"
    assert config.num_speculative_tokens == 3
    assert config.use_greedy_acceptance is True
    assert config.relaxed_delta == 0.5
    assert config.draft_proposal == "argmax"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("num_speculative_tokens", "three"),
        ("use_greedy_acceptance", "maybe"),
        ("speculative_method", "EAGLE3"),
    ],
)
def test_strings_that_do_not_coerce_are_rejected(field: str, value: str) -> None:
    with pytest.raises(ValidationError) as excinfo:
        SpeculativeConfig(**{field: value})
    assert field in blamed_fields(excinfo.value)


@pytest.mark.parametrize(
    "field", ["synthetic_acceptance_rate", "relaxed_delta", "suffix_decoding_min_score_ratio"]
)
@pytest.mark.parametrize("value", [float("nan"), float("inf"), "inf"])
def test_non_finite_floats_are_refused_naming_the_field(field: str, value: float | str) -> None:
    # JSON has no NaN or infinity; serialised for the rules, they would read as unset.
    with pytest.raises(ValidationError, match="finite number") as excinfo:
        SpeculativeConfig(speculative_method="ngram", **{field: value})
    assert field in blamed_fields(excinfo.value)


@pytest.mark.parametrize(
    "schedule",
    [
        '[{"batch_start": 9, "batch_end": 64, "num_tokens": 1},'
        ' {"batch_start": 1, "batch_end": 8, "num_tokens": 3}]',
        "[[9, 64, 1], [1, 8, 3]]",
        [(9, 64, 1), (1, 8, 3)],
        [
            {"batch_start": 9, "batch_end": 64, "num_tokens": 1},
            VerifyWidthRange(batch_start=1, batch_end=8, num_tokens=3),
        ],
    ],
    ids=["json_string_of_mappings", "json_string_of_triples", "triples", "mixed_mapping_and_model"],
)
def test_schedule_accepts_every_spelling_and_is_sorted(schedule: Any) -> None:
    config = SpeculativeConfig(
        speculative_method="eagle", num_speculative_tokens=3, num_speculative_tokens_per_batch_size=schedule
    )
    assert config.verify_width_schedule == [(1, 8, 3), (9, 64, 1)]


def test_schedule_entry_that_is_not_a_triple_is_rejected() -> None:
    with pytest.raises(ValidationError, match="triple"):
        SpeculativeConfig(num_speculative_tokens_per_batch_size=[(1, 8)])


def test_equality_and_hash_are_structural() -> None:
    a = SpeculativeConfig(
        speculative_method="eagle", num_speculative_tokens_per_batch_size=[(5, 8, 1), (1, 4, 2)]
    )
    b = SpeculativeConfig(
        speculative_method="EAGLE",
        num_speculative_tokens=2,
        num_speculative_tokens_per_batch_size="[[1, 4, 2], [5, 8, 1]]",
    )
    different = SpeculativeConfig(speculative_method="eagle", num_speculative_tokens=3)
    assert a == b
    assert hash(a) == hash(b)
    assert len({a, b, different}) == 2
    assert a != different
    assert a != a.model_dump()


def test_dump_round_trips() -> None:
    config = SpeculativeConfig(
        speculative_method="dspark",
        num_speculative_tokens=7,
        num_speculative_tokens_per_batch_size=[(1, 16, 7), (17, 256, 3)],
        synthetic_acceptance_rate=0.25,
        draft_probs_layout="replica",
    )
    dumped = config.model_dump()
    assert not FILE_FIELDS & dumped.keys()
    assert SpeculativeConfig(**dumped) == config
    assert SpeculativeConfig.model_validate_json(config.model_dump_json()) == config
    assert json.loads(config.model_dump_json()) == config.model_dump(mode="json")


def test_draft_width_is_the_resolved_width() -> None:
    assert SpeculativeConfig(speculative_method="mtp").draft_width == 2
    assert SpeculativeConfig(speculative_method="dflash", num_speculative_tokens=15).draft_width == 15


@pytest.mark.parametrize("method", ["dflash", "dflash2", "dspark"])
def test_draft_width_of_an_unresolved_block_drafter_raises(method: str) -> None:
    config = SpeculativeConfig(speculative_method=method)
    with pytest.raises(AttributeError, match="not resolved yet"):
        _ = config.draft_width


def test_verify_width_schedule_is_none_when_unset() -> None:
    assert SpeculativeConfig(speculative_method="eagle").verify_width_schedule is None


METHOD_PREDICATES = {
    "is_enabled": {"eagle", "mtp", "dflash", "dflash2", "dspark", "ngram", "suffix"},
    "is_block_draft": {"dflash", "dflash2", "dspark"},
    "is_dflash": {"dflash", "dflash2"},
    "is_dflash2": {"dflash2"},
    "is_dspark": {"dspark"},
    "is_eagle": {"eagle"},
    "is_mtp": {"mtp"},
    "is_ngram": {"ngram"},
    "is_suffix": {"suffix"},
}


@pytest.mark.parametrize("method", [None, "eagle", "mtp", "dflash", "dflash2", "dspark", "ngram", "suffix"])
@pytest.mark.parametrize("predicate", sorted(METHOD_PREDICATES))
def test_method_predicates(method: str | None, predicate: str) -> None:
    config = SpeculativeConfig(speculative_method=method)
    assert getattr(config, predicate)() is (method in METHOD_PREDICATES[predicate])


@pytest.mark.parametrize(
    ("settings", "rule"),
    [
        ({}, "stochastic"),
        ({"draft_proposal": "sampled"}, "stochastic"),
        ({"use_relaxed_acceptance_for_thinking": True}, "stochastic"),
        ({"use_greedy_acceptance": True}, "greedy"),
        ({"synthetic_acceptance_rate": 0.5}, "synthetic"),
        ({"synthetic_acceptance_rate": 0.5, "use_greedy_acceptance": True}, "synthetic"),
    ],
)
def test_acceptance_rule_precedence(settings: dict[str, Any], rule: str) -> None:
    assert SpeculativeConfig(speculative_method="eagle", **settings).acceptance_rule() == rule


def test_adaptive_widths_parse_against_the_draft_width() -> None:
    assert SpeculativeConfig(speculative_method="eagle").adaptive_widths() is None
    listed = SpeculativeConfig(
        speculative_method="eagle", num_speculative_tokens=5, adaptive_speculative_widths="5, 1,3"
    )
    assert listed.adaptive_widths() == [1, 3, 5]
    every = SpeculativeConfig(
        speculative_method="eagle", num_speculative_tokens=3, adaptive_speculative_widths="all"
    )
    assert every.adaptive_widths() == [1, 2, 3]


def test_adaptive_widths_of_a_block_drafter_wait_for_the_checkpoint_width() -> None:
    config = SpeculativeConfig(speculative_method="dflash", adaptive_speculative_widths="1,15")
    with pytest.raises(AttributeError, match="not resolved yet"):
        config.adaptive_widths()
    assert config.with_width(16).adaptive_widths() == [1, 15]


def test_with_width_resolves_a_copy_and_revalidates() -> None:
    config = SpeculativeConfig(speculative_method="dflash", adaptive_speculative_widths="1,15")
    resolved = config.with_width(16)
    assert resolved.draft_width == 16
    assert resolved.adaptive_speculative_widths == "1,15"
    assert config.num_speculative_tokens is None
    with pytest.raises(ValidationError, match=r"Verify widths \[15\] are outside 1..8"):
        config.with_width(8)
    with pytest.raises(ValidationError, match="must be between 1 and 1048576, got 0"):
        config.with_width(0)


# --- YAML config files ---


def write_yaml(tmp_path: Path, text: str) -> str:
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    return str(path)


SECTIONED_FILE = """\
speculative:
  speculative_method: eagle
  num_speculative_tokens: 3
  relaxed_topk: 5
  num_speculative_tokens_per_batch_size: [[1, 8, 3], [9, 64, 1]]
serving:
  port: 8000
"""


def test_config_file_section_is_the_base_and_explicit_values_override_it(tmp_path: Path) -> None:
    path = write_yaml(tmp_path, SECTIONED_FILE)
    config = SpeculativeConfig(
        config_file=path,
        section_name="speculative",
        num_speculative_tokens=4,
        num_speculative_tokens_per_batch_size=[(1, 64, 2)],
    )
    assert config.speculative_method == "eagle"
    assert config.relaxed_topk == 5
    assert config.num_speculative_tokens == 4
    assert config.verify_width_schedule == [(1, 64, 2)]
    assert config.config_file == path
    assert config == SpeculativeConfig(
        speculative_method="eagle",
        num_speculative_tokens=4,
        relaxed_topk=5,
        num_speculative_tokens_per_batch_size=[(1, 64, 2)],
    )


def test_config_file_without_section_reads_the_root(tmp_path: Path) -> None:
    path = write_yaml(tmp_path, "speculative_method: dspark\nnum_speculative_tokens: 7\n")
    assert SpeculativeConfig(config_file=path).draft_width == 7


def test_config_file_values_are_validated_like_arguments(tmp_path: Path) -> None:
    path = write_yaml(tmp_path, "speculative_method: eagle\nsynthetic_acceptance_rate: 1.5\n")
    with pytest.raises(ValidationError, match=r"must be between 0\.0 and 1\.0, got 1\.5"):
        SpeculativeConfig(config_file=path)


@pytest.mark.parametrize(
    ("settings", "field"),
    [
        (
            {
                "speculative_method": "eagle",
                "num_speculative_tokens": 1 << 40,
                "adaptive_speculative_widths": "all",
            },
            "num_speculative_tokens",
        ),
        (
            {"speculative_method": "suffix", "suffix_decoding_max_tree_depth": 1 << 40},
            "suffix_decoding_max_tree_depth",
        ),
    ],
)
def test_widths_past_any_context_are_refused_before_they_are_expanded(
    settings: dict[str, Any], field: str
) -> None:
    # "all" used to expand into 2**40 widths (an abort); trees that deep, a capacity panic.
    with pytest.raises(ValidationError, match=f"{field} must be between 1 and 1048576"):
        SpeculativeConfig(**settings)


def test_config_file_infinities_are_refused_naming_the_key(tmp_path: Path) -> None:
    path = write_yaml(tmp_path, "speculative_method: ngram\nsynthetic_acceptance_rate: .inf\n")
    with pytest.raises(ValidationError, match=r"'synthetic_acceptance_rate' in config file .* is inf"):
        SpeculativeConfig(config_file=path)


def test_section_name_without_a_config_file_is_refused() -> None:
    with pytest.raises(ValidationError, match="section_name names a section of config_file"):
        SpeculativeConfig(section_name="speculative")


def test_missing_config_file_raises_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="not found"):
        SpeculativeConfig(config_file=str(tmp_path / "absent.yaml"))


def test_missing_section_raises_key_error_listing_the_sections(tmp_path: Path) -> None:
    path = write_yaml(tmp_path, SECTIONED_FILE)
    with pytest.raises(KeyError, match="sections present: speculative, serving"):
        SpeculativeConfig(config_file=path, section_name="speculation")


def test_config_file_whose_root_is_not_a_mapping_raises_type_error(tmp_path: Path) -> None:
    path = write_yaml(tmp_path, "- eagle\n- 3\n")
    with pytest.raises(TypeError, match="must contain a mapping at its root, found a list"):
        SpeculativeConfig(config_file=path)


# --- the verify-width schedule's dense lookup ---


def test_schedule_lookup_carries_gaps_and_tail_forward_and_caps_at_the_width() -> None:
    # Entry b is the width at decode batch size b; entry 0 is unused.
    widths_from_batch_size_1 = _spec_rs.schedule_lookup([(8, 8, 9), (1, 2, 3), (5, 6, 0)], 10, 4)[1:]
    # batch size:                     1  2  3  4  5  6  7  8  9  10
    assert widths_from_batch_size_1 == [3, 3, 3, 3, 0, 0, 0, 4, 4, 4]


def test_schedule_lookup_rejects_an_invalid_schedule() -> None:
    with pytest.raises(ConfigError, match="must start at batch size 1"):
        _spec_rs.schedule_lookup([(2, 8, 1)], 8, 4)
    with pytest.raises(ConfigError, match="must not overlap"):
        _spec_rs.schedule_lookup([(1, 8, 1), (8, 9, 2)], 8, 4)


# --- the adaptive width controller, on simulated traffic ---

BATCH_SIZE = 64
WIDTHS = [1, 2, 3, 4, 5, 6]
#: Each probe moves the deep positions' estimate a fifth of the way (ema_alpha=0.2).
PROBES_TO_RECOVER = 6


def step_time(width: int) -> float:
    """A verify step costs a fixed part plus a part growing with the width."""
    return 1.0 + 0.3 * width


def tokens_per_second(acceptance: float, width: int) -> float:
    """Expected tokens per row per second when each draft is accepted with ``acceptance``
    given the previous one was."""
    return sum(acceptance**k for k in range(width + 1)) / step_time(width)


def best_width(acceptance: float) -> int:
    return max(WIDTHS, key=lambda w: tokens_per_second(acceptance, w))


def run_traffic(controller: Any, acceptance: float, steps: int) -> list[int]:
    """Runs decode steps at the controller's widths; returns its chosen width after each."""
    chosen = []
    for _ in range(steps):
        width = controller.next_step_width(BATCH_SIZE)
        accepted = [round(BATCH_SIZE * acceptance ** (k + 1)) for k in range(width)]
        controller.record_step(BATCH_SIZE, width, accepted, BATCH_SIZE, step_time(width))
        chosen.append(controller.chosen_width(BATCH_SIZE))
    return chosen


def settled_after(chosen: list[int], width: int) -> int:
    """The number of steps after which ``chosen`` stays at ``width`` to the end."""
    assert chosen[-1] == width, f"ended at {chosen[-1]}, expected {width}"
    return len(chosen) - next(i for i, w in enumerate(reversed(chosen)) if w != width)


def test_scenario_traffic_has_a_distinct_best_width() -> None:
    # Guards the scenarios below: each must make the controller move.
    assert best_width(0.8) == 3
    assert best_width(0.3) == 1


def test_controller_converges_to_the_throughput_best_width() -> None:
    controller = _spec_rs.AdaptiveWidthController(WIDTHS, margin=0.0)
    chosen = run_traffic(controller, acceptance=0.8, steps=300)
    assert settled_after(chosen, best_width(0.8)) <= 30


def test_controller_narrows_when_acceptance_collapses_and_widens_when_it_recovers() -> None:
    controller = _spec_rs.AdaptiveWidthController(WIDTHS, margin=0.0)
    run_traffic(controller, acceptance=0.8, steps=300)
    collapsed = run_traffic(controller, acceptance=0.3, steps=300)
    assert settled_after(collapsed, best_width(0.3)) <= 10
    recovered = run_traffic(controller, acceptance=0.8, steps=600)
    # Narrow steps cannot see deep positions recover; the probe every 50 steps does.
    assert settled_after(recovered, best_width(0.8)) <= PROBES_TO_RECOVER * 50


@pytest.mark.parametrize(("probe_interval", "recovers"), [(50, True), (100_000, False)])
def test_controller_sees_deep_positions_recover_only_through_probes(
    probe_interval: int, recovers: bool
) -> None:
    controller = _spec_rs.AdaptiveWidthController(WIDTHS, margin=0.0, probe_interval=probe_interval)
    run_traffic(controller, acceptance=0.8, steps=300)
    # Near-zero acceptance teaches the controller that deep drafts never continue.
    assert run_traffic(controller, acceptance=0.05, steps=300)[-1] == 1
    recovered = run_traffic(controller, acceptance=0.8, steps=600)
    if recovers:
        assert settled_after(recovered, best_width(0.8)) <= PROBES_TO_RECOVER * 50
    else:
        assert set(recovered) == {1}


def test_controller_keeps_its_width_when_the_best_beats_it_by_less_than_the_margin() -> None:
    # At acceptance 0.73 width 2 beats width 3 by 1.3%: less than the default 2% margin.
    assert tokens_per_second(0.73, 3) < tokens_per_second(0.73, 2) < tokens_per_second(0.73, 3) * 1.02
    kept = _spec_rs.AdaptiveWidthController(WIDTHS)
    assert run_traffic(kept, acceptance=0.8, steps=300)[-1] == 3
    assert set(run_traffic(kept, acceptance=0.73, steps=300)) == {3}
    # Without the margin the same traffic moves it.
    moved = _spec_rs.AdaptiveWidthController(WIDTHS, margin=0.0)
    assert run_traffic(moved, acceptance=0.8, steps=300)[-1] == 3
    assert settled_after(run_traffic(moved, acceptance=0.73, steps=300), 2) <= 30


def test_controller_probes_the_widest_width_every_50_steps() -> None:
    controller = _spec_rs.AdaptiveWidthController(WIDTHS, margin=0.0)
    run_traffic(controller, acceptance=0.3, steps=100)
    assert controller.chosen_width(BATCH_SIZE) == 1
    widths = [controller.next_step_width(BATCH_SIZE) for _ in range(200)]
    probes = [i for i, w in enumerate(widths, start=101) if w == max(WIDTHS)]
    assert probes == [150, 200, 250, 300]
    assert {w for w in widths if w != max(WIDTHS)} == {1}


def test_controller_rejects_empty_and_zero_widths() -> None:
    with pytest.raises(ConfigError, match="at least one width"):
        _spec_rs.AdaptiveWidthController([])
    with pytest.raises(ConfigError, match=">= 1"):
        _spec_rs.AdaptiveWidthController([0, 2])
    assert _spec_rs.AdaptiveWidthController([3, 1, 3]).widths == [1, 3]


# --- the generated command-line flags ---


def expected_flag_kind(annotation: Any) -> tuple[str, list[str] | None]:
    """How a field of this type is spelled on the command line: (kind, choices)."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        (annotation,) = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) is typing.Literal:
        return "choice", list(typing.get_args(annotation))
    if typing.get_origin(annotation) is list:
        return "json", None
    return {bool: "bool", int: "int", float: "float", str: "str"}[annotation], None


def test_speculative_flags_cover_exactly_the_model_fields() -> None:
    flags = {flag["field"]: flag for flag in _spec_rs.speculative_flags()}
    model_fields = {
        name: info for name, info in SpeculativeConfig.model_fields.items() if name not in FILE_FIELDS
    }
    assert list(flags) == list(model_fields)
    for name, info in model_fields.items():
        flag = flags[name]
        kebab = name.replace("_", "-")
        assert flag["flag"] == f"--{kebab}"
        assert (flag["kind"], flag["choices"]) == expected_flag_kind(info.annotation), name
        assert flag["negated_flag"] == (f"--no-{kebab}" if flag["kind"] == "bool" else None)
        assert flag["help"], name
