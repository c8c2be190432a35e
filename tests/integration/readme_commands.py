"""Command lines as README.md gives them, and the repository folder they run from.

The tests that run a README command take it from here, so the README and the tests cannot
drift apart: a command edited in the README is the command the tests run.
"""

from __future__ import annotations

import re
import secrets
import shlex
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[2]
README = REPOSITORY / "README.md"
STACK_DATA_DIR = REPOSITORY / ".regionbus" / "stack"
"""``regionbus stack``'s default ``--data-dir``, as the README's command resolves it."""

_INLINE_CODE = re.compile(r"`([^`\n]+)`")


def readme_text() -> str:
    """README.md's text."""
    return README.read_text()


def readme_stack_command() -> list[str]:
    """The ``regionbus stack`` command line of the README's "A client in a few lines", as
    arguments (``shlex``), exactly as written there.

    Raises:
        AssertionError: the section gives no such command.
    """
    text = readme_text()
    start = text.index("\n## A client in a few lines\n")
    end = text.index("\n## ", start + 1)
    for code in _INLINE_CODE.findall(text[start:end]):
        argv = shlex.split(code)
        if len(argv) >= 2 and argv[0].endswith("regionbus") and argv[1] == "stack":
            return argv
    raise AssertionError("README's 'A client in a few lines' gives no regionbus stack command")


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
