"""The offline API on the default model: exactness against transformers, batch invariance,
lossless speculation and its metrics, draft traces, streaming and cancellation, stop rules,
seeded sampling, errors, and the resolved pipeline."""

from __future__ import annotations

import itertools
import json
import re
import time
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from pydantic import ValidationError

from conftest import IM_END, ONE_WEATHER_CALL, ONE_WEATHER_CALL_RE, make_llm, reference_cases
from spec_rs import (
    LLM,
    ConfigError,
    GuidedDecodingParams,
    ModelLoadError,
    ModelNotInstalledError,
    RequestError,
    RequestOutput,
    SamplingParams,
    SpecDecodeMetrics,
    SpecRsError,
    SpeculativeConfig,
    StructuredOutputsParams,
    _spec_rs,
)

pytestmark = pytest.mark.timeout(180)

REFERENCE = reference_cases()
GREEDY = SamplingParams(temperature=0.0, max_tokens=48)

#: Chat prompts for the speculative tests: four reference prompts plus two whose answers
#: repeat text, so the n-gram drafter both hits and misses.
SPEC_PROMPTS = [c["prompt"] for c in REFERENCE[:4]] + [
    "Repeat the following sentence three times: The quick brown fox jumps over the lazy dog.",
    "List the numbers from 1 to 20, separated by commas.",
]


def user(content: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": content}]


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """Index of the first differing token (or the shorter length), None when equal."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def wait_for_free_kv(llm: LLM, timeout: float = 5.0) -> tuple[int, int]:
    deadline = time.monotonic() + timeout
    free, total = llm.kv_blocks()
    while free != total and time.monotonic() < deadline:
        time.sleep(0.02)
        free, total = llm.kv_blocks()
    return free, total


def abort_count(llm: LLM) -> float:
    m = re.search(
        r'^specrs_request_success_total\{finished_reason="abort"\} (\S+)$', llm.metrics_text(), re.M
    )
    assert m, "the abort counter is missing from the metrics"
    return float(m.group(1))


def assert_metrics_consistent(m: SpecDecodeMetrics | None, width: int) -> None:
    """The invariants every request's speculative statistics satisfy."""
    assert m is not None
    assert 0 <= m.num_accepted_tokens <= m.num_draft_tokens <= width * m.num_drafts
    per_pos = m.accepted_per_position
    assert len(per_pos) <= width
    assert all(a >= b for a, b in itertools.pairwise(per_pos)), f"not monotone: {per_pos}"
    assert sum(per_pos) == m.num_accepted_tokens
    assert not per_pos or per_pos[0] <= m.num_drafts
    if m.num_drafts:
        assert m.acceptance_length == pytest.approx(1 + m.num_accepted_tokens / m.num_drafts)
    assert m.latency > 0


def assert_trace_matches_output(out: RequestOutput, *, greedy: bool) -> None:
    """Every traced step committed drafted[:n] + [target[n]]; under greedy acceptance the
    accepted drafts are also the target's argmax."""
    assert out.trace, "no verify step was traced"
    positions = [s.position for s in out.trace]
    assert positions == sorted(set(positions)), "trace positions must increase"
    for step in out.trace:
        n = step.num_accepted
        assert len(step.target) == len(step.drafted) + 1
        assert 0 <= n <= len(step.drafted)
        if greedy:
            assert step.drafted[:n] == step.target[:n], step
        at = step.position - out.num_prompt_tokens
        expected = [*step.drafted[:n], step.target[n]]
        committed = out.token_ids[at : at + n + 1]
        # A stop or max_tokens inside the window cuts what was committed.
        assert committed == expected[: len(committed)], step
        assert len(committed) == n + 1 or at + len(committed) == len(out.token_ids), step


# --- fixtures ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def f32_llm(default_model_path: str) -> LLM:
    return make_llm(dtype="f32")


@pytest.fixture(scope="module")
def f32_ngram_llm(default_model_path: str) -> LLM:
    return make_llm(SpeculativeConfig(speculative_method="ngram", num_speculative_tokens=3), dtype="f32")


@pytest.fixture(scope="module")
def synthetic_llm(default_model_path: str) -> LLM:
    return make_llm(
        SpeculativeConfig(speculative_method="ngram", num_speculative_tokens=3, synthetic_acceptance_rate=0.7)
    )


@pytest.fixture(scope="module")
def plain_alone(plain_llm: LLM) -> list[RequestOutput]:
    """Plain greedy outputs of SPEC_PROMPTS, each generated on its own (batch size 1)."""
    return [plain_llm.chat(user(p), GREEDY)[0] for p in SPEC_PROMPTS]


# --- exactness against transformers (f32) ------------------------------------------------


def test_f32_greedy_generate_reproduces_transformers_token_ids(f32_llm: LLM) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=96)
    outs = f32_llm.generate([c["input_ids"] for c in REFERENCE], params)
    assert len(outs) == len(REFERENCE)
    for case, out in zip(REFERENCE, outs, strict=True):
        assert out.num_prompt_tokens == len(case["input_ids"])
        assert out.token_ids == case["greedy_ids"], (
            case["prompt"],
            first_divergence(out.token_ids, case["greedy_ids"]),
        )
        stopped = case["greedy_ids"][-1] == IM_END
        assert out.finish_reason == ("stop" if stopped else "length")
        # The reference text was decoded with special tokens; ours skips them.
        assert out.text == case["greedy_text"].removesuffix("<|im_end|>")


def test_f32_chat_applies_the_chat_template_in_rust_and_matches_transformers(f32_llm: LLM) -> None:
    for case in REFERENCE:
        rendered = f32_llm.apply_chat_template(user(case["prompt"]))
        assert f32_llm.tokenize(rendered) == case["input_ids"]
    outs = f32_llm.chat(
        [user(c["prompt"]) for c in REFERENCE], SamplingParams(temperature=0.0, max_tokens=96)
    )
    for case, out in zip(REFERENCE, outs, strict=True):
        assert out.num_prompt_tokens == len(case["input_ids"])
        assert out.token_ids == case["greedy_ids"], case["prompt"]


# --- batch invariance --------------------------------------------------------------------


def test_batched_generation_of_different_length_prompts_equals_each_prompt_alone(plain_llm: LLM) -> None:
    prompts: list[Any] = [
        "Hi",
        "The three primary colors are",
        REFERENCE[0]["input_ids"],
        "Explain, step by step and in plain words, how a bicycle stays upright while it is moving forward.",
    ]
    params = SamplingParams(temperature=0.0, max_tokens=32)
    batched = plain_llm.generate(prompts, params)
    alone = [plain_llm.generate([p], params)[0] for p in prompts]
    lengths = {o.num_prompt_tokens for o in batched}
    assert len(lengths) == len(prompts), "the prompts must differ in length"
    for i, (b, a) in enumerate(zip(batched, alone, strict=True)):
        assert b.token_ids == a.token_ids, (
            f"prompt {i}: first divergence at {first_divergence(b.token_ids, a.token_ids)}"
        )
        assert b.text == a.text
        assert b.finish_reason == a.finish_reason


# --- speculative decoding ------------------------------------------------------------------


def test_ngram_speculation_is_lossless_under_greedy_and_reports_consistent_metrics(
    ngram_llm: LLM, plain_alone: list[RequestOutput]
) -> None:
    drafts = accepted = 0
    for prompt, plain in zip(SPEC_PROMPTS, plain_alone, strict=True):
        out = ngram_llm.chat(user(prompt), GREEDY)[0]
        assert out.token_ids == plain.token_ids, (prompt, first_divergence(out.token_ids, plain.token_ids))
        assert out.text == plain.text
        assert out.finish_reason == plain.finish_reason
        assert_metrics_consistent(out.metrics, width=3)
        assert out.metrics is not None
        drafts += out.metrics.num_drafts
        accepted += out.metrics.num_accepted_tokens
    assert drafts > 0 and accepted > 0, (
        "the n-gram drafter never drafted or never hit: the test proves nothing"
    )


def test_ngram_speculation_in_a_batch_equals_plain_greedy_in_f32(f32_llm: LLM, f32_ngram_llm: LLM) -> None:
    # f32 isolates speculation from the quantized kernels (see the batch-invariance test).
    prompts = [user(p) for p in SPEC_PROMPTS]
    plain = f32_llm.chat(prompts, GREEDY)
    outs = f32_ngram_llm.chat(prompts, GREEDY)
    for prompt, out, ref in zip(SPEC_PROMPTS, outs, plain, strict=True):
        assert out.token_ids == ref.token_ids, (prompt, first_divergence(out.token_ids, ref.token_ids))
        assert_metrics_consistent(out.metrics, width=3)
    assert sum(o.metrics.num_accepted_tokens for o in outs if o.metrics) > 0


@pytest.fixture(scope="module")
def suffix_llm(default_model_path: str) -> LLM:
    """Suffix decoding with vLLM's defaults (24-token trees, drafts up to 24)."""
    return make_llm(SpeculativeConfig(speculative_method="suffix"))


