"""``regionbus demo flights`` with its output redirected (no terminal, so no progress bar)
prints progress lines and names the folder where its server's log stays."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from regionbus.runtime.heartbeat import DEFAULT_INTERVAL_S

_PROGRESS_LINE = re.compile(r"^\[\d+:\d\d:\d\d\] (?P<status>.+)$", re.MULTILINE)
_DEMO_TIMEOUT_S = 300


@pytest.mark.timeout(_DEMO_TIMEOUT_S + 60)
def test_the_demo_redirected_to_a_file_prints_progress_and_keeps_its_logs(
    kafka_bootstrap_servers: str, redis_url: str, namespace: str, tmp_path: Path
) -> None:
    output = tmp_path / "demo.out"
    env = {k: v for k, v in os.environ.items() if not k.startswith("REGIONBUS_")}
    env["REGIONBUS_KAFKA_BOOTSTRAP_SERVERS"] = kafka_bootstrap_servers
    env["REGIONBUS_REDIS_URL"] = redis_url
    with output.open("w") as out:
        ran = subprocess.run(
            [
                sys.executable,
                "-m",
                "regionbus",
                "demo",
                "flights",
                "--days",
                "3",
                "--namespace",
                namespace,
                "--progress-interval-s",
                "1",
                "--log-dir",
                str(tmp_path / "logs"),
            ],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=tmp_path,
            timeout=_DEMO_TIMEOUT_S,
            check=False,
        )
    text = output.read_text()

    assert ran.returncode == 0, text
    assert "MISMATCH" not in text
    progress = [m["status"] for m in _PROGRESS_LINE.finditer(text)]
    assert len(progress) >= 2, text
    assert any(status.startswith(("starting", "loading", "replay")) for status in progress)
    logs = re.search(r"^logs: (?P<path>\S+)$", text, re.MULTILINE)
    assert logs is not None, text
    run_dir = Path(logs["path"])
    assert run_dir.parent == (tmp_path / "logs").resolve()
    assert "serving" in (run_dir / "server.log").read_text(), "server.log not kept"
    assert f"logs kept in {run_dir}" in text


def test_the_default_progress_interval_is_at_most_ten_seconds() -> None:
    assert DEFAULT_INTERVAL_S <= 10
