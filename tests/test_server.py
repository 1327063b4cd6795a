"""The OpenAI-compatible server, run as `spec-rs serve` subprocesses: parity with the offline
API through the official `openai` client, SSE framing, models/health/metrics, OpenAI error
JSON for bad input, API keys, a concurrent streaming load test with disconnects, metrics that
add up to the per-request usage, overload (429) and graceful shutdown."""

from __future__ import annotations

import asyncio
import http.client
import json
import random
import re
import signal
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

import openai
import pytest

import spec_rs
from conftest import ARTIFACTS, ONE_WEATHER_CALL, ONE_WEATHER_CALL_RE, Server
from spec_rs import LLM, SamplingParams, StructuredOutputsParams

pytestmark = pytest.mark.timeout(240)

MODEL = "smollm2-135m-instruct"
SPEC_ARGS = ("--speculative-method", "ngram", "--num-speculative-tokens", "3")
#: Small engines: 512 MiB of KV holds the load test's 64 concurrent sequences.
ENGINE_ARGS = ("--kv-cache-memory", str(512 << 20), "--max-model-len", "2048")
SMALL_ENGINE_ARGS = ("--kv-cache-memory", str(64 << 20), "--max-model-len", "1024")

CHAT_PROMPTS = [
    "List the numbers from 1 to 20, separated by commas.",
    "Write a Python function that checks whether a number is prime.",
]
TEXT_PROMPT = "def fibonacci(n):\n    "


def user(content: str) -> list[Any]:
    return [{"role": "user", "content": content}]


def usage_spec(usage: Any) -> dict[str, Any]:
    """The `usage.spec_decode` extension (absent when no step verified a draft)."""
    extra = usage.model_extra or {}
    spec: dict[str, Any] = extra.get("spec_decode") or {}
    return spec


def assert_usage_matches(usage: Any, out: Any) -> None:
    assert usage.prompt_tokens == out.num_prompt_tokens
    assert usage.completion_tokens == len(out.token_ids)
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    spec = usage_spec(usage)
    if out.metrics.num_drafts:
        assert spec["num_drafts"] == out.metrics.num_drafts
        assert spec["num_draft_tokens"] == out.metrics.num_draft_tokens
        assert spec["num_accepted_tokens"] == out.metrics.num_accepted_tokens
        assert spec["accepted_per_position"] == out.metrics.accepted_per_position
    else:
        assert spec == {}


def sse_events(server: Server, path: str, body: dict[str, Any], timeout: float = 60) -> list[str]:
    """POSTs a streaming request and returns the `data:` payloads in order (raw SSE framing)."""
    host, port = server.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 200, resp.read()
        assert resp.getheader("Content-Type", "").startswith("text/event-stream")
        raw = resp.read().decode()
    finally:
        conn.close()
    events = []
    for block in raw.split("\n\n"):
        lines = [ln for ln in block.split("\n") if ln and not ln.startswith(":")]
        if lines:
            assert all(ln.startswith("data: ") for ln in lines), block
            events.append("\n".join(ln.removeprefix("data: ") for ln in lines))
    return events


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def wait_for_idle_engine(server: Server, timeout: float = 30.0) -> dict[str, float]:
    """Polls /metrics until every KV block is free and nothing runs, waits or is in flight."""
    deadline = time.monotonic() + timeout
    while True:
        m = server.metrics()
        idle = (
            m["specrs_kv_cache_free_blocks"] == m["specrs_kv_cache_total_blocks"]
            and m["specrs_num_requests_running"] == 0
            and m["specrs_num_requests_waiting"] == 0
            and m["specrs_num_requests_in_flight"] == 0
        )
        if idle or time.monotonic() > deadline:
            return m
        time.sleep(0.1)


# --- fixtures ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(serve: Callable[..., Server], default_model_path: str) -> Server:
    """n-gram speculation, 3 drafts per step (the same pipeline as the `ngram_llm` fixture)."""
    return serve(*SPEC_ARGS, *ENGINE_ARGS)


@pytest.fixture(scope="module")
def client(server: Server, openai_client: Callable[..., Any]) -> openai.OpenAI:
    c: openai.OpenAI = openai_client(server)
    return c


def expected_chat(llm: LLM, prompt: str, max_tokens: int) -> Any:
    return llm.chat(user(prompt), SamplingParams(temperature=0.0, max_tokens=max_tokens))[0]


# --- parity with the offline API -----------------------------------------------------------


@pytest.mark.parametrize("prompt", CHAT_PROMPTS)
def test_chat_completion_equals_llm_chat_with_usage(
    client: openai.OpenAI, ngram_llm: LLM, prompt: str
) -> None:
    resp = client.chat.completions.create(model=MODEL, messages=user(prompt), temperature=0, max_tokens=40)
    out = expected_chat(ngram_llm, prompt, 40)
    choice = resp.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content == out.text
    assert choice.finish_reason == out.finish_reason
    assert resp.model == MODEL
    assert resp.object == "chat.completion"
    assert_usage_matches(resp.usage, out)


def test_streamed_chat_completion_equals_llm_chat_and_ends_with_usage(
    client: openai.OpenAI, ngram_llm: LLM
) -> None:
    prompt = CHAT_PROMPTS[0]
    stream = client.chat.completions.create(
        model=MODEL,
        messages=user(prompt),
        temperature=0,
        max_tokens=40,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    out = expected_chat(ngram_llm, prompt, 40)
    *content_chunks, usage_chunk = chunks
    assert usage_chunk.choices == []
    assert_usage_matches(usage_chunk.usage, out)
    assert content_chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in content_chunks) == out.text
    finishes = [c.choices[0].finish_reason for c in content_chunks]
    assert finishes[-1] == out.finish_reason
    assert all(f is None for f in finishes[:-1])
    assert all(c.usage is None for c in content_chunks)
    assert len({c.id for c in chunks}) == 1


def test_logit_bias_and_no_tool_choice_give_what_llm_chat_gives(
    client: openai.OpenAI, ngram_llm: LLM
) -> None:
    prompt = CHAT_PROMPTS[0]
    plain = expected_chat(ngram_llm, prompt, 24)
    banned = max(set(plain.token_ids), key=plain.token_ids.count)
    params = SamplingParams(temperature=0.0, max_tokens=24, logit_bias={banned: -100})
    out = ngram_llm.chat(user(prompt), params)[0]
    assert banned not in out.token_ids
    resp = client.chat.completions.create(
        model=MODEL,
        messages=user(prompt),
        temperature=0,
        max_tokens=24,
        logit_bias={str(banned): -100},
        tool_choice="none",
    )
    assert resp.choices[0].message.content == out.text
    auto = client.chat.completions.create(
        model=MODEL, messages=user(prompt), temperature=0, max_tokens=24, tool_choice="auto", tools=[]
    )
    assert auto.choices[0].message.content == plain.text
    # Tools that may not be called leave a plain answer.
    none = client.chat.completions.create(
        model=MODEL,
        messages=user(prompt),
        temperature=0,
        max_tokens=24,
        tool_choice="none",
        tools=[TOOL],
    )
    assert none.choices[0].message.content == plain.text


