"""Export recipes: read, validate (JSON Schema + semantic checks) and normalise them to one full form.

A recipe is pure data. It is read from a JSON file, a model folder (`export_config.json`, else the
`export_config` field of `config.json`) or a Hub repo (only those two small files are downloaded), validated
against `schemas/export_config.schema.json`, then checked for what a schema cannot say (dim references, bounds,
options per format, default target). Every problem is reported with its JSON path in one `RecipeError`.
"""

from __future__ import annotations

import copy
import difflib
import hashlib
import json
import re
from typing import Any

from hfexport import strict_json
from hfexport.errors import Problem, RecipeError
from hfexport.formats import find_format, format_traits, formats
from hfexport.layout import LayoutError, canonical_format, check_file_name
from hfexport.quantization.shapes import group_size_problems, variant_group_size_problems
from hfexport.quantization.spec import METHOD_FORMATS, section_problems
from hfexport.quantization.variants import variant_problems
from hfexport.schema import schema_validator, load_schema

MAX_RECIPE_BYTES = 1 << 20
MAX_DEPTH = 32  # the deepest legitimate path (a component's per-tensor axis) is 9 levels
MODES = ("forward", "generation")
AXIS_KEYWORDS = ("static", "auto", "dynamic")
_LINEAR = re.compile(r"^\s*(?:(\d+)\s*\*\s*)?([A-Za-z_]\w*)\s*(?:([+-])\s*(\d+)\s*)?$")


# Engine config fields per built-in format (transformers.exporters.configs: each format's `options`), minus what the
# recipe sets elsewhere. A test checks this table against the engine's dataclasses so a new engine field is noticed.
# Validation asks the registry (`hfexport.formats`) itself, so a format registered later is checked the same way.
FORMAT_OPTIONS = {backend.name: backend.options for backend in formats()}


# Which quantization method runs on which format (the engine's quantizers; see docs/quantization.md).
QUANTIZATION_FORMATS = METHOD_FORMATS


def json_path(parts) -> str:
    """`targets.onnx-cpu.dynamic_shapes.input_ids.1` from a sequence of keys and indices; `$` when empty."""
    return ".".join(str(part) for part in parts) or "$"


