"""The README's client snippet, copied verbatim from README.md, runs against a stack started
the way the README says: its ``regionbus stack`` command line exactly as written, from the
repository's root, with no other option (so its default ``--data-dir``, a relative path,
is the one used), configured only by the variables the stack prints.

The conventional ports are held during the test, so it runs the same way whether or not
9092 is free on the machine: the stack must say it moved, and the printed variables must
be enough. That the stack takes a free preferred port is
``test_stack.py::test_a_service_takes_its_preferred_port_when_free_and_another_when_taken``.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from readme_commands import (
    README,
    REPOSITORY,
    fresh_default_stack_dir,
    readme_stack_command,
)

from regionbus.devstack.local import (
    CONVENTIONAL_KAFKA_PORT,
    CONVENTIONAL_REDIS_PORT,
    DEPRECATED_ENV_VARS,
)

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
def conventional_ports_taken() -> Iterator[None]:
    """Keep Kafka's and Redis' conventional ports taken (bound, not listening) for the
    test, so the stack must move to others whatever else runs on the machine. A port
    something else already listens on is taken as it is.

    The holder binds with SO_REUSEADDR: a service an earlier test ran on the port leaves
    its connections in TIME_WAIT for up to 60 s, which refuses a plain bind, and that
    TIME_WAIT could end before the stack probes the port, which it would then take. A
    bound holder, even with SO_REUSEADDR, still refuses the stack's plain probe."""
    with contextlib.ExitStack() as held:
        for port in (CONVENTIONAL_KAFKA_PORT, CONVENTIONAL_REDIS_PORT):
            holder = held.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            with contextlib.suppress(OSError):
                holder.bind(("127.0.0.1", port))
        yield


@pytest.fixture
def stack_exports(conventional_ports_taken: None) -> Iterator[tuple[dict[str, str], list[str]]]:
    """Run the README's ``regionbus stack`` command line as written, from the repository's
    root, on a fresh default data dir; yield the variables it printed to export and its
    stderr, once it says it is running; stop it with Ctrl-C."""
    with fresh_default_stack_dir() as data_dir:
        yield from _run_readme_stack(data_dir)


def _run_readme_stack(data_dir: Path) -> Iterator[tuple[dict[str, str], list[str]]]:
    process = subprocess.Popen(
        readme_stack_command(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_without_regionbus_env(),
        cwd=REPOSITORY,
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
        # The relative default data dir is resolved once, against the repository's root.
        said = "".join(stderr_lines)
        assert f"data in {data_dir}" in said, said
        assert (data_dir / "kafka" / "data" / "meta.properties").is_file()
        yield exports, stderr_lines
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _run_snippet(
    snippet: str, exports: dict[str, str], cwd: Path
) -> subprocess.CompletedProcess[str]:
    """Run a README snippet in a fresh interpreter configured only by the stack's exports."""
    return subprocess.run(
        [sys.executable, "-c", snippet],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        env={**_without_regionbus_env(), **exports},
        cwd=cwd,
        timeout=_SNIPPET_TIMEOUT_S,
        check=False,
    )


@pytest.mark.timeout(_STACK_START_TIMEOUT_S + _SNIPPET_TIMEOUT_S + 60)
def test_the_readme_client_snippet_runs_as_written_against_regionbus_stack(
    stack_exports: tuple[dict[str, str], list[str]], tmp_path: Path
) -> None:
    exports, stderr_lines = stack_exports
    assert set(exports) == _EXPECTED_EXPORTS
    # 9092 and 6379 are taken: the stack says so, and the exports carry the other ports.
    said = "".join(stderr_lines)
    assert "port 9092 is taken, so kafka runs on another port" in said
    assert "port 6379 is taken, so redis runs on another port" in said
    assert not exports["REGIONBUS_KAFKA_BOOTSTRAP_SERVERS"].endswith(":9092")
    snippet = readme_snippet()
    assert "ClientCache(" in snippet

    ran = _run_snippet(snippet, exports, tmp_path)

    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.splitlines() == [
        "created UA-1545-EWR-2013-01-01 {'dep_delay': 2}",
        "{'dep_delay': 2}",
    ], ran.stderr


@pytest.mark.timeout(_STACK_START_TIMEOUT_S + _SNIPPET_TIMEOUT_S + 60)
def test_the_readme_continuous_query_snippet_runs_as_written_against_regionbus_stack(
    stack_exports: tuple[dict[str, str], list[str]], tmp_path: Path
) -> None:
    exports, _ = stack_exports
    snippet = readme_snippet("## Continuous queries")
    assert "new_cq(" in snippet

    ran = _run_snippet(snippet, exports, tmp_path)

    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.splitlines() == [
        "['B6-725-JFK-2013-01-01']",
        "UPDATE B6-725-JFK-2013-01-01 {'dep_delay': 90}",
        "DESTROY B6-725-JFK-2013-01-01 {'dep_delay': 30}",
        "CqStatistics(events=2, inserts=0, updates=1, deletes=1)",
    ], ran.stderr
