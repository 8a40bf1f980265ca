"""Write docs/architecture.md's table of upstream workarounds from the registry (`hfexport.workarounds.WORKAROUNDS`).

usage: python scripts/workarounds_table.py   (tests/test_workarounds.py fails while the table and the registry differ)
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "library"))

from hfexport.workarounds import WORKAROUNDS, markdown_table  # noqa: E402

DOC = ROOT / "docs" / "architecture.md"
HEADER = "| workaround |"


def table_lines(lines: list[str]) -> tuple[int, int]:
    """(first, end) of the workarounds table in `lines`: its header row to its last row."""
    first = next(index for index, line in enumerate(lines) if line.startswith(HEADER))
    end = first
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    return first, end


if __name__ == "__main__":
    lines = DOC.read_text().splitlines(keepends=True)
    first, end = table_lines(lines)
    lines[first:end] = [markdown_table(WORKAROUNDS)]
    DOC.write_text("".join(lines))
