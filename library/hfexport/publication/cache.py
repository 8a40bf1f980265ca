"""Cache keys: whether a target needs exporting again.

A target's key hashes what decides its artifacts: the source model's files (`source.content_hash`: the sha256 of
each config and weight file, of a local folder or at a Hub revision — the same files give the same hash either way;
not the repo's commit, which publishing the exports into the same repo would change), the target's canonical recipe
hash
(`Recipe.target_hash`), and the versions of hfexport, the engine (transformers, torch) and the target's backend
packages. `lookup` finds a previous export with the same key in OUTPUT (`OUTPUT/<target>/export_report.json`) or
published in a Hub repo (`exports/<target>/export_report.json` at the open hfexport PR's head, then the branch),
before any weights are loaded.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from hfexport.errors import HfExportError
from hfexport.files import MANIFEST_FILE, REPORT_FILE, file_sha256, git_blob_sha1, write_json_atomic
from hfexport.formats import format_traits
from hfexport.formats.programs import format_program
from hfexport.hub import HubRepo
from hfexport.layout import export_folders, in_export_folder, published_name, target_places
from hfexport.publication.publish import find_open_publication
from hfexport.recipe.data import Target
from hfexport.recipe.validation import sha256_of
from hfexport.report.data import JobReport, TargetReport

KEY_VERSION = 1
CORE_PACKAGES = ("hfexport", "transformers", "torch")


QUANTIZATION_PACKAGES = {
    "ort_dynamic": ("onnxruntime",),
    "ort_static": ("onnxruntime",),
    "nncf_weights": ("nncf",),
    "nncf_quantize": ("nncf",),
    "pt2e": ("torchao",),
}


SOURCE_FILE_NAMES = ("config.json", "generation_config.json")
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")


def is_source_file(path: str, export_folders: set[str] = frozenset()) -> bool:
    """Files whose content decides an export: configs and weights (not the README, the recipe, nor a published
    target's own files: `exports/**` and the files of each folder in `export_folders`, those holding an
    `export.json`, such as `openvino/openvino_model.bin`)."""

    name = path.rsplit("/", 1)[-1]
    return not in_export_folder(path, set(export_folders)) and (name in SOURCE_FILE_NAMES or name.endswith(WEIGHT_SUFFIXES))


def _files_hash(entries: list[list[str]]) -> str:
    return hashlib.sha256(json.dumps(sorted(entries)).encode()).hexdigest()


def local_content_hash(folder: Path) -> str:
    """sha256 over a local model folder's configs and weights: [relative path, sha256 of the file] pairs."""

    files = {file.relative_to(folder).as_posix(): file for file in folder.rglob("*")
             if file.is_file() and not file.name.startswith(".")}
    published = export_folders(files)
    return _files_hash([[path, file_sha256(file)] for path, file in files.items() if is_source_file(path, published)])


def hub_content_hash(repo_id: str, commit: str, siblings, token: str | None = None) -> str:
    """`local_content_hash` of a Hub revision, without downloading LFS files: the Hub gives their sha256; the
    others (small by the Hub's rules: configs, tiny weights) are downloaded into the cache and hashed once, the
    sha256 remembered by git blob id (which names the content) in `HF_HOME/hfexport/sha256-by-blob.json`."""
    repo = HubRepo(repo_id, commit, token)
    entries, known, learned = [], _blob_digests(), {}
    published = export_folders(sibling.rfilename for sibling in siblings or [])
    for sibling in siblings or []:
        if not is_source_file(sibling.rfilename, published):
            continue
        lfs = getattr(sibling, "lfs", None)
        digest = getattr(lfs, "sha256", None) or (lfs.get("sha256") if isinstance(lfs, dict) else None)
        blob = getattr(sibling, "blob_id", None)
        if not digest and blob in known:
            digest = known[blob]
        if not digest:
            path = repo.download(sibling.rfilename, required=True)
            digest = file_sha256(path)
            if blob and git_blob_sha1(path) == blob:  # remember only what was verified to be that blob
                learned[blob] = digest
        entries.append([sibling.rfilename, digest])
    if learned:
        _remember_blob_digests(learned)
    return _files_hash(entries)


def _digest_file() -> Path:
    from huggingface_hub import constants

    return Path(constants.HF_HOME) / "hfexport" / "sha256-by-blob.json"


