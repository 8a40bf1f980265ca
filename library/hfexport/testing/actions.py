"""Run a composite GitHub Action's `run:` steps locally, with GitHub's environment, for end-to-end tests.

`run_action("action", {"model": "org/m", "publish": "pr"}, workspace=tmp)` reads `action/action.yml` and executes
its steps in order the way the runner does for a composite action: `if:` conditions and `${{ }}` expressions
are evaluated (inputs with their defaults, `steps.<id>.outputs.*`, `github.*`, `runner.*`, `env.*`, the status
functions), each `run:` step runs in `bash --noprofile --norc -eo pipefail` with its own `GITHUB_OUTPUT`,
`GITHUB_STEP_SUMMARY`, `GITHUB_ENV` and `GITHUB_PATH` files, `GITHUB_WORKSPACE` as working directory, and
workflow commands (`::error ...::`, `::add-mask::`) are collected from its output. The action's outputs are
evaluated from `outputs.<name>.value` at the end.

`uses:` steps (actions/setup-python, actions/upload-artifact) cannot run here: their `if:` is evaluated and
they are recorded as `not-run` (would have run) or `skipped`, never executed. Everything else the action needs
(Python, hfexport) must be on PATH: pass the action's own documented input for that (hfexport's action:
`install: "false"`). Expressions outside the supported subset raise `ActionError`, so a test cannot silently
run something different from what GitHub would.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["ActionError", "ActionResult", "StepResult", "evaluate", "parse_commands", "read_output_file", "run_action"]

_EXPRESSION = re.compile(r"\$\{\{(.*?)\}\}", re.S)
_COMMAND = re.compile(r"^::([a-z-]+)(?: ([^:]*))?::(.*)$")


class ActionError(Exception):
    """The action cannot be run locally as written (unsupported expression, step or shell)."""


@dataclass
class StepResult:
    id: str | None
    name: str
    outcome: str  # success | failure | skipped | not-run (a `uses:` step that would have run)
    returncode: int | None = None
    outputs: dict[str, str] = field(default_factory=dict)
    log: str = ""
    uses: str | None = None
    seconds: float | None = None  # wall time of a `run:` step


@dataclass
class ActionResult:
    steps: list[StepResult]
    outputs: dict[str, str]
    summary: str
    annotations: list[dict[str, Any]]
    log: str

    @property
    def success(self) -> bool:
        return all(step.outcome in ("success", "skipped", "not-run") for step in self.steps)

    def step(self, step_id: str) -> StepResult:
        return next(step for step in self.steps if step.id == step_id)


# ── expressions ──────────────────────────────────────────────────────────────

_TOKEN = re.compile(r"\s*(?:(?P<str>'(?:[^']|'')*')|(?P<num>-?\d+(?:\.\d+)?)|(?P<op>==|!=|&&|\|\||<=|>=|[!()<>,.\[\]])"
                    r"|(?P<name>[A-Za-z_][A-Za-z0-9_-]*))")


def _tokens(text: str) -> list[tuple[str, str]]:
    tokens, index = [], 0
    text = text.strip()
    while index < len(text):
        match = _TOKEN.match(text, index)
        if not match or match.end() == index:
            raise ActionError(f"cannot parse expression {text!r} at {text[index:]!r}")
        kind = match.lastgroup
        tokens.append((kind, match.group(kind)))
        index = match.end()
    return tokens


class _Parser:
    """GitHub expressions: literals, contexts (a.b.c, a['b']), ! == != < > && || ( ) and a few functions."""

    FUNCTIONS = ("always", "success", "failure", "cancelled", "contains", "startsWith", "endsWith", "format", "toJSON",
                 "fromJSON")

    def __init__(self, text: str, contexts: Mapping[str, Any], status: str):
        self.text, self.tokens, self.index = text, _tokens(text), 0
        self.contexts, self.status = contexts, status
        self.used_status = False

    def peek(self) -> tuple[str, str] | None:
        return self.tokens[self.index] if self.index < len(self.tokens) else None

    def take(self, value: str | None = None) -> tuple[str, str]:
        token = self.peek()
        if token is None or (value is not None and token[1] != value):
            raise ActionError(f"expected {value or 'more'} in expression {self.text!r}")
        self.index += 1
        return token

    def parse(self) -> Any:
        value = self.or_()
        if self.peek() is not None:
            raise ActionError(f"unexpected {self.peek()[1]!r} in expression {self.text!r}")
        return value

    def or_(self) -> Any:
        value = self.and_()
        while self.peek() == ("op", "||"):
            self.take()
            right = self.and_()
            value = value if _truthy(value) else right
        return value

    def and_(self) -> Any:
        value = self.compare()
        while self.peek() == ("op", "&&"):
            self.take()
            right = self.compare()
            value = right if _truthy(value) else value
        return value

    def compare(self) -> Any:
        value = self.unary()
        while self.peek() in (("op", "=="), ("op", "!="), ("op", "<"), ("op", ">"), ("op", "<="), ("op", ">=")):
            operator = self.take()[1]
            right = self.unary()
            value = _compare(value, right, operator)
        return value

    def unary(self) -> Any:
        if self.peek() == ("op", "!"):
            self.take()
            return not _truthy(self.unary())
        return self.primary()

    def primary(self) -> Any:
        kind, value = self.take()
        if kind == "str":
            return value[1:-1].replace("''", "'")
        if kind == "num":
            return float(value)
        if value == "(":
            inner = self.or_()
            self.take(")")
            return inner
        if kind != "name":
            raise ActionError(f"unexpected {value!r} in expression {self.text!r}")
        if value in ("true", "false"):
            return value == "true"
        if value == "null":
            return None
        if self.peek() == ("op", "("):
            return self.call(value)
        if value not in self.contexts:
            raise ActionError(f"unknown context {value!r} in expression {self.text!r}")
        current = self.contexts[value]
        while self.peek() in (("op", "."), ("op", "[")):
            if self.take()[1] == ".":
                key = self.take()[1]
            else:
                key = self.or_()
                self.take("]")
            current = current.get(str(key)) if isinstance(current, Mapping) else None
        return current

    def call(self, name: str) -> Any:
        if name not in self.FUNCTIONS:
            raise ActionError(f"function {name}() is not supported locally (expression {self.text!r})")
        self.take("(")
        args = []
        while self.peek() != ("op", ")"):
            args.append(self.or_())
            if self.peek() == ("op", ","):
                self.take()
        self.take(")")
        if name in ("always", "success", "failure", "cancelled"):
            self.used_status = True
            return {"always": True, "success": self.status == "success", "failure": self.status == "failure",
                    "cancelled": False}[name]
        if name == "contains":
            haystack, needle = args
            if isinstance(haystack, list):
                return any(_compare(item, needle, "==") for item in haystack)
            return str(needle).lower() in _string(haystack).lower()
        if name in ("startsWith", "endsWith"):
            text, part = (_string(arg).lower() for arg in args)
            return text.startswith(part) if name == "startsWith" else text.endswith(part)
        if name == "format":
            template, *rest = args
            return re.sub(r"\{(\d+)\}", lambda m: _string(rest[int(m.group(1))]), _string(template))
        import json

        return json.dumps(args[0]) if name == "toJSON" else json.loads(_string(args[0]))


def _truthy(value: Any) -> bool:
    return value not in (None, False, 0, "", 0.0)


def _string(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _compare(left: Any, right: Any, operator: str) -> bool:
    """GitHub's loose comparison: strings case-insensitively, otherwise numbers when either side is one."""
    if isinstance(left, str) and isinstance(right, str):
        left, right = left.lower(), right.lower()
    elif type(left) is not type(right):  # mismatched types (null, bool, number, string) compare as numbers
        left, right = _number(left), _number(right)
    operations = {"==": lambda: left == right, "!=": lambda: left != right, "<": lambda: left < right,
                  ">": lambda: left > right, "<=": lambda: left <= right, ">=": lambda: left >= right}
    return operations[operator]()


