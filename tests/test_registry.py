"""The architecture registry: Speculator.derive(), ArchLookup registration and lookup, the
speculator-selection rule (in Rust), custom architecture modules and the built-ins."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterator
from pathlib import Path
from types import MappingProxyType
from typing import Any, ClassVar

import pytest

from spec_rs import SpeculativeConfig, _spec_rs, architectures
from spec_rs.errors import ConfigError, SpeculatorSelectionError
from spec_rs.llm import build_pipeline
from spec_rs.registry import (
    ARCH_LOOKUP,
    ArchLookup,
    Speculator,
    SupportedArchitecture,
    WeightsFormat,
)


class TargetPipeline:
    pass


class FusedPipeline:
    pass


class DraftConfig:
    pass


class DraftMemoryPlanner:
    pass


class DraftBatching:
    pass


def rename_gguf(names: list[str]) -> dict[str, str]:
    return {name: name.replace("blk.", "model.layers.") for name in names}


def rename_draft(names: list[str]) -> dict[str, str]:
    return {name: f"draft.{name}" for name in names}


def width_from_checkpoint(config: Any, target_hf_config: Any, draft_hf_config: Any) -> int:
    return 8


def make_target(name: str = "ToyForCausalLM", **fields: Any) -> SupportedArchitecture:
    """A target with every inheritable field set to something recognisable."""
    defaults: dict[str, Any] = {
        "example_repo_ids": ["toy/target"],
        "supported_encodings": {"f32", "q8_0"},
        "default_encoding": "f32",
        "tokenizer": lambda repo: f"tokenizer for {repo}",
        "weight_adapters": {WeightsFormat.GGUF: rename_gguf},
        "multi_gpu_supported": True,
        "required_arguments": {"enable_prefix_caching": False},
        "supports_overlap_scheduler": False,
        "supports_device_graph_capture": True,
        "supports_spec_decode_mixed_batches": False,
        "memory_planner": object,
        "cascade_pipeline_factory": lambda: "cascade",
        "batching": object,
        "config": object,
        "reasoning_parser": "deepseek_r1",
        "tool_parser": "hermes",
    }
    return SupportedArchitecture(name=name, pipeline_model=TargetPipeline, **{**defaults, **fields})


def make_speculator(
    base: SupportedArchitecture,
    method: str = "eagle",
    draft_arch: str | None = "ToyEagle3",
    **fields: Any,
) -> Speculator:
    return Speculator(
        name=f"Unified{method}{base.name}[{draft_arch}]",
        base=base,
        draft_arch=draft_arch,
        method=method,
        pipeline_model=FusedPipeline,
        **fields,
    )


@pytest.fixture
def isolated_imports(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Undoes sys.path changes and forgets modules imported during the test."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        del sys.modules[name]


# --- Speculator.derive() ---


def test_derive_with_no_overrides_changes_only_name_and_pipeline() -> None:
    target = make_target()
    speculator = make_speculator(target)
    assert speculator.derive() == dataclasses.replace(
        target, name=speculator.name, pipeline_model=FusedPipeline
    )


def test_derive_applies_every_set_field_and_inherits_the_rest() -> None:
    target = make_target()
    speculator = make_speculator(
        target,
        batching=DraftBatching,
        weight_adapters={WeightsFormat.SAFETENSORS: rename_draft},
        example_repo_ids=["toy/draft"],
        supports_device_graph_capture=False,
        config=DraftConfig,
        memory_planner=DraftMemoryPlanner,
        checkpoint_draft_width=width_from_checkpoint,
        supports_spec_decode_mixed_batches=True,
    )
    derived = speculator.derive()
    assert derived == dataclasses.replace(
        target,
        name=speculator.name,
        pipeline_model=FusedPipeline,
        batching=DraftBatching,
        weight_adapters={WeightsFormat.SAFETENSORS: rename_draft},
        example_repo_ids=["toy/draft"],
        supports_device_graph_capture=False,
        config=DraftConfig,
        memory_planner=DraftMemoryPlanner,
        checkpoint_draft_width=width_from_checkpoint,
        supports_spec_decode_mixed_batches=True,
    )
    # Spelled out: what a speculator cannot name comes from its target.
    assert derived.tokenizer is target.tokenizer
    assert derived.supported_encodings == {"f32", "q8_0"}
    assert derived.default_encoding == "f32"
    assert (derived.reasoning_parser, derived.tool_parser) == ("deepseek_r1", "hermes")
    assert derived.required_arguments == {"enable_prefix_caching": False}
    assert derived.cascade_pipeline_factory is target.cascade_pipeline_factory


def test_derive_copies_weight_adapters_into_a_dict_and_leaves_the_base_untouched() -> None:
    target = make_target()
    adapters = MappingProxyType({WeightsFormat.SAFETENSORS: rename_draft})
    derived = make_speculator(target, weight_adapters=adapters).derive()
    assert type(derived.weight_adapters) is dict
    assert derived.weight_adapters == {WeightsFormat.SAFETENSORS: rename_draft}
    assert target.weight_adapters == {WeightsFormat.GGUF: rename_gguf}
    assert target.name == "ToyForCausalLM"
    assert target.pipeline_model is TargetPipeline


def test_derive_overrides_with_false_but_inherits_none() -> None:
    target = make_target(supports_device_graph_capture=True, supports_spec_decode_mixed_batches=True)
    assert make_speculator(target).derive().supports_device_graph_capture is True
    overridden = make_speculator(
        target, supports_device_graph_capture=False, supports_spec_decode_mixed_batches=False
    ).derive()
    assert overridden.supports_device_graph_capture is False
    assert overridden.supports_spec_decode_mixed_batches is False


def test_opt_out_cascade_clears_the_cascade_factory() -> None:
    target = make_target()
    assert make_speculator(target, opt_out_cascade=True).derive().cascade_pipeline_factory is None
    assert make_speculator(target, opt_out_cascade=False).derive().cascade_pipeline_factory is not None


def test_speculator_is_frozen() -> None:
    speculator = make_speculator(make_target())
    with pytest.raises(dataclasses.FrozenInstanceError):
        speculator.method = "mtp"


# --- registration ---


def test_speculators_are_indexed_by_target_and_never_by_name() -> None:
    lookup = ArchLookup()
    target = make_target()
    speculator = make_speculator(target)
    lookup.register(target)
    lookup.register(speculator)
    assert lookup.speculators_for(target.name) == [speculator]
    assert lookup.find(speculator.name) is None
    assert lookup.speculators_for("OtherForCausalLM") == []


def test_speculators_are_deduplicated_by_identity() -> None:
    lookup = ArchLookup()
    target = make_target()
    speculator = make_speculator(target)
    lookup.register(speculator)
    lookup.register(speculator)
    twin = dataclasses.replace(speculator)
    assert twin == speculator
    lookup.register(twin)
    registered = lookup.speculators_for(target.name)
    assert len(registered) == 2
    assert registered[0] is speculator
    assert registered[1] is twin


def test_duplicate_architecture_raises_unless_overridden() -> None:
    lookup = ArchLookup()
    original, replacement = make_target(), make_target()
    lookup.register(original)
    with pytest.raises(
        ConfigError, match="'ToyForCausalLM' is already registered for task 'text_generation'"
    ):
        lookup.register(replacement)
    assert lookup.find("ToyForCausalLM") is original
    lookup.register(replacement, allow_override=True)
    assert lookup.find("ToyForCausalLM") is replacement
    assert lookup.find("ToyForCausalLM", task="text_generation") is replacement


def test_same_name_for_another_task_is_kept_alongside() -> None:
    lookup = ArchLookup()
    generator = make_target()
    embedder = make_target(task="embeddings_generation")
    lookup.register(generator)
    lookup.register(embedder)
    assert lookup.find("ToyForCausalLM") is generator
    assert lookup.find("ToyForCausalLM", task="text_generation") is generator
    assert lookup.find("ToyForCausalLM", task="embeddings_generation") is embedder
    assert lookup.find("ToyForCausalLM", task="reranking") is None


def test_register_rejects_other_objects() -> None:
    with pytest.raises(TypeError, match="Expected a SupportedArchitecture or a Speculator"):
        ArchLookup().register("ToyForCausalLM")


# --- lazy registration ---

LAZY_MODULE = """\
from spec_rs.registry import Speculator, SupportedArchitecture

