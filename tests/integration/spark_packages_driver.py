"""A Spark driver whose session is docs/spark.md's, for an installed regionbus: the connector
and spark-avro named in ``spark.jars.packages``, resolved when the session starts.

Usage: ``python spark_packages_driver.py SESSION_SOURCE BOOTSTRAP TOPIC``. Runs the Python
file SESSION_SOURCE (the document's block, as written), which leaves ``spark``; the test
gives Spark its other settings through ``SPARK_CONF_DIR`` (Ivy resolving from a local
Maven repository only). Reads and decodes TOPIC with it and prints one JSON line: the
format the session reads Kafka with, its ``spark.jars`` and the decoded rows.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from regionbus.spark.decode import read_messages
from regionbus.spark.format import kafka_format


def main(session_source: str, bootstrap: str, topic: str) -> None:
    scope: dict[str, Any] = {}
    path = Path(session_source)
    exec(compile(path.read_text(), str(path), "exec"), scope)
    spark = scope["spark"]
    try:
        rows = read_messages(spark, kafka_bootstrap_servers=bootstrap, subscribe=topic)
        found = [
            [
                *(r.offset, r["index"], bytes(r.record_key or b"").decode(), r.region, r.key),
                *(r.operation, r.value.decode() if r.value is not None else None, r.decode_error),
            ]
            for r in rows.orderBy("offset", "index").collect()
        ]
        print(
            json.dumps(
                {
                    "format": kafka_format(spark),
                    "jars": spark.sparkContext.getConf().get("spark.jars", ""),
                    "rows": found,
                }
            ),
            flush=True,
        )
    finally:
        spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:4])
