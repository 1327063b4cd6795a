"""Tool calling and reasoning: `tools` rendered by the chat template (server and `LLM.chat`),
a named `tool_choice` and `"required"` kept exact by structured outputs, `"auto"` read by the
Hermes, Llama 3 JSON and Mistral parsers, thinking split into `reasoning_content`, streamed deltas that
add up to the whole response, multi-turn conversations carrying calls and their results, and
the 400s for tool requests the server cannot honour."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest

from conftest import ASK, TIME, TOOLS, TOOLS_TEMPLATE, WEATHER, Server
from spec_rs import LLM, RequestError, SamplingParams, StructuredOutputsParams

pytestmark = pytest.mark.timeout(240)

MODEL = "smollm2-135m-instruct"
SPEC_ARGS = ("--speculative-method", "ngram", "--num-speculative-tokens", "3")
ENGINE_ARGS = ("--kv-cache-memory", str(256 << 20), "--max-model-len", "2048")

SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}


@pytest.fixture(scope="module")
def template_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("templates") / "tools.jinja"
    path.write_text(TOOLS_TEMPLATE)
    return path


def tool_server(serve: Callable[..., Server], template_file: Path, parser: str, *args: str) -> Server:
    """A server with the tools template and `"auto"` read by `parser`."""
    template = ("--chat-template", str(template_file))
    return serve(*args, *ENGINE_ARGS, *template, "--enable-auto-tool-choice", "--tool-call-parser", parser)


def called_and_answered(city: str, result: str) -> list[dict[str, Any]]:
    """ASK, an assistant's call of get_weather for `city`, and the tool's `result`."""
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": json.dumps({"city": city})},
    }
    return [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": result},
    ]


@pytest.fixture(scope="module")
def server(serve: Callable[..., Server], template_file: Path) -> Server:
    """The `ngram_llm` pipeline, with the tools template and `"auto"` read as Hermes calls."""
    return tool_server(serve, template_file, "hermes", *SPEC_ARGS, "--trust-request-chat-template")


@pytest.fixture(scope="module")
def client(server: Server, openai_client: Callable[..., Any]) -> openai.OpenAI:
    c: openai.OpenAI = openai_client(server)
    return c


def offline(llm: LLM, schema: dict[str, Any], max_tokens: int) -> str:
    """What `LLM.chat` writes for ASK with the tools template and `schema` as the constraint."""
    params = SamplingParams(
        temperature=0, max_tokens=max_tokens, structured_outputs=StructuredOutputsParams(json=schema)
    )
    out = llm.chat(ASK, params, tools=TOOLS, chat_template=TOOLS_TEMPLATE)[0]
    return out.text


def stream_message(client: openai.OpenAI, **fields: Any) -> tuple[str, list[dict[str, Any]], str | None]:
    """A streamed response's content, its tool calls put together from their deltas (with the
    number of deltas that carried arguments), and its finish reason."""
    content = ""
    calls: list[dict[str, Any]] = []
    finish = None
    for chunk in client.chat.completions.create(model=MODEL, stream=True, **fields):
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        content += choice.delta.content or ""
        for call in choice.delta.tool_calls or []:
            if call.id is not None:
                assert call.index == len(calls), "a call's first delta carries its id"
                assert call.type == "function" and call.function is not None and call.function.name
                calls.append({"id": call.id, "name": call.function.name, "arguments": "", "pieces": 0})
            assert call.function is not None
            calls[call.index]["arguments"] += call.function.arguments or ""
            calls[call.index]["pieces"] += bool(call.function.arguments)
        finish = choice.finish_reason or finish
    return content, calls, finish


def test_the_template_renders_tools_calls_and_results_as_vllm_passes_them(ngram_llm: LLM) -> None:
    conversation = called_and_answered("Oslo", "12 degrees")
    text = ngram_llm.apply_chat_template(conversation, tools=TOOLS, chat_template=TOOLS_TEMPLATE)
    # Each tool as JSON, written as transformers' tojson (Python's json.dumps) writes it.
    assert json.dumps(TOOLS[0]) in text, "each tool as JSON"
    # The arguments' JSON text reaches the template as an object, as transformers expects.
    assert '{"name": "get_weather", "arguments": {"city": "Oslo"}}' in text
    assert "<tool_response>\n12 degrees\n</tool_response>" in text
    assert text.endswith("<|im_start|>assistant\n")
    # Without tools the section is gone; template variables come from chat_template_kwargs.
    assert "<tools>" not in ngram_llm.apply_chat_template(ASK, chat_template=TOOLS_TEMPLATE)
    greeting = "{{ greeting }}{% for m in messages %}{{ m.content }}{% endfor %}"
    assert ngram_llm.apply_chat_template(
        ASK, chat_template=greeting, chat_template_kwargs={"greeting": "Hi! "}
    ) == ("Hi! " + ASK[0]["content"])
    with pytest.raises(RequestError, match="may not set 'tools'"):
        ngram_llm.apply_chat_template(ASK, chat_template=greeting, chat_template_kwargs={"tools": []})
    with pytest.raises(TypeError, match="tools must be a list"):
        ngram_llm.chat(ASK, tools="get_weather")  # type: ignore[arg-type]


def test_a_named_tool_choice_returns_one_call_whose_arguments_follow_its_schema(
    client: openai.OpenAI, ngram_llm: LLM
) -> None:
    choice = {"type": "function", "function": {"name": "get_weather"}}
    resp = client.chat.completions.create(
        model=MODEL, messages=ASK, tools=TOOLS, tool_choice=choice, temperature=0, max_tokens=48
    )  # type: ignore[arg-type]
    message = resp.choices[0].message
    assert message.content is None and message.tool_calls is not None and len(message.tool_calls) == 1
    call = message.tool_calls[0]
    assert call.type == "function" and call.id.startswith("chatcmpl-tool-")
    assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER)
    # OpenAI reports a forced call as a normal stop.
    assert resp.choices[0].finish_reason == "stop"
    # The server renders the tools as LLM.chat does and constrains the output the same way.
    assert call.function.arguments == offline(ngram_llm, WEATHER, 48)

    content, calls, finish = stream_message(
        client, messages=ASK, tools=TOOLS, tool_choice=choice, temperature=0, max_tokens=48
    )
    assert content == "" and finish == "stop"
    assert [(c["name"], c["arguments"]) for c in calls] == [("get_weather", call.function.arguments)]


def test_required_calls_tools_from_the_list_and_streams_what_it_returns_whole(client: openai.OpenAI) -> None:
    fields: dict[str, Any] = {"messages": ASK, "tools": TOOLS, "tool_choice": "required", "max_tokens": 96}
    resp = client.chat.completions.create(model=MODEL, temperature=0, **fields)
    message = resp.choices[0].message
    assert message.content is None and message.tool_calls
    for call in message.tool_calls:
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
    assert len({c.id for c in message.tool_calls}) == len(message.tool_calls), "ids are unique"
    assert resp.choices[0].finish_reason == "tool_calls"

    content, calls, finish = stream_message(client, temperature=0, **fields)
    assert content == "" and finish == "tool_calls"
    assert [(c["name"], c["arguments"]) for c in calls] == [
        (c.function.name, c.function.arguments) for c in message.tool_calls
    ]

    # Sampled, several choices, one call each when parallel calls are off.
    resp = client.chat.completions.create(
        model=MODEL, temperature=1.0, seed=7, n=3, parallel_tool_calls=False, **fields
    )
    for choice in resp.choices:
        assert choice.message.tool_calls is not None and len(choice.message.tool_calls) == 1
        call = choice.message.tool_calls[0]
        if choice.finish_reason == "tool_calls":
            jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def test_auto_reads_hermes_calls_the_model_writes_and_leaves_plain_answers_alone(
    client: openai.OpenAI,
) -> None:
    # The call is made certain with a regex, so the test is about reading it, not about
    # whether the 135M model decides to call.
    written = (
        r'<tool_call>\n\{"name": "get_weather", '
        r'"arguments": \{"city": "(Paris|Lyon)", "unit": "celsius"\}\}\n</tool_call>'
    )
    fields: dict[str, Any] = {
        "messages": ASK,
        "tools": TOOLS,
        "temperature": 0,
        "max_tokens": 64,
        "extra_body": {"guided_regex": written},
    }
    resp = client.chat.completions.create(model=MODEL, **fields)
    message = resp.choices[0].message
    assert message.content is None and message.tool_calls is not None
    (call,) = message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments)["unit"] == "celsius"
    assert resp.choices[0].finish_reason == "tool_calls"
    content, calls, finish = stream_message(client, **fields)
    assert (content, finish) == ("", "tool_calls")
    assert [(c["name"], c["arguments"]) for c in calls] == [(call.function.name, call.function.arguments)]
    assert calls[0]["pieces"] > 1, "the arguments stream as written, not whole once the block ends"

    # A plain answer (tool_choice "auto" explicitly) stays content, whole or streamed.
    plain: dict[str, Any] = {"messages": ASK, "tools": TOOLS, "tool_choice": "auto", "max_tokens": 12}
    plain["extra_body"] = {"guided_regex": r"It is (sunny|rainy) in Paris\."}
    resp = client.chat.completions.create(model=MODEL, temperature=0, **plain)
    assert resp.choices[0].message.tool_calls is None
    assert resp.choices[0].message.content in ("It is sunny in Paris.", "It is rainy in Paris.")
    assert resp.choices[0].finish_reason == "stop"
    assert stream_message(client, temperature=0, **plain) == (resp.choices[0].message.content, [], "stop")


def test_auto_reads_llama3_json_calls_after_the_python_tag(
    serve: Callable[..., Server], template_file: Path
) -> None:
    llama = tool_server(serve, template_file, "llama3_json")
    written = (
        r'<\|python_tag\|>\{"name": "get_time", "parameters": \{"timezone": "UTC"\}\}; '
        r'\{"name": "get_weather", "parameters": \{"city": "Rome", "unit": "celsius"\}\}'
    )
    calls = forced_calls(llama, written, 64)
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in calls] == [
        ("get_time", '{"timezone": "UTC"}'),
        ("get_weather", '{"city": "Rome", "unit": "celsius"}'),
    ]


def test_auto_reads_granite_call_lists(serve: Callable[..., Server], template_file: Path) -> None:
    granite = tool_server(serve, template_file, "granite")
    written = (
        r'<\|tool_call\|>\[\{"arguments": \{"city": "(Rome|Oslo)"\}, "name": "get_weather"\}, '
        r'\{"name": "get_time", "arguments": \{"timezone": "UTC"\}\}\]'
    )
    calls = [
        (c["function"]["name"], json.loads(c["function"]["arguments"]))
        for c in forced_calls(granite, written, 64)
    ]
    assert calls[0][0] == "get_weather" and calls[0][1]["city"] in ("Rome", "Oslo"), (
        "arguments before the name"
    )
    assert calls[1] == ("get_time", {"timezone": "UTC"})


def test_auto_reads_pythonic_call_lists_whole_or_streamed(
    serve: Callable[..., Server], template_file: Path, openai_client: Callable[..., Any]
) -> None:
    pythonic = tool_server(serve, template_file, "pythonic")
    written = r'\[get_weather\(city="(Rome|Oslo)", unit=\'celsius\'\), get_time\(timezone="UTC"\)\]'
    whole = [(c["function"]["name"], c["function"]["arguments"]) for c in forced_calls(pythonic, written, 64)]
    calls = [(name, json.loads(arguments)) for name, arguments in whole]
    assert calls[0][0] == "get_weather" and calls[0][1]["unit"] == "celsius", "Python literals read as JSON"
    assert calls[1] == ("get_time", {"timezone": "UTC"})
    client: openai.OpenAI = openai_client(pythonic)
    content, streamed, finish = stream_message(
        client, messages=ASK, tools=TOOLS, temperature=0, max_tokens=64, extra_body={"guided_regex": written}
    )
    assert (content, finish) == ("", "tool_calls")
    assert [(c["name"], c["arguments"]) for c in streamed] == whole


@pytest.mark.parametrize(("parser", "block"), [("qwen3_coder", "tool_call"), ("seed_oss", "seed:tool_call")])
def test_auto_reads_qwen3_coder_xml_calls_with_values_typed_by_the_schema(
    serve: Callable[..., Server],
    template_file: Path,
    openai_client: Callable[..., Any],
    parser: str,
    block: str,
) -> None:
    # Seed-OSS writes Qwen3-Coder's functions inside its own block tags.
    coder = tool_server(serve, template_file, parser)
    forecast = {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    }
    tools = [{"type": "function", "function": {"name": "get_forecast", "parameters": forecast}}]
    written = (
        rf"Checking\.\n<{block}>\n<function=get_forecast>\n<parameter=city>\n(Rome|Oslo)\n</parameter>\n"
        rf"<parameter=days>\n3\n</parameter>\n</function>\n</{block}>"
    )
    fields: dict[str, Any] = {"tools": tools, "temperature": 0, "max_tokens": 160}
    status, body = post(coder, **fields, guided_regex=written)
    assert status == 200, body
    choice = body["choices"][0]
    assert choice["message"]["content"] == "Checking.\n" and choice["finish_reason"] == "tool_calls"
    (call,) = choice["message"]["tool_calls"]
    whole = (call["function"]["name"], call["function"]["arguments"])
    assert whole[0] == "get_forecast"
    arguments = json.loads(whole[1])
    assert arguments["days"] == 3 and arguments["city"] in ("Rome", "Oslo"), "the integer read as one"
    client: openai.OpenAI = openai_client(coder)
    content, streamed, finish = stream_message(
        client, messages=ASK, **fields, extra_body={"guided_regex": written}
    )
    assert (content, finish) == ("Checking.\n", "tool_calls")
    assert [(c["name"], c["arguments"]) for c in streamed] == [whole]


def test_auto_reads_glm_calls_with_values_typed_by_the_schema(
    serve: Callable[..., Server], template_file: Path, openai_client: Callable[..., Any]
) -> None:
    glm = tool_server(serve, template_file, "glm45")
    forecast = {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    }
    tools = [{"type": "function", "function": {"name": "get_forecast", "parameters": forecast}}]
    written = (
        r"<tool_call>get_forecast\n<arg_key>city</arg_key>\n<arg_value>(Rome|Oslo)</arg_value>\n"
        r"<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>"
    )
    fields: dict[str, Any] = {"tools": tools, "temperature": 0, "max_tokens": 120}
    status, body = post(glm, **fields, guided_regex=written)
    assert status == 200, body
    choice = body["choices"][0]
    assert choice["message"]["content"] is None and choice["finish_reason"] == "tool_calls"
    (call,) = choice["message"]["tool_calls"]
    whole = (call["function"]["name"], call["function"]["arguments"])
    arguments = json.loads(whole[1])
    assert whole[0] == "get_forecast"
    assert arguments["days"] == 3 and arguments["city"] in ("Rome", "Oslo"), "the integer read as one"
    client: openai.OpenAI = openai_client(glm)
    content, streamed, finish = stream_message(
        client, messages=ASK, **fields, extra_body={"guided_regex": written}
    )
    assert (content, finish) == ("", "tool_calls")
    assert [(c["name"], c["arguments"]) for c in streamed] == [whole]


def test_auto_reads_minimax_m2_invokes_with_quoted_names_and_values_typed_by_the_schema(
    serve: Callable[..., Server], template_file: Path, openai_client: Callable[..., Any]
) -> None:
    minimax = tool_server(serve, template_file, "minimax_m2")
    forecast = {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    }
    tools = [{"type": "function", "function": {"name": "get_forecast", "parameters": forecast}}]
    written = (
        r'Checking\.\n<minimax:tool_call>\n<invoke name="get_forecast">\n<parameter name="city">(Rome|Oslo)'
        r'</parameter>\n<parameter name="days"> 3 </parameter>\n</invoke>\n</minimax:tool_call>'
    )
    fields: dict[str, Any] = {"tools": tools, "temperature": 0, "max_tokens": 160}
    status, body = post(minimax, **fields, guided_regex=written)
    assert status == 200, body
    choice = body["choices"][0]
    assert choice["message"]["content"] == "Checking.\n" and choice["finish_reason"] == "tool_calls"
    (call,) = choice["message"]["tool_calls"]
    whole = (call["function"]["name"], call["function"]["arguments"])
    arguments = json.loads(whole[1])
    assert whole[0] == "get_forecast", "the quoted name read without its quotes"
    assert arguments["days"] == 3 and arguments["city"] in ("Rome", "Oslo"), "the trimmed integer read as one"
    client: openai.OpenAI = openai_client(minimax)
    content, streamed, finish = stream_message(
        client, messages=ASK, **fields, extra_body={"guided_regex": written}
    )
    assert (content, finish) == ("Checking.\n", "tool_calls")
    assert [(c["name"], c["arguments"]) for c in streamed] == [whole]


def test_auto_reads_step3_invokes_inside_its_call_markers(
    serve: Callable[..., Server], template_file: Path, openai_client: Callable[..., Any]
) -> None:
    step3 = tool_server(serve, template_file, "step3")
    # Step 3's markers, spelled with the fullwidth bar (U+FF5C) its tokenizer has.
    calls_tag, call_tag, sep = (
        "<\uff5ctool_calls_{}\uff5c>",
        "<\uff5ctool_call_{}\uff5c>",
        "<\uff5ctool_sep\uff5c>",
    )
    written = (
        calls_tag.format("begin")
        + call_tag.format("begin")
        + "function"
        + sep
        + r'<steptml:invoke name="get_weather"><steptml:parameter name="city">(Rome|Oslo)</steptml:parameter>'
        + "</steptml:invoke>"
        + call_tag.format("end")
        + calls_tag.format("end")
    )
    # The fullwidth bars take several tokens each.
    (call,) = forced_calls(step3, written, 240)
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"])["city"] in ("Rome", "Oslo")
    client: openai.OpenAI = openai_client(step3)
    fields: dict[str, Any] = {"tools": TOOLS, "temperature": 0, "max_tokens": 240}
    content, streamed, finish = stream_message(
        client, messages=ASK, **fields, extra_body={"guided_regex": written}
    )
    assert (content, finish) == ("", "tool_calls")
    assert [(c["name"], c["arguments"]) for c in streamed] == [("get_weather", call["function"]["arguments"])]


def test_auto_reads_olmo3_calls_a_line_each_in_their_tags(
    serve: Callable[..., Server], template_file: Path
) -> None:
    olmo3 = tool_server(serve, template_file, "olmo3")
    written = (
        r'<function_calls>\nget_weather\(city="(Rome|Oslo)"\)\nget_time\(timezone="UTC"\)\n</function_calls>'
    )
    calls = [
        (c["function"]["name"], json.loads(c["function"]["arguments"]))
        for c in forced_calls(olmo3, written, 120)
    ]
    assert calls[0][0] == "get_weather" and calls[0][1]["city"] in ("Rome", "Oslo")
    assert calls[1] == ("get_time", {"timezone": "UTC"})


def test_gpt_oss_harmony_channels_split_into_reasoning_content_and_calls(
    serve: Callable[..., Server], template_file: Path, openai_client: Callable[..., Any]
) -> None:
    harmony = tool_server(serve, template_file, "openai", "--reasoning-parser", "openai_gptoss")
    written = (
        r"<\|channel\|>analysis<\|message\|>The user wants the weather\.<\|end\|>"
        r"<\|start\|>assistant<\|channel\|>commentary to=functions\.get_weather <\|constrain\|>json"
        r'<\|message\|>\{"city": "(Rome|Oslo)"\}<\|call\|>'
    )
    fields: dict[str, Any] = {"tools": TOOLS, "temperature": 0, "max_tokens": 200}
    status, body = post(harmony, **fields, guided_regex=written)
    assert status == 200, body
    message = body["choices"][0]["message"]
    assert message["reasoning_content"] == "The user wants the weather."
    assert message["content"] is None and body["choices"][0]["finish_reason"] == "tool_calls"
    (call,) = message["tool_calls"]
    whole = (call["function"]["name"], call["function"]["arguments"])
    assert whole[0] == "get_weather" and json.loads(whole[1])["city"] in ("Rome", "Oslo")
    client: openai.OpenAI = openai_client(harmony)
    content, streamed, finish = stream_message(
        client, messages=ASK, **fields, extra_body={"guided_regex": written}
    )
    assert (content, finish) == ("", "tool_calls")
    assert [(c["name"], c["arguments"]) for c in streamed] == [whole]
    # Without tools the channels still split: the final channel is the content.
    answer = (
        r"<\|channel\|>analysis<\|message\|>Short\.<\|end\|>"
        r"<\|start\|>assistant<\|channel\|>final<\|message\|>Hi!"
    )
    status, body = post(harmony, temperature=0, max_tokens=120, guided_regex=answer)
    assert status == 200, body
    message = body["choices"][0]["message"]
    assert (message["reasoning_content"], message["content"]) == ("Short.", "Hi!")


# Each family's block around the same two calls, as a regex the answer is forced to.
BLOCK_FAMILIES = [
    (
        "jamba",
        r'<tool_calls>\[\{"name": "get_weather", "arguments": \{"city": "(Rome|Oslo)"\}\}, '
        r'\{"name": "get_time", "arguments": \{"timezone": "UTC"\}\}\]</tool_calls>',
    ),
    (
        "minimax",
        r'<tool_calls>\n\{"name": "get_weather", "arguments": \{"city": "(Rome|Oslo)"\}\}\n'
        r'\{"name": "get_time", "arguments": \{"timezone": "UTC"\}\}\n</tool_calls>',
    ),
    (
        "hunyuan_a13b",
        r'<tool_calls>\[\{"name": "get_weather", "arguments": \{"city": "(Rome|Oslo)"\}\}, '
        r'\{"name": "get_time", "arguments": \{"timezone": "UTC"\}\}\]</tool_calls>',
    ),
    (
        "longcat",
        r'<longcat_tool_call>\n\{"name": "get_weather", "arguments": \{"city": "(Rome|Oslo)"\}\}\n'
        r'</longcat_tool_call>\n<longcat_tool_call>\n\{"name": "get_time", "arguments": '
        r'\{"timezone": "UTC"\}\}\n</longcat_tool_call>',
    ),
    (
        "internlm",
        r'<\|action_start\|><\|plugin\|>\{"name": "get_weather", "parameters": \{"city": "(Rome|Oslo)"\}\}'
        r'<\|action_end\|><\|action_start\|><\|plugin\|>\{"name": "get_time", "parameters": '
        r'\{"timezone": "UTC"\}\}<\|action_end\|>',
    ),
    (
        "phi4_mini_json",
        r'functools\[\{"name": "get_weather", "arguments": \{"city": "(Rome|Oslo)"\}\}, '
        r'\{"name": "get_time", "arguments": \{"timezone": "UTC"\}\}\]',
    ),
    (
        "xlam",
        r'\[\{"name": "get_weather", "arguments": \{"city": "(Rome|Oslo)"\}\}, '
        r'\{"name": "get_time", "arguments": \{"timezone": "UTC"\}\}\]',
    ),
    (
        "granite-20b-fc",
        r'<function_call> \{"name": "get_weather", "arguments": \{"city": "(Rome|Oslo)"\}\}\n'
        r'<function_call> \{"name": "get_time", "arguments": \{"timezone": "UTC"\}\}',
    ),
]


@pytest.mark.parametrize(("parser", "written"), BLOCK_FAMILIES, ids=[f[0] for f in BLOCK_FAMILIES])
def test_auto_reads_each_json_block_familys_calls(
    serve: Callable[..., Server], template_file: Path, parser: str, written: str
) -> None:
    server = tool_server(serve, template_file, parser)
    calls = [
        (c["function"]["name"], json.loads(c["function"]["arguments"]))
        for c in forced_calls(server, written, 120)
    ]
    assert calls[0][0] == "get_weather" and calls[0][1]["city"] in ("Rome", "Oslo")
    assert calls[1] == ("get_time", {"timezone": "UTC"})


def test_auto_reads_kimi_calls_and_keeps_their_ids(serve: Callable[..., Server], template_file: Path) -> None:
    kimi = tool_server(serve, template_file, "kimi_k2")
    written = (
        r"<\|tool_calls_section_begin\|><\|tool_call_begin\|>functions\.get_time:0<\|tool_call_argument_begin\|>"
        r'\{"timezone": "UTC"\}<\|tool_call_end\|><\|tool_calls_section_end\|>'
    )
    (call,) = forced_calls(kimi, written, 120)
    assert call["id"] == "functions.get_time:0", "the model's id, as Kimi's template wants it back"
    assert (call["function"]["name"], call["function"]["arguments"]) == ("get_time", '{"timezone": "UTC"}')


def test_auto_reads_deepseek_calls(serve: Callable[..., Server], template_file: Path) -> None:
    deepseek = tool_server(serve, template_file, "deepseek_v31")

    def marker(words: str) -> str:
        """DeepSeek's special tokens: fullwidth bars around words joined by lower blocks."""
        return "<\uff5c" + words.replace(" ", "\u2581") + "\uff5c>"

    written = (
        marker("tool calls begin")
        + marker("tool call begin")
        + "get_time"
        + marker("tool sep")
        + r'\{"timezone": "(UTC|CET)"\}'
        + marker("tool call end")
        + marker("tool calls end")
    )
    (call,) = [c["function"] for c in forced_calls(deepseek, written, 200)]
    assert call["name"] == "get_time" and json.loads(call["arguments"])["timezone"] in ("UTC", "CET")