def _number(value: Any) -> float:
    if value is None or value == "":
        return 0.0
    if isinstance(value, bool):
        return float(value)
    try:
        return float(value)
    except (TypeError, ValueError):
        return float("nan")


def evaluate(expression: str, contexts: Mapping[str, Any], status: str = "success") -> Any:
    """The value of one expression (without `${{ }}`)."""
    return _Parser(expression, contexts, status).parse()


def substitute(text: str, contexts: Mapping[str, Any]) -> str:
    """`text` with every `${{ expression }}` replaced by its string value."""
    return _EXPRESSION.sub(lambda match: _string(evaluate(match.group(1), contexts)), str(text))


def condition(text: str | bool | None, contexts: Mapping[str, Any], status: str) -> bool:
    """A step's `if:` as GitHub decides it: without a status function it means `success() && (...)`."""
    if text is None:
        return status == "success"
    if isinstance(text, bool):
        return text and status == "success"
    expression = text.strip()
    match = re.fullmatch(r"\$\{\{(.*)\}\}", expression, re.S)
    expression = match.group(1) if match else expression
    parser = _Parser(expression, contexts, status)
    value = _truthy(parser.parse())
    return value if parser.used_status else value and status == "success"


# ── workflow files and commands ──────────────────────────────────────────────


def read_output_file(path: Path) -> dict[str, str]:
    """Parse a `GITHUB_OUTPUT`/`GITHUB_ENV` file: `name=value` lines and `name<<DELIMITER` blocks."""
    values: dict[str, str] = {}
    if not path.exists():
        return values
    lines = path.read_text(encoding="utf-8").splitlines()
    index = 0
    while index < len(lines):
        line = lines[index]
        index += 1
        if not line.strip():
            continue
        if "<<" in line and ("=" not in line or line.index("<<") < line.index("=")):
            name, delimiter = line.split("<<", 1)
            block = []
            while index < len(lines) and lines[index] != delimiter:
                block.append(lines[index])
                index += 1
            if index >= len(lines):
                raise ActionError(f"{path.name}: no closing delimiter {delimiter!r} for {name!r}")
            index += 1
            values[name] = "\n".join(block)
        elif "=" in line:
            name, value = line.split("=", 1)
            values[name] = value
        else:
            raise ActionError(f"{path.name}: invalid line {line!r}")
    return values


