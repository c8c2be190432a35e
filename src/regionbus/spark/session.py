"""A SparkSession set up for regionbus jobs and tests: in this process (``local[N]``) or on
a Spark standalone cluster (``spark://host:port``)."""

from __future__ import annotations

import logging
import os
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final

import pyspark
from pyspark.sql import SparkSession

from regionbus.devstack.jvm import jvm_lib_dir

log = logging.getLogger("regionbus.spark")

_LOOPBACK_MASTERS: Final = ("spark://127.0.0.1:", "spark://localhost:")
_CONNECTOR_JAR: Final = re.compile(r"spark-sql-kafka-0-10_2\.13-(.+)\.jar")

CONNECTOR_MODULE: Final = "spark"
"""The ``jvm/pom.xml`` module whose jars are Spark's Kafka connector and Avro functions."""


def connector_jars(environ: Mapping[str, str] | None = None) -> list[Path]:
    """The jars of Spark's Kafka connector and ``spark-avro``, as ``scripts/bootstrap.sh``
    resolved them into ``jvm/lib/spark`` (or ``$REGIONBUS_JVM_LIB/spark``).

    Args:
        environ: Where to read ``REGIONBUS_JVM_LIB``; None reads ``os.environ``.

    Returns:
        The jar paths, sorted.

    Raises:
        StackError: no resolved jars were found (the message says how to get them).
    """
    return sorted(jvm_lib_dir(CONNECTOR_MODULE, environ).glob("*.jar"))


def connector_mismatch(jars: Sequence[Path], pyspark_version: str) -> str | None:
    """Why Spark's Kafka connector among ``jars`` may fail on this pyspark, or None.

    The connector is built against one Spark release's internals, so its version must be
    the installed pyspark's; pyspark's range (any 4.x from 4.2) is wider than the one
    version ``jvm/pom.xml`` resolves.

    Args:
        jars: Jar paths (:func:`connector_jars`).
        pyspark_version: The installed pyspark's version, e.g. ``"4.2.0"``.

    Returns:
        A message naming both versions and the two ways to match them, or None when the
        connector is that version (or no connector jar is among ``jars``).
    """
    found = {jar: m.group(1) for jar in jars if (m := _CONNECTOR_JAR.fullmatch(jar.name))}
    if set(found.values()) <= {pyspark_version}:
        return None
    folders = ", ".join(sorted({str(jar.parent) for jar in found}))
    versions = ", ".join(sorted(set(found.values())))
    return (
        f"Spark's Kafka connector in {folders} is for Spark {versions}, but pyspark is "
        f"{pyspark_version}: set spark.version in jvm/pom.xml to {pyspark_version} and run "
        "scripts/bootstrap.sh, or start the session with spark.jars.packages "
        f"org.apache.spark:spark-sql-kafka-0-10_2.13:{pyspark_version} (docs/spark.md)"
    )


def local_session(
    app_name: str = "regionbus",
    master: str = "local[2]",
    shuffle_partitions: int = 2,
    conf: Mapping[str, str] | None = None,
) -> SparkSession:
    """Get or create a SparkSession with Spark's Kafka connector and Avro functions on its
    classpath, whose Python workers run this interpreter.

    The connector jars come from the local folder the set-up filled (``spark.jars``), so
    nothing is resolved or downloaded when the session starts, and
    ``spark.read.format("kafka")``, ``readStream.format("kafka")`` and
    ``df.write.format("kafka")`` work at once. On a standalone cluster Spark ships the
    ``spark.jars`` to every executor; their Python workers run this interpreter too, so
    the executors must see the same Python environment (true of a cluster on this
    machine, as ``regionbus spark cluster`` starts; elsewhere install regionbus there). A
    master on loopback gets the driver on loopback as well, so its executors reach it
    whatever the host name resolves to.

    Python UDFs run in worker processes; without ``PYSPARK_PYTHON`` /
    ``spark.pyspark.python`` they start whatever ``python3`` is first on ``PATH``, which
    may lack this environment's packages. ``PYSPARK_PYTHON`` is set to this interpreter
    unless already set.

    Args:
        app_name: Spark application name.
        master: Spark master URL (``local[2]``: two cores in this process's JVM;
            ``spark://127.0.0.1:7077``: a standalone cluster's master).
        shuffle_partitions: ``spark.sql.shuffle.partitions`` (Spark's 200 is far too many
            for small local jobs).
        conf: More Spark settings; a ``spark.jars`` given here is added to the connector's.

    Returns:
        The session (an existing one is returned with these settings applied where Spark
        allows changing them at run time; ``spark.jars`` only counts for a new one).

    Logs a warning when the connector is for another Spark version than the installed
    pyspark (:func:`connector_mismatch`).

    Raises:
        StackError: the connector jars were never resolved (run ``scripts/bootstrap.sh``).
    """
    # Read by the JVM (which inherits this environment) for every kind of Python worker.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    extra = dict(conf or {})
    found = connector_jars()
    mismatch = connector_mismatch(found, pyspark.__version__)
    if mismatch is not None:
        log.warning(mismatch)
    jars = [str(jar) for jar in found]
    if extra.get("spark.jars"):
        jars.append(extra.pop("spark.jars"))
    builder = (
        SparkSession.builder.appName(app_name)
        .master(master)
        .config("spark.jars", ",".join(jars))
        .config("spark.pyspark.python", sys.executable)
        .config("spark.pyspark.driver.python", sys.executable)
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
    )
    if master.startswith(_LOOPBACK_MASTERS):
        builder = builder.config("spark.driver.host", "127.0.0.1").config(
            "spark.driver.bindAddress", "127.0.0.1"
        )
    for key, value in extra.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    return session


__all__ = ["CONNECTOR_MODULE", "connector_jars", "connector_mismatch", "local_session"]