def test_suffix_decoding_is_lossless_under_greedy_and_reports_its_pipeline(
    suffix_llm: LLM, plain_alone: list[RequestOutput]
) -> None:
    info = suffix_llm.info
    assert info["pipeline_class"] == "SuffixPipeline" == type(suffix_llm.pipeline).__name__
    assert (info["method"], info["num_speculative_tokens"]) == ("suffix", 24)
    drafts = accepted = 0
    for prompt, plain in zip(SPEC_PROMPTS, plain_alone, strict=True):
        out = suffix_llm.chat(user(prompt), GREEDY)[0]
        assert out.token_ids == plain.token_ids, (prompt, first_divergence(out.token_ids, plain.token_ids))
        assert_metrics_consistent(out.metrics, width=24)
        assert out.metrics is not None
        drafts += out.metrics.num_drafts
        accepted += out.metrics.num_accepted_tokens
    assert drafts > 0 and accepted > 0, "suffix decoding never drafted or never hit: the test proves nothing"


def test_suffix_decoding_accepts_more_each_time_a_request_is_repeated(default_model_path: str) -> None:
    # vLLM's check of the method: the same request, asked again, is drafted from the earlier
    # answers kept in the shared tree, and its acceptance climbs above 80%.
    llm = make_llm(SpeculativeConfig(speculative_method="suffix", num_speculative_tokens=16))
    prompt = user(REFERENCE[1]["prompt"])
    runs = [llm.chat(prompt, GREEDY)[0] for _ in range(3)]
    assert all(r.token_ids == runs[0].token_ids for r in runs)
    rates = []
    for r in runs:
        assert r.metrics is not None
        assert_metrics_consistent(r.metrics, width=16)
        rates.append(r.metrics.num_accepted_tokens / max(r.metrics.num_draft_tokens, 1))
    assert rates[0] < rates[1], rates
    assert rates[2] > 0.8, rates
    assert runs[2].metrics is not None and runs[2].metrics.acceptance_length > 4.0, runs[2].metrics
    # reset_suffix_cache forgets the earlier answers: the next repeat drafts as the first did.
    assert llm.reset_suffix_cache() == 3
    assert llm.reset_suffix_cache() == 0, "nothing left to forget"
    cold = llm.chat(prompt, GREEDY)[0]
    assert cold.token_ids == runs[0].token_ids and cold.metrics is not None and runs[0].metrics is not None
    assert (cold.metrics.num_draft_tokens, cold.metrics.num_accepted_tokens) == (
        runs[0].metrics.num_draft_tokens,
        runs[0].metrics.num_accepted_tokens,
    )
    # Without the shared tree, a repeat drafts only from its own text, as the first run did.
    alone = make_llm(
        SpeculativeConfig(
            speculative_method="suffix", num_speculative_tokens=16, suffix_decoding_max_cached_requests=0
        )
    )
    first, again = (alone.chat(prompt, GREEDY)[0] for _ in range(2))
    assert first.metrics is not None and again.metrics is not None
    assert again.metrics.num_accepted_tokens == first.metrics.num_accepted_tokens
    assert again.metrics.acceptance_length < runs[2].metrics.acceptance_length


def test_captured_decode_steps_generate_what_the_ragged_engine_does(f32_llm: LLM) -> None:
    # On CPU, device_graph_capture runs decode steps on the captured (padded) shapes eagerly;
    # on CUDA the same shapes are replayed graphs. Either way the text must not change.
    prompts = [user(p) for p in SPEC_PROMPTS]
    captured = make_llm(dtype="f32", device_graph_capture=True, max_num_seqs=8, max_model_len=512)
    outs = captured.chat(prompts, GREEDY)
    for prompt, out, ref in zip(SPEC_PROMPTS, outs, f32_llm.chat(prompts, GREEDY), strict=True):
        assert out.token_ids == ref.token_ids, (prompt, first_divergence(out.token_ids, ref.token_ids))
    m = re.search(r"^specrs_engine_captured_steps_total (\S+)$", captured.metrics_text(), re.M)
    assert m and float(m.group(1)) >= GREEDY.max_tokens - 1, "decode steps did not run on captured shapes"


def test_contexts_past_max_seq_len_to_capture_run_uncaptured_with_the_same_text(f32_llm: LLM) -> None:
    # The chat template alone is longer than 16 tokens, so under a 16-key cap every decode
    # step runs the ragged forward: nothing is captured, and the text stays the same.
    prompts = [user(p) for p in SPEC_PROMPTS[:2]]
    capped = make_llm(
        dtype="f32", device_graph_capture=True, max_seq_len_to_capture=16, max_num_seqs=4, max_model_len=512
    )
    for out, ref in zip(capped.chat(prompts, GREEDY), f32_llm.chat(prompts, GREEDY), strict=True):
        assert out.token_ids == ref.token_ids
    m = re.search(r"^specrs_engine_captured_steps_total (\S+)$", capped.metrics_text(), re.M)
    assert m and float(m.group(1)) == 0.0, m


def test_two_data_parallel_replicas_give_each_request_the_text_one_engine_gives(f32_llm: LLM) -> None:
    # One replica per listed device (two logical CPUs here): the batch is split between them,
    # and each request's text must be what one engine writes for it, plainly and with the
    # shipped draft head (on device 0, drafting for both replicas).
    prompts = [user(p) for p in SPEC_PROMPTS]
    reference = f32_llm.chat(prompts, GREEDY)
    plain = make_llm(dtype="f32", device=["cpu", "cpu"], max_num_seqs=4, max_model_len=512)
    drafted = LLM(dtype="f32", device="cpu,cpu", max_num_seqs=4, max_model_len=512, kv_cache_memory=64 << 20)
    assert plain.info["num_replicas"] == drafted.info["num_replicas"] == 2
    assert drafted.info["method"] == "eagle"
    for llm in (plain, drafted):
        for prompt, out, ref in zip(SPEC_PROMPTS, llm.chat(prompts, GREEDY), reference, strict=True):
            assert out.token_ids == ref.token_ids, (prompt, first_divergence(out.token_ids, ref.token_ids))
        free, total = wait_for_free_kv(llm)
        assert free == total, "every replica's KV blocks return to its pool"
    for devices, message in [
        ("cuda:0,cuda:0", "cuda:0 is listed twice"),
        ("tpu", "unknown device 'tpu'"),
        (["cpu", "cuda:0"], "all run on CUDA or all on the CPU"),
    ]:
        with pytest.raises(ConfigError, match=message) as excinfo:
            make_llm(device=devices)
        assert excinfo.value.field == "device"


def test_synthetic_acceptance_hits_the_configured_rate_and_emits_target_argmax(
    synthetic_llm: LLM, plain_alone: list[RequestOutput]
) -> None:
    """Synthetic acceptance accepts drafts by a calibrated coin, not by the logits: recovered
    and bonus tokens are the target argmax, so the output equals plain greedy until the first
    accepted draft the target would not have chosen (after that it is not a faithful decode)."""
    draft_tokens = accepted = 0
    seeded = GREEDY.model_copy(update={"seed": 0})  # fixes the acceptance coin flips
    for prompt, plain in zip(SPEC_PROMPTS, plain_alone, strict=True):
        out = synthetic_llm.chat(user(prompt), seeded, trace=True)[0]
        assert_metrics_consistent(out.metrics, width=3)
        assert out.metrics is not None
        draft_tokens += out.metrics.num_draft_tokens
        accepted += out.metrics.num_accepted_tokens
        if not out.trace:
            assert out.token_ids == plain.token_ids
            continue
        assert_trace_matches_output(out, greedy=False)
        wrong = [s for s in out.trace if s.drafted[: s.num_accepted] != s.target[: s.num_accepted]]
        exact_until = len(out.token_ids)
        if wrong:
            s = wrong[0]
            first_bad = next(i for i in range(s.num_accepted) if s.drafted[i] != s.target[i])
            exact_until = s.position - out.num_prompt_tokens + first_bad
        assert out.token_ids[:exact_until] == plain.token_ids[:exact_until], prompt
    assert draft_tokens >= 30, f"too few drafts ({draft_tokens}) to measure the rate"
    rate = accepted / draft_tokens
    assert 0.45 <= rate <= 0.95, (
        f"synthetic rate 0.7 configured, measured {rate:.2f} over {draft_tokens} drafts"
    )


def test_trace_steps_agree_with_committed_tokens_and_are_deterministic(ngram_llm: LLM) -> None:
    for prompt in SPEC_PROMPTS[4:]:
        first = ngram_llm.chat(user(prompt), GREEDY, trace=True)[0]
        second = ngram_llm.chat(user(prompt), GREEDY, trace=True)[0]
        untraced = ngram_llm.chat(user(prompt), GREEDY)[0]
        assert_trace_matches_output(first, greedy=True)
        assert first.trace == second.trace
        assert first.token_ids == second.token_ids == untraced.token_ids
        assert untraced.trace == []
        assert first.metrics is not None
        assert len(first.trace) == first.metrics.num_drafts
        assert sum(s.num_accepted for s in first.trace) == first.metrics.num_accepted_tokens
        assert sum(len(s.drafted) for s in first.trace) == first.metrics.num_draft_tokens


