"""The JVM side of the peers: resolving their jars on first use and the ``java`` command.

The Geode set (geode-core and the harness built from ``bench/peers/geode/``) is resolved
only for people who benchmark: :func:`ensure_geode_jars` runs ``scripts/bootstrap.sh
--peers``, which builds it with Maven from Maven Central into ``jvm/lib/geode/`` when its
pom or sources changed, and returns at once otherwise. MirrorMaker 2 comes with the
Apache Kafka jars that every bootstrap resolves into ``jvm/lib/kafka/``.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Final

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


__all__ = [
    "GEODE_JAVA_17_FLAGS",
    "GEODE_LIB",
    "GEODE_MAIN",
    "KAFKA_LIB",
    "REPOSITORY",
    "PeerSetupError",
    "ensure_geode_jars",
    "java",
]