class Pipeline:
    pass

TARGET = SupportedArchitecture(name="LazyForCausalLM", pipeline_model=Pipeline)
SPECULATOR = Speculator(
    name="UnifiedLazy", base=TARGET, draft_arch="LazyDraft", method="dflash", pipeline_model=Pipeline
)
"""


@pytest.fixture
def lazy_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, isolated_imports: None) -> str:
    (tmp_path / "lazy_toy_arch.py").write_text(LAZY_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "lazy_toy_arch"


def test_lazy_architecture_is_imported_on_first_lookup(lazy_module: str) -> None:
    lookup = ArchLookup()
    lookup.register_lazy("LazyForCausalLM", lazy_module, "TARGET")
    assert lazy_module not in sys.modules
    found = lookup.find("LazyForCausalLM")
    assert found is sys.modules[lazy_module].TARGET
    assert lookup.find("LazyForCausalLM") is found


def test_lazy_speculator_is_imported_by_speculators_for(lazy_module: str) -> None:
    lookup = ArchLookup()
    lookup.register_lazy("UnifiedLazy", lazy_module, "SPECULATOR", speculates_on="LazyForCausalLM")
    assert lookup.find("UnifiedLazy") is None
    assert lazy_module not in sys.modules
    assert lookup.speculators_for("LazyForCausalLM") == [sys.modules[lazy_module].SPECULATOR]
    assert lookup.find("LazyForCausalLM") is None


def test_relative_lazy_registration_resolves_against_its_package() -> None:
    lookup = ArchLookup()
    lookup.register_lazy("LlamaForCausalLM", ".architectures", "LlamaForCausalLM", package="spec_rs")
    assert lookup.find("LlamaForCausalLM") is architectures.BUILTIN_ARCHITECTURES["LlamaForCausalLM"]


def test_eagerly_registered_architecture_wins_over_a_lazy_one(lazy_module: str) -> None:
    lookup = ArchLookup()
    lookup.register_lazy("LazyForCausalLM", lazy_module, "TARGET")
    custom = make_target("LazyForCausalLM")
    lookup.register(custom)
    assert lookup.find("LazyForCausalLM") is custom


def test_eagerly_registered_custom_architecture_wins_over_the_builtin() -> None:
    lookup = ArchLookup.with_builtins()
    custom = make_target("LlamaForCausalLM")
    lookup.register(custom)
    assert lookup.find("LlamaForCausalLM") is custom
    assert (
        ArchLookup.with_builtins().find("LlamaForCausalLM")
        is architectures.BUILTIN_ARCHITECTURES["LlamaForCausalLM"]
    )


def test_materialised_builtin_then_counts_as_registered() -> None:
    lookup = ArchLookup.with_builtins()
    assert lookup.find("Qwen3ForCausalLM") is not None
    with pytest.raises(ConfigError, match="already registered"):
        lookup.register(make_target("Qwen3ForCausalLM"))


# --- selection (the rule is specrs_core::registry::select_speculator) ---


@pytest.fixture
def declared() -> tuple[ArchLookup, list[Speculator]]:
    lookup = ArchLookup()
    target = make_target("T")
    speculators = [
        make_speculator(target, "eagle", "EagleDraft"),
        make_speculator(target, "dflash", "DFlashDraft"),
        make_speculator(target, "mtp", None),
        make_speculator(target, "eagle", "EagleDraft", example_repo_ids=["declared/later"]),
    ]
    for speculator in speculators:
        lookup.register(speculator)
    return lookup, speculators


@pytest.mark.parametrize(
    ("method", "draft_arch", "index"),
    [("eagle", "EagleDraft", 0), ("dflash", "DFlashDraft", 1), ("mtp", None, 2)],
)
def test_selection_matches_method_and_draft_architecture(
    declared: tuple[ArchLookup, list[Speculator]], method: str, draft_arch: str | None, index: int
) -> None:
    lookup, speculators = declared
    assert lookup.select_speculator("T", method, draft_arch) is speculators[index]


@pytest.mark.parametrize(
    ("method", "draft_arch"),
    [
        ("eagle", "DFlashDraft"),
        ("dflash", "EagleDraft"),
        ("mtp", "EagleDraft"),
        ("eagle", None),
        ("dspark", None),
    ],
)
def test_selection_fails_when_either_half_does_not_match(
    declared: tuple[ArchLookup, list[Speculator]], method: str, draft_arch: str | None
) -> None:
    lookup, _ = declared
    expected = (
        f"No speculator for T runs '{method}' with draft architecture '{draft_arch}'. "
        "Declared: eagle+EagleDraft, dflash+DFlashDraft, mtp+None, eagle+EagleDraft"
    )
    with pytest.raises(SpeculatorSelectionError) as excinfo:
        lookup.select_speculator("T", method, draft_arch)
    assert str(excinfo.value) == expected
    assert isinstance(excinfo.value, ValueError)


def test_selection_returns_none_when_the_target_declares_no_speculators() -> None:
    lookup = ArchLookup()
    lookup.register(make_target("T"))
    assert lookup.select_speculator("T", "eagle", "EagleDraft") is None
    assert lookup.select_speculator("Unknown", "eagle", None) is None


def test_select_speculator_binding_returns_the_index_or_none() -> None:
    assert _spec_rs.select_speculator("T", "mtp", None, [("eagle", "E"), ("mtp", None)]) == 1
    assert _spec_rs.select_speculator("T", "mtp", None, []) is None


@pytest.mark.parametrize(
    ("method", "draft_arch", "has_draft_vocab", "canonical"),
    [
        ("eagle", "LlamaForCausalLM", False, "LlamaForCausalLMEagle"),
        ("eagle", "LlamaForCausalLM", True, "LlamaForCausalLMEagle3"),
        ("eagle", "Eagle3DraftModel", True, "Eagle3DraftModel"),
        ("dflash", "LlamaForCausalLM", False, "LlamaForCausalLM"),
    ],
)
def test_canonical_draft_arch_rewrites_only_eagle_llama_drafts(
    method: str, draft_arch: str, has_draft_vocab: bool, canonical: str
) -> None:
    assert _spec_rs.canonical_draft_arch(method, draft_arch, has_draft_vocab) == canonical


def test_canonical_draft_arch_rejects_an_unknown_method() -> None:
    with pytest.raises(ConfigError, match="unknown speculative_method 'medusa'"):
        _spec_rs.canonical_draft_arch("medusa", "LlamaForCausalLM", False)


# --- custom architecture modules ---

CUSTOM_MODULE = """\
from spec_rs.registry import Speculator, SupportedArchitecture