# --- streaming ---------------------------------------------------------------------------------


def test_stream_deltas_concatenate_to_the_generated_output(ngram_llm: LLM) -> None:
    prompt = user(SPEC_PROMPTS[5])
    whole = ngram_llm.chat(prompt, GREEDY)[0]
    deltas = list(ngram_llm.stream(prompt, GREEDY))
    assert len(deltas) > 1
    assert "".join(d.text for d in deltas) == whole.text
    assert [t for d in deltas for t in d.token_ids] == whole.token_ids
    *partial, last = deltas
    assert all(d.finish_reason is None and d.metrics is None for d in partial)
    assert last.finish_reason == whole.finish_reason
    assert last.metrics is not None
    assert last.metrics.num_drafts == whole.metrics.num_drafts  # type: ignore[union-attr]
    assert last.metrics.time_to_first_token is not None and last.metrics.time_to_first_token > 0


def test_breaking_out_of_a_stream_cancels_the_request_and_frees_its_kv_blocks(plain_llm: LLM) -> None:
    aborted_before = abort_count(plain_llm)
    # 1500 tokens take far longer than the 5 s allowed below: freeing means cancelling.
    params = SamplingParams(temperature=0.0, max_tokens=1500, ignore_eos=True)
    received = 0
    for delta in plain_llm.stream("Once upon a time", params):
        received += len(delta.token_ids)
        if received >= 3:
            break
    free, total = wait_for_free_kv(plain_llm)
    assert free == total
    assert abort_count(plain_llm) == aborted_before + 1
    # The engine keeps serving.
    assert (
        plain_llm.generate("Hello", SamplingParams(temperature=0.0, max_tokens=4))[0].finish_reason
        == "length"
    )


# --- stop rules ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def base_output(plain_llm: LLM) -> RequestOutput:
    out = plain_llm.generate("The capital of France is", SamplingParams(temperature=0.0, max_tokens=40))[0]
    assert len(out.token_ids) >= 12
    return out


def test_stop_string_truncates_before_it_and_finishes_with_stop(
    plain_llm: LLM, base_output: RequestOutput
) -> None:
    words = re.findall(r"[A-Za-z]{4,}", base_output.text)
    stop = words[1] if len(words) > 1 else words[0]
    params = SamplingParams(temperature=0.0, max_tokens=40, stop=[stop, "@@never@@"])
    out = plain_llm.generate("The capital of France is", params)[0]
    assert out.finish_reason == "stop"
    assert out.outputs[0].stop_reason == stop, "vLLM's stop_reason names the string"
    assert base_output.outputs[0].stop_reason is None
    assert stop not in out.text
    assert out.text == base_output.text[: base_output.text.index(stop)]
    streamed = list(plain_llm.stream("The capital of France is", params))
    assert all(stop not in d.text for d in streamed)
    assert "".join(d.text for d in streamed) == out.text
    assert streamed[-1].outputs[0].stop_reason == stop


def test_stop_token_ids_end_the_output_at_that_token(plain_llm: LLM, base_output: RequestOutput) -> None:
    k = next(
        i
        for i in range(3, len(base_output.token_ids))
        if base_output.token_ids[i] not in base_output.token_ids[:i]
    )
    stop_id = base_output.token_ids[k]
    out = plain_llm.generate(
        "The capital of France is", SamplingParams(temperature=0.0, max_tokens=40, stop_token_ids=[stop_id])
    )[0]
    assert out.finish_reason == "stop"
    assert out.outputs[0].stop_reason == stop_id
    assert out.token_ids == base_output.token_ids[: k + 1]
    # The stop token's own text is not emitted.
    assert out.text == plain_llm.detokenize(base_output.token_ids[:k])


def test_max_tokens_cuts_the_output_with_finish_reason_length(
    plain_llm: LLM, base_output: RequestOutput
) -> None:
    out = plain_llm.generate("The capital of France is", SamplingParams(temperature=0.0, max_tokens=5))[0]
    assert out.finish_reason == "length"
    assert out.token_ids == base_output.token_ids[:5]


def test_ignore_eos_generates_past_the_end_of_turn(plain_llm: LLM) -> None:
    prompt = user(REFERENCE[2]["prompt"])  # a short answer that ends with <|im_end|>
    stopped = plain_llm.chat(prompt, SamplingParams(temperature=0.0, max_tokens=64))[0]
    assert stopped.finish_reason == "stop" and stopped.token_ids[-1] == IM_END
    n = len(stopped.token_ids)
    out = plain_llm.chat(prompt, SamplingParams(temperature=0.0, max_tokens=n + 8, ignore_eos=True))[0]
    assert out.finish_reason == "length"
    assert len(out.token_ids) == n + 8
    assert out.token_ids[:n] == stopped.token_ids


# --- seeded sampling -------------------------------------------------------------------------


def test_seeded_sampling_is_reproducible_and_independent_of_batch_composition(f32_llm: LLM) -> None:
    params = SamplingParams(temperature=0.8, seed=1234, max_tokens=24, ignore_eos=True)
    prompt = user("Write a haiku about the sea.")
    alone = f32_llm.chat(prompt, params)[0]
    again = f32_llm.chat(prompt, params)[0]
    assert len(alone.token_ids) == 24
    assert alone.token_ids == again.token_ids
    batch = f32_llm.chat(
        [user("Tell me a joke."), prompt, user("Name three rivers in Europe and one in Asia.")], params
    )
    assert batch[1].token_ids == alone.token_ids
    other_seed = f32_llm.chat(prompt, params.model_copy(update={"seed": 4321}))[0]
    assert other_seed.token_ids != alone.token_ids, "the seed must change the sample"


def test_n_choices_are_independent_samples_and_choice_zero_is_the_single_choice_sample(
    ngram_llm: LLM,
) -> None:
    prompt = user("Write a haiku about the sea.")
    params = SamplingParams(temperature=0.8, seed=1234, max_tokens=16, n=3)
    out = ngram_llm.chat(prompt, params)[0]
    assert [o.index for o in out.outputs] == [0, 1, 2]
    assert len({tuple(o.token_ids) for o in out.outputs}) == 3, "three different samples"
    single = ngram_llm.chat(prompt, params.model_copy(update={"n": 1}))[0]
    assert out.outputs[0].token_ids == single.token_ids
    assert (out.text, out.token_ids) == (out.outputs[0].text, out.outputs[0].token_ids)
    again = ngram_llm.chat(prompt, params)[0]
    assert [o.token_ids for o in again.outputs] == [o.token_ids for o in out.outputs]
    # The request's statistics sum its choices'.
    parts = [o.metrics for o in out.outputs]
    assert all(m is not None for m in parts)
    assert out.metrics is not None
    assert out.metrics.num_draft_tokens == sum(m.num_draft_tokens for m in parts if m)
    assert out.metrics.num_accepted_tokens == sum(m.num_accepted_tokens for m in parts if m)
    assert_metrics_consistent(out.metrics, width=3)
    # In a batch, each prompt keeps its own choices.
    batch = ngram_llm.chat([user("Tell me a joke."), prompt], [params.model_copy(update={"n": 2}), params])
    assert [len(b.outputs) for b in batch] == [2, 3]
    assert [o.token_ids for o in batch[1].outputs] == [o.token_ids for o in out.outputs]


def test_a_streamed_request_with_n_choices_yields_each_choices_deltas_and_ends_once(ngram_llm: LLM) -> None:
    params = SamplingParams(temperature=0.8, seed=3, max_tokens=12, n=2)
    prompt = user("Name a colour.")
    want = ngram_llm.chat(prompt, params)[0]
    deltas = list(ngram_llm.stream(prompt, params))
    assert [d.finished for d in deltas].count(True) == 1 and deltas[-1].finished
    for choice in want.outputs:
        mine = [d.outputs[0] for d in deltas if d.outputs[0].index == choice.index]
        assert "".join(d.text for d in mine) == choice.text
        assert [d.finish_reason for d in mine if d.finish_reason] == [choice.finish_reason]
    assert wait_for_free_kv(ngram_llm)[0] == ngram_llm.kv_blocks()[1]


def test_seeded_sampling_with_speculation_is_reproducible(ngram_llm: LLM) -> None:
    params = SamplingParams(temperature=0.8, seed=7, max_tokens=32)
    prompt = user(SPEC_PROMPTS[5])
    a = ngram_llm.chat(prompt, params)[0]
    b = ngram_llm.chat(prompt, params)[0]
    assert a.token_ids == b.token_ids
    assert_metrics_consistent(a.metrics, width=3)


# --- errors ------------------------------------------------------------------------------------


@pytest.mark.parametrize("model", ["no-such-model-alias", "/nonexistent/dir/model.gguf"])
def test_unknown_model_fails_with_a_message_naming_it(model: str) -> None:
    with pytest.raises((ModelNotInstalledError, ModelLoadError, RequestError)) as excinfo:
        LLM(model)
    assert model in str(excinfo.value)