def test_echo_returns_the_prompt_and_with_logprobs_scores_its_tokens(server: Server, ngram_llm: LLM) -> None:
    body = {"model": MODEL, "prompt": TEXT_PROMPT, "max_tokens": 4, "temperature": 0, "echo": True}
    status, _, raw = server.request("POST", COMPLETIONS, {**body, "logprobs": 1})
    assert status == 200, raw
    choice = json.loads(raw)["choices"][0]
    params = SamplingParams(temperature=0.0, max_tokens=4, logprobs=1, prompt_logprobs=1)
    out = ngram_llm.generate(TEXT_PROMPT, params)[0]
    assert choice["text"] == TEXT_PROMPT + out.text
    lps = choice["logprobs"]
    n = out.num_prompt_tokens
    assert "".join(lps["tokens"][:n]) == TEXT_PROMPT
    assert len(lps["tokens"]) == n + len(out.token_ids)
    assert lps["token_logprobs"][0] is None and lps["top_logprobs"][0] is None
    want = [lp.logprob for lp in out.prompt_logprobs[1:] if lp] + [lp.logprob for lp in out.logprobs]
    assert lps["token_logprobs"][1:] == pytest.approx(want, abs=1e-4)
    assert lps["text_offset"][n] == len(TEXT_PROMPT)
    status, _, raw = server.request("POST", COMPLETIONS, body)
    assert status == 200, raw
    plain = json.loads(raw)["choices"][0]
    assert plain["text"] == choice["text"] and plain["logprobs"] is None


def test_streamed_echo_opens_each_choice_with_its_prompt_and_adds_up_to_the_whole(server: Server) -> None:
    prompts = [TEXT_PROMPT, "The capital of France is"]
    body = {"model": MODEL, "prompt": prompts, "max_tokens": 5, "temperature": 0.8, "seed": 3, "n": 2}
    body |= {"echo": True, "logprobs": 2}
    status, _, raw = server.request("POST", COMPLETIONS, body)
    assert status == 200, raw
    whole = sorted(json.loads(raw)["choices"], key=lambda c: c["index"])
    events = sse_events(server, COMPLETIONS, {**body, "stream": True})
    assert events[-1] == "[DONE]"
    texts = ["" for _ in whole]
    keys = ("tokens", "token_logprobs", "text_offset")
    logprobs: list[dict[str, list[Any]]] = [{key: [] for key in keys} for _ in whole]
    for event in events[:-1]:
        (choice,) = json.loads(event)["choices"]
        i = choice["index"]
        if not texts[i] and choice["text"]:
            assert choice["text"].startswith(prompts[i // 2]), "a choice's first text opens with its prompt"
        texts[i] += choice["text"]
        for key, values in logprobs[i].items():
            values += (choice["logprobs"] or {}).get(key, [])
    assert texts == [c["text"] for c in whole]
    for streamed, c in zip(logprobs, whole, strict=True):
        assert streamed["tokens"] == c["logprobs"]["tokens"], "the prompt's tokens, then the completion's"
        assert streamed["text_offset"] == c["logprobs"]["text_offset"]
        assert streamed["token_logprobs"][0] is None, "nothing predicts a prompt's first token"
        assert streamed["token_logprobs"][1:] == pytest.approx(c["logprobs"]["token_logprobs"][1:], abs=1e-4)


def test_completion_logprobs_count_characters_hold_the_chosen_token_and_stream_the_same_offsets(
    server: Server,
) -> None:
    prompt = "Café au lait, naïve résumé, and"
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 16, "temperature": 0, "echo": True, "logprobs": 0}
    status, _, raw = server.request("POST", COMPLETIONS, body)
    assert status == 200, raw
    choice = json.loads(raw)["choices"][0]
    lps = choice["logprobs"]
    # Offsets count characters, as OpenAI's: each token sits at its offset in the text.
    for token, at in zip(lps["tokens"], lps["text_offset"], strict=True):
        if "\ufffd" in token:
            break  # a token holding part of a character: its text is not the text's
        assert choice["text"][at : at + len(token)] == token, (token, at)
    # logprobs=0 still reports the chosen token (up to logprobs + 1 entries).
    scored = zip(lps["tokens"][1:], lps["token_logprobs"][1:], lps["top_logprobs"][1:], strict=True)
    for token, logprob, top in scored:
        assert top == {token: pytest.approx(logprob)}
    # Streamed with a stop string (text held back while it might begin one), the chunks'
    # offsets continue the whole response's.
    stop = choice["text"][len(prompt) :].split()[3]
    body = {**body, "stop": [stop], "logprobs": 1}
    status, _, raw = server.request("POST", COMPLETIONS, body)
    assert status == 200, raw
    whole = json.loads(raw)["choices"][0]
    assert whole["finish_reason"] == "stop" and not whole["text"].endswith(stop)
    streamed: list[int] = []
    for event in sse_events(server, COMPLETIONS, {**body, "stream": True})[:-1]:
        for c in json.loads(event)["choices"]:
            streamed += (c["logprobs"] or {}).get("text_offset", [])
    assert streamed == whole["logprobs"]["text_offset"]
    tops = whole["logprobs"]["top_logprobs"][1:]
    for token, top in zip(whole["logprobs"]["tokens"][1:], tops, strict=True):
        assert token in top and len(top) <= 2


def test_n_choices_are_the_offline_apis_choices_with_usage_summed_over_them(
    client: openai.OpenAI, ngram_llm: LLM
) -> None:
    params = SamplingParams(temperature=0.8, seed=5, max_tokens=12, n=3)
    want = ngram_llm.chat(user(CHAT_PROMPTS[0]), params)[0]
    assert [o.index for o in want.outputs] == [0, 1, 2]
    assert len({o.text for o in want.outputs}) > 1, "three samples, not one answer thrice"
    resp = client.chat.completions.create(
        model=MODEL, messages=user(CHAT_PROMPTS[0]), temperature=0.8, seed=5, max_tokens=12, n=3
    )
    assert [c.index for c in resp.choices] == [0, 1, 2]
    assert [c.message.content for c in resp.choices] == [o.text for o in want.outputs]
    assert resp.usage.prompt_tokens == want.num_prompt_tokens, "the shared prompt counts once"
    assert resp.usage.completion_tokens == sum(len(o.token_ids) for o in want.outputs)
    # Completions number prompt p's choices p*n .. p*n + n - 1.
    prompts = [TEXT_PROMPT, "The capital of France is"]
    cmpl_params = SamplingParams(temperature=0.8, seed=5, max_tokens=8, n=2)
    offline = ngram_llm.generate(prompts, cmpl_params)
    resp = client.completions.create(model=MODEL, prompt=prompts, temperature=0.8, seed=5, max_tokens=8, n=2)
    assert [c.index for c in resp.choices] == [0, 1, 2, 3]
    assert [c.text for c in resp.choices] == [o.text for out in offline for o in out.outputs]
    assert resp.usage.prompt_tokens == sum(out.num_prompt_tokens for out in offline)


def test_streamed_n_choices_each_open_with_the_role_finish_once_and_share_one_usage_chunk(
    client: openai.OpenAI, server: Server, ngram_llm: LLM
) -> None:
    params = SamplingParams(temperature=0.8, seed=9, max_tokens=10, n=2)
    want = ngram_llm.chat(user(CHAT_PROMPTS[1]), params)[0]
    stream = client.chat.completions.create(
        model=MODEL,
        messages=user(CHAT_PROMPTS[1]),
        temperature=0.8,
        seed=9,
        max_tokens=10,
        n=2,
        stream=True,
        stream_options={"include_usage": True},
    )
    *chunks, usage_chunk = list(stream)
    assert usage_chunk.choices == []
    assert usage_chunk.usage.completion_tokens == sum(len(o.token_ids) for o in want.outputs)
    for out in want.outputs:
        mine = [c.choices[0] for c in chunks if c.choices[0].index == out.index]
        assert mine[0].delta.role == "assistant"
        assert "".join(c.delta.content or "" for c in mine) == out.text
        assert [c.finish_reason for c in mine if c.finish_reason] == [out.finish_reason]
    events = sse_events(
        server,
        CHAT,
        chat(messages=user(CHAT_PROMPTS[1]), temperature=0.8, seed=9, max_tokens=10, n=2, stream=True),
    )
    assert events.count("[DONE]") == 1 and events[-1] == "[DONE]"


def test_prompt_logprobs_come_back_in_vllms_shape_on_both_endpoints(server: Server, ngram_llm: LLM) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=4, prompt_logprobs=2)
    want = ngram_llm.chat(user(CHAT_PROMPTS[0]), params)[0]
    status, _, raw = server.request("POST", CHAT, chat(messages=user(CHAT_PROMPTS[0]), **params_body(params)))
    assert status == 200, raw
    got = json.loads(raw)["prompt_logprobs"]
    assert len(got) == len(want.prompt_token_ids) == want.num_prompt_tokens
    assert got[0] is None
    for position, token, lp in zip(got[1:], want.prompt_token_ids[1:], want.prompt_logprobs[1:], strict=True):
        assert lp is not None
        mine = position[str(token)]
        assert mine["logprob"] == pytest.approx(lp.logprob, abs=1e-4) and mine["rank"] == lp.rank
        for rank, (top_id, top_lp) in enumerate(lp.top, start=1):
            assert position[str(top_id)]["rank"] == rank
            assert position[str(top_id)]["logprob"] == pytest.approx(top_lp, abs=1e-4)
            assert position[str(top_id)]["decoded_token"] == ngram_llm.detokenize([top_id], False)
    # Completions put them on each choice, the token prompt scored as given.
    ids = ngram_llm.tokenize(TEXT_PROMPT)
    status, _, raw = server.request("POST", COMPLETIONS, cmpl(prompt=ids, **params_body(params)))
    assert status == 200, raw
    choice = json.loads(raw)["choices"][0]
    offline = ngram_llm.generate(ids, params)[0]
    assert [
        None if p is None else p[str(t)]["rank"] for p, t in zip(choice["prompt_logprobs"], ids, strict=True)
    ] == [None if lp is None else lp.rank for lp in offline.prompt_logprobs]
    status, _, raw = server.request(
        "POST", COMPLETIONS, cmpl(**params_body(params.model_copy(update={"prompt_logprobs": None})))
    )
    assert "prompt_logprobs" not in json.loads(raw)["choices"][0], "only when asked"


