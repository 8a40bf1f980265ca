"""Which of hfexport's modules one `hfexport export` visits, and how often it goes back and forth between them.

usage: python scripts/module_walk.py [LIBRARY_DIR] -- EXPORT ARGS...
  e.g. python scripts/module_walk.py library -- examples/tiny-bert --target onnx -o /tmp/walk
Runs `hfexport export ARGS` in this process under a profiler hook that records every call into an hfexport module
(the testing helpers excluded) and prints JSON: the modules visited, the module-to-module edges taken, and the
returns to a module already left on the way down ("A -> B -> A" in the call chain), the back-and-forth the
architecture issue counts. LIBRARY_DIR (default `library`) lets the same script measure an older checkout.
"""

import json
import sys
from pathlib import Path

args = sys.argv[1:]
library = args.pop(0) if args and args[0] != "--" else "library"
args = args[1:] if args and args[0] == "--" else args
sys.path.insert(0, str(Path(library).resolve()))

visited: dict[str, int] = {}
edges: set[tuple[str, str]] = set()
stack: list[str] = []
back_and_forth: set[tuple[str, ...]] = set()


def module_of(frame) -> str | None:
    name = frame.f_globals.get("__name__", "")
    return name if name.startswith("hfexport") and not name.startswith("hfexport.testing") else None


def hook(frame, event, _arg):
    if event == "call":
        module = module_of(frame)
        if module is None:
            return
        visited[module] = visited.get(module, 0) + 1
        caller = stack[-1] if stack else None
        if caller and caller != module:
            edges.add((caller, module))
            if module in stack[:-1]:  # back into a module already on the chain: A -> ... -> B -> A
                back_and_forth.add(tuple(dict.fromkeys(stack[stack.index(module):] + [module])))
        stack.append(module)
    elif event == "return" and module_of(frame) is not None and stack:
        stack.pop()


def main() -> None:
    try:
        from hfexport.surfaces.cli import main as cli
    except ImportError:
        from hfexport.cli import main as cli  # before the layered package
    sys.setprofile(hook)
    try:
        code = cli(["export", *args, "--quiet"])
    finally:
        sys.setprofile(None)
    print(json.dumps({"exit_code": code, "modules": len(visited), "visited": sorted(visited),
                      "edges": len(edges), "back_and_forth": sorted(" -> ".join(chain) for chain in back_and_forth)},
                     indent=1))


main()
