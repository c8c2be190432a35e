"""The README's snippets, copied verbatim from README.md, run against a stack started the
way the README says: its ``regionbus stack`` command line exactly as written, from the
repository's root, with no other option (so its default ``--data-dir``, a relative path,
is the one used), configured only by the variables the stack prints. Each prints what the
README's ``text`` block after it says. The quickstart is also examples/quickstart.py, which
``scripts/compose-check.sh`` runs against the real compose stack.

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
    REPOSITORY,
    fresh_default_stack_dir,
    output_after,
    python_block,
    quickstart_source,
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


def _without_regionbus_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("REGIONBUS_")}
    for old in DEPRECATED_ENV_VARS.values():
        env.pop(old, None)
    return env


@pytest.fixture(scope="module")
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


@pytest.fixture(scope="module")
def stack_exports(conventional_ports_taken: None) -> Iterator[tuple[dict[str, str], list[str]]]:
    """Run the README's ``regionbus stack`` command line as written, from the repository's
    root, on a fresh default data dir; yield the variables it printed to export and its
    stderr, once it says it is running; stop it with Ctrl-C. One stack for the module: the
    snippets use keys of their own."""
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
def test_the_readme_quickstart_runs_as_written_against_regionbus_stack(
    stack_exports: tuple[dict[str, str], list[str]], tmp_path: Path
) -> None:
    exports, stderr_lines = stack_exports
    assert set(exports) == _EXPECTED_EXPORTS
    # 9092 and 6379 are taken: the stack says so, and the exports carry the other ports.
    said = "".join(stderr_lines)
    assert "port 9092 is taken, so kafka runs on another port" in said
    assert "port 6379 is taken, so redis runs on another port" in said
    assert not exports["REGIONBUS_KAFKA_BOOTSTRAP_SERVERS"].endswith(":9092")
    block = python_block("Quickstart with Docker")
    assert block.text == quickstart_source(), "README's quickstart is not examples/quickstart.py"

    ran = _run_snippet(block.text, exports, tmp_path)

    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.splitlines() == output_after(block), ran.stderr
    assert ran.stdout.splitlines() == [
        "desk heard: created UA-1545-EWR-2013-01-01 {'dep_delay': 2}",
        "writer reads {'dep_delay': 2}",
    ]


@pytest.mark.timeout(_STACK_START_TIMEOUT_S + _SNIPPET_TIMEOUT_S + 60)
def test_the_readme_continuous_query_snippet_runs_as_written_against_regionbus_stack(
    stack_exports: tuple[dict[str, str], list[str]], tmp_path: Path
) -> None:
    exports, _ = stack_exports
    block = python_block("A continuous query")
    assert "new_cq(" in block.text

    ran = _run_snippet(block.text, exports, tmp_path)

    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.splitlines() == output_after(block), ran.stderr
    assert len(output_after(block)) == 4


@pytest.mark.timeout(_STACK_START_TIMEOUT_S + _SNIPPET_TIMEOUT_S + 60)
def test_the_client_guide_first_snippet_runs_as_written_against_regionbus_stack(
    stack_exports: tuple[dict[str, str], list[str]], tmp_path: Path
) -> None:
    exports, _ = stack_exports
    block = python_block("A client cache and its regions", REPOSITORY / "docs" / "client.md")

    ran = _run_snippet(block.text, exports, tmp_path)

    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.splitlines() == [
        "created UA-1696-EWR-2013-01-01 {'dep_delay': 2}",
        "{'dep_delay': 2}",
    ], ran.stderr
