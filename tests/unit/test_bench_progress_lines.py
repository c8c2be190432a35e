"""bench.progress without a terminal: phase lines with counts, a kept log folder (pure
logic, no Kafka)."""

from __future__ import annotations

import io
import re
import threading
from pathlib import Path

import pytest
from rich.console import Console

from bench import progress


class _Lines(io.StringIO):
    """A non-terminal stream that says when a line matching ``wanted`` came."""

    def __init__(self, wanted: str) -> None:
        super().__init__()
        self.wanted = re.compile(wanted, re.MULTILINE)
        self.seen = threading.Event()

    def flush(self) -> None:
        super().flush()
        if self.wanted.search(self.getvalue()):
            self.seen.set()


def test_progress_lines_name_the_phase_and_its_counts_and_the_kept_logs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(progress.LOG_DIR_ENV, str(tmp_path))
    stream = _Lines(r"^\[\d:\d\d:\d\d\] \(a\) puts \(\d+ s\): 7 of 10 answered$")
    # Narrower than the paths: each must still come whole on one line.
    console = Console(file=stream, width=20)
    answered = 0

    with progress.heartbeat(console, interval_s=0.01):
        path = progress.log_dir("tiny", console)
        progress.phase(console, "(a) puts ...")
        answered = 7
        progress.counts(lambda: f"{answered} of 10 answered")
        assert stream.seen.wait(30), stream.getvalue()

    text = stream.getvalue()
    assert path.is_dir() and path.parent == (tmp_path / "tiny").resolve()
    assert f"logs: {path}\n" in text
    assert "(a) puts ...\n" in text, "the phase is printed as it begins"
    assert text.rstrip().endswith(f"logs kept in {path}")


def test_a_terminal_gets_no_progress_lines_and_phases_outside_a_run_only_print() -> None:
    stream = io.StringIO()
    terminal = Console(file=stream, force_terminal=True, width=200)
    with progress.heartbeat(terminal, interval_s=0.01):
        progress.phase(terminal, "(b) latency ...")
        threading.Event().wait(0.2)
    assert not re.search(r"^\[\d:\d\d:\d\d\]", stream.getvalue(), re.MULTILINE)

    quiet = io.StringIO()
    progress.phase(Console(file=quiet), "(c) raw ...")
    progress.counts(lambda: "never shown")
    assert quiet.getvalue() == "(c) raw ...\n"


def test_the_progress_interval_from_the_environment_is_at_most_ten_seconds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(progress.INTERVAL_ENV, raising=False)
    assert progress.progress_interval_s() == 10
    monkeypatch.setenv(progress.INTERVAL_ENV, "60")
    assert progress.progress_interval_s() == 10
    monkeypatch.setenv(progress.INTERVAL_ENV, "0.5")
    assert progress.progress_interval_s() == 0.5
    monkeypatch.setenv(progress.INTERVAL_ENV, "0")
    with (
        pytest.raises(ValueError, match="interval_s"),
        progress.heartbeat(Console(file=io.StringIO())),
    ):
        pass


def test_the_last_line_of_a_childs_log(tmp_path: Path) -> None:
    log = tmp_path / "harness.stderr"
    assert progress.last_line(log) == "(no log yet)"
    log.write_text("geode-peer 1.0 s: server up\n\ngeode-peer 2.5 s: latency phase\n\n")
    assert progress.last_line(log) == "geode-peer 2.5 s: latency phase"
