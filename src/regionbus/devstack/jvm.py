"""Where the JVM parts live: the ``java`` program and the jars ``scripts/bootstrap.sh`` resolved.

``jvm/pom.xml`` pins every JVM artifact (Apache Kafka, Spark's Kafka connector); the
bootstrap copies each module's runtime jars into ``jvm/lib/<module>/``. A checkout finds
them there; an installed package (or a custom layout) names the folder with
``REGIONBUS_JVM_LIB``, or, for Kafka alone, uses a Kafka distribution via ``KAFKA_HOME``.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Mapping
from pathlib import Path

from regionbus.schemas.errors import StackError

JVM_LIB_ENV_VAR = "REGIONBUS_JVM_LIB"
"""Environment variable naming the folder that holds ``kafka/`` and ``spark/`` jar folders."""

KAFKA_HOME_ENV_VAR = "KAFKA_HOME"
"""An Apache Kafka binary distribution; its ``libs/`` is used when no resolved jars exist."""

CHECKOUT_LIB = Path(__file__).resolve().parents[3] / "jvm" / "lib"
"""``jvm/lib`` of the checkout this package runs from (this file is
``src/regionbus/devstack/jvm.py`` there)."""
_KAFKA_JAR = re.compile(r"^kafka_2\.13-(\d+\.\d+\.\d+)\.jar$")
_BOOTSTRAP_HINT = "run scripts/bootstrap.sh (needs Java 17 and Maven 3.8 with Maven Central)"


def jvm_lib_dir(
    module: str, environ: Mapping[str, str] | None = None, checkout_lib: Path = CHECKOUT_LIB
) -> Path:
    """The folder of one module's jars, e.g. ``jvm/lib/kafka``.

    Args:
        module: ``"kafka"`` or ``"spark"`` (a module of ``jvm/pom.xml``), or
            ``"wire-client"`` (the Java client of ``jvm/wire-client``).
        environ: Where to read ``REGIONBUS_JVM_LIB`` / ``KAFKA_HOME``; None reads
            ``os.environ``.
        checkout_lib: The checkout's ``jvm/lib``, tried after ``REGIONBUS_JVM_LIB``.

    Returns:
        An existing folder that holds at least one jar.

    Raises:
        StackError: no such folder, or it holds no jar; the message says how to get them.
    """
    env = os.environ if environ is None else environ
    candidates: list[Path] = []
    if env.get(JVM_LIB_ENV_VAR):
        candidates.append(Path(env[JVM_LIB_ENV_VAR]) / module)
    candidates.append(checkout_lib / module)
    if module == "kafka" and env.get(KAFKA_HOME_ENV_VAR):
        candidates.append(Path(env[KAFKA_HOME_ENV_VAR]) / "libs")
    for folder in candidates:
        if folder.is_dir() and any(folder.glob("*.jar")):
            return folder
    tried = ", ".join(str(c) for c in candidates)
    raise StackError(f"no {module} jars in {tried}: {_BOOTSTRAP_HINT}")


def kafka_version(lib_dir: Path) -> str:
    """The Apache Kafka version of the ``kafka_2.13-X.Y.Z.jar`` in ``lib_dir``.

    Raises:
        StackError: no such jar in the folder.
    """
    for jar in lib_dir.glob("kafka_2.13-*.jar"):
        match = _KAFKA_JAR.match(jar.name)
        if match:
            return match.group(1)
    raise StackError(f"no kafka_2.13-<version>.jar in {lib_dir}: {_BOOTSTRAP_HINT}")


def java_program(environ: Mapping[str, str] | None = None) -> str:
    """The ``java`` launcher: ``$JAVA_HOME/bin/java``, else the first on PATH.

    Raises:
        StackError: no Java found (Apache Kafka 4 needs Java 17 or newer).
    """
    env = os.environ if environ is None else environ
    home = env.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").is_file():
        return str(Path(home) / "bin" / "java")
    found = shutil.which("java")
    if found is None:
        raise StackError(
            "no java on PATH and no JAVA_HOME: install Java 17 (apt-get install "
            "openjdk-17-jre-headless), or set KAFKA_BOOTSTRAP_SERVERS to a running Kafka"
        )
    return found