def test_continuous_usage_stats_put_the_usage_so_far_on_every_output_chunk(server: Server) -> None:
    every_chunk = {"include_usage": True, "continuous_usage_stats": True}
    requests = [
        (CHAT, chat(messages=user(CHAT_PROMPTS[0]), n=2, temperature=0.7, seed=1)),
        (COMPLETIONS, cmpl(prompt=[TEXT_PROMPT, "1, 2, 3, 4,"])),
    ]
    for path, body in requests:
        body = {**body, "max_tokens": 12, "stream": True, "stream_options": every_chunk}
        chunks = [json.loads(e) for e in sse_events(server, path, body) if e != "[DONE]"]
        final = chunks[-1]
        assert final["choices"] == [] and "usage" in final
        running = [c["usage"] for c in chunks[:-1] if c["choices"] and "usage" in c]
        assert running, path
        generated = [u["completion_tokens"] for u in running]
        assert generated == sorted(generated), "the count only grows"
        assert generated[-1] == final["usage"]["completion_tokens"], path
        assert running[-1]["prompt_tokens"] == final["usage"]["prompt_tokens"], "every prompt counted once"
        assert all(u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"] for u in running)
        only_final = {**body, "stream_options": {"include_usage": True}}
        plain_chunks = [json.loads(e) for e in sse_events(server, path, only_final) if e != "[DONE]"]
        with_usage = [c for c in plain_chunks if "usage" in c]
        assert with_usage == plain_chunks[-1:], "without it, only the last chunk"


def test_vllms_output_controls_pass_through_the_server(server: Server, ngram_llm: LLM) -> None:
    base = expected_chat(ngram_llm, CHAT_PROMPTS[0], 24)
    stop = base.text.split()[1]
    controls = {
        "temperature": 0,
        "max_tokens": 24,
        "stop": [stop],
        "include_stop_str_in_output": True,
        "skip_special_tokens": False,
        "allowed_token_ids": sorted(set(base.token_ids)),
    }
    truncated = {"temperature": 0, "max_tokens": 8, "truncate_prompt_tokens": 8}
    bad_words = {"temperature": 0, "max_tokens": 24, "bad_words": [base.text.split()[2]]}
    for fields in (controls, bad_words, truncated):
        status, _, raw = server.request("POST", CHAT, chat(messages=user(CHAT_PROMPTS[0]), **fields))
        assert status == 200, raw
        body = json.loads(raw)
        want = ngram_llm.chat(user(CHAT_PROMPTS[0]), SamplingParams(**fields))[0]
        assert body["choices"][0]["message"]["content"] == want.text
        assert body["choices"][0]["stop_reason"] == want.outputs[0].stop_reason
        assert body["usage"]["prompt_tokens"] == want.num_prompt_tokens
    assert want.num_prompt_tokens == 8
    request = chat(messages=user(CHAT_PROMPTS[0]), **controls)
    stopped = json.loads(server.request("POST", CHAT, request)[2])
    assert stopped["choices"][0]["stop_reason"] == stop, "vLLM's stop_reason names the stop string"
    streamed = [json.loads(e) for e in sse_events(server, CHAT, {**request, "stream": True})[:-1]]
    assert streamed[-1]["choices"][0]["stop_reason"] == stop
    assert base.text.index(stop) + len(stop) == len(
        ngram_llm.chat(user(CHAT_PROMPTS[0]), SamplingParams(**controls))[0].text
    ), "the output ends with its stop string"


# vLLM's documentation example for `grammar`.
SQL_GRAMMAR = """
root ::= select_statement
select_statement ::= "SELECT " column " from " table " where " condition
column ::= "col_1 " | "col_2 "
table ::= "table_1 " | "table_2 "
condition ::= column "= " number
number ::= "1 " | "2 "
"""


def test_structured_outputs_through_every_request_field_give_what_llm_chat_gives(
    client: openai.OpenAI, server: Server, ngram_llm: LLM
) -> None:
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer", "minimum": 0}},
        "required": ["name", "age"],
    }
    person = user("Describe a fictional software engineer as JSON.")
    resp = client.chat.completions.create(
        model=MODEL,
        messages=person,
        temperature=0,
        max_tokens=64,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": schema}},
    )
    text = resp.choices[0].message.content
    assert text is not None and isinstance(json.loads(text)["age"], int)
    want = ngram_llm.chat(
        person,
        SamplingParams(temperature=0, max_tokens=64, structured_outputs=StructuredOutputsParams(json=schema)),
    )[0]
    assert text == want.text and resp.choices[0].finish_reason == "stop"

    question = user("Is Paris the capital of France?")
    choices = ["Yes", "No"]
    want_choice = ngram_llm.chat(
        question,
        SamplingParams(
            temperature=0, max_tokens=8, structured_outputs=StructuredOutputsParams(choice=choices)
        ),
    )[0].text
    assert want_choice in choices
    for extra in ({"guided_choice": choices}, {"structured_outputs": {"choice": choices}}):
        resp = client.chat.completions.create(
            model=MODEL, messages=question, temperature=0, max_tokens=8, extra_body=extra
        )
        assert resp.choices[0].message.content == want_choice, extra

    # json_object on the completions endpoint, streamed: the pieces join into one object.
    stream = client.completions.create(
        model=MODEL,
        prompt='A JSON object with one key, "answer", holding 2 + 2: ',
        temperature=0,
        max_tokens=32,
        stream=True,
        extra_body={"response_format": {"type": "json_object"}},
    )
    streamed = "".join(chunk.choices[0].text for chunk in stream if chunk.choices)
    assert isinstance(json.loads(streamed), dict), streamed
    regex = r"[0-9]{3}-[0-9]{4}"
    status, _, raw = server.request(
        "POST", COMPLETIONS, cmpl(prompt="Phone: ", temperature=0, max_tokens=12, guided_regex=regex)
    )
    assert status == 200, raw
    assert re.fullmatch(regex, json.loads(raw)["choices"][0]["text"])

    # A context-free grammar (vLLM's documentation example), by either of its names.
    sql = user("Generate an SQL query to show the 'username' and 'email' from the 'users' table.")
    want_sql = ngram_llm.chat(
        sql,
        SamplingParams(
            temperature=0, max_tokens=40, structured_outputs=StructuredOutputsParams(grammar=SQL_GRAMMAR)
        ),
    )[0].text
    assert re.fullmatch(r"SELECT col_[12]  from table_[12]  where col_[12] = [12] ", want_sql), want_sql
    for extra in ({"guided_grammar": SQL_GRAMMAR}, {"structured_outputs": {"grammar": SQL_GRAMMAR}}):
        resp = client.chat.completions.create(
            model=MODEL, messages=sql, temperature=0, max_tokens=40, extra_body=extra
        )
        assert resp.choices[0].message.content == want_sql, extra

    # A structural tag: xgrammar's shape as a response_format and as JSON text in
    # structured_outputs, and vLLM's earlier `structures` shape.
    weather = user("What is the weather in Paris? Call get_weather.")
    legacy = {
        "type": "structural_tag",
        "structures": [{"begin": "<city>", "schema": {"type": "string", "maxLength": 12}, "end": "</city>"}],
        "triggers": ["<city>"],
    }
    for tag, extra in (
        (ONE_WEATHER_CALL, {"response_format": ONE_WEATHER_CALL}),
        (ONE_WEATHER_CALL, {"structured_outputs": {"structural_tag": json.dumps(ONE_WEATHER_CALL)}}),
        (legacy, {"response_format": legacy}),
    ):
        want_tag = ngram_llm.chat(
            weather,
            SamplingParams(
                temperature=0, max_tokens=24, structured_outputs=StructuredOutputsParams(structural_tag=tag)
            ),
        )[0].text
        if tag is ONE_WEATHER_CALL:
            assert re.fullmatch(ONE_WEATHER_CALL_RE, want_tag), want_tag
        resp = client.chat.completions.create(
            model=MODEL, messages=weather, temperature=0, max_tokens=24, extra_body=extra
        )
        assert resp.choices[0].message.content == want_tag, extra


