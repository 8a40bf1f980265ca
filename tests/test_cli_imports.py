"""`hfexport show` and `validate` read the recipe only, so they import neither torch, transformers nor the job stack
(job, publication, report): each command imports what it runs (benchmarks/show.py measures the difference)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MODEL = str(ROOT / "examples" / "tiny-bert")
HEAVY = ("torch", "transformers", "hfexport.job", "hfexport.publication", "hfexport.report", "hfexport.surfaces.ci",
         "hfexport.export", "hfexport.plan")

RUN = """
import json, sys
from hfexport.surfaces.cli import main
code = main(sys.argv[1:])
print(json.dumps({"code": code, "modules": sorted(sys.modules)}), file=sys.stderr)
"""


def _imported(*argv: str) -> tuple[int, list[str]]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "library") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    result = subprocess.run([sys.executable, "-c", RUN, *argv], env=env, capture_output=True, text=True, timeout=120)
    answer = json.loads(result.stderr.strip().splitlines()[-1])
    return answer["code"], answer["modules"]


@pytest.mark.parametrize("argv", [("show", MODEL), ("validate", MODEL), ("validate", MODEL, "--json"),
                                  ("validate", MODEL, "--format", "github")])
def test_show_and_validate_import_only_what_they_run(argv):
    code, modules = _imported(*argv)
    assert code == 0
    heavy = [name for name in modules if name.split(".")[0] in HEAVY or name.startswith(HEAVY)]
    assert not heavy, f"hfexport {' '.join(argv[:1])} imported {heavy}"


def test_the_check_sees_the_job_stack():
    """The test above can fail: `hfexport report` runs the report module, and it shows up."""
    code, modules = _imported("report", str(ROOT / "does-not-exist"))
    assert code != 0
    assert "hfexport.report.data" in modules
