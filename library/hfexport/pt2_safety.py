"""Refusing a `.pt2` archive's serialized program (`<name>/models/*.json`) when torch would run code it holds.

`safety.check_pt2_archive` checks an archive's pickles; this checks the program, whose strings torch 2.13 turns
into code when loading or calling it:
- `guards_code`: Python source that `ExportedProgram.module()` compiles with `exec` into the guard function run on
  every call (pasted into a string literal too, so a quote in it escapes);
- symbolic expressions (`expr_str`, range-constraint names): parsed with `sympy.sympify`, which evaluates Python;
- graph node targets: resolved by attribute lookups from `torch` (`torch.<path>`), then called;
- the signature's pytree specs, whose cache contexts the engine turns into calls (`safety.check_treespec`).
Each string must parse into the small grammar `torch.export` writes; anything else raises `UnsafeExportError`
naming the archive member and JSON path.
"""

from __future__ import annotations

import ast
import re
from typing import Any

from .errors import UnsafeExportError

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SYMBOL = re.compile(r"^[a-z]+[0-9]+$")  # s0, u12, ...
_OPERATOR = {"getitem", "add", "sub", "mul", "floordiv", "truediv", "mod", "neg", "pos", "pow", "abs", "eq", "ne",
             "lt", "le", "gt", "ge", "and_", "or_", "not_", "xor", "invert", "lshift", "rshift"}
_MATH = {"floor", "ceil", "trunc", "sqrt", "log2", "exp", "log"}
# torch.utils._sympy.functions that the deserializer offers to sympify, plus sympy's own constructors.
_SYMPY_NAMES = {
    "Symbol", "Integer", "Rational", "Float", "Add", "Mul", "Pow", "Max", "Min", "Abs", "Eq", "Ne", "Lt", "Le", "Gt",
    "Ge", "And", "Or", "Not", "Piecewise", "ExprCondPair", "true", "false", "oo", "zoo", "nan", "floor", "ceiling",
    "sqrt", "FloorDiv", "ModularIndexing", "Where", "PythonMod", "Mod", "CleanDiv", "CeilToInt", "FloorToInt",
    "CeilDiv", "LShift", "RShift", "PowByNatural", "FloatPow", "FloatTrueDiv", "IntTrueDiv",
    "IsNonOverlappingAndDenseIndicator", "TruncToFloat", "TruncToInt", "RoundToInt", "RoundDecimal", "ToFloat",
    "Identity", "BitwiseFn_bitwise_and", "BitwiseFn_bitwise_or", "BitwiseFn_bitwise_xor",
}
_SYMPY_KEYWORDS = {"positive", "integer", "real", "nonnegative", "negative", "finite", "evaluate"}
_GUARD_NAMES = {"L", "inf", "min", "max", "abs", "Max", "Min", "Eq", "Ne", "Mod", "FloorDiv", "PythonMod", "CeilDiv",
                "CleanDiv", "IntTrueDiv", "FloatTrueDiv", "ToFloat", "TruncToInt", "sym_max", "sym_min"}
_TENSOR_METHODS = {"size", "stride", "storage_offset", "dim", "numel"}
_BIN_OPS = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow, ast.LShift, ast.RShift,
            ast.BitAnd, ast.BitOr, ast.BitXor)
_NAMESPACE = re.compile(r"^[a-z][a-z0-9_]*$")
_OP = re.compile(r"^(?!__)[A-Za-z_][A-Za-z0-9_]*$")
_DUNDER_OPS = {f"__{name}__" for name in ("and", "or", "xor", "lshift", "rshift", "iand", "ior", "ixor", "ilshift",
                                           "irshift", "rand", "ror", "rxor", "rlshift", "rrshift")}


def _walk(value: Any, path: str):
    """Every (key, value, path) of a JSON document, without recursion."""
    stack = [(value, path)]
    while stack:
        current, where = stack.pop()
        if isinstance(current, dict):
            for key, item in current.items():
                yield key, item, f"{where}.{key}"
                stack.append((item, f"{where}.{key}"))
        elif isinstance(current, list):
            stack.extend((item, f"{where}[{index}]") for index, item in enumerate(current))


def check_pt2_program(document: Any, source: str, name: str) -> None:
    """Check one serialized program (`name` is its archive member) for code-like strings outside the grammar."""
    from .safety import check_treespec

    where = f"{source}: {name}"
    for key, value, path in _walk(document, "$"):
        if key == "target" and isinstance(value, str):
            _check_target(value, f"{where}: {path}")
        elif key == "expr_str" and isinstance(value, str):
            _check_sympy(value, f"{where}: {path}")
        elif key in ("in_spec", "out_spec") and isinstance(value, str):
            check_treespec(value, f"{source}: {name}", path)
        elif key == "guards_code":
            for index, code in enumerate(value if isinstance(value, list) else [value]):
                _check_guard(code, f"{where}: {path}[{index}]")
        elif key == "range_constraints" and isinstance(value, dict):
            for symbol in value:
                _check_sympy(symbol, f"{where}: {path}.{symbol}")