def test_continue_final_message_continues_the_prefilled_answer_as_llm_chat_does(
    client: openai.OpenAI, server: Server, ngram_llm: LLM
) -> None:
    messages: list[Any] = [
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "The capital of France is"},
    ]
    flags = {"add_generation_prompt": False, "continue_final_message": True}
    want = ngram_llm.chat(messages, SamplingParams(temperature=0.0, max_tokens=6), **flags)[0]
    resp = client.chat.completions.create(
        model=MODEL, messages=messages, temperature=0, max_tokens=6, extra_body=flags
    )
    assert resp.choices[0].message.content == want.text
    assert resp.usage.prompt_tokens == len(want.prompt_token_ids)
    status, _, raw = server.request("POST", "/tokenize", {"messages": messages, **flags})
    assert status == 200, raw
    assert json.loads(raw)["tokens"] == want.prompt_token_ids


def params_body(params: SamplingParams) -> dict[str, Any]:
    """The request fields of `params` that these tests set."""
    body: dict[str, Any] = {"temperature": params.temperature, "max_tokens": params.max_tokens}
    if params.prompt_logprobs is not None:
        body["prompt_logprobs"] = params.prompt_logprobs
    return body


def test_completion_equals_llm_generate_on_the_text_prompt(client: openai.OpenAI, ngram_llm: LLM) -> None:
    resp = client.completions.create(model=MODEL, prompt=TEXT_PROMPT, temperature=0, max_tokens=40)
    out = ngram_llm.generate(TEXT_PROMPT, SamplingParams(temperature=0.0, max_tokens=40))[0]
    assert resp.object == "text_completion"
    assert resp.choices[0].text == out.text
    assert resp.choices[0].finish_reason == out.finish_reason
    assert_usage_matches(resp.usage, out)