def canonical_json(value: Any) -> str:
    """Sorted, compact JSON: the form hashed for provenance and cache keys."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def sha256_of(value: Any) -> str:
    return hashlib.sha256(canonical_json(value).encode("utf-8")).hexdigest()


# ── Parsing ──────────────────────────────────────────────────────────────────


def parse_recipe_text(text: str | bytes, source: str | None = None) -> Any:
    """Parse JSON strictly: no NaN/Infinity, no duplicate keys, bounded size and depth."""
    if isinstance(text, bytes):
        if len(text) > MAX_RECIPE_BYTES:
            raise RecipeError(Problem("$", f"recipe is {len(text)} bytes; at most {MAX_RECIPE_BYTES} are read"), source)
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as error:
            raise RecipeError(Problem("$", f"not UTF-8 text ({error.reason} at byte {error.start})"), source) from None
    if len(text) > MAX_RECIPE_BYTES:
        raise RecipeError(Problem("$", f"recipe is {len(text)} characters; at most {MAX_RECIPE_BYTES} are read"), source)
    if not text.strip():
        raise RecipeError(Problem("$", "empty document; expected a JSON object"), source)
    try:
        return strict_json.loads(text)
    except strict_json.DuplicateKeyError as error:
        raise RecipeError(Problem("$", f"duplicate key {error.key!r}: each name may appear once"), source) from None
    except json.JSONDecodeError as error:
        raise RecipeError(
            Problem("$", f"not valid JSON: {error.msg} (line {error.lineno}, column {error.colno})"), source
        ) from None
    except (ValueError, RecursionError) as error:
        message = "nested too deeply" if isinstance(error, RecursionError) else str(error)
        raise RecipeError(Problem("$", f"not valid JSON: {message}"), source) from None


# ── Schema and semantic validation ───────────────────────────────────────────


def _deepest(error):
    """For a oneOf/anyOf failure, the sub-error that got furthest into the instance (the most precise one)."""
    while error.validator in ("oneOf", "anyOf") and error.context:
        deeper = max(error.context, key=lambda sub: len(sub.absolute_path))
        if len(deeper.absolute_path) <= len(error.absolute_path):
            # Same depth: a bad key ("batch" where an axis index goes) says more than "not valid".
            named = [sub for sub in error.context if "propertyNames" in sub.schema_path]
            return named[0] if named else error
        error = deeper
    return error


def _schema_problem(error) -> Problem:
    error = _deepest(error)
    path = list(error.absolute_path)
    validator, value = error.validator, error.instance
    if "propertyNames" in error.schema_path and validator == "pattern" and isinstance(value, str):
        pattern = error.schema["pattern"]
        what = "an axis index (\"0\", \"1\", ...)" if pattern.startswith("^(0|") else f"a name matching {pattern}"
        return Problem(json_path(path), f"invalid key {value!r}; expected {what}")
    if validator == "additionalProperties":
        allowed = sorted(error.schema.get("properties", {}))
        extra = sorted(set(value) - set(error.schema.get("properties", {})))
        key = extra[0] if extra else "?"
        expected = f"; expected one of: {', '.join(allowed)}" if allowed else ""
        return Problem(json_path([*path, key]), f"unknown key {key!r}{expected}")
    if validator == "required":
        return Problem(json_path(path), error.message.replace("is a required property", "is required"))
    if validator in ("oneOf", "anyOf") and "description" in error.schema:
        return Problem(json_path(path), f"{_short(value)} is not valid; expected {error.schema['description'][0].lower()}{error.schema['description'][1:]}")
    if validator == "propertyNames":
        pattern = error.schema["propertyNames"].get("pattern") or load_schema()["$defs"]["dim_name"]["pattern"]
        bad = [name for name in value if not re.fullmatch(pattern, name)]
        what = "an axis index (\"0\", \"1\", ...)" if pattern.startswith("^(0|") else f"a name matching {pattern}"
        return Problem(json_path(path), f"invalid key {bad[0]!r}; expected {what}" if bad else error.message)
    if validator == "enum" and isinstance(value, str):
        choices = [str(choice) for choice in error.validator_value]
        alias = canonical_format(value)
        close = ([alias] if alias in choices and alias != value else []) or difflib.get_close_matches(
            value, choices, n=1, cutoff=0.6) or difflib.get_close_matches(value.lower(), choices, n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        return Problem(json_path(path), f"{value!r} is not one of {', '.join(choices)}{hint}")
    if validator == "pattern" and isinstance(value, str) and "." in value and path and path[-1] == "model_class":
        return Problem(json_path(path), f"{value!r} is a dotted path; a recipe names a transformers class, never code")
    return Problem(json_path(path), _short_message(error.message))


# What a model's config.json says its inputs admit: (config keys, the inputs and axes they bound, what it is).
_SEQUENCE_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length")
_SEQUENCE_AXES = {"input_ids": "1", "attention_mask": "1", "token_type_ids": "1", "position_ids": "1",
                  "decoder_input_ids": "1", "inputs_embeds": "1"}
_IMAGE_AXES = {"pixel_values": ("2", "3")}


def _config_value(config: dict, keys: tuple[str, ...], nested: str) -> tuple[str, int] | None:
    for holder in (config, config.get(nested) if isinstance(config.get(nested), dict) else None):
        for key in keys:
            value = (holder or {}).get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return (key if holder is config else f"{nested}.{key}"), value
    return None


def _dims_on(document: dict, axes: dict) -> set[str]:
    """The names of `dims` that some target binds to one of `axes` (input name -> axis key or keys)."""
    names = set()
    for target in (document.get("targets") or {}).values():
        for tensor, spec in ((target or {}).get("dynamic_shapes") or {}).items():
            wanted = axes.get(tensor)
            if not isinstance(spec, dict) or wanted is None:
                continue
            for axis, value in spec.items():
                if axis in (wanted if isinstance(wanted, tuple) else (wanted,)) and isinstance(value, str):
                    names.add(re.split(r"[+\-*]", value)[0].strip())
    return names


def config_problems(document: dict, config: dict, config_source: str = "config.json") -> list[Problem]:
    """The recipe's `dims` against what the model's config admits: a sequence dim past `max_position_embeddings`
    (or its aliases), an image dim past `image_size`; and each target's quantization and variants against the model's
    layer shapes (a group size that does not divide a layer's input: `hfexport.quantization.shapes`). The schema cannot
    know these; the export would fail with the engine's "Constraints violated" (or run past the model's positions),
    or NNCF's `InvalidGroupSizeError` after the export, instead."""
    problems: list[Problem] = []
    dims = document.get("dims") if isinstance(document.get("dims"), dict) else {}
    checks = [(_dims_on(document, _SEQUENCE_AXES) | ({"seq"} & set(dims)),
               _config_value(config, _SEQUENCE_KEYS, "text_config"), "positions"),
              (_dims_on(document, _IMAGE_AXES), _config_value(config, ("image_size",), "vision_config"), "pixels")]
    for names, limit, what in checks:
        if limit is None:
            continue
        key, value = limit
        for name in sorted(names):
            bound = (dims.get(name) or {}).get("max") if isinstance(dims.get(name), dict) else None
            if isinstance(bound, int) and bound > value:
                problems.append(Problem(f"dims.{name}.max", f"{bound} is more than the model's {key} ({value} "
                                        f"{what}, {config_source}); at most {value}"))
    for name, target in (document.get("targets") or {}).items():
        if isinstance(target, dict) and isinstance(target.get("quantization"), dict):
            problems.extend(group_size_problems(target["quantization"], ["targets", name], config, config_source))
        if isinstance(target, dict) and isinstance(target.get("variants"), list):
            problems.extend(variant_group_size_problems(target, ["targets", name], config, config_source))
    return problems


