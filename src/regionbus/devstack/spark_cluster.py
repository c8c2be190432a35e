"""A Spark standalone cluster on loopback: one master and one worker, from the installed
pyspark.

The pyspark wheel carries Spark's jars and its ``bin/spark-class`` launcher (not the
``sbin/start-*.sh`` daemon scripts of a Spark distribution), so each daemon is
``spark-class org.apache.spark.deploy.master.Master`` or ``...worker.Worker`` run as a
child process with its log in its work dir, like the embedded Kafka and Redis. Jobs then
run on it with ``--master spark://127.0.0.1:<port>``
(:func:`regionbus.spark.session.local_session` ships the connector jars to the executors).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Final

from regionbus.devstack.jvm import java_program
from regionbus.devstack.process import (
    LOOPBACK_HOST,
    ChildService,
    Closing,
    ServiceNotReadyError,
    free_port,
)
from regionbus.schemas.errors import StackError

_MASTER_CLASS: Final = "org.apache.spark.deploy.master.Master"
_WORKER_CLASS: Final = "org.apache.spark.deploy.worker.Worker"
_PROBE_TIMEOUT_S: Final = 2.0


def spark_home() -> Path:
    """The installed pyspark's Spark home (its ``bin/spark-class`` and ``jars/``).

    Raises:
        StackError: pyspark is not installed (the ``spark`` extra).
    """
    try:
        from pyspark.find_spark_home import _find_spark_home
    except ImportError as exc:
        raise StackError(
            "pyspark is not installed: pip install '.[spark]' (or run scripts/bootstrap.sh)"
        ) from exc
    return Path(_find_spark_home())


def _daemon_env(work_dir: Path) -> dict[str, str]:
    """What a Spark daemon runs with: Java, loopback only, its logs in its work dir."""
    java = Path(java_program())
    env = dict(os.environ)
    env.setdefault("JAVA_HOME", str(java.resolve().parent.parent))
    env["SPARK_HOME"] = str(spark_home())
    env["SPARK_LOCAL_IP"] = LOOPBACK_HOST
    env["SPARK_LOG_DIR"] = str(work_dir)
    return env


def _master_state(webui_port: int) -> dict[str, Any]:
    """The master's state as its web UI gives it (``/json``)."""
    url = f"http://{LOOPBACK_HOST}:{webui_port}/json/"
    try:
        with urllib.request.urlopen(url, timeout=_PROBE_TIMEOUT_S) as answer:
            state: dict[str, Any] = json.loads(answer.read())
    except (OSError, ValueError, urllib.error.URLError) as exc:
        raise ServiceNotReadyError(f"Spark master web UI: {exc}") from exc
    return state


class SparkMaster(ChildService):
    """A Spark standalone master on loopback.

    Args:
        port: Port of ``spark://``; None picks a free one.
        work_dir: Home of its log; None creates a temporary one.
        start_timeout_s: Seconds `start` waits for the master to be ALIVE.
    """

    _name = "spark-master"

    def __init__(
        self,
        *,
        port: int | None = None,
        work_dir: Path | None = None,
        start_timeout_s: float = 90.0,
    ) -> None:
        super().__init__(
            port=port, work_dir=work_dir, start_timeout_s=start_timeout_s, stop_timeout_s=15.0
        )
        kept = self.kept_state().get("webui_port")
        self.webui_port: int = kept if isinstance(kept, int) else free_port()

    def _state(self) -> dict[str, Any]:
        return {"webui_port": self.webui_port}

    def _command(self, port: int) -> list[str]:
        return [
            str(spark_home() / "bin" / "spark-class"),
            _MASTER_CLASS,
            "--host",
            LOOPBACK_HOST,
            "--port",
            str(port),
            "--webui-port",
            str(self.webui_port),
        ]

    def _child_env(self) -> dict[str, str]:
        return _daemon_env(self.work_dir)

    def _address(self, port: int) -> str:
        return f"spark://{LOOPBACK_HOST}:{port}"

    def _probe(self, port: int) -> None:
        if _master_state(self.webui_port).get("status") != "ALIVE":
            raise ServiceNotReadyError("Spark master not ALIVE yet")

    def alive_workers(self) -> int:
        """Workers registered with the master and ALIVE now (0 when it does not answer)."""
        try:
            workers = _master_state(self.webui_port).get("workers", [])
        except ServiceNotReadyError:
            return 0
        return sum(1 for w in workers if w.get("state") == "ALIVE")