def test_streamed_completion_equals_llm_generate(client: openai.OpenAI, ngram_llm: LLM) -> None:
    stream = client.completions.create(
        model=MODEL,
        prompt=TEXT_PROMPT,
        temperature=0,
        max_tokens=40,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    out = ngram_llm.generate(TEXT_PROMPT, SamplingParams(temperature=0.0, max_tokens=40))[0]
    *content_chunks, usage_chunk = chunks
    assert "".join(c.choices[0].text for c in content_chunks) == out.text
    assert content_chunks[-1].choices[0].finish_reason == out.finish_reason
    assert usage_chunk.choices == []
    assert_usage_matches(usage_chunk.usage, out)


def test_streams_are_server_sent_events_ending_with_done(server: Server) -> None:
    for path, body in [
        ("/v1/chat/completions", {"messages": user("Say hello."), "max_tokens": 8}),
        ("/v1/completions", {"prompt": "Hello", "max_tokens": 8}),
    ]:
        events = sse_events(server, path, {"model": MODEL, "temperature": 0, "stream": True, **body})
        assert events[-1] == "[DONE]"
        assert events.count("[DONE]") == 1
        payloads = [json.loads(e) for e in events[:-1]]
        assert payloads[-1]["choices"][0]["finish_reason"] in ("stop", "length")


# --- models, health, metrics -----------------------------------------------------------------


def test_models_lists_the_served_model(client: openai.OpenAI, server: Server) -> None:
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    status, _, raw = server.request("GET", "/v1/models")
    body = json.loads(raw)
    assert status == 200 and body["object"] == "list"
    assert body["data"][0]["max_model_len"] == 2048
    assert body["data"][0]["owned_by"] == "spec-rs"


def test_retrieve_model_returns_the_listed_object_or_model_not_found(client: openai.OpenAI) -> None:
    listed = client.models.list().data[0]
    assert client.models.retrieve(MODEL) == listed
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-5")


def test_a_requests_own_chat_template_is_refused_unless_the_server_trusts_them(server: Server) -> None:
    template = {"chat_template": "{% for m in messages %}{{ m.content }}{% endfor %}"}
    for path, body in [
        (CHAT, {"model": MODEL, "messages": HI, "max_tokens": 2, **template}),
        ("/tokenize", {"model": MODEL, "messages": HI, **template}),
    ]:
        status, _, raw = server.request("POST", path, body)
        assert status == 400, raw
        err = assert_openai_error(raw, 400, "chat_template", None)
        assert "--trust-request-chat-template" in err["message"], err


def test_tokenize_and_detokenize_use_the_served_tokenizer_and_chat_template(
    server: Server, ngram_llm: LLM
) -> None:
    text = "The sky is blue."
    status, _, raw = server.request("POST", "/tokenize", {"model": MODEL, "prompt": text})
    assert status == 200, raw
    body = json.loads(raw)
    assert body["tokens"] == ngram_llm.tokenize(text)
    assert body["count"] == len(body["tokens"]) and body["max_model_len"] >= body["count"]
    status, _, raw = server.request("POST", "/tokenize", {"messages": HI})
    assert status == 200, raw
    rendered = ngram_llm.apply_chat_template(HI)
    assert json.loads(raw)["tokens"] == ngram_llm.tokenize(rendered, add_special_tokens=False)
    status, _, raw = server.request("POST", "/detokenize", {"tokens": body["tokens"]})
    assert status == 200, raw
    assert json.loads(raw) == {"prompt": ngram_llm.detokenize(body["tokens"], skip_special_tokens=False)}
    assert text in json.loads(raw)["prompt"]


def test_health_reports_ok(server: Server) -> None:
    status, _, raw = server.request("GET", "/health")
    assert status == 200
    assert json.loads(raw) == {"status": "ok"}


def test_metrics_parse_and_expose_the_spec_decode_series(server: Server, client: openai.OpenAI) -> None:
    client.chat.completions.create(model=MODEL, messages=user(CHAT_PROMPTS[0]), temperature=0, max_tokens=24)
    status, headers, _raw = server.request("GET", "/metrics")
    assert status == 200
    assert headers["content-type"].startswith("text/plain")
    m = server.metrics()
    for name in (
        "specrs_spec_decode_num_drafts_total",
        "specrs_spec_decode_num_draft_tokens_total",
        "specrs_spec_decode_num_accepted_tokens_total",
        "specrs_kv_cache_free_blocks",
        "specrs_kv_cache_total_blocks",
        "specrs_num_requests_running",
        "specrs_num_requests_waiting",
        "specrs_generation_tokens_total",
        "specrs_spec_decode_avg_acceptance_length_count",
    ):
        assert name in m, name
    assert m["specrs_spec_decode_num_drafts_total"] > 0
    assert (
        0
        < m["specrs_spec_decode_num_accepted_tokens_total"]
        <= m["specrs_spec_decode_num_draft_tokens_total"]
    )
    per_pos = {
        k: v for k, v in m.items() if k.startswith("specrs_spec_decode_num_accepted_tokens_per_pos_total{")
    }
    assert set(per_pos) == {
        f'specrs_spec_decode_num_accepted_tokens_per_pos_total{{position="{i}"}}' for i in range(3)
    }
    assert sum(per_pos.values()) == m["specrs_spec_decode_num_accepted_tokens_total"]
    assert any(k.startswith("specrs_spec_decode_acceptance_rate_per_position_bucket{") for k in m)
    assert (
        m['specrs_spec_decode_avg_acceptance_length_bucket{le="+Inf"}']
        == m["specrs_spec_decode_avg_acceptance_length_count"]
    )


# --- bad input -------------------------------------------------------------------------------

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
HI = user("hi")


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": HI, **fields}


def cmpl(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": "hi", **fields}


TOOL = {"type": "function", "function": {"name": "f", "parameters": {}}}
OVERSIZED = b'{"prompt": "' + b"x" * (9 << 20) + b'"}'

BAD_REQUESTS = [
    # id, path, body, status, param, code
    ("malformed-json", CHAT, b'{"model": "x", "messages": [', 400, None, None),
    ("non-object-body", CHAT, b"[1, 2, 3]", 400, None, None),
    ("unknown-model", CHAT, chat(model="gpt-5"), 404, "model", "model_not_found"),
    ("max-tokens-wrong-type", CHAT, chat(max_tokens="ten"), 400, "max_tokens", None),
    ("temperature-wrong-type", CHAT, chat(temperature="hot"), 400, "temperature", None),
    ("temperature-out-of-range", CHAT, chat(temperature=5), 400, "temperature", None),
    ("top-p-zero", CHAT, chat(top_p=0), 400, "top_p", None),
    ("n-2-greedy", CHAT, chat(n=2, temperature=0), 400, "n", None),
    ("n-0", CHAT, chat(n=0), 400, "n", None),
    ("n-past-max-num-seqs", CHAT, chat(n=100_000), 400, "n", None),
    ("best-of-below-n", COMPLETIONS, cmpl(n=2, best_of=1), 400, "best_of", None),
    ("best-of-above-n", COMPLETIONS, cmpl(best_of=3), 400, "best_of", None),
    ("beam-search", COMPLETIONS, cmpl(use_beam_search=True), 400, "use_beam_search", None),
    ("reasoning-effort-unknown", CHAT, chat(reasoning_effort="max"), 400, "reasoning_effort", None),
    ("top-logprobs-50", CHAT, chat(logprobs=True, top_logprobs=50), 400, "top_logprobs", None),
    ("max-tokens-0", CHAT, chat(max_tokens=0), 400, "max_tokens", None),
    ("max-completion-tokens-0", CHAT, chat(max_completion_tokens=0), 400, "max_completion_tokens", None),
    (
        "stream-options-without-stream",
        CHAT,
        chat(stream_options={"include_usage": True}),
        400,
        "stream_options",
        None,
    ),
    (
        "stream-options-with-stream-false",
        COMPLETIONS,
        cmpl(stream=False, stream_options={"include_usage": True}),
        400,
        "stream_options",
        None,
    ),
    (
        "response-format-unknown-type",
        CHAT,
        chat(response_format={"type": "xml"}),
        400,
        "response_format",
        None,
    ),
    (
        "response-format-json-schema-without-schema",
        CHAT,
        chat(response_format={"type": "json_schema", "json_schema": {"name": "x"}}),
        400,
        "response_format",
        None,
    ),
    (
        "response-format-unsupported-keyword",
        COMPLETIONS,
        cmpl(
            response_format={
                "type": "json_schema",
                "json_schema": {"schema": {"type": "number", "maximum": 3}},
            }
        ),
        400,
        "response_format",
        None,
    ),
    (
        "response-format-structural-tag-token-level",
        CHAT,
        chat(response_format={"type": "structural_tag", "format": {"type": "any_tokens"}}),
        400,
        "response_format",
        None,
    ),
    (
        "structured-outputs-structural-tag-trigger-opens-no-tag",
        CHAT,
        chat(
            structured_outputs={
                "structural_tag": {
                    "structures": [{"begin": "<a>", "schema": {}, "end": "</a>"}],
                    "triggers": ["<b>"],
                }
            }
        ),
        400,
        "structured_outputs",
        None,
    ),
    ("guided-regex-invalid", CHAT, chat(guided_regex="("), 400, "guided_regex", None),
    ("guided-grammar-undefined-rule", CHAT, chat(guided_grammar="root ::= x"), 400, "guided_grammar", None),
    (
        "structured-outputs-lark-anchor",
        CHAT,
        chat(structured_outputs={"grammar": "start: /^a/"}),
        400,
        "structured_outputs",
        None,
    ),
    (
        "structured-outputs-grammar-left-recursive",
        CHAT,
        chat(structured_outputs={"grammar": 'root ::= root "a" | "a"'}),
        400,
        "structured_outputs",
        None,
    ),
    (
        "two-output-constraints",
        CHAT,
        chat(response_format={"type": "json_object"}, guided_choice=["a", "b"]),
        400,
        "guided_choice",
        None,
    ),
    ("structured-outputs-empty", CHAT, chat(structured_outputs={}), 400, "structured_outputs", None),
    ("tools", CHAT, chat(tools=[TOOL]), 400, "tools", None),
    ("tool-choice-required", CHAT, chat(tool_choice="required"), 400, "tool_choice", None),
    ("tool-choice-auto-with-tools", CHAT, chat(tools=[TOOL], tool_choice="auto"), 400, "tool_choice", None),
    ("logit-bias-not-an-id", CHAT, chat(logit_bias={"the": 5}), 400, "logit_bias", None),
    ("logit-bias-out-of-range", CHAT, chat(logit_bias={"5": 150}), 400, "logit_bias", None),
    ("logit-bias-outside-vocab", CHAT, chat(logit_bias={"99999999": 1}), 400, "logit_bias", None),
    ("logit-bias-not-an-object", COMPLETIONS, cmpl(logit_bias=[1, 2]), 400, "logit_bias", None),
    (
        "unknown-role",
        CHAT,
        chat(messages=[{"role": "wizard", "content": "hi"}]),
        400,
        "messages[0].role",
        None,
    ),
    ("empty-messages", CHAT, chat(messages=[]), 400, "messages", None),
    (
        "image-content-part",
        CHAT,
        chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]),
        400,
        "messages[0].content",
        None,
    ),
    ("penalty-without-logit-penalties", CHAT, chat(presence_penalty=0.5), 400, "presence_penalty", None),
    ("completion-max-tokens-0", COMPLETIONS, cmpl(max_tokens=0), 400, "max_tokens", None),
    ("completion-empty-prompt", COMPLETIONS, cmpl(prompt=[]), 400, "prompt", None),
    ("completion-logprobs-50", COMPLETIONS, cmpl(logprobs=50), 400, "logprobs", None),
    ("prompt-logprobs-stream", CHAT, chat(prompt_logprobs=1, stream=True), 400, "prompt_logprobs", None),
    ("prompt-logprobs-50", COMPLETIONS, cmpl(prompt_logprobs=50), 400, "prompt_logprobs", None),
    (
        "continue-final-message-with-generation-prompt",
        CHAT,
        chat(continue_final_message=True),
        400,
        "continue_final_message",
        None,
    ),
    ("allowed-token-ids-empty", CHAT, chat(allowed_token_ids=[]), 400, "allowed_token_ids", None),
    ("bad-words-blank", CHAT, chat(bad_words=["  "]), 400, "bad_words", None),
    (
        "allowed-token-ids-the-choice-cannot-start-with",
        CHAT,
        chat(allowed_token_ids=[2], structured_outputs={"choice": ["Yes"]}),
        400,
        "allowed_token_ids",
        None,
    ),
    (
        "allowed-token-ids-only-eos-under-min-tokens",
        COMPLETIONS,
        cmpl(allowed_token_ids=[2], min_tokens=3),
        400,
        "allowed_token_ids",
        None,
    ),
    (
        "allowed-token-ids-outside-vocab",
        CHAT,
        chat(allowed_token_ids=[1 << 30]),
        400,
        "allowed_token_ids",
        None,
    ),
    (
        "truncate-prompt-tokens-0",
        COMPLETIONS,
        cmpl(truncate_prompt_tokens=0),
        400,
        "truncate_prompt_tokens",
        None,
    ),
    ("completion-unknown-model", COMPLETIONS, cmpl(model="nope"), 404, "model", "model_not_found"),
    ("body-over-size-limit", COMPLETIONS, OVERSIZED, 413, None, None),
    ("tokenize-prompt-and-messages", "/tokenize", {"prompt": "a", "messages": HI}, 400, None, None),
    ("tokenize-nothing", "/tokenize", {}, 400, None, None),
    (
        "tokenize-unknown-model",
        "/tokenize",
        {"model": "nope", "prompt": "a"},
        404,
        "model",
        "model_not_found",
    ),
    (
        "tokenize-unknown-role",
        "/tokenize",
        {"messages": [{"role": "wizard", "content": "x"}]},
        400,
        "messages[0].role",
        None,
    ),
    ("detokenize-outside-vocab", "/detokenize", {"tokens": [99999999]}, 400, "tokens", None),
    ("detokenize-not-ids", "/detokenize", {"tokens": ["a"]}, 400, "tokens[0]", None),
]


