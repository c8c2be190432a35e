"""The connector jars a local session puts on the classpath must be the installed pyspark's."""

from __future__ import annotations

from pathlib import Path

from regionbus.spark.session import connector_mismatch


def test_a_connector_for_another_spark_than_the_installed_pyspark_is_named() -> None:
    lib = Path("/opt/jvm/lib/spark")
    jars = [
        lib / "commons-pool2-2.13.1.jar",
        lib / "spark-avro_2.13-4.1.1.jar",
        lib / "spark-sql-kafka-0-10_2.13-4.2.0.jar",
        lib / "spark-token-provider-kafka-0-10_2.13-4.2.0.jar",
    ]

    assert connector_mismatch(jars, "4.2.0") is None
    assert connector_mismatch(jars[:2], "4.3.0") is None, "no connector jar: nothing to match"
    message = connector_mismatch(jars, "4.3.0")
    assert message is not None
    assert "/opt/jvm/lib/spark is for Spark 4.2.0, but pyspark is 4.3.0" in message
    assert "spark-sql-kafka-0-10_2.13:4.3.0" in message
