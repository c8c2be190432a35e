"""A benchmark run on its own with its output redirected (no terminal) prints progress lines
naming its phase, and names the folder where its server's, Kafka's and Redis' logs stay."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench.progress import INTERVAL_ENV, LOG_DIR_ENV

_PROGRESS_LINE = re.compile(r"^\[\d+:\d\d:\d\d\] (?P<status>.+)$", re.MULTILINE)
_RUN_TIMEOUT_S = 300
_REPO = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(_RUN_TIMEOUT_S + 60)
def test_a_benchmark_redirected_to_a_file_prints_its_phases_and_keeps_its_logs(
    tmp_path: Path,
) -> None:
    output = tmp_path / "bench.out"
    # Its own embedded stack (no REGIONBUS_* / KAFKA_* addresses), so Kafka's and Redis'
    # logs are there to keep.
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("REGIONBUS_", "KAFKA_", "REDIS_", "BENCH_"))
    }
    env[LOG_DIR_ENV] = str(tmp_path / "logs")
    env[INTERVAL_ENV] = "1"
    with output.open("w") as out:
        ran = subprocess.run(
            [sys.executable, "-m", "bench.durable_replay", "--events", "2000", "--chunk", "200"],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=_REPO,
            timeout=_RUN_TIMEOUT_S,
            check=False,
        )
    text = output.read_text()

    assert ran.returncode == 0, text
    progress = [m["status"] for m in _PROGRESS_LINE.finditer(text)]
    assert len(progress) >= 2, text
    phases = ("starting Kafka", "set-up: durable client away", "durable replay", "raw:")
    assert any(status.startswith(phases) for status in progress), text
    logs = re.search(r"^logs: (?P<path>\S+)$", text, re.MULTILINE)
    assert logs is not None, text
    run_dir = Path(logs["path"])
    assert run_dir.parent == (tmp_path / "logs" / "durable_replay").resolve()
    assert f"logs kept in {run_dir}" in text
    assert "serving" in (run_dir / "server.log").read_text(), "server.log not kept"
    kept = {path.name for path in run_dir.iterdir()}
    assert {"kafka.log", "redis.log"} <= kept, kept