def _unescape(text: str, property_: bool = False) -> str:
    text = text.replace("%0D", "\r").replace("%0A", "\n")
    if property_:
        text = text.replace("%3A", ":").replace("%2C", ",")
    return text.replace("%25", "%")


def parse_commands(log: str) -> tuple[list[dict[str, Any]], list[str]]:
    """Workflow commands in a step's output: annotations (error/warning/notice with properties) and masks."""
    annotations, masks = [], []
    for line in log.splitlines():
        match = _COMMAND.match(line.strip())
        if not match:
            continue
        command, properties, message = match.groups()
        if command == "add-mask":
            masks.append(message)
        elif command in ("error", "warning", "notice"):
            entry: dict[str, Any] = {"level": command, "message": _unescape(message)}
            for item in (properties or "").split(","):
                if "=" in item:
                    key, value = item.split("=", 1)
                    entry[key.strip()] = _unescape(value, property_=True)
            for key in ("line", "col", "endLine", "endColumn"):
                if key in entry:
                    entry[key] = int(entry[key])
            annotations.append(entry)
    return annotations, masks


# ── the runner ───────────────────────────────────────────────────────────────


def _load(action: str | Path) -> tuple[Path, dict]:
    import yaml

    path = Path(action)
    if path.is_dir():
        path = path / "action.yml"
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    runs = data.get("runs", {})
    if runs.get("using") != "composite":
        raise ActionError(f"{path}: only composite actions run locally (runs.using is {runs.get('using')!r})")
    return path.parent, data


