"""Decoding regionbus topic records into typed columns, in the JVM.

A record's value is a framed Avro message (:mod:`regionbus.schemas.codec`: magic byte ``0xB1``, a
type
byte, the Avro body) or a ``Batch`` of them: the server writes one poll's events for a queue
as one batch, and ``put_all`` sends one per bucket. :func:`decode_messages` explodes batches
(one row per message) and spreads each message over typed columns with Spark's own
``from_avro`` on the bytes after the frame header, the reader schema of each type taken
from this repository's ``schemas/*.avsc`` (the one source of truth); no row goes through
Python. :func:`read_messages` is the one call from a topic to those columns.
:func:`decode_values` turns entry value bytes into a struct of the region's value type
(``from_json`` or ``from_avro``). A record that cannot be decoded becomes one row with
``decode_error`` set, so one bad record never fails a job (invariant 6). Each row keeps
whom its record was for (:data:`ADDRESS_SCHEMA`): the record key and the client ids of the
``rb.to`` header (`regionbus.schemas.addressing`).

:func:`decode_record_values` is the same decoding in Python (fastavro), kept as the
reference the JVM decoding is tested against and for tools that hold bytes without Spark.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any, Final

import pyarrow as pa
from fastavro.schema import load_schema, to_parsing_canonical_form
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F  # noqa: N812
from pyspark.sql.avro.functions import from_avro
from pyspark.sql.pandas.types import to_arrow_type
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    DataType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from regionbus import schemas
from regionbus.schemas.addressing import RECIPIENTS_HEADER
from regionbus.schemas.codec import (
    MAGIC,
    SINGLE_OBJECT_MARKER,
    TYPE_BYTES,
    decode,
    schema_fingerprint,
    split_batch,
)
from regionbus.schemas.errors import MessageDecodeError, SerializationError
from regionbus.schemas.messages import Control, CqEvent, Event, Marker, Operation, Reply
from regionbus.schemas.serializers import AvroSerializer
from regionbus.spark.format import kafka_reader

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

ADDRESS_SCHEMA: Final = StructType(
    [
        StructField("record_key", BinaryType()),
        StructField("recipients", ArrayType(StringType())),
    ]
)
"""Columns :func:`decode_messages` keeps of each record, before :data:`DECODED_SCHEMA`:
``record_key`` is the Kafka record key; ``recipients`` the client ids its ``rb.to`` header
lists (`regionbus.schemas.addressing.recipient_ids`), null without that header."""

_DROPPED: Final = ("key", "value", "headers", *ADDRESS_SCHEMA.names)
_NAMES: Final = [f.name for f in DECODED_SCHEMA.fields]


def _row_of(index: int, message: Any) -> dict[str, Any]:
    row: dict[str, Any] = {"index": index, "message_type": type(message).__name__}
    if isinstance(message, CqEvent):
        # A continuous query's event: the change's columns (its CQ list is not among them).
        return {**_row_of(index, message.event), "message_type": "CqEvent"}
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


_TYPES: Final = {
    1: "Operation",
    2: "Event",
    3: "Reply",
    4: "Control",
    5: "Marker",
    7: "CqEvent",
}
"""Type byte -> record name (as :data:`regionbus.schemas.codec.TYPE_BYTES`)."""
_BATCH_TYPE: Final = 6
_SCHEMA_DIR: Final = Path(schemas.__file__).parent
_PERMISSIVE: Final = {"mode": "PERMISSIVE"}
_REQUIRED: Final = {
    "Operation": "request_id",
    "Event": "event_id",
    "Reply": "request_id",
    "Control": "kind",
    "Marker": "client_id",
    "CqEvent": "event",
    "Batch": "messages",
}
"""A field each record always has: null after ``from_avro`` means the bytes did not decode
(PERMISSIVE mode gives a struct of nulls rather than failing the job)."""


@cache
def avro_reader_schema(name: str) -> str:
    """The Avro schema of one regionbus record as JSON for ``from_avro``: the parsing
    canonical form of ``schemas/regionbus.<name>.avsc``, named references inlined.

    Args:
        name: Record name, e.g. ``"Event"`` or ``"Batch"``.
    """
    canonical: str = to_parsing_canonical_form(
        load_schema(str(_SCHEMA_DIR / f"regionbus.{name}.avsc"))
    )
    return canonical


_SINGLE_OBJECT_TYPES: Final = {
    schema_fingerprint(cls.__name__): type_byte for cls, type_byte in TYPE_BYTES.items()
} | {schema_fingerprint("Batch"): _BATCH_TYPE}
_REST: Final = 2**31 - 1


def _regionbus_frame(data: Column) -> Column:
    """A record in Avro's single-object encoding of a regionbus schema (``C3 01``, the
    schema's fingerprint, the body) as the regionbus frame of the same body (``0xB1``, its
    type byte), as :func:`regionbus.schemas.codec.regionbus_frame` does; any other bytes
    as they are."""
    fingerprint = F.substring(data, 3, 8)
    type_byte = F.coalesce(
        *[
            F.when(fingerprint == F.lit(found), F.lit(bytes([byte])))
            for found, byte in _SINGLE_OBJECT_TYPES.items()
        ]
    )
    single_object = (F.substring(data, 1, 2) == F.lit(SINGLE_OBJECT_MARKER)) & type_byte.isNotNull()
    return F.when(
        single_object, F.concat(F.lit(bytes([MAGIC])), type_byte, F.substring(data, 11, _REST))
    ).otherwise(data)


def _framed(data: Column) -> Column:
    return (F.length(data) >= 2) & (F.substring(data, 1, 1) == F.lit(bytes([MAGIC])))


def _type_of(data: Column) -> Column:
    return F.conv(F.hex(F.substring(data, 2, 1)), 16, 10).cast("int")


def _from_avro(body: Column, name: str) -> Column:
    return from_avro(body, avro_reader_schema(name), _PERMISSIVE)


def _frame_error(data: Column) -> Column:
    return F.when(F.coalesce(F.length(data), F.lit(0)) < 2, "empty or truncated message").when(
        F.substring(data, 1, 1) != F.lit(bytes([MAGIC])),
        F.concat(
            F.lit("not a regionbus message (magic 0x"),
            F.lower(F.hex(F.substring(data, 1, 1))),
            F.lit(")"),
        ),
    )


def _address_columns(df: DataFrame) -> list[Column]:
    names = set(df.columns)
    key = F.col("key").cast("binary") if "key" in names else F.lit(None).cast("binary")
    recipients = F.lit(None).cast("array<string>")
    if "headers" in names:
        # The first rb.to header, its NUL-separated ids (empty parts dropped), as the
        # clients read it; get() is null past the end, so no header gives null.
        listed = F.get(F.filter("headers", lambda h: h["key"] == RECIPIENTS_HEADER), 0)
        ids = F.split(listed["value"].cast("string"), "\\x00")
        recipients = F.filter(ids, lambda part: part != "")
    return [key.alias("record_key"), recipients.alias("recipients")]


def decode_messages(df: DataFrame, value_column: str = "value") -> DataFrame:
    """One row per regionbus message in the records of a Kafka DataFrame, decoded in the JVM.

    Works on batch and streaming DataFrames alike (only column expressions: ``from_avro``
    with the schemas of ``schemas/*.avsc``, ``posexplode`` for batches).

    Args:
        df: Rows of the Kafka source schema (or any DataFrame with a binary
            ``value_column``).
        value_column: The column holding the framed bytes.

    Returns:
        ``df``'s other columns except ``key``, ``value`` and ``headers`` (so ``topic``,
        ``partition``, ``offset``, ``timestamp``, ``timestampType`` stay), then
        :data:`ADDRESS_SCHEMA`: ``record_key`` (the record's ``key``, binary; on a shared
        client queue or reply topic the id of the one client a record is for, or a NUL byte
        and 8 hex digits for a record for several) and ``recipients`` (the ids listed in its
        ``rb.to`` header: the clients a record for several is for, null without the header;
        ``headers`` is read only when ``df`` has it, as Spark's Kafka source gives it with
        ``includeHeaders=true``), these replacing any columns of those names in ``df``; all
        repeated for each message of a batch, followed by :data:`DECODED_SCHEMA`: ``index``
        (position in the batch), ``message_type`` (``Event``, ``Operation``, ``Marker``, ``Reply``,
        ``Control``, ``CqEvent``: a continuous query's event, with its change's columns),
        ``region``, ``key``, ``operation`` (event kind such as ``CREATE``, or
        operation kind such as ``PUT``; ``MARKER`` for a marker), the EventID (``member``,
        ``thread``, ``sequence``, ``bucket``), ``version``, ``timestamp_ms`` (milliseconds
        since the Unix epoch, UTC), ``originator`` (the client that made the change),
        ``value`` (entry value bytes; see :func:`decode_values`), ``serializer``,
        ``possible_duplicate``, ``callback_argument``, ``origin_site_id`` and
        ``decode_error`` (null unless the record or message could not be decoded; the other
        decoded columns are then null). The decoded columns are those of
        :func:`decode_record_values`.
    """
    kept = [f.name for f in df.schema.fields if f.name not in (*_DROPPED, value_column)]
    addressed = df.select(*kept, *_address_columns(df), F.col(value_column))
    kept += ADDRESS_SCHEMA.names
    # Each from_avro is computed in a projection of its own: a later projection reading
    # many fields of its struct then reuses it (Spark does not merge a projection into the
    # next when that would repeat an expensive expression), where one projection would
    # decode the record again for each field, being inside conditional expressions.
    framed = addressed.select(*kept, _regionbus_frame(F.col(value_column)).alias("_raw"))
    raw = F.col("_raw")
    is_batch = _framed(raw) & (_type_of(raw) == _BATCH_TYPE)
    records = framed.select(
        *kept,
        "_raw",
        is_batch.alias("_is_batch"),
        F.when(is_batch, _from_avro(F.expr("substring(_raw, 3)"), "Batch"))["messages"].alias(
            "_messages"
        ),
    )
    record_error = F.when(F.col("_is_batch") & F.col("_messages").isNull(), "undecodable Batch")
    items = F.when(F.col("_is_batch") & F.col("_messages").isNotNull(), F.col("_messages"))
    exploded = records.select(
        *kept,
        record_error.alias("_record_error"),
        F.posexplode(F.coalesce(items, F.array("_raw"))).alias("index", "_framed_item"),
    ).select(
        *kept, "_record_error", "index", _regionbus_frame(F.col("_framed_item")).alias("_item")
    )
    item = F.col("_item")
    body = F.expr("substring(_item, 3)")
    structs = exploded.select(
        *kept,
        "index",
        "_record_error",
        "_item",
        _type_of(item).alias("_kind"),
        *[
            F.when(_framed(item) & (_type_of(item) == byte), _from_avro(body, name)).alias(
                f"_{name}"
            )
            for byte, name in _TYPES.items()
        ],
    )
    kind = F.col("_kind")
    decoded = {name: F.col(f"_{name}") for name in _TYPES.values()}
    undecodable = F.coalesce(
        *[
            F.when((kind == byte) & decoded[name][_REQUIRED[name]].isNull(), f"undecodable {name}")
            for byte, name in _TYPES.items()
        ]
    )
    error = F.coalesce(
        F.col("_record_error"),
        _frame_error(item),
        F.when(
            ~kind.isin(*_TYPES),
            F.concat(F.lit("unknown message type "), kind.cast("string")),
        ),
        undecodable,
    )
    op, rp, ct, mk = (decoded[n] for n in ("Operation", "Reply", "Control", "Marker"))
    # A CQ event's columns are those of the change it carries.
    ev = F.coalesce(decoded["Event"], decoded["CqEvent"]["event"])
    columns = {
        "message_type": F.element_at(
            F.create_map(*[x for b, n in _TYPES.items() for x in (F.lit(b), F.lit(n))]), kind
        ),
        "region": F.coalesce(ev["region"], op["region"]),
        "key": F.coalesce(ev["key"], op["key"]),
        "operation": F.coalesce(
            ev["kind"], op["kind"], F.when(kind == 5, "MARKER"), ct["kind"], rp["event_kind"]
        ),
        "member": F.coalesce(ev["event_id"]["member"], op["event_id"]["member"]),
        "thread": F.coalesce(ev["event_id"]["thread"], op["event_id"]["thread"]),
        "sequence": F.coalesce(ev["event_id"]["sequence"], op["event_id"]["sequence"]),
        "bucket": F.coalesce(ev["event_id"]["bucket"], op["event_id"]["bucket"], rp["bucket"]),
        "version": F.coalesce(ev["version"], rp["version"]),
        "timestamp_ms": F.coalesce(
            ev["timestamp_ms"], op["timestamp_ms"], mk["timestamp_ms"], ct["timestamp_ms"]
        ),
        "originator": F.coalesce(
            ev["originator"], op["client_id"], mk["client_id"], ct["client_id"]
        ),
        "value": F.coalesce(ev["value"], op["value"], rp["value"]),
        "serializer": F.coalesce(ev["serializer"], op["serializer"], rp["serializer"]),
        "possible_duplicate": F.coalesce(ev["possible_duplicate"], op["possible_duplicate"]),
        "callback_argument": F.coalesce(ev["callback_argument"], op["callback_argument"]),
        "origin_site_id": F.coalesce(ev["origin_site_id"], op["origin_site_id"]),
    }
    ok = F.col("decode_error").isNull()
    with_error = structs.withColumn("decode_error", error)
    return with_error.select(
        *kept,
        F.col("index").cast("int").alias("index"),
        *[
            F.when(ok, expr).cast(DECODED_SCHEMA[name].dataType).alias(name)
            for name, expr in columns.items()
        ],
        "decode_error",
    )


def read_messages(
    spark: SparkSession,
    *,
    kafka_bootstrap_servers: str,
    subscribe: str,
    kafka_config: Mapping[str, str] | None = None,
    streaming: bool = False,
    options: Mapping[str, str] | None = None,
) -> DataFrame:
    """Read regionbus topics with Spark's Kafka connector and decode them: the one call from
    ``{ns}.events``, a subscription queue or a gateway queue to typed columns.

    Args:
        spark: A session with the connector on its classpath
        (:func:`regionbus.spark.session.local_session`).
        kafka_bootstrap_servers: Kafka.
        subscribe: Topic name(s), comma separated (``{ns}.events``, ``{ns}.queues``,
            ``{ns}.gw.<sender>``, ...).
        kafka_config: librdkafka settings (without the ``kafka.`` prefix), translated for the
            JVM client by :func:`regionbus.spark.format.jvm_kafka_options`.
        streaming: A Structured Streaming DataFrame (``readStream``) instead of a batch one.
        options: More options of Spark's Kafka source (``startingOffsets``,
            ``endingOffsets``, ``maxOffsetsPerTrigger``, ...).

    Returns:
        The rows of :func:`decode_messages`: the record's ``topic, partition, offset,
        timestamp, timestampType``, ``record_key, recipients`` and the decoded columns.
        The headers are read (``includeHeaders=true``) unless ``options`` says otherwise,
        so ``recipients`` is set.

    Raises:
        ConfigurationError: a librdkafka setting that cannot be translated.
    """
    reader = kafka_reader(spark, kafka_bootstrap_servers, kafka_config, streaming=streaming).option(
        "subscribe", subscribe
    )
    for key, value in {"includeHeaders": "true", **(options or {})}.items():
        reader = reader.option(key, value)
    return decode_messages(reader.load())


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
    values of a typed region (serializer ``avro:<name>``) by Spark's ``from_avro`` with
    ``avro_schema``; both in the JVM.
    Values of another serializer, absent values (destroy, invalidate) and values that do not
    parse give null (an Avro value counts as unparsed when a field its schema declares
    non-null comes out null).

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
    fields = {f["name"] for f in avro_schema.get("fields", [])}
    record = from_avro(F.col(value_column), json.dumps(avro_schema), _PERMISSIVE)
    value = F.struct(
        *[
            (record[f.name] if f.name in fields else F.lit(None)).cast(f.dataType).alias(f.name)
            for f in struct.fields
        ]
    )
    decodable = (F.col(serializer_column) == serializer.name) & F.col(value_column).isNotNull()
    # PERMISSIVE from_avro gives a struct of nulls for bytes that do not parse: a field the
    # schema makes non-null tells such a value from a real one.
    required = [
        f["name"]
        for f in avro_schema.get("fields", [])
        if not (isinstance(f["type"], list) and "null" in f["type"])
    ]
    if required:
        decodable = decodable & record[required[0]].isNotNull()
    return df.withColumn(output_column, F.when(decodable, value))


__all__ = [
    "ADDRESS_SCHEMA",
    "DECODED_SCHEMA",
    "avro_reader_schema",
    "decode_messages",
    "decode_record_values",
    "decode_values",
    "read_messages",
]