def assert_openai_error(raw: bytes, status: int, param: str | None, code: str | None) -> dict[str, Any]:
    body = json.loads(raw)
    assert set(body) == {"error"}, body
    err: dict[str, Any] = body["error"]
    assert isinstance(err["message"], str) and err["message"]
    assert err["type"] == ("not_found_error" if status == 404 else "invalid_request_error")
    assert err["param"] == param, err
    assert err["code"] == code, err
    return err


@pytest.mark.parametrize(
    ("path", "body", "status", "param", "code"),
    [c[1:] for c in BAD_REQUESTS],
    ids=[c[0] for c in BAD_REQUESTS],
)
def test_bad_request_returns_openai_error_naming_the_field_and_server_keeps_serving(
    server: Server, path: str, body: Any, status: int, param: str | None, code: str | None
) -> None:
    got, headers, raw = server.request("POST", path, body)
    assert got == status, raw[:500]
    assert headers["content-type"] == "application/json"
    assert_openai_error(raw, status, param, code)
    ok, _, raw = server.request("POST", COMPLETIONS, {"model": MODEL, "prompt": "Hello", "max_tokens": 1})
    assert ok == 200, raw


def test_unknown_endpoint_is_a_404_openai_error(server: Server) -> None:
    status, _, raw = server.request("GET", "/v1/embeddings")
    assert status == 404
    assert_openai_error(raw, 404, None, None)


def test_masks_that_leave_no_token_mid_output_end_the_request_with_a_client_error(server: Server) -> None:
    status, tokenized = server.post_json(
        "/tokenize", {"model": MODEL, "prompt": "Yes", "add_special_tokens": False}
    )
    assert status == 200 and tokenized["count"] == 1, tokenized
    # "Yes" is allowed and starts the choice; after it the choice needs EOS, which the request
    # does not allow: a 400 naming the fields, not a 500 or junk text.
    dead_end = {
        "allowed_token_ids": tokenized["tokens"],
        "structured_outputs": {"choice": ["Yes"]},
        "temperature": 0,
        "max_tokens": 8,
    }
    status, _, raw = server.request("POST", CHAT, chat(**dead_end))
    err = assert_openai_error(raw, 400, None, None)
    assert "output token 1" in err["message"], err
    assert "allowed_token_ids and structured_outputs" in err["message"], err

    # Streamed, the status is out before the dead end: the text so far, then an error event.
    events = sse_events(server, COMPLETIONS, cmpl(stream=True, **dead_end))
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert error["type"] == "invalid_request_error" and "output token 1" in error["message"], error
    text = "".join(c["text"] for e in events[:-2] for c in json.loads(e)["choices"])
    assert text == "Yes"

    # The server goes on serving.
    status, body = server.post_json(CHAT, chat(max_tokens=2, temperature=0))
    assert status == 200 and body["choices"][0]["finish_reason"] == "length", body


