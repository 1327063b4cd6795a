"""The offline API: ``LLM(model, draft_model, speculative_config=...)`` and ``generate`` /
``chat`` / ``stream``.

Building an ``LLM`` resolves the pipeline the way the server does: the target checkpoint's
architecture is looked up in :data:`~spec_rs.registry.ARCH_LOOKUP`; with speculation on, the
speculator matching the method and the draft checkpoint's architecture is selected and
``derive()``-d; the draft width is resolved from the checkpoint where the architecture says
so; and the derived ``pipeline_model`` (a Rust pipeline class) is built. Generation runs on
the engine's own thread with the GIL released.

With neither ``draft_model`` nor ``speculative_config``, the default model runs with the
EAGLE-3 head spec-rs ships for it (K=3); ``speculative_config=SpeculativeConfig()`` asks for
plain decoding.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from . import _spec_rs
from .config import SpeculativeConfig
from .errors import ConfigError
from .models import DEFAULT_MODEL, resolve_model
from .registry import ARCH_LOOKUP, ArchLookup, SupportedArchitecture

Prompt = str | Sequence[int] | dict[str, Any]

#: Methods whose drafter is a separate checkpoint (MTP heads may live in the target's).
DRAFT_CHECKPOINT_METHODS = ("eagle", "dflash", "dflash2", "dspark")
Message = dict[str, Any]


class StructuredOutputsParams(BaseModel):
    """What the output must look like (vLLM's ``StructuredOutputsParams``); give exactly one.

    At every position the tokens that would leave the constraint are masked before sampling,
    drafts included, so speculative decoding returns exactly what plain decoding returns.

    - ``json``: a JSON schema (a dict, or its JSON text) the output is an instance of.
      Properties come in the schema's order; keywords whose constraint cannot be enforced
      (``maximum`` on a non-integer number, ``uniqueItems``, ...) raise ``ValidationError``
      rather than be ignored; integers take any ``minimum`` / ``maximum``.
    - ``regex``: a regex the whole output matches.
    - ``choice``: the output is exactly one of these strings.
    - ``json_object``: the output is any JSON object.
    - ``grammar``: a context-free grammar, in EBNF (``root ::= ...``, the syntax of vLLM's
      xgrammar backend and llama.cpp's GBNF: literals, character classes, groups, ``*``, ``+``,
      ``?``, ``{m,n}``) or in Lark (``start: ...``, with ``/regex/`` terminals, Lark's
      ``common`` terminals and ``%ignore``); left recursion and undefined rules raise
      ``ValidationError`` naming the rule.
    - ``structural_tag``: free text with constrained regions (a dict, or its JSON text), as
      xgrammar's ``{"type": "structural_tag", "format": {...}}`` (``tag``,
      ``triggered_tags``, ``json_schema``, ``any_text``, ``sequence``, ... nested) or vLLM's
      earlier ``{"structures": [{"begin", "schema", "end"}], "triggers": [...]}``. Free text
      never holds a trigger or the enclosing tag's end, so a trigger always opens a tag and a
      region closes at its first end; token-level formats raise ``ValidationError``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, validate_by_name=True, serialize_by_alias=True)

    json_: dict[str, Any] | str | None = Field(None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    json_object: bool | None = None
    grammar: str | None = None
    structural_tag: dict[str, Any] | str | None = None


GuidedDecodingParams = StructuredOutputsParams
"""vLLM's earlier name for :class:`StructuredOutputsParams`."""


class SamplingParams(BaseModel):
    """How a request samples and when it stops (vLLM's names and meanings).

    ``temperature=0`` decodes greedily. Off values: ``top_k=0``, ``top_p=1``, ``min_p=0``,
    ``repetition_penalty=1``, ``frequency_penalty=presence_penalty=0``, ``logit_bias={}``.

    Values are checked when the object is built, by the rules the engine applies to every
    request (one implementation, in Rust): a bad one raises ``ValidationError`` naming it
    (NaN and infinity too, which JSON cannot carry to those rules).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = Field(None, ge=0, lt=1 << 64)
    n: int = Field(1, ge=1)
    """Independent completions of each prompt (``RequestOutput.outputs``); sampling only: a
    greedy request (``temperature=0``) takes one. With a seed, choice 0 uses it as is and the
    others derive their own from it."""
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    max_tokens: int | None = Field(16, ge=0)
    stop: list[str] = []
    stop_token_ids: list[Annotated[int, Field(ge=0, lt=1 << 32)]] = []
    ignore_eos: bool = False
    logprobs: int | None = Field(None, ge=0)
    prompt_logprobs: int | None = Field(None, ge=0)
    """Score the prompt: each prompt token's logprob after the first (with this many top
    logprobs per position) comes back in ``RequestOutput.prompt_logprobs``."""
    min_tokens: int = Field(0, ge=0)
    logit_bias: dict[Annotated[int, Field(ge=0, lt=1 << 32)], float] = {}
    """Added to the named tokens' logits at every position (OpenAI's range, -100 to 100)."""
    allowed_token_ids: list[Annotated[int, Field(ge=0, lt=1 << 32)]] | None = None
    """Sample only among these tokens (every other logit is masked at every position)."""
    include_stop_str_in_output: bool = False
    """Keep the stop string (or the stop token's text) that ended the output in its text."""
    skip_special_tokens: bool = True
    """Leave special tokens out of the text; ``token_ids`` keeps them either way."""
    truncate_prompt_tokens: int | None = Field(None, ge=1)
    """Keep only the last this many prompt tokens."""
    bad_words: list[str] = []
    """Words the output never contains: the token that would complete one (as written or
    after a space) is masked at every position, drafts included, so speculation stays
    lossless."""
    structured_outputs: StructuredOutputsParams | None = None
    """The output follows a JSON schema, is any JSON object, matches a regex or is one of
    some choices (see :class:`StructuredOutputsParams`)."""
    guided_decoding: StructuredOutputsParams | None = Field(None, exclude=True)
    """vLLM's earlier name for ``structured_outputs``: moved there when the object is built."""

    @model_validator(mode="before")
    @classmethod
    def _guided_decoding_is_structured_outputs(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("guided_decoding") is not None:
            if data.get("structured_outputs") is not None:
                raise ValueError("give structured_outputs or guided_decoding (its earlier name), not both")
            data = {**data, "structured_outputs": data["guided_decoding"], "guided_decoding": None}
        return data

    @field_validator("stop", mode="before")
    @classmethod
    def _stop_as_list(cls, value: Any) -> Any:
        if value is None:
            return []
        return [value] if isinstance(value, str) else value

    @model_validator(mode="after")
    def _engine_rules(self) -> SamplingParams:
        _spec_rs.validate_sampling_params(self.model_dump_json())
        return self


@dataclass(frozen=True)
class SpecDecodeMetrics:
    """Speculative-decoding statistics of one request."""

    num_drafts: int = 0
    """Verify steps that carried at least one draft."""
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    acceptance_length: float = 1.0
    """Committed tokens per verify step with drafts (accepted drafts + 1)."""
    accepted_per_position: list[int] = field(default_factory=list)
    """``accepted_per_position[i]``: steps that accepted at least ``i + 1`` drafts."""
    time_to_first_token: float | None = None
    latency: float = 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0


@dataclass(frozen=True)
class TraceStep:
    """One verify step of a request: drafted tokens, the target's argmax at those positions
    (and the bonus position), and how many drafts were accepted."""

    position: int
    drafted: list[int]
    target: list[int]
    num_accepted: int


@dataclass(frozen=True)
class TokenLogprob:
    """A token's log-probability under the raw target logits, its rank there (1: the most
    likely; vLLM's ``Logprob.rank``) and the most likely tokens with theirs."""

    token: int
    logprob: float
    top: list[tuple[int, float]]
    rank: int = 1


def _token_logprob(lp: dict[str, Any]) -> TokenLogprob:
    return TokenLogprob(lp["token"], lp["logprob"], [tuple(t) for t in lp["top"]], lp["rank"])


def _metrics(m: dict[str, Any] | None) -> SpecDecodeMetrics | None:
    if not m:
        return None
    return SpecDecodeMetrics(
        num_drafts=m["num_drafts"],
        num_draft_tokens=m["num_draft_tokens"],
        num_accepted_tokens=m["num_accepted_tokens"],
        acceptance_length=m["acceptance_length"],
        accepted_per_position=m["accepted_per_position"],
        time_to_first_token=m["time_to_first_token"],
        latency=m["latency"],
    )


def _merged_metrics(parts: list[SpecDecodeMetrics]) -> SpecDecodeMetrics:
    """One request's statistics over its choices: counts summed, the first token of any
    choice, the last choice's finish."""
    per_position = [0] * max(len(m.accepted_per_position) for m in parts)
    for m in parts:
        for i, v in enumerate(m.accepted_per_position):
            per_position[i] += v
    drafts = sum(m.num_drafts for m in parts)
    accepted = sum(m.num_accepted_tokens for m in parts)
    first_tokens = [m.time_to_first_token for m in parts if m.time_to_first_token is not None]
    return SpecDecodeMetrics(
        num_drafts=drafts,
        num_draft_tokens=sum(m.num_draft_tokens for m in parts),
        num_accepted_tokens=accepted,
        acceptance_length=1.0 + accepted / drafts if drafts else 1.0,
        accepted_per_position=per_position,
        time_to_first_token=min(first_tokens) if first_tokens else None,
        latency=max(m.latency for m in parts),
    )


@dataclass(frozen=True)
class CompletionOutput:
    """One completion (choice) of a request, as vLLM's ``RequestOutput.outputs`` holds them:
    ``n`` of them with ``SamplingParams(n=...)``."""

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None
    logprobs: list[TokenLogprob] = field(default_factory=list)
    metrics: SpecDecodeMetrics | None = None
    """This choice's speculative-decoding statistics (on its last delta when streaming)."""
    stop_reason: int | str | None = None
    """The stop token id or stop string that ended the choice (vLLM's); ``None`` for EOS and
    length limits, and on a stream's earlier deltas."""
    trace: list[TraceStep] = field(default_factory=list)
    error: str | None = None

    @classmethod
    def _from_dict(cls, d: dict[str, Any]) -> CompletionOutput:
        return cls(
            index=d.get("index", 0),
            text=d["text"],
            token_ids=d["token_ids"],
            finish_reason=d["finish_reason"],
            logprobs=[_token_logprob(lp) for lp in d["logprobs"]],
            metrics=_metrics(d.get("metrics")),
            stop_reason=d.get("stop_reason"),
            trace=[TraceStep(**t) for t in d["trace"]],
            error=(d.get("error") or {}).get("message"),
        )


@dataclass(frozen=True)
class RequestOutput:
    """A finished request (or, from :meth:`LLM.stream`, one streamed delta of one choice).

    ``outputs`` holds the request's choices (one unless ``SamplingParams(n=...)``; a streamed
    delta holds the one choice it extends). ``text``, ``token_ids``, ``finish_reason``,
    ``logprobs``, ``trace`` and ``error`` read the first of them; ``metrics`` sums every choice.
    """

    request_id: int
    outputs: list[CompletionOutput]
    num_prompt_tokens: int
    prompt_token_ids: list[int] = field(default_factory=list)
    """The prompt as the engine tokenized it (a streamed request's first delta of each
    choice carries it)."""
    prompt_logprobs: list[TokenLogprob | None] = field(default_factory=list)
    """With ``prompt_logprobs``: one per prompt token, ``None`` for the first."""
    finished: bool = True
    """Every choice has finished (a streamed request's last delta)."""
    num_cached_tokens: int | None = None
    """Prompt tokens whose KV the prefix cache supplied (vLLM's field), as the first choice
    saw it; ``None`` until the first choice finishes (a streamed request's earlier deltas)."""

    @property
    def text(self) -> str:
        return self.outputs[0].text

    @property
    def token_ids(self) -> list[int]:
        return self.outputs[0].token_ids

    @property
    def finish_reason(self) -> str | None:
        return self.outputs[0].finish_reason

    @property
    def logprobs(self) -> list[TokenLogprob]:
        return self.outputs[0].logprobs

    @property
    def trace(self) -> list[TraceStep]:
        return self.outputs[0].trace

    @property
    def error(self) -> str | None:
        return next((o.error for o in self.outputs if o.error is not None), None)

    @property
    def metrics(self) -> SpecDecodeMetrics | None:
        parts = [o.metrics for o in self.outputs if o.metrics is not None]
        if len(parts) <= 1:
            return parts[0] if parts else None
        return _merged_metrics(parts)

    @classmethod
    def _from_choices(cls, choices: list[dict[str, Any]], finished: bool = True) -> RequestOutput:
        first = choices[0]
        return cls(
            request_id=first["request_id"],
            outputs=[CompletionOutput._from_dict(c) for c in choices],
            num_prompt_tokens=first["num_prompt_tokens"],
            prompt_token_ids=first["prompt_token_ids"],
            prompt_logprobs=[None if lp is None else _token_logprob(lp) for lp in first["prompt_logprobs"]],
            finished=finished,
            num_cached_tokens=(first.get("metrics") or {}).get("num_cached_tokens"),
        )

    @classmethod
    def _from_json(cls, text: str) -> RequestOutput:
        d = json.loads(text)
        return cls._from_choices([d], finished=d.get("finished", d["finish_reason"] is not None))


def _read_hf_config(path: str | None) -> dict[str, Any]:
    if path is None:
        return {}
    p = Path(path)
    cfg = p / "config.json" if p.is_dir() else p.with_name("config.json")
    if p.suffix == ".gguf" or not cfg.is_file():
        return {}
    loaded: dict[str, Any] = json.loads(cfg.read_text())
    return loaded


@dataclass(frozen=True)
class ResolvedPipeline:
    """What building a pipeline decided."""

    target_architecture: str
    architecture: SupportedArchitecture
    speculative_config: SpeculativeConfig
    pipeline: Any


def _check_sizes(**sizes: int | None) -> None:
    """The engine takes unsigned sizes: name the one that is not, rather than an OverflowError
    from the binding. Their rules (at least 1, fits the model) are the engine's."""
    for name, value in sizes.items():
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 1 << 64
        ):
            error = ConfigError(f"{name} must be a non-negative integer below 2**64, got {value!r}")
            error.field = name
            raise error


def _speculative_config_from_mapping(
    mapping: Mapping[str, Any], draft_model: str | None
) -> tuple[SpeculativeConfig, str | None]:
    """A dict of ``SpeculativeConfig`` fields, or of vLLM's spelling of them (``{"method":
    "eagle3", "model": "<draft dir>", ...}``): the config, and the draft ``model`` names."""
    fields = dict(mapping)
    dialect = {key: fields.pop(key) for key in list(fields) if key not in SpeculativeConfig.model_fields}
    if dialect:
        translated, dialect_draft = _spec_rs.translate_vllm_speculative_config(
            json.dumps(dialect, default=str), sorted(fields)
        )
        fields.update(json.loads(translated))
        if dialect_draft is not None:
            if draft_model is not None and os.path.normpath(draft_model) != os.path.normpath(dialect_draft):
                error = ConfigError(
                    f"draft_model={draft_model!r} and speculative_config's model={dialect_draft!r} "
                    "name different drafts: give one"
                )
                error.field = "draft_model"
                raise error
            draft_model = dialect_draft
    # Validated (and refused) as the model is.
    return SpeculativeConfig.model_validate(fields), draft_model


def build_pipeline(
    model: str = DEFAULT_MODEL,
    draft_model: str | None = None,
    speculative_config: SpeculativeConfig | Mapping[str, Any] | None = None,
    *,
    dtype: str | None = None,
    device: str | Sequence[str] = "cpu",
    max_num_seqs: int = 64,
    max_model_len: int | None = None,
    max_num_batched_tokens: int = 2048,
    kv_cache_memory: int = 1 << 30,
    block_size: int = 16,
    enable_spec_decode_mixed_batches: bool = False,
    device_graph_capture: bool = False,
    max_seq_len_to_capture: int = 4096,
    enable_prefix_caching: bool = True,
    tokenizer: str | None = None,
    arch_lookup: ArchLookup | None = None,
) -> ResolvedPipeline:
    """Selects the architecture (and speculator), resolves the draft width, builds the pipeline."""
    _check_sizes(
        max_num_seqs=max_num_seqs,
        max_model_len=max_model_len,
        max_num_batched_tokens=max_num_batched_tokens,
        kv_cache_memory=kv_cache_memory,
        block_size=block_size,
        max_seq_len_to_capture=max_seq_len_to_capture,
    )
    lookup = arch_lookup or ARCH_LOOKUP
    if isinstance(speculative_config, Mapping):
        speculative_config, draft_model = _speculative_config_from_mapping(speculative_config, draft_model)
    elif speculative_config is not None and not isinstance(speculative_config, SpeculativeConfig):
        raise TypeError(
            "speculative_config must be a SpeculativeConfig or a dict of its fields (or vLLM's), "
            f"got {type(speculative_config).__name__}"
        )
    if speculative_config is None and draft_model is None:
        shipped = _spec_rs.default_draft(model)
        if shipped is not None:
            draft_model, spec_json = shipped
            speculative_config = SpeculativeConfig.model_validate_json(spec_json)
    spec = speculative_config or SpeculativeConfig()
    target_path = resolve_model(model)
    draft_path = resolve_model(draft_model) if draft_model is not None else None
    target_arch = _spec_rs.peek_architecture(target_path)
    arch = lookup.find(target_arch)
    if arch is None:
        raise ConfigError(
            f"architecture {target_arch!r} of {model!r} is not registered; register it in ARCH_LOOKUP"
        )
    if spec.speculative_method is None and draft_path is not None:
        # As vLLM does: a draft given alone runs the method its config names.
        inferred = _spec_rs.draft_method(draft_path)
        if inferred is not None:
            spec = SpeculativeConfig.model_validate({**spec.model_dump(), "speculative_method": inferred})
    if spec.speculative_method in DRAFT_CHECKPOINT_METHODS and draft_path is None:
        error = ConfigError(
            f"speculative_method={spec.speculative_method!r} needs a draft checkpoint: "
            "pass draft_model=<directory> (--draft-model on the command line)"
        )
        error.field = "draft_model"
        raise error
    if spec.speculative_method is not None:
        draft_arch = (
            _spec_rs.draft_architecture(spec.speculative_method, draft_path)
            if draft_path is not None
            else None
        )
        speculator = lookup.select_speculator(target_arch, spec.speculative_method, draft_arch)
        if speculator is None:
            raise ConfigError(
                f"{target_arch} declares no speculators; "
                f"speculative_method={spec.speculative_method!r} cannot run"
            )
        arch = speculator.derive()
        if arch.checkpoint_draft_width is not None:
            width = arch.checkpoint_draft_width(
                spec, _read_hf_config(target_path), _read_hf_config(draft_path)
            )
            spec = spec.with_width(width)
        spec.check_pipeline_combinations()
    engine_args = _with_required_arguments(
        arch,
        {
            "max_num_seqs": max_num_seqs,
            "max_model_len": max_model_len,
            "max_num_batched_tokens": max_num_batched_tokens,
            "kv_cache_memory": kv_cache_memory,
            "block_size": block_size,
            "enable_spec_decode_mixed_batches": enable_spec_decode_mixed_batches,
            "device_graph_capture": device_graph_capture,
            "max_seq_len_to_capture": max_seq_len_to_capture,
            "enable_prefix_caching": enable_prefix_caching,
        },
    )
    kv_cache_bytes = engine_args.pop("kv_cache_memory")
    try:
        pipeline = arch.pipeline_model(
            target_path,
            draft_path,
            json.dumps(spec.model_dump(mode="json")),
            dtype=_encoding(arch, dtype),
            device=device if isinstance(device, str) else ",".join(device),
            kv_cache_bytes=kv_cache_bytes,
            tokenizer=str(resolve_tokenizer(tokenizer)) if tokenizer is not None else None,
            **engine_args,
        )
    except ConfigError as error:
        if error.field == "kv_cache_bytes":  # the engine's name for this argument
            error.field = "kv_cache_memory"
        raise
    return ResolvedPipeline(target_arch, arch, spec, pipeline)


def _encoding(arch: SupportedArchitecture, dtype: str | None) -> str:
    """The weight dtype: the one asked for, which the architecture must support, or (for
    none, or ``"auto"``) its ``default_encoding``."""
    if dtype is None or _spec_rs.canonical_dtype(dtype) == "auto":
        return arch.default_encoding
    dtype = _spec_rs.canonical_dtype(dtype)
    if dtype not in arch.supported_encodings:
        error = ConfigError(
            f"{arch.name} does not run dtype={dtype!r}: its supported encodings are "
            f"{', '.join(sorted(arch.supported_encodings))}"
        )
        error.field = "dtype"
        raise error
    return dtype


def _with_required_arguments(arch: SupportedArchitecture, engine_args: dict[str, Any]) -> dict[str, Any]:
    """``engine_args`` with the values ``arch.required_arguments`` forces (as MAX applies them)."""
    unknown = sorted(set(arch.required_arguments) - set(engine_args))
    if unknown:
        raise ConfigError(
            f"{arch.name} requires arguments the engine does not take: {', '.join(unknown)} "
            f"(required_arguments may set {', '.join(engine_args)})"
        )
    forced = {**engine_args, **arch.required_arguments}
    _check_sizes(**{k: v for k, v in forced.items() if not isinstance(engine_args[k], bool)})
    return forced


def resolve_tokenizer(tokenizer: str | os.PathLike[str]) -> Path:
    """The directory (or ``tokenizer.json``) a ``tokenizer=`` argument names, checked to exist."""
    path = Path(tokenizer).expanduser()
    if not path.exists():
        error = ConfigError(
            f"tokenizer {str(tokenizer)!r} does not exist: "
            "pass a directory holding tokenizer.json or the file itself"
        )
        error.field = "tokenizer"
        raise error
    return path


def _is_token_ids(value: Any) -> bool:
    # Bytes are a sequence of ints too, but they are text, not token ids; bools are not ids.
    return (
        isinstance(value, Sequence)
        and not isinstance(value, str | bytes | bytearray)
        and all(isinstance(t, int) and not isinstance(t, bool) for t in value)
    )


def _token_ids(ids: Sequence[int]) -> list[int]:
    """Prompt token ids as the engine takes them; it checks them against the vocabulary."""
    negative = next((t for t in ids if t < 0), None)
    if negative is not None:
        raise ValueError(f"prompt token ids must be non-negative, got {negative}")
    huge = next((t for t in ids if t >= 1 << 32), None)
    if huge is not None:
        raise ValueError(f"prompt token id {huge} is outside any vocabulary (token ids are below 2**32)")
    return [int(t) for t in ids]


def _prompt_json(prompt: Any) -> dict[str, Any]:
    if isinstance(prompt, str):
        return {"text": prompt}
    if _is_token_ids(prompt):
        return {"tokens": _token_ids(prompt)}
    # vLLM's TextPrompt / TokensPrompt dicts.
    if isinstance(prompt, dict) and set(prompt) == {"prompt"} and isinstance(prompt["prompt"], str):
        return {"text": prompt["prompt"]}
    if (
        isinstance(prompt, dict)
        and set(prompt) == {"prompt_token_ids"}
        and _is_token_ids(prompt["prompt_token_ids"])
    ):
        return {"tokens": _token_ids(prompt["prompt_token_ids"])}
    raise TypeError(
        "a prompt must be a string, a list of token ids (ints), or vLLM's {'prompt': str} or "
        f"{{'prompt_token_ids': [int]}}, got {type(prompt).__name__}: {prompt!r:.80}"
    )


def _prompt_batch(prompts: Any) -> list[dict[str, Any]]:
    """One prompt (text, token ids or a vLLM prompt dict) or a list of them, as request prompts."""
    if isinstance(prompts, str | dict) or (_is_token_ids(prompts) and len(prompts) > 0):
        return [_prompt_json(prompts)]
    if not isinstance(prompts, Sequence) or isinstance(prompts, bytes | bytearray):
        raise TypeError(
            "prompts must be a string (decode bytes first), a list of token ids, or a list of those, "
            f"got {type(prompts).__name__}: {prompts!r:.80}"
        )
    return [_prompt_json(p) for p in prompts]


def _conversations(messages: Any) -> list[list[Message]]:
    """One conversation (a list of message dicts) or a list of them."""
    if isinstance(messages, Sequence) and not isinstance(messages, str):
        if messages and all(isinstance(m, dict) for m in messages):
            return [list(messages)]
        if all(
            isinstance(c, Sequence) and not isinstance(c, str) and all(isinstance(m, dict) for m in c)
            for c in messages
        ):
            return [list(c) for c in messages]
    raise TypeError(
        'messages must be a conversation (a list of {"role": ..., "content": ...} dicts) or a list of '
        f"conversations, got {type(messages).__name__}: {messages!r:.80}"
    )


def _template_options(
    add_generation_prompt: bool,
    continue_final_message: bool,
    tools: Sequence[dict[str, Any]] | None,
    chat_template: str | None,
    chat_template_kwargs: dict[str, Any] | None,
) -> dict[str, Any]:
    """How a conversation is rendered, as the engine reads it beside ``chat``."""
    for name, flag in (
        ("add_generation_prompt", add_generation_prompt),
        ("continue_final_message", continue_final_message),
    ):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be True or False, got {flag!r}")
    if chat_template is not None and not isinstance(chat_template, str):
        raise TypeError(f"chat_template must be a Jinja template string, got {type(chat_template).__name__}")
    if tools is not None and not (
        isinstance(tools, Sequence) and not isinstance(tools, str) and all(isinstance(t, dict) for t in tools)
    ):
        raise TypeError(f"tools must be a list of tool dicts, got {type(tools).__name__}")
    if chat_template_kwargs is not None and not isinstance(chat_template_kwargs, dict):
        raise TypeError(f"chat_template_kwargs must be a dict, got {type(chat_template_kwargs).__name__}")
    return {
        "add_generation_prompt": add_generation_prompt,
        "continue_final_message": continue_final_message,
        "tools": None if tools is None else list(tools),
        "chat_template": chat_template,
        "chat_template_kwargs": chat_template_kwargs,
    }


def _params_per_prompt(
    params: SamplingParams | Sequence[SamplingParams] | None, count: int
) -> list[SamplingParams]:
    """One ``SamplingParams`` for every prompt, or a list of one per prompt (as vLLM takes)."""
    if params is None or isinstance(params, SamplingParams):
        return [params or SamplingParams()] * count
    if isinstance(params, Sequence) and all(isinstance(p, SamplingParams) for p in params):
        if len(params) != count:
            raise ValueError(
                f"{len(params)} sampling params for {count} prompts: pass one SamplingParams for all "
                "or one per prompt"
            )
        return list(params)
    raise TypeError(
        "sampling_params must be a SamplingParams or a list of one per prompt, "
        f"got {type(params).__name__}: {params!r:.80}"
    )


class LLM:
    """A target model, optionally with a drafter, ready to generate.

    >>> llm = LLM("smollm2-135m-instruct", speculative_config=SpeculativeConfig(speculative_method="ngram"))
    >>> out = llm.generate(["def fibonacci(n):"], SamplingParams(max_tokens=64, temperature=0.0))
    >>> out[0].text, out[0].metrics.acceptance_length  # doctest: +SKIP

    ``device`` names one device or several (``["cuda:0", "cuda:1"]`` or ``"cuda:0,cuda:1"``):
    one data-parallel replica per device, each with its own copy of the target and KV cache
    (``max_num_seqs`` and ``kv_cache_memory`` each), new requests going to the replica that
    cached their prompt's start (unless it is much busier) or else the least-loaded one.
    ``speculative_config.draft_head_parallelism`` places the draft head.

    ``speculative_config`` may also be a dict: of its fields, or in vLLM's spelling
    (``{"method": "eagle3", "model": "<draft dir>", "num_speculative_tokens": 3}``, where
    ``model`` is the draft checkpoint and vLLM's family MTP methods are ``mtp``); vLLM keys
    spec-rs has no use for are refused by name, with what to set instead.

    ``enable_prefix_caching`` (on, as in vLLM) reuses the KV blocks, the target's and the
    drafter's, of prompt prefixes earlier requests computed: shared system prompts,
    multi-turn chats and a request's ``n`` choices skip computing them again.
    ``RequestOutput.num_cached_tokens`` says how many prompt tokens were reused.

    ``tokenizer`` (as vLLM's) names a directory holding ``tokenizer.json`` (or the file) to use
    instead of the model's: for checkpoints that ship only ``tokenizer.model``, and GGUF files
    whose tokenizer spec-rs does not build (it builds byte-level BPE and SentencePiece BPE
    vocabularies).
    """

    def __init__(
        self,
        model: str = DEFAULT_MODEL,
        draft_model: str | None = None,
        *,
        speculative_config: SpeculativeConfig | Mapping[str, Any] | None = None,
        dtype: str | None = None,
        device: str | Sequence[str] = "cpu",
        max_num_seqs: int = 64,
        max_model_len: int | None = None,
        max_num_batched_tokens: int = 2048,
        kv_cache_memory: int = 1 << 30,
        block_size: int = 16,
        enable_spec_decode_mixed_batches: bool = False,
        device_graph_capture: bool = False,
        max_seq_len_to_capture: int = 4096,
        enable_prefix_caching: bool = True,
        tokenizer: str | None = None,
        custom_architectures: str | None = None,
        arch_lookup: ArchLookup | None = None,
    ) -> None:
        lookup = arch_lookup or ARCH_LOOKUP
        if custom_architectures is not None:
            lookup.load_custom_architectures(custom_architectures)
        resolved = build_pipeline(
            model,
            draft_model,
            speculative_config,
            dtype=dtype,
            device=device,
            max_num_seqs=max_num_seqs,
            max_model_len=max_model_len,
            max_num_batched_tokens=max_num_batched_tokens,
            kv_cache_memory=kv_cache_memory,
            block_size=block_size,
            enable_spec_decode_mixed_batches=enable_spec_decode_mixed_batches,
            device_graph_capture=device_graph_capture,
            max_seq_len_to_capture=max_seq_len_to_capture,
            enable_prefix_caching=enable_prefix_caching,
            tokenizer=tokenizer,
            arch_lookup=lookup,
        )
        self.model = model
        self.architecture = resolved.architecture
        self.speculative_config = resolved.speculative_config
        self.pipeline = resolved.pipeline

    @property
    def info(self) -> dict[str, Any]:
        """The resolved pipeline: architecture, fused name, method, width, acceptance rule."""
        info: dict[str, Any] = self.pipeline.info
        return info

    def _run(
        self,
        prompts: list[dict[str, Any]],
        params: SamplingParams | Sequence[SamplingParams] | None,
        trace: bool,
    ) -> list[RequestOutput]:
        per_prompt = _params_per_prompt(params, len(prompts))
        requests = [
            json.dumps({"prompt": pr, "params": p.model_dump(), "trace": trace})
            for pr, p in zip(prompts, per_prompt, strict=True)
        ]
        # One JSON object per choice, a request's choices together and in index order.
        choices = [json.loads(o) for o in self.pipeline.generate(requests)]
        grouped: list[list[dict[str, Any]]] = []
        for choice in choices:
            if grouped and grouped[-1][0]["request_id"] == choice["request_id"]:
                grouped[-1].append(choice)
            else:
                grouped.append([choice])
        return [RequestOutput._from_choices(g) for g in grouped]

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        trace: bool = False,
    ) -> list[RequestOutput]:
        """Completes each prompt (text, or token ids) as is, batched; outputs in prompt order.

        ``sampling_params`` is one for every prompt or a list of one per prompt.
        ``trace=True`` records, per verify step, the drafted tokens, the target's tokens at
        those positions and how many were accepted.
        """
        return self._run(_prompt_batch(prompts), sampling_params, trace)

    def chat(
        self,
        messages: Sequence[Message] | Sequence[Sequence[Message]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        trace: bool = False,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        tools: Sequence[dict[str, Any]] | None = None,
        chat_template: str | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> list[RequestOutput]:
        """Answers one conversation (a list of ``{"role", "content"}``) or several, with the
        model's chat template: in a new assistant turn, or, with ``continue_final_message=True``
        (and ``add_generation_prompt=False``), by continuing the final message, whose text
        then prefills the start of the answer (vLLM's flags).

        As in vLLM, ``tools`` (OpenAI's tool list) are rendered by the template for the model
        to see, ``chat_template`` replaces the model's template, and ``chat_template_kwargs``
        are more variables for it. Messages may carry an assistant's ``tool_calls`` and a tool
        result's ``tool_call_id``. To make the output a call, constrain it with
        ``StructuredOutputsParams(json=<the function's parameters>)``."""
        options = _template_options(
            add_generation_prompt, continue_final_message, tools, chat_template, chat_template_kwargs
        )
        return self._run([{"chat": c, **options} for c in _conversations(messages)], sampling_params, trace)

    def stream(
        self,
        prompt: Prompt | Sequence[Message],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        trace: bool = False,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        tools: Sequence[dict[str, Any]] | None = None,
        chat_template: str | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> Iterator[RequestOutput]:
        """Yields a request's output as it is committed, one choice's delta at a time
        (``outputs[0].index`` says which); a choice's last delta carries its ``finish_reason``
        and ``metrics``, the request's last one ``finished=True``. Stop iterating (or close the
        generator) to cancel. A conversation takes :meth:`chat`'s template options."""
        if isinstance(prompt, str | dict) or (_is_token_ids(prompt) and len(prompt) > 0):
            p = _prompt_json(prompt)
        else:
            conversations = _conversations(prompt)
            if len(conversations) != 1:
                raise TypeError("stream takes one prompt or one conversation; use chat() for several")
            p = {
                "chat": conversations[0],
                **_template_options(
                    add_generation_prompt, continue_final_message, tools, chat_template, chat_template_kwargs
                ),
            }
        (params,) = _params_per_prompt(sampling_params, 1)
        request = json.dumps({"prompt": p, "params": params.model_dump(), "trace": trace})
        stream = self.pipeline.submit(request)
        try:
            for delta in stream:
                yield RequestOutput._from_json(delta)
        finally:
            stream.cancel()

    def tokenize(self, text: str, add_special_tokens: bool = True) -> list[int]:
        tokens: list[int] = self.pipeline.tokenize(text, add_special_tokens)
        return tokens

    def detokenize(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        ids = list(token_ids)
        for i, token in enumerate(ids):
            if isinstance(token, bool) or not isinstance(token, int):
                raise TypeError(f"token_ids[{i}] = {token!r} is not an int token id")
            if not -(1 << 63) <= token < 1 << 63:  # past what the engine reads; it checks the rest
                raise ValueError(
                    f"token_ids[{i}] = {token} is not a token id of this model "
                    f"(0 to {self.info['vocab_size'] - 1})"
                )
        text: str = self.pipeline.detokenize(ids, skip_special_tokens)
        return text

    def apply_chat_template(
        self,
        messages: Sequence[Message],
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        tools: Sequence[dict[str, Any]] | None = None,
        chat_template: str | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> str:
        """The prompt text :meth:`chat` would give the model for ``messages``."""
        options = _template_options(
            add_generation_prompt, continue_final_message, tools, chat_template, chat_template_kwargs
        )
        text: str = self.pipeline.apply_chat_template(json.dumps({"chat": list(messages), **options}))
        return text

    def kv_blocks(self) -> tuple[int, int]:
        """``(free, total)`` KV-cache blocks; every finished request returns its blocks."""
        blocks: tuple[int, int] = self.pipeline.kv_blocks()
        return blocks

    def reset_prefix_cache(self) -> bool:
        """Forgets every cached prompt prefix (vLLM's ``LLM.reset_prefix_cache``): later
        requests compute their prompts in full. Running requests keep the blocks they hold.
        Returns True once done."""
        self.pipeline.reset_prefix_cache()
        return True

    def reset_suffix_cache(self) -> int:
        """Forgets the outputs of finished requests that suffix decoding drafts from (the
        shared tree of ``suffix_decoding_max_cached_requests`` outputs): a request asked again
        is drafted as the first time. Running requests keep theirs. Returns how many outputs
        went (0 without suffix decoding)."""
        forgotten: int = self.pipeline.reset_suffix_cache()
        return forgotten

    def metrics_text(self) -> str:
        """The engine's Prometheus metrics."""
        text: str = self.pipeline.metrics_text()
        return text

    def serve(self, host: str = "127.0.0.1", port: int = 8000, **kwargs: Any) -> None:
        """Serves the OpenAI API on this model until SIGINT/SIGTERM."""
        if isinstance(port, bool) or not isinstance(port, int):
            raise TypeError(f"port must be an int, got {type(port).__name__}")
        if not 0 <= port <= 65535:
            raise ValueError(f"port must be in 0..=65535 (0 picks a free one), got {port}")
        self.pipeline.serve(host, port, **kwargs)


__all__ = [
    "LLM",
    "CompletionOutput",
    "GuidedDecodingParams",
    "RequestOutput",
    "ResolvedPipeline",
    "SamplingParams",
    "SpecDecodeMetrics",
    "StructuredOutputsParams",
    "TokenLogprob",
    "TraceStep",
    "build_pipeline",
]