def test_tool_choice_none_renders_the_tools_unless_the_server_excludes_them(
    serve: Callable[..., Server], template_file: Path, server: Server
) -> None:
    excluding = tool_server(serve, template_file, "hermes", "--exclude-tools-when-tool-choice-none")
    fields: dict[str, Any] = {"max_tokens": 1, "temperature": 0}

    def prompt_tokens(s: Server, **more: Any) -> int:
        status, body = post(s, **fields, **more)
        assert status == 200, body
        return int(body["usage"]["prompt_tokens"])

    bare = prompt_tokens(server)
    assert prompt_tokens(server, tools=TOOLS, tool_choice="none") > bare, "by default the template sees them"
    assert prompt_tokens(excluding, tools=TOOLS, tool_choice="none") == bare
    assert prompt_tokens(excluding, tools=TOOLS) > bare, "only tool_choice 'none' leaves them out"


def test_auto_reads_mistral_calls_old_and_new_and_every_call_id_is_nine_letters_and_digits(
    serve: Callable[..., Server], template_file: Path
) -> None:
    mistral = tool_server(serve, template_file, "mistral")
    written = r'\[TOOL_CALLS\]\[\{"name": "get_time", "arguments": \{"timezone": "UTC"\}\}\]'
    (call,) = forced_calls(mistral, written, 48)
    assert (call["function"]["name"], call["function"]["arguments"]) == ("get_time", '{"timezone": "UTC"}')
    newer_text = r'\[TOOL_CALLS\]get_time\[ARGS\]\{"timezone":"UTC"\}'
    (newer,) = [c["function"] for c in forced_calls(mistral, newer_text, 48)]
    assert (newer["name"], newer["arguments"]) == ("get_time", '{"timezone": "UTC"}')
    named = {"type": "function", "function": {"name": "get_time"}}
    status, body = post(mistral, tools=TOOLS, tool_choice=named, temperature=0, max_tokens=48)
    assert status == 200, body
    ids = [call["id"], body["choices"][0]["message"]["tool_calls"][0]["id"]]
    # Mistral's templates refuse any other id when the call comes back in the next turn.
    assert all(len(i) == 9 and i.isalnum() for i in ids), ids


