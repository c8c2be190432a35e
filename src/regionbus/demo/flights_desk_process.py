"""Where a flights demo desk runs: in the caller's process (:func:`make_desk`) or in a
child process of its own (:class:`DeskProcess`), driven over a pipe with the same
interface (:class:`regionbus.demo.flights_desks.DeskHandle`).
"""

from __future__ import annotations

import contextlib
import multiprocessing
from multiprocessing.connection import Connection
from typing import Any

from regionbus.clients import ClientSettings
from regionbus.demo.flights_cq_desk import CqDesk
from regionbus.demo.flights_desks import Desk, DeskError, DeskKind, DeskResult, DeskSpec
from regionbus.demo.flights_operations_desk import OperationsDesk
from regionbus.schemas.errors import RegionBusError


def make_desk(spec: DeskSpec, settings: ClientSettings) -> Desk | OperationsDesk | CqDesk:
    """The in-process desk of a spec: :class:`OperationsDesk` for OPERATIONS, :class:`CqDesk`
    for CQ, else :class:`Desk`.

    Raises:
        As :class:`Desk`, :class:`OperationsDesk` and :class:`CqDesk`.
    """
    if spec.kind is DeskKind.OPERATIONS:
        return OperationsDesk(spec, settings)
    if spec.kind is DeskKind.CQ:
        return CqDesk(spec, settings)
    return Desk(spec, settings)


def _desk_main(spec: DeskSpec, settings: dict[str, Any], conn: Connection) -> None:
    """Body of a desk child process: build the desk, then obey the parent's commands."""
    try:
        desk = make_desk(spec, ClientSettings(**settings))
    except BaseException as exc:
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready", None))
    try:
        while True:
            try:
                command, *args = conn.recv()
            except EOFError:
                return
            if command == "day":
                desk.show_day(args[0])
            elif command == "published":
                desk.day_published(args[0])
                if args[0] == spec.away_at_day:
                    conn.send(("away", None))
            elif command == "finish":
                try:
                    conn.send(("result", desk.finish(args[0], args[1])))
                except RegionBusError as exc:
                    conn.send(("error", f"{type(exc).__name__}: {exc}"))
            elif command == "close":
                return
    finally:
        desk.close()
        conn.close()


class DeskProcess:
    """A desk in a child process of its own (``spawn``), driven over a pipe.

    Construction starts the child and returns at once; call :meth:`wait_ready` before the
    replay so the desk's interest is registered. As with any ``spawn`` child, the calling
    program's main module must be importable without side effects (``if __name__ ==
    "__main__":``), or the child fails while starting.

    Args:
        spec: What the desk subscribes to.
        settings: Client settings for the child's cache.
    """

    def __init__(self, spec: DeskSpec, settings: ClientSettings) -> None:
        self.spec = spec
        context = multiprocessing.get_context("spawn")
        self._conn, child_conn = context.Pipe()
        self._process = context.Process(
            target=_desk_main,
            args=(spec, settings.model_dump(), child_conn),
            name=f"desk-{spec.kind.value}",
            daemon=True,
        )
        self._process.start()
        child_conn.close()

    def _receive(self, timeout_s: float, expected: str) -> Any:
        if not self._conn.poll(timeout_s):
            raise DeskError(f"{self.spec.name}: no answer from its process within {timeout_s} s")
        try:
            kind, payload = self._conn.recv()
        except EOFError as exc:
            raise DeskError(f"{self.spec.name}: its process exited") from exc
        if kind == "error":
            raise DeskError(f"{self.spec.name}: {payload}")
        if kind != expected:
            raise DeskError(f"{self.spec.name}: expected {expected!r}, got {kind!r}")
        return payload

    def wait_ready(self, timeout_s: float) -> None:
        """Wait until the child is connected and has registered its interest.

        Raises:
            DeskError: it failed, exited or did not answer within ``timeout_s`` seconds.
        """
        self._receive(timeout_s, "ready")

    def show_day(self, keys: tuple[str, ...]) -> None:
        """As :meth:`Desk.show_day`."""
        if self.spec.kind is DeskKind.DASHBOARD:
            self._conn.send(("day", keys))

    def day_published(self, number: int) -> None:
        """As :meth:`OperationsDesk.day_published` (the other desks are not told): on the
        day to go away, returns once the child closed with keep-alive.

        Raises:
            DeskError: the child failed, exited or did not close within 60 s.
        """
        if self.spec.kind is not DeskKind.OPERATIONS:
            return
        self._conn.send(("published", number))
        if number == self.spec.away_at_day:
            self._receive(60.0, "away")

    def finish(self, expected_events: int | None, timeout_s: float) -> DeskResult:
        """As :meth:`Desk.finish`; the snapshot is sent back over the pipe.

        Raises:
            DeskError: the child failed, exited or did not answer in time.
        """
        self._conn.send(("finish", expected_events, timeout_s))
        result: DeskResult = self._receive(timeout_s + 30.0, "result")
        return result

    def close(self) -> None:
        """Tell the child to disconnect and exit; terminate it if it does not within 15 s."""
        with contextlib.suppress(OSError):
            self._conn.send(("close",))
        self._process.join(15)
        if self._process.is_alive():
            self._process.terminate()
            self._process.join(5)
        self._conn.close()


__all__ = ["DeskProcess", "make_desk"]
