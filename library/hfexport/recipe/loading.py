"""Where recipes come from: a file, a model folder (`export_config.json`, else `config.json`'s `export_config`
field), a Hub repo, a dict or an existing `Recipe` (`load_recipe` takes any of them).
"""

from __future__ import annotations

from pathlib import Path

from hfexport.errors import Problem, RecipeError, RecipeNotFoundError, SourceError
from hfexport.files import RECIPE_FILE
from hfexport.hub import HubRepo, looks_like_repo_id
from hfexport.recipe.data import Recipe, recipe_from_document, recipe_from_text
from hfexport.recipe.validation import MAX_RECIPE_BYTES, config_problems, parse_recipe_text

CONFIG_FILE = "config.json"
CONFIG_FIELD = "export_config"


def _read_file(path: Path) -> bytes:
    try:
        size = path.stat().st_size
        if size > MAX_RECIPE_BYTES:
            raise RecipeError(Problem("$", f"recipe is {size} bytes; at most {MAX_RECIPE_BYTES} are read"), str(path))
        return path.read_bytes()
    except OSError as error:
        raise SourceError(f"cannot read {path}: {error.strerror or error}") from None


def _recipe_from_config(config_bytes: bytes, source: str) -> Recipe | None:
    config = parse_recipe_text(config_bytes, source)
    if not isinstance(config, dict) or CONFIG_FIELD not in config:
        return None
    return recipe_from_document(config[CONFIG_FIELD], f"{source} ({CONFIG_FIELD})")


def recipe_from_folder(folder: str | Path) -> Recipe:
    folder = Path(folder)
    recipe_file = folder / RECIPE_FILE
    if recipe_file.is_file():
        return recipe_from_text(_read_file(recipe_file), str(recipe_file))
    config_file = folder / CONFIG_FILE
    if config_file.is_file():
        recipe = _recipe_from_config(_read_file(config_file), str(config_file))
        if recipe is not None:
            return recipe
    raise RecipeNotFoundError(
        f"no recipe in {folder}: expected {RECIPE_FILE} or an `{CONFIG_FIELD}` field in {CONFIG_FILE} "
        "(`hfexport init` proposes one)"
    )


def recipe_from_hub(repo_id: str, revision: str | None = None, token: str | None = None) -> Recipe:
    """Read a repo's recipe: only `export_config.json` or `config.json` are downloaded, never weights."""
    at = f"{repo_id}@{revision}" if revision else repo_id
    repo = HubRepo(repo_id, revision, token)
    data = repo.read(RECIPE_FILE)
    if data is not None:
        return recipe_from_text(data, f"{at}/{RECIPE_FILE}")
    config = repo.read(CONFIG_FILE)
    if config is not None:
        recipe = _recipe_from_config(config, f"{at}/{CONFIG_FILE}")
        if recipe is not None:
            return recipe
    raise RecipeNotFoundError(
        f"no recipe in {at}: expected {RECIPE_FILE} or an `{CONFIG_FIELD}` field in {CONFIG_FILE} "
        "(`hfexport init` proposes one)"
    )


def model_config(source: str | Path, revision: str | None = None, token: str | None = None) -> tuple[dict, str] | None:
    """(the model's config.json as a dict, where it was read) for a model folder or a Hub repo id; None for anything
    else (a recipe file, a dict) or a model without one."""
    path = Path(str(source))
    if path.is_dir():
        config_path = path / CONFIG_FILE
        data = _read_file(config_path) if config_path.is_file() else None
        where = str(config_path)
    elif isinstance(source, str) and looks_like_repo_id(source) and not path.suffix == ".json":
        data = HubRepo(source, revision, token).read(CONFIG_FILE)
        where = f"{source}/{CONFIG_FILE}"
    else:
        return None
    if data is None:
        return None
    config = parse_recipe_text(data, where)
    return (config, where) if isinstance(config, dict) else None


def check_against_model(recipe: Recipe, source: str | Path, revision: str | None = None,
                        token: str | None = None) -> None:
    """Raise `RecipeError` when the recipe's dims are past what the model's config admits (`config_problems`)."""
    found = model_config(source, revision, token)
    if found is None:
        return
    problems = config_problems(recipe.data, *found)
    if problems:
        raise RecipeError(problems, recipe.source)


def load_recipe(source: str | Path | dict | Recipe, revision: str | None = None, token: str | None = None) -> Recipe:
    """A validated recipe from a dict, a JSON file, a model folder or a Hub repo id."""
    if isinstance(source, Recipe):
        return source
    if isinstance(source, dict):
        return recipe_from_document(source, "<dict>")
    path = Path(source)
    if path.is_dir():
        return recipe_from_folder(path)
    if path.is_file():
        return recipe_from_text(_read_file(path), str(path))
    text = str(source)
    local_parent = "/" in text and Path(text.split("/")[0]).is_dir()  # `examples/missing`: a path, not a repo
    if path.suffix == ".json" or text.startswith((".", "/", "~")) or local_parent or not looks_like_repo_id(text):
        raise SourceError(f"{text}: no such file or folder")
    if "/" not in text:
        # `nosuchdir`: most likely a folder name mistyped, though the Hub has (legacy) repos without an owner too.
        try:
            return recipe_from_hub(text, revision, token)
        except SourceError as error:
            raise SourceError(f"{text}: no such file or folder here; as a Hub repo id: {error}") from None
    return recipe_from_hub(text, revision, token)
