"""A continuous query over history: what a CQ would have delivered, from ``{ns}.events``.

The same query text a client gives ``new_cq`` (parsed and checked by
:mod:`regionbus.schemas.cq`) compiles to a Spark SQL expression (:func:`cq_condition`)
that evaluates its predicate on JSON values with Geode's UNDEFINED rules, in the JVM: each
attribute path is read from the value parsed as a ``VARIANT`` (``try_parse_json``,
``variant_get``), a missing attribute (or one of a non-object) is SQL NULL (UNDEFINED),
but for the ones the servers read through a Java method (a mapping's ``size``,
``isEmpty``, ``values``, ``keySet``, ``entrySet``, a list's ``size``, a string's
``length``), a JSON null is a variant null, and the comparison table of
:mod:`regionbus.schemas.cq.evaluate` is spelled out case by case. The expression gives
``'T'``, ``'F'``, ``'U'`` (UNDEFINED) or ``'E'`` (the live CQ's error event).

:func:`cq_history` then does what the servers do per change (docs/behaviour.md §9): the old value of
a change is the value of the key's previous event (none after a region clear, destroy or
invalidate in between), the predicate is evaluated on the old and the new value, and the
query-operation table gives CREATE, UPDATE, DESTROY (or ERROR); region clears and destroys
are REGION_CLEAR and REGION_DESTROY. Events re-emitted after a failover (same EventID) are
counted once. Values of other serializers than JSON give ERROR rows.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final, NamedTuple

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F  # noqa: N812

from regionbus.schemas.cq import parse_cq
from regionbus.schemas.cq.syntax import (
    UNDEFINED,
    Comparison,
    Defined,
    Expr,
    Junction,
    Like,
    Literal,
    Membership,
    Not,
    Parameter,
    Path,
)

TRUE: Final = "T"
FALSE: Final = "F"
UNKNOWN: Final = "U"
ERROR: Final = "E"

_ENTRY_KINDS: Final = ("CREATE", "UPDATE", "DESTROY", "INVALIDATE")
_RESET_KINDS: Final = ("REGION_CLEAR", "REGION_DESTROY", "REGION_INVALIDATE")
_EVENT_ID: Final = ("member", "thread", "sequence", "bucket")
_NUMBER_TYPES: Final = ("BIGINT", "INT", "SMALLINT", "TINYINT", "DOUBLE", "FLOAT", "DECIMAL")


class _Operand(NamedTuple):
    """What the comparison table reads of an operand, as Spark columns."""

    undefined: Column
    null: Column
    kind: Column  # 'number', 'string', 'boolean' or 'other'
    number: Column
    text: Column
    boolean: Column
    json: Column


def _variant_operand(value: Column) -> _Operand:
    type_name = F.schema_of_variant(value)
    kind = (
        F.when(type_name == "STRING", F.lit("string"))
        .when(type_name == "BOOLEAN", F.lit("boolean"))
        .when(F.regexp_extract(type_name, r"^([A-Z]+)", 1).isin(*_NUMBER_TYPES), F.lit("number"))
        .otherwise(F.lit("other"))
    )
    return _Operand(
        undefined=value.isNull(),
        null=F.coalesce(F.is_variant_null(value), F.lit(False)),
        kind=kind,
        number=F.try_variant_get(value, "$", "double"),
        text=F.try_variant_get(value, "$", "string"),
        boolean=F.try_variant_get(value, "$", "boolean"),
        json=F.to_json(value),
    )


def _literal_operand(value: Any) -> _Operand:
    if value is UNDEFINED or value is None:
        kind = "other"
    elif isinstance(value, bool):
        kind = "boolean"
    elif isinstance(value, int | float):
        kind = "number"
    else:
        kind = "string"
    return _Operand(
        undefined=F.lit(value is UNDEFINED),
        null=F.lit(value is None),
        kind=F.lit(kind),
        number=F.lit(float(value) if kind == "number" else None).cast("double"),
        text=F.lit(value if kind == "string" else None).cast("string"),
        boolean=F.lit(value if kind == "boolean" else None).cast("boolean"),
        json=F.lit(None).cast("string"),
    )


_METHODS: Final = frozenset(
    {"size", "length", "isEmpty", "values", "keySet", "keys", "entrySet", "entries"}
)
"""The attributes the servers read through a ``java.util.Map``, ``List`` or ``String``
method when a value has no such key (`regionbus.schemas.cq.evaluate.read_path`)."""


def _path(value: Column, path: Path) -> Column:
    if not path.attributes:
        return value
    if not _METHODS.intersection(path.attributes):
        steps = "".join(_step_text(a) for a in path.attributes)
        return F.try_variant_get(value, "$" + steps, "variant")
    current = value
    for attribute in path.attributes:
        current = _step(current, attribute)
    return current


def _step_text(attribute: str) -> str:
    return "['" + attribute.replace("\\", "\\\\").replace("'", "\\'") + "']"


def _as_variant(column: Column) -> Column:
    """A number or boolean column as a VARIANT (its JSON text parsed)."""
    return F.try_parse_json(column.cast("string"))


def _step(current: Column, attribute: str) -> Column:
    """One step of a path: the object's key, else what the servers read through a method
    (a mapping's size, isEmpty, values, keySet, entrySet; a list's size and isEmpty; a
    string's length and isEmpty)."""
    found = F.try_variant_get(current, "$" + _step_text(attribute), "variant")
    if attribute not in _METHODS:
        return found
    kind = F.schema_of_variant(current)
    is_object, is_array = kind.startswith("OBJECT"), kind.startswith("ARRAY")
    is_string = kind == "STRING"
    mapping = F.try_variant_get(current, "$", "map<string,variant>")
    members = F.try_variant_get(current, "$", "array<variant>")
    text = F.try_variant_get(current, "$", "string")
    if attribute == "size":
        method = F.when(is_object, _as_variant(F.size(mapping))).when(
            is_array, _as_variant(F.array_size(members))
        )
    elif attribute == "length":
        method = F.when(is_string, _as_variant(F.length(text)))
    elif attribute == "isEmpty":
        method = (
            F.when(is_object, _as_variant(F.size(mapping) == 0))
            .when(is_array, _as_variant(F.array_size(members) == 0))
            .when(is_string, _as_variant(F.length(text) == 0))
        )
    elif attribute == "values":
        method = F.when(is_object, F.try_parse_json(F.to_json(F.map_values(mapping))))
    elif attribute in ("keySet", "keys"):
        method = F.when(is_object, F.try_parse_json(F.to_json(F.map_keys(mapping))))
    else:  # entrySet, entries: each a mapping of key and value, as /r.entries gives
        entries = F.transform(
            F.map_entries(mapping),
            lambda e: F.named_struct(F.lit("key"), e["key"], F.lit("value"), e["value"]),
        )
        method = F.when(is_object, F.try_parse_json(F.to_json(entries)))
    return F.coalesce(found, method)


def _code(flag: Column) -> Column:
    return F.when(flag, F.lit(TRUE)).otherwise(F.lit(FALSE))


def _compare(op: str, a: _Operand, b: _Operand) -> Column:
    """Geode's ``TypeUtils.compare`` as a Spark expression (see
    `regionbus.schemas.cq.evaluate.compare`)."""
    both_null = a.null & b.null
    both_undefined = a.undefined & b.undefined
    if op == "=":
        null_case, undefined_case = (
            _code(both_null),
            F.when(both_undefined, TRUE).otherwise(UNKNOWN),
        )
    elif op == "<>":
        null_case = _code(~both_null)
        undefined_case = F.when(both_undefined, UNKNOWN).otherwise(TRUE)
    else:
        null_case = undefined_case = F.lit(UNKNOWN)
    ordered: dict[str, Callable[[Column, Column], Column]] = {
        "=": lambda x, y: x == y,
        "<>": lambda x, y: x != y,
        "<": lambda x, y: x < y,
        "<=": lambda x, y: x <= y,
        ">": lambda x, y: x > y,
        ">=": lambda x, y: x >= y,
    }
    compared = ordered[op]
    same = a.kind == b.kind
    equal = same & F.coalesce(
        F.when(a.kind == "boolean", a.boolean == b.boolean).otherwise(a.json == b.json),
        F.lit(False),
    )
    if op == "=":
        mixed = _code(equal)
    elif op == "<>":
        mixed = _code(~equal)
    else:
        mixed = F.lit(ERROR)
    return (
        F.when(a.null | b.null, null_case)
        .when(a.undefined | b.undefined, undefined_case)
        .when(same & (a.kind == "number"), _code(compared(a.number, b.number)))
        .when(same & (a.kind == "string"), _code(compared(a.text, b.text)))
        .otherwise(mixed)
    )


def _like_regex(pattern: str) -> str:
    """A LIKE pattern as a Java regex matched against the whole string."""
    parts: list[str] = []
    escaped = False
    for char in pattern:
        if escaped:
            parts.append(char if char.isalnum() else "\\" + char)
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == "%":
            parts.append(".*")
        elif char == "_":
            parts.append(".")
        else:
            parts.append(char if char.isalnum() else "\\" + char)
    if escaped:
        parts.append("\\\\")
    return "(?s)^" + "".join(parts) + "$"


class _Compiler:
    """Compiles a predicate over one value column (a VARIANT)."""

    def __init__(self, value: Column) -> None:
        self._value = value

    def operand(self, expr: Expr) -> _Operand:
        if isinstance(expr, Path):
            return _variant_operand(_path(self._value, expr))
        if isinstance(expr, Literal):
            return _literal_operand(expr.value)
        return _truth_operand(self.code(expr))

    def code(self, expr: Expr) -> Column:
        if isinstance(expr, Literal):
            value = expr.value
            if isinstance(value, bool):
                return F.lit(TRUE if value else FALSE)
            return F.lit(UNKNOWN if value is None or value is UNDEFINED else ERROR)
        if isinstance(expr, Path):
            o = self.operand(expr)
            return (
                F.when(o.undefined | o.null, UNKNOWN)
                .when(o.kind == "boolean", _code(o.boolean))
                .otherwise(ERROR)
            )
        if isinstance(expr, Comparison):
            return _compare(expr.op, self.operand(expr.left), self.operand(expr.right))
        if isinstance(expr, Not):
            inner = self.code(expr.operand)
            return F.when(inner == TRUE, FALSE).when(inner == FALSE, TRUE).otherwise(inner)
        if isinstance(expr, Defined):
            o = self.operand(expr.operand)
            return _code(~o.undefined if expr.defined else o.undefined)
        if isinstance(expr, Junction):
            codes = [self.code(o) for o in expr.operands]
            deciding, other = (TRUE, FALSE) if expr.op == "OR" else (FALSE, TRUE)

            def any_is(code: str) -> Column:
                found = codes[0] == code
                for c in codes[1:]:
                    found = found | (c == code)
                return found

            return (
                F.when(any_is(deciding), deciding)
                .when(any_is(ERROR), ERROR)
                .when(any_is(UNKNOWN), UNKNOWN)
                .otherwise(other)
            )
        if isinstance(expr, Membership):
            element = self.operand(expr.element)
            if isinstance(expr.collection, Path):
                collection = _path(self._value, expr.collection)
                o = _variant_operand(collection)
                members = F.try_variant_get(collection, "$", "array<variant>")
                found = F.exists(
                    members, lambda x: _compare("=", element, _variant_operand(x)) == TRUE
                )
                return (
                    F.when(o.undefined | o.null, UNKNOWN)
                    .when(members.isNull(), ERROR)
                    .otherwise(_code(found))
                )
            assert not isinstance(expr.collection, Parameter), "a CQ has no bind parameters"
            found = F.lit(False)
            for member in expr.collection:
                found = found | (_compare("=", element, self.operand(member)) == TRUE)
            return _code(found)
        assert isinstance(expr, Like)
        o = self.operand(expr.operand)
        return (
            F.when(o.undefined | o.null, UNKNOWN)
            .when(o.kind != "string", FALSE)
            .otherwise(_code(o.text.rlike(_like_regex(expr.pattern))))
        )


def _truth_operand(code: Column) -> _Operand:
    return _Operand(
        undefined=code == UNKNOWN,
        null=F.lit(False),
        kind=F.lit("boolean"),
        number=F.lit(None).cast("double"),
        text=F.lit(None).cast("string"),
        boolean=code == TRUE,
        json=F.lit(None).cast("string"),
    )


def cq_condition(query: str, value: Column, serializer: Column | None = None) -> Column:
    """The CQ's predicate on a column of value bytes: ``'T'`` (in the result set), ``'F'``,
    ``'U'`` (UNDEFINED: not in it) or ``'E'`` (the servers would send an error event).

    Args:
        query: The CQ's text (``SELECT * FROM /region [alias] [WHERE predicate]``).
        value: A binary (or string) column of JSON values.
        serializer: The serializer names' column: a value of another serializer than
            ``json`` gives ``'E'``; None takes every value as JSON.

    Raises:
        CqInvalidError: the query is outside the CQ subset.
    """
    parsed = parse_cq(query)
    parsed_value = F.try_parse_json(value.cast("string"))
    code = (
        F.lit(TRUE) if parsed.predicate is None else _Compiler(parsed_value).code(parsed.predicate)
    )
    readable = parsed_value.isNotNull()
    if serializer is not None:
        readable = readable & (F.coalesce(serializer, F.lit("json")) == "json")
    return F.when(value.isNull(), F.lit(FALSE)).when(~readable, ERROR).otherwise(code)


def cq_history(messages: DataFrame, query: str) -> DataFrame:
    """What a CQ would have delivered over decoded ``{ns}.events`` messages.

    Args:
        messages: Rows of :func:`regionbus.spark.decode.read_messages` or
            :func:`regionbus.spark.decode.decode_messages` of ``{ns}.events`` (batch).
        query: The CQ's text.

    Returns:
        One row per CQ event: ``key`` (null for a region event), ``base_operation``,
        ``query_operation`` (CREATE, UPDATE, DESTROY, REGION_CLEAR, REGION_DESTROY or
        ERROR), ``value``, ``serializer``, ``version`` and the EventID's ``member,
        thread, sequence, bucket``.

    Raises:
        CqInvalidError: the query is outside the CQ subset.
    """
    parsed = parse_cq(query)
    events = (
        messages.where(
            (F.col("message_type") == "Event")
            & (F.col("region") == parsed.region)
            & F.col("operation").isin(*_ENTRY_KINDS, *_RESET_KINDS)
        )
        .dropDuplicates(list(_EVENT_ID))
        .select("key", "operation", "value", "serializer", "version", *_EVENT_ID)
    )
    region_order = Window.orderBy("version").rowsBetween(Window.unboundedPreceding, -1)
    events = events.withColumn(
        "last_reset",
        F.max(F.when(F.col("operation").isin(*_RESET_KINDS), F.col("version"))).over(region_order),
    )
    entries = events.where(F.col("operation").isin(*_ENTRY_KINDS))
    by_key = Window.partitionBy("key").orderBy("version")
    entries = (
        entries.withColumn("old_value", F.lag("value").over(by_key))
        .withColumn("old_serializer", F.lag("serializer").over(by_key))
        .withColumn("old_version", F.lag("version").over(by_key))
    )
    old_valid = F.col("old_version").isNotNull() & (
        F.col("last_reset").isNull() | (F.col("old_version") > F.col("last_reset"))
    )
    has_new = F.col("operation").isin("CREATE", "UPDATE")
    new_code = F.when(has_new, cq_condition(query, F.col("value"), F.col("serializer"))).otherwise(
        FALSE
    )
    old_code = F.when(
        old_valid, cq_condition(query, F.col("old_value"), F.col("old_serializer"))
    ).otherwise(FALSE)
    query_operation = (
        F.when((new_code == ERROR) | (old_code == ERROR), F.lit("ERROR"))
        .when(new_code == TRUE, F.when(old_code == TRUE, "UPDATE").otherwise("CREATE"))
        .when(old_code == TRUE, F.lit("DESTROY"))
    )
    columns = ["key", "base_operation", "query_operation", "value", "serializer", "version"]
    changes = (
        entries.withColumn("query_operation", query_operation)
        .where(F.col("query_operation").isNotNull())
        .withColumnRenamed("operation", "base_operation")
        .select(*columns, *_EVENT_ID)
    )
    regions = (
        events.where(F.col("operation").isin("REGION_CLEAR", "REGION_DESTROY"))
        .withColumn("query_operation", F.col("operation"))
        .withColumnRenamed("operation", "base_operation")
        .select(*columns, *_EVENT_ID)
    )
    return changes.unionByName(regions)


__all__ = ["ERROR", "FALSE", "TRUE", "UNKNOWN", "cq_condition", "cq_history"]
