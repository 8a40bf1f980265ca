"""The README's code blocks, as the tests run them: exactly what users read."""

from __future__ import annotations

from pathlib import Path

README = Path(__file__).resolve().parents[3] / "README.md"


def readme_blocks(marker: str) -> dict[str, str]:
    """The README's code blocks right after `<!-- marker -->`, by language (`bash`, `python`)."""
    text = README.read_text().split(f"<!-- {marker} -->\n", 1)[1]
    blocks = {}
    while text.startswith("```"):
        language, rest = text[3:].split("\n", 1)
        blocks[language], text = rest.split("```\n", 1)
    return blocks


def readme_snippet(marker: str) -> str:
    """The README's first Python code block after `<!-- marker -->`."""
    block = README.read_text().split(f"<!-- {marker} -->", 1)[1].split("```python\n", 1)[1]
    return block.split("```", 1)[0]
