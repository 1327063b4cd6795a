"""``SpeculativeConfig``: how a pipeline drafts and verifies.

Field names, defaults and rules follow Modular MAX's ``SpeculativeConfig``. Every rule is
implemented once, in Rust (``specrs_core``); this pydantic model is the object users hold and
calls that implementation from its validators, so the ``spec-rs`` binary, the server and
Python reject exactly the same configurations with the same messages.

spec-rs adds two methods that need no draft model: ``"ngram"`` (prompt lookup: drafts
copied from earlier in the request's own text), configured by ``prompt_lookup_min`` and
``prompt_lookup_max``, and ``"suffix"`` (vLLM's suffix decoding: frequency-counted suffix
trees over the request's text and earlier requests' outputs), configured by the
``suffix_decoding_*`` fields under vLLM's names and defaults. Three more fields:
``enable_prompt_lookup``, which puts prompt lookup in front of a draft model,
``enable_suffix_decoding``, which puts suffix decoding there instead, and
``draft_confidence_threshold``, which cuts a draft model's chain where its drafts become
unlikely to be accepted.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from . import _spec_rs

SpeculativeMethod = Literal["eagle", "mtp", "dflash", "dflash2", "dspark", "ngram", "suffix"]
DraftProposal = Literal["argmax", "sampled"]
DraftPlacement = Literal["device0", "replica"]

#: Methods that draft one token per drafter forward.
SEQUENTIAL_METHODS = ("eagle", "mtp", "ngram", "suffix")
#: Methods that draft a whole block per drafter forward.
BLOCK_METHODS = ("dflash", "dflash2", "dspark")

_FILE_FIELDS = ("config_file", "section_name")


class VerifyWidthRange(BaseModel):
    """An inclusive range of decode batch sizes and how many drafts the target verifies there.

    Accepts a mapping or a ``(batch_start, batch_end, num_tokens)`` triple.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=False)

    batch_start: int
    batch_end: int
    num_tokens: int

    @model_validator(mode="before")
    @classmethod
    def _from_triple(cls, data: Any) -> Any:
        if isinstance(data, (list, tuple)):
            if len(data) != 3:
                raise ValueError(
                    "each num_speculative_tokens_per_batch_size entry must be a "
                    f"(batch_start, batch_end, num_tokens) triple, got {list(data)!r}"
                )
            return {"batch_start": data[0], "batch_end": data[1], "num_tokens": data[2]}
        return data

    def as_tuple(self) -> tuple[int, int, int]:
        return (self.batch_start, self.batch_end, self.num_tokens)