@pytest.fixture(scope="module")
def short_llm(default_model_path: str) -> LLM:
    return make_llm(max_model_len=64, kv_cache_memory=32 << 20)


def test_prompt_longer_than_max_model_len_raises_request_error(short_llm: LLM) -> None:
    with pytest.raises(RequestError, match=r"context holds 64") as excinfo:
        short_llm.generate("word " * 100, SamplingParams(max_tokens=4))
    assert "prompt" in str(excinfo.value)
    assert short_llm.info["max_model_len"] == 64
    assert (
        short_llm.generate("Hi", SamplingParams(temperature=0.0, max_tokens=2))[0].finish_reason == "length"
    )
    assert wait_for_free_kv(short_llm)[0] == short_llm.kv_blocks()[1]


BAD_SAMPLING = [
    ("logit_bias", {5: 101.0}),
    ("prompt_logprobs", 21),
    ("temperature", -1.0),
    ("top_p", 0.0),
    ("max_tokens", 0),
    ("min_p", 1.5),
    ("presence_penalty", 3.0),
    ("stop", [""]),
    ("n", 0),
    ("allowed_token_ids", []),
    ("truncate_prompt_tokens", 0),
]


def test_greedy_requests_take_one_choice() -> None:
    with pytest.raises(ValidationError, match="n must be 1 when decoding greedily"):
        SamplingParams(temperature=0.0, n=2)


@pytest.mark.parametrize(("field", "value"), BAD_SAMPLING)
def test_invalid_sampling_params_fail_when_built_naming_the_field(field: str, value: Any) -> None:
    with pytest.raises(ValidationError) as excinfo:
        SamplingParams(**{field: value})
    assert field in str(excinfo.value)


@pytest.mark.parametrize("field", ["temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_floats_fail_when_built_naming_the_field(field: str, value: float) -> None:
    # JSON cannot carry NaN or infinity to the engine's rules: pydantic refuses them first.
    with pytest.raises(ValidationError, match="finite number") as excinfo:
        SamplingParams(**{field: value})
    assert field in str(excinfo.value)


@pytest.mark.parametrize("field", ["max_tokens", "min_tokens", "logprobs", "seed"])
def test_negative_counts_fail_when_built(field: str) -> None:
    with pytest.raises(ValidationError, match=field):
        SamplingParams(**{field: -1})


@pytest.mark.parametrize(("field", "value"), BAD_SAMPLING)
def test_the_engine_refuses_invalid_sampling_params_that_skipped_validation(
    short_llm: LLM, field: str, value: Any
) -> None:
    # `model_construct` skips pydantic's validators: the engine checks every request itself.
    params = SamplingParams.model_construct(**{**SamplingParams().model_dump(), field: value})
    with pytest.raises(SpecRsError) as excinfo:
        short_llm.generate("Hi", params)
    assert isinstance(excinfo.value, ValueError)
    assert getattr(excinfo.value, "field", None) == field
    assert field in str(excinfo.value)


@pytest.mark.parametrize(
    "prompts", [5, None, [1.5], ["ok", 7], [["a"]]], ids=["int", "none", "floats", "mixed", "nested-str"]
)
def test_generate_refuses_what_is_not_a_prompt_naming_its_type(short_llm: LLM, prompts: Any) -> None:
    with pytest.raises(TypeError, match="prompt"):
        short_llm.generate(prompts)


def test_vllm_prompt_dicts_generate_what_text_and_token_ids_do(short_llm: LLM) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=4)
    ids = short_llm.tokenize("The sky is")
    by_text = short_llm.generate("The sky is", params)[0]
    outs = short_llm.generate([{"prompt": "The sky is"}, {"prompt_token_ids": ids}], params)
    assert [o.token_ids for o in outs] == [by_text.token_ids, short_llm.generate(ids, params)[0].token_ids]
    assert short_llm.generate({"prompt": "The sky is"}, params)[0].token_ids == by_text.token_ids
    streamed = [t for d in short_llm.stream({"prompt_token_ids": ids}, params) for t in d.token_ids]
    assert streamed == outs[1].token_ids
    with pytest.raises(TypeError, match="prompt_token_ids"):
        short_llm.generate({"prompt": "x", "extra": 1})


def test_chat_checks_roles_and_content_the_way_the_server_does(short_llm: LLM) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=4)
    with pytest.raises(RequestError, match="unknown role 'wizard' in message 1"):
        short_llm.chat([{"role": "user", "content": "Hi"}, {"role": "wizard", "content": "x"}], params)
    with pytest.raises(RequestError, match="only text content parts"):
        short_llm.chat(
            [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}], params
        )
    with pytest.raises(RequestError, match="unknown role"):
        short_llm.apply_chat_template([{"role": "wizard", "content": "x"}])
    with pytest.raises(TypeError, match="messages must be a conversation"):
        short_llm.chat("Hi", params)  # type: ignore[arg-type]
    # Text parts are joined by newlines, as vLLM joins them.
    parts = [{"role": "user", "content": [{"type": "text", "text": "Say"}, {"type": "text", "text": "hi."}]}]
    assert short_llm.apply_chat_template(parts) == short_llm.apply_chat_template(user("Say\nhi."))
    assert short_llm.chat(parts, params)[0].token_ids == short_llm.chat(user("Say\nhi."), params)[0].token_ids


def test_continue_final_message_prefills_the_answer_and_contradicting_flags_are_refused(
    short_llm: LLM,
) -> None:
    messages = [
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "The capital of France is"},
    ]
    params = SamplingParams(temperature=0.0, max_tokens=4)
    out = short_llm.chat(messages, params, add_generation_prompt=False, continue_final_message=True)[0]
    rendered = short_llm.apply_chat_template(
        messages, add_generation_prompt=False, continue_final_message=True
    )
    assert rendered.endswith("The capital of France is")
    assert out.prompt_token_ids == short_llm.tokenize(rendered)
    assert "Paris" in out.text, "the model continues the prefilled answer"
    closed = short_llm.apply_chat_template(messages, add_generation_prompt=False)
    assert closed.startswith(rendered) and len(closed) > len(rendered)
    streamed = short_llm.stream(messages, params, add_generation_prompt=False, continue_final_message=True)
    assert "".join(d.text for d in streamed) == out.text
    with pytest.raises(RequestError, match="set add_generation_prompt to false"):
        short_llm.chat(messages, params, continue_final_message=True)


def test_a_list_of_sampling_params_gives_each_prompt_its_own(short_llm: LLM) -> None:
    prompts = ["Hi", "Hello"]
    one, three = SamplingParams(temperature=0.0, max_tokens=1), SamplingParams(temperature=0.0, max_tokens=3)
    outs = short_llm.generate(prompts, [one, three])
    assert [len(o.token_ids) for o in outs] == [1, 3]
    assert outs[1].token_ids == short_llm.generate("Hello", three)[0].token_ids
    chats = short_llm.chat([user("Hi"), user("Hello")], [three, one])
    assert [len(o.token_ids) for o in chats] == [3, 1]
    with pytest.raises(ValueError, match="2 sampling params for 3 prompts"):
        short_llm.generate([*prompts, "Hey"], [one, three])
    with pytest.raises(TypeError, match="sampling_params must be"):
        short_llm.generate(prompts, {"max_tokens": 3})  # type: ignore[arg-type]
    # stream takes the same forms for its one prompt.
    assert [t for d in short_llm.stream("Hello", [three]) for t in d.token_ids] == outs[1].token_ids
    with pytest.raises(TypeError, match="sampling_params must be"):
        next(iter(short_llm.stream("Hello", {"max_tokens": 3})))  # type: ignore[arg-type]


def test_token_ids_outside_the_vocabulary_are_value_errors_naming_the_id(short_llm: LLM) -> None:
    vocab_size = short_llm.info["vocab_size"]
    assert short_llm.detokenize(short_llm.tokenize("Hello there")) == "Hello there"
    cases = [([10**6], "token_ids[0] = 1000000"), ([1, -1], "token_ids[1] = -1"), ([vocab_size], "")]
    for ids, shown in cases:
        with pytest.raises(ValueError, match="is not a token id of this model") as excinfo:
            short_llm.detokenize(ids)
        assert shown in str(excinfo.value) and str(vocab_size - 1) in str(excinfo.value)
    with pytest.raises(ValueError, match="non-negative, got -3"):
        short_llm.generate([5, -3])
    with pytest.raises(ValueError, match="non-negative"):
        short_llm.generate({"prompt_token_ids": [-1]})
    with pytest.raises(ValueError, match="prompt token id 1099511627776 is outside any vocabulary"):
        short_llm.generate([1 << 40])
    with pytest.raises(ValueError, match=r"token_ids\[1\] = 1180591620717411303424 is not a token id"):
        short_llm.detokenize([1, 1 << 70])
    with pytest.raises(TypeError, match=r"token_ids\[0\] = 'a' is not an int"):
        short_llm.detokenize(["a"])  # type: ignore[list-item]