def test_openai_client_raises_typed_errors(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-5", messages=HI)
    with pytest.raises(openai.BadRequestError) as excinfo:
        client.chat.completions.create(model=MODEL, messages=HI, temperature=5)
    assert excinfo.value.param == "temperature"  # type: ignore[attr-defined]


def test_prompt_longer_than_the_context_is_context_length_exceeded(
    serve: Callable[..., Server], default_model_path: str
) -> None:
    short = serve("--max-model-len", "128", "--kv-cache-memory", str(32 << 20))
    long_text = "word " * 200
    for path, body, param in [
        (CHAT, {"model": MODEL, "messages": user(long_text)}, "messages"),
        (COMPLETIONS, {"model": MODEL, "prompt": long_text}, "prompt"),
    ]:
        status, _, raw = short.request("POST", path, body)
        assert status == 400, raw
        err = assert_openai_error(raw, 400, param, "context_length_exceeded")
        assert "128" in err["message"]
    status, _, raw = short.request("POST", COMPLETIONS, {"model": MODEL, "prompt": "Hello", "max_tokens": 2})
    assert status == 200, raw
    # A prompt that fits but a max_tokens past the room it leaves is refused, as vLLM's server
    # does, rather than cut short; unset, max_tokens runs to the end of the context.
    for path, body, field in [
        (COMPLETIONS, {"model": MODEL, "prompt": "Hello", "max_tokens": 200}, "max_tokens"),
        (CHAT, {"model": MODEL, "messages": HI, "max_tokens": 200}, "max_tokens"),
        (CHAT, {"model": MODEL, "messages": HI, "max_completion_tokens": 128}, "max_completion_tokens"),
    ]:
        status, _, raw = short.request("POST", path, body)
        assert status == 400, raw
        err = assert_openai_error(raw, 400, field, "context_length_exceeded")
        assert "128" in err["message"] and f"lower {field}" in err["message"], err
    unbounded = {"model": MODEL, "messages": HI, "temperature": 0, "ignore_eos": True}
    status, out = short.post_json(CHAT, unbounded)
    assert status == 200 and out["choices"][0]["finish_reason"] == "length", out
    assert out["usage"]["total_tokens"] == 128, out["usage"]


# --- API key ---------------------------------------------------------------------------------

API_KEY = "test-key-123"


@pytest.fixture(scope="module")
def auth_server(serve: Callable[..., Server], default_model_path: str) -> Server:
    return serve("--api-key", API_KEY, *SMALL_ENGINE_ARGS)


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", "/v1/models", None),
        ("GET", "/metrics", None),
        ("POST", CHAT, {"model": MODEL, "messages": HI, "max_tokens": 1}),
        ("POST", COMPLETIONS, {"model": MODEL, "prompt": "hi", "max_tokens": 1}),
        ("GET", f"/v1/models/{MODEL}", None),
        ("POST", "/tokenize", {"prompt": "hi"}),
        ("POST", "/detokenize", {"tokens": [1, 2]}),
    ],
)
def test_api_key_is_required_on_every_endpoint_but_health(
    auth_server: Server, method: str, path: str, body: Any
) -> None:
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": API_KEY}):
        status, _, raw = auth_server.request(method, path, body, headers=headers)
        assert status == 401, (headers, raw)
        assert json.loads(raw)["error"]["type"] == "authentication_error"
    status, _, raw = auth_server.request(method, path, body, headers={"Authorization": f"Bearer {API_KEY}"})
    assert status == 200, raw


def test_version_needs_no_api_key_and_is_the_package_version(auth_server: Server) -> None:
    status, _, raw = auth_server.request("GET", "/version")
    assert status == 200, raw
    assert json.loads(raw) == {"version": spec_rs.__version__}


def test_health_needs_no_api_key(auth_server: Server) -> None:
    status, _, raw = auth_server.request("GET", "/health")
    assert status == 200 and json.loads(raw) == {"status": "ok"}


def test_openai_client_with_the_api_key_works(auth_server: Server, openai_client: Callable[..., Any]) -> None:
    resp = openai_client(auth_server, api_key=API_KEY).chat.completions.create(
        model=MODEL, messages=HI, max_tokens=4, temperature=0
    )
    assert resp.usage.completion_tokens >= 1
    with pytest.raises(openai.AuthenticationError):
        openai_client(auth_server, api_key="wrong").models.list()


# --- load ------------------------------------------------------------------------------------

WORDS = [
    "river",
    "mountain",
    "code",
    "python",
    "rust",
    "speculative",
    "token",
    "cache",
    "garden",
    "music",
    "ocean",
    "planet",
    "history",
    "science",
    "kitchen",
    "recipe",
    "winter",
    "summer",
    "robot",
    "engine",
    "story",
    "number",
    "table",
    "window",
]


async def _load(
    client: openai.AsyncOpenAI, num_requests: int, concurrency: int, seed: int
) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    plans = [
        {
            "prompt": "Write about " + " ".join(rng.choices(WORDS, k=rng.randint(3, 12))) + ".",
            "max_tokens": rng.randint(8, 64),
            "disconnect": rng.random() < 0.25,
            "temperature": rng.choice([0.0, 0.7]),
        }
        for _ in range(num_requests)
    ]
    sem = asyncio.Semaphore(concurrency)

    async def one(plan: dict[str, Any]) -> dict[str, Any]:
        async with sem:
            result: dict[str, Any] = {
                **plan,
                "ttft": None,
                "itl": [],
                "finish": None,
                "usage": None,
                "error": None,
            }
            start = last = time.perf_counter()
            try:
                stream = await client.chat.completions.create(
                    model=MODEL,
                    messages=user(plan["prompt"]),
                    max_tokens=plan["max_tokens"],
                    temperature=plan["temperature"],
                    seed=1,
                    stream=True,
                    stream_options={"include_usage": True},
                )
                content_chunks = 0
                async for chunk in stream:
                    now = time.perf_counter()
                    if chunk.usage is not None:
                        result["usage"] = chunk.usage
                    if not chunk.choices:
                        continue
                    if chunk.choices[0].delta.content:
                        if result["ttft"] is None:
                            result["ttft"] = now - start
                        else:
                            result["itl"].append(now - last)
                        last = now
                        content_chunks += 1
                        if plan["disconnect"] and content_chunks >= 3:
                            await stream.close()
                            break
                    if chunk.choices[0].finish_reason is not None:
                        result["finish"] = chunk.choices[0].finish_reason
            except Exception as e:  # recorded and asserted on below
                result["error"] = repr(e)
            return result

    return await asyncio.gather(*(one(p) for p in plans))


def test_concurrent_streaming_load_with_disconnects_leaks_no_kv_blocks(
    server: Server, openai_client: Callable[..., Any]
) -> None:
    before = server.metrics()
    client = openai_client(server, async_=True)
    started = time.perf_counter()
    results = asyncio.run(_load(client, num_requests=96, concurrency=64, seed=0))
    elapsed = time.perf_counter() - started

    errors = [r["error"] for r in results if r["error"]]
    assert not errors, errors[:5]
    # Streams the client did not close must run to their end; closed ones may have ended first.
    assert all(r["finish"] is not None for r in results if not r["disconnect"])
    ended = [r for r in results if r["finish"] is not None]
    for r in ended:
        assert r["finish"] in ("stop", "length"), r
        assert r["usage"] is not None, r
        assert 1 <= r["usage"].completion_tokens <= r["max_tokens"]
        if r["finish"] == "length":
            assert r["usage"].completion_tokens == r["max_tokens"], r
    assert all(r["ttft"] is not None for r in results), "every stream must deliver text"

    after = wait_for_idle_engine(server)
    assert after["specrs_kv_cache_free_blocks"] == after["specrs_kv_cache_total_blocks"], "KV blocks leaked"
    assert after["specrs_num_requests_running"] == 0
    assert after["specrs_num_requests_waiting"] == 0
    assert after["specrs_num_requests_in_flight"] == 0
    finished = sum(
        after[k] - before.get(k, 0) for k in after if k.startswith("specrs_request_success_total{")
    )
    assert finished == 96
    assert after['specrs_request_success_total{finished_reason="error"}'] == before.get(
        'specrs_request_success_total{finished_reason="error"}', 0
    )

    ttft = [r["ttft"] for r in results if r["ttft"] is not None]
    itl = [x for r in results for x in r["itl"]]
    report = {
        "requests": len(results),
        "concurrency": 64,
        "disconnected": sum(r["disconnect"] for r in results),
        "wall_s": round(elapsed, 3),
        "generated_tokens": int(
            after["specrs_generation_tokens_total"] - before["specrs_generation_tokens_total"]
        ),
        "ttft_p50_s": round(statistics.median(ttft), 4),
        "ttft_p99_s": round(percentile(ttft, 99), 4),
        "itl_p50_s": round(statistics.median(itl), 4),
        "itl_p99_s": round(percentile(itl, 99), 4),
    }
    print("\nload test:", json.dumps(report))
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / ".gitignore").write_text("*\n")
    (ARTIFACTS / "load_test.json").write_text(json.dumps(report, indent=2) + "\n")


