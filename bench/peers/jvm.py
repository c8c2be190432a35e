"""The JVM side of the peers: resolving their jars on first use and the ``java`` command.

The Geode set (geode-core and the harness built from ``bench/peers/geode/``) is resolved
only for people who benchmark: :func:`ensure_geode_jars` runs ``scripts/bootstrap.sh
--peers``, which builds it with Maven from Maven Central into ``jvm/lib/geode/`` when its
pom or sources changed, and returns at once otherwise. MirrorMaker 2 comes with the
Apache Kafka jars that every bootstrap resolves into ``jvm/lib/kafka/``.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
from pathlib import Path
from typing import Any, Final

REPOSITORY: Final = Path(__file__).resolve().parents[2]
GEODE_LIB: Final = REPOSITORY / "jvm" / "lib" / "geode"
KAFKA_LIB: Final = REPOSITORY / "jvm" / "lib" / "kafka"
GEODE_MAIN: Final = "io.regionbus.peers.geode.GeodePeer"

GEODE_JAVA_17_FLAGS: Final = (
    "--add-exports=java.base/sun.nio.ch=ALL-UNNAMED",
    "--add-exports=java.management/com.sun.jmx.remote.security=ALL-UNNAMED",
    "--add-opens=java.base/java.lang=ALL-UNNAMED",
    "--add-opens=java.base/java.nio=ALL-UNNAMED",
    "--add-opens=java.base/sun.nio.ch=ALL-UNNAMED",
    "--add-opens=java.base/java.util=ALL-UNNAMED",
    "--add-opens=java.base/java.util.concurrent=ALL-UNNAMED",
    "--add-opens=java.base/java.util.concurrent.atomic=ALL-UNNAMED",
    "--add-opens=java.management/com.sun.jmx.remote.security=ALL-UNNAMED",
    "--add-opens=java.base/jdk.internal.misc=ALL-UNNAMED",
)
"""The module flags Geode 1.15 needs on Java 17 (those gfsh starts its members with)."""


log = logging.getLogger("regionbus.bench.geode")


class PeerSetupError(RuntimeError):
    """The peers' jars could not be resolved, or Java is missing."""


def java() -> str:
    """The ``java`` on PATH.

    Raises:
        PeerSetupError: there is none.
    """
    found = shutil.which("java")
    if found is None:
        raise PeerSetupError(
            "java is not on PATH (Java 17: apt-get install openjdk-17-jre-headless)"
        )
    return found


def ensure_geode_jars(timeout_s: float = 900.0) -> Path:
    """Resolve the Geode set into ``jvm/lib/geode/`` unless it is current.

    Args:
        timeout_s: Longest resolution, in seconds (the first one downloads about 60 jars).

    Returns:
        The folder of the jars.

    Raises:
        PeerSetupError: ``scripts/bootstrap.sh --peers`` failed or took too long.
    """
    try:
        done = subprocess.run(
            ["bash", str(REPOSITORY / "scripts" / "bootstrap.sh"), "--peers"],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise PeerSetupError(f"scripts/bootstrap.sh --peers took over {timeout_s} s") from exc
    if done.returncode != 0:
        raise PeerSetupError(
            f"scripts/bootstrap.sh --peers failed ({done.returncode}): {done.stderr[-2000:]}"
        )
    return GEODE_LIB


def run_geode_main(
    subcommand: str, options: dict[str, Any], work_dir: Path, timeout_s: float
) -> str:
    """Run the Geode harness's ``subcommand`` (``run``, ``wan``) in a JVM of its own and
    return what it printed on stdout (its figures as JSON on the last line).

    Args:
        subcommand: The harness's first argument (:data:`GEODE_MAIN`).
        options: Its options by name without dashes (``ops``, ``mode``, ...); booleans as
            ``true`` / ``false``.
        work_dir: Where every member's log goes (``<member>.log``, ``<member>.stderr``) and
            the harness's stderr (``harness.stderr``).
        timeout_s: Longest run, in seconds.

    Raises:
        PeerSetupError: Java or the jars are missing and cannot be resolved.
        RuntimeError: the harness failed or took longer than ``timeout_s``.
    """
    lib = ensure_geode_jars()
    arguments = [f"--{name.replace('_', '-')}={value}" for name, value in options.items()]
    command = [
        java(),
        *GEODE_JAVA_17_FLAGS,
        "-Xmx1g",
        "-cp",
        f"{lib}/*",
        GEODE_MAIN,
        subcommand,
        *(part for argument in arguments for part in argument.split("=", 1)),
        "--work-dir",
        str(work_dir),
    ]
    log.info("running %s", " ".join(command))
    stderr_path = work_dir / "harness.stderr"
    with stderr_path.open("wb") as stderr:
        try:
            done = subprocess.run(
                command,
                stdout=subprocess.PIPE,
                stderr=stderr,
                cwd=work_dir,  # Geode writes files of its own where it runs
                timeout=timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            message = f"the Geode harness took over {timeout_s} s; logs in {work_dir}"
            raise RuntimeError(message) from exc
    if done.returncode != 0:
        tail = stderr_path.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"the Geode harness failed ({done.returncode}): {tail}")
    return done.stdout.decode(errors="replace")


__all__ = [
    "GEODE_JAVA_17_FLAGS",
    "GEODE_LIB",
    "GEODE_MAIN",
    "KAFKA_LIB",
    "REPOSITORY",
    "PeerSetupError",
    "ensure_geode_jars",
    "java",
    "run_geode_main",
]
