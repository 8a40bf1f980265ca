"""Running a job on Hugging Face Jobs instead of in this process: the hardware it needs, and the Job's life.

The receiver's `hf-jobs` executor dispatches each export as a Job through huggingface_hub's client (`run_job`,
`inspect_job`, `fetch_job_logs`, `cancel_job`): the Job runs `python -m hfexport.surfaces.webhook --job` in an image
with hfexport installed, reads its settings from `HFEXPORT_JOB` and the token from the `HF_TOKEN` secret (never an
environment variable or an argument, so the Hub never shows it), exports and publishes itself. The flavor is the
cheapest CPU machine the Hub lists (`list_jobs_hardware`) whose memory holds the preflight's estimate for the recipe's
targets (its largest stage: `job.preflight.loaded_stages`).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass

from hfexport.errors import HfExportError, first_line, redact
from hfexport.job.preflight import loaded_bytes, loaded_stages, weights_metadata
from hfexport.job.run import select_targets
from hfexport.progress import Step
from hfexport.recipe.loading import load_recipe

JOB_COMMAND = ["python", "-m", "hfexport.surfaces.webhook", "--job"]
SPEC_ENV = "HFEXPORT_JOB"
RESULT_PREFIX = "hfexport-job-result: "  # the Job's last stdout line: its outcome as JSON
STEP_PREFIX = "hfexport-job-step: "  # a progress `Step` of the Job, as JSON, one line each
TERMINAL = ("COMPLETED", "CANCELED", "ERROR", "DELETED")
_SIZE = re.compile(r"^\s*([\d.]+)\s*([KMGT]?)i?B\s*$", re.I)


@dataclass
class Flavor:
    """The hardware chosen for a Job, and why."""

    name: str
    memory_needed: int | None
    ram: int | None

    def describe(self) -> str:
        if self.memory_needed is None:
            return f"{self.name} (no estimate)"
        return f"{self.name} ({self.memory_needed / 2**30:.1f} GiB estimated, {self.ram / 2**30:.0f} GiB there)" \
            if self.ram else f"{self.name} ({self.memory_needed / 2**30:.1f} GiB estimated)"


def _bytes(text: str | None) -> int | None:
    match = _SIZE.match(text or "")
    if not match:
        return None
    return int(float(match[1]) * 1000 ** " KMGT".index(match[2].upper() or " "))


def estimate_memory(repo_id: str, revision: str, targets: list[str] | None, token: str | None) -> int:
    """The preflight's memory estimate for exporting `targets` (None: all) of `repo_id` at `revision` in one
    process, its largest stage's (`preflight.loaded_stages`: the load, the export, a target's variants made and gated;
    reads the recipe and the weights' sizes from the Hub; loads nothing)."""
    recipe = load_recipe(repo_id, revision=revision, token=token)
    chosen = [recipe.target(name) for name in select_targets(recipe, targets, targets is None)]
    return max(loaded_stages(chosen, loaded_bytes(*weights_metadata(repo_id, revision, token))).values())


def job_result(lines: Iterable[str]) -> dict | None:
    """The outcome a Job printed (its last `RESULT_PREFIX` line, as a dict), or None when it printed none."""
    found = [line[len(RESULT_PREFIX):] for line in lines if line.startswith(RESULT_PREFIX)]
    try:
        result = json.loads(found[-1]) if found else None
    except ValueError:
        return None
    return result if isinstance(result, dict) else None


def print_step(step) -> None:
    """A Job's progress callback: each `Step` (not the heartbeats) as one `STEP_PREFIX` line of its logs."""
    if step.status != "running":
        print(STEP_PREFIX + json.dumps(dataclasses.asdict(step)), flush=True)


def job_steps(lines: Iterable[str]) -> tuple[list[Step], list[str]]:
    """A Job's logs split into its progress `Step`s and its other lines."""
    steps, other = [], []
    for line in lines:
        if line.startswith(STEP_PREFIX):
            try:
                steps.append(Step(**json.loads(line[len(STEP_PREFIX):])))
                continue
            except (ValueError, TypeError):
                pass
        other.append(line)
    return steps, other


def choose_flavor(memory: int | None, hardware: Iterable) -> Flavor:
    """The cheapest CPU flavor (`JobHardwareInfo`s) whose RAM holds `memory` bytes; the largest CPU one when none
    does (the Job's own preflight then says it does not fit); cpu-basic without an estimate."""
    cpus = sorted(((item, _bytes(item.ram)) for item in hardware if item.accelerator is None and _bytes(item.ram)),
                  key=lambda pair: (pair[0].unit_cost_micro_usd, pair[1]))
    if not cpus:
        return Flavor("cpu-basic", memory, None)
    if memory is None:
        return Flavor(cpus[0][0].name, None, cpus[0][1])
    fits = [(item, ram) for item, ram in cpus if ram >= memory]
    item, ram = fits[0] if fits else max(cpus, key=lambda pair: pair[1])
    return Flavor(item.name, memory, ram)


class HfJobs:
    """One namespace's Hugging Face Jobs, through huggingface_hub's client (HF_ENDPOINT decides which Hub)."""

    def __init__(self, token: str | None, namespace: str | None = None, image: str = "", timeout: str | None = None):
        from huggingface_hub import HfApi

        self.api = HfApi(token=token)
        self.token = token
        self.namespace = namespace or self.api.whoami(token=token)["name"]
        self.image = image
        self.timeout = timeout

    def flavor(self, repo_id: str, revision: str, targets: list[str] | None) -> Flavor:
        try:
            memory = estimate_memory(repo_id, revision, targets, self.token)
        except HfExportError:
            memory = None  # no recipe, an unreadable repo: the Job says so itself, on the smallest machine
        return choose_flavor(memory, self.api.list_jobs_hardware(token=self.token))

    def run(self, spec: dict, flavor: str, labels: dict[str, str]) -> str:
        """Start the Job for one export; its id."""
        info = self.api.run_job(image=self.image, command=JOB_COMMAND, env={SPEC_ENV: json.dumps(spec)},
                                secrets={"HF_TOKEN": self.token} if self.token else None, flavor=flavor,
                                timeout=self.timeout, labels=labels, namespace=self.namespace, token=self.token)
        return info.id

    def stage(self, job_id: str) -> tuple[str, str | None]:
        status = self.api.inspect_job(job_id=job_id, namespace=self.namespace, token=self.token).status
        return str(getattr(status.stage, "value", status.stage)), status.message

    def logs(self, job_id: str) -> list[str]:
        """What the Job printed so far (redacted; never blocks while it runs)."""
        try:
            return [redact(line) for line in self.api.fetch_job_logs(job_id=job_id, namespace=self.namespace,
                                                                       token=self.token)]
        except Exception as error:  # noqa: BLE001 - logs are a courtesy: say why they are missing
            return [f"(logs unavailable: {first_line(error)})"]

    def cancel(self, job_id: str) -> None:
        self.api.cancel_job(job_id=job_id, namespace=self.namespace, token=self.token)