def test_bytes_and_bools_are_not_token_ids_and_bad_messages_are_named(short_llm: LLM) -> None:
    with pytest.raises(TypeError, match=r"prompts must be a string \(decode bytes first\)"):
        short_llm.generate(b"hi")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="a prompt must be a string"):
        short_llm.generate([True, 5])
    with pytest.raises(ValueError, match=r"messages\[1\]: missing field `role`"):
        short_llm.chat([user("Hi")[0], {"content": "no role"}])


def test_outputs_reads_the_completion_the_way_vllm_does(short_llm: LLM) -> None:
    out = short_llm.generate("Hi", SamplingParams(temperature=0.0, max_tokens=3, logprobs=1))[0]
    (completion,) = out.outputs
    assert (completion.index, completion.text, completion.token_ids) == (0, out.text, out.token_ids)
    assert completion.finish_reason == out.finish_reason == "length"
    assert completion.logprobs == out.logprobs and len(completion.logprobs) == 3
    assert out.finished


@pytest.mark.parametrize(
    ("sizes", "field", "message"),
    [
        ({"max_model_len": 1 << 20}, "max_model_len", "exceeds the model's context of 8192"),
        ({"max_model_len": 1}, "max_model_len", "at least 2"),
        ({"kv_cache_memory": -5}, "kv_cache_memory", "non-negative integer"),
        ({"max_num_seqs": 2.5}, "max_num_seqs", "non-negative integer"),
        ({"kv_cache_memory": 1 << 64}, "kv_cache_memory", "below 2\\*\\*64"),
        ({"max_num_seqs": 0}, "max_num_seqs", "max_num_seqs must be at least 1"),
        ({"block_size": 0}, "block_size", "block_size must be at least 1"),
        ({"kv_cache_memory": 1024}, "kv_cache_memory", "raise the KV memory budget"),
    ],
)
def test_engine_sizes_the_model_cannot_honour_raise_config_error_naming_them(
    sizes: dict[str, Any], field: str, message: str
) -> None:
    with pytest.raises(ConfigError, match=message) as excinfo:
        LLM(speculative_config=SpeculativeConfig(), **sizes)
    assert excinfo.value.field == field


@pytest.mark.parametrize(
    ("speculative", "field"),
    [
        (
            {"speculative_method": "suffix", "suffix_decoding_max_tree_depth": 10**5},
            "suffix_decoding_max_tree_depth",
        ),
        (
            # A depth past the context with a narrower width: the trees copy up to their depth.
            {
                "speculative_method": "suffix",
                "num_speculative_tokens": 8,
                "suffix_decoding_max_tree_depth": 10**5,
            },
            "suffix_decoding_max_tree_depth",
        ),
        ({"speculative_method": "ngram", "num_speculative_tokens": 8192}, "num_speculative_tokens"),
    ],
)
def test_drafts_longer_than_the_context_raise_config_error_naming_the_setting(
    speculative: dict[str, Any], field: str
) -> None:
    with pytest.raises(ConfigError, match="do not fit in max_model_len 8192") as excinfo:
        LLM(speculative_config=SpeculativeConfig(**speculative))
    assert excinfo.value.field == field


@pytest.mark.parametrize(
    ("speculative_config", "hint"),
    [(None, "set speculative_method"), ({"speculative_method": "ngram"}, "takes no draft model")],
)
def test_a_draft_model_the_method_would_not_use_raises_config_error(
    tmp_path: Path, speculative_config: dict[str, Any] | None, hint: str
) -> None:
    # Without a method the draft used to be dropped in silence, decoding plainly. (A draft
    # whose config names its method runs that method; a language model's names none.)
    language_model = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 30}
    (tmp_path / "config.json").write_text(json.dumps(language_model))
    with pytest.raises(ConfigError, match=hint) as excinfo:
        LLM(draft_model=str(tmp_path), speculative_config=speculative_config)
    assert excinfo.value.field == "draft_model"


def test_speculative_config_may_be_a_dict_of_its_fields() -> None:
    llm = LLM(speculative_config={"speculative_method": "ngram", "num_speculative_tokens": 2})
    assert llm.speculative_config == SpeculativeConfig(speculative_method="ngram", num_speculative_tokens=2)
    assert (llm.info["method"], llm.info["num_speculative_tokens"]) == ("ngram", 2)
    with pytest.raises(ValidationError, match="speculative_method"):
        LLM(speculative_config={"speculative_method": "medusa"})
    with pytest.raises(TypeError, match=r"a SpeculativeConfig or a dict of its fields \(or vLLM's\), got"):
        LLM(speculative_config='{"speculative_method": "ngram"}')  # type: ignore[arg-type]


def test_speculative_config_in_vllms_spelling_runs_with_the_draft_it_names() -> None:
    shipped_draft, _ = _spec_rs.default_draft("smollm2-135m-instruct")
    vllm_style = {"method": "eagle3", "model": shipped_draft, "num_speculative_tokens": 2}
    llm = LLM(speculative_config=vllm_style)
    assert (llm.info["method"], llm.info["num_speculative_tokens"]) == ("eagle", 2)
    assert llm.speculative_config == SpeculativeConfig(speculative_method="eagle", num_speculative_tokens=2)
    params = SamplingParams(max_tokens=12, temperature=0.0)
    plain = LLM(speculative_config=SpeculativeConfig()).generate(["Name a color."], params)[0].text
    assert llm.generate(["Name a color."], params)[0].text == plain
    # vLLM's batch-size cut-off is a verify-width schedule: nothing verified past it.
    ngram = LLM(speculative_config={"method": "ngram", "disable_by_batch_size": 4, "prompt_lookup_max": 3})
    assert ngram.speculative_config.prompt_lookup_max == 3
    assert [r.as_tuple() for r in ngram.speculative_config.num_speculative_tokens_per_batch_size or []] == [
        (1, 4, 1 << 20),
        (5, 5, 0),
    ]


def test_a_draft_given_without_a_method_runs_the_method_its_config_names(
    plain_llm: LLM, tmp_path: Path
) -> None:
    shipped_draft, _ = _spec_rs.default_draft("smollm2-135m-instruct")
    assert _spec_rs.draft_method(shipped_draft) == "eagle"
    params = SamplingParams(max_tokens=16, temperature=0.0)
    plain = plain_llm.generate(["Count from one to ten."], params)[0]
    # Both spellings, as vLLM infers the method from the draft: spec-rs's draft_model with the
    # config's width, and vLLM's speculative_config={"model": ...} with no method.
    for llm in (
        LLM(draft_model=shipped_draft, speculative_config={"num_speculative_tokens": 3}),
        LLM(speculative_config={"model": shipped_draft, "num_speculative_tokens": 3}),
    ):
        assert (llm.info["method"], llm.info["num_speculative_tokens"]) == ("eagle", 3)
        out = llm.generate(["Count from one to ten."], params)[0]
        assert out.token_ids == plain.token_ids
        assert out.metrics is not None and out.metrics.num_accepted_tokens > 0
    # A language model is no drafter: the method must be given.
    language_model = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 30}
    (tmp_path / "config.json").write_text(json.dumps(language_model))
    with pytest.raises(ConfigError, match=r"no speculative_method, and its config\.json names no drafter"):
        LLM(draft_model=str(tmp_path), speculative_config={"num_speculative_tokens": 3})


@pytest.mark.parametrize(
    ("speculative_config", "draft_model", "field", "hint"),
    [
        ({"method": "medusa"}, None, "method", "not supported by spec-rs"),
        ({"method": "ngram", "speculative_method": "ngram"}, None, "method", "set only one"),
        ({"method": "eagle3", "quantization": "fp8"}, None, "quantization", "pass dtype"),
        ({"method": "ngram", "draft_tensor_parallel_size": 2}, None, "draft_tensor_parallel_size", "one dev"),
        ({"methd": "ngram"}, None, "methd", "unknown field"),
        ({"method": "eagle3", "model": "/a"}, "/b", "draft_model", "name different drafts"),
    ],
)
def test_vllm_spelled_config_errors_name_the_key(
    speculative_config: dict[str, Any], draft_model: str | None, field: str, hint: str
) -> None:
    with pytest.raises(ConfigError, match=hint) as excinfo:
        LLM(draft_model=draft_model, speculative_config=speculative_config)
    assert excinfo.value.field == field


def test_chat_flags_and_serve_port_of_the_wrong_type_are_refused(short_llm: LLM) -> None:
    messages = user("Hi")
    for flag in ("add_generation_prompt", "continue_final_message"):
        with pytest.raises(TypeError, match=f"{flag} must be True or False, got 0"):
            short_llm.apply_chat_template(messages, **{flag: 0})
    with pytest.raises(TypeError, match="chat_template must be a Jinja template string"):
        short_llm.chat(messages, chat_template=b"{{ x }}")  # type: ignore[arg-type]
    for port in (70000, -1):
        with pytest.raises(ValueError, match=r"port must be in 0\.\.=65535"):
            short_llm.serve(port=port)
    with pytest.raises(TypeError, match="port must be an int, got str"):
        short_llm.serve(port="8000")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="api_key is empty"):
        short_llm.serve(port=0, api_key="")


