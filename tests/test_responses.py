"""OpenAI's Responses API (`/v1/responses`) on a `spec-rs serve` subprocess, through the
official `openai` client and raw HTTP: the same text, tool calls and usage as
`/v1/chat/completions` for the same conversation, typed stream events that add up to the
stored response, `previous_response_id` continuing a conversation (tool results included),
`text.format` and logprobs, GET / DELETE of stored responses, and 4xx errors naming the field."""

from __future__ import annotations

import http.client
import json
from collections.abc import Callable
from typing import Any

import jsonschema
import openai
import pytest

from conftest import ASK, TOOLS, TOOLS_TEMPLATE, WEATHER, Server

pytestmark = pytest.mark.timeout(240)

MODEL = "smollm2-135m-instruct"
SPEC_ARGS = ("--speculative-method", "ngram", "--num-speculative-tokens", "3")
ENGINE_ARGS = ("--kv-cache-memory", str(256 << 20), "--max-model-len", "2048")
PROMPT = "List the numbers from 1 to 20, separated by commas."
#: The chat tools in the Responses API's flat form.
RESPONSE_TOOLS = [{"type": "function", **tool["function"]} for tool in TOOLS]
WEATHER_CHOICE = {"type": "function", "name": "get_weather"}


@pytest.fixture(scope="module")
def server(serve: Callable[..., Server], tmp_path_factory: pytest.TempPathFactory) -> Server:
    """n-gram speculation, the tools template, and `"auto"` calls read as Hermes calls."""
    template = tmp_path_factory.mktemp("templates") / "tools.jinja"
    template.write_text(TOOLS_TEMPLATE)
    return serve(
        *SPEC_ARGS,
        *ENGINE_ARGS,
        "--chat-template",
        str(template),
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        "hermes",
    )


@pytest.fixture(scope="module")
def client(server: Server, openai_client: Callable[..., Any]) -> openai.OpenAI:
    c: openai.OpenAI = openai_client(server)
    return c


def request(server: Server, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, bytes]:
    """One HTTP request (60 s at most): its status and body."""
    host, port = server.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        payload = None if body is None else json.dumps(body)
        conn.request(method, path, payload, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def stream_events(server: Server, body: dict[str, Any]) -> list[dict[str, Any]]:
    """A streamed response's events in order, each `event:` name checked against its `type`."""
    status, raw = request(server, "POST", "/v1/responses", {**body, "stream": True})
    assert status == 200, raw
    events = []
    for block in raw.decode().split("\n\n"):
        lines = [ln for ln in block.split("\n") if ln and not ln.startswith(":")]
        if not lines:
            continue
        name = next(ln.removeprefix("event: ") for ln in lines if ln.startswith("event: "))
        data = json.loads(next(ln.removeprefix("data: ") for ln in lines if ln.startswith("data: ")))
        assert data["type"] == name
        events.append(data)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    return events


def chat(client: openai.OpenAI, messages: list[dict[str, Any]], **fields: Any) -> Any:
    return client.chat.completions.create(model=MODEL, messages=messages, temperature=0, **fields)  # type: ignore[call-overload]


def without_ids(output: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in item.items() if k != "id"} for item in output]


def assert_openai_error(raw: bytes, status: int, param: str | None) -> None:
    body = json.loads(raw)
    assert set(body) == {"error"}, body
    err = body["error"]
    assert err["message"], body
    assert err["type"] == ("not_found_error" if status == 404 else "invalid_request_error"), body
    assert err["param"] == param, body


def test_a_response_has_the_text_and_usage_of_the_chat_completion_of_its_conversation(
    client: openai.OpenAI,
) -> None:
    resp = client.responses.create(
        model=MODEL, instructions="You are terse.", input=PROMPT, temperature=0, max_output_tokens=40
    )
    expected = chat(
        client,
        [{"role": "system", "content": "You are terse."}, {"role": "user", "content": PROMPT}],
        max_tokens=40,
    )
    assert resp.object == "response" and resp.id.startswith("resp_")
    assert resp.output_text == expected.choices[0].message.content
    assert [item.type for item in resp.output] == ["message"]
    # 40 tokens do not reach the end of the list.
    assert expected.choices[0].finish_reason == "length"
    assert resp.status == "incomplete" and resp.incomplete_details is not None
    assert resp.incomplete_details.reason == "max_output_tokens"
    assert resp.usage is not None and expected.usage is not None
    assert (resp.usage.input_tokens, resp.usage.output_tokens) == (
        expected.usage.prompt_tokens,
        expected.usage.completion_tokens,
    )
    assert resp.usage.total_tokens == resp.usage.input_tokens + resp.usage.output_tokens
    assert resp.usage.output_tokens_details.reasoning_tokens == 0
    # The speculative statistics ride the usage as on chat completions.
    spec = resp.usage.model_extra["spec_decode"] if resp.usage.model_extra else None
    assert spec is not None and spec["num_drafts"] > 0
    assert (resp.instructions, resp.max_output_tokens, resp.temperature, resp.store) == (
        "You are terse.",
        40,
        0,
        True,
    )

    short = client.responses.create(model=MODEL, input="Say hi.", temperature=0, max_output_tokens=200)
    assert short.status == "completed" and short.incomplete_details is None
    assert short.output[0].type == "message" and short.output[0].status == "completed"