def _blob_digests() -> dict[str, str]:
    try:
        data = json.loads(_digest_file().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _remember_blob_digests(learned: dict[str, str]) -> None:

    try:
        write_json_atomic(_digest_file(), json.dumps({**_blob_digests(), **learned}, sort_keys=True))
    except OSError:
        pass  # a read-only cache only costs the hashing next time


def target_packages(target: Target) -> tuple[str, ...]:
    names = [*CORE_PACKAGES, *format_traits(target.export_format).packages]  # each format's `packages`
    method = (target.quantization or {}).get("method")
    names += QUANTIZATION_PACKAGES.get(method, ())
    return tuple(dict.fromkeys(names))


def cache_key(source: dict, target: Target, target_hash: str, packages: dict[str, str]) -> str | None:
    """The key of one target's export; None when the source has no content identity (nothing to compare)."""
    identity = source.get("content_hash") or source.get("commit")
    if not identity:
        return None
    return sha256_of({
        "key_version": KEY_VERSION,
        "source": identity,
        "recipe_target": target_hash,
        "packages": {name: packages.get(name) for name in target_packages(target)},
    })


@dataclass
class CacheHit:
    """A previous export with the same key: where it is, and a sentence saying why nothing is exported."""

    where: str
    reason: str
    report: TargetReport


def find_local(output: Path, name: str, key: str) -> CacheHit | None:
    """`OUTPUT/<name>` exported with the same key, with status ok and every listed file present at its size."""
    folder = output / name
    try:
        previous = JobReport.read(folder).targets.get(name)
    except Exception:  # noqa: BLE001 - no report, or an unreadable one: not a hit
        return None
    if previous is None or previous.cache_key != key or previous.status != "ok":
        return None
    for entry in previous.files:
        file = folder / entry["path"]
        if not file.is_file() or file.stat().st_size != entry["bytes"]:
            return None
    return CacheHit(str(folder), f"{folder} holds an export with the same cache key (same model files, recipe "
                                 "target and package versions)", previous)


def find_published(repo_id: str, name: str, key: str, revisions: list[str], token: str | None) -> CacheHit | None:
    """Target `name`'s `export_report.json` where a publication put it (hfexport.layout: `onnx/`, ..., or an older
    publication's `exports/<name>/`; a variant's `<stem>.export_report.json`) at one of `revisions` of `repo_id`, with
    the same key and status ok. A Hub that cannot be read gives no hit (the target is exported), never a wrong one."""
    for revision in revisions:
        repo = HubRepo(repo_id, revision, token)
        try:
            place = target_places(set(repo.files()), repo.read_text).get(name)
            if place is None:
                continue
            previous = JobReport.from_dict(json.loads(repo.read_text(place.path(REPORT_FILE), required=True))
                                           ).targets.get(name)
        except Exception:  # noqa: BLE001 - absent, private, unreachable or unreadable: not a hit
            continue
        if previous is not None and previous.cache_key == key and previous.status == "ok":
            return CacheHit(f"{repo_id}@{revision}", f"already published in {repo_id}@{revision} ({place.label()}) with "
                                                     "the same cache key", previous)
    return None


def published_revisions(repo_id: str, token: str | None, base: str = "main") -> list[str]:
    """Where a repo's published exports may be: the open hfexport PR's head, then `base`."""
    try:
        open_pr = find_open_publication(repo_id, base, token)
    except HfExportError:  # no access to discussions: the branch alone
        open_pr = None
    return ([f"refs/pr/{open_pr.num}"] if open_pr else []) + [base]


def lookup(output: Path, keys: dict[str, str | None], repos: list[str], token: str | None) -> dict[str, CacheHit]:
    """The targets of `keys` that need no export: found in OUTPUT first, then in each repo's published exports."""
    hits: dict[str, CacheHit] = {}
    for name, key in keys.items():
        if key and (hit := find_local(output, name, key)):
            hits[name] = hit
    missing = [name for name, key in keys.items() if key and name not in hits]
    for repo_id in dict.fromkeys(repos):
        if not missing:
            break
        revisions = published_revisions(repo_id, token)
        for name in list(missing):
            if hit := find_published(repo_id, name, keys[name], revisions, token):
                hits[name] = hit
                missing.remove(name)
    return hits


def fetch_published_export(repos: list[str], name: str, key: str, destination: Path, token: str | None) -> str | None:
    """Download target `name`'s published export whose weight map has rebind key `key` (hfexport.rebind) from the
    first of `repos` that has one (its open hfexport PR's head, then its branch) into `destination`, under the names
    the job saves (`published_name` undone: `X.onnx_data` back to `X.onnx.data`, a variant's stem dropped), so it
    reads as `OUTPUT/<name>/` would. Returns where it came from (`repo@revision`), or None (also when the Hub cannot
    be read: the target is then exported in full)."""
    for repo_id in dict.fromkeys(repos):
        for revision in published_revisions(repo_id, token):
            repo = HubRepo(repo_id, revision, token)
            try:
                files = set(repo.files())
                place = target_places(files, repo.read_text).get(name)
                if place is None or place.manifest not in files:
                    continue
                manifest = json.loads(repo.read_text(place.manifest, required=True))
                if (manifest.get("weight_map") or {}).get("rebind_key") != key:
                    continue
                report_text = repo.read_text(place.path(REPORT_FILE), required=True)
                previous = JobReport.from_dict(json.loads(report_text)).targets.get(name)
            except Exception:  # noqa: BLE001 - absent, private, unreachable or unreadable: not a source
                continue
            if previous is None or previous.status != "ok":
                continue
            if _download_target(repo_id, revision, place, previous, destination, token):
                write_json_atomic(destination / REPORT_FILE, report_text)
                return f"{repo_id}@{revision}"
    return None


def _download_target(repo_id: str, revision: str, place, previous: TargetReport, destination: Path,
                     token: str | None) -> bool:
    """The files of a published target into `destination` under their local names; False if any is missing."""
    repo = HubRepo(repo_id, revision, token)
    export_format = previous.export_format
    names = {entry["path"]: published_name(place, entry["path"], export_format) for entry in previous.files}
    local_of = {published: local for local, published in names.items()}
    destination.mkdir(parents=True, exist_ok=True)
    try:
        for local, published in names.items():
            path = f"{place.folder}/{published}" if place.folder else published
            file = repo.download(path, required=True)
            (destination / local).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(file, destination / local)
    except (HfExportError, OSError):  # a file that cannot be downloaded: not a source
        return False
    manifest = json.loads((destination / MANIFEST_FILE).read_text(encoding="utf-8"))
    for entry in manifest.get("components", {}).values():
        entry["file"] = local_of.get(entry["file"], entry["file"])
    write_json_atomic(destination / MANIFEST_FILE, json.dumps(manifest, indent=2) + "\n")
    format_program(export_format).localize(destination, local_of)  # ONNX: graphs name their data as the job saved it
    return True
