"""The `spec-rs` command line: help, flag errors, `generate` with speculation and its trace,
and the cargo binary agreeing with the Python console script."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from spec_rs import LLM, SamplingParams, StructuredOutputsParams, _spec_rs

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parent.parent
PROMPT = "List the numbers from 1 to 20, separated by commas."
GENERATE = ["generate", "--speculative-method", "ngram", "--max-tokens", "16", PROMPT]
STATS = re.compile(
    r"\[(\d+) tokens in [\d.]+s, [\d.]+ tok/s, finish: (\w+)\] drafts accepted (\d+)/(\d+) \(\d+%\), "
    r"acceptance length ([\d.]+), per position \[([\d, ]*)\]"
)
TRACE_LINE = re.compile(r"^\s+(\d+): \[([\d, ]*)\] \| \[([\d, ]*)\] \| (\d+)$")


def console_script() -> list[str]:
    script = Path(sysconfig.get_path("scripts")) / "spec-rs"
    assert script.is_file(), f"the spec-rs console script is not installed at {script}: pip install -e ."
    return [str(script)]


ENTRY_POINTS = {
    "console-script": console_script,
    "python-m": lambda: [sys.executable, "-m", "spec_rs.cli"],
}


def run(cmd: list[str], timeout: float = 90) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SPEC_RS_LOG": "warn", "NO_COLOR": "1"}
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, env=env, stdin=subprocess.DEVNULL
    )


def ints(text: str) -> list[int]:
    return [int(x) for x in text.replace(",", " ").split()]


@pytest.fixture(scope="module")
def cargo_binary() -> Path:
    """The newest `spec-rs` cargo binary (release or debug). Missing, the test fails with the
    build command rather than skipping."""
    built = [b for b in (REPO / "target" / p / "spec-rs" for p in ("release", "debug")) if b.is_file()]
    if not built:
        pytest.fail(
            "no cargo-built spec-rs binary: run `cargo build --release -p specrs-server --bin spec-rs`"
        )
    return max(built, key=lambda b: b.stat().st_mtime)


# --- help and flag errors ----------------------------------------------------------------------


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_help_lists_the_commands(entry: str) -> None:
    proc = run([*ENTRY_POINTS[entry](), "--help"])
    assert proc.returncode == 0, proc.stderr
    assert "serve" in proc.stdout and "generate" in proc.stdout
    version = run([*ENTRY_POINTS[entry](), "--version"])
    assert version.returncode == 0
    assert _spec_rs.__version__ in version.stdout


@pytest.mark.parametrize("command", ["serve", "generate"])
@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_subcommand_help_lists_every_speculative_flag(entry: str, command: str) -> None:
    proc = run([*ENTRY_POINTS[entry](), command, "--help"])
    assert proc.returncode == 0, proc.stderr
    flags = [row["flag"] for row in _spec_rs.speculative_flags()]
    assert "--speculative-method" in flags and "--synthetic-acceptance-rate" in flags
    missing = [f for f in flags if re.search(rf"{re.escape(f)}\b", proc.stdout) is None]
    assert not missing, missing
    assert "--config-file" in proc.stdout and "--section-name" in proc.stdout


BAD_FLAGS = [
    ("unknown-method", ["--speculative-method", "foo"], "invalid value 'foo' for '--speculative-method"),
    (
        "synthetic-rate-2",
        ["--speculative-method", "ngram", "--synthetic-acceptance-rate", "2"],
        "synthetic_acceptance_rate must be between 0.0 and 1.0",
    ),
    (
        "section-name-without-config-file",
        ["--section-name", "speculative"],
        "--section-name needs --config-file",
    ),
    (
        "confidence-threshold-1",
        ["--speculative-method", "eagle", "--draft-confidence-threshold", "1"],
        "draft_confidence_threshold must be >= 0.0 and < 1.0",
    ),
    ("missing-config-file", ["--config-file", "/nonexistent/spec.yaml"], "not found"),
    (
        "max-seq-len-to-capture-0",
        ["--device-graph-capture", "--max-seq-len-to-capture", "0"],
        "--max-seq-len-to-capture must be at least 1",
    ),
    ("device-listed-twice", ["--device", "cuda:0,cuda:0"], "cuda:0 is listed twice"),
    ("devices-mixed", ["--device", "cpu,cuda:1"], "all run on CUDA or all on the CPU"),
    ("unknown-flag", ["--bogus"], "unexpected argument '--bogus'"),
    (
        "vllm-method-spec-rs-lacks",
        ["--speculative-config", '{"method": "medusa"}'],
        "--speculative-config: method 'medusa' (a vLLM method) is not supported",
    ),
]


@pytest.mark.parametrize(("args", "message"), [c[1:] for c in BAD_FLAGS], ids=[c[0] for c in BAD_FLAGS])
@pytest.mark.parametrize("command", ["serve", "generate"])
def test_bad_flags_exit_2_with_a_message_on_stderr(command: str, args: list[str], message: str) -> None:
    positional = ["hello"] if command == "generate" else []
    proc = run([*console_script(), command, *args, *positional])
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert message in proc.stderr
    assert proc.stdout == ""


SERVE_BAD_FLAGS = [
    ("auto-tools-without-parser", ["--enable-auto-tool-choice"], "needs --tool-call-parser"),
    ("unknown-tool-parser", ["--tool-call-parser", "bogus"], "invalid value 'bogus' for '--tool-call-parser"),
    (
        "chat-template-missing",
        ["--chat-template", "/nonexistent/t.jinja"],
        "cannot read '/nonexistent/t.jinja'",
    ),
    ("chat-template-broken", ["--chat-template", "{% for %}"], "invalid chat template"),
    ("unknown-reasoning-parser", ["--reasoning-parser", "o1"], "invalid value 'o1' for '--reasoning-parser"),
    ("host-not-an-address", ["--host", "999.1.1.1"], "--host: host '999.1.1.1' is not a valid IPv4 address"),
]


@pytest.mark.parametrize(
    ("args", "message"), [c[1:] for c in SERVE_BAD_FLAGS], ids=[c[0] for c in SERVE_BAD_FLAGS]
)
def test_serve_bad_tool_and_template_flags_exit_2_before_loading(args: list[str], message: str) -> None:
    proc = run([*console_script(), "serve", *args])
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert message in proc.stderr
    assert proc.stdout == ""


TRAIN_DRAFT_BAD_FLAGS = [
    (
        "init-from-missing",
        ["--init-from", "/nonexistent/draft"],
        "--init-from /nonexistent/draft: no config.json",
    ),
    ("zero-ttt-steps", ["--ttt-steps", "0"], "--ttt-steps must be at least 1"),
    ("zero-draft-layers", ["--draft-layers", "0"], "--draft-layers must be at least 1"),
    ("bad-taps", ["--taps", "2,x"], "--taps: 'x' is not a layer index"),
    ("prompts-missing", ["--prompts", "/nonexistent/prompts.json"], "--prompts /nonexistent/prompts.json: "),
    ("zero-max-new-tokens", ["--max-new-tokens", "0"], "--max-new-tokens must be at least 1"),
    ("zero-generation-batch", ["--generation-batch", "0"], "--generation-batch must be at least 1"),
    ("negative-learning-rate", ["--learning-rate", "-1"], "--learning-rate must be a positive finite number"),
    (
        "infinite-learning-rate",
        ["--learning-rate", "inf"],
        "--learning-rate must be a positive finite number",
    ),
    ("endless-epochs", ["--epochs", "inf"], "--epochs must be in (0, 10000]"),
    ("nan-epochs", ["--epochs", "nan"], "--epochs must be in (0, 10000], got NaN"),
    ("too-many-prompts", ["--num-prompts", "1000000000000000000"], "--num-prompts must be at most 1000000"),
    (
        "skip-past-any-list",
        ["--skip-prompts", "18446744073709551615"],
        "--skip-prompts must be at most 1000000",
    ),
    ("tap-past-the-layers", ["--taps", "2,15,31"], "--taps: tap 31 is past the target's hidden states"),
    (
        "draft-vocab-past-the-target",
        ["--draft-vocab-size", "100000"],
        "exceeds the target's vocabulary of 49152",
    ),
]


@pytest.mark.parametrize(
    ("args", "message"), [c[1:] for c in TRAIN_DRAFT_BAD_FLAGS], ids=[c[0] for c in TRAIN_DRAFT_BAD_FLAGS]
)
def test_train_draft_bad_flags_exit_2_before_generating_anything(
    args: list[str], message: str, tmp_path: Path
) -> None:
    work = tmp_path / "work"
    proc = run(
        [*console_script(), "train-draft", "--output", str(tmp_path / "out"), "--work-dir", str(work), *args]
    )
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert message in proc.stderr
    assert not work.exists(), "nothing is generated for a bad command line"


GENERATE_BAD_SAMPLING = [
    (
        "negative-temperature",
        ["--temperature", "-1"],
        "--temperature: temperature must be a finite number >= 0",
    ),
    ("top-p-above-1", ["--top-p", "1.5"], "--top-p: top_p must be in (0, 1]"),
    ("max-tokens-0", ["--max-tokens", "0"], "--max-tokens: max_tokens must be >= 1"),
    ("regex-invalid", ["--regex", "("], "--regex: structured_outputs.regex is not a valid regex"),
    ("schema-unsupported", ["--json-schema", '{"type": "number", "maximum": 1}'], "`maximum`"),
    ("grammar-left-recursive", ["--grammar", 'root ::= root "a" | "a"'], "rule `root` is left-recursive"),
    (
        "structural-tag-token-level",
        ["--structural-tag", '{"type": "structural_tag", "format": {"type": "token", "token": 1}}'],
        "--structural-tag: structured_outputs.structural_tag at format: the token-level format `token`",
    ),
    ("two-constraints", ["--regex", "a", "--json-object"], "cannot be used with"),
]


@pytest.mark.parametrize(
    ("args", "message"), [c[1:] for c in GENERATE_BAD_SAMPLING], ids=[c[0] for c in GENERATE_BAD_SAMPLING]
)
def test_generate_bad_sampling_flags_exit_2_naming_the_flag(args: list[str], message: str) -> None:
    proc = run([*console_script(), "generate", "--model", "/nonexistent/model.gguf", *args, "hello"])
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert message in proc.stderr
    assert "/nonexistent" not in proc.stderr, "the flags are checked before the model is looked for"


def test_a_tokenizer_directory_without_tokenizer_json_is_a_usage_error(tmp_path: Path) -> None:
    proc = run([*console_script(), "generate", "--tokenizer", str(tmp_path), "hi"])
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "holds no tokenizer.json" in proc.stderr


def test_a_draft_directory_without_a_config_is_a_usage_error_naming_the_file(tmp_path: Path) -> None:
    proc = run(
        [*console_script(), "generate", "--speculative-method", "eagle", "--draft-model", str(tmp_path), "hi"]
    )
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert str(tmp_path / "config.json") in proc.stderr
    assert "checkpoint directory holding config.json" in proc.stderr


def test_generate_keeps_engine_logs_out_of_its_text_unless_asked() -> None:
    env = {k: v for k, v in os.environ.items() if k != "SPEC_RS_LOG"}
    cmd = [*console_script(), *GENERATE]
    quiet = subprocess.run(cmd, capture_output=True, text=True, timeout=90, env=env, stdin=subprocess.DEVNULL)
    assert quiet.returncode == 0, quiet.stderr
    assert " INFO " not in quiet.stderr, quiet.stderr
    assert STATS.search(quiet.stderr), quiet.stderr
    loud = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=90,
        env={**env, "SPEC_RS_LOG": "info"},
        stdin=subprocess.DEVNULL,
    )
    assert loud.returncode == 0, loud.stderr
    assert " INFO " in loud.stderr
    assert loud.stdout == quiet.stdout


def test_generate_without_a_prompt_is_a_usage_error() -> None:
    proc = run([*console_script(), "generate"])
    assert proc.returncode == 2
    assert "<prompt>" in proc.stderr


# --- generate ----------------------------------------------------------------------------------


def test_generate_with_ngram_prints_the_greedy_text_and_acceptance_statistics(plain_llm: LLM) -> None:
    proc = run([*console_script(), *GENERATE])
    assert proc.returncode == 0, proc.stderr
    expected = plain_llm.chat(
        [{"role": "user", "content": PROMPT}], SamplingParams(temperature=0.0, max_tokens=16)
    )[0]
    assert proc.stdout == expected.text + "\n"
    m = STATS.search(proc.stderr)
    assert m, proc.stderr
    tokens, finish, accepted, drafted = int(m[1]), m[2], int(m[3]), int(m[4])
    assert (tokens, finish) == (16, "length")
    assert drafted > 0 and 0 <= accepted <= drafted
    per_position = ints(m[6])
    assert len(per_position) == 4  # the ngram default width
    assert sum(per_position) == accepted


def test_generate_reads_a_vllm_speculative_config_as_the_flags_it_spells() -> None:
    vllm_style = '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}'
    proc = run([*console_script(), "generate", "--speculative-config", vllm_style, *GENERATE[3:]])
    flags = run([*console_script(), *GENERATE])
    assert proc.returncode == 0 and flags.returncode == 0, (proc.stderr, flags.stderr)
    assert proc.stdout == flags.stdout
    # The same width and drafts: the statistics line matches but for the timing.
    assert STATS.search(proc.stderr).groups()[2:] == STATS.search(flags.stderr).groups()[2:]  # type: ignore[union-attr]


def test_generate_with_an_output_constraint_prints_what_llm_chat_gives(ngram_llm: LLM) -> None:
    question = "Is Paris the capital of France?"
    proc = run([*console_script(), *GENERATE[:-1], "--choice", "Yes", "--choice", "No", question])
    assert proc.returncode == 0, proc.stderr
    params = SamplingParams(
        temperature=0.0, max_tokens=16, structured_outputs=StructuredOutputsParams(choice=["Yes", "No"])
    )
    expected = ngram_llm.chat([{"role": "user", "content": question}], params)[0]
    assert proc.stdout == expected.text + "\n" and expected.text in ("Yes", "No")


def test_generate_n_prints_each_choice_as_llm_chat_samples_it(ngram_llm: LLM) -> None:
    question = "Write a haiku about the sea."
    ngram = ["--speculative-method", "ngram", "--num-speculative-tokens", "3"]
    sampling = ["--temperature", "0.8", "--seed", "1234", "--max-tokens", "16", "--n", "2"]
    proc = run([*console_script(), "generate", *ngram, *sampling, question])
    assert proc.returncode == 0, proc.stderr
    params = SamplingParams(temperature=0.8, seed=1234, max_tokens=16, n=2)
    want = ngram_llm.chat([{"role": "user", "content": question}], params)[0]
    blocks = [f"[choice {o.index}]\n{o.text}\n" for o in want.outputs]
    assert len(set(blocks)) == 2 and all(b in proc.stdout for b in blocks), proc.stdout
    assert len(proc.stdout) == sum(map(len, blocks)), "each choice printed once, whole"
    assert all(f"[choice {i}: " in proc.stderr for i in (0, 1)), proc.stderr


def test_generate_trace_prints_one_line_per_verify_step() -> None:
    proc = run([*console_script(), *GENERATE, "--trace"])
    assert proc.returncode == 0, proc.stderr
    assert "draft trace (position: drafted | target | accepted):" in proc.stderr
    steps = [TRACE_LINE.match(line) for line in proc.stderr.splitlines() if TRACE_LINE.match(line)]
    assert steps
    stats = STATS.search(proc.stderr)
    assert stats
    assert sum(len(ints(s[2])) for s in steps if s) == int(stats[4])
    assert sum(int(s[4]) for s in steps if s) == int(stats[3])
    positions = [int(s[1]) for s in steps if s]
    assert positions == sorted(set(positions))
    for s in steps:
        assert s
        drafted, target, n = ints(s[2]), ints(s[3]), int(s[4])
        assert len(target) == len(drafted) + 1
        assert n <= len(drafted) and drafted[:n] == target[:n]


def test_generate_with_device_graph_capture_prints_the_same_text() -> None:
    # On CPU the flag runs decode steps on the captured (padded) shapes eagerly.
    args = [*GENERATE, "--dtype", "f32", "--max-model-len", "512", "--max-num-seqs", "4"]
    ragged = run([*console_script(), *args])
    # Under a 48-key cap, steps whose rows hold more keys run the ragged forward instead.
    captured = run([*console_script(), *args, "--device-graph-capture", "--max-seq-len-to-capture", "48"])
    assert ragged.returncode == 0, ragged.stderr
    assert captured.returncode == 0, captured.stderr
    assert captured.stdout == ragged.stdout
    stats = [STATS.search(proc.stderr) for proc in (ragged, captured)]
    assert stats[0] and stats[1], (ragged.stderr, captured.stderr)
    # Tokens, finish reason, accepted and drafted tokens, acceptance per position.
    assert [stats[0][i] for i in (1, 2, 3, 4, 6)] == [stats[1][i] for i in (1, 2, 3, 4, 6)]


def test_cargo_binary_generates_the_same_greedy_text_as_the_console_script(cargo_binary: Path) -> None:
    python = run([*console_script(), *GENERATE])
    rust = run([str(cargo_binary), *GENERATE], timeout=110)
    assert python.returncode == 0, python.stderr
    assert rust.returncode == 0, rust.stderr
    assert rust.stdout == python.stdout
    py_stats, rs_stats = STATS.search(python.stderr), STATS.search(rust.stderr)
    assert py_stats and rs_stats
    # Same tokens, finish reason and draft counts: the two front ends run the same engine.
    assert py_stats.group(1, 2, 3, 4, 6) == rs_stats.group(1, 2, 3, 4, 6)


def test_generate_on_two_data_parallel_replicas_prints_the_same_text(cargo_binary: Path) -> None:
    # `--device cpu,cpu` runs one replica per listed device, through both front ends.
    args = [*GENERATE, "--dtype", "f32", "--max-model-len", "512", "--max-num-seqs", "4"]
    one = run([*console_script(), *args])
    assert one.returncode == 0, one.stderr
    for front_end in (console_script(), [str(cargo_binary)]):
        two = run([*front_end, *args, "--device", "cpu,cpu"], timeout=110)
        assert two.returncode == 0, two.stderr
        assert two.stdout == one.stdout, front_end