def test_stream_events_add_up_to_the_response_that_is_stored(server: Server, client: openai.OpenAI) -> None:
    body = {"model": MODEL, "input": PROMPT, "temperature": 0, "max_output_tokens": 30}
    events = stream_events(server, body)
    kinds = [e["type"] for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",
    ]
    assert events[0]["response"]["status"] == "in_progress" and events[0]["response"]["output"] == []
    final = events[-1]["response"]
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert text == final["output"][0]["content"][0]["text"]
    assert all(e["item_id"] == final["output"][0]["id"] for e in events if "item_id" in e)
    status, whole = request(server, "POST", "/v1/responses", body)
    assert status == 200
    assert without_ids(final["output"]) == without_ids(json.loads(whole)["output"])
    # The streamed response is stored as it ended.
    status, raw = request(server, "GET", f"/v1/responses/{final['id']}")
    assert status == 200 and json.loads(raw) == final

    # The official client reads every event into its typed model, and its stream helper
    # gathers a completed response.
    typed = list(client.responses.create(stream=True, **body))  # type: ignore[call-overload]
    assert [e.type for e in typed] == kinds
    assert typed[-1].response.output_text == text
    short = {"model": MODEL, "input": "Say hi.", "temperature": 0, "max_output_tokens": 200}
    with client.responses.stream(**short) as stream:  # type: ignore[arg-type]
        gathered = stream.get_final_response()
    assert gathered.status == "completed"
    assert gathered.output_text == client.responses.create(**short).output_text  # type: ignore[arg-type]


def test_previous_response_id_continues_the_conversation_without_its_instructions(
    client: openai.OpenAI,
) -> None:
    first_ask = "My name is Ada. Remember it."
    first = client.responses.create(
        model=MODEL,
        instructions="Answer in one sentence.",
        input=first_ask,
        temperature=0,
        max_output_tokens=30,
    )
    second = client.responses.create(
        model=MODEL,
        previous_response_id=first.id,
        input="What is my name?",
        temperature=0,
        max_output_tokens=30,
    )
    assert second.previous_response_id == first.id
    expected = chat(
        client,
        [
            {"role": "user", "content": first_ask},
            {"role": "assistant", "content": first.output_text},
            {"role": "user", "content": "What is my name?"},
        ],
        max_tokens=30,
    )
    assert second.output_text == expected.choices[0].message.content
    assert second.usage is not None and expected.usage is not None
    assert second.usage.input_tokens == expected.usage.prompt_tokens


def test_a_named_function_is_called_and_its_output_continues_the_conversation(client: openai.OpenAI) -> None:
    resp = client.responses.create(
        model=MODEL,
        input=ASK,
        tools=RESPONSE_TOOLS,
        tool_choice=WEATHER_CHOICE,
        temperature=0,
        max_output_tokens=48,
    )  # type: ignore[arg-type]
    assert [item.type for item in resp.output] == ["function_call"]
    call = resp.output[0]
    assert call.type == "function_call" and call.name == "get_weather" and call.status == "completed"
    jsonschema.validate(json.loads(call.arguments), WEATHER)
    chat_call = (
        chat(
            client,
            ASK,
            tools=TOOLS,
            tool_choice={"type": "function", "function": {"name": "get_weather"}},
            max_tokens=48,
        )
        .choices[0]
        .message.tool_calls[0]
    )
    assert call.arguments == chat_call.function.arguments, "the same constrained call as chat's"

    result = "12 degrees and sunny"
    answer = client.responses.create(
        model=MODEL,
        previous_response_id=resp.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": result}],
        tools=RESPONSE_TOOLS,
        tool_choice="none",
        temperature=0,
        max_output_tokens=40,
    )  # type: ignore[arg-type]
    expected = chat(
        client,
        [
            *ASK,
            {"role": "assistant", "content": None, "tool_calls": [chat_call.model_dump()]},
            {"role": "tool", "tool_call_id": chat_call.id, "content": result},
        ],
        tools=TOOLS,
        tool_choice="none",
        max_tokens=40,
    )
    assert answer.output_text == expected.choices[0].message.content
    # The same conversation sent whole, as stateless clients do, gives the same answer.
    stateless = client.responses.create(
        model=MODEL,
        input=[
            *ASK,
            {
                "type": "function_call",
                "call_id": call.call_id,
                "name": call.name,
                "arguments": call.arguments,
            },
            {"type": "function_call_output", "call_id": call.call_id, "output": result},
        ],
        tools=RESPONSE_TOOLS,
        tool_choice="none",
        temperature=0,
        max_output_tokens=40,
        store=False,
    )  # type: ignore[arg-type]
    assert stateless.output_text == answer.output_text


