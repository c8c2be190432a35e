"""A Spark driver process for the kill -9 test: streams a topic into a Parquet table.

Usage: ``python spark_stream_driver.py BOOTSTRAP TOPIC OUTPUT CHECKPOINT [STALL_MARKER]``.
Reads TOPIC with the regionbus Kafka format (Spark's JVM connector; the log names it), 100
records per micro-batch, into a Parquet file sink (exactly once through its metadata log),
with ``Trigger.AvailableNow``. With
STALL_MARKER, a task of the first micro-batch that starts after two committed batches
creates that file and sleeps, so the test can kill the driver in the middle of a batch.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa

from regionbus.spark.format import kafka_format
from regionbus.spark.session import local_session

_RECORDS_PER_BATCH = "100"
_STALL_S = 600


def main(bootstrap: str, topic: str, output: str, checkpoint: str, stall_marker: str) -> None:
    spark = local_session("regionbus-stream-driver")
    commits = Path(checkpoint) / "commits"

    def maybe_stall(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            committed = len(list(commits.glob("[0-9]*"))) if commits.exists() else 0
            if stall_marker and committed >= 2:
                Path(stall_marker).touch()
                time.sleep(_STALL_S)
            yield batch

    fmt = kafka_format(spark)
    print(f"reading with format {fmt}", flush=True)
    stream = (
        spark.readStream.format(fmt)
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", _RECORDS_PER_BATCH)
        .load()
        .select("partition", "offset", "value")
    )
    query = (
        stream.mapInArrow(maybe_stall, stream.schema)
        .writeStream.format("parquet")
        .option("path", output)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    spark.stop()


if __name__ == "__main__":
    arguments = sys.argv[1:]
    main(*arguments[:4], arguments[4] if len(arguments) > 4 else "")
