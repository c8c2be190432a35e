"""The README's and the user documents' code blocks and links, as written, and the repository
folder they run from.

The tests that run a README command or snippet take it from here, so the README and the
tests cannot drift apart: a command edited in the README is the command the tests run.
"""

from __future__ import annotations

import re
import secrets
import shlex
import shutil
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPOSITORY = Path(__file__).resolve().parents[2]
README = REPOSITORY / "README.md"
USER_DOCUMENTS = (README, *sorted((REPOSITORY / "docs").glob("*.md")))
"""What a user reads: the README and docs/. Their shell lines are all run or checked."""
QUICKSTART = REPOSITORY / "examples" / "quickstart.py"
STACK_DATA_DIR = REPOSITORY / ".regionbus" / "stack"
"""``regionbus stack``'s default ``--data-dir``, as the README's command resolves it."""

_FENCE = re.compile(r"^([ \t]*)```(\w*)\n(.*?)^[ \t]*```[ \t]*$", re.MULTILINE | re.DOTALL)


@dataclass(frozen=True)
class Block:
    """One fenced code block of a Markdown document.

    Attributes:
        document: The file.
        language: The fence's info string (``"python"``, ``"bash"``, ``""``...).
        text: The block's lines, dedented by the fence's own indentation.
        section: The heading (``## ...`` or deeper) it is under.
        start: Its offset in the document's text.
    """

    document: Path
    language: str
    text: str
    section: str
    start: int


def blocks(document: Path = README) -> list[Block]:
    """Every fenced code block of ``document``, in order."""
    text = document.read_text()
    headings = [(m.start(), m.group(1)) for m in re.finditer(r"^#{1,6} (.*)$", text, re.M)]
    found = []
    for match in _FENCE.finditer(text):
        indent = match.group(1)
        body = "".join(
            line[len(indent) :] if line.startswith(indent) else line
            for line in match.group(3).splitlines(keepends=True)
        )
        section = next((h for at, h in reversed(headings) if at < match.start()), "")
        found.append(Block(document, match.group(2), body, section, match.start()))
    return found


def readme_text() -> str:
    """README.md's text."""
    return README.read_text()


def python_block(section: str, document: Path = README) -> Block:
    """The first ``python`` block under the heading ``section``.

    Raises:
        AssertionError: the section has none.
    """
    for block in blocks(document):
        if block.language == "python" and block.section == section:
            return block
    raise AssertionError(f"no python block under {section!r} in {document.name}")


def block_containing(document: Path, text: str, language: str = "python") -> Block:
    """The one ``language`` block of ``document`` that holds ``text``.

    Raises:
        AssertionError: none does, or more than one.
    """
    found = [b for b in blocks(document) if b.language == language and text in b.text]
    assert len(found) == 1, f"{len(found)} {language} blocks of {document.name} hold {text!r}"
    return found[0]


def run_python(
    block: Block, replacements: Mapping[str, str], scope: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Run a Python block as written but for ``replacements`` (a broker address, topic
    names: each must occur in it), in a copy of ``scope``; return the names it left.

    Raises:
        AssertionError: a text to replace is not in the block.
    """
    source = block.text
    for old, new in replacements.items():
        assert old in source, f"{block.document.name} ({block.section}) no longer says {old}"
        source = source.replace(old, new)
    names = dict(scope or {})
    exec(compile(source, f"{block.document.name}: {block.section}", "exec"), names)
    return names


def output_after(block: Block) -> list[str]:
    """The lines of the ``text`` block that follows ``block``: what the document says it
    prints.

    Raises:
        AssertionError: the next block is not a ``text`` block.
    """
    following = [b for b in blocks(block.document) if b.start > block.start]
    assert following and following[0].language == "text", f"no output after {block.section}"
    return following[0].text.splitlines()


def quickstart_source() -> str:
    """examples/quickstart.py without its module docstring: what the README shows."""
    source = QUICKSTART.read_text()
    assert source.startswith('"""')
    return source.split('"""', 2)[2].lstrip("\n")


def regionbus_program() -> str:
    """The ``regionbus`` entry point of the interpreter running the tests, which a README
    line's ``regionbus`` or ``.venv/bin/regionbus`` stands for."""
    return str(Path(sys.executable).parent / "regionbus")


def readme_stack_command() -> list[str]:
    """The ``regionbus stack`` command line of the README's "The two commands", as
    arguments (``shlex``), exactly as written there but for the program, which is this
    interpreter's ``regionbus``.

    Raises:
        AssertionError: the section gives no such command.
    """
    for block in blocks(README):
        if block.section != "The two commands" or block.language != "bash":
            continue
        for line in block.text.splitlines():
            argv = shlex.split(line, comments=True)
            if len(argv) >= 2 and argv[0].endswith("regionbus") and argv[1] == "stack":
                return [regionbus_program(), *argv[1:]]
    raise AssertionError("README's 'The two commands' gives no regionbus stack command")


@contextmanager
def fresh_default_stack_dir() -> Iterator[Path]:
    """Make ``.regionbus/stack`` of the checkout absent for the body, then remove what the
    body left there and put back what was there before (a developer's own stack data)."""
    kept: Path | None = None
    if STACK_DATA_DIR.exists():
        kept = STACK_DATA_DIR.with_name(f"stack.kept-{secrets.token_hex(3)}")
        STACK_DATA_DIR.rename(kept)
    try:
        yield STACK_DATA_DIR
    finally:
        shutil.rmtree(STACK_DATA_DIR, ignore_errors=True)
        if kept is not None:
            kept.rename(STACK_DATA_DIR)