# --- metrics agree with usage ------------------------------------------------------------------


def test_metrics_counters_equal_the_sum_of_per_request_usage(
    serve: Callable[..., Server], openai_client: Callable[..., Any], default_model_path: str
) -> None:
    fresh = serve(*SPEC_ARGS, *SMALL_ENGINE_ARGS)
    client = openai_client(fresh)
    usages = [
        client.chat.completions.create(model=MODEL, messages=user(p), temperature=0, max_tokens=32).usage
        for p in CHAT_PROMPTS
    ]
    usages.append(
        client.completions.create(
            model=MODEL, prompt=[TEXT_PROMPT, "1, 2, 3, 4, 5,"], temperature=0, max_tokens=24
        ).usage
    )
    m = fresh.metrics()
    specs = [usage_spec(u) for u in usages]
    for field in ("num_drafts", "num_draft_tokens", "num_accepted_tokens"):
        assert m[f"specrs_spec_decode_{field}_total"] == sum(s.get(field, 0) for s in specs), field
    assert m["specrs_spec_decode_num_drafts_total"] > 0
    per_pos = [0] * 3
    for s in specs:
        for i, v in enumerate(s.get("accepted_per_position", [])):
            per_pos[i] += v
    for i, v in enumerate(per_pos):
        assert m[f'specrs_spec_decode_num_accepted_tokens_per_pos_total{{position="{i}"}}'] == v
    assert m["specrs_generation_tokens_total"] == sum(u.completion_tokens for u in usages)
    assert m["specrs_prompt_tokens_total"] == sum(u.prompt_tokens for u in usages)
    assert sum(v for k, v in m.items() if k.startswith("specrs_request_success_total{")) == 4
    cached = [u.prompt_tokens_details.cached_tokens for u in usages]
    assert cached[1] > 0, "the second chat reuses the chat template's system prompt"
    assert m["specrs_prefix_cache_hits_total"] == sum(cached)
    assert m["specrs_prefix_cache_queries_total"] == m["specrs_prompt_tokens_total"]


# --- prefix caching -------------------------------------------------------------------------


def test_a_repeated_prompt_reports_cached_tokens_until_the_prefix_cache_is_reset(
    server: Server, client: openai.OpenAI, ngram_llm: LLM
) -> None:
    messages = user("Explain in two sentences why the sky is blue, for a curious seven-year-old child.")

    def ask() -> Any:
        return client.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=12)

    first, second = ask(), ask()
    assert second.choices[0].message.content == first.choices[0].message.content
    assert second.choices[0].message.content == expected_chat(ngram_llm, messages[0]["content"], 12).text
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert 16 <= cached < second.usage.prompt_tokens, "every full block but the last token's"
    status, body = server.post_json("/reset_prefix_cache", {})
    assert status == 200 and body["status"] == "ok" and body["forgotten_blocks"] > 0
    assert ask().usage.prompt_tokens_details.cached_tokens == 0
    status, body = server.post_json("/reset_suffix_cache", {})
    assert (status, body) == (200, {"status": "ok", "forgotten_outputs": 0}), "n-gram keeps no outputs"


def test_reset_suffix_cache_makes_a_repeated_request_draft_as_the_first_time(
    serve: Callable[..., Server], default_model_path: str
) -> None:
    suffix = serve("--speculative-method", "suffix", "--num-speculative-tokens", "16", *SMALL_ENGINE_ARGS)
    prompt = "List the colours of the rainbow, one per line:"
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 40, "temperature": 0, "ignore_eos": True}

    def accepted() -> float:
        status, out = suffix.post_json("/v1/completions", body, timeout=60)
        assert status == 200, out
        return suffix.metrics()["specrs_spec_decode_num_accepted_tokens_total"]

    first = accepted()
    repeat = accepted() - first
    assert repeat >= 16, f"the repeat is drafted from the first answer ({repeat} accepted)"
    status, reset = suffix.post_json("/reset_suffix_cache", {})
    assert (status, reset) == (200, {"status": "ok", "forgotten_outputs": 2})
    assert accepted() - first - repeat == first, "after the reset the request drafts as the first time"


# --- overload --------------------------------------------------------------------------------


def test_overload_answers_429_with_retry_after_and_no_5xx(
    serve: Callable[..., Server], default_model_path: str
) -> None:
    busy = serve("--max-num-seqs", "1", "--max-pending", "1", *SMALL_ENGINE_ARGS)
    body = {"model": MODEL, "prompt": "Tell me a story", "max_tokens": 24, "ignore_eos": True}
    results: list[tuple[int, dict[str, str], bytes]] = []
    barrier = threading.Barrier(10)

    def fire() -> None:
        barrier.wait(timeout=10)
        results.append(busy.request("POST", COMPLETIONS, body, timeout=60))

    threads = [threading.Thread(target=fire) for _ in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=90)
    assert len(results) == 10
    statuses = sorted(status for status, _, _ in results)
    assert all(s < 500 for s in statuses), statuses
    assert set(statuses) <= {200, 429}, statuses
    assert 1 <= statuses.count(200) <= 8
    assert statuses.count(429) >= 2
    for status, headers, raw in results:
        if status == 429:
            assert int(headers["retry-after"]) >= 1
            assert json.loads(raw)["error"]["type"] == "rate_limit_error"
        else:
            assert json.loads(raw)["usage"]["completion_tokens"] == 24
    status, _, _ = busy.request("POST", COMPLETIONS, {**body, "max_tokens": 2})
    assert status == 200
    # A batch larger than the server ever holds (1 running + 1 pending) cannot succeed by
    # retrying: a 400 naming the prompt, not a 429.
    status, headers, raw = busy.request("POST", COMPLETIONS, {**body, "prompt": ["a", "b", "c"]})
    assert status == 400, raw
    err = json.loads(raw)["error"]
    assert err["param"] == "prompt" and "split it" in err["message"], err
    assert "retry-after" not in headers


# --- graceful shutdown -------------------------------------------------------------------------


def test_sigterm_during_a_stream_ends_the_stream_and_exits_zero(
    serve: Callable[..., Server], default_model_path: str
) -> None:
    grace = 2.0
    srv = serve("--shutdown-timeout", str(grace), *SMALL_ENGINE_ARGS)
    host, port = srv.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    body = {
        "model": MODEL,
        "messages": user("Tell me a long story."),
        "max_tokens": 900,
        "ignore_eos": True,
        "stream": True,
    }
    conn.request("POST", CHAT, json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200
    for _ in range(6):  # a few events: the request is running
        assert resp.readline().startswith((b"data: ", b"\n"))
    signalled = time.monotonic()
    srv.proc.send_signal(signal.SIGTERM)
    rest = resp.read().decode()  # returns once the server ends the stream
    stream_ended = time.monotonic() - signalled
    conn.close()
    assert srv.proc.wait(timeout=grace + 15) == 0
    exited = time.monotonic() - signalled
    assert stream_ended < grace + 10
    assert exited < grace + 15
    events = [ln.removeprefix("data: ") for ln in rest.split("\n") if ln.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2])["choices"][0]["finish_reason"] in ("abort", "length")
