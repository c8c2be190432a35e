"""The heartbeat's lines and the demo's durable-desk timeout (pure logic)."""

from __future__ import annotations

import io
import re
import threading

import pytest

from regionbus.demo.flights_run import (
    MIN_DURABLE_TIMEOUT_S,
    QUIET_MACHINE_OPS_PER_S,
    SLOW_MACHINE_FACTOR,
    durable_timeout_s,
)
from regionbus.runtime.heartbeat import Heartbeat, PhaseStatus


class _Lines(io.StringIO):
    def __init__(self, wanted: int) -> None:
        super().__init__()
        self.wanted = wanted
        self.enough = threading.Event()

    def flush(self) -> None:
        super().flush()
        if self.getvalue().count("\n") >= self.wanted:
            self.enough.set()


def test_a_heartbeat_prints_its_status_until_stopped() -> None:
    stream = _Lines(wanted=3)
    calls = iter(range(1_000))
    with Heartbeat(lambda: f"step {next(calls)}", stream, interval_s=0.01):
        assert stream.enough.wait(30)
    lines = stream.getvalue().splitlines()
    assert lines[:3] == [f"[0:00:00] step {n}" for n in range(3)]


def test_a_disabled_heartbeat_prints_nothing_and_a_failing_status_does_not_end_it() -> None:
    quiet = io.StringIO()
    with Heartbeat(lambda: "x", quiet, interval_s=0.01, enabled=False):
        pass
    assert quiet.getvalue() == ""

    def broken() -> str:
        raise RuntimeError("no data yet")

    stream = _Lines(wanted=2)
    with Heartbeat(broken, stream, interval_s=0.01):
        assert stream.enough.wait(30)
    assert "(status unavailable: no data yet)" in stream.getvalue()


def test_a_heartbeat_needs_a_positive_interval() -> None:
    with pytest.raises(ValueError, match="interval_s"):
        Heartbeat(lambda: "x", io.StringIO(), interval_s=0)


def test_the_durable_desk_outlasts_a_replay_three_times_slower_than_a_quiet_one() -> None:
    full_year_ops = 1_001_615
    quiet_replay_s = full_year_ops / QUIET_MACHINE_OPS_PER_S
    timeout_s = durable_timeout_s(full_year_ops, 365, speed=0)
    # The desk is away for a third of the replay: on a machine three times slower than a
    # quiet one, that third takes as long as the whole replay on the quiet machine.
    assert timeout_s >= SLOW_MACHINE_FACTOR * quiet_replay_s
    assert timeout_s > MIN_DURABLE_TIMEOUT_S, "the old fixed 300 s was too short"
    assert durable_timeout_s(18_000, 7, speed=0) == MIN_DURABLE_TIMEOUT_S
    paced = durable_timeout_s(18_000, 7, speed=3_600)
    assert paced >= SLOW_MACHINE_FACTOR * 7 * 86_400 / 3_600


def test_a_phase_status_says_the_phase_its_length_and_its_detail() -> None:
    status = PhaseStatus("starting Spark")
    assert re.fullmatch(r"starting Spark \(\d+ s\)", status())
    answered = [0]
    status.phase("waiting for replies", lambda: f"{answered[0]:,} of 2,000 answered")
    answered[0] = 1_500
    assert re.fullmatch(r"waiting for replies \(\d+ s\): 1,500 of 2,000 answered", status())