def stream_reasoning(client: openai.OpenAI, **fields: Any) -> tuple[str, str]:
    """A streamed response's reasoning and content, each joined from its deltas."""
    reasoning, content = "", ""
    for chunk in client.chat.completions.create(model=MODEL, stream=True, **fields):
        if chunk.choices:
            delta = chunk.choices[0].delta
            reasoning += getattr(delta, "reasoning_content", None) or ""
            content += delta.content or ""
    return reasoning, content


def test_a_reasoning_parser_splits_thinking_from_the_answer_and_the_calls_after_it(
    serve: Callable[..., Server], template_file: Path, openai_client: Callable[..., Any]
) -> None:
    thinker = tool_server(serve, template_file, "hermes", "--reasoning-parser", "qwen3")
    client: openai.OpenAI = openai_client(thinker)
    # The shape is made certain with a regex (auto tool choice leaves the output free).
    thought = r"<think>\nThe user (asks|wants) the weather\.\n</think>\n\nI will check\."
    fields: dict[str, Any] = {"messages": ASK, "temperature": 0, "max_tokens": 40}
    resp = client.chat.completions.create(model=MODEL, extra_body={"guided_regex": thought}, **fields)
    message = resp.choices[0].message.model_dump()
    assert message["reasoning_content"] in (
        "\nThe user asks the weather.\n",
        "\nThe user wants the weather.\n",
    )
    assert message["content"] == "\n\nI will check."
    streamed = stream_reasoning(client, extra_body={"guided_regex": thought}, **fields)
    assert streamed == (message["reasoning_content"], message["content"])
    hidden = client.chat.completions.create(
        model=MODEL, extra_body={"guided_regex": thought, "include_reasoning": False}, **fields
    ).choices[0]
    assert (
        hidden.message.content == "\n\nI will check."
        and "reasoning_content" not in hidden.message.model_dump()
    )
    # No <think> block: no reasoning, the answer whole.
    plain = client.chat.completions.create(model=MODEL, extra_body={"guided_regex": "Sunny\\."}, **fields)
    assert plain.choices[0].message.model_dump()["reasoning_content"] is None
    assert plain.choices[0].message.content == "Sunny."

    # Thinking, then a call: the reasoning is split off and the call read from the rest.
    then_call = (
        r"<think>Use the tool\.</think>\n<tool_call>\n"
        r'\{"name": "get_time", "arguments": \{"timezone": "CET"\}\}\n</tool_call>'
    )
    resp = client.chat.completions.create(
        model=MODEL, tools=TOOLS, extra_body={"guided_regex": then_call}, **{**fields, "max_tokens": 80}
    )  # type: ignore[arg-type]
    choice = resp.choices[0]
    assert choice.message.model_dump()["reasoning_content"] == "Use the tool."
    assert choice.message.tool_calls is not None and choice.finish_reason == "tool_calls"
    assert [(c.function.name, c.function.arguments) for c in choice.message.tool_calls] == [
        ("get_time", '{"timezone": "CET"}')
    ]
    # A constrained output is all answer: a named call's arguments are never taken for thought.
    named = client.chat.completions.create(
        model=MODEL,
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_time"}},
        **fields,
    )  # type: ignore[arg-type]
    assert named.choices[0].message.tool_calls is not None
    jsonschema.validate(json.loads(named.choices[0].message.tool_calls[0].function.arguments), TIME)