class SpeculativeConfig(BaseModel):
    """Configures speculative decoding for a pipeline.

    Instances are immutable: assigning a field raises. Unknown fields are rejected. Values
    given as strings (from the command line, environment or YAML) are coerced. NaN and
    infinity are refused by field: no rule can compare them.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=False, allow_inf_nan=False)

    config_file: str | None = Field(default=None, exclude=True)
    """YAML file whose values (or whose ``section_name`` section) form the base of the
    config; values passed explicitly override it leaf by leaf. Excluded from dumps, which
    hold the effective values."""
    section_name: str | None = Field(default=None, exclude=True)
    """Top-level key of ``config_file`` to read."""

    speculative_method: SpeculativeMethod | None = None
    """The method; ``None`` disables speculative decoding."""
    num_speculative_tokens: int | None = None
    """Tokens drafted per step, at most. Unset: 2 for eagle/mtp, 4 for ngram,
    ``suffix_decoding_max_tree_depth`` for suffix (whose drafts are as long as their
    estimated probability allows); block drafters take the width the draft checkpoint was
    trained for."""
    num_speculative_tokens_per_batch_size: list[VerifyWidthRange] | None = None
    """How many drafts the target verifies, by decode batch size (inclusive ranges from 1,
    gaps and tail carry forward, capped at ``num_speculative_tokens``, 0 allowed)."""
    adaptive_speculative_widths: str | None = None
    """Verify widths a throughput-driven controller chooses among: ``"1,3,5"`` or ``"all"``."""
    adaptive_speculative_min_batch_size: int = 1
    """Decode batch size below which only the widest adaptive width is used."""
    num_speculative_tokens_mixed_batch: int | None = None
    """Verify width of mixed prefill+decode steps (with ``enable_spec_decode_mixed_batches``)."""
    synthetic_acceptance_rate: float | None = None
    """Benchmark-only: accept drafts with a calibrated probability, ignoring the logits."""
    use_relaxed_acceptance_for_thinking: bool = False
    """Inside reasoning spans, accept drafts among the target's top candidates (lossy)."""
    relaxed_topk: int = 10
    relaxed_delta: float = 0.6
    use_greedy_acceptance: bool = False
    """Accept drafts by argmax match only."""
    draft_proposal: DraftProposal = "argmax"
    draft_head_parallelism: DraftPlacement = "device0"
    draft_probs_layout: DraftPlacement = "device0"
    logit_penalties: bool = False
    """Apply repetition/frequency/presence penalties at every draft position while verifying."""
    prompt_lookup_min: int = 2
    """ngram (spec-rs extension): shortest suffix n-gram matched."""
    prompt_lookup_max: int = 4
    """ngram (spec-rs extension): longest suffix n-gram matched, tried first."""
    enable_prompt_lookup: bool = False
    """spec-rs extension, with a draft model: a row whose latest tokens repeat an earlier
    n-gram of its text (``prompt_lookup_min`` to ``prompt_lookup_max`` tokens) drafts what
    followed it, and the model drafts only the rows without such a match."""
    draft_confidence_threshold: float = 0.0
    """spec-rs extension, with a draft model: a row drafting the drafter's argmax
    (``draft_proposal="argmax"``, or a greedy request) stops at the first draft where the
    product of the drafter's top-1 probabilities so far falls below this (that draft
    excluded), so the target verifies only drafts likely to be accepted. 0.0 drafts every
    position; must be below 1.0. Not for ``ngram`` or ``dflash2`` (no token probabilities),
    nor ``suffix`` (``suffix_decoding_min_token_prob`` cuts its drafts)."""
    suffix_decoding_max_tree_depth: int = 24
    """suffix: the longest substring the suffix trees count, which bounds the match length
    plus the draft length (vLLM's default)."""
    suffix_decoding_max_cached_requests: int = 10000
    """suffix: earlier requests whose outputs later requests draft from, evicted oldest
    first; 0 keeps only each request's own tree (prompt and output)."""
    suffix_decoding_max_spec_factor: float = 1.0
    """suffix: a match of ``n`` tokens drafts at most ``n * max_spec_factor`` tokens."""
    suffix_decoding_min_token_prob: float = 0.1
    """suffix: drafting stops before a token whose probability, estimated from the trees'
    counts, falls below this."""
    enable_suffix_decoding: bool = False
    """spec-rs extension, with a draft model: suffix decoding's trees (the request's own text
    and earlier requests' outputs, configured by the ``suffix_decoding_*`` fields) draft for a
    row when the continuation they find scores, in expected accepted tokens, at least
    ``suffix_decoding_min_score_ratio`` times ``num_speculative_tokens``: the row copies that
    continuation (up to ``suffix_decoding_max_tree_depth`` tokens, past
    ``num_speculative_tokens``, in batches of fewer than 4 decoding rows), and the model drafts
    the other rows. Instead of ``enable_prompt_lookup``, not with it."""
    suffix_decoding_min_score_ratio: float = 0.5
    """With ``enable_suffix_decoding``: the score a suffix draft needs, as a multiple of
    ``num_speculative_tokens``."""

    @model_validator(mode="before")
    @classmethod
    def _load_config_file(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        if data.get("config_file") is None:
            if data.get("section_name") is not None:
                raise ValueError("section_name names a section of config_file: give config_file too")
            return data
        file_values = json.loads(
            _spec_rs.load_config_file(str(data["config_file"]), data.get("section_name"))
        )
        explicit = {k: v for k, v in data.items() if k not in _FILE_FIELDS}
        merged = json.loads(_spec_rs.merge_config(json.dumps(file_values), json.dumps(_jsonable(explicit))))
        merged.update({k: data[k] for k in _FILE_FIELDS if k in data})
        return merged

    @field_validator(
        "speculative_method", "draft_proposal", "draft_head_parallelism", "draft_probs_layout", mode="before"
    )
    @classmethod
    def _lowercase_choice(cls, value: Any) -> Any:
        return value.strip().lower() if isinstance(value, str) else value

    @field_validator("num_speculative_tokens_per_batch_size", mode="before")
    @classmethod
    def _schedule_from_json_string(cls, value: Any) -> Any:
        # The CLI and environment hand the schedule over as a JSON string.
        if isinstance(value, str):
            return json.loads(value)
        return value

    @model_validator(mode="after")
    def _apply_rules(self) -> SpeculativeConfig:
        normalized = json.loads(_spec_rs.validate_speculative_config(json.dumps(self._fields_json())))
        # Resolved values (the method's default width, the sorted schedule) are written
        # back the way pydantic's own validators do: frozen models allow it during validation.
        object.__setattr__(self, "num_speculative_tokens", normalized["num_speculative_tokens"])
        schedule = normalized["num_speculative_tokens_per_batch_size"]
        if schedule is not None:
            object.__setattr__(
                self,
                "num_speculative_tokens_per_batch_size",
                [VerifyWidthRange(**r) for r in schedule],
            )
        return self

    def _fields_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude=set(_FILE_FIELDS))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SpeculativeConfig):
            return NotImplemented
        return self.model_dump() == other.model_dump()

    def __hash__(self) -> int:
        return hash(json.dumps(self.model_dump(mode="json"), sort_keys=True))

    @property
    def draft_width(self) -> int:
        """The number of tokens drafted per step; set for every config a pipeline builds."""
        if self.num_speculative_tokens is None:
            raise AttributeError(
                "num_speculative_tokens is not resolved yet: block drafters take it from the "
                "draft checkpoint when the pipeline is built"
            )
        return self.num_speculative_tokens

    @property
    def verify_width_schedule(self) -> list[tuple[int, int, int]] | None:
        """The validated schedule as sorted ``(start, end, count)`` triples."""
        if self.num_speculative_tokens_per_batch_size is None:
            return None
        return [r.as_tuple() for r in self.num_speculative_tokens_per_batch_size]

    def is_enabled(self) -> bool:
        return self.speculative_method is not None

    def is_block_draft(self) -> bool:
        """True for methods that draft a block per forward: dflash, dflash2, dspark."""
        return self.speculative_method in BLOCK_METHODS

    def is_dflash(self) -> bool:
        """True for dflash and dflash2 (v2 keeps v1's block-drafting contract)."""
        return self.speculative_method in ("dflash", "dflash2")

    def is_dflash2(self) -> bool:
        return self.speculative_method == "dflash2"

    def is_dspark(self) -> bool:
        return self.speculative_method == "dspark"

    def is_eagle(self) -> bool:
        return self.speculative_method == "eagle"

    def is_mtp(self) -> bool:
        return self.speculative_method == "mtp"

    def is_ngram(self) -> bool:
        return self.speculative_method == "ngram"

    def is_suffix(self) -> bool:
        return self.speculative_method == "suffix"

    def acceptance_rule(self) -> str:
        """``"synthetic"``, ``"stochastic"`` or ``"greedy"``, by precedence."""
        return _spec_rs.acceptance_rule(json.dumps(self._fields_json()))

    def check_pipeline_combinations(self) -> None:
        """Raises :class:`~spec_rs.errors.ConfigError` for rule combinations no verifier runs
        (checked when a pipeline is built)."""
        _spec_rs.check_pipeline_combinations(json.dumps(self._fields_json()))

    def adaptive_widths(self) -> list[int] | None:
        """The adaptive candidate widths, once the draft width is known."""
        if self.adaptive_speculative_widths is None:
            return None
        return _spec_rs.parse_adaptive_widths(self.adaptive_speculative_widths, self.draft_width)

    def with_width(self, num_speculative_tokens: int) -> SpeculativeConfig:
        """A copy with the draft width resolved (used when a checkpoint fixes it)."""
        return type(self).model_validate(
            {**self._fields_json(), "num_speculative_tokens": num_speculative_tokens}
        )


def _jsonable(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


__all__ = ["BLOCK_METHODS", "SEQUENTIAL_METHODS", "SpeculativeConfig", "VerifyWidthRange"]
