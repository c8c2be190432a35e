"""The documents a user reads (README.md, docs/, and every other Markdown file of the
repository): every link resolves inside the repository, heading anchors included; every
code block of the README is of a kind a test runs; the user documents' Python blocks
compile and their TOML blocks name settings that exist; the README stays short, with a
table of contents; and nothing cites a document a clone does not have.

No process is started here; the blocks run in test_readme_commands.py and
test_readme_snippet.py.
"""

from __future__ import annotations

import re
import subprocess
import tomllib
import unicodedata
from pathlib import Path

import pytest
import yaml
from readme_commands import README, REPOSITORY, USER_DOCUMENTS, blocks

from regionbus.schemas.settings import SECTIONS, settings_class

_LINK = re.compile(r"(?<!\!)\[[^\]]*\]\(([^)\s]+)\)")
_INLINE_CODE = re.compile(r"`[^`\n]*`")
_README_MAX_WORDS = 3_000


def _markdown_files() -> list[Path]:
    tracked = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.md"],
        cwd=REPOSITORY,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return sorted({REPOSITORY / name for name in tracked} | set(USER_DOCUMENTS))


def _prose(path: Path) -> str:
    """A Markdown file's text without its code blocks and inline code (no links there)."""
    text = path.read_text()
    for block in blocks(path):
        text = text.replace(block.text, "")
    return _INLINE_CODE.sub("", text)


def anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to
    hyphens."""
    text = heading.strip().lower()
    kept = [c for c in text if c in " -_" or unicodedata.category(c)[0] in ("L", "N")]
    return "".join(kept).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = path.read_text()
    for block in blocks(path):
        text = text.replace(block.text, "")
    found: set[str] = set()
    for heading in re.findall(r"^#{1,6} (.+)$", text, re.MULTILINE):
        base = anchor(heading.replace("`", ""))
        name, n = base, 0
        while name in found:
            n += 1
            name = f"{base}-{n}"
        found.add(name)
    return found


@pytest.mark.parametrize(
    "document", _markdown_files(), ids=lambda p: str(p.relative_to(REPOSITORY))
)
def test_every_link_resolves_inside_the_repository(document: Path) -> None:
    broken = []
    for target in _LINK.findall(_prose(document)):
        path_part, _, fragment = target.partition("#")
        if re.match(r"[a-z][a-z0-9+.-]*:", path_part):
            broken.append(f"{target}: leaves the repository")
            continue
        resolved = (document.parent / path_part).resolve() if path_part else document
        if not resolved.is_relative_to(REPOSITORY) or not resolved.exists():
            broken.append(f"{target}: no such file in the repository")
        elif fragment and resolved.suffix == ".md" and fragment not in _anchors(resolved):
            broken.append(f"{target}: no heading #{fragment} in {resolved.name}")
    assert broken == []


def test_the_anchor_rule_is_githubs() -> None:
    assert anchor("Scaling out: Redis Cluster, a Kafka cluster, a Spark cluster") == (
        "scaling-out-redis-cluster-a-kafka-cluster-a-spark-cluster"
    )
    assert anchor("1. Regions, entries, operations") == "1-regions-entries-operations"
    assert anchor("The compose check on this project's machines") == (
        "the-compose-check-on-this-projects-machines"
    )


def test_every_readme_block_is_of_a_kind_a_test_runs() -> None:
    """bash: every line run or checked (test_readme_commands.py); python: the quickstart
    and the continuous query, run against the stack, each followed by the ``text`` block it
    prints (test_readme_snippet.py); toml: the configuration file config show reads."""
    found = blocks(README)
    kinds = [b.language for b in found]
    assert set(kinds) == {"bash", "python", "text", "toml"}, kinds
    python = [b.section for b in found if b.language == "python"]
    assert python == ["Quickstart with Docker", "A continuous query"]
    for i, block in enumerate(found):
        if block.language == "text":
            assert found[i - 1].language == "python", "a text block that is no output"
        if block.language == "python":
            assert found[i + 1].language == "text", f"{block.section}: no output shown"
    assert kinds.count("toml") == 1


@pytest.mark.parametrize("document", USER_DOCUMENTS, ids=lambda p: p.name)
def test_the_python_blocks_compile_and_the_toml_blocks_name_settings(document: Path) -> None:
    """Python compiles, TOML names settings that exist, YAML (Kubernetes probes) parses."""
    for block in blocks(document):
        if block.language == "python":
            compile(block.text, f"{document.name}: {block.section}", "exec")
        if block.language == "toml":
            tables = tomllib.loads(block.text)
            for section, values in tables.items():
                assert section in SECTIONS, f"{document.name}: [{section}]"
                fields = settings_class(section).model_fields
                assert set(values) <= set(fields), f"{document.name}: {sorted(values)}"
        if block.language == "yaml":
            assert yaml.safe_load(block.text), f"{document.name}: {block.section}"
        assert block.language in ("bash", "python", "text", "toml", "yaml"), block.language


def test_the_readme_is_short_and_lists_its_sections() -> None:
    text = README.read_text()
    words = len(_prose(README).split())
    assert words <= _README_MAX_WORDS, f"{words} words"
    sections = re.findall(r"^## (.+)$", text, re.MULTILINE)
    contents = text.split("## Contents\n", 1)[1].split("\n## ", 1)[0]
    listed = re.findall(r"\]\(#([^)]+)\)", contents)
    assert listed == [anchor(s) for s in sections if s != "Contents"]


def test_nothing_cites_a_document_a_clone_does_not_have() -> None:
    spec = "SPEC " + "§"
    shared = "../" + "shared/"
    seed = re.compile(r"\bseed " + r"00\d")
    offenders = []
    for folder in ("src", "tests", "bench", "scripts", "docs", "examples"):
        for path in (REPOSITORY / folder).rglob("*"):
            if (
                path.is_file()
                and not path.is_symlink()
                and path.suffix in (".py", ".md", ".lua", ".sh")
            ):
                text = path.read_text()
                if spec in text or shared in text or seed.search(text):
                    offenders.append(str(path.relative_to(REPOSITORY)))
    for path in (README, REPOSITORY / "CHANGELOG.md"):
        if spec in path.read_text() or shared in path.read_text():
            offenders.append(path.name)
    assert offenders == []