class SparkWorker(ChildService):
    """A Spark standalone worker on loopback, registered with ``master``.

    Args:
        master: The master it offers its cores to.
        cores: Cores it offers.
        memory_mb: Memory it offers executors, MiB.
        work_dir: Home of its log and its executors' folders; None creates a temporary one.
        start_timeout_s: Seconds `start` waits for it to be ALIVE at the master.
    """

    _name = "spark-worker"

    def __init__(
        self,
        master: SparkMaster,
        *,
        cores: int = 2,
        memory_mb: int = 1024,
        work_dir: Path | None = None,
        start_timeout_s: float = 90.0,
    ) -> None:
        super().__init__(
            port=None, work_dir=work_dir, start_timeout_s=start_timeout_s, stop_timeout_s=15.0
        )
        self.master = master
        self.cores = cores
        self.memory_mb = memory_mb
        kept = self.kept_state().get("webui_port")
        self.webui_port: int = kept if isinstance(kept, int) else free_port()

    def _state(self) -> dict[str, Any]:
        return {"webui_port": self.webui_port}

    def _command(self, port: int) -> list[str]:
        assert self.master.port is not None
        return [
            str(spark_home() / "bin" / "spark-class"),
            _WORKER_CLASS,
            f"spark://{LOOPBACK_HOST}:{self.master.port}",
            "--host",
            LOOPBACK_HOST,
            "--port",
            str(port),
            "--webui-port",
            str(self.webui_port),
            "--cores",
            str(self.cores),
            "--memory",
            f"{self.memory_mb}m",
            "--work-dir",
            str(self.work_dir / "executors"),
        ]

    def _child_env(self) -> dict[str, str]:
        return _daemon_env(self.work_dir)

    def _address(self, port: int) -> str:
        return f"{LOOPBACK_HOST}:{port}"

    def _probe(self, port: int) -> None:
        if self.master.alive_workers() < 1:
            raise ServiceNotReadyError("Spark worker not registered with the master yet")


class EmbeddedSparkCluster(Closing):
    """A Spark standalone master and one worker on loopback, for jobs run with
    ``--master spark://...``. Used as a context manager it starts on enter and on exit
    stops both and deletes the work dir if it created it.

    Args:
        cores: Cores the worker offers.
        memory_mb: Memory the worker offers executors, MiB.
        work_dir: Parent of ``master/`` and ``worker/``; None creates a temporary one.
        start_timeout_s: Seconds each daemon may take to be ALIVE.
    """

    def __init__(
        self,
        *,
        cores: int = 2,
        memory_mb: int = 1024,
        work_dir: Path | None = None,
        start_timeout_s: float = 90.0,
    ) -> None:
        self._owns_work_dir = work_dir is None
        self.work_dir = (
            Path(tempfile.mkdtemp(prefix="regionbus-spark-"))
            if work_dir is None
            else Path(work_dir).resolve()
        )
        self.master = SparkMaster(
            work_dir=self.work_dir / "master", start_timeout_s=start_timeout_s
        )
        self.worker = SparkWorker(
            self.master,
            cores=cores,
            memory_mb=memory_mb,
            work_dir=self.work_dir / "worker",
            start_timeout_s=start_timeout_s,
        )

    @property
    def url(self) -> str:
        """``spark://127.0.0.1:PORT`` of the master.

        Raises:
            StackError: the master is not running.
        """
        if self.master.pid is None or self.master.port is None:
            raise StackError("the Spark master is not running")
        return f"spark://{LOOPBACK_HOST}:{self.master.port}"

    @property
    def web_ui(self) -> str:
        """The master's web UI address."""
        return f"http://{LOOPBACK_HOST}:{self.master.webui_port}"

    def start(self) -> str:
        """Start the master, then the worker, and wait until the worker is ALIVE.

        Returns:
            The master's ``spark://`` URL.

        Raises:
            StackError: a daemon exited or was not ALIVE in time (the message ends with its
                log's tail), or pyspark / Java is missing.
        """
        try:
            self.master.start()
            self.worker.start()
        except BaseException:
            self.stop()
            raise
        return self.url

    def stop(self) -> None:
        """Stop the worker (and its executors), then the master."""
        self.worker.stop()
        self.master.stop()

    def close(self) -> None:
        """Stop both and delete the work dir if this object created it."""
        self.worker.close()
        self.master.close()
        if self._owns_work_dir:
            shutil.rmtree(self.work_dir, ignore_errors=True)


__all__ = ["EmbeddedSparkCluster", "SparkMaster", "SparkWorker", "spark_home"]
