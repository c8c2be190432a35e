"""A progress line every few seconds for long commands whose output is not a terminal.

A progress bar is only drawn on a terminal; under CI, ``nohup`` or a redirect to a file a
long command (the demo, a bulk load, a benchmark) would otherwise print nothing for
minutes, which cannot be told apart from a hang. :class:`Heartbeat` prints one line per
``interval_s`` saying what the command is doing, from a callable the command keeps
current.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import IO, Final, Self

DEFAULT_INTERVAL_S: Final = 10.0
"""Longest silence of a long command without a terminal, in seconds."""


class Heartbeat:
    """Prints ``[elapsed] <status>`` to ``stream`` every ``interval_s`` seconds until stopped.

    Use it as a context manager. The line is flushed at once, so a log file shows it as it
    comes. Thread-safe: ``status`` is called from the heartbeat's own thread and must not
    block (read a counter, return a string).

    Args:
        status: Returns what the command is doing now, e.g. ``"replay: 45,000 of 1,001,615
            operations"``.
        stream: Where the lines go (a text stream, e.g. ``sys.stdout``).
        interval_s: Seconds between lines (default :data:`DEFAULT_INTERVAL_S`).
        enabled: False makes the heartbeat do nothing (a progress bar is shown instead).

    Raises:
        ValueError: ``interval_s`` is not positive.
    """

    def __init__(
        self,
        status: Callable[[], str],
        stream: IO[str],
        *,
        interval_s: float = DEFAULT_INTERVAL_S,
        enabled: bool = True,
    ) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be positive, got {interval_s}")
        self._status = status
        self._stream = stream
        self.interval_s = interval_s
        self.enabled = enabled
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._began = time.monotonic()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                line = self._status()
            except Exception as exc:  # a status that failed must not end the heartbeat
                line = f"(status unavailable: {exc})"
            elapsed_s = int(time.monotonic() - self._began)
            stamp = f"{elapsed_s // 3600:d}:{elapsed_s // 60 % 60:02d}:{elapsed_s % 60:02d}"
            self._stream.write(f"[{stamp}] {line}\n")
            self._stream.flush()

    def start(self) -> Self:
        """Start printing (does nothing when disabled or already started)."""
        if self.enabled and self._thread is None:
            self._began = time.monotonic()
            self._thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop printing; waits for a line being written to finish."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


class PhaseStatus:
    """What a long command is doing now, as a :class:`Heartbeat`'s status. Thread-safe.

    Call :meth:`phase` at each step; the line is the phase, how long it has lasted, and
    what ``detail`` returns (e.g. a counter) when one was given.
    """

    def __init__(self, first_phase: str = "starting") -> None:
        self._lock = threading.Lock()
        self._phase = first_phase
        self._detail: Callable[[], str] | None = None
        self._since = time.monotonic()

    def phase(self, text: str, detail: Callable[[], str] | None = None) -> None:
        """Enter a phase, e.g. ``"writing 1,000,000 entries"``.

        Args:
            text: What the command does now.
            detail: Called for each line while the phase lasts (must not block); None
                for none.
        """
        with self._lock:
            self._phase, self._detail, self._since = text, detail, time.monotonic()

    def __call__(self) -> str:
        with self._lock:
            phase, detail, since = self._phase, self._detail, self._since
        line = f"{phase} ({time.monotonic() - since:,.0f} s)"
        if detail is None:
            return line
        shown = detail()
        return f"{line}: {shown}" if shown else line


def last_line(log_path: Path, chars: int = 120) -> str:
    """The last non-empty line of a log file so far, cut to ``chars``: what a heartbeat
    line shows of a child process that reports its own progress.

    Args:
        log_path: The log file (it may not exist yet).
        chars: Longest result, in characters.

    Returns:
        The line, or ``"(no log yet)"`` / ``"(no output yet)"``; never raises.
    """
    try:
        with log_path.open("rb") as log:
            log.seek(max(log_path.stat().st_size - 4096, 0))
            lines = [line for line in log.read().decode(errors="replace").splitlines() if line]
    except OSError:
        return "(no log yet)"
    return lines[-1].strip()[:chars] if lines else "(no output yet)"


__all__ = ["DEFAULT_INTERVAL_S", "Heartbeat", "PhaseStatus", "last_line"]