def test_a_tokenizer_override_must_exist_and_hold_tokenizer_json(tmp_path: Any) -> None:
    with pytest.raises(ConfigError, match="does not exist") as excinfo:
        LLM(speculative_config=SpeculativeConfig(), tokenizer=str(tmp_path / "absent"))
    assert excinfo.value.field == "tokenizer"
    with pytest.raises(ConfigError, match=r"holds no tokenizer\.json") as excinfo:
        LLM(speculative_config=SpeculativeConfig(), tokenizer=str(tmp_path))
    assert excinfo.value.field == "tokenizer"


def test_a_missing_model_path_or_a_corrupt_tokenizer_is_a_load_error_not_a_request_err(tmp_path: Any) -> None:
    with pytest.raises(ModelNotInstalledError, match="neither a known alias") as missing:
        LLM(str(tmp_path / "no-such-model.gguf"), speculative_config=SpeculativeConfig())
    assert isinstance(missing.value, FileNotFoundError)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match="tokenizer"):
        LLM(speculative_config=SpeculativeConfig(), tokenizer=str(tmp_path))


def test_a_draft_directory_without_a_config_raises_model_load_error(tmp_path: Any) -> None:
    with pytest.raises(ModelLoadError) as excinfo:
        LLM(draft_model=str(tmp_path), speculative_config=SpeculativeConfig(speculative_method="eagle"))
    assert str(tmp_path / "config.json") in str(excinfo.value)


def test_logit_bias_bans_and_forces_tokens_and_stays_lossless_under_speculation(
    plain_llm: LLM, ngram_llm: LLM, plain_alone: list[RequestOutput]
) -> None:
    prompt = user(SPEC_PROMPTS[4])  # a repetition task: the n-gram drafter hits
    base = plain_alone[4]
    banned = max(set(base.token_ids), key=base.token_ids.count)
    ban = SamplingParams(temperature=0.0, max_tokens=48, logit_bias={banned: -100})
    plain = plain_llm.chat(prompt, ban)[0]
    assert banned not in plain.token_ids and plain.token_ids != base.token_ids
    spec = ngram_llm.chat(prompt, ban)[0]
    assert spec.token_ids == plain.token_ids, first_divergence(spec.token_ids, plain.token_ids)
    assert spec.metrics is not None and spec.metrics.num_accepted_tokens > 0
    forced_token = base.token_ids[3]
    for temperature in (0.0, 1.0):
        force = SamplingParams(temperature=temperature, max_tokens=5, seed=1, logit_bias={forced_token: 100})
        for llm in (plain_llm, ngram_llm):
            assert llm.chat(prompt, force)[0].token_ids == [forced_token] * 5, (llm.info, temperature)


def test_prompt_logprobs_score_every_prompt_token_the_way_decoding_scores_it(
    f32_llm: LLM, f32_ngram_llm: LLM
) -> None:
    prompt = "The quick brown fox jumps over the lazy dog because"
    ids = f32_llm.tokenize(prompt)
    greedy = SamplingParams(temperature=0.0, max_tokens=1, logprobs=2)
    scored = f32_llm.generate(prompt, SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=2))[0]
    assert len(scored.prompt_logprobs) == len(ids) == scored.num_prompt_tokens
    assert scored.prompt_logprobs[0] is None
    assert [lp.token for lp in scored.prompt_logprobs[1:] if lp] == ids[1:]
    assert scored.prompt_token_ids == ids, "the prompt as the engine read it"
    for lp in scored.prompt_logprobs[1:]:
        assert lp is not None and len(lp.top) == 2 and lp.top[0][1] >= lp.logprob - 1e-4
        # The rank places the token among the top ones: first exactly when it is the top one.
        assert (lp.rank == 1) == (lp.top[0][0] == lp.token)
        assert lp.rank > 2 or lp.token in [t for t, _ in lp.top][: lp.rank]
    # Token k scored over the prompt equals the logprob decoding gives it after ids[:k]: take
    # the greedy next token of a prefix, append it, and score the longer prompt.
    for k in (3, len(ids)):
        step = f32_llm.generate(ids[:k], greedy)[0]
        token = step.token_ids[0]
        extended = f32_llm.generate(
            [*ids[:k], token], SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0)
        )[0]
        last = extended.prompt_logprobs[-1]
        assert last is not None and last.token == token and last.top == []
        assert last.logprob == pytest.approx(step.logprobs[0].logprob, abs=2e-3)
        assert last.rank == step.logprobs[0].rank == 1, "a greedy token is the most likely"
    # Chunked prefill (4 tokens a step) and speculation score the same prompt the same way.
    chunked = make_llm(dtype="f32", max_num_batched_tokens=4, max_model_len=256)
    params = SamplingParams(temperature=0.0, max_tokens=8, prompt_logprobs=1)
    for llm in (chunked, f32_ngram_llm):
        out = llm.generate(prompt, params)[0]
        assert out.token_ids == f32_llm.generate(prompt, params)[0].token_ids
        assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == len(ids)
        for got, want in zip(out.prompt_logprobs[1:], scored.prompt_logprobs[1:], strict=True):
            assert got is not None and want is not None and got.token == want.token
            assert got.logprob == pytest.approx(want.logprob, abs=2e-3)


def test_allowed_token_ids_confine_the_output_and_stay_lossless_under_speculation(
    plain_llm: LLM, ngram_llm: LLM
) -> None:
    prompt = user(SPEC_PROMPTS[0])
    base = plain_llm.chat(prompt, SamplingParams(temperature=0.0, max_tokens=16))[0]
    allowed = sorted(set(base.token_ids[1:6]))
    params = SamplingParams(temperature=0.0, max_tokens=16, allowed_token_ids=allowed)
    plain = plain_llm.chat(prompt, params)[0]
    assert set(plain.token_ids) <= set(allowed) and len(plain.token_ids) == 16
    assert ngram_llm.chat(prompt, params)[0].token_ids == plain.token_ids
    sampled = ngram_llm.chat(prompt, params.model_copy(update={"temperature": 1.0, "seed": 2}))[0]
    assert set(sampled.token_ids) <= set(allowed)


def test_masks_that_leave_no_token_are_a_config_error_up_front_or_an_error_output_later(
    plain_llm: LLM, ngram_llm: LLM
) -> None:
    (yes,) = plain_llm.tokenize("Yes", add_special_tokens=False)
    choice = StructuredOutputsParams(choice=["Yes"])
    # Only EOS allowed, and min_tokens holds it back: nothing could be generated first.
    with pytest.raises(ConfigError, match="allowed_token_ids and min_tokens") as excinfo:
        plain_llm.generate("Hi", SamplingParams(allowed_token_ids=[IM_END], min_tokens=2, max_tokens=4))
    assert excinfo.value.field == "allowed_token_ids"
    # "Yes" is allowed and starts the choice, which then needs EOS, which is not allowed: the
    # request ends after "Yes" with the reason, and a request beside it is untouched.
    dead_end = SamplingParams(
        temperature=0.0, max_tokens=8, allowed_token_ids=[yes], structured_outputs=choice
    )
    free = SamplingParams(temperature=0.0, max_tokens=4)
    for llm in (plain_llm, ngram_llm):
        failed, fine = llm.generate(["Is Paris in France?", "Name a colour."], [dead_end, free])
        assert failed.finish_reason == "error" and failed.token_ids == [yes]
        assert failed.error is not None and "output token 1" in failed.error, failed.error
        assert fine.finish_reason == "length" and fine.error is None


@pytest.mark.parametrize("grace", [float("inf"), float("nan"), -1.0, 1e20])
def test_serve_refuses_a_shutdown_timeout_that_means_nothing_before_it_binds(
    plain_llm: LLM, grace: float
) -> None:
    with pytest.raises(ValueError, match="shutdown_timeout must be between 0 and 86400"):
        plain_llm.serve(port=0, shutdown_timeout=grace)


def test_serve_refuses_a_host_that_names_no_address_before_it_binds(plain_llm: LLM) -> None:
    with pytest.raises(ValueError, match=r"host '999\.1\.1\.1' is not a valid IPv4 address"):
        plain_llm.serve(host="999.1.1.1", port=0)


def test_bad_words_never_appear_and_stay_lossless_under_speculation(plain_llm: LLM, ngram_llm: LLM) -> None:
    prompt = user(SPEC_PROMPTS[5])  # "List the numbers from 1 to 20, ...": the n-gram drafter hits
    greedy = SamplingParams(temperature=0.0, max_tokens=40)
    base = plain_llm.chat(prompt, greedy)[0]
    assert "7" in base.text
    params = greedy.model_copy(update={"bad_words": ["7", "12"]})
    plain = plain_llm.chat(prompt, params)[0]
    assert "7" not in plain.text and "12" not in plain.text, plain.text
    assert plain.text != base.text
    spec = ngram_llm.chat(prompt, params)[0]
    assert spec.token_ids == plain.token_ids
    assert spec.metrics is not None and spec.metrics.num_accepted_tokens > 0
    sampled = ngram_llm.chat(prompt, params.model_copy(update={"temperature": 0.8, "seed": 3}))[0]
    assert "7" not in sampled.text
    with pytest.raises(ValidationError, match="bad_words"):
        SamplingParams(bad_words=["  "])


