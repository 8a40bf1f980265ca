"""A runtime client's fork server, run in the runtime's own interpreter: `python warm_server.py CLIENT`.

It runs CLIENT's top-level imports once (torch, optimum: most of a Python client's start), prints `ready`, then for
each request line on stdin (JSON: `argv`, `cwd`, `env`, `stdout`, `stderr`) forks a child that runs CLIENT as
`__main__` exactly as `python CLIENT ARGV...` would (its own process, its stdin /dev/null, its output in the named
files, its exit code), prints `{"pid": ...}` when the child starts and `{"exit": ..., "cpu_s": ...}` when it ends
(the CPU seconds of the server and its children so far). The imports are
the only thing the children share. Standard library only: it never imports hfexport (`hfexport.deployment.warm`).
"""

import ast
import json
import os
import resource
import runpy
import sys
import traceback


def preload(client: str) -> None:
    """Run the client's module-level `import` statements (a failing one is left for the child to raise as usual)."""
    with open(client, encoding="utf-8") as handle:
        tree = ast.parse(handle.read(), client)
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            try:
                exec(compile(ast.Module([node], []), client, "exec"), {"__name__": "__warm__"})
            except Exception:  # noqa: BLE001 - the child meets the same error and reports it as the client would
                pass


def child(client: str, request: dict) -> None:
    """In the forked child: become `python CLIENT ARGV...` and never return."""
    code = 1
    try:
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        for fd, path, flags in ((0, os.devnull, os.O_RDONLY), (1, request["stdout"], os.O_WRONLY | os.O_CREAT),
                                (2, request["stderr"], os.O_WRONLY | os.O_CREAT)):
            opened = os.open(path, flags, 0o600)
            os.dup2(opened, fd)
            os.close(opened)
        sys.argv = [client, *request["argv"]]
        sys.path[0] = os.path.dirname(os.path.abspath(client))
        try:
            runpy.run_path(client, run_name="__main__")
            code = 0
        except SystemExit as done:
            code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
            if done.code is not None and not isinstance(done.code, int):
                print(done.code, file=sys.stderr)
        except BaseException:  # noqa: BLE001 - as the interpreter would: the traceback on stderr, exit 1
            traceback.print_exc()
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def main() -> None:
    client = sys.argv[1]
    preload(client)
    print("ready", flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            child(client, request)
        print(json.dumps({"pid": pid}), flush=True)
        _, status = os.waitpid(pid, 0)
        spent = sum(usage.ru_utime + usage.ru_stime for usage in (resource.getrusage(resource.RUSAGE_SELF),
                                                                  resource.getrusage(resource.RUSAGE_CHILDREN)))
        print(json.dumps({"exit": os.waitstatus_to_exitcode(status), "cpu_s": spent}), flush=True)


if __name__ == "__main__":
    main()
