"""A local Hub-compatible HTTP server, for tests that drive the real `huggingface_hub` client.

No machine here reaches huggingface.co, so uploads, pull requests, `refs/pr/N` revisions and discussions are
exercised over real HTTP against this server on 127.0.0.1 (pass `endpoint=hub.url` or set `HF_ENDPOINT` before
anything imports huggingface_hub). Standard library only.

Start it:
    python -m hfexport.testing.hub --root DIR --port 0 --token alice=hf_alice:write
    with LocalHub(tmp_path) as hub: HfApi(endpoint=hub.url, token=hub.write_token)
    conftest.py: `from hfexport.testing.hub import local_hub`(a function-scoped pytest fixture),
                 or `hub_session = make_fixture(scope="session")`.

Storage, tokens, Hugging Face Jobs and fault injection: docs/architecture.md, "The local Hub".
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import dataclasses
import datetime as _dt
import difflib
import hashlib
import html
import json
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

try:  # cross-process safety when a CLI server and a test seed the same root
    import fcntl
except ImportError:  # pragma: no cover - non-POSIX
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "DEFAULT_READ_TOKEN",
    "DEFAULT_USER",
    "DEFAULT_WRITE_TOKEN",
    "GRADIO_MOCK_OAUTH_TOKEN",
    "HubError",
    "LocalHub",
    "Token",
    "git_blob_oid",
    "main",
    "make_fixture",
]

GRADIO_MOCK_OAUTH_TOKEN = "mock-oauth-token-for-local-dev"
DEFAULT_USER = "user"
DEFAULT_WRITE_TOKEN = "hf_local_write_token"
DEFAULT_READ_TOKEN = "hf_local_read_token"

_TYPE_BY_PLURAL = {"models": "model", "datasets": "dataset", "spaces": "space"}
_PLURAL_BY_TYPE = {v: k for k, v in _TYPE_BY_PLURAL.items()}
_URL_PREFIX = {"model": "", "dataset": "datasets/", "space": "spaces/"}
_NAME_RE = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9_-])?$")
_PR_REF_RE = re.compile(r"^refs/pr/(\d+)$")
_HEX_PREFIX_RE = re.compile(r"^[0-9a-f]{7,40}$")
_DISCUSSION_PAGE = 50
_MAX_DIFF_CHARS = 200_000
_GITATTRIBUTES = "".join(
    f"{pattern} filter=lfs diff=lfs merge=lfs -text\n"
    for pattern in (
        "*.7z", "*.arrow", "*.bin", "*.bz2", "*.ckpt", "*.ftz", "*.gz", "*.h5", "*.joblib", "*.lfs.*",
        "*.mlmodel", "*.model", "*.msgpack", "*.npy", "*.npz", "*.onnx", "*.ot", "*.parquet", "*.pb", "*.pickle",
        "*.pkl", "*.pt", "*.pth", "*.rar", "*.safetensors", "saved_model/**/*", "*.tar.*", "*.tar", "*.tflite",
        "*.tgz", "*.wasm", "*.xz", "*.zip", "*.zst", "*tfevents*",
    )
).encode()

FAULT_MODES = ("drop", "drop_after_apply", "error", "timeout")


# ----------------------------------------------------------------------------------------------------------------------
# small helpers


def git_blob_oid(data: bytes) -> str:
    """Git blob sha1 of `data`: what the Hub reports as a regular file's `oid`/ETag."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _now() -> str:
    now = _dt.datetime.now(_dt.UTC)
    return now.strftime("%Y-%m-%dT%H:%M:%S.") + f"{now.microsecond // 1000:03d}Z"


def _atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _split_repo_id(repo_id: str) -> tuple[str, str]:
    parts = repo_id.split("/")
    if len(parts) != 2 or not all(_NAME_RE.match(p) for p in parts):
        raise HubError(400, f"Invalid repo id: {repo_id!r} (expected 'namespace/name')")
    return parts[0], parts[1]


def _check_repo_type(repo_type: str | None) -> str:
    repo_type = repo_type or "model"
    if repo_type not in _PLURAL_BY_TYPE:
        raise ValueError(f"Unsupported repo type {repo_type!r}")
    return repo_type


def _check_path(path: str) -> str:
    path = path.strip("/")
    if not path or any(part in ("", ".", "..") for part in path.split("/")) or path.startswith(".git/"):
        raise HubError(400, f"Invalid path in repo: {path!r}")
    return path


class HubError(Exception):
    """An HTTP error answered the way the Hub does: JSON `{"error": msg}` plus `X-Error-Code`/`X-Error-Message`."""

    def __init__(self, status: int, message: str, code: str | None = None, headers: Mapping[str, str] | None = None,
                 extra: Mapping[str, Any] | None = None):
        super().__init__(message)
        self.status, self.message, self.code = status, message, code
        self.headers = dict(headers or {})
        self.extra = dict(extra or {})

    def response(self) -> _Response:
        headers = {"X-Error-Message": self.message.encode("ascii", "replace").decode(), **self.headers}
        if self.code:
            headers["X-Error-Code"] = self.code
        return _json({"error": self.message, **self.extra}, self.status, headers)


def _repo_not_found(user: Token | None) -> HubError:
    # Like the Hub: 401 when anonymous (don't leak existence), 404 when authenticated.
    return HubError(401 if user is None else 404, "Repository not found", "RepoNotFound")


def _revision_not_found(rev: str) -> HubError:
    return HubError(404, f"Invalid rev id: {rev}", "RevisionNotFound")


@dataclasses.dataclass(frozen=True)
class Token:
    """An access token the server accepts: its value, owner, `read`/`write` role and the orgs the owner is in."""

    value: str
    user: str
    role: str = "write"
    orgs: tuple[str, ...] = ()

    def __post_init__(self):
        if self.role not in ("read", "write"):
            raise ValueError(f"token role must be 'read' or 'write', got {self.role!r}")

    @classmethod
    def parse(cls, spec: str) -> Token:
        """Parse the CLI form `USER=VALUE[:read|write[:org1,org2]]`."""
        user, sep, rest = spec.partition("=")
        if not sep or not user or not rest:
            raise ValueError(f"token spec must be USER=VALUE[:read|write[:orgs]], got {spec!r}")
        value, _, tail = rest.partition(":")
        role, _, orgs = tail.partition(":")
        return cls(value, user, role or "write", tuple(o for o in orgs.split(",") if o))


@dataclasses.dataclass
class _Response:
    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = dataclasses.field(default_factory=dict)
    file: tuple[Path, int, int] | None = None  # (path, offset, length) streamed instead of body


