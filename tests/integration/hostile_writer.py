"""An attacker writing hostile records, in its own OS process (as an attacker would be: the
records' compression and allocation must not compete with the workers under test for the
test process's interpreter).

Usage: ``python hostile_writer.py <bootstrap servers>`` with a JSON list on stdin, one
object per write, ``{"topic", "partition", "kind", ...}``:

- ``"bomb"``, ``total``, ``count``: ``count`` records of ``total // count`` zero bytes,
  zstd-compressed in as few batches as librdkafka makes (Kafka checks a compressed batch's
  size on the wire, not decompressed);
- ``"empty_items"``, ``count``: one regionbus ``Batch`` frame of ``count`` empty items;
- ``"value"``, ``hex``: one record of those bytes;
- ``"oversize"``, ``size``: one record of ``size`` bytes, which the topic should refuse.

Prints one JSON list: per write, ``{"offsets": [...], "error": <Kafka error code or
null>}``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from regionbus.schemas.codec import BATCH_TYPE, MAGIC
from regionbus.schemas.kafka_clients import kafka_producer


def _array_of_empty_items(count: int) -> bytes:
    """An Avro array body of ``count`` empty byte strings, in one block."""
    zigzag = count << 1
    header = bytearray()
    while zigzag >= 0x80:
        header.append((zigzag & 0x7F) | 0x80)
        zigzag >>= 7
    header.append(zigzag)
    return bytes(header) + b"\x00" * count + b"\x00"


def main() -> None:
    bootstrap = sys.argv[1]
    plain = kafka_producer({"bootstrap.servers": bootstrap, "message.max.bytes": 10_000_000})
    bomber = kafka_producer(
        {
            "bootstrap.servers": bootstrap,
            "compression.type": "zstd",
            "message.max.bytes": 1_000_000_000,
            "batch.size": 1_000_000_000,
            "linger.ms": 100,
        }
    )
    results: list[dict[str, Any]] = []
    for write in json.load(sys.stdin):
        result: dict[str, Any] = {"offsets": [], "error": None}

        def delivered(error: Any, message: Any, into: dict[str, Any] = result) -> None:
            if error is not None:
                into["error"] = error.code()
            else:
                into["offsets"].append(message.offset())

        kind = write["kind"]
        producer = bomber if kind == "bomb" else plain
        if kind == "bomb":
            values = [b"\0" * (write["total"] // write["count"])] * write["count"]
        elif kind == "empty_items":
            values = [bytes((MAGIC, BATCH_TYPE)) + _array_of_empty_items(write["count"])]
        elif kind == "value":
            values = [bytes.fromhex(write["hex"])]
        else:
            values = [b"x" * write["size"]]
        for value in values:
            producer.produce(
                write["topic"], value, partition=write["partition"], on_delivery=delivered
            )
        producer.flush(60)
        result["offsets"].sort()
        results.append(result)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
