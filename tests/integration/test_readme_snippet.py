"""The README's client snippet, copied verbatim from README.md, runs against a stack started
the way the README says (``regionbus stack --region flights``), configured only by the
variables the stack prints."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from devstack.local import DEPRECATED_ENV_VARS

README = Path(__file__).resolve().parents[2] / "README.md"
_STACK_START_TIMEOUT_S = 180.0
"""Kafka's JVM takes 3 s on a quiet machine and about 30 s on a loaded one."""
_SNIPPET_TIMEOUT_S = 120.0
_EXPECTED_EXPORTS = frozenset(
    {"REGIONBUS_NAMESPACE", "REGIONBUS_KAFKA_BOOTSTRAP_SERVERS", "REGIONBUS_REDIS_URL"}
)
_EXPORT = re.compile(r"^export (REGIONBUS_[A-Z_]+)=(.*)$")


def readme_snippet(section: str = "## A client in a few lines") -> str:
    """The first fenced ``python`` block after the heading ``section`` in README.md."""
    text = README.read_text()
    start = text.index(f"\n{section}\n")
    found = re.compile(r"^```python\n(.*?)^```$", re.MULTILINE | re.DOTALL).search(text, start)
    assert found is not None, f"no python block after {section!r}"
    return found.group(1)


def _without_regionbus_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("REGIONBUS_")}
    for old in DEPRECATED_ENV_VARS.values():
        env.pop(old, None)
    return env


@pytest.fixture
def stack_exports(tmp_path: Path) -> Iterator[dict[str, str]]:
    """Run ``regionbus stack --region flights`` on a fresh data dir; yield the variables it
    printed to export, once it says it is running; stop it with Ctrl-C (SIGINT)."""
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "broker",
            "stack",
            "--region",
            "flights",
            "--data-dir",
            str(tmp_path / "stack"),
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_without_regionbus_env(),
        cwd=tmp_path,
    )
    exports: dict[str, str] = {}
    stderr_lines: list[str] = []
    running = threading.Event()

    def read_stdout() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            found = _EXPORT.match(line.strip())
            if found:
                exports[found[1]] = found[2]

    def read_stderr() -> None:
        assert process.stderr is not None
        for line in process.stderr:
            stderr_lines.append(line)
            if line.startswith("stack running"):
                running.set()

    readers = [threading.Thread(target=f, daemon=True) for f in (read_stdout, read_stderr)]
    for reader in readers:
        reader.start()
    try:
        deadline = time.monotonic() + _STACK_START_TIMEOUT_S
        # stdout and stderr are read on two threads: "running" may come before the exports.
        while not (running.wait(0.5) and len(exports) == len(_EXPECTED_EXPORTS)):
            assert process.poll() is None, "stack exited:\n" + "".join(stderr_lines[-40:])
            assert time.monotonic() < deadline, "stack not running:\n" + "".join(stderr_lines[-40:])
        yield exports
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.mark.timeout(_STACK_START_TIMEOUT_S + _SNIPPET_TIMEOUT_S + 60)
def test_the_readme_client_snippet_runs_as_written_against_regionbus_stack(
    stack_exports: dict[str, str], tmp_path: Path
) -> None:
    assert set(stack_exports) == _EXPECTED_EXPORTS
    snippet = readme_snippet()
    assert "ClientCache(" in snippet

    ran = subprocess.run(
        [sys.executable, "-c", snippet],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        env={**_without_regionbus_env(), **stack_exports},
        cwd=tmp_path,
        timeout=_SNIPPET_TIMEOUT_S,
        check=False,
    )

    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.splitlines() == [
        "created UA-1545-EWR-2013-01-01 {'dep_delay': 2}",
        "{'dep_delay': 2}",
    ], ran.stderr
