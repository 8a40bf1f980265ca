"""Reports: what a job did, per target, as JSON validated against `schemas/export_report.schema.json`.

One `JobReport` holds a `TargetReport` per target. `OUTPUT/<target>/export_report.json` holds the job's
source, packages and that target alone; `OUTPUT/export_report.json` holds the whole job. Verification results
slot into `TargetReport.verification`. Markdown rendering (for PRs, job summaries, the Space):
`hfexport.report.markdown.report_markdown`.
"""

from __future__ import annotations

import datetime as _dt
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from hfexport.errors import HfExportError, redact
from hfexport.files import REPORT_FILE
from hfexport.schema import load_schema
from hfexport.version import __version__

PACKAGES = ("hfexport", "transformers", "torch", "huggingface_hub", "onnx", "onnxscript", "onnxruntime", "openvino",
            "executorch", "nncf", "torchao")


def package_versions() -> dict[str, str]:
    """Installed versions of hfexport, the engine and the backends (absent packages left out)."""
    from importlib import metadata

    versions = {}
    for name in PACKAGES:
        if name == "hfexport":  # the source's own: an editable install's metadata keeps the version it was installed at
            versions[name] = __version__
            continue
        try:
            versions[name] = metadata.version(name.replace("_", "-"))
        except metadata.PackageNotFoundError:
            pass
    return versions


@dataclass
class TargetReport:
    target: str
    export_format: str
    mode: str
    status: str = "ok"
    error: str | None = None
    recipe_target_sha256: str = ""
    cache_key: str | None = None
    unchanged_reason: str | None = None
    method: str = "export"  # "rebind": the previous export's graphs with this checkpoint's weights (hfexport.rebind)
    rebind: dict | None = None  # {"from", "seconds", "fallback", "bytes_written"}: the rebind tried, and why it fell back
    plan: dict | None = None
    # per component, what transformers' export input preparers computed from the sample inputs (Plan.prepared_inputs)
    prepared_inputs: dict | None = None
    # the person's own sample files the job was given (hfexport.samples: name, size, pixels or seconds; never a path),
    # which stood in the recipe's synthesized images or clips for tracing and every check; None: all synthesized
    sample_files: list[dict] | None = None
    files: list[dict] = field(default_factory=list)
    total_bytes: int = 0
    timings: dict[str, float] = field(default_factory=dict)
    verification: dict | None = None
    quantization: dict | None = None
    latency: dict | None = None  # hfexport.latency: artifact vs eager torch per batch size, on the verifying machine
    runtimes: list[dict] = field(default_factory=list)  # hfexport.deployment: RuntimeCheck.to_dict() per runtime
    variants: list[dict] = field(default_factory=list)  # hfexport.verify.variants: each variant made and its gate
    memory: dict | None = None  # hfexport.job.memory: peak RSS per stage of this target (MB), where it was measured

    def to_dict(self) -> dict:
        data = asdict(self)
        if data["error"]:
            data["error"] = redact(data["error"])
        return data

    @classmethod
    def from_dict(cls, data: dict) -> TargetReport:
        return cls(**data)  # reports written before `runtimes` existed read with an empty list (the default)


@dataclass
class JobReport:
    source: dict
    targets: dict[str, TargetReport] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    packages: dict[str, str] = field(default_factory=package_versions)
    created_at: str = field(default_factory=lambda: _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"))
    peak_rss_mb: float | None = None
    hfexport_version: str = __version__
    # hfexport.job.memory: the job's own stages' peak RSS (loading), the preflight's estimate per stage, the budget
    memory: dict | None = None

    @property
    def status(self) -> str:
        """error if any target could not export, else failed if any failed a check, else ok (or unchanged)."""
        statuses = [report.status for report in self.targets.values()]
        for status in ("error", "failed"):
            if status in statuses:
                return status
        if statuses and all(status == "unchanged" for status in statuses):
            return "unchanged"
        return "ok"

    @property
    def changed(self) -> bool:
        """Whether any target was (re-)exported (False when every target was a cache hit)."""
        return any(report.status != "unchanged" for report in self.targets.values())

    def to_dict(self, only: str | None = None) -> dict:
        targets = {name: report.to_dict() for name, report in self.targets.items() if only in (None, name)}
        data = {
            "report_version": 1,
            "hfexport_version": self.hfexport_version,
            "created_at": self.created_at,
            "status": self.status if only is None else self.targets[only].status,
            "source": self.source,
            "packages": self.packages,
            "timings": self.timings,
            "peak_rss_mb": self.peak_rss_mb,
            "targets": targets,
        }
        if self.memory is not None:
            data["memory"] = self.memory
        validate_report(data)
        return data

    def to_json(self, only: str | None = None) -> str:
        return json.dumps(self.to_dict(only), indent=2, sort_keys=False) + "\n"

    @classmethod
    def from_dict(cls, data: dict) -> JobReport:
        validate_report(data)
        return cls(
            source=data["source"],
            targets={name: TargetReport.from_dict(value) for name, value in data["targets"].items()},
            timings=data.get("timings", {}),
            packages=data.get("packages", {}),
            created_at=data["created_at"],
            peak_rss_mb=data.get("peak_rss_mb"),
            hfexport_version=data["hfexport_version"],
            memory=data.get("memory"),
        )

    @classmethod
    def read(cls, path: str | Path) -> JobReport:
        """A report from `OUTPUT/export_report.json`, `OUTPUT/<target>/export_report.json`, or their folder."""
        path = Path(path)
        if path.is_dir():
            path = path / REPORT_FILE
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            raise HfExportError(f"cannot read a report from {path}: {error}") from None
        return cls.from_dict(data)


def validate_report(data: dict) -> None:
    """Raise if `data` does not match the report schema (a bug in hfexport, never the user's input)."""
    from jsonschema import Draft202012Validator


    errors = list(Draft202012Validator(load_schema("export_report")).iter_errors(data))
    if errors:
        first = errors[0]
        path = ".".join(map(str, first.absolute_path)) or "$"
        raise ValueError(f"report does not match its schema at {path}: {first.message}")
