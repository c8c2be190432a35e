"""One local service run as a child process on a loopback port: start, wait, stop, kill.

`ChildService` is the base of the embedded Kafka and Redis: it starts the child with its
output in a log file of its work dir, waits on a readiness probe (never a fixed sleep),
retries on another port when the one it picked was taken meanwhile, and stops it with
SIGTERM then SIGKILL. Subclasses give the command line, the probe and the address.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import tempfile
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from tenacity import Retrying, retry_if_exception_type, stop_after_delay, wait_fixed

from regionbus.schemas.errors import StackError

_log = logging.getLogger(__name__)

LOOPBACK_HOST = "127.0.0.1"

_READY_POLL_INTERVAL_S = 0.1
PORT_ATTEMPTS = 3
_LOG_SCAN_CHARS = 1_000_000


class ServiceNotReadyError(Exception):
    """What a subclass's ``_probe`` raises while the service does not answer yet."""


class PortInUseError(Exception):
    """The child exited at start because its port was taken meanwhile."""


def port_free(port: int) -> bool:
    """Whether nothing is bound to TCP ``port`` on 127.0.0.1 (or the wildcard address) now.

    Args:
        port: The TCP port.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((LOOPBACK_HOST, port))
        except OSError:
            return False
        return True


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that nothing listens on at the time of the call.

    The port is only probed, not reserved: another process can take it before the caller
    binds it, so the embedded services retry with a new port when that happens.

    Returns:
        A port number in the kernel's ephemeral range.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((LOOPBACK_HOST, 0))
        port: int = probe.getsockname()[1]
        return port


def run_tool(command: list[str], what: str, timeout_s: float, cwd: Path | None = None) -> str:
    """Run a one-off command of the stack's set-up (format Kafka's storage, form a Redis
    Cluster) to its end.

    Args:
        command: The program and its arguments.
        what: What it does, for the error message (``"formatting Kafka storage"``).
        timeout_s: Longest run, seconds.
        cwd: Its working directory; None keeps this process's.

    Returns:
        Its standard output.

    Raises:
        StackError: it could not be run, ran longer than ``timeout_s``, or failed (the
            message ends with the tail of its output).
    """
    try:
        done = subprocess.run(
            command,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise StackError(f"{what} failed: {exc}") from exc
    if done.returncode != 0:
        raise StackError(
            f"{what} failed (status {done.returncode}):\n{(done.stdout + done.stderr)[-2000:]}"
        )
    return done.stdout


class Closing:
    """The ``with`` protocol every devstack service shares: entering starts it, leaving
    closes it (stops it and removes what it made). Subclasses define both."""

    def start(self) -> object:
        """Start the service; what it returns is the subclass's."""
        raise NotImplementedError

    def close(self) -> None:
        """Stop the service and remove what it made."""
        raise NotImplementedError

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


