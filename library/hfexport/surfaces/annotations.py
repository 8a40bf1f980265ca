"""Recipe problems as GitHub annotations: each `RecipeError` problem mapped to its line and column in the file.

GitHub shows `::error file=F,line=L,col=C,title=T::message` lines printed by a step inline in the pull request
diff, so recipe owners see the problem on the line that causes it. A problem's JSON path (`targets.onnx.options.
opset`) is resolved against the document (keys may contain dots: the longest existing key wins) and located by
a small position-tracking scan of the recipe text that uses the json module's own string and scalar decoders.
A path that does not exist (a missing required key) points at its deepest existing parent; a JSON syntax error
points at the line and column the parser reported.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from json.decoder import scanstring
from pathlib import Path
from typing import Any

from hfexport.errors import RecipeError, SourceError
from hfexport.files import RECIPE_FILE
from hfexport.hub import HubRepo
from hfexport.recipe.loading import CONFIG_FIELD, CONFIG_FILE
from hfexport.recipe.data import recipe_from_document, recipe_from_text
from hfexport.recipe.validation import parse_recipe_text

_WHITESPACE = re.compile(r"[ \t\n\r]*")
_SYNTAX_POSITION = re.compile(r"\(line (\d+), column (\d+)\)")


@dataclass(frozen=True)
class Annotation:
    """One GitHub annotation: where (file, 1-based line and column) and what."""

    message: str
    file: str | None = None
    line: int | None = None
    col: int | None = None
    title: str = "invalid recipe"
    level: str = "error"

    def command(self) -> str:
        """The workflow command line (`::error file=...,line=...,col=...,title=...::message`)."""
        properties = [("file", self.file), ("line", self.line), ("col", self.col), ("title", self.title)]
        rendered = ",".join(f"{key}={_escape_property(str(value))}" for key, value in properties if value not in (None, ""))
        return f"::{self.level} {rendered}::{_escape_data(self.message)}" if rendered else f"::{self.level}::{_escape_data(self.message)}"


def _escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


# ── positions ────────────────────────────────────────────────────────────────


def value_positions(text: str) -> dict[tuple, tuple[int | None, int]]:
    """{path tuple: (offset of its key or None, offset of its value)} for every value of a JSON document."""
    decoder = json.JSONDecoder()
    positions: dict[tuple, tuple[int | None, int]] = {}

    def skip(index: int) -> int:
        return _WHITESPACE.match(text, index).end()

    def expect(index: int, char: str) -> int:
        if text[index:index + 1] != char:
            raise ValueError(f"expected {char!r} at offset {index}")
        return index + 1

    def value(index: int, path: tuple, key_at: int | None) -> int:
        index = skip(index)
        positions[path] = (key_at, index)
        opening = text[index:index + 1]
        if opening in ("{", "["):
            closing = "}" if opening == "{" else "]"
            index = skip(index + 1)
            if text[index:index + 1] == closing:
                return index + 1
            count = 0
            while True:
                index = skip(index)
                if opening == "{":
                    key_offset = index
                    key, index = scanstring(text, expect(index, '"'))
                    index = value(expect(skip(index), ":"), (*path, key), key_offset)
                else:
                    index = value(index, (*path, count), None)
                    count += 1
                index = skip(index)
                if text[index:index + 1] == ",":
                    index += 1
                    continue
                return expect(index, closing)
        _, end = decoder.raw_decode(text, index)
        return end

    value(0, (), None)
    return positions


def line_col(text: str, offset: int) -> tuple[int, int]:
    """1-based line and column (in characters) of `offset` in `text`."""
    line = text.count("\n", 0, offset) + 1
    return line, offset - (text.rfind("\n", 0, offset) + 1) + 1


def resolve_path(document: Any, dotted: str) -> tuple:
    """The deepest existing path of `document` named by a dotted problem path (keys may contain dots)."""
    if dotted in ("", "$"):
        return ()
    parts = dotted.split(".")
    resolved: list = []
    node, index = document, 0
    while index < len(parts):
        if isinstance(node, dict):
            for width in range(len(parts) - index, 0, -1):
                key = ".".join(parts[index:index + width])
                if key in node:
                    resolved.append(key)
                    node, index = node[key], index + width
                    break
            else:
                break
        elif isinstance(node, list) and parts[index].isdigit() and int(parts[index]) < len(node):
            resolved.append(int(parts[index]))
            node, index = node[int(parts[index])], index + 1
        else:
            break
    return tuple(resolved)


def locate(text: str, problem_path: str, message: str = "", base: tuple = ()) -> tuple[int, int]:
    """The line and column a problem points at: its key (or value) in the text, else the parser's position."""
    if problem_path in ("", "$"):
        match = _SYNTAX_POSITION.search(message)
        if match:
            return int(match.group(1)), int(match.group(2))
    try:
        document = json.loads(text)
        positions = value_positions(text)
    except (ValueError, RecursionError):
        return 1, 1
    root = document
    for key in base:
        root = root[key] if isinstance(root, dict) and key in root else root
    path = (*base, *resolve_path(root, problem_path))
    key_at, value_at = positions.get(path, positions.get(base, (None, 0)))
    return line_col(text, key_at if key_at is not None else value_at)