def test_a_conversation_with_calls_and_results_continues_and_none_answers_in_text(
    client: openai.OpenAI, ngram_llm: LLM
) -> None:
    conversation = called_and_answered("Paris", "18 degrees and sunny")
    resp = client.chat.completions.create(
        model=MODEL, messages=conversation, tools=TOOLS, tool_choice="none", temperature=0, max_tokens=24
    )  # type: ignore[arg-type]
    text = resp.choices[0].message.content
    assert resp.choices[0].message.tool_calls is None and text
    want = ngram_llm.chat(
        conversation, SamplingParams(temperature=0, max_tokens=24), tools=TOOLS, chat_template=TOOLS_TEMPLATE
    )[0]
    assert text == want.text


def test_tokenize_renders_the_tools_with_the_servers_template_as_chat_does(
    server: Server, client: openai.OpenAI, ngram_llm: LLM
) -> None:
    status, body = server.post_json("/tokenize", {"model": MODEL, "messages": ASK, "tools": TOOLS})
    assert status == 200, body
    rendered = ngram_llm.apply_chat_template(ASK, tools=TOOLS, chat_template=TOOLS_TEMPLATE)
    assert "get_time" in rendered
    assert body["tokens"] == ngram_llm.tokenize(rendered, add_special_tokens=False)
    resp = client.chat.completions.create(
        model=MODEL, messages=ASK, tools=TOOLS, tool_choice="none", max_tokens=1
    )  # type: ignore[arg-type]
    assert resp.usage is not None and resp.usage.prompt_tokens == body["count"]