def run_action(action: str | Path, inputs: Mapping[str, Any] | None = None, *, workspace: str | Path,
               env: Mapping[str, str] | None = None, temp: str | Path | None = None, timeout: float = 900,
               github: Mapping[str, Any] | None = None) -> ActionResult:
    """Run the composite action at `action` (a folder with action.yml, or the file) with `inputs`.

    `env` is the process environment for the steps (default: this process's); `workspace` becomes
    `GITHUB_WORKSPACE` and the steps' working directory. Unknown input names raise `ActionError`, as GitHub
    warns; missing required inputs too.
    """
    action_dir, data = _load(action)
    declared = data.get("inputs", {}) or {}
    given = {str(key): "" if value is None else _string(value) for key, value in (inputs or {}).items()}
    unknown = sorted(set(given) - set(declared))
    if unknown:
        raise ActionError(f"unknown input(s) {', '.join(unknown)}; the action declares: {', '.join(declared)}")
    workspace = Path(workspace)
    temp = Path(temp) if temp else Path(tempfile.mkdtemp(prefix="runner-temp-"))
    temp.mkdir(parents=True, exist_ok=True)
    base_env = dict(os.environ if env is None else env)
    github_context = {"action_path": str(action_dir), "workspace": str(workspace), "event_name": "workflow_dispatch",
                      "repository": "local/test", "sha": "0" * 40, "ref": "refs/heads/main", **(github or {})}
    runner_context = {"temp": str(temp), "os": "Linux", "arch": "X64", "name": "local"}
    contexts: dict[str, Any] = {"inputs": {}, "github": github_context, "runner": runner_context,
                                "env": dict(base_env), "steps": {}, "matrix": {}, "secrets": {}}
    for name, spec in declared.items():
        spec = spec or {}
        if name in given:
            contexts["inputs"][name] = given[name]
        elif spec.get("required") and "default" not in spec:
            raise ActionError(f"input {name!r} is required")
        else:
            contexts["inputs"][name] = substitute(_string(spec.get("default", "")), contexts)

    results: list[StepResult] = []
    status = "success"
    step_env_extra: dict[str, str] = {}
    path_extra: list[str] = []
    summary_parts: list[str] = []
    annotations: list[dict[str, Any]] = []
    masks: list[str] = []
    logs: list[str] = []
    for index, step in enumerate(data["runs"].get("steps", [])):
        step_id = step.get("id")
        name = step.get("name") or step.get("uses") or f"step {index + 1}"
        run_it = condition(step.get("if"), contexts, status)
        if "uses" in step:
            results.append(StepResult(step_id, name, "not-run" if run_it else "skipped", uses=step["uses"]))
            _record_step(contexts, step_id, "skipped", {})
            continue
        if not run_it:
            results.append(StepResult(step_id, name, "skipped"))
            _record_step(contexts, step_id, "skipped", {})
            continue
        shell = step.get("shell")
        if shell != "bash":
            raise ActionError(f"step {name!r}: composite run steps need `shell: bash` here (got {shell!r})")
        files = {key: temp / f"{key.lower()}_{index}_{uuid.uuid4().hex[:6]}" for key in
                 ("GITHUB_OUTPUT", "GITHUB_STEP_SUMMARY", "GITHUB_ENV", "GITHUB_PATH")}
        for file in files.values():
            file.touch()
        contexts["env"] = {**base_env, **step_env_extra}
        step_env = {key: substitute(_string(value), contexts) for key, value in (step.get("env") or {}).items()}
        script = substitute(step["run"], {**contexts, "env": {**contexts["env"], **step_env}})
        script_file = temp / f"step_{index}_{uuid.uuid4().hex[:6]}.sh"
        script_file.write_text(script, encoding="utf-8")
        process_env = {
            **base_env, **step_env_extra,
            "GITHUB_ACTIONS": "true", "CI": "true", "GITHUB_WORKSPACE": str(workspace),
            "GITHUB_ACTION_PATH": str(action_dir), "RUNNER_TEMP": str(temp), "RUNNER_OS": "Linux",
            **{key: str(file) for key, file in files.items()}, **step_env,
        }
        if path_extra:
            process_env["PATH"] = os.pathsep.join([*reversed(path_extra), process_env.get("PATH", "")])
        cwd = workspace / substitute(step["working-directory"], contexts) if step.get("working-directory") else workspace
        started = time.perf_counter()
        completed = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script_file)],
                                   cwd=cwd, env=process_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   text=True, timeout=timeout)
        log = completed.stdout  # one stream, in order, as GitHub's log shows it
        step_annotations, step_masks = parse_commands(log)
        masks += [mask for mask in step_masks if mask]
        annotations += step_annotations
        outputs = read_output_file(files["GITHUB_OUTPUT"])
        step_env_extra.update(read_output_file(files["GITHUB_ENV"]))
        path_extra += [line for line in files["GITHUB_PATH"].read_text().splitlines() if line.strip()]
        summary_parts.append(files["GITHUB_STEP_SUMMARY"].read_text(encoding="utf-8"))
        outcome = "success" if completed.returncode == 0 else "failure"
        if outcome == "failure" and not step.get("continue-on-error"):
            status = "failure"
        results.append(StepResult(step_id, name, outcome, completed.returncode, outputs, _mask(log, masks),
                                  seconds=time.perf_counter() - started))
        logs.append(f"## {name} (exit {completed.returncode})\n{_mask(log, masks)}")
        _record_step(contexts, step_id, outcome, outputs)
    contexts["env"] = {**base_env, **step_env_extra}
    outputs = {name: substitute(_string((spec or {}).get("value", "")), contexts)
               for name, spec in (data.get("outputs") or {}).items()}
    return ActionResult(results, outputs, "".join(summary_parts), annotations, "\n".join(logs))


def _record_step(contexts: dict, step_id: str | None, outcome: str, outputs: dict[str, str]) -> None:
    if step_id:
        contexts["steps"][step_id] = {"outcome": outcome, "conclusion": outcome, "outputs": outputs}


def _mask(text: str, masks: list[str]) -> str:
    for mask in sorted(set(masks), key=len, reverse=True):
        text = text.replace(mask, "***")
    return text