class Pipeline:
    pass

TARGET = SupportedArchitecture(name="{name}", pipeline_model=Pipeline)
ARCHITECTURES = [
    TARGET,
    Speculator(name="Unified{name}", base=TARGET, draft_arch=None, method="ngram", pipeline_model=Pipeline),
]
"""


def assert_custom_module_registered(lookup: ArchLookup, name: str, loaded: list[Any]) -> None:
    target, speculator = loaded
    assert lookup.find(name) is target
    assert lookup.speculators_for(name) == [speculator]
    assert lookup.select_speculator(name, "ngram", None) is speculator


def test_custom_architectures_load_from_a_python_file(tmp_path: Path, isolated_imports: None) -> None:
    path = tmp_path / "my_arch.py"
    path.write_text(CUSTOM_MODULE.format(name="FileForCausalLM"))
    lookup = ArchLookup()
    assert_custom_module_registered(lookup, "FileForCausalLM", lookup.load_custom_architectures(path))


def test_custom_architectures_load_from_dir_and_module(tmp_path: Path, isolated_imports: None) -> None:
    package = tmp_path / "toy_models"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "archs.py").write_text(CUSTOM_MODULE.format(name="DirForCausalLM"))
    lookup = ArchLookup()
    loaded = lookup.load_custom_architectures(f"{tmp_path}:toy_models.archs")
    assert_custom_module_registered(lookup, "DirForCausalLM", loaded)
    assert str(tmp_path) in sys.path


def test_missing_custom_architectures_file_is_reported(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"Custom architectures file '.*absent\.py' does not exist"):
        ArchLookup().load_custom_architectures(tmp_path / "absent.py")


def test_missing_custom_architectures_directory_is_reported(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"Custom architectures directory '.*absent' does not exist"):
        ArchLookup().load_custom_architectures(f"{tmp_path / 'absent'}:archs")


def test_missing_custom_architectures_module_is_reported(tmp_path: Path, isolated_imports: None) -> None:
    with pytest.raises(
        ModuleNotFoundError, match="No module 'absent_archs' in custom architectures directory"
    ):
        ArchLookup().load_custom_architectures(f"{tmp_path}:absent_archs")


def test_a_missing_dependency_of_the_custom_module_keeps_its_own_error(
    tmp_path: Path, isolated_imports: None
) -> None:
    (tmp_path / "needs_dependency.py").write_text("import absent_dependency_of_archs\n")
    with pytest.raises(ModuleNotFoundError) as excinfo:
        ArchLookup().load_custom_architectures(f"{tmp_path}:needs_dependency")
    assert excinfo.value.name == "absent_dependency_of_archs"


def test_custom_module_without_architectures_is_reported(tmp_path: Path, isolated_imports: None) -> None:
    path = tmp_path / "no_list.py"
    path.write_text("TARGETS = []\n")
    with pytest.raises(ConfigError, match="has no ARCHITECTURES list"):
        ArchLookup().load_custom_architectures(path)


def test_custom_architectures_spec_must_be_a_file_or_dir_and_module() -> None:
    with pytest.raises(ConfigError, match=r"expected a path to a \.py file or 'dir:module'"):
        ArchLookup().load_custom_architectures("archs")


def test_custom_module_that_fails_to_import_is_not_left_half_loaded(tmp_path: Path) -> None:
    path = tmp_path / "broken_archs.py"
    path.write_text("raise RuntimeError('broken declaration')\n")
    with pytest.raises(RuntimeError, match="broken declaration"):
        ArchLookup().load_custom_architectures(path)
    assert not any(name.endswith("broken_archs") for name in sys.modules)


# --- the built-ins ---

DRAFT_ARCH_BY_METHOD = {
    "eagle": "LlamaForCausalLMEagle3",
    "mtp": "MTPDraftModel",
    "dflash": "DFlashDraftModel",
    "dflash2": "DFlash2DraftModel",
    "dspark": "DSparkDraftModel",
    "ngram": None,
    "suffix": None,
}
PIPELINE_BY_METHOD = {
    "eagle": "EaglePipeline",
    "mtp": "MtpPipeline",
    "dflash": "DFlashPipeline",
    "dflash2": "DFlash2Pipeline",
    "dspark": "DSparkPipeline",
    "ngram": "NgramPipeline",
    "suffix": "SuffixPipeline",
}


def pipeline_class_name(pipeline: type) -> str:
    return getattr(pipeline, "pipeline_class_name", pipeline.__name__)


@pytest.mark.parametrize(
    "target",
    [
        "LlamaForCausalLM",
        "MistralForCausalLM",
        "Qwen3ForCausalLM",
        "Qwen3MoeForCausalLM",
        "Qwen2MoeForCausalLM",
        "MixtralForCausalLM",
        "Glm4ForCausalLM",
        "Olmo2ForCausalLM",
        "Olmo3ForCausalLM",
        "Exaone4ForCausalLM",
        "HunYuanDenseV1ForCausalLM",
        "HunYuanMoEV1ForCausalLM",
        "SmolLM3ForCausalLM",
        "Glm4MoeForCausalLM",
        "Dots1ForCausalLM",
        "OlmoeForCausalLM",
        "SeedOssForCausalLM",
        "Ernie4_5ForCausalLM",
        "Ernie4_5_MoeForCausalLM",
        "GraniteMoeForCausalLM",
        "GraniteMoeSharedForCausalLM",
        "GraniteMoeHybridForCausalLM",
        "CohereForCausalLM",
        "Cohere2ForCausalLM",
        "DeepseekV2ForCausalLM",
        "DeepseekV3ForCausalLM",
        "Glm4MoeLiteForCausalLM",
        "MiniMaxM2ForCausalLM",
        "InternLM2ForCausalLM",
        "GptOssForCausalLM",
        "GemmaForCausalLM",
        "Gemma2ForCausalLM",
        "Gemma3ForCausalLM",
        "Gemma3ForConditionalGeneration",
        "Mistral3ForConditionalGeneration",
        "Qwen2VLForConditionalGeneration",
        "Qwen2_5_VLForConditionalGeneration",
        "Qwen3VLForConditionalGeneration",
        "Qwen3VLMoeForConditionalGeneration",
        "Llama4ForConditionalGeneration",
        "Llama4ForCausalLM",
        "GraniteForCausalLM",
        "ArceeForCausalLM",
        "ApertusForCausalLM",
        "Starcoder2ForCausalLM",
        "StableLmForCausalLM",
        "PhiForCausalLM",
        "PhimoeForCausalLM",
        "OlmoForCausalLM",
        "NemotronForCausalLM",
        "GPTNeoXForCausalLM",
        "FalconForCausalLM",
        "GPTBigCodeForCausalLM",
        "GPT2LMHeadModel",
        "BloomForCausalLM",
        "MptForCausalLM",
        "MPTForCausalLM",
        "BaichuanForCausalLM",
        "BaiChuanForCausalLM",
        "GlmForCausalLM",
        "ChatGLMModel",
        "ChatGLMForConditionalGeneration",
        "Phi3ForCausalLM",
    ],
)
@pytest.mark.parametrize("method", sorted(DRAFT_ARCH_BY_METHOD))
def test_builtins_run_every_method_on_every_target_family(target: str, method: str) -> None:
    speculator = ARCH_LOOKUP.select_speculator(target, method, DRAFT_ARCH_BY_METHOD[method])
    assert speculator is not None
    assert (speculator.method, speculator.draft_arch) == (method, DRAFT_ARCH_BY_METHOD[method])
    assert speculator.base is ARCH_LOOKUP.find(target)
    assert pipeline_class_name(speculator.pipeline_model) == PIPELINE_BY_METHOD[method]
    derived = speculator.derive()
    assert derived.name == speculator.name
    assert derived.default_weights_format is WeightsFormat.SAFETENSORS


def test_builtins_reject_a_mismatched_method_and_draft() -> None:
    with pytest.raises(SpeculatorSelectionError) as excinfo:
        ARCH_LOOKUP.select_speculator("Qwen3ForCausalLM", "eagle", "DFlashDraftModel")
    declared = ", ".join(
        f"{s.method}+{s.draft_arch}" for s in ARCH_LOOKUP.speculators_for("Qwen3ForCausalLM")
    )
    assert str(excinfo.value) == (
        "No speculator for Qwen3ForCausalLM runs 'eagle' with draft architecture 'DFlashDraftModel'. "
        f"Declared: {declared}"
    )
    assert "eagle+LlamaForCausalLMEagle3" in declared
    assert "dflash+DFlashDraftModel" in declared


def test_builtins_mirror_the_rust_tables() -> None:
    lookup = ArchLookup.with_builtins()
    for row in _spec_rs.builtin_architectures():
        target = lookup.find(row["name"])
        assert target is not None
        assert target.example_repo_ids == row["example_repo_ids"]
        assert pipeline_class_name(target.pipeline_model) == row["pipeline"] == "PlainPipeline"
        declared = [(s.name, s.method, s.draft_arch) for s in lookup.speculators_for(row["name"])]
        rows = [
            (s["name"], s["method"], s["draft_arch"])
            for s in _spec_rs.builtin_speculators()
            if s["base"] == row["name"]
        ]
        assert declared == rows


def test_builtin_block_drafters_take_their_width_from_the_rust_reader(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def reader(config: Any, target_hf_config: Any, draft_hf_config: Any) -> int:
        return 16

    monkeypatch.setattr(_spec_rs, "checkpoint_draft_width", reader, raising=False)
    speculators = architectures.declare_speculators(architectures.declare_architectures())
    widths = {s.method: s.checkpoint_draft_width for s in speculators.values()}
    assert widths == {
        "dflash": reader,
        "dflash2": reader,
        "dspark": reader,
        "eagle": None,
        "mtp": None,
        "ngram": None,
        "suffix": None,
    }


def test_pipeline_class_is_the_extension_class_when_built(monkeypatch: pytest.MonkeyPatch) -> None:
    class EaglePipeline:
        pass

    monkeypatch.setattr(_spec_rs, "EaglePipeline", EaglePipeline, raising=False)
    assert architectures.pipeline_class("EaglePipeline") is EaglePipeline


def test_every_builtin_pipeline_is_a_rust_pipeline_class() -> None:
    for spec in architectures.declare_speculators(architectures.declare_architectures()).values():
        assert issubclass(spec.pipeline_model, _spec_rs.Pipeline), spec.name
    for arch in architectures.declare_architectures().values():
        assert arch.pipeline_model is _spec_rs.PlainPipeline


def test_weights_format_values() -> None:
    assert WeightsFormat("gguf") is WeightsFormat.GGUF
    assert WeightsFormat.SAFETENSORS == "safetensors"
    with pytest.raises(ValueError, match="'pt'"):
        WeightsFormat("pt")


# --- what build_pipeline takes from the architecture ---


class RecordingPipeline:
    """Stands in for a pipeline class: keeps the engine arguments it was built with."""

    built: ClassVar[list[dict[str, Any]]] = []

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        RecordingPipeline.built.append(kwargs)


def recording_lookup(**fields: Any) -> ArchLookup:
    lookup = ArchLookup()
    lookup.register(
        SupportedArchitecture(name="LlamaForCausalLM", pipeline_model=RecordingPipeline, **fields)
    )
    return lookup


def test_an_architectures_encodings_and_required_arguments_shape_the_engine_it_builds() -> None:
    lookup = recording_lookup(
        supported_encodings={"f32", "q8_0"},
        default_encoding="f32",
        required_arguments={"enable_prefix_caching": False, "max_num_seqs": 4},
    )
    plain = SpeculativeConfig()
    build_pipeline(speculative_config=plain, arch_lookup=lookup)
    built = RecordingPipeline.built[-1]
    assert built["dtype"] == "f32", "no dtype (or auto) takes the default encoding"
    assert (built["enable_prefix_caching"], built["max_num_seqs"]) == (False, 4), "required arguments win"
    for spelling in ("q8_0", "Q8_0", "q8"):
        build_pipeline(speculative_config=plain, arch_lookup=lookup, dtype=spelling)
        assert RecordingPipeline.built[-1]["dtype"] == "q8_0", spelling
    build_pipeline(speculative_config=plain, arch_lookup=lookup, dtype="float32")
    assert RecordingPipeline.built[-1]["dtype"] == "f32", "the engine's spellings all name its dtypes"
    with pytest.raises(ConfigError, match="does not run dtype='q4_0'") as excinfo:
        build_pipeline(speculative_config=plain, arch_lookup=lookup, dtype="q4_0")
    assert excinfo.value.field == "dtype"
    with pytest.raises(ConfigError, match="requires arguments the engine does not take: warp_speed"):
        build_pipeline(
            speculative_config=plain, arch_lookup=recording_lookup(required_arguments={"warp_speed": 9})
        )