def _check_target(target: str, where: str) -> None:
    """Graph call targets: torch operators (`torch.ops.<namespace>.<op>[.<overload>]`, an op named like a Python
    operator allowed: `aten.__and__`), and a few pure Python operators. The deserializer resolves a target by
    attribute lookups from `torch`, so any other path could reach a Python callable."""
    parts = target.split(".")
    ok = (
        (target.startswith("torch.ops.") and len(parts) in (4, 5) and _NAMESPACE.match(parts[2])
         and (_OP.match(parts[3]) or parts[3] in _DUNDER_OPS) and (len(parts) == 4 or _OP.match(parts[4])))
        or (len(parts) == 2 and parts[0] == "_operator" and parts[1] in _OPERATOR)
        or (len(parts) == 2 and parts[0] == "math" and parts[1] in _MATH)
        or (len(parts) == 2 and parts[0] == "torch" and re.fullmatch(r"_?sym_[a-z_]+", parts[1]) is not None)
    )
    if not ok:
        raise UnsafeExportError(f"{where}: refusing the graph call target {target!r}: only torch operators "
                                "(torch.ops.*) and arithmetic may be called by a downloaded program")


def _parse(text: Any, where: str, what: str) -> ast.Expression:
    if not isinstance(text, str) or len(text) > 10_000:
        raise UnsafeExportError(f"{where}: {what}: expected a short expression string")
    try:
        return ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError):
        raise UnsafeExportError(f"{where}: {what} {text[:80]!r} is not an expression") from None


def _check_sympy(text: Any, where: str) -> None:
    """`sympy.sympify` evaluates its input: only sympy constructors, numbers, symbols and arithmetic may appear."""
    tree = _parse(text, where, "symbolic expression")
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            if not (isinstance(node.func, ast.Name) and node.func.id in _SYMPY_NAMES):
                return _refuse(where, "symbolic expression", text)
            for keyword in node.keywords:
                if keyword.arg not in _SYMPY_KEYWORDS or not isinstance(keyword.value, ast.Constant):
                    return _refuse(where, "symbolic expression", text)
        elif isinstance(node, ast.Name):
            if node.id not in _SYMPY_NAMES and not _SYMBOL.match(node.id):
                return _refuse(where, "symbolic expression", text)
        elif isinstance(node, ast.Constant):
            if isinstance(node.value, str) and not _SYMBOL.match(node.value):
                return _refuse(where, "symbolic expression", text)
            if not isinstance(node.value, (int, float, bool, str)):
                return _refuse(where, "symbolic expression", text)
        elif not isinstance(node, (ast.Expression, ast.BinOp, ast.UnaryOp, ast.Compare, ast.BoolOp, ast.keyword,
                                   ast.Load, ast.USub, ast.UAdd, ast.Not, ast.And, ast.Or, ast.cmpop, *_BIN_OPS)):
            return _refuse(where, "symbolic expression", text)
    return None


def _check_guard(code: Any, where: str) -> None:
    """`guards_code` is compiled with `exec`: only comparisons over `L['input'].size()[i]`-style reads and numbers."""
    tree = _parse(code, where, "guard")
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            if node.id not in _GUARD_NAMES:
                return _refuse(where, "guard", code)
        elif isinstance(node, ast.Attribute):
            if node.attr not in _TENSOR_METHODS:
                return _refuse(where, "guard", code)
        elif isinstance(node, ast.Call):
            func = node.func
            named = isinstance(func, ast.Name) and func.id in _GUARD_NAMES - {"L"}
            method = isinstance(func, ast.Attribute) and func.attr in _TENSOR_METHODS
            if not (named or method) or node.keywords:
                return _refuse(where, "guard", code)
        elif isinstance(node, ast.Constant):
            # Strings are input names inside L[...]; torch pastes the guard into a string literal of generated code.
            if isinstance(node.value, str) and not _IDENT.match(node.value):
                return _refuse(where, "guard", code)
            if not isinstance(node.value, (int, float, bool, str)):
                return _refuse(where, "guard", code)
        elif not isinstance(node, (ast.Expression, ast.Compare, ast.BoolOp, ast.BinOp, ast.UnaryOp, ast.Subscript,
                                   ast.Load, ast.USub, ast.UAdd, ast.Not, ast.And, ast.Or, ast.cmpop, *_BIN_OPS)):
            return _refuse(where, "guard", code)
    return None


def _refuse(where: str, what: str, text: str) -> None:
    raise UnsafeExportError(f"{where}: refusing the {what} {text[:120]!r}: it is compiled or evaluated as Python when "
                            "the program loads or runs, and this one is not the kind torch.export writes")
