"""The EAGLE-3 head shipped for the default model: it is what `LLM()` and `spec-rs generate` run
when nothing speculative is asked for, it is lossless against plain decoding, it accepts most of
its drafts on prompts it was never trained on, prompt lookup in front of it accepts more, and
every explicit choice turns it off."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from conftest import TEST_KV_MEMORY, TEST_MAX_MODEL_LEN, reference_cases
from spec_rs import LLM, RequestOutput, SamplingParams, SpeculativeConfig, _spec_rs
from spec_rs.models import DEFAULT_MODEL

pytestmark = pytest.mark.timeout(300)

GREEDY = SamplingParams(temperature=0.0, max_tokens=48)
STATS = re.compile(r"drafts accepted (\d+)/(\d+) \(\d+%\), acceptance length ([\d.]+)")


@pytest.fixture(scope="module")
def shipped_llm(default_model_path: str) -> LLM:
    """The default model as a user gets it: no draft_model, no speculative_config."""
    return LLM(DEFAULT_MODEL, kv_cache_memory=TEST_KV_MEMORY, max_model_len=TEST_MAX_MODEL_LEN)


def shipped_head_llm(**speculative: Any) -> LLM:
    """The shipped head drafting 3 per step (no adaptive widths), with `speculative` added."""
    draft = _spec_rs.default_draft(DEFAULT_MODEL)
    assert draft is not None
    return LLM(
        DEFAULT_MODEL,
        draft_model=draft[0],
        speculative_config=SpeculativeConfig(
            speculative_method="eagle", num_speculative_tokens=3, **speculative
        ),
        kv_cache_memory=TEST_KV_MEMORY,
        max_model_len=TEST_MAX_MODEL_LEN,
    )


@pytest.fixture(scope="module")
def fixed_width_llm(default_model_path: str) -> LLM:
    """The shipped head verifying 3 drafts every step (no adaptive widths): its quality alone."""
    return shipped_head_llm()


def held_out_prompts() -> list[list[int]]:
    """The reference prompts (token ids), which `train-draft` keeps out of its training set."""
    return [case["input_ids"] for case in reference_cases()]


def test_default_model_without_a_config_runs_the_shipped_eagle3_head(shipped_llm: LLM) -> None:
    info = shipped_llm.info
    assert info["method"] == "eagle"
    assert info["num_speculative_tokens"] == 3
    assert shipped_llm.speculative_config.speculative_method == "eagle"
    draft = _spec_rs.default_draft(DEFAULT_MODEL)
    assert draft is not None
    path, spec_json = draft
    config = json.loads((Path(path) / "config.json").read_text())
    assert config["speculators_model_type"] == "eagle3"
    assert config["transformer_layer_config"]["hidden_size"] == 576
    assert json.loads(spec_json)["num_speculative_tokens"] == 3
    # The adaptive controller picks widths 1..3 or plain steps per batch size by default.
    assert json.loads(spec_json)["adaptive_speculative_widths"] == "all"
    assert shipped_llm.speculative_config.adaptive_speculative_widths == "all"
    # Prompt lookup drafts rows that repeat earlier text; the head drafts the rest.
    assert json.loads(spec_json)["enable_prompt_lookup"] is True
    # Each row's drafts stop where their running probability under the head drops below 20%.
    assert json.loads(spec_json)["draft_confidence_threshold"] == 0.2
    assert shipped_llm.speculative_config.draft_confidence_threshold == 0.2


def test_the_default_model_runs_penalised_requests_as_plain_decoding_does(
    shipped_llm: LLM, plain_llm: LLM
) -> None:
    # The user asked for no speculation, so nothing plain decoding runs may be refused: the
    # shipped config applies penalties at every draft position (logit_penalties).
    assert shipped_llm.speculative_config.logit_penalties
    prompt = [{"role": "user", "content": "List the days of the week, then list them again."}]
    for params in (
        SamplingParams(temperature=0.0, max_tokens=40, repetition_penalty=1.3),
        SamplingParams(temperature=0.0, max_tokens=40, presence_penalty=0.8, frequency_penalty=0.4),
    ):
        out = shipped_llm.chat(prompt, params)[0]
        assert out.token_ids == plain_llm.chat(prompt, params)[0].token_ids


def test_other_models_have_no_shipped_draft() -> None:
    assert _spec_rs.default_draft("/models/Qwen3-8B") is None


#: Mean acceptance length (K = 3, greedy) the shipped head measured on the held-out reference
#: prompts when it was shipped (crates/specrs-engine/drafters/README.md). A wiring fault (taps,
#: d2t, chaining) drops it to ~1.0.
SHIPPED_HEAD_REFERENCE_AL = 1.53


def test_shipped_head_is_lossless_and_accepted_on_held_out_prompts(
    shipped_llm: LLM, fixed_width_llm: LLM, plain_llm: LLM
) -> None:
    prompts = held_out_prompts()
    plain = plain_llm.generate(prompts, GREEDY)
    adaptive = shipped_llm.generate(prompts, GREEDY)
    assert [o.token_ids for o in adaptive] == [o.token_ids for o in plain]
    speculative = fixed_width_llm.generate(prompts, GREEDY)
    assert [o.token_ids for o in speculative] == [o.token_ids for o in plain]
    drafts = sum(o.metrics.num_drafts for o in speculative)
    accepted = sum(o.metrics.num_accepted_tokens for o in speculative)
    acceptance_length = 1 + accepted / drafts
    assert acceptance_length >= SHIPPED_HEAD_REFERENCE_AL - 0.1, (
        f"mean acceptance length {acceptance_length:.2f}"
    )
    # Acceptance falls with depth: each position accepts no more often than the one before.
    per_position = [sum(o.metrics.accepted_per_position[i] for o in speculative) for i in range(3)]
    assert per_position[0] >= per_position[1] >= per_position[2] > 0


def test_suffix_decoding_in_front_of_the_shipped_head_copies_repeated_requests(plain_llm: LLM) -> None:
    llm = shipped_head_llm(enable_suffix_decoding=True)
    assert llm.speculative_config.enable_suffix_decoding
    prompts = held_out_prompts()[:3]
    # Long answers: a copy grows with its match (at most as long as the match, spec factor 1).
    params = GREEDY.model_copy(update={"max_tokens": 96})
    plain = plain_llm.generate(prompts, params)
    first = llm.generate(prompts, params)
    again = llm.generate(prompts, params)
    for out in (first, again):
        assert [o.token_ids for o in out] == [o.token_ids for o in plain]

    def acceptance_length(outs: list[RequestOutput]) -> float:
        drafts = sum(o.metrics.num_drafts for o in outs if o.metrics)
        return 1 + sum(o.metrics.num_accepted_tokens for o in outs if o.metrics) / max(drafts, 1)

    # The first time the head drafts (as without suffix decoding); asked again, each answer
    # is copied from the first as far as the trees reach: past K = 3, so a step returns more
    # than the 4 tokens the head's drafts ever could (3 rows copy past K: a small batch).
    assert acceptance_length(first) >= SHIPPED_HEAD_REFERENCE_AL - 0.3
    assert acceptance_length(again) > 5.0, (acceptance_length(first), acceptance_length(again))


def test_prompt_lookup_in_front_of_the_shipped_head_is_lossless_and_accepts_more(
    fixed_width_llm: LLM, plain_llm: LLM
) -> None:
    lookup_llm = shipped_head_llm(enable_prompt_lookup=True)
    assert lookup_llm.speculative_config.enable_prompt_lookup
    prompts = held_out_prompts()
    # Long enough for the continuations to repeat spans (code, lists) of their own.
    params = GREEDY.model_copy(update={"max_tokens": 96})
    plain = plain_llm.generate(prompts, params)
    head_alone = fixed_width_llm.generate(prompts, params)
    with_lookup = lookup_llm.generate(prompts, params)
    assert [o.token_ids for o in with_lookup] == [o.token_ids for o in plain]

    def acceptance_length(outputs: list) -> float:
        drafts = sum(o.metrics.num_drafts for o in outputs)
        return 1 + sum(o.metrics.num_accepted_tokens for o in outputs) / drafts

    # Copying predicts the repeated spans better than the head (1.51 vs 1.45 on Q4_1 weights).
    assert acceptance_length(with_lookup) > acceptance_length(head_alone) + 0.03


def test_an_explicit_empty_config_means_plain_decoding(plain_llm: LLM) -> None:
    assert plain_llm.info["method"] is None
    assert plain_llm.speculative_config == SpeculativeConfig()


def test_an_explicit_method_replaces_the_shipped_draft(ngram_llm: LLM) -> None:
    assert ngram_llm.info["method"] == "ngram"


def _generate(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SPEC_RS_LOG": "warn", "NO_COLOR": "1"}
    cmd = [sys.executable, "-m", "spec_rs.cli", "generate", "--max-tokens", "24", *args, "Name three rivers."]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env, stdin=subprocess.DEVNULL)


def test_cli_generate_uses_the_shipped_draft_unless_told_not_to() -> None:
    shipped = _generate()
    assert shipped.returncode == 0, shipped.stderr
    stats = STATS.search(shipped.stderr)
    assert stats, shipped.stderr
    assert int(stats[2]) > 0 and float(stats[3]) > 1.0
    plain = _generate("--no-default-draft")
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout == shipped.stdout
    assert "drafts accepted" not in plain.stderr
