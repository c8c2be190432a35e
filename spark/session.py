"""A local SparkSession set up for regionbus jobs and tests."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from pyspark.sql import SparkSession


def local_session(
    app_name: str = "regionbus",
    master: str = "local[2]",
    shuffle_partitions: int = 2,
    conf: Mapping[str, str] | None = None,
) -> SparkSession:
    """Get or create a SparkSession whose Python workers run this interpreter.

    Python data sources and UDFs run in worker processes; without ``PYSPARK_PYTHON`` /
    ``spark.pyspark.python`` they start whatever ``python3`` is first on ``PATH``, which
    may lack this environment's packages. ``PYSPARK_PYTHON`` is set to this interpreter
    unless already set.

    Args:
        app_name: Spark application name.
        master: Spark master URL (``local[2]``: two cores in this process's JVM).
        shuffle_partitions: ``spark.sql.shuffle.partitions`` (Spark's 200 is far too many
            for small local jobs).
        conf: More Spark settings, e.g. ``{"spark.jars.packages": "..."}``.

    Returns:
        The session (an existing one is returned with these settings applied where Spark
        allows changing them at run time).
    """
    # Read by the JVM (which inherits this environment) for every kind of Python worker;
    # the data-source planner ignores spark.pyspark.python.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.appName(app_name)
        .master(master)
        .config("spark.pyspark.python", sys.executable)
        .config("spark.pyspark.driver.python", sys.executable)
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
    )
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    return session


__all__ = ["local_session"]