def post(server: Server, **fields: Any) -> tuple[int, dict[str, Any]]:
    return server.post_json("/v1/chat/completions", {"model": MODEL, "messages": ASK, **fields})


def forced_calls(server: Server, written: str, max_tokens: int) -> list[dict[str, Any]]:
    """The tool calls of a greedy answer to ASK made certain by the regex `written` (so a test
    is about reading them, not whether the 135M model decides to call); it holds nothing else."""
    status, body = post(server, tools=TOOLS, temperature=0, max_tokens=max_tokens, guided_regex=written)
    assert status == 200, body
    choice = body["choices"][0]
    assert choice["message"]["content"] is None and choice["finish_reason"] == "tool_calls"
    calls: list[dict[str, Any]] = choice["message"]["tool_calls"]
    return calls


BAD_TOOL_REQUESTS = [
    # id, fields, param, message
    ("tools-not-a-list", {"tools": {"a": 1}}, "tools", "must be a list"),
    ("custom-tool", {"tools": [{"type": "custom", "custom": {}}]}, "tools[0]", "type 'custom'"),
    (
        "bad-name",
        {"tools": [{"type": "function", "function": {"name": "get weather"}}]},
        "tools[0].function.name",
        "letters, digits",
    ),
    (
        "unsupported-schema",
        {
            "tools": [
                {
                    "type": "function",
                    "function": {"name": "f", "parameters": {"type": "array", "uniqueItems": True}},
                }
            ]
        },
        "tools[0].function.parameters",
        "keyword `uniqueItems` is not supported",
    ),
    ("unknown-choice", {"tools": TOOLS, "tool_choice": "always"}, "tool_choice", "not one of"),
    (
        "named-not-offered",
        {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "fly"}}},
        "tool_choice",
        "not among tools",
    ),
    (
        "required-and-response-format",
        {"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}},
        "response_format",
        "one output constraint",
    ),
    (
        "bad-call-arguments",
        {
            "messages": [
                *ASK,
                {
                    "role": "assistant",
                    "tool_calls": [
                        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{x"}}
                    ],
                },
            ]
        },
        "messages[1].tool_calls[0]",
        "JSON text of an object",
    ),
    ("deprecated-functions", {"functions": [{"name": "f"}]}, "functions", "send tools and tool_choice"),
    ("deprecated-function-call", {"function_call": "auto"}, "function_call", "send tools and tool_choice"),
    ("broken-template", {"chat_template": "{% for %}"}, "chat_template", "invalid chat template"),
    (
        "reserved-template-variable",
        {"chat_template_kwargs": {"messages": []}},
        "chat_template_kwargs",
        "may not set",
    ),
]


@pytest.mark.parametrize(
    ("fields", "param", "message"), [c[1:] for c in BAD_TOOL_REQUESTS], ids=[c[0] for c in BAD_TOOL_REQUESTS]
)
def test_bad_tool_requests_are_400s_naming_the_field(
    server: Server, fields: dict[str, Any], param: str, message: str
) -> None:
    status, body = post(server, max_tokens=4, **fields)
    assert status == 400, body
    assert body["error"]["param"] == param, body
    assert message in body["error"]["message"], body


def test_auto_needs_the_server_flags_and_completions_take_no_tools(
    serve: Callable[..., Server], server: Server
) -> None:
    plain = serve(*ENGINE_ARGS)
    status, body = post(plain, tools=TOOLS, max_tokens=4)
    assert status == 400 and body["error"]["param"] == "tools"
    assert "--enable-auto-tool-choice" in body["error"]["message"]
    status, body = server.post_json(
        "/v1/completions", {"model": MODEL, "prompt": "hi", "tools": TOOLS, "max_tokens": 4}
    )
    assert status == 400 and body["error"]["param"] == "tools"
    assert "/v1/chat/completions" in body["error"]["message"]