# ── recipes ──────────────────────────────────────────────────────────────────


@dataclass
class RecipeText:
    """The text a recipe was read from, the file to annotate and where the recipe sits inside the document."""

    text: str
    source: str
    file: str | None
    base: tuple = ()


def read_recipe_text(source: str | Path, revision: str | None = None, token: str | None = None,
                     workspace: str | Path | None = None) -> RecipeText:
    """Find a recipe's text the way `load_recipe` does: a JSON file, a model folder, or a Hub repo."""
    path = Path(source)
    if path.is_file():
        return RecipeText(_read(path), str(path), _relative(path, workspace))
    if path.is_dir():
        recipe_file, config_file = path / RECIPE_FILE, path / CONFIG_FILE
        if recipe_file.is_file():
            return RecipeText(_read(recipe_file), str(recipe_file), _relative(recipe_file, workspace))
        if config_file.is_file():
            return RecipeText(_read(config_file), f"{config_file} ({CONFIG_FIELD})", _relative(config_file, workspace),
                              (CONFIG_FIELD,))
        raise SourceError(f"no recipe in {path}: expected {RECIPE_FILE} or an `{CONFIG_FIELD}` field in {CONFIG_FILE}")
    at = f"{source}@{revision}" if revision else str(source)
    repo = HubRepo(str(source), revision, token)
    data = repo.read(RECIPE_FILE)
    if data is not None:
        return RecipeText(data.decode("utf-8", errors="replace"), f"{at}/{RECIPE_FILE}", RECIPE_FILE)
    data = repo.read(CONFIG_FILE)
    if data is not None:
        return RecipeText(data.decode("utf-8", errors="replace"), f"{at}/{CONFIG_FILE} ({CONFIG_FIELD})", CONFIG_FILE,
                          (CONFIG_FIELD,))
    raise SourceError(f"no recipe in {at}: expected {RECIPE_FILE} or an `{CONFIG_FIELD}` field in {CONFIG_FILE}")


def _read(path: Path) -> str:
    try:
        return path.read_bytes().decode("utf-8", errors="replace")
    except OSError as error:
        raise SourceError(f"cannot read {path}: {error.strerror or error}") from None


def _relative(path: Path, workspace: str | Path | None) -> str:
    """The path GitHub expects: relative to the checked-out repository when the file is inside it."""
    workspace = workspace or os.environ.get("GITHUB_WORKSPACE")
    if workspace:
        try:
            return path.resolve().relative_to(Path(workspace).resolve()).as_posix()
        except ValueError:
            pass
    return path.as_posix()


def annotations_for(error: RecipeError, recipe: RecipeText) -> list[Annotation]:
    """One annotation per problem of `error`, at the problem's line and column in `recipe.text`."""
    annotations = []
    for problem in error.problems:
        line, col = locate(recipe.text, problem.path, problem.message, recipe.base)
        where = "" if problem.path in ("", "$") else f"{problem.path}: "
        annotations.append(Annotation(f"{where}{problem.message}", recipe.file, line, col))
    return annotations


def check_recipe(source: str | Path, revision: str | None = None, token: str | None = None,
                 workspace: str | Path | None = None) -> list[Annotation]:
    """Validate the recipe of `source` (file, folder or repo); the annotations of its problems (empty: valid)."""
    recipe = read_recipe_text(source, revision, token, workspace)
    try:
        if recipe.base:
            config = parse_recipe_text(recipe.text, recipe.source)
            if not isinstance(config, dict) or CONFIG_FIELD not in config:
                raise SourceError(f"no recipe in {recipe.source}")
            recipe_from_document(config[CONFIG_FIELD], recipe.source)
        else:
            recipe_from_text(recipe.text, recipe.source)
    except RecipeError as error:
        return annotations_for(error, recipe)
    return []