def test_stop_strings_special_tokens_and_prompt_truncation_follow_vllms_flags(plain_llm: LLM) -> None:
    greedy = SamplingParams(temperature=0.0, max_tokens=48)
    prompt = user("Say hello.")
    base = plain_llm.chat(prompt, greedy)[0]
    stop = base.text.split()[2]
    at = base.text.index(stop)
    cut = plain_llm.chat(prompt, greedy.model_copy(update={"stop": [stop]}))[0]
    kept = plain_llm.chat(
        prompt, greedy.model_copy(update={"stop": [stop], "include_stop_str_in_output": True})
    )[0]
    assert (cut.text, kept.text) == (base.text[:at], base.text[: at + len(stop)])
    # Past the end of turn, its marker shows only when special tokens are kept.
    past = SamplingParams(temperature=0.0, max_tokens=len(base.token_ids) + 2, ignore_eos=True)
    assert base.finish_reason == "stop"
    hidden = plain_llm.chat(prompt, past)[0]
    shown = plain_llm.chat(prompt, past.model_copy(update={"skip_special_tokens": False}))[0]
    assert hidden.token_ids == shown.token_ids
    assert "<|im_end|>" in shown.text and "<|im_end|>" not in hidden.text
    # The end-of-turn token that stops a request is its stop string.
    with_marker = plain_llm.chat(
        prompt, greedy.model_copy(update={"include_stop_str_in_output": True, "skip_special_tokens": False})
    )[0]
    assert with_marker.text == base.text + "<|im_end|>"
    # Left truncation keeps the prompt's last tokens.
    text = "One two three four five six seven eight nine ten."
    ids = plain_llm.tokenize(text)
    out = plain_llm.generate(text, SamplingParams(temperature=0.0, max_tokens=4, truncate_prompt_tokens=4))[0]
    assert (out.num_prompt_tokens, out.prompt_token_ids) == (4, ids[-4:])
    assert (
        out.token_ids
        == plain_llm.generate(ids[-4:], SamplingParams(temperature=0.0, max_tokens=4))[0].token_ids
    )


def test_penalties_under_speculation_need_logit_penalties(ngram_llm: LLM) -> None:
    for params in (SamplingParams(repetition_penalty=1.2), SamplingParams(presence_penalty=0.5)):
        with pytest.raises(RequestError, match="logit_penalties"):
            ngram_llm.generate("Hi", params)
    with_penalties = make_llm(
        SpeculativeConfig(speculative_method="ngram", num_speculative_tokens=3, logit_penalties=True),
        max_model_len=256,
        kv_cache_memory=32 << 20,
    )
    out = with_penalties.generate(
        "Hi", SamplingParams(temperature=0.0, repetition_penalty=1.2, max_tokens=4)
    )[0]
    assert len(out.token_ids) == 4


def test_eagle_without_a_draft_model_is_a_clear_error() -> None:
    with pytest.raises(ConfigError) as excinfo:
        LLM(speculative_config=SpeculativeConfig(speculative_method="eagle"))
    message = str(excinfo.value)
    assert "eagle" in message and "draft_model=" in message
    assert excinfo.value.field == "draft_model"


def test_sampled_drafts_with_greedy_acceptance_fail_at_llm_build() -> None:
    config = SpeculativeConfig(
        speculative_method="ngram", draft_proposal="sampled", use_greedy_acceptance=True
    )
    with pytest.raises(ConfigError, match="use_greedy_acceptance") as excinfo:
        LLM(speculative_config=config)
    assert excinfo.value.field == "draft_proposal"


# --- the resolved pipeline ---------------------------------------------------------------------


def test_plain_llm_selects_the_plain_pipeline(plain_llm: LLM) -> None:
    info = plain_llm.info
    assert info["architecture"] == "LlamaForCausalLM"
    assert info["pipeline_class"] == "PlainPipeline" == type(plain_llm.pipeline).__name__
    assert info["method"] is None
    assert info["num_speculative_tokens"] is None
    assert info["vocab_size"] == 49152


@pytest.mark.parametrize(("fixture", "rule"), [("ngram_llm", "stochastic"), ("synthetic_llm", "synthetic")])
def test_speculative_llm_info_reports_pipeline_method_width_and_rule(
    request: pytest.FixtureRequest, fixture: str, rule: str
) -> None:
    llm: LLM = request.getfixturevalue(fixture)
    info = llm.info
    assert info["architecture"] == "LlamaForCausalLM"
    assert info["pipeline_class"] == "NgramPipeline" == type(llm.pipeline).__name__
    assert "Ngram" in info["pipeline_name"] and "LlamaForCausalLM" in info["pipeline_name"]
    assert info["method"] == "ngram"
    assert info["num_speculative_tokens"] == 3 == llm.speculative_config.num_speculative_tokens
    assert info["acceptance_rule"] == rule


@pytest.mark.parametrize("fixture", ["plain_llm", "ngram_llm", "synthetic_llm", "f32_llm"])
def test_every_finished_request_returns_its_kv_blocks(request: pytest.FixtureRequest, fixture: str) -> None:
    llm: LLM = request.getfixturevalue(fixture)
    llm.generate(["Hi", "The three primary colors are"], SamplingParams(temperature=0.0, max_tokens=6))
    free, total = llm.kv_blocks()
    assert total > 0
    assert free == total


# --- prefix caching -------------------------------------------------------------------------


def test_cached_prefixes_reuse_the_shared_chat_start_and_leave_the_text_unchanged(
    default_model_path: str,
) -> None:
    """The shipped EAGLE-3 drafter (behind prompt lookup) on the default model: a second chat
    shares the template's system prompt with the first, a later turn the whole first
    exchange; both reuse those blocks and generate what an engine without caching does."""
    first = user(SPEC_PROMPTS[0])
    cached, uncached = (
        LLM(kv_cache_memory=64 << 20, max_model_len=1024, enable_prefix_caching=on) for on in (True, False)
    )
    outputs = {}
    for name, llm in (("cached", cached), ("uncached", uncached)):
        answer = llm.chat(first, GREEDY)[0]
        later_turn = [*first, {"role": "assistant", "content": answer.text}, *user("Now say it in French.")]
        outputs[name] = [answer, *llm.chat([user(SPEC_PROMPTS[1]), later_turn], GREEDY)]
    for got, want in zip(outputs["cached"], outputs["uncached"], strict=True):
        assert got.text == want.text
        assert want.num_cached_tokens == 0
    answer, other_chat, later_turn = outputs["cached"]
    assert answer.num_cached_tokens == 0
    # Blocks of 16 tokens: the system prompt's first blocks, then the first exchange.
    assert 16 <= other_chat.num_cached_tokens < other_chat.num_prompt_tokens
    assert later_turn.num_cached_tokens >= 16 * ((answer.num_prompt_tokens - 1) // 16)
    assert "specrs_prefix_cache_hits_total" in cached.metrics_text()
    free, total = cached.kv_blocks()
    assert free == total, "cached blocks no request holds count as free"


def test_reset_prefix_cache_forgets_cached_prompts(plain_llm: LLM) -> None:
    # Over 17 tokens: at least one full block of 16, keyed with the token after it.
    prompt = (
        "Describe the water cycle in two sentences, naming evaporation, condensation, "
        "precipitation and collection, for a class of ten-year-old students."
    )
    plain_llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=4))
    assert plain_llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=4))[0].num_cached_tokens
    assert plain_llm.reset_prefix_cache() is True
    again = plain_llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=4))[0]
    assert again.num_cached_tokens == 0


def test_a_streamed_requests_last_delta_reports_its_cached_tokens(plain_llm: LLM) -> None:
    prompt = (
        "Name three rivers of Europe, the countries each one flows through, and one surprising "
        "fact about each of them."
    )
    plain_llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=4))
    deltas = list(plain_llm.stream(prompt, SamplingParams(temperature=0.0, max_tokens=6)))
    assert [d.num_cached_tokens for d in deltas[:-1]] == [None] * (len(deltas) - 1)
    assert deltas[-1].num_cached_tokens and deltas[-1].num_cached_tokens > 0


PERSON_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 18, "maximum": 99},
        "city": {"type": "string", "maxLength": 20},
    },
    "required": ["name", "age", "city"],
}


# A Lark grammar: an answer of either case, then a reason.
YES_NO_LARK = """
start: ANSWER ", because " REASON "."
ANSWER: "yes"i | "no"i
REASON: /[a-z ]{1,60}/
"""

# Lists of one to three numbers or lists, nested to any depth: no regex describes them.
NESTED_LISTS = """
root ::= list
list ::= "[" item ("," item){0,2} "]"
item ::= [0-9]{1,3} | list
"""


