"""The recipe as objects: `Recipe` (targets, shared dims, sample inputs) and `Target` (one named export), built
from a validated document.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from hfexport.errors import UnknownTargetError
from hfexport.formats import format_traits as _backend
from hfexport.recipe.validation import parse_recipe_text, sha256_of, validate_document


@dataclass
class Target:
    """One named export of a recipe, in full form (see the schema's `target`)."""

    name: str
    export_format: str
    mode: str = "forward"
    options: dict = field(default_factory=dict)
    dynamic_shapes: dict | None = None
    generation: dict = field(default_factory=dict)
    components: dict = field(default_factory=dict)
    parity: dict = field(default_factory=dict)
    quantization: dict | None = None
    dtype: str | None = None  # "float16": the ONNX graph converted when saved (hfexport.formats.onnx.float16); None: the model's
    description: str | None = None
    runtime: dict = field(default_factory=dict)
    path: str | None = None  # where the publication puts it (hfexport.layout); not part of what is exported
    file_name: str | None = None  # the artifact's name there (hfexport.layout); not part of what is exported either
    rebind: bool = True  # a weights-only update may be rebound into the previous export's graphs (hfexport.rebind)
    variants: list = field(default_factory=list)  # published beside it, made from its files (hfexport.quantization.variants)

    @property
    def single_graph(self) -> bool:
        """A generation target exported as its multi-token decode alone (`generation.single_graph`): one graph. An
        ONNX or OpenVINO generation target that says nothing of its layout is one by default
        (`single_graph_by_default`)."""
        if self.mode != "generation":
            return False
        if "single_graph" in self.generation:
            return bool(self.generation["single_graph"])
        return self.single_graph_by_default

    @property
    def single_graph_by_default(self) -> bool:
        """An ONNX or OpenVINO generation target without `single_graph`, `multi_token_decode` or a static cache: the
        ONNX runtimes' contract is one decoder graph (`hfexport.formats.onnx.decoder_contract`), OpenVINO GenAI's and optimum-intel's
        one stateful decode graph (`hfexport.formats.openvino.genai_layout`), so a decoder-only model exports as one; the plan falls
        back to a prefill/decode pair where the model has none (encoder-decoders, VLMs, Mamba)."""
        generation = self.generation
        return self.mode == "generation" and _backend(self.export_format).one_decoder_graph and \
            "single_graph" not in generation and "multi_token_decode" not in generation and \
            generation.get("cache_implementation", "dynamic") == "dynamic"

    @property
    def llm_runner_by_default(self) -> bool:
        """An ExecuTorch generation target without `single_graph`, `multi_token_decode` or `cache_implementation`:
        ExecuTorch's LLM runner contract (one program that holds its cache, `hfexport.formats.executorch.llm_program`) for a
        decoder-only text model; the plan falls back to the engine's prefill/decode pair where the model has none
        (encoder-decoders, VLMs, Mamba). `single_graph: false` keeps the pair too."""
        generation = self.generation
        return self.mode == "generation" and _backend(self.export_format).llm_program and \
            "single_graph" not in generation and "multi_token_decode" not in generation and \
            "cache_implementation" not in generation and not self.quantization

    @classmethod
    def from_dict(cls, name: str, data: dict) -> Target:
        return cls(
            name=name,
            export_format=data["export_format"],
            mode=data.get("mode", "forward"),
            options=copy.deepcopy(data.get("options", {})),
            dynamic_shapes=copy.deepcopy(data.get("dynamic_shapes")),
            generation=copy.deepcopy(data.get("generation", {})),
            components=copy.deepcopy(data.get("components", {})),
            parity=copy.deepcopy(data.get("parity", {})),
            quantization=copy.deepcopy(data.get("quantization")),
            dtype=data.get("dtype"),
            description=data.get("description"),
            runtime=copy.deepcopy(data.get("runtime", {})),
            path=data.get("path"),
            file_name=data.get("file_name"),
            rebind=data.get("rebind", True),
            variants=copy.deepcopy(data.get("variants", [])),
        )

    def to_dict(self) -> dict:
        """The target as the recipe would write it (empty sections left out)."""
        data: dict[str, Any] = {"export_format": self.export_format, "mode": self.mode}
        for key in ("description", "options", "generation", "dynamic_shapes", "components", "parity", "quantization",
                    "dtype", "runtime", "path", "file_name", "variants"):
            value = getattr(self, key)
            if value not in (None, {}, []):
                data[key] = copy.deepcopy(value)
        if not self.rebind:
            data["rebind"] = False
        return data


@dataclass
class Recipe:
    """A validated recipe in full form, and where it came from."""

    data: dict
    source: str | None = None
    document: Any = None  # as published (flat or full)

    @property
    def targets(self) -> dict[str, Target]:
        return {name: Target.from_dict(name, data) for name, data in self.data["targets"].items()}

    @property
    def target_names(self) -> list[str]:
        return list(self.data["targets"])

    @property
    def dims(self) -> dict[str, dict]:
        return self.data.get("dims", {})

    @property
    def sample_inputs(self) -> dict:
        return self.data.get("sample_inputs", {})

    @property
    def task(self) -> str | None:
        return self.data.get("task")

    @property
    def model_class(self) -> str | None:
        return self.data.get("model_class")

    @property
    def default_target(self) -> str:
        return self.data.get("default_target") or self.target_names[0]

    @property
    def sha256(self) -> str:
        return sha256_of(self.data)

    def target(self, name: str | None = None) -> Target:
        """The named target (the default one when `name` is None), or a `RecipeError` listing the targets."""
        name = name or self.default_target
        if name not in self.data["targets"]:
            raise UnknownTargetError(
                f"no target {name!r} in the recipe {self.source or ''}; its targets: {', '.join(self.target_names)}"
            )
        return Target.from_dict(name, self.data["targets"][name])

    def with_target_overrides(self, name: str, **options) -> Recipe:
        """A copy whose target `name` has extra engine options (revalidated)."""
        data = copy.deepcopy(self.data)
        data["targets"][name].setdefault("options", {}).update(options)
        return Recipe(validate_document(data, self.source), self.source, self.document)

    def standalone(self, name: str) -> dict:
        """A one-target recipe (dims, sample inputs and task kept) that reproduces target `name` on its own."""
        data = {key: copy.deepcopy(value) for key, value in self.data.items() if key not in ("targets", "default_target")}
        data["targets"] = {name: copy.deepcopy(self.data["targets"][name])}
        data["default_target"] = name
        data.setdefault("recipe_version", 1)
        return data

    def target_hash(self, name: str) -> str:
        """The canonical hash of everything that decides target `name`'s export (its standalone recipe; the `path` and
        `file_name` it is published under do not change the export, so moving or renaming a target re-uses its
        cache)."""
        data = self.standalone(name)
        data["targets"][name].pop("path", None)
        data["targets"][name].pop("file_name", None)
        return sha256_of(data)


# ── Sources ──────────────────────────────────────────────────────────────────


def recipe_from_document(document: Any, source: str | None = None) -> Recipe:
    return Recipe(validate_document(document, source), source, document)


def recipe_from_text(text: str | bytes, source: str | None = None) -> Recipe:
    return recipe_from_document(parse_recipe_text(text, source), source)