def _json(obj: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> _Response:
    body = json.dumps(obj).encode()
    return _Response(status, body, {"Content-Type": "application/json; charset=utf-8", **(headers or {})})


def _user_json(name: str) -> dict[str, Any]:
    return {"name": name, "fullname": name, "type": "user", "avatarUrl": f"/avatars/{name}.svg",
            "isPro": False, "isHf": False, "isMod": False, "isOwner": False}


# ----------------------------------------------------------------------------------------------------------------------
# storage


class _Store:
    """On-disk repos: content-addressed blobs, commit manifests and one atomically replaced state.json per repo."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock = threading.RLock()
        self._depth = 0
        self._lock_file = open(self.root / ".lock", "a+b") if fcntl is not None else None  # noqa: SIM115

    def close(self) -> None:
        if self._lock_file is not None:
            self._lock_file.close()
            self._lock_file = None

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        with self._lock:
            self._depth += 1
            try:
                if self._depth == 1 and self._lock_file is not None:
                    fcntl.flock(self._lock_file, fcntl.LOCK_EX)
                try:
                    yield
                finally:
                    if self._depth == 1 and self._lock_file is not None:
                        fcntl.flock(self._lock_file, fcntl.LOCK_UN)
            finally:
                self._depth -= 1

    # blobs
    def blob_path(self, oid: str) -> Path:
        return self.root / "blobs" / oid[:2] / oid

    def put_blob(self, data: bytes) -> str:
        oid = git_blob_oid(data)
        path = self.blob_path(oid)
        if not path.exists():
            _atomic_write(path, data)
        return oid

    def get_blob(self, oid: str) -> bytes:
        return self.blob_path(oid).read_bytes()

    # repos
    def repo_dir(self, repo_type: str, repo_id: str) -> Path:
        ns, name = _split_repo_id(repo_id)
        return self.root / "repos" / _PLURAL_BY_TYPE[repo_type] / ns / name

    def load_state(self, repo_type: str, repo_id: str) -> dict[str, Any] | None:
        try:
            return json.loads((self.repo_dir(repo_type, repo_id) / "state.json").read_bytes())
        except FileNotFoundError:
            return None

    def save_state(self, state: dict[str, Any]) -> None:
        path = self.repo_dir(state["type"], state["id"]) / "state.json"
        _atomic_write(path, json.dumps(state, indent=1, sort_keys=True).encode())

    def list_repos(self, repo_type: str) -> list[dict[str, Any]]:
        base = self.root / "repos" / _PLURAL_BY_TYPE[repo_type]
        states = []
        for path in sorted(base.glob("*/*/state.json")):
            with contextlib.suppress(FileNotFoundError, ValueError):
                states.append(json.loads(path.read_bytes()))
        return states

    def load_commit(self, state: dict[str, Any], sha: str) -> dict[str, Any]:
        return json.loads((self.repo_dir(state["type"], state["id"]) / "commits" / f"{sha}.json").read_bytes())

    def find_commits(self, state: dict[str, Any], prefix: str) -> list[str]:
        folder = self.repo_dir(state["type"], state["id"]) / "commits"
        return sorted(p.stem for p in folder.glob(f"{prefix}*.json"))

    def write_commit(self, state: dict[str, Any], parents: list[str], files: Mapping[str, Mapping[str, Any]],
                     title: str, message: str, author: str) -> str:
        """Store a new commit object (not yet referenced by any ref) and return its id."""
        state["seq"] = state.get("seq", 0) + 1
        commit = {"parents": parents, "title": title, "message": message, "author": author, "date": _now(),
                  "seq": state["seq"], "repo": f"{state['type']}/{state['id']}",
                  "files": {p: dict(files[p]) for p in sorted(files)}}
        sha = hashlib.sha1(json.dumps(commit, sort_keys=True).encode()).hexdigest()
        commit["id"] = sha
        _atomic_write(self.repo_dir(state["type"], state["id"]) / "commits" / f"{sha}.json",
                      json.dumps(commit, indent=1, sort_keys=True).encode())
        return sha

    def resolve(self, state: dict[str, Any], rev: str) -> str | None:
        """Commit id a revision (branch, tag, `refs/...`, full or abbreviated sha) points at, or None."""
        if rev.startswith("refs/heads/"):
            return state["branches"].get(rev[len("refs/heads/"):])
        if rev.startswith("refs/tags/"):
            return state["tags"].get(rev[len("refs/tags/"):])
        if m := _PR_REF_RE.match(rev):
            return state["pulls"].get(m[1])
        if rev in state["branches"]:
            return state["branches"][rev]
        if rev in state["tags"]:
            return state["tags"][rev]
        if _HEX_PREFIX_RE.match(rev):
            found = self.find_commits(state, rev)
            if len(found) == 1:
                return found[0]
        return None

    def ancestors(self, state: dict[str, Any], sha: str) -> list[dict[str, Any]]:
        """All commits reachable from `sha`, newest first."""
        seen: dict[str, dict[str, Any]] = {}
        todo = [sha]
        while todo:
            current = todo.pop()
            if current in seen:
                continue
            commit = self.load_commit(state, current)
            seen[current] = commit
            todo.extend(commit["parents"])
        return sorted(seen.values(), key=lambda c: c["seq"], reverse=True)


# ----------------------------------------------------------------------------------------------------------------------
# tree helpers


def _tree_entries(files: Mapping[str, Mapping[str, Any]], path: str, recursive: bool) -> list[dict[str, Any]]:
    prefix = f"{path}/" if path else ""
    dirs: dict[str, list[str]] = {}
    entries: list[dict[str, Any]] = []
    for file_path in sorted(files):
        if not file_path.startswith(prefix):
            continue
        rel = file_path[len(prefix):]
        parts = rel.split("/")
        for depth in range(1, len(parts)):
            dirs.setdefault(prefix + "/".join(parts[:depth]), []).append(file_path)
        if recursive or len(parts) == 1:
            info = files[file_path]
            entries.append({"type": "file", "oid": info["oid"], "size": info["size"], "path": file_path})
    for dir_path, members in sorted(dirs.items()):
        if recursive or "/" not in dir_path[len(prefix):]:
            oid = hashlib.sha1("".join(f"{m}\0{files[m]['oid']}\n" for m in members).encode()).hexdigest()
            entries.append({"type": "directory", "oid": oid, "size": 0, "path": dir_path})
    return sorted(entries, key=lambda e: (e["type"] != "directory", e["path"]))


def _event_json(event: dict[str, Any]) -> dict[str, Any]:
    data = event["data"]
    if event["type"] == "comment":
        data = {**data, "latest": {**data["latest"], "author": _user_json(data["latest"]["author"])}}
    return {**event, "author": _user_json(event["author"]), "data": data}


def _changed_paths(old: Mapping[str, Mapping[str, Any]], new: Mapping[str, Mapping[str, Any]]) -> list[str]:
    return sorted(p for p in set(old) | set(new) if (old.get(p) or {}).get("oid") != (new.get(p) or {}).get("oid"))


def _merge_text(base: bytes | None, ours: bytes | None, theirs: bytes | None) -> bytes | None:
    """git's 3-way merge of one file changed on both sides (`git merge-file`), or None for a conflict: binary
    content, a side that deleted it, both sides adding it, overlapping edits, or no git to ask."""
    if base is None or ours is None or theirs is None or any(b"\0" in blob for blob in (base, ours, theirs)):
        return None
    git = shutil.which("git")
    if git is None:
        return None
    with tempfile.TemporaryDirectory(prefix="hub-merge-") as folder:
        names = []
        for name, blob in (("ours", ours), ("base", base), ("theirs", theirs)):
            Path(folder, name).write_bytes(blob)
            names.append(str(Path(folder, name)))
        import subprocess

        done = subprocess.run([git, "merge-file", "-p", "--quiet", *names], capture_output=True, timeout=60)
    return done.stdout if done.returncode == 0 else None


# ----------------------------------------------------------------------------------------------------------------------
# the server


class LocalHub:
    """A Hub-compatible server over an on-disk store; also seeds and inspects repos directly from Python.

    `LocalHub(root).start()` returns the base URL (port 0 picks a free port); `.stop()` shuts it down; it is also a
    context manager. With `root=None` a temporary directory is used and removed on `stop()`.
    """

    def __init__(self, root: str | os.PathLike[str] | None = None, *, tokens: Iterable[Token | str] | None = None,
                 host: str = "127.0.0.1", port: int = 0, strict: bool = False,
                 mock_oauth_user: str | bool | None = None, verbose: bool = False):
        self._own_root = root is None
        self.root = Path(tempfile.mkdtemp(prefix="localhub-") if root is None else root)
        self.store = _Store(self.root)
        self.host, self.port = host, port
        self.strict = strict
        self.verbose = verbose
        self.tokens: dict[str, Token] = {}
        if tokens is None:
            tokens = [Token(DEFAULT_WRITE_TOKEN, DEFAULT_USER, "write"),
                      Token(DEFAULT_READ_TOKEN, DEFAULT_USER, "read")]
        for token in tokens:
            self.add_token(Token.parse(token) if isinstance(token, str) else token)
        if mock_oauth_user is not False and GRADIO_MOCK_OAUTH_TOKEN not in self.tokens:
            owner = mock_oauth_user if isinstance(mock_oauth_user, str) else (self._first_token("write") or
                                                                             Token("", DEFAULT_USER)).user
            self.add_token(Token(GRADIO_MOCK_OAUTH_TOKEN, owner, "write"))
        self.requests: list[tuple[str, str, int]] = []  # (method, path, status), most recent last
        self._faults: dict[str, list[str | int]] = {}
        self._path_faults: list[list] = []  # [endpoint, path suffix, mode, times left]
        self._faults_lock = threading.Lock()
        self.timeout_s = 5.0  # how long a "timeout" fault holds the request before closing without an answer
        self.jobs = _Jobs(self)
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------------------------------------------------

    def start(self) -> str:
        """Serve in a background thread; return the base URL (e.g. `http://127.0.0.1:43123`)."""
        if self._server is None:
            server = ThreadingHTTPServer((self.host, self.port), _Handler)
            server.daemon_threads = True
            server.hub = self  # type: ignore[attr-defined]
            self._server = server
            self.port = server.server_address[1]
            self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                                            name=f"localhub:{self.port}", daemon=True)
            self._thread.start()
        return self.url

    def stop(self) -> None:
        """Stop serving (idempotent); removes the root if it was a temporary one."""
        self.jobs.cancel_all()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
            if self._thread is not None:
                self._thread.join(timeout=5)
        self.store.close()
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> LocalHub:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def write_token(self) -> str | None:
        token = self._first_token("write")
        return token.value if token else None

    @property
    def read_token(self) -> str | None:
        token = self._first_token("read")
        return token.value if token else None

    @property
    def user(self) -> str:
        """Owner of the first write token: the natural namespace for test repos."""
        token = self._first_token("write")
        return token.user if token else DEFAULT_USER

    def _first_token(self, role: str) -> Token | None:
        return next((t for t in self.tokens.values() if t.role == role and t.value != GRADIO_MOCK_OAUTH_TOKEN), None)

    def add_token(self, token: Token | str, user: str | None = None, role: str = "write",
                  orgs: Iterable[str] = ()) -> Token:
        """Accept one more token: `add_token(Token(...))` or `add_token("hf_x", "alice", "read", ["org"])`."""
        if isinstance(token, str):
            token = Token(token, user or DEFAULT_USER, role, tuple(orgs))
        self.tokens[token.value] = token
        return token

    def env(self, token: str | bool | None = True, hf_home: str | os.PathLike[str] | None = None) -> dict[str, str]:
        """Environment for a subprocess that uses the real client against this server (merge into os.environ).

        Never sets HF_HUB_OFFLINE (it blocks 127.0.0.1 too). `token=True` uses the first write token.
        """
        env = {"HF_ENDPOINT": self.url, "HF_HUB_DISABLE_XET": "1", "HF_HUB_DISABLE_TELEMETRY": "1",
               "HF_HUB_DISABLE_PROGRESS_BARS": "1", "HF_HUB_DISABLE_IMPLICIT_TOKEN": "1"}
        value = self.write_token if token is True else (token or None)
        if value:
            env["HF_TOKEN"] = value
            env.pop("HF_HUB_DISABLE_IMPLICIT_TOKEN")
        if hf_home is not None:
            env["HF_HOME"] = str(hf_home)
        return env

    def transformers_js_env(self, cache_dir: str | os.PathLike[str]) -> str:
        """The lines a transformers.js script starts with to read models from this server (`env()`'s twin for
        JavaScript: the one part a user of the real Hub leaves out), its downloads cached in `cache_dir`."""
        return ('import { env } from "@huggingface/transformers";\n'
                f'env.remoteHost = {json.dumps(self.url.rstrip("/") + "/")};\n'
                'env.remotePathTemplate = "{model}/resolve/{revision}/";\n'
                f'env.allowLocalModels = false; env.cacheDir = {json.dumps(str(cache_dir))};\n')

    # -- fault injection ---------------------------------------------------------------------------------------------

    def inject_fault(self, endpoint: str, mode: str | int = "drop", times: int = 1, path: str | None = None) -> None:
        """Make the next `times` requests to `endpoint` fail (only those whose URL path ends with `/<path>` when
        `path` is given, e.g. `inject_fault("resolve", 500, path="README.md")`: one file unreachable, the rest not).

        Endpoints: commit, preupload, resolve, repo_info, tree, paths_info, refs, commits, create_repo, delete_repo,
        discussions, discussion, discussion_change, merge, whoami, branch, tag, settings, list_repos, jobs_run,
        jobs_inspect, jobs_logs, jobs_cancel, jobs_list, jobs_hardware.
        Modes: "drop" (close the connection mid-request, apply nothing), "drop_after_apply" (apply, then close
        without answering), "error" (HTTP 500, apply nothing), "timeout" (read the request, answer nothing for
        `hub.timeout_s` seconds, then close; apply nothing) or an int HTTP status such as 429 (apply nothing).
        The client sends commits without retrying, but preupload and downloads go through its backoff helper,
        which retries network errors, 429 and 5xx after sleeping 1, 2, 4... seconds: use a 4xx there to stay fast.
        """
        if mode not in FAULT_MODES and not isinstance(mode, int):
            raise ValueError(f"unknown fault mode {mode!r}; expected one of {FAULT_MODES} or an HTTP status")
        with self._faults_lock:
            if path is not None:
                self._path_faults.append([endpoint, "/" + path.lstrip("/"), mode, times])
            else:
                self._faults.setdefault(endpoint, []).extend([mode] * times)

    def clear_faults(self) -> None:
        with self._faults_lock:
            self._faults.clear()
            self._path_faults.clear()

    @property
    def fail_next_commit(self) -> str | int | None:
        """Pending fault of the next commit request; setting it queues one (`None` clears the queue)."""
        with self._faults_lock:
            queue = self._faults.get("commit")
            return queue[0] if queue else None

    @fail_next_commit.setter
    def fail_next_commit(self, mode: str | int | None) -> None:
        if mode is None:
            with self._faults_lock:
                self._faults.pop("commit", None)
        else:
            self.inject_fault("commit", mode)

    def _take_fault(self, endpoint: str, path: str = "") -> str | int | None:
        with self._faults_lock:
            for fault in self._path_faults:
                if fault[0] == endpoint and unquote(path).endswith(fault[1]):
                    fault[3] -= 1
                    if fault[3] <= 0:
                        self._path_faults.remove(fault)
                    return fault[2]
            queue = self._faults.get(endpoint)
            return queue.pop(0) if queue else None

    # -- Python-side helpers (no HTTP) -------------------------------------------------------------------------------

    def create_repo(self, repo_id: str, *, repo_type: str = "model", private: bool = False, exist_ok: bool = True,
                    sdk: str | None = None) -> bool:
        """Create a repo with the Hub's initial `.gitattributes` commit; returns False if it already existed."""
        repo_type = _check_repo_type(repo_type)
        with self.store.locked():
            if self.store.load_state(repo_type, repo_id) is not None:
                if not exist_ok:
                    raise HubError(409, f"You already created this {repo_type} repo", extra={"url": self.repo_url(
                        repo_id, repo_type)})
                return False
            state = {"type": repo_type, "id": repo_id, "private": bool(private), "createdAt": _now(), "sdk": sdk,
                     "seq": 0, "branches": {}, "tags": {}, "pulls": {}, "discussions": {}, "next_num": 1,
                     "uid": uuid.uuid4().hex[:24]}
            oid = self.store.put_blob(_GITATTRIBUTES)
            sha = self.store.write_commit(state, [], {".gitattributes": {"oid": oid, "size": len(_GITATTRIBUTES)}},
                                          "initial commit", "", "system")
            state["branches"]["main"] = sha
            self.store.save_state(state)
            return True

    def seed_repo(self, repo_id: str, files: str | os.PathLike[str] | Mapping[str, bytes | str | os.PathLike[str]],
                  *, repo_type: str = "model", private: bool = False, revision: str = "main",
                  message: str = "Upload folder", author: str | None = None) -> str:
        """Create `repo_id` if needed and commit `files` (a folder, or {path_in_repo: bytes|str|Path}) to it.

        Returns the head commit id. Existing files not in `files` are kept; `private` applies on creation; if
        nothing would change (e.g. re-seeding a persistent root), no commit is made.
        """
        self.create_repo(repo_id, repo_type=repo_type, private=private, exist_ok=True)
        add = _collect_files(files)
        head = self.head(repo_id, revision, repo_type)
        if head is not None and add:
            current = self._files_at(repo_id, revision, repo_type)
            if all((current.get(p) or {}).get("oid") == git_blob_oid(d) for p, d in add.items()):
                return head
        return self.commit(repo_id, add=add, repo_type=repo_type, revision=revision, title=message,
                           author=author or self.user)["oid"]

    def commit(self, repo_id: str, *, add: Mapping[str, bytes | str] | None = None, delete: Iterable[str] = (),
               repo_type: str = "model", revision: str = "main", title: str = "Update", description: str = "",
               author: str | None = None, parent_commit: str | None = None, create_pr: bool = False
               ) -> dict[str, Any]:
        """Commit directly (no HTTP): returns {"oid", "pr_num"}. Paths in `delete` ending in '/' are folders."""
        ops: list[tuple[str, str, bytes | None]] = []
        for path, data in (add or {}).items():
            ops.append(("file", path, data.encode() if isinstance(data, str) else bytes(data)))
        for path in delete:
            ops.append(("deletedFolder" if path.endswith("/") else "deletedFile", path, None))
        return self._apply_commit(_check_repo_type(repo_type), repo_id, revision, ops, title=title,
                                  description=description, author=author or self.user, parent_commit=parent_commit,
                                  create_pr=create_pr)

    def repo_exists(self, repo_id: str, repo_type: str = "model") -> bool:
        return self.store.load_state(_check_repo_type(repo_type), repo_id) is not None

    def head(self, repo_id: str, revision: str = "main", repo_type: str = "model") -> str | None:
        """Commit id `revision` points at, or None."""
        state = self.store.load_state(_check_repo_type(repo_type), repo_id)
        return None if state is None else self.store.resolve(state, revision)

    def list_files(self, repo_id: str, revision: str = "main", repo_type: str = "model") -> list[str]:
        return sorted(self._files_at(repo_id, revision, repo_type))

    def files(self, repo_id: str, revision: str = "main", repo_type: str = "model") -> dict[str, bytes]:
        """All files of the repo at `revision`, {path: content}."""
        files = self._files_at(repo_id, revision, repo_type)
        return {p: self.store.get_blob(files[p]["oid"]) for p in sorted(files)}

    def read_file(self, repo_id: str, path: str, revision: str = "main", repo_type: str = "model") -> bytes:
        files = self._files_at(repo_id, revision, repo_type)
        if path not in files:
            raise KeyError(f"{path} not in {repo_id}@{revision}")
        return self.store.get_blob(files[path]["oid"])

    def refs(self, repo_id: str, repo_type: str = "model") -> dict[str, dict[str, str]]:
        """{"branches": {name: sha}, "tags": {...}, "pulls": {num: sha}}."""
        state = self._state_or_raise(repo_id, repo_type)
        return {"branches": dict(state["branches"]), "tags": dict(state["tags"]), "pulls": dict(state["pulls"])}

    def commits(self, repo_id: str, revision: str = "main", repo_type: str = "model") -> list[dict[str, Any]]:
        """Commits reachable from `revision`, newest first (id, parents, title, message, author, date, files)."""
        state = self._state_or_raise(repo_id, repo_type)
        sha = self.store.resolve(state, revision)
        if sha is None:
            raise KeyError(f"unknown revision {revision!r} of {repo_id}")
        return self.store.ancestors(state, sha)

    def discussions(self, repo_id: str, repo_type: str = "model") -> list[dict[str, Any]]:
        """Raw discussion records (num, title, status, isPullRequest, author, events, ...) oldest first."""
        state = self._state_or_raise(repo_id, repo_type)
        return [state["discussions"][k] for k in sorted(state["discussions"], key=int)]

    def set_private(self, repo_id: str, private: bool = True, repo_type: str = "model") -> None:
        with self.store.locked():
            state = self._state_or_raise(repo_id, repo_type)
            state["private"] = bool(private)
            self.store.save_state(state)

    def repo_url(self, repo_id: str, repo_type: str = "model", base: str | None = None) -> str:
        return f"{base or self.url}/{_URL_PREFIX[repo_type]}{repo_id}"

    def _state_or_raise(self, repo_id: str, repo_type: str) -> dict[str, Any]:
        state = self.store.load_state(_check_repo_type(repo_type), repo_id)
        if state is None:
            raise KeyError(f"no {repo_type} repo {repo_id!r}")
        return state

    def _files_at(self, repo_id: str, revision: str, repo_type: str) -> dict[str, dict[str, Any]]:
        state = self._state_or_raise(repo_id, repo_type)
        sha = self.store.resolve(state, revision)
        if sha is None:
            raise KeyError(f"unknown revision {revision!r} of {repo_id}")
        return self.store.load_commit(state, sha)["files"]

    # -- git-like operations shared by HTTP and Python ---------------------------------------------------------------

    def _apply_commit(self, repo_type: str, repo_id: str, revision: str, ops: list[tuple[str, str, bytes | None]], *,
                      title: str, description: str, author: str, parent_commit: str | None = None,
                      create_pr: bool = False, check: Callable[[dict[str, Any]], None] | None = None
                      ) -> dict[str, Any]:
        """Apply all `ops` as one commit on `revision` (a branch or `refs/pr/N`), or on a new PR if `create_pr`."""
        store = self.store
        with store.locked():
            state = store.load_state(repo_type, repo_id)
            if state is None:
                raise _repo_not_found(None)
            if check is not None:
                check(state)
            pr_num: str | None = None
            branch: str | None = None
            if create_pr:
                branch = revision[len("refs/heads/"):] if revision.startswith("refs/heads/") else revision
                if branch not in state["branches"]:
                    raise _revision_not_found(revision)
                head = state["branches"][branch]
                if parent_commit is not None:
                    head = store.resolve(state, parent_commit) or ""
                    if not head:
                        raise HubError(400, f"Invalid parent commit: {parent_commit}")
            else:
                if m := _PR_REF_RE.match(revision):
                    pr_num = m[1]
                    if pr_num not in state["pulls"]:
                        raise _revision_not_found(revision)
                    if state["discussions"][pr_num]["status"] == "merged":
                        raise HubError(400, f"Pull request #{pr_num} is already merged")
                    head = state["pulls"][pr_num]
                else:
                    branch = revision[len("refs/heads/"):] if revision.startswith("refs/heads/") else revision
                    if branch not in state["branches"]:
                        if store.resolve(state, revision) is not None:
                            raise HubError(400, f"Cannot commit to {revision!r}: not a branch")
                        raise _revision_not_found(revision)
                    head = state["branches"][branch]
                if parent_commit is not None and parent_commit != head:
                    raise HubError(412, "A commit has happened since. Please refresh and try again.")
            files = dict(store.load_commit(state, head)["files"])
            for kind, path, data in ops:
                path = _check_path(path)
                if kind == "file":
                    assert data is not None
                    files[path] = {"oid": store.put_blob(data), "size": len(data)}
                elif kind == "deletedFile":
                    if path not in files:
                        raise HubError(404, f"A file with this name doesn't exist: {path}", "EntryNotFound")
                    del files[path]
                elif kind == "deletedFolder":
                    doomed = [p for p in files if p.startswith(path + "/")]
                    if not doomed:
                        raise HubError(404, f"A folder with this name doesn't exist: {path}", "EntryNotFound")
                    for p in doomed:
                        del files[p]
                else:
                    raise HubError(400, f"Unsupported commit operation {kind!r} (this local Hub stores regular files "
                                        "only: answer 'regular' in preupload / set HF_HUB_DISABLE_XET=1)")
            sha = store.write_commit(state, [head], files, title, description, author)
            if create_pr:
                pr_num = str(state["next_num"])
                state["next_num"] += 1
                state["pulls"][pr_num] = sha
                discussion = self._new_discussion(state, pr_num, title, description, author, is_pr=True,
                                                  status="open", target=branch, base=head)
                discussion["events"].append(self._event("commit", author, {"subject": title, "oid": sha}))
            elif pr_num is not None:
                state["pulls"][pr_num] = sha
                discussion = state["discussions"][pr_num]
                discussion["events"].append(self._event("commit", author, {"subject": title, "oid": sha}))
                if discussion["status"] == "draft":
                    discussion["status"] = "open"
            else:
                state["branches"][branch] = sha
            store.save_state(state)
            return {"oid": sha, "pr_num": int(pr_num) if pr_num is not None else None}

    @staticmethod
    def _event(kind: str, author: str, data: dict[str, Any]) -> dict[str, Any]:
        return {"id": uuid.uuid4().hex[:24], "type": kind, "createdAt": _now(), "author": author, "data": data}

    def _comment_event(self, author: str, text: str) -> dict[str, Any]:
        now = _now()
        return self._event("comment", author, {
            "edited": False, "hidden": False, "numEdits": 0, "editors": [author], "reactions": [],
            "latest": {"raw": text, "html": f"<p>{html.escape(text)}</p>", "updatedAt": now, "author": author},
        })

    def _new_discussion(self, state: dict[str, Any], num: str, title: str, description: str, author: str, *,
                        is_pr: bool, status: str, target: str | None = None, base: str | None = None
                        ) -> dict[str, Any]:
        discussion = {"num": int(num), "title": title, "author": author, "createdAt": _now(), "status": status,
                      "isPullRequest": is_pr, "target": target, "base": base, "mergeCommitId": None,
                      "events": [self._comment_event(author, description)]}
        state["discussions"][num] = discussion
        return discussion

    def _is_ancestor(self, state: dict[str, Any], maybe_ancestor: str, sha: str) -> bool:
        return any(c["id"] == maybe_ancestor for c in self.store.ancestors(state, sha))

    def _merge_base(self, state: dict[str, Any], ours: str, theirs: str) -> str:
        """The newest commit of `theirs`' history that `ours` also holds: git's merge base for a branch and a PR."""
        ancestors = {c["id"] for c in self.store.ancestors(state, ours)}
        return next((c["id"] for c in self.store.ancestors(state, theirs) if c["id"] in ancestors), theirs)

    def _three_way(self, state: dict[str, Any], discussion: dict[str, Any]
                   ) -> tuple[dict[str, dict[str, Any]], list[str]]:
        """Merge the PR head into its target branch as git does: (the merged file manifest, conflicting paths).

        Paths changed on one side only take that side; paths changed on both to the same content are fine; text
        files changed on both are merged line by line by `git merge-file` (git's own 3-way merge, the one the Hub's
        git runs), which conflicts only where both edits touch the same or adjacent lines. Binary files, add/add and
        modify/delete pairs that differ conflict, as in git. Without a `git` binary every file changed on both sides
        differently conflicts (stricter than the Hub, never more lenient)."""
        store = self.store
        head, pr_head = state["branches"][discussion["target"]], state["pulls"][str(discussion["num"])]
        base = store.load_commit(state, self._merge_base(state, head, pr_head))["files"]
        ours = store.load_commit(state, head)["files"]
        theirs = store.load_commit(state, pr_head)["files"]
        merged, conflicts = dict(ours), []
        changed_ours = set(_changed_paths(base, ours))
        for path in _changed_paths(base, theirs):
            mine, other = ours.get(path), theirs.get(path)
            if path not in changed_ours or (mine or {}).get("oid") == (other or {}).get("oid"):
                if other is None:
                    merged.pop(path, None)
                else:
                    merged[path] = other
                continue
            text = _merge_text(*(store.get_blob(entry["oid"]) if entry else None
                                 for entry in (base.get(path), mine, other)))
            if text is None:
                conflicts.append(path)
            else:
                merged[path] = {"oid": store.put_blob(text), "size": len(text)}
        return merged, sorted(conflicts)

    def _conflicts(self, state: dict[str, Any], discussion: dict[str, Any]) -> list[str]:
        return self._three_way(state, discussion)[1]

    def _merge(self, state: dict[str, Any], num: str, author: str, comment: str | None) -> None:
        store = self.store
        discussion = state["discussions"][num]
        target = discussion["target"]
        if target not in state["branches"]:
            raise HubError(400, f"Target branch {target!r} of pull request #{num} no longer exists")
        head, pr_head = state["branches"][target], state["pulls"][num]
        if self._is_ancestor(state, head, pr_head):
            new_head = pr_head  # fast-forward
        else:
            files, conflicts = self._three_way(state, discussion)
            if conflicts:
                raise HubError(409, f"Pull request #{num} has conflicts: {', '.join(conflicts)}")
            new_head = store.write_commit(state, [head, pr_head], files, discussion["title"],
                                          f"Merge refs/pr/{num} into {target}", author)
        state["branches"][target] = new_head
        if comment:
            discussion["events"].append(self._comment_event(author, comment))
        discussion["events"].append(self._event("status-change", author, {"status": "merged"}))
        discussion["status"] = "merged"
        discussion["mergeCommitId"] = new_head

    def _diff(self, state: dict[str, Any], discussion: dict[str, Any]) -> str:
        store = self.store
        old = store.load_commit(state, discussion["base"])["files"]
        new = store.load_commit(state, state["pulls"][str(discussion["num"])])["files"]
        out: list[str] = []
        for path in _changed_paths(old, new):
            out.append(f"diff --git a/{path} b/{path}\n")
            if path not in old:
                out.append("new file mode 100644\n")
            elif path not in new:
                out.append("deleted file mode 100644\n")
            a = store.get_blob(old[path]["oid"]) if path in old else b""
            b = store.get_blob(new[path]["oid"]) if path in new else b""
            try:
                a_text, b_text = a.decode(), b.decode()
            except UnicodeDecodeError:
                out.append(f"Binary files a/{path} and b/{path} differ\n")
                continue
            out.extend(difflib.unified_diff(a_text.splitlines(keepends=True), b_text.splitlines(keepends=True),
                                            f"a/{path}" if path in old else "/dev/null",
                                            f"b/{path}" if path in new else "/dev/null"))
            if out and not out[-1].endswith("\n"):
                out[-1] += "\n\\ No newline at end of file\n"
        text = "".join(out)
        return text if len(text) <= _MAX_DIFF_CHARS else text[:_MAX_DIFF_CHARS] + "\n[diff truncated]\n"

    # -- auth --------------------------------------------------------------------------------------------------------

    def _authenticate(self, authorization: str | None) -> Token | None:
        if not authorization:
            return None
        scheme, _, value = authorization.strip().partition(" ")
        if scheme.lower() != "bearer" or not value.strip():
            raise HubError(401, "Invalid credentials in Authorization header")
        token = self.tokens.get(value.strip())
        if token is None:
            raise HubError(401, "Invalid credentials in Authorization header")
        return token

    def _is_member(self, user: Token | None, namespace: str) -> bool:
        return user is not None and (not self.strict or user.user == namespace or namespace in user.orgs)

    def _can_read(self, user: Token | None, state: dict[str, Any]) -> bool:
        return not state["private"] or self._is_member(user, state["id"].split("/")[0])

    def _require_write_role(self, user: Token | None, what: str) -> Token:
        if user is None:
            raise HubError(401, f"You must be authenticated to {what}")
        if user.role != "write":
            raise HubError(403, f"You don't have the rights to {what}: token is read-only")
        return user

    def _require_repo_write(self, user: Token | None, state: dict[str, Any], what: str) -> Token:
        user = self._require_write_role(user, what)
        if not self._is_member(user, state["id"].split("/")[0]):
            raise HubError(403, f"You don't have the rights to {what} on {state['id']}")
        return user

    # -- HTTP API ----------------------------------------------------------------------------------------------------

    def _route(self, method: str, segs: list[str]) -> tuple[str, Callable[[_Request], _Response]]:
        """Map a request to (fault-injection endpoint name, handler)."""
        n = len(segs)
        if n >= 1 and segs[0] == "api":
            if segs[1:] == ["whoami-v2"] and method == "GET":
                return "whoami", self._h_whoami
            if segs[1:] == ["validate-yaml"] and method == "POST":
                return "validate_yaml", lambda req: _json({"errors": [], "warnings": []})
            if n >= 2 and segs[1] == "jobs":
                return self.jobs.route(method, [unquote(seg) for seg in segs[2:]])
            if segs[1:] == ["repos", "create"] and method == "POST":
                return "create_repo", self._h_create_repo
            if segs[1:] == ["repos", "delete"] and method == "DELETE":
                return "delete_repo", self._h_delete_repo
            if n == 2 and segs[1] in _TYPE_BY_PLURAL and method == "GET":
                return "list_repos", lambda req: self._h_list_repos(req, _TYPE_BY_PLURAL[segs[1]])
            if n >= 4 and segs[1] in _TYPE_BY_PLURAL:
                repo_type, repo_id = _TYPE_BY_PLURAL[segs[1]], f"{unquote(segs[2])}/{unquote(segs[3])}"
                routed = self._route_repo(method, repo_type, repo_id, segs[4:])
                if routed is not None:
                    return routed
        else:
            typed = n >= 4 and segs[0] in ("datasets", "spaces") and segs[3] == "resolve"
            if typed or (n >= 3 and segs[2] == "resolve"):
                repo_type = _TYPE_BY_PLURAL[segs[0]] if typed else "model"
                ns, name, rest = (segs[1], segs[2], segs[4:]) if typed else (segs[0], segs[1], segs[3:])
                if method in ("GET", "HEAD") and rest:
                    rev, path_segs = _take_revision(rest)
                    path = "/".join(unquote(s) for s in path_segs)
                    return "resolve", lambda req: self._h_resolve(req, repo_type, f"{unquote(ns)}/{unquote(name)}",
                                                                  rev, path)
        raise HubError(404, f"Not found: {method} /{'/'.join(segs)}")

    def _route_repo(self, method: str, repo_type: str, repo_id: str, rest: list[str]
                    ) -> tuple[str, Callable[[_Request], _Response]] | None:
        head = rest[0] if rest else ""
        args = (repo_type, repo_id)
        if not rest and method == "GET":
            return "repo_info", lambda req: self._h_repo_info(req, *args, "main")
        if head == "revision" and len(rest) >= 2 and method == "GET":
            rev = _take_revision(rest[1:], greedy=True)[0]
            return "repo_info", lambda req: self._h_repo_info(req, *args, rev)
        if head == "tree" and len(rest) >= 2 and method == "GET":
            rev, path_segs = _take_revision(rest[1:])
            path = "/".join(unquote(s) for s in path_segs)
            return "tree", lambda req: self._h_tree(req, *args, rev, path)
        if head == "paths-info" and len(rest) >= 2 and method == "POST":
            rev = _take_revision(rest[1:], greedy=True)[0]
            return "paths_info", lambda req: self._h_paths_info(req, *args, rev)
        if rest == ["refs"] and method == "GET":
            return "refs", lambda req: self._h_refs(req, *args)
        if head == "commits" and method == "GET":
            rev = _take_revision(rest[1:], greedy=True)[0] if len(rest) >= 2 else "main"
            return "commits", lambda req: self._h_commits(req, *args, rev)
        if head == "preupload" and len(rest) >= 2 and method == "POST":
            rev = _take_revision(rest[1:], greedy=True)[0]
            return "preupload", lambda req: self._h_preupload(req, *args, rev)
        if head == "commit" and len(rest) >= 2 and method == "POST":
            rev = _take_revision(rest[1:], greedy=True)[0]
            return "commit", lambda req: self._h_commit(req, *args, rev)
        if rest == ["discussions"]:
            if method == "GET":
                return "discussions", lambda req: self._h_list_discussions(req, *args)
            if method == "POST":
                return "discussions", lambda req: self._h_create_discussion(req, *args)
        if head == "discussions" and len(rest) >= 2 and rest[1].isdigit():
            num = str(int(rest[1]))
            if len(rest) == 2 and method == "GET":
                return "discussion", lambda req: self._h_discussion(req, *args, num)
            if len(rest) >= 3 and method == "POST":
                action = "/".join(rest[2:])
                endpoint = "merge" if action == "merge" else "discussion_change"
                return endpoint, lambda req: self._h_discussion_change(req, *args, num, action)
        if head == "branch" and len(rest) >= 2 and method in ("POST", "DELETE"):
            branch = _take_revision(rest[1:], greedy=True)[0]
            return "branch", lambda req: self._h_branch(req, *args, branch)
        if head == "tag" and len(rest) >= 2 and method in ("POST", "DELETE"):
            rev = _take_revision(rest[1:], greedy=True)[0]
            return "tag", lambda req: self._h_tag(req, *args, rev)
        if rest == ["settings"] and method == "PUT":
            return "settings", lambda req: self._h_settings(req, *args)
        if rest == ["auth-check"] and method == "GET":
            return "repo_info", lambda req: (self._readable(req, *args), _json({"ok": True}))[1]
        return None

    def _readable(self, req: _Request, repo_type: str, repo_id: str) -> dict[str, Any]:
        _split_repo_id(repo_id)
        state = self.store.load_state(repo_type, repo_id)
        if state is None or not self._can_read(req.user, state):
            raise _repo_not_found(req.user)
        return state

    def _resolve_or_404(self, state: dict[str, Any], rev: str) -> str:
        sha = self.store.resolve(state, rev)
        if sha is None:
            raise _revision_not_found(rev)
        return sha

    def _h_whoami(self, req: _Request) -> _Response:
        user = req.user
        if user is None:
            raise HubError(401, "Invalid credentials in Authorization header")
        return _json({
            "type": "user", "id": hashlib.sha1(user.user.encode()).hexdigest()[:24], "name": user.user,
            "fullname": user.user, "email": f"{user.user}@localhost", "emailVerified": True, "canPay": False,
            "isPro": False, "periodEnd": None, "avatarUrl": f"/avatars/{user.user}.svg",
            "orgs": [{"type": "org", "name": o, "fullname": o, "roleInOrg": "write", "avatarUrl": ""}
                     for o in user.orgs],
            "auth": {"type": "access_token", "accessToken": {
                "displayName": f"{user.user}-{user.role}", "role": user.role, "createdAt": "2024-01-01T00:00:00.000Z"}},
        })

    def _repo_info_json(self, state: dict[str, Any], sha: str, full: bool = True) -> dict[str, Any]:
        commit = self.store.load_commit(state, sha)
        repo_type, repo_id = state["type"], state["id"]
        info: dict[str, Any] = {
            "_id": state.get("uid", ""), "id": repo_id, "author": repo_id.split("/")[0], "sha": sha,
            "lastModified": commit["date"], "createdAt": state["createdAt"], "private": state["private"],
            "gated": False, "disabled": False, "downloads": 0, "likes": 0, "tags": [],
        }
        if repo_type == "model":
            info["modelId"] = repo_id
        if repo_type == "space":
            info["sdk"] = state.get("sdk")
        if full:
            files = commit["files"]
            info["siblings"] = [{"rfilename": p, "size": files[p]["size"], "blobId": files[p]["oid"]}
                                for p in sorted(files)]
            info["usedStorage"] = sum(f["size"] for f in files.values())
            if repo_type == "model" and "config.json" in files:
                with contextlib.suppress(ValueError, UnicodeDecodeError):
                    config = json.loads(self.store.get_blob(files["config.json"]["oid"]))
                    if isinstance(config, dict):
                        info["config"] = {k: config[k] for k in ("architectures", "model_type") if k in config}
        return info

    def _h_repo_info(self, req: _Request, repo_type: str, repo_id: str, rev: str) -> _Response:
        state = self._readable(req, repo_type, repo_id)
        return _json(self._repo_info_json(state, self._resolve_or_404(state, rev)))

    def _h_list_repos(self, req: _Request, repo_type: str) -> _Response:
        author, search = req.param("author"), req.param("search")
        limit = int(req.param("limit") or 0)
        full = req.param("full") not in (None, "", "false", "False", "0")
        out = []
        for state in self.store.list_repos(repo_type):
            if not self._can_read(req.user, state):
                continue
            if author and state["id"].split("/")[0] != author:
                continue
            if search and search.lower() not in state["id"].lower():
                continue
            sha = state["branches"].get("main") or next(iter(state["branches"].values()))
            out.append(self._repo_info_json(state, sha, full=full))
        return _json(out[:limit] if limit else out)

    def _h_tree(self, req: _Request, repo_type: str, repo_id: str, rev: str, path: str) -> _Response:
        state = self._readable(req, repo_type, repo_id)
        files = self.store.load_commit(state, self._resolve_or_404(state, rev))["files"]
        path = path.strip("/")
        if path and not any(p.startswith(path + "/") for p in files):
            raise HubError(404, f"Entry not found: {path}", "EntryNotFound")
        recursive = req.param("recursive") in ("1", "true", "True")
        return _json(_tree_entries(files, path, recursive))

    def _h_paths_info(self, req: _Request, repo_type: str, repo_id: str, rev: str) -> _Response:
        state = self._readable(req, repo_type, repo_id)
        files = self.store.load_commit(state, self._resolve_or_404(state, rev))["files"]
        if req.headers.get("Content-Type", "").startswith("application/json"):
            paths = req.json().get("paths", [])
        else:
            paths = parse_qs(req.body.decode(), keep_blank_values=True).get("paths", [])
        all_entries = {e["path"]: e for e in _tree_entries(files, "", recursive=True)}
        return _json([all_entries[p.strip("/")] for p in paths if p.strip("/") in all_entries])

    def _h_refs(self, req: _Request, repo_type: str, repo_id: str) -> _Response:
        state = self._readable(req, repo_type, repo_id)
        body: dict[str, Any] = {
            "branches": [{"name": b, "ref": f"refs/heads/{b}", "targetCommit": s}
                         for b, s in sorted(state["branches"].items())],
            "tags": [{"name": t, "ref": f"refs/tags/{t}", "targetCommit": s} for t, s in sorted(state["tags"].items())],
            "converts": [],
        }
        if req.param("include_prs") not in (None, "", "0", "false", "False"):
            body["pullRequests"] = [{"name": f"refs/pr/{n}", "ref": f"refs/pr/{n}", "targetCommit": s}
                                    for n, s in sorted(state["pulls"].items(), key=lambda kv: int(kv[0]))]
        else:
            body["pullRequests"] = []
        return _json(body)

    def _h_commits(self, req: _Request, repo_type: str, repo_id: str, rev: str) -> _Response:
        state = self._readable(req, repo_type, repo_id)
        commits = self.store.ancestors(state, self._resolve_or_404(state, rev))
        return _json([{"id": c["id"], "title": c["title"], "message": c["message"], "date": c["date"],
                       "parents": c["parents"],
                       "authors": [{"user": c["author"], "avatar": f"/avatars/{c['author']}.svg"}]} for c in commits])

    def _h_preupload(self, req: _Request, repo_type: str, repo_id: str, rev: str) -> _Response:
        state = self._readable(req, repo_type, repo_id)
        files = self.store.load_commit(state, self._resolve_or_404(state, rev))["files"]
        payload = req.json()
        return _json({"files": [
            {"path": f["path"], "uploadMode": "regular", "shouldIgnore": False,
             "oid": (files.get(f["path"]) or {}).get("oid")} for f in payload.get("files", [])
        ], "commitOid": self.store.resolve(state, rev)})

    def _h_commit(self, req: _Request, repo_type: str, repo_id: str, rev: str) -> _Response:
        state = self._readable(req, repo_type, repo_id)
        create_pr = req.param("create_pr") in ("1", "true", "True")
        user = self._require_write_role(req.user, "create a commit")
        pr = _PR_REF_RE.match(rev)
        if not create_pr and not pr:
            self._require_repo_write(user, state, "create a commit")
        header: dict[str, Any] = {}
        ops: list[tuple[str, str, bytes | None]] = []
        for line in req.body.splitlines():
            if not line.strip():
                continue
            try:
                item = json.loads(line)
                key, value = item["key"], item["value"]
            except (ValueError, KeyError, TypeError) as e:
                raise HubError(400, f"Invalid NDJSON commit payload: {e}") from None
            if key == "header":
                header = value
            elif key == "file":
                try:
                    content = value["content"]
                    data = base64.b64decode(content) if value.get("encoding") == "base64" else content.encode()
                except (KeyError, ValueError, AttributeError) as e:
                    raise HubError(400, f"Invalid file entry: {e}") from None
                ops.append(("file", value.get("path", ""), data))
            elif key in ("deletedFile", "deletedFolder"):
                ops.append((key, value.get("path", ""), None))
            else:
                ops.append((key, value.get("path", "") if isinstance(value, dict) else "", None))
        title = (header.get("summary") or "").strip()
        if not title:
            raise HubError(400, "Commit summary is required")

        def check(current: dict[str, Any]) -> None:
            if pr and not create_pr:
                discussion = current["discussions"].get(pr[1])
                if discussion is not None and discussion["author"] != user.user:
                    self._require_repo_write(user, current, "push to this pull request")

        result = self._apply_commit(repo_type, repo_id, rev, ops, title=title,
                                    description=header.get("description") or "", author=user.user,
                                    parent_commit=header.get("parentCommit"), create_pr=create_pr, check=check)
        repo_url = self.repo_url(repo_id, repo_type, req.base_url)
        return _json({"success": True, "commitOid": result["oid"], "commitUrl": f"{repo_url}/commit/{result['oid']}",
                      "commitMessage": title, "hookOutput": "",
                      "pullRequestUrl": f"{repo_url}/discussions/{result['pr_num']}" if result["pr_num"] else None})

    def _discussion_json(self, state: dict[str, Any], d: dict[str, Any], details: bool = False,
                         diff: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {
            "num": d["num"], "title": d["title"], "status": d["status"], "createdAt": d["createdAt"],
            "isPullRequest": d["isPullRequest"], "author": _user_json(d["author"]),
            "repo": {"name": state["id"], "type": state["type"]}, "pinned": False, "topReactions": [],
            "numComments": sum(1 for e in d["events"] if e["type"] == "comment"),
            "numReactionUsers": 0, "repoOwner": {"name": state["id"].split("/")[0], "type": "user"},
        }
        if details:
            out["events"] = [_event_json(e) for e in d["events"]]
            if d["isPullRequest"]:
                out["changes"] = {"base": f"refs/heads/{d['target']}", "headOid": state["pulls"][str(d["num"])]}
                if d.get("mergeCommitId"):
                    out["changes"]["mergeCommitId"] = d["mergeCommitId"]
                open_pr = d["status"] in ("open", "draft") and d["target"] in state["branches"]
                out["filesWithConflicts"] = self._conflicts(state, d) if open_pr else []
                if diff:
                    out["diff"] = self._diff(state, d)
        return out

    def _h_list_discussions(self, req: _Request, repo_type: str, repo_id: str) -> _Response:
        state = self._readable(req, repo_type, repo_id)
        kind, status, author = req.param("type") or "all", req.param("status") or "all", req.param("author")
        items = []
        for key in sorted(state["discussions"], key=int, reverse=True):
            d = state["discussions"][key]
            if (kind == "pull_request") != d["isPullRequest"] and kind != "all":
                continue
            if status != "all" and d["status"] != status:
                continue
            if author and d["author"] != author:
                continue
            items.append(self._discussion_json(state, d))
        page = int(req.param("p") or 0)
        start = page * _DISCUSSION_PAGE
        return _json({"discussions": items[start:start + _DISCUSSION_PAGE], "count": len(items), "start": start,
                      "numClosedDiscussions": sum(1 for d in state["discussions"].values() if d["status"] != "open")})

    def _h_discussion(self, req: _Request, repo_type: str, repo_id: str, num: str) -> _Response:
        state = self._readable(req, repo_type, repo_id)
        d = state["discussions"].get(num)
        if d is None:
            raise HubError(404, f"Discussion #{num} not found")
        return _json(self._discussion_json(state, d, details=True, diff=req.param("diff") is not None))

    def _h_create_discussion(self, req: _Request, repo_type: str, repo_id: str) -> _Response:
        self._readable(req, repo_type, repo_id)
        user = self._require_write_role(req.user, "open a discussion")
        body = req.json()
        title = (body.get("title") or "").strip()
        if len(title) < 3:
            raise HubError(400, "Title must be at least 3 characters long")
        is_pr = bool(body.get("pullRequest"))
        with self.store.locked():
            state = self._readable(req, repo_type, repo_id)
            num = str(state["next_num"])
            state["next_num"] += 1
            target = "main" if "main" in state["branches"] else next(iter(state["branches"]))
            base = state["branches"][target] if is_pr else None
            self._new_discussion(state, num, title, body.get("description") or "", user.user, is_pr=is_pr,
                                 status="draft" if is_pr else "open", target=target if is_pr else None, base=base)
            if is_pr:
                state["pulls"][num] = base
            self.store.save_state(state)
        url = f"{self.repo_url(repo_id, repo_type, req.base_url)}/discussions/{num}"
        return _json({"num": int(num), "pullRequest": is_pr, "url": url})

    def _h_discussion_change(self, req: _Request, repo_type: str, repo_id: str, num: str, action: str) -> _Response:
        self._readable(req, repo_type, repo_id)
        user = self._require_write_role(req.user, "change a discussion")
        body = req.json() if req.body.strip() else {}
        with self.store.locked():
            state = self._readable(req, repo_type, repo_id)
            d = state["discussions"].get(num)
            if d is None:
                raise HubError(404, f"Discussion #{num} not found")
            is_author = d["author"] == user.user
            if action == "comment":
                text = (body.get("comment") or "").strip()
                if not text:
                    raise HubError(400, "Comment must not be empty")
                event = self._comment_event(user.user, text)
                d["events"].append(event)
                key = "newMessage"
            elif action == "status":
                new_status = body.get("status")
                if new_status not in ("open", "closed"):
                    raise HubError(400, "Invalid status, valid statuses are: 'open' and 'closed'")
                if not is_author:
                    self._require_repo_write(user, state, "change the status of this discussion")
                if d["status"] == "merged":
                    raise HubError(400, "Cannot change the status of a merged pull request")
                if body.get("comment"):
                    d["events"].append(self._comment_event(user.user, body["comment"]))
                event = self._event("status-change", user.user, {"status": new_status})
                d["events"].append(event)
                d["status"] = new_status
                key = "newStatus"
            elif action == "title":
                new_title = (body.get("title") or "").strip()
                if len(new_title) < 3:
                    raise HubError(400, "Title must be at least 3 characters long")
                if not is_author:
                    self._require_repo_write(user, state, "rename this discussion")
                event = self._event("title-change", user.user, {"from": d["title"], "to": new_title})
                d["events"].append(event)
                d["title"] = new_title
                key = "newTitle"
            elif action == "merge":
                self._require_repo_write(user, state, "merge a pull request")
                if not d["isPullRequest"]:
                    raise HubError(400, f"#{num} is not a pull request")
                if d["status"] != "open":
                    raise HubError(400, f"Cannot merge pull request #{num}: its status is {d['status']!r}")
                self._merge(state, num, user.user, (body.get("comment") or "").strip() or None)
                self.store.save_state(state)
                return _json({"success": True, "mergeCommitId": d["mergeCommitId"]})
            elif m := re.fullmatch(r"comment/([0-9a-f]+)/(edit|hide)", action):
                event = next((e for e in d["events"] if e["id"] == m[1] and e["type"] == "comment"), None)
                if event is None:
                    raise HubError(404, f"Comment {m[1]} not found")
                if event["author"] != user.user:
                    self._require_repo_write(user, state, "edit this comment")
                if m[2] == "edit":
                    text = body.get("content") or ""
                    event["data"]["latest"] = {"raw": text, "html": f"<p>{html.escape(text)}</p>",
                                               "updatedAt": _now(), "author": user.user}
                    event["data"]["edited"] = True
                    event["data"]["numEdits"] += 1
                else:
                    event["data"]["hidden"] = True
                key = "updatedComment"
            else:
                raise HubError(404, f"Unknown discussion action {action!r}")
            self.store.save_state(state)
        return _json({key: _event_json(event)})

    def _h_branch(self, req: _Request, repo_type: str, repo_id: str, branch: str) -> _Response:
        self._readable(req, repo_type, repo_id)
        with self.store.locked():
            state = self._readable(req, repo_type, repo_id)
            self._require_repo_write(req.user, state, "manage branches")
            if req.method == "DELETE":
                if branch not in state["branches"]:
                    raise _revision_not_found(branch)
                if branch == "main":
                    raise HubError(403, "Cannot delete the default branch")
                del state["branches"][branch]
            else:
                if branch.startswith("refs/") or not _NAME_RE.match(branch.replace("/", "-")):
                    raise HubError(400, f"Invalid branch name: {branch!r}")
                if branch in state["branches"]:
                    raise HubError(409, f"Branch {branch!r} already exists")
                start = (req.json() if req.body.strip() else {}).get("startingPoint") or "main"
                state["branches"][branch] = self._resolve_or_404(state, start)
            self.store.save_state(state)
        return _json({"success": True})

    def _h_tag(self, req: _Request, repo_type: str, repo_id: str, rev: str) -> _Response:
        self._readable(req, repo_type, repo_id)
        with self.store.locked():
            state = self._readable(req, repo_type, repo_id)
            self._require_repo_write(req.user, state, "manage tags")
            if req.method == "DELETE":
                if rev not in state["tags"]:
                    raise _revision_not_found(rev)
                del state["tags"][rev]
            else:
                tag = (req.json().get("tag") or "").strip()
                if not tag or tag.startswith("refs/"):
                    raise HubError(400, f"Invalid tag name: {tag!r}")
                if tag in state["tags"]:
                    raise HubError(409, f"Tag {tag!r} already exists")
                state["tags"][tag] = self._resolve_or_404(state, rev)
            self.store.save_state(state)
        return _json({"success": True})

    def _h_settings(self, req: _Request, repo_type: str, repo_id: str) -> _Response:
        self._readable(req, repo_type, repo_id)
        body = req.json()
        with self.store.locked():
            state = self._readable(req, repo_type, repo_id)
            self._require_repo_write(req.user, state, "update settings")
            if "private" in body:
                state["private"] = bool(body["private"])
            if body.get("visibility") in ("private", "public", "protected"):
                state["private"] = body["visibility"] == "private"
            self.store.save_state(state)
        return _json({"success": True})

    def _h_create_repo(self, req: _Request) -> _Response:
        user = self._require_write_role(req.user, "create a repo")
        body = req.json()
        repo_type = body.get("type") or "model"
        if repo_type not in _PLURAL_BY_TYPE:
            raise HubError(400, f"Invalid repo type: {repo_type!r}")
        namespace = body.get("organization") or user.user
        repo_id = f"{namespace}/{body.get('name') or ''}"
        _split_repo_id(repo_id)
        if not self._is_member(user, namespace):
            raise HubError(403, f"You don't have the rights to create a repo under the namespace {namespace!r}")
        private = bool(body.get("private")) or body.get("visibility") == "private"
        url = self.repo_url(repo_id, repo_type, req.base_url)
        if not self.create_repo(repo_id, repo_type=repo_type, private=private, sdk=body.get("sdk")):
            raise HubError(409, f"You already created this {repo_type} repo", extra={"url": url})
        return _json({"url": url, "name": repo_id, "id": self.store.load_state(repo_type, repo_id)["uid"]})

    def _h_delete_repo(self, req: _Request) -> _Response:
        user = self._require_write_role(req.user, "delete a repo")
        body = req.json()
        repo_type = body.get("type") or "model"
        if repo_type not in _PLURAL_BY_TYPE:
            raise HubError(400, f"Invalid repo type: {repo_type!r}")
        repo_id = f"{body.get('organization') or user.user}/{body.get('name') or ''}"
        with self.store.locked():
            state = self._readable(req, repo_type, repo_id)
            self._require_repo_write(user, state, "delete this repo")
            shutil.rmtree(self.store.repo_dir(repo_type, repo_id))
        return _Response(200, b"", {"Content-Type": "text/plain"})

    def _h_resolve(self, req: _Request, repo_type: str, repo_id: str, rev: str, path: str) -> _Response:
        state = self._readable(req, repo_type, repo_id)
        sha = self._resolve_or_404(state, rev)
        files = self.store.load_commit(state, sha)["files"]
        if path not in files:
            raise HubError(404, f"Entry not found: {path}", "EntryNotFound", {"X-Repo-Commit": sha})
        info = files[path]
        size, blob = info["size"], self.store.blob_path(info["oid"])
        headers = {"X-Repo-Commit": sha, "ETag": f'"{info["oid"]}"', "Accept-Ranges": "bytes",
                   "Content-Type": "application/octet-stream",
                   "Content-Disposition": f"inline; filename*=UTF-8''{quote(path.rsplit('/', 1)[-1])}"}
        start, length, status = 0, size, 200
        if (spec := req.headers.get("Range")) and req.method == "GET":
            parsed = _parse_range(spec, size)
            if parsed is None:
                raise HubError(416, "Requested range not satisfiable", headers={"Content-Range": f"bytes */{size}",
                                                                                **headers})
            start, length, status = parsed[0], parsed[1] - parsed[0] + 1, 206
            headers["Content-Range"] = f"bytes {parsed[0]}-{parsed[1]}/{size}"
        headers["Content-Length"] = str(length)
        return _Response(status, b"", headers, file=(blob, start, length))


# ----------------------------------------------------------------------------------------------------------------------
# Jobs


JOB_HARDWARE = [  # what GET /api/jobs/hardware answers (the Hub's published CPU flavors; a local run uses this machine)
    {"name": "cpu-basic", "prettyName": "CPU Basic", "cpu": "2 vCPU", "ram": "16 GB", "ephemeralStorage": "50 GB",
     "accelerator": None, "unitCostMicroUSD": 167, "unitCostUSD": 0.000167, "unitLabel": "minute"},
    {"name": "cpu-upgrade", "prettyName": "CPU Upgrade", "cpu": "8 vCPU", "ram": "32 GB", "ephemeralStorage": "50 GB",
     "accelerator": None, "unitCostMicroUSD": 500, "unitCostUSD": 0.0005, "unitLabel": "minute"},
]
_TERMINAL = ("COMPLETED", "CANCELED", "ERROR", "DELETED")


class _Jobs:
    """Hugging Face Jobs on the local Hub: `POST /api/jobs/{namespace}` runs the Job's command as a local subprocess
    (a leading `python` is this interpreter, with hfexport importable: it stands for the Job's image), with its
    `environment` and `secrets` as environment variables and `HF_ENDPOINT` pointing back here; `GET .../{id}` is
    `inspect_job`, `GET .../{id}/logs` the log stream (SSE) `fetch_job_logs` reads, `POST .../{id}/cancel` kills it.
    Secret values are never answered back. `hub.jobs.started` lists (id, spec) for tests."""

    def __init__(self, hub: LocalHub):
        self.hub = hub
        self._lock = threading.Lock()
        self._jobs: dict[str, dict[str, Any]] = {}
        self.started: list[tuple[str, dict[str, Any]]] = []

    def route(self, method: str, rest: list[str]) -> tuple[str, Callable[[_Request], _Response]]:
        if rest == ["hardware"] and method == "GET":
            return "jobs_hardware", lambda req: _json(JOB_HARDWARE)
        if len(rest) == 1 and method == "POST":
            return "jobs_run", lambda req: self._run(req, rest[0])
        if len(rest) == 1 and method == "GET":
            return "jobs_list", lambda req: _json([self._info(job) for job in self._owned(req, rest[0])])
        if len(rest) == 2 and method == "GET":
            return "jobs_inspect", lambda req: _json(self._info(self._get(req, *rest)))
        if len(rest) == 3 and rest[2] == "logs" and method == "GET":
            return "jobs_logs", lambda req: self._logs(self._get(req, rest[0], rest[1]))
        if len(rest) == 3 and rest[2] == "cancel" and method == "POST":
            return "jobs_cancel", lambda req: self._cancel(self._get(req, rest[0], rest[1]))
        raise HubError(404, f"Not found: {method} /api/jobs/{'/'.join(rest)}")

    def _owned(self, req: _Request, namespace: str) -> list[dict[str, Any]]:
        if req.user is None:
            raise HubError(401, "Invalid credentials in Authorization header")
        if not self.hub._is_member(req.user, namespace):
            raise HubError(403, f"You cannot use the Jobs of {namespace!r}")
        with self._lock:
            return [job for job in self._jobs.values() if job["namespace"] == namespace]

    def _get(self, req: _Request, namespace: str, job_id: str) -> dict[str, Any]:
        for job in self._owned(req, namespace):
            if job["id"] == job_id:
                return job
        raise HubError(404, f"Job {job_id} not found")

    def _run(self, req: _Request, namespace: str) -> _Response:
        import subprocess

        self._owned(req, namespace)
        user = self.hub._require_write_role(req.user, "run a Job")
        spec = req.json()
        command = spec.get("command")
        if not isinstance(command, list) or not command or not all(isinstance(part, str) for part in command):
            raise HubError(400, "command: expected a non-empty list of strings")
        environment, secrets = spec.get("environment") or {}, spec.get("secrets") or {}
        if not isinstance(environment, dict) or not isinstance(secrets, dict):
            raise HubError(400, "environment and secrets: expected objects")
        flavor = spec.get("flavor") or "cpu-basic"
        if flavor not in {hardware["name"] for hardware in JOB_HARDWARE}:
            raise HubError(400, f"Unknown flavor {flavor!r}")
        job_id = uuid.uuid4().hex[:24]
        folder = self.hub.root / "jobs" / job_id
        folder.mkdir(parents=True)
        library = str(Path(__file__).resolve().parents[2])
        env = {**os.environ, **{k: str(v) for k, v in environment.items()}, **{k: str(v) for k, v in secrets.items()},
               "HF_ENDPOINT": self.hub.url, "JOB_ID": job_id,
               "PYTHONPATH": os.pathsep.join(filter(None, [library, os.environ.get("PYTHONPATH")]))}
        argv = [sys.executable, *command[1:]] if command[0] in ("python", "python3") else command
        log = open(folder / "log.txt", "wb")  # noqa: SIM115 - the child writes it; closed when it ends
        try:
            process = subprocess.Popen(argv, cwd=folder, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                       stderr=subprocess.STDOUT, start_new_session=True)
        except OSError as error:
            log.close()
            raise HubError(400, f"cannot start the Job's command: {error}") from None
        job = {"id": job_id, "namespace": namespace, "owner": user.user, "spec": spec, "flavor": flavor,
               "createdAt": _now(), "process": process, "log": log, "folder": folder, "canceled": False,
               "finishedAt": None, "started": time.monotonic(), "ended": None}
        threading.Thread(target=lambda: (process.wait(), job.__setitem__("ended", time.monotonic())),
                         daemon=True).start()  # when it really ended (benchmarks), whoever asks
        with self._lock:
            self._jobs[job_id] = job
            self.started.append((job_id, {k: v for k, v in spec.items() if k != "secrets"}))
        return _json(self._info(job))

    def _stage(self, job: dict[str, Any]) -> tuple[str, str | None]:
        code = job["process"].poll()
        if code is None:
            return "RUNNING", None
        if job["finishedAt"] is None:
            job["finishedAt"] = _now()
            job["log"].close()
        if job["canceled"]:
            return "CANCELED", "canceled"
        return ("COMPLETED", None) if code == 0 else ("ERROR", f"exit code {code}")

    def _info(self, job: dict[str, Any]) -> dict[str, Any]:
        stage, message = self._stage(job)
        spec = job["spec"]
        return {"id": job["id"], "createdAt": job["createdAt"], "startedAt": job["createdAt"],
                "finishedAt": job["finishedAt"], "dockerImage": spec.get("dockerImage"), "spaceId": spec.get("spaceId"),
                "owner": {"id": hashlib.sha1(job["owner"].encode()).hexdigest()[:24], "name": job["owner"],
                          "type": "user"},
                "command": spec.get("command"), "arguments": spec.get("arguments") or [],
                "environment": spec.get("environment") or {}, "secrets": sorted(spec.get("secrets") or {}),
                "flavor": job["flavor"], "labels": spec.get("labels") or {},
                "status": {"stage": stage, "message": message}}

    def _logs(self, job: dict[str, Any]) -> _Response:
        self._stage(job)
        text = (job["folder"] / "log.txt").read_bytes().decode("utf-8", "replace")
        events = [{"timestamp": job["createdAt"], "data": line} for line in ["===== Job started =====",
                                                                             *text.splitlines()]]
        body = "".join(f"data: {json.dumps(event)}\n\n" for event in events).encode()
        return _Response(200, body, {"Content-Type": "text/event-stream"})

    def _cancel(self, job: dict[str, Any]) -> _Response:
        if job["process"].poll() is None:
            job["canceled"] = True
            with contextlib.suppress(OSError):
                os.killpg(job["process"].pid, signal.SIGKILL)
            job["process"].wait(30)
        return _json({"success": True})

    def cancel_all(self) -> None:
        with self._lock:
            jobs = list(self._jobs.values())
        for job in jobs:
            self._cancel(job)
            self._stage(job)


def _parse_range(spec: str, size: int) -> tuple[int, int] | None:
    m = re.fullmatch(r"\s*bytes\s*=\s*(\d*)\s*-\s*(\d*)\s*", spec)
    if not m or (not m[1] and not m[2]):
        return None
    if not m[1]:
        suffix = int(m[2])
        if suffix == 0:
            return None
        return max(0, size - suffix), size - 1
    start = int(m[1])
    end = min(int(m[2]), size - 1) if m[2] else size - 1
    if start >= size or end < start:
        return None
    return start, end


def _take_revision(segs: list[str], greedy: bool = False) -> tuple[str, list[str]]:
    """Split raw path segments into (revision, rest); accepts `refs%2Fpr%2F1` as well as unencoded `refs/pr/1`."""
    if greedy:
        return "/".join(unquote(s) for s in segs), []
    first = unquote(segs[0])
    if first == "refs" and len(segs) >= 3 and segs[1] in ("pr", "heads", "tags", "convert"):
        return f"refs/{segs[1]}/{unquote(segs[2])}", segs[3:]
    return first, segs[1:]


def _collect_files(files: str | os.PathLike[str] | Mapping[str, bytes | str | os.PathLike[str]]) -> dict[str, bytes]:
    if isinstance(files, Mapping):
        out = {}
        for path, data in files.items():
            if isinstance(data, bytes):
                out[path] = data
            elif isinstance(data, str):
                out[path] = data.encode()
            else:
                out[path] = Path(data).read_bytes()
        return out
    folder = Path(files)
    if not folder.is_dir():
        raise NotADirectoryError(folder)
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and ".git" not in p.relative_to(folder).parts}


class _Request:
    def __init__(self, method: str, query: dict[str, list[str]], headers: Any, base_url: str):
        self.method, self.query, self.headers, self.base_url = method, query, headers, base_url
        self.body = b""
        self.user: Token | None = None

    def param(self, name: str) -> str | None:
        values = self.query.get(name)
        return values[-1] if values else None

    def json(self) -> dict[str, Any]:
        try:
            value = json.loads(self.body or b"{}")
        except ValueError as e:
            raise HubError(400, f"Invalid JSON body: {e}") from None
        if not isinstance(value, dict):
            raise HubError(400, "JSON body must be an object")
        return value


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "hfexport-localhub/1"

    def do_GET(self) -> None:
        self._handle("GET")

    def do_HEAD(self) -> None:
        self._handle("HEAD")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_PUT(self) -> None:
        self._handle("PUT")

    def do_DELETE(self) -> None:
        self._handle("DELETE")

    def do_PATCH(self) -> None:
        self._handle("PATCH")

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        if self.server.hub.verbose:  # type: ignore[attr-defined]
            super().log_message(format, *args)

    def _handle(self, method: str) -> None:
        hub: LocalHub = self.server.hub  # type: ignore[attr-defined]
        split = urlsplit(self.path)
        segs = split.path.split("/")[1:]
        while segs and segs[-1] == "":
            segs.pop()
        host = self.headers.get("Host") or f"{hub.host}:{hub.port}"
        req = _Request(method, parse_qs(split.query, keep_blank_values=True), self.headers, f"http://{host}")
        fault: str | int | None = None
        try:
            try:
                endpoint, handler = hub._route(method, segs)
            except HubError:
                self._read_body()
                raise
            fault = hub._take_fault(endpoint, split.path)
            if fault == "drop":
                self._drop(read_half=True)
                hub.requests.append((method, self.path, 0))
                return
            req.body = self._read_body()
            if fault == "timeout":
                threading.Event().wait(hub.timeout_s)
                self._drop(read_half=False)
                hub.requests.append((method, self.path, 0))
                return
            if fault == "error" or isinstance(fault, int):
                status = 500 if fault == "error" else int(fault)
                raise HubError(status, f"Injected fault ({status})")
            req.user = hub._authenticate(self.headers.get("Authorization"))
            response = handler(req)
            if fault == "drop_after_apply":
                self._drop(read_half=False)
                hub.requests.append((method, self.path, 0))
                return
        except HubError as e:
            response = e.response()
        except Exception as e:  # a bug in the server: answer 500 with the reason, keep serving
            response = HubError(500, f"Local hub internal error: {type(e).__name__}: {e}").response()
            if hub.verbose:
                import traceback

                traceback.print_exc()
        hub.requests.append((method, self.path, response.status))
        del hub.requests[:-1000]
        self._send(response, method)

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _drop(self, read_half: bool) -> None:
        """Close the connection without answering (after reading at most half the body if `read_half`)."""
        if read_half:
            length = int(self.headers.get("Content-Length") or 0)
            if length > 1:
                self.rfile.read(length // 2)
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.wfile.flush()
            self.connection.shutdown(2)  # socket.SHUT_RDWR

    def _send(self, response: _Response, method: str) -> None:
        self.send_response(response.status)
        headers = dict(response.headers)
        headers.setdefault("Content-Length", str(len(response.body)))
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()
        if method == "HEAD":
            return
        if response.file is not None:
            path, offset, length = response.file
            with open(path, "rb") as f:
                f.seek(offset)
                remaining = length
                while remaining > 0:
                    chunk = f.read(min(1 << 20, remaining))
                    if not chunk:
                        break
                    self.wfile.write(chunk)
                    remaining -= len(chunk)
        else:
            self.wfile.write(response.body)


# ----------------------------------------------------------------------------------------------------------------------
# pytest integration and CLI


def make_fixture(scope: str = "function", **hub_kwargs: Any) -> Any:
    """Build a pytest fixture yielding a started `LocalHub` on a temporary root (kwargs go to `LocalHub`).

    In a conftest: `local_hub = make_fixture()` or `hub_session = make_fixture(scope="session", strict=True)`.
    """
    import pytest

    @pytest.fixture(scope=scope)
    def _local_hub(tmp_path_factory: Any) -> Iterator[LocalHub]:
        with LocalHub(tmp_path_factory.mktemp("localhub"), **hub_kwargs) as hub:
            yield hub

    return _local_hub


def __getattr__(name: str) -> Any:
    # `from hfexport.testing.hub import local_hub` gives a function-scoped fixture without importing pytest eagerly.
    if name == "local_hub":
        return make_fixture()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main(argv: list[str] | None = None) -> int:
    """Command line: serve a root directory until interrupted; prints the base URL first."""
    parser = argparse.ArgumentParser(prog="python -m hfexport.testing.hub", description=__doc__.splitlines()[0])
    parser.add_argument("--root", required=True, help="directory holding the repos (created if missing)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--token", action="append", default=[], metavar="USER=VALUE[:read|write[:org1,org2]]",
                        help=f"accepted token (repeatable); default: {DEFAULT_USER}={DEFAULT_WRITE_TOKEN}:write and "
                             f"{DEFAULT_USER}={DEFAULT_READ_TOKEN}:read")
    parser.add_argument("--strict", action="store_true", help="only namespace owners/org members may write")
    parser.add_argument("--mock-oauth-user", default=None,
                        help=f"user that Gradio's mock OAuth token {GRADIO_MOCK_OAUTH_TOKEN!r} maps to "
                             "(default: first write token's user; 'none' disables it)")
    parser.add_argument("--seed", action="append", default=[], metavar="[TYPE:]REPO_ID=FOLDER",
                        help="commit a folder into a repo before serving (TYPE: model, dataset or space)")
    parser.add_argument("--verbose", action="store_true", help="log every request to stderr")
    args = parser.parse_args(argv)

    mock_user: str | bool | None = args.mock_oauth_user
    if isinstance(mock_user, str) and mock_user.lower() == "none":
        mock_user = False
    hub = LocalHub(args.root, tokens=[Token.parse(t) for t in args.token] or None, host=args.host, port=args.port,
                   strict=args.strict, mock_oauth_user=mock_user, verbose=args.verbose)
    for spec in args.seed:
        target, _, folder = spec.partition("=")
        repo_type, _, repo_id = target.rpartition(":")
        hub.seed_repo(repo_id, folder, repo_type=repo_type or "model")
    print(hub.start(), flush=True)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        stop.wait()
    finally:
        hub.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