class ChildService(Closing):
    """One service run as a child process on a loopback port, logging to its work dir.

    Args:
        port: Loopback TCP port; None picks a free one at the first `start`.
        work_dir: Directory of the child's files and log; None creates a temporary one,
            deleted by `close`.
        start_timeout_s: Seconds `start` waits for the probe to pass.
        stop_timeout_s: Seconds `stop` waits after SIGTERM before SIGKILL.
    """

    _name = "service"

    def __init__(
        self,
        *,
        port: int | None,
        work_dir: Path | None,
        start_timeout_s: float,
        stop_timeout_s: float,
    ) -> None:
        self._fixed_port = port is not None
        self._port = port
        self._owns_work_dir = work_dir is None
        # Absolute once: the child runs with this folder as its working directory, so a
        # relative path handed to it would be resolved a second time inside it.
        self.work_dir = (
            Path(tempfile.mkdtemp(prefix=f"regionbus-{self._name}-"))
            if work_dir is None
            else Path(work_dir).resolve()
        )
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.work_dir / f"{self._name}.log"
        self.start_timeout_s = start_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self._process: subprocess.Popen[bytes] | None = None
        self._log_offset = 0
        kept = self.kept_state()
        if port is None and isinstance(kept.get("port"), int):
            # A work dir used before: come back on its port, so clients' addresses hold;
            # a port taken meanwhile is replaced like a picked one.
            self._port = kept["port"]

    def prefer_port(self, port: int) -> bool:
        """Take ``port`` for the next start when no port was given or kept and it is free.

        Not a reservation: a process binding it before the child does makes `start` move
        to a free port, as for a picked one.

        Returns:
            True when this service will use ``port`` (or already does).
        """
        if self._port is None and port_free(port):
            self._port = port
        return self._port == port

    @property
    def name(self) -> str:
        """Short name of the service, used in logs and errors."""
        return self._name

    @property
    def port(self) -> int | None:
        """The loopback TCP port, chosen at the first `start` unless given; kept on restart."""
        return self._port

    @property
    def pid(self) -> int | None:
        """The child's process id while it runs, else None."""
        if self._process is None or self._process.poll() is not None:
            return None
        return self._process.pid

    def kept_state(self) -> dict[str, Any]:
        """What the last successful start in this work dir kept (``<name>.json``): its
        ``port`` and what `_state` adds; empty when none."""
        path = self.work_dir / f"{self._name}.json"
        try:
            kept = json.loads(path.read_text())
        except (OSError, ValueError):
            return {}
        return kept if isinstance(kept, dict) else {}

    def _state(self) -> dict[str, Any]:
        """More to keep in ``<name>.json`` after a start (subclasses)."""
        return {}

    def _command(self, port: int) -> list[str]:
        raise NotImplementedError

    def _prepare(self, port: int) -> None:
        """Write what the child needs before it starts (config files, formatted storage)."""

    def _child_env(self) -> dict[str, str]:
        return dict(os.environ)

    def _address(self, port: int) -> str:
        raise NotImplementedError

    def _probe(self, port: int) -> None:
        """Raise `ServiceNotReadyError` until the service answers on ``port``."""
        raise NotImplementedError

    def launch(self) -> int:
        """Start the child process without waiting for it to answer.

        Picks a free port first when none was given. Use `wait_ready` next; `start` does
        both, with retries on a taken port.

        Returns:
            The port the child was told to listen on.

        Raises:
            StackError: the program cannot be run, or preparing its files failed.
        """
        if self._port is None:
            self._port = free_port()
        port = self._port
        self._prepare(port)
        self._log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        command = self._command(port)
        try:
            with self.log_path.open("ab") as log_file:
                self._process = subprocess.Popen(
                    command,
                    stdin=subprocess.DEVNULL,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    cwd=self.work_dir,
                    env=self._child_env(),
                    start_new_session=True,
                )
        except OSError as exc:
            raise StackError(f"cannot run {command[0]}: {exc}") from exc
        return port

    def wait_ready(self) -> str:
        """Wait until the launched child answers its probe, at most ``start_timeout_s``.

        Returns:
            The address clients connect to.

        Raises:
            PortInUseError: the child exited because its port was taken.
            StackError: the child exited, or did not answer in time (it is stopped then).
                The message ends with the log's tail.
        """
        assert self._port is not None
        port = self._port
        try:
            for attempt in Retrying(
                stop=stop_after_delay(self.start_timeout_s),
                wait=wait_fixed(_READY_POLL_INTERVAL_S),
                retry=retry_if_exception_type(ServiceNotReadyError),
                reraise=True,
            ):
                with attempt:
                    self._check_alive(port)
                    self._probe(port)
        except ServiceNotReadyError as exc:
            self.stop()
            raise StackError(
                f"{self._name} on {LOOPBACK_HOST}:{port} did not answer within "
                f"{self.start_timeout_s} s ({exc}); log {self.log_path}:\n{self.log_tail()}"
            ) from exc
        except BaseException:
            self.stop()
            raise
        # Clients keep the address, so a restart must come back on the same port.
        self._fixed_port = True
        if not self._owns_work_dir:
            state = {"port": port, **self._state()}
            (self.work_dir / f"{self._name}.json").write_text(json.dumps(state))
        _log.info("%s started: pid %s, %s", self._name, self.pid, self._address(port))
        return self._address(port)

    def _check_alive(self, port: int) -> None:
        assert self._process is not None
        exit_code = self._process.poll()
        if exit_code is None:
            return
        self._process = None
        tail = self.log_tail(since=self._log_offset)
        # The whole log of this start: a JVM's stack traces after the bind error can push
        # it out of the tail.
        if "in use" in self.log_tail(since=self._log_offset, chars=_LOG_SCAN_CHARS).lower():
            raise PortInUseError(
                f"{self._name}: port {LOOPBACK_HOST}:{port} is taken; log {self.log_path}:\n{tail}"
            )
        raise StackError(
            f"{self._name} exited with status {exit_code} while starting on "
            f"{LOOPBACK_HOST}:{port}; log {self.log_path}:\n{tail}"
        )

    def log_tail(self, since: int = 0, chars: int = 2000) -> str:
        """The last ``chars`` characters of the child's log from byte ``since``, for error
        messages."""
        try:
            with self.log_path.open("rb") as log_file:
                log_file.seek(since)
                return log_file.read().decode(errors="replace")[-chars:]
        except OSError:
            return "(no log)"

    def start(self) -> str:
        """Start the child process and wait until it serves requests.

        A second call while it runs returns the same address. After `stop` or `kill`, it
        starts again on the same port and work dir.

        Returns:
            The address clients connect to.

        Raises:
            StackError: the program is missing, the process exited, the port was taken
                (after retries with new ports when no port was given), or the service
                did not answer within ``start_timeout_s`` seconds.
        """
        if self.pid is not None and self._port is not None:
            return self._address(self._port)
        for _ in range(PORT_ATTEMPTS):
            self.launch()
            try:
                return self.wait_ready()
            except PortInUseError as exc:
                if self._fixed_port:
                    raise StackError(str(exc)) from exc
                _log.info("%s: port %s was taken, retrying on another", self._name, self._port)
                self._port = None
        raise StackError(
            f"{self._name}: every one of {PORT_ATTEMPTS} free ports was taken before it bound"
        )

    def stop(self) -> None:
        """Terminate the child and reap it: SIGTERM, then SIGKILL after ``stop_timeout_s``.

        Does nothing if it is not running. The work dir and log stay until `close`.
        """
        process, self._process = self._process, None
        if process is None:
            return
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=self.stop_timeout_s)
            except subprocess.TimeoutExpired:
                _log.warning(
                    "%s pid %d ignored SIGTERM for %s s, killing it",
                    self._name,
                    process.pid,
                    self.stop_timeout_s,
                )
                process.kill()
                process.wait()
        _log.info("%s stopped: pid %d, exit status %s", self._name, process.pid, process.returncode)

    def terminate(self) -> None:
        """Send SIGTERM without waiting; `stop` then waits and reaps. Nothing if not running."""
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()

    def kill(self) -> None:
        """SIGKILL the child (a crash: no shutdown work) and reap it; nothing if not running."""
        process, self._process = self._process, None
        if process is None:
            return
        if process.poll() is None:
            process.kill()
        process.wait()
        _log.info("%s killed: pid %d", self._name, process.pid)

    def close(self) -> None:
        """Stop the child and delete the work dir if this object created it."""
        self.stop()
        if self._owns_work_dir:
            shutil.rmtree(self.work_dir, ignore_errors=True)
