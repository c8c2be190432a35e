"""Choosing the Kafka format: Spark's JVM connector when present, else the Python source.

A user with Maven access adds the connector with
``spark.jars.packages=org.apache.spark:spark-sql-kafka-0-10_2.13:<spark version>``; our
machines cannot download it, so there :func:`kafka_format` registers
:class:`spark.source.KafkaTopicsSource` and returns its name. Either way the caller writes
``spark.read.format(kafka_format(spark)).option("kafka.bootstrap.servers", ...)`` and the
same options, schema and sink columns apply.
"""

from __future__ import annotations

import logging
from typing import Final

from pyspark.errors import AnalysisException
from pyspark.sql import SparkSession

from spark.source import SOURCE_NAME, KafkaTopicsSource

log = logging.getLogger("regionbus.spark")

JVM_FORMAT: Final = "kafka"
"""The format name of Spark's built-in (JVM) Kafka source."""

_registered: set[int] = set()


def jvm_connector_present(spark: SparkSession) -> bool:
    """Whether ``format("kafka")`` resolves to Spark's JVM connector in this session.

    Probes by analysing a Kafka read (the connector builds its relation without contacting
    any broker); a missing connector fails analysis with ``DATA_SOURCE_NOT_FOUND``.

    Args:
        spark: The session.
    """
    try:
        _ = (
            spark.read.format(JVM_FORMAT)
            .option("kafka.bootstrap.servers", "127.0.0.1:9")
            .option("subscribe", "regionbus-format-probe")
            .load()
            .schema
        )
    except AnalysisException as exc:
        if "DATA_SOURCE_NOT_FOUND" in str(exc) or "Failed to find data source" in str(exc):
            return False
        raise
    return True


def register_python_source(spark: SparkSession) -> str:
    """Register :class:`KafkaTopicsSource` in the session (once) and return its name."""
    key = id(spark)
    if key not in _registered:
        spark.dataSource.register(KafkaTopicsSource)
        _registered.add(key)
    return SOURCE_NAME


def kafka_format(spark: SparkSession, prefer_jvm: bool = True) -> str:
    """The format to read and write regionbus topics with in this session.

    Args:
        spark: The session.
        prefer_jvm: Use the JVM connector when it is on the classpath; False always
            uses the Python source.

    Returns:
        ``"kafka"`` (JVM connector) or :data:`spark.source.SOURCE_NAME` (Python source,
        registered by this call).

    Raises:
        pyspark.errors.AnalysisException: the probe failed for another reason than a
            missing connector.
    """
    if prefer_jvm and jvm_connector_present(spark):
        return JVM_FORMAT
    log.info("Spark's Kafka connector is not on the classpath: using the Python source")
    return register_python_source(spark)


__all__ = ["JVM_FORMAT", "jvm_connector_present", "kafka_format", "register_python_source"]
