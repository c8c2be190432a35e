"""Continuous queries' language: Geode's CQ subset of OQL, parsed, checked, normalized and
evaluated with Geode's UNDEFINED rules; and the query operation of a change.

Shared by the client (``new_cq`` refuses a query outside the subset), the cache servers
(each distinct normalized query of a region is evaluated once per change) and Spark (the
same predicate compiled to a filter over ``{ns}.events``).
"""

from regionbus.schemas.cq.evaluate import compare, evaluate, read_path, selects
from regionbus.schemas.cq.operations import has_new_value, query_operation, region_query_operation
from regionbus.schemas.cq.parser import MAX_CQ_QUERY_CHARS, ParsedCq, parse_cq
from regionbus.schemas.cq.rules import CQ_RULES
from regionbus.schemas.cq.syntax import UNDEFINED, Expr, canonical_text

__all__ = [
    "CQ_RULES",
    "MAX_CQ_QUERY_CHARS",
    "UNDEFINED",
    "Expr",
    "ParsedCq",
    "canonical_text",
    "compare",
    "evaluate",
    "has_new_value",
    "parse_cq",
    "query_operation",
    "read_path",
    "region_query_operation",
    "selects",
]