def test_a_response_cut_inside_its_call_is_refused_as_a_start_naming_it(server: Server) -> None:
    body = {"model": MODEL, "input": ASK, "tools": RESPONSE_TOOLS, "tool_choice": WEATHER_CHOICE}
    status, raw = request(server, "POST", "/v1/responses", {**body, "temperature": 0, "max_output_tokens": 3})
    assert status == 200, raw
    cut = json.loads(raw)
    assert cut["status"] == "incomplete" and cut["output"][-1]["type"] == "function_call", cut
    call_id = cut["output"][-1]["call_id"]
    follow_up = {
        "model": MODEL,
        "previous_response_id": cut["id"],
        "input": [{"type": "function_call_output", "call_id": call_id, "output": "sunny"}],
    }
    status, raw = request(server, "POST", "/v1/responses", follow_up)
    assert status == 400, raw
    assert_openai_error(raw, 400, "previous_response_id")
    assert call_id in json.loads(raw)["error"]["message"]


def test_required_tool_calls_stream_their_arguments(server: Server) -> None:
    body = {
        "model": MODEL,
        "input": ASK,
        "tools": RESPONSE_TOOLS,
        "tool_choice": "required",
        "temperature": 0,
        "max_output_tokens": 64,
    }
    events = stream_events(server, body)
    final = events[-1]["response"]
    calls = [item for item in final["output"] if item["type"] == "function_call"]
    assert calls, final
    for call in calls:
        arguments = "".join(
            e["delta"]
            for e in events
            if e["type"] == "response.function_call_arguments.delta" and e["item_id"] == call["id"]
        )
        assert arguments == call["arguments"]
        json.loads(arguments)
    added = [e["item"] for e in events if e["type"] == "response.output_item.added"]
    assert [(i["type"], i["status"], i["arguments"]) for i in added if i["type"] == "function_call"] == [
        ("function_call", "in_progress", "")
    ] * len(calls)


def test_text_format_json_schema_gives_what_chats_response_format_gives(client: openai.OpenAI) -> None:
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer"}},
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    ask = "Describe a person as JSON with a name and an age."
    resp = client.responses.create(
        model=MODEL,
        input=ask,
        text={"format": {"type": "json_schema", "name": "person", "schema": schema, "strict": True}},
        temperature=0,
        max_output_tokens=60,
    )
    jsonschema.validate(json.loads(resp.output_text), schema)
    expected = chat(
        client,
        [{"role": "user", "content": ask}],
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "person", "schema": schema, "strict": True},
        },
        max_tokens=60,
    )
    assert resp.output_text == expected.choices[0].message.content


def test_logprobs_come_with_the_output_text_as_chat_reports_them(client: openai.OpenAI) -> None:
    resp = client.responses.create(
        model=MODEL,
        input=PROMPT,
        include=["message.output_text.logprobs"],
        top_logprobs=2,
        temperature=0,
        max_output_tokens=12,
    )
    part = resp.output[0].content[0]  # type: ignore[union-attr]
    expected = chat(
        client, [{"role": "user", "content": PROMPT}], logprobs=True, top_logprobs=2, max_tokens=12
    )
    chat_lps = expected.choices[0].logprobs.content
    assert part.logprobs is not None and len(part.logprobs) == len(chat_lps) == 12
    for got, want in zip(part.logprobs, chat_lps, strict=True):
        assert (got.token, len(got.top_logprobs)) == (want.token, 2)
        assert got.logprob == pytest.approx(want.logprob, abs=1e-4)