def widths_within(value: Any, most: int) -> bool:
    if isinstance(value, int):
        return True
    return isinstance(value, list) and 1 <= len(value) <= most and all(widths_within(v, most) for v in value)


def guided(max_tokens: int, **constraint: Any) -> SamplingParams:
    return SamplingParams(
        temperature=0.0, max_tokens=max_tokens, structured_outputs=StructuredOutputsParams(**constraint)
    )


def test_structured_outputs_follow_their_constraint_and_stay_lossless_under_speculation(
    plain_llm: LLM, ngram_llm: LLM
) -> None:
    prompts = [
        user("Describe a fictional software engineer as JSON."),
        user('What is 2 + 2? Reply with a JSON object like {"answer": 0}.'),
        user("Is Paris the capital of France?"),
        user("Give me a US phone number."),
        user("Write a nested list of small numbers, like [1,[2,3]]."),
        user("Is Paris the capital of France? Answer yes or no, then say why."),
        user("What is the weather in Paris? Call get_weather."),
    ]
    params = [
        guided(96, json=PERSON_SCHEMA),
        guided(64, json_object=True),
        guided(8, choice=["Yes", "No", "Not sure"]),
        guided(24, regex=r"\(\d{3}\) \d{3}-\d{4}"),
        guided(48, grammar=NESTED_LISTS),
        guided(48, grammar=YES_NO_LARK),
        guided(48, structural_tag=ONE_WEATHER_CALL),
    ]
    plain = [plain_llm.chat(p, sp)[0] for p, sp in zip(prompts, params, strict=True)]
    person = json.loads(plain[0].text)
    assert set(person) <= {"name", "age", "city"}
    assert isinstance(person["age"], int) and 18 <= person["age"] <= 99
    assert isinstance(json.loads(plain[1].text), dict)
    assert plain[2].text in ("Yes", "No", "Not sure")
    assert re.fullmatch(r"\(\d{3}\) \d{3}-\d{4}", plain[3].text), plain[3].text
    assert widths_within(json.loads(plain[4].text), 3), plain[4].text
    assert re.fullmatch(r"(?i:yes|no), because [a-z ]{1,60}\.", plain[5].text), plain[5].text
    assert re.fullmatch(ONE_WEATHER_CALL_RE, plain[6].text), plain[6].text
    assert all(out.finish_reason == "stop" for out in plain), [o.text for o in plain]
    for p, sp, want in zip(prompts, params, plain, strict=True):
        assert ngram_llm.chat(p, sp)[0].token_ids == want.token_ids
    # The same schema given as JSON text, and sampled outputs, stay within it.
    as_text = guided(96, json=json.dumps(PERSON_SCHEMA))
    assert plain_llm.chat(prompts[0], as_text)[0].text == plain[0].text
    sampled = as_text.model_copy(update={"temperature": 1.0, "seed": 5, "max_tokens": 128})
    out = ngram_llm.chat(prompts[0], sampled)[0]
    if out.finish_reason == "stop":
        assert isinstance(json.loads(out.text)["age"], int)


def test_bad_structured_outputs_raise_validation_errors_naming_the_problem() -> None:
    cases = [
        ({"json": {"type": "number", "maximum": 3}}, "`maximum` is supported on integers only"),
        ({"json": {"type": "integer", "minimum": 3, "maximum": 1}}, "leave no integer"),
        ({"regex": "("}, "not a valid regex"),
        ({"regex": "a", "choice": ["a"]}, "exactly one"),
        ({"grammar": 'root ::= "a" tail'}, "rule `tail` is used at line 1, column 14"),
        ({"grammar": 'root ::= root "a" | "b"'}, "rule `root` is left-recursive"),
        ({"grammar": 'root: "a"'}, "the grammar has no `start` rule"),
        ({"grammar": "start: /^a/"}, "anchor or look-around"),
        ({"choice": []}, "non-empty"),
        ({"structural_tag": {"type": "structural_tag", "format": {"type": "token", "token": 1}}}, "`token`"),
        (
            {
                "structural_tag": {
                    "structures": [{"begin": "<a>", "schema": {}, "end": "</a>"}],
                    "triggers": ["<b>"],
                }
            },
            "structures[0]: begin",
        ),
        ({"structural_tag": "{not json"}, "not valid JSON"),
        ({}, "needs one of"),
    ]
    for constraint, message in cases:
        with pytest.raises(ValidationError, match=re.escape(message)):
            SamplingParams(structured_outputs=StructuredOutputsParams(**constraint))
    with pytest.raises(ValidationError, match="drop min_tokens and ignore_eos"):
        SamplingParams(structured_outputs=StructuredOutputsParams(json_object=True), min_tokens=3)
    with pytest.raises(ValidationError, match="json"):
        StructuredOutputsParams(json=3)  # type: ignore[arg-type]
    # vLLM's earlier names still work, and only one of the two fields may be given.
    old_names = SamplingParams(guided_decoding=GuidedDecodingParams(regex="[0-9]+"))
    assert old_names.structured_outputs == StructuredOutputsParams(regex="[0-9]+")
    assert "guided_decoding" not in old_names.model_dump()
    with pytest.raises(ValidationError, match="not both"):
        SamplingParams(
            guided_decoding=GuidedDecodingParams(regex="a"),
            structured_outputs=StructuredOutputsParams(regex="b"),
        )
    dumped = StructuredOutputsParams(json={"type": "string"}).model_dump()
    assert dumped["json"] == {"type": "string"}, "serialised under vLLM's name"


#: Schemas exercising every keyword the translation supports, for sampled outputs.
SAMPLED_SCHEMAS: list[dict[str, Any]] = [
    {
        "type": "object",
        "properties": {
            "id": {"type": "string", "format": "uuid"},
            "born": {"type": "string", "format": "date"},
            "score": {"type": "number"},
            "tags": {
                "type": "array",
                "items": {"type": "string", "maxLength": 8},
                "minItems": 1,
                "maxItems": 3,
            },
            "note": {"type": ["string", "null"], "maxLength": 20},
        },
        "required": ["id", "tags"],
    },
    {
        "$defs": {
            "point": {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}}}
        },
        "type": "object",
        "properties": {
            "kind": {"enum": ["line", "dot"]},
            "points": {"type": "array", "items": {"$ref": "#/$defs/point"}, "maxItems": 2},
            "closed": {"const": False},
        },
        "required": ["kind", "points", "closed"],
    },
    {
        "type": "object",
        "properties": {
            "code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"},
            "value": {"anyOf": [{"type": "integer", "minimum": 0}, {"type": "boolean"}]},
            "extra": {"type": "object", "additionalProperties": {"type": "integer"}},
        },
    },
]


def test_a_patterned_string_stays_json_when_the_model_writes_quotes(plain_llm: LLM) -> None:
    # The pattern allows '"'; it used to end the JSON string early ('{ "q": "a "quoted" w...').
    text = {"type": "string", "pattern": "^[^0-9]+$"}
    schema = {"type": "object", "properties": {"q": text}, "required": ["q"]}
    prompt = user('Give JSON with q: a sentence with a "quoted" word.')
    structured = StructuredOutputsParams(json=schema)
    finished = 0
    for seed, temperature in [(0, 0.0), (1, 1.0), (2, 1.0)]:
        params = SamplingParams(
            temperature=temperature, seed=seed, max_tokens=80, structured_outputs=structured
        )
        out = plain_llm.chat(prompt, params)[0]
        if out.finish_reason == "stop":
            finished += 1
            jsonschema.validate(json.loads(out.text), schema)
    assert finished >= 1, "an output completes within max_tokens"
    # A pattern that needs quotes in the value: they are written escaped, and the text parses.
    said = {"type": "string", "pattern": '^say "[a-z]+"$'}
    quoted = {"type": "object", "properties": {"q": said}, "required": ["q"]}
    guide = StructuredOutputsParams(json=quoted)
    out = plain_llm.chat(prompt, SamplingParams(temperature=0.0, max_tokens=40, structured_outputs=guide))[0]
    assert out.finish_reason == "stop", out.text
    value = json.loads(out.text)
    jsonschema.validate(value, quoted)
    assert '\\"' in out.text and value["q"].startswith('say "'), out.text


def test_sampled_structured_outputs_validate_against_their_schema(plain_llm: LLM) -> None:
    prompt = user("Produce some JSON data.")
    finished = 0
    for schema in SAMPLED_SCHEMAS:
        params = [
            SamplingParams(
                temperature=1.0,
                seed=seed,
                max_tokens=160,
                structured_outputs=StructuredOutputsParams(json=schema),
            )
            for seed in range(6)
        ]
        for out in plain_llm.chat([prompt] * len(params), params):
            if out.finish_reason != "stop":
                continue
            finished += 1
            value = json.loads(out.text)
            jsonschema.validate(value, schema, format_checker=jsonschema.FormatChecker())
    assert finished >= 9, "most sampled outputs complete within max_tokens"
