"""The card's YAML header keeps the owner's bytes (issue 14): hfexport adds its tags and `base_model` as lines, every
owner line kept byte for byte (comments, quoting, key order, CRLF), and the result reads, with huggingface_hub's
`ModelCard`, as exactly the metadata huggingface_hub's own rewrite would give. Headers that cannot be edited by adding
lines (flow-style or scalar `tags`) get huggingface_hub's rewrite, with the same metadata.
"""

from __future__ import annotations

import pytest
from hfexport.report.card import END, START, header_with, update_card

SECTION = f"{START}\nthe section\n{END}"
TAGS = ["hfexport", "onnx", "openvino"]


def _expected(readme: str, base_model: str | None) -> dict:
    """What huggingface_hub's own edit of the metadata gives: the owner's keys, the tags merged, base_model set."""
    from huggingface_hub import ModelCard

    card = ModelCard(readme, ignore_metadata_errors=True)
    existing = list(card.data.tags or [])
    card.data.tags = existing + [tag for tag in TAGS if tag not in existing]
    if base_model and not card.data.get("base_model"):
        card.data.base_model = base_model
    return card.data.to_dict()


def _metadata(readme: str) -> dict:
    from huggingface_hub import ModelCard

    return ModelCard(readme, ignore_metadata_errors=True).data.to_dict()


def _header(readme: str) -> str:
    from huggingface_hub import ModelCard

    return readme[: len(readme) - len(ModelCard(readme, ignore_metadata_errors=True).text)]


HEADERS = {
    "comments-crlf-quoted": (
        "---\r\n# the owner's comment\r\nlicense: \"apache-2.0\"  # quoted, with a comment\r\nlanguage:\r\n"
        "  - en\r\n  - 'fr'\r\ntags:\r\n  - 'sentence-transformers'\r\n  - feature-extraction # why\r\n"
        "pipeline_tag: sentence-similarity\r\n---\r\n# Model\r\n\r\nBody.\r\n"),
    "odd-order-no-tags": (
        "---\nwidget:\n- text: \"Hello: world\"\nmodel-index: null\nlicense: mit\n# trailing comment\n---\nbody\n"),
    "zero-indent-tags-last": "---\nlicense: mit\ntags:\n- bert\n- \"a: b\"\n---\n\nText\n",
    "empty-tags-key": "---\ntags:\nlicense: mit\n---\nText\n",
    "header-only": "---\nlicense: mit\n---",
}


@pytest.mark.parametrize("base_model", [None, "org/base-model"])
@pytest.mark.parametrize("name", sorted(HEADERS))
def test_every_owner_line_is_kept_and_the_metadata_is_huggingface_hubs(name, base_model):
    readme = HEADERS[name]
    result = update_card(readme, SECTION, TAGS, base_model=base_model)
    header = _header(result)
    owner = _header(readme)
    lines = owner.splitlines(keepends=True)
    if not lines[-1].endswith(("\n", "\r")):
        lines[-1] += "\n"  # a README that ends at its closing `---`: a line break follows it now
    kept = iter(header.splitlines(keepends=True))
    for line in lines:  # each owner line, byte for byte and in order (hfexport's lines only come in between)
        assert any(candidate == line for candidate in kept), (line, header)
    added = [line for line in header.splitlines(keepends=True) if line not in lines]
    assert all(line.rstrip("\r\n") in {"tags:", *(f"{indent}- {tag}" for indent in ("", "  ") for tag in TAGS),
                                        f"base_model: {base_model}"} for line in added), added
    newline = "\r\n" if "\r\n" in readme else "\n"
    assert all(line.endswith(newline) for line in header.splitlines(keepends=True)), header
    assert _metadata(result) == _expected(readme, base_model)
    assert result.endswith(SECTION.replace("\n", newline) + newline)
    assert result[len(header):].startswith(readme[len(owner):])  # the body too, byte for byte


def test_the_tags_go_into_the_owners_list_in_its_indentation():
    readme = HEADERS["comments-crlf-quoted"]
    header = _header(update_card(readme, SECTION, TAGS))
    assert ("tags:\r\n  - 'sentence-transformers'\r\n  - feature-extraction # why\r\n  - hfexport\r\n  - onnx\r\n"
            "  - openvino\r\npipeline_tag:") in header


def test_an_unchanged_header_is_not_touched():
    readme = "---\nlicense: mit\ntags: [hfexport, onnx, openvino]   # flow style, already complete\n---\nbody\n"
    result = update_card(readme, SECTION, TAGS)
    assert result.startswith(_header(readme))


@pytest.mark.parametrize("readme", [
    "---\nlicense: mit\ntags: [bert, 'x']\n---\nbody\n",  # flow style
    "---\ntags: bert\n---\nbody\n",  # a scalar
])
def test_a_header_that_cannot_take_lines_gets_huggingface_hubs_rewrite(readme):
    from huggingface_hub import ModelCard

    assert header_with(_header(readme), ["hfexport"], None) is None
    result = update_card(readme, SECTION, TAGS)
    card = ModelCard(readme, ignore_metadata_errors=True)
    assert _metadata(result) == _expected(readme, None)
    assert result.endswith(card.text + "\n" + SECTION + "\n")


def test_a_card_without_header_gets_one():
    result = update_card("# Just text\r\n", SECTION, TAGS, base_model="org/m")
    assert _metadata(result) == {"tags": TAGS, "base_model": "org/m"}
    assert "# Just text\r\n" in result