def test_stored_responses_are_retrieved_with_their_input_items_and_deleted(
    server: Server, client: openai.OpenAI
) -> None:
    resp = client.responses.create(model=MODEL, input="Say hi.", temperature=0, max_output_tokens=8)
    assert client.responses.retrieve(resp.id).model_dump() == resp.model_dump()
    listed = client.responses.input_items.list(resp.id)
    assert [(i.type, i.role, i.content[0].text) for i in listed.data] == [("message", "user", "Say hi.")]  # type: ignore[union-attr]
    # A conversation's items page newest first, `after` the last one seen.
    items = [
        {"role": "user", "content": "One."},
        {"role": "assistant", "content": "Two."},
        {"role": "user", "content": "Three."},
    ]
    many = client.responses.create(model=MODEL, input=items, temperature=0, max_output_tokens=4)  # type: ignore[arg-type]
    first = client.responses.input_items.list(many.id, limit=2)
    assert [i.content[0].text for i in first.data] == ["Three.", "Two."] and first.has_more  # type: ignore[union-attr]
    rest = client.responses.input_items.list(many.id, limit=2, after=first.data[-1].id)
    assert [i.content[0].text for i in rest.data] == ["One."] and not rest.has_more  # type: ignore[union-attr]
    oldest = client.responses.input_items.list(many.id, order="asc")
    assert [i.content[0].text for i in oldest.data] == ["One.", "Two.", "Three."]  # type: ignore[union-attr]
    status, raw = request(server, "GET", f"/v1/responses/{many.id}/input_items?limit=500")
    assert status == 400
    assert_openai_error(raw, 400, "limit")
    status, raw = request(server, "DELETE", f"/v1/responses/{resp.id}")
    assert (status, json.loads(raw)) == (200, {"id": resp.id, "object": "response", "deleted": True})
    for method in ("GET", "DELETE"):
        status, raw = request(server, method, f"/v1/responses/{resp.id}")
        assert status == 404
        assert_openai_error(raw, 404, None)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(resp.id)
    unstored = client.responses.create(model=MODEL, input="Say hi.", max_output_tokens=4, store=False)
    assert unstored.store is False
    status, raw = request(server, "GET", f"/v1/responses/{unstored.id}")
    assert status == 404
    status, raw = request(
        server, "POST", "/v1/responses", {"model": MODEL, "input": "Hi", "previous_response_id": unstored.id}
    )
    assert status == 404
    assert_openai_error(raw, 404, "previous_response_id")


BAD_RESPONSES: list[tuple[str, dict[str, Any], int, str | None]] = [
    (
        "image input",
        {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
        400,
        "input[0].content[0].type",
    ),
    ("unknown role", {"input": [{"role": "wizard", "content": "hi"}]}, 400, "input[0].role"),
    (
        "output answering no call",
        {"input": [{"type": "function_call_output", "call_id": "call_nowhere", "output": "12 C"}]},
        400,
        "input[0].call_id",
    ),
    ("hosted tool", {"tools": [{"type": "web_search"}]}, 400, "tools[0].type"),
    (
        "unknown named tool",
        {"tools": RESPONSE_TOOLS, "tool_choice": {"type": "function", "name": "nope"}},
        400,
        "tool_choice",
    ),
    ("truncation auto", {"truncation": "auto"}, 400, "truncation"),
    ("background", {"background": True}, 400, "background"),
    ("bad text format", {"text": {"format": {"type": "yaml"}}}, 400, "text.format"),
    ("schema missing", {"text": {"format": {"type": "json_schema", "name": "x"}}}, 400, "text.format.schema"),
    ("zero output tokens", {"max_output_tokens": 0}, 400, "max_output_tokens"),
    ("hot temperature", {"temperature": 3}, 400, "temperature"),
    ("unknown include", {"include": ["file_search_call.results"]}, 400, "include[0]"),
    ("empty input", {"input": []}, 400, "input"),
    ("unknown model", {"model": "gpt-5"}, 404, "model"),
]


@pytest.mark.parametrize(
    ("body", "status", "param"), [c[1:] for c in BAD_RESPONSES], ids=[c[0] for c in BAD_RESPONSES]
)
def test_bad_requests_are_openai_errors_naming_the_field(
    server: Server, body: dict[str, Any], status: int, param: str | None
) -> None:
    got, raw = request(server, "POST", "/v1/responses", {"model": MODEL, "input": "Hi", **body})
    assert got == status, raw
    assert_openai_error(raw, status, param)
    assert request(server, "GET", "/health")[0] == 200
