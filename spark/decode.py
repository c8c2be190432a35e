"""Decoding regionbus topic records into typed columns.

A record's value is a framed Avro message (:mod:`schemas.codec`) or a ``Batch`` of them:
the server writes one poll's events for a queue as one batch, and ``put_all`` sends one per
bucket. :func:`decode_messages` explodes batches (one row per message) and spreads each
message over typed columns; :func:`decode_values` turns entry value bytes into a struct of
the region's value type. A record that cannot be decoded becomes one row with
``decode_error`` set, so one bad record never fails a job (invariant 6).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Final

import pyarrow as pa
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F  # noqa: N812
from pyspark.sql.pandas.types import to_arrow_type
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    DataType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from schemas.codec import decode, split_batch
from schemas.errors import MessageDecodeError, SerializationError
from schemas.messages import Control, Event, Marker, Operation, Reply
from schemas.serializers import AvroSerializer

DECODED_SCHEMA: Final = StructType(
    [
        StructField("index", IntegerType()),
        StructField("message_type", StringType()),
        StructField("region", StringType()),
        StructField("key", StringType()),
        StructField("operation", StringType()),
        StructField("member", StringType()),
        StructField("thread", LongType()),
        StructField("sequence", LongType()),
        StructField("bucket", IntegerType()),
        StructField("version", LongType()),
        StructField("timestamp_ms", LongType()),
        StructField("originator", StringType()),
        StructField("value", BinaryType()),
        StructField("serializer", StringType()),
        StructField("possible_duplicate", BooleanType()),
        StructField("callback_argument", BinaryType()),
        StructField("origin_site_id", IntegerType()),
        StructField("decode_error", StringType()),
    ]
)
"""Columns :func:`decode_messages` adds."""

_DROPPED: Final = ("key", "value", "headers")
_NAMES: Final = [f.name for f in DECODED_SCHEMA.fields]


def _row_of(index: int, message: Any) -> dict[str, Any]:
    row: dict[str, Any] = {"index": index, "message_type": type(message).__name__}
    if isinstance(message, Event | Operation):
        row.update(
            region=message.region,
            key=message.key,
            operation=message.kind.value,
            timestamp_ms=message.timestamp_ms,
            value=message.value,
            serializer=message.serializer,
            possible_duplicate=message.possible_duplicate,
            callback_argument=message.callback_argument,
            origin_site_id=message.origin_site_id,
        )
        eid = message.event_id
        if eid is not None:
            row.update(
                member=eid.member, thread=eid.thread, sequence=eid.sequence, bucket=eid.bucket
            )
        if isinstance(message, Event):
            row.update(version=message.version, originator=message.originator)
        else:
            row["originator"] = message.client_id
    elif isinstance(message, Marker):
        row.update(operation="MARKER", originator=message.client_id)
        row["timestamp_ms"] = message.timestamp_ms
    elif isinstance(message, Control):
        row.update(
            operation=message.kind.value,
            originator=message.client_id,
            timestamp_ms=message.timestamp_ms,
        )
    elif isinstance(message, Reply):
        row.update(
            operation=message.event_kind.value if message.event_kind else None,
            bucket=message.bucket,
            version=message.version,
            value=message.value,
            serializer=message.serializer,
        )
    return row


def _decoded_rows(raw: bytes | None) -> list[dict[str, Any]]:
    try:
        items = split_batch(raw)
    except MessageDecodeError as exc:
        return [{"index": 0, "decode_error": str(exc)}]
    rows = []
    for index, item in enumerate(items):
        try:
            rows.append(_row_of(index, decode(item)))
        except MessageDecodeError as exc:
            rows.append({"index": index, "decode_error": str(exc)})
    return rows


def decode_record_values(values: list[bytes | None]) -> tuple[list[int], list[pa.Array]]:
    """Decode Kafka record values into the Arrow columns of :data:`DECODED_SCHEMA`.

    The part of :func:`decode_messages` that needs no Spark session (each executor runs it
    on its Arrow batches), public so it can be run over arbitrary bytes.

    Args:
        values: Record values (framed messages, batches, or anything else; None allowed).

    Returns:
        ``(source_rows, columns)``: for each output row the index in ``values`` it came from
        (a batch gives several rows, anything else one), and one Arrow array per field of
        :data:`DECODED_SCHEMA`, in order. A value that cannot be decoded gives a row with
        only ``index`` and ``decode_error`` set; nothing raises for bad bytes.
    """
    source_rows: list[int] = []
    columns: dict[str, list[Any]] = {name: [] for name in _NAMES}
    for i, raw in enumerate(values):
        for row in _decoded_rows(raw):
            source_rows.append(i)
            for name in _NAMES:
                columns[name].append(row.get(name))
    arrays = [pa.array(columns[f.name], to_arrow_type(f.dataType)) for f in DECODED_SCHEMA.fields]
    return source_rows, arrays


def decode_messages(df: DataFrame, value_column: str = "value") -> DataFrame:
    """One row per regionbus message in the records of a Kafka DataFrame.

    Args:
        df: Rows of the Kafka source schema (or any DataFrame with a binary
            ``value_column``).
        value_column: The column holding the framed bytes.

    Returns:
        ``df``'s other columns except ``key``, ``value`` and ``headers`` (so ``topic``,
        ``partition``, ``offset``, ``timestamp`` stay), repeated for each message of a
        batch, followed by :data:`DECODED_SCHEMA`: ``index`` (position in the batch),
        ``message_type`` (``Event``, ``Operation``, ``Marker``, ``Reply``, ``Control``),
        ``region``, ``key``, ``operation`` (event kind such as ``CREATE``, or operation kind
        such as ``PUT``; ``MARKER`` for a marker), the EventID (``member``, ``thread``,
        ``sequence``, ``bucket``), ``version``, ``timestamp_ms`` (milliseconds since the
        Unix epoch, UTC), ``originator`` (the client that made the change), ``value`` (entry
        value bytes; see :func:`decode_values`), ``serializer``, ``possible_duplicate``,
        ``callback_argument``, ``origin_site_id`` and ``decode_error`` (null unless the
        record or message could not be decoded; the other decoded columns are then null).
    """
    kept = [f for f in df.schema.fields if f.name not in (*_DROPPED, value_column)]
    out_schema = StructType([*kept, *DECODED_SCHEMA.fields])
    kept_names = [f.name for f in kept]
    decoded_arrow = pa.schema(
        [pa.field(f.name, to_arrow_type(f.dataType)) for f in out_schema.fields[len(kept) :]]
    )

    def explode(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            source_rows, decoded = decode_record_values(batch.column(value_column).to_pylist())
            repeated = batch.select(kept_names).take(pa.array(source_rows, pa.int64()))
            yield pa.RecordBatch.from_arrays(
                [*repeated.columns, *decoded],
                schema=pa.schema([*repeated.schema, *decoded_arrow]),
            )

    return df.select(*kept_names, value_column).mapInArrow(explode, out_schema)


def decode_values(
    df: DataFrame,
    schema: StructType | str,
    *,
    avro_schema: dict[str, Any] | None = None,
    value_column: str = "value",
    serializer_column: str = "serializer",
    output_column: str = "entry",
) -> DataFrame:
    """Add a struct column holding each entry value decoded into the region's value type.

    JSON values (serializer ``json``, the default) are parsed by Spark's ``from_json``; Avro
    values of a typed region (serializer ``avro:<name>``) by fastavro with ``avro_schema``.
    Values of another serializer, absent values (destroy, invalidate) and values that do not
    parse give null.

    Args:
        df: A DataFrame from :func:`decode_messages` (or any with the two columns).
        schema: The value type, a ``StructType`` or DDL string such as
            ``"carrier string, dep_delay double"``; fields missing from a value are null.
        avro_schema: The region's Avro record schema, for typed regions.
        value_column: Column of value bytes.
        serializer_column: Column of serializer names.
        output_column: Name of the added column.

    Returns:
        ``df`` with ``output_column`` added.

    Raises:
        SerializationError: ``avro_schema`` is not a valid Avro record schema.
    """
    struct = schema if isinstance(schema, StructType) else DataType.fromDDL(schema)
    if not isinstance(struct, StructType):
        raise SerializationError(f"value schema must be a struct, got {struct}")
    if avro_schema is None:
        parsed: Column = F.from_json(F.col(value_column).cast("string"), struct)
        return df.withColumn(output_column, F.when(F.col(serializer_column) == "json", parsed))
    try:
        serializer = AvroSerializer(avro_schema)
    except Exception as exc:  # fastavro raises many types on a bad schema
        raise SerializationError(f"invalid Avro schema: {exc}") from exc
    name = serializer.name
    out_schema = StructType([*df.schema.fields, StructField(output_column, struct)])
    arrow_type = to_arrow_type(struct)

    def add_values(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            values = []
            serializers = batch.column(serializer_column).to_pylist()
            for raw, used in zip(batch.column(value_column).to_pylist(), serializers, strict=True):
                value = None
                if raw is not None and used == name:
                    try:
                        value = serializer.loads(raw)
                    except SerializationError:
                        value = None
                values.append(value)
            column = pa.array(values, arrow_type)
            yield pa.RecordBatch.from_arrays(
                [*batch.columns, column],
                schema=pa.schema([*batch.schema, pa.field(output_column, arrow_type)]),
            )

    return df.mapInArrow(add_values, out_schema)


__all__ = ["DECODED_SCHEMA", "decode_messages", "decode_record_values", "decode_values"]