def _short(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _short_message(message: str) -> str:
    return message if len(message) <= 300 else message[:297] + "..."


def _schema_problems(document: Any, invalid_paths: list | None = None) -> list[Problem]:
    """The schema's problems; `invalid_paths` collects where each one is in the document (as a key list)."""
    errors = sorted(schema_validator("export_config").iter_errors(document),
                    key=lambda e: list(map(str, e.absolute_path)))
    problems, seen = [], set()
    for error in errors:
        problem = _schema_problem(error)
        if invalid_paths is not None:
            invalid_paths.append(list(_deepest(error).absolute_path))
        if str(problem) not in seen:
            seen.add(str(problem))
            problems.append(problem)
    return problems


def _pruned(document: Any, paths: list[list]) -> Any:
    """A copy of `document` without the values at `paths` (where the schema found problems), so that the semantic
    checks can run on the rest. A path that is the whole document (or a target's export_format) prunes nothing
    useful: the caller then reports the schema's problems alone."""
    pruned = copy.deepcopy(document)
    for path in sorted(paths, key=len, reverse=True):
        if not path:
            return None
        node = pruned
        for key in path[:-1]:
            try:
                node = node[key]
            except (KeyError, IndexError, TypeError):
                node = None
                break
        if isinstance(node, dict):
            node.pop(path[-1], None)
        elif isinstance(node, list) and isinstance(path[-1], int) and path[-1] < len(node):
            node[path[-1]] = None
    return pruned


def _semantic_problems_despite(document: dict, invalid_paths: list[list]) -> list[Problem]:
    """The semantic problems of the parts of `document` the schema accepted: a recipe with both kinds gets both
    in one pass (a CI user used to fix the schema's problems, re-run, and only then see the others)."""
    pruned = _pruned(document, invalid_paths)
    if not isinstance(pruned, dict):
        return []
    try:
        full = normalize(pruned)
        problems = _semantic_problems(full)
    except Exception:  # noqa: BLE001 - what the schema rejected can break a semantic check; the schema said it
        return []
    return [_flat_path(problem, full) for problem in problems] if "targets" not in pruned else problems


def parse_axis(spec: Any) -> tuple[str, Any]:
    """Classify one axis spec: ("int", n) | ("keyword", "static"|"auto"|"dynamic") | ("dim", (name, scale, offset))."""
    if isinstance(spec, bool):
        raise ValueError("expected an axis spec, got a boolean")
    if isinstance(spec, int):
        return "int", spec
    if spec in AXIS_KEYWORDS:
        return "keyword", spec
    match = _LINEAR.match(spec) if isinstance(spec, str) else None
    if not match:
        raise ValueError(f"{spec!r} is not an axis spec")
    scale, name, sign, offset = match.groups()
    offset_value = int(offset or 0) * (-1 if sign == "-" else 1)
    return "dim", (name, int(scale or 1), offset_value)


def _iter_tensor_shapes(input_spec: Any, path: list) -> list[tuple[list, dict]]:
    """The per-axis maps inside one input's spec, with their paths."""
    if input_spec is None:
        return []
    if isinstance(input_spec, list):
        return [([*path, index], item) for index, item in enumerate(input_spec) if item is not None]
    if "*" in input_spec:
        return [([*path, "*"], input_spec["*"])]
    return [(path, input_spec)]


def _semantic_problems(recipe: dict) -> list[Problem]:
    problems: list[Problem] = []
    dims = recipe.get("dims", {})
    known = ", ".join(sorted(dims)) or "(none declared)"
    for name, bounds in dims.items():
        low, high = bounds.get("min"), bounds.get("max")
        if low is not None and high is not None and low > high:
            problems.append(Problem(f"dims.{name}", f"min {low} is greater than max {high}"))

    def check_dim_ref(path: list, spec: Any):
        try:
            kind, value = parse_axis(spec)
        except ValueError as error:
            problems.append(Problem(json_path(path), str(error)))
            return
        if kind == "dim" and value[0] not in dims:
            problems.append(Problem(json_path(path), f"{value[0]!r} is not a dim; known dims: {known}"))

    def check_shapes(shapes: dict | None, path: list):
        for input_name, input_spec in (shapes or {}).items():
            for tensor_path, axes in _iter_tensor_shapes(input_spec, [*path, input_name]):
                for axis, spec in axes.items():
                    check_dim_ref([*tensor_path, axis], spec)

    def check_options(options: dict | None, export_format: str, path: list):
        allowed = find_format(export_format).options
        for option in options or {}:
            if option not in allowed:
                owners = [backend.name for backend in formats() if option in backend.options]
                hint = f" (an option of {', '.join(owners)})" if owners else ""
                problems.append(
                    Problem(
                        json_path([*path, option]),
                        f"not an option of {export_format}{hint}; {export_format} takes: {', '.join(allowed)}",
                    )
                )
        if options and options.get("ort_fusions") and options.get("optimize") is False:
            problems.append(Problem(json_path([*path, "ort_fusions"]), "ort_fusions requires optimize to be true"))

    tensors = recipe.get("sample_inputs", {}).get("tensors", {})
    for input_name, tensor in tensors.items():
        for index, size in enumerate(tensor.get("shape", [])):
            if isinstance(size, str) and size not in dims:
                problems.append(
                    Problem(f"sample_inputs.tensors.{input_name}.shape.{index}", f"{size!r} is not a dim; known dims: {known}")
                )

    targets = recipe.get("targets", {})
    default = recipe.get("default_target")
    if default is not None and default not in targets:
        problems.append(
            Problem("default_target", f"{default!r} is not a target; targets: {', '.join(sorted(targets))}")
        )
    for name, target in targets.items():
        base = ["targets", name]
        export_format = target.get("export_format")
        if find_format(export_format) is None:
            continue  # the schema already said so
        mode = target.get("mode", "forward")
        check_options(target.get("options"), export_format, [*base, "options"])
        check_shapes(target.get("dynamic_shapes"), [*base, "dynamic_shapes"])
        if "components" in target and mode != "generation":
            problems.append(Problem(json_path([*base, "components"]), "components apply to mode 'generation' only"))
        if "generation" in target and mode != "generation":
            problems.append(Problem(json_path([*base, "generation"]), "generation settings apply to mode 'generation' only"))
        generation = target.get("generation", {})
        if generation.get("cache_implementation") == "static" and "max_cache_len" not in generation:
            problems.append(Problem(json_path([*base, "generation"]), "a static cache needs max_cache_len"))
        if generation.get("single_graph"):
            if generation.get("cache_implementation") == "static":
                problems.append(Problem(json_path([*base, "generation", "single_graph"]),
                                        "a single graph runs the prompt on an empty DynamicCache: it takes no static cache"))
            if generation.get("multi_token_decode") is False:
                problems.append(Problem(json_path([*base, "generation", "single_graph"]),
                                        "a single graph is a multi-token decode: drop multi_token_decode: false"))
        for component, override in target.get("components", {}).items():
            check_options(override.get("options"), export_format, [*base, "components", component, "options"])
            check_shapes(override.get("dynamic_shapes"), [*base, "components", component, "dynamic_shapes"])
        for dim_name in target.get("parity", {}).get("probe", {}):
            if dim_name not in dims:
                problems.append(
                    Problem(json_path([*base, "parity", "probe", dim_name]), f"{dim_name!r} is not a dim; known dims: {known}")
                )
        precision = target.get("runtime", {}).get("precision")
        precisions = format_traits(export_format).runtime_precisions
        if precision is not None and precision not in precisions:
            problems.append(Problem(json_path([*base, "runtime", "precision"]),
                                    f"{export_format} runs the graph's own types: precision can be "
                                    f"{' or '.join(repr(p) for p in precisions)} "
                                    f"('bf16'/'f16' are OpenVINO runtime precisions)"))
        if "file_name" in target:  # the suffix of its format, a stem that claims none of hfexport's own names
            if mode != "forward":
                problems.append(Problem(json_path([*base, "file_name"]), "file_name applies to mode 'forward' only "
                                        "(a generation target's graphs keep the engine's names)"))
            else:
                try:
                    check_file_name(target["file_name"], export_format, json_path([*base, "file_name"]))
                except LayoutError as error:
                    problems.append(Problem(json_path([*base, "file_name"]), str(error).split(": ", 1)[-1]))
        if "dtype" in target:  # a float16 ONNX graph (hfexport.formats.onnx.float16)
            if not format_traits(export_format).converts_to_float16:
                problems.append(Problem(json_path([*base, "dtype"]), f"dtype converts an ONNX graph; {export_format} "
                                        "takes none (OpenVINO: options.compress_to_fp16 or runtime.precision 'f16')"))
            elif target.get("quantization"):
                problems.append(Problem(json_path([*base, "dtype"]), "dtype float16 converts a float graph and "
                                        "cannot be combined with quantization; make it a target of its own"))
        if target.get("variants"):  # names per format, settings per variant (hfexport.quantization.variants)
            problems.extend(variant_problems(target, export_format, base))
        quantization = target.get("quantization")
        if quantization:  # method x format, preset, params, calibration (hfexport.quantization.spec)
            problems.extend(section_problems(quantization, export_format, target.get("options"), base,
                                             recipe.get("sample_inputs"), task=recipe.get("task")))
    return problems


# ── The normalised recipe ────────────────────────────────────────────────────


def normalize(document: dict) -> dict:
    """The full form of a recipe: a flat engine config becomes one forward target named after its format; every
    `export_format` is the engine's name (`pt2` -> `dynamo`: `layout.canonical_format`)."""
    if "targets" in document:
        full = copy.deepcopy(document)
        for target in full["targets"].values():
            if isinstance(target, dict) and "export_format" in target:
                target["export_format"] = canonical_format(target["export_format"])
        return full
    flat = copy.deepcopy(document)
    export_format = canonical_format(flat.pop("export_format"))
    target: dict[str, Any] = {"export_format": export_format, "mode": "forward"}
    if "dynamic_shapes" in flat:
        target["dynamic_shapes"] = flat.pop("dynamic_shapes")
    if flat:
        target["options"] = flat
    return {"recipe_version": 1, "targets": {export_format: target}}


def validate_document(document: Any, source: str | None = None) -> dict:
    """Validate a parsed recipe (either form) and return its full form; raise `RecipeError` with every problem."""
    if not isinstance(document, dict):
        raise RecipeError(Problem("$", f"expected a JSON object, got {type(document).__name__}"), source)
    too_deep = _too_deep(document)
    if too_deep is not None:
        # Free-form objects (quantization.params) would otherwise reach copy/json recursion limits.
        raise RecipeError(Problem(json_path(too_deep), f"nested more than {MAX_DEPTH} levels deep"), source)
    invalid_paths: list[list] = []
    problems = _schema_problems(document, invalid_paths)
    if problems:
        reported = {problem.path for problem in problems}
        extra = [p for p in _semantic_problems_despite(document, invalid_paths) if p.path not in reported]
        raise RecipeError(problems + extra, source)
    full = normalize(document)
    problems = _semantic_problems(full)
    if problems:
        if "targets" not in document:
            problems = [_flat_path(problem, full) for problem in problems]
        raise RecipeError(problems, source)
    return full


def _too_deep(document: Any) -> list | None:
    """The path of the first value nested deeper than MAX_DEPTH (checked without recursion), else None."""
    stack = [(document, [])]
    while stack:
        value, path = stack.pop()
        if len(path) > MAX_DEPTH:
            return path[:MAX_DEPTH + 1]
        if isinstance(value, dict):
            stack.extend((item, [*path, key]) for key, item in value.items())
        elif isinstance(value, list):
            stack.extend((item, [*path, index]) for index, item in enumerate(value))
    return None


def _flat_path(problem: Problem, full: dict) -> Problem:
    """A problem found in the full form of a flat recipe, with its path as the flat document spells it."""
    prefix = f"targets.{next(iter(full['targets']))}"
    if problem.path == prefix:
        return Problem("$", problem.message)
    if not problem.path.startswith(prefix + "."):
        return problem
    path = problem.path[len(prefix) + 1:]
    return Problem(path.removeprefix("options."), problem.message)
