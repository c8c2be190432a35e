"""The flights demo's data logic: keys, the operation timeline and the expected end state."""

from __future__ import annotations

import json
import math
import re
from collections import defaultdict
from typing import Any

import pandas as pd
import pytest

from regionbus.demo.flights_data import (
    MINUTES_PER_DAY,
    FlightOp,
    Stage,
    carrier_regex,
    count_operations,
    day_regex,
    expected_final_state,
    flight_key,
    flight_keys,
    load_flights,
    operations_per_key,
    schedule,
    timeline,
)

NAN = float("nan")
_COLUMNS = (
    "year",
    "month",
    "day",
    "dep_time",
    "sched_dep_time",
    "dep_delay",
    "arr_time",
    "sched_arr_time",
    "arr_delay",
    "carrier",
    "flight",
    "tailnum",
    "origin",
    "dest",
    "air_time",
    "distance",
)


def _row(**fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "year": 2013,
        "month": 1,
        "day": 1,
        "dep_time": NAN,
        "sched_dep_time": 600,
        "dep_delay": NAN,
        "arr_time": NAN,
        "sched_arr_time": 800,
        "arr_delay": NAN,
        "carrier": "UA",
        "flight": 1,
        "tailnum": "N1",
        "origin": "EWR",
        "dest": "ORD",
        "air_time": NAN,
        "distance": 700,
    }
    base.update(fields)
    return base


NORMAL = "UA-1545-EWR-2013-01-01"
SAME_FLIGHT_OTHER_ORIGIN = "UA-1545-LGA-2013-01-01"
CANCELLED = "AA-100-JFK-2013-01-01"
DIVERTED = "B6-200-JFK-2013-01-01"
PAST_MIDNIGHT = "DL-300-LGA-2013-01-01"
NEXT_DAY = "UA-1545-EWR-2013-01-02"
NO_AIR_TIME = "EV-400-EWR-2013-01-02"


@pytest.fixture
def flights() -> pd.DataFrame:
    """Seven flights over two days covering every case the timeline distinguishes."""
    rows = [
        _row(
            carrier="UA",
            flight=1545,
            origin="EWR",
            sched_dep_time=515,
            dep_time=517.0,
            dep_delay=2.0,
            arr_time=830.0,
            sched_arr_time=819,
            arr_delay=11.0,
            air_time=227.0,
            tailnum="N14228",
            dest="IAH",
            distance=1400,
        ),
        _row(
            carrier="UA",
            flight=1545,
            origin="LGA",
            sched_dep_time=900,
            dep_time=905.0,
            dep_delay=5.0,
            arr_time=1100.0,
            sched_arr_time=1050,
            arr_delay=10.0,
            air_time=120.0,
        ),
        _row(carrier="AA", flight=100, origin="JFK", sched_dep_time=700, tailnum=NAN),
        _row(
            carrier="B6",
            flight=200,
            origin="JFK",
            sched_dep_time=2330,
            dep_time=2340.0,
            dep_delay=10.0,
        ),
        _row(
            carrier="DL",
            flight=300,
            origin="LGA",
            sched_dep_time=2300,
            dep_time=15.0,
            dep_delay=75.0,
            arr_time=155.0,
            sched_arr_time=40,
            arr_delay=75.0,
            air_time=100.0,
        ),
        _row(
            day=2,
            carrier="UA",
            flight=1545,
            origin="EWR",
            sched_dep_time=515,
            dep_time=510.0,
            dep_delay=-5.0,
            arr_time=800.0,
            sched_arr_time=819,
            arr_delay=-19.0,
            air_time=200.0,
        ),
        _row(
            day=2,
            carrier="EV",
            flight=400,
            origin="EWR",
            sched_dep_time=1000,
            sched_arr_time=1130,
            dep_time=1000.0,
            dep_delay=0.0,
            arr_time=1140.0,
        ),
    ]
    return pd.DataFrame(rows, columns=list(_COLUMNS))


def _ops_by_key(ops: list[FlightOp]) -> dict[str, list[FlightOp]]:
    by_key: dict[str, list[FlightOp]] = defaultdict(list)
    for op in ops:
        by_key[op.key].append(op)
    return by_key


def _has_nan(value: Any) -> bool:
    if isinstance(value, float):
        return math.isnan(value)
    if isinstance(value, dict):
        return any(_has_nan(v) for v in value.values())
    return False


def test_flight_key_names_carrier_flight_origin_and_date() -> None:
    assert flight_key("UA", 1545, "EWR", 2013, 1, 1) == NORMAL


def test_keys_are_unique_although_carrier_flight_and_date_repeat(flights: pd.DataFrame) -> None:
    keys = flight_keys(flights)
    assert len(set(keys)) == len(keys)
    by_flight_and_date = flights.groupby(["carrier", "flight", "year", "month", "day"]).size()
    assert by_flight_and_date.max() > 1
    assert {NORMAL, SAME_FLIGHT_OTHER_ORIGIN} <= set(keys)


def test_each_key_goes_create_departure_arrival_or_create_destroy(flights: pd.DataFrame) -> None:
    by_key = _ops_by_key(list(timeline(flights)))
    stages = {key: [op.stage for op in ops] for key, ops in by_key.items()}
    assert stages[NORMAL] == [Stage.CREATE, Stage.DEPART, Stage.ARRIVE]
    assert stages[PAST_MIDNIGHT] == [Stage.CREATE, Stage.DEPART, Stage.ARRIVE]
    assert stages[NO_AIR_TIME] == [Stage.CREATE, Stage.DEPART, Stage.ARRIVE]
    assert stages[CANCELLED] == [Stage.CREATE, Stage.DESTROY]
    assert stages[DIVERTED] == [Stage.CREATE, Stage.DEPART]
    for ops in by_key.values():
        minutes = [op.minute for op in ops]
        assert minutes == sorted(minutes)
        updates = [op.minute for op in ops if op.stage in (Stage.DEPART, Stage.ARRIVE)]
        assert updates == sorted(set(updates)), "arrival must come strictly after departure"


def test_event_times_follow_the_schedule_and_delays(flights: pd.DataFrame) -> None:
    by_key = _ops_by_key(list(timeline(flights)))
    create, departure, arrival = by_key[NORMAL]
    assert (create.minute, departure.minute, arrival.minute) == (0, 5 * 60 + 15 + 2, 317 + 227)
    cancel = by_key[CANCELLED][1]
    assert cancel.minute == 7 * 60
    late_departure, late_arrival = by_key[PAST_MIDNIGHT][1:]
    assert late_departure.minute == 23 * 60 + 75
    assert late_arrival.minute == late_departure.minute + 100
    no_air_departure, no_air_arrival = by_key[NO_AIR_TIME][1:]
    assert no_air_arrival.minute - no_air_departure.minute == 90, "scheduled block time"


def test_timeline_is_in_time_order(flights: pd.DataFrame) -> None:
    ops = list(timeline(flights))
    assert [op.minute for op in ops] == sorted(op.minute for op in ops)
    assert len(ops) == count_operations(flights) == sum(operations_per_key(flights))


def test_a_days_creates_come_first_at_midnight_in_scheduled_order(flights: pd.DataFrame) -> None:
    days = list(schedule(flights))
    assert [d.date.isoformat() for d in days] == ["2013-01-01", "2013-01-02"]
    for index, day in enumerate(days):
        start = index * MINUTES_PER_DAY
        assert all(op.stage is Stage.CREATE and op.minute == start for op in day.creates)
        sched = [op.value["sched_dep_time"] for op in day.creates if op.value is not None]
        assert sched == sorted(sched)
        assert all(op.stage is not Stage.CREATE and op.minute >= start for op in day.events)
    assert [op.key for op in days[0].creates] == [
        NORMAL,
        CANCELLED,
        SAME_FLIGHT_OTHER_ORIGIN,
        PAST_MIDNIGHT,
        DIVERTED,
    ]
    assert all(op.minute < MINUTES_PER_DAY for op in days[0].events)


def test_a_late_arrival_comes_after_the_next_days_creates(flights: pd.DataFrame) -> None:
    day_two = list(schedule(flights))[1]
    assert {op.key for op in day_two.creates} == {NEXT_DAY, NO_AIR_TIME}
    late = [op for op in day_two.events if op.key == PAST_MIDNIGHT]
    assert [op.stage for op in late] == [Stage.DEPART, Stage.ARRIVE]


def test_values_grow_by_stage(flights: pd.DataFrame) -> None:
    create, departure, arrival = _ops_by_key(list(timeline(flights)))[NORMAL]
    assert create.value == {
        "carrier": "UA",
        "flight": 1545,
        "tailnum": "N14228",
        "origin": "EWR",
        "dest": "IAH",
        "year": 2013,
        "month": 1,
        "day": 1,
        "sched_dep_time": 515,
        "sched_arr_time": 819,
        "distance": 1400,
        "status": "scheduled",
    }
    assert departure.value == {
        **create.value,
        "dep_time": 517,
        "dep_delay": 2,
        "status": "departed",
    }
    assert arrival.value == {
        **departure.value,
        "arr_time": 830,
        "arr_delay": 11,
        "air_time": 227,
        "status": "arrived",
    }


def test_values_never_hold_nan(flights: pd.DataFrame) -> None:
    values = [op.value for op in timeline(flights) if op.value is not None]
    values += list(expected_final_state(flights).values())
    for value in values:
        assert not _has_nan(value)
        json.dumps(value, allow_nan=False)
        for name in ("flight", "sched_dep_time", "dep_time", "arr_time", "air_time"):
            assert value.get(name) is None or isinstance(value[name], int)
    cancelled_create = _ops_by_key(list(timeline(flights)))[CANCELLED][0]
    assert cancelled_create.value is not None and cancelled_create.value["tailnum"] is None


def test_expected_final_state_drops_cancelled_and_keeps_last_stage(flights: pd.DataFrame) -> None:
    state = expected_final_state(flights)
    assert CANCELLED not in state
    assert set(state) == set(flight_keys(flights)) - {CANCELLED}
    assert state[NORMAL]["status"] == "arrived" and state[NORMAL]["arr_time"] == 830
    assert state[DIVERTED]["status"] == "departed"
    assert "arr_time" not in state[DIVERTED]
    assert state[NO_AIR_TIME]["air_time"] is None and state[NO_AIR_TIME]["arr_delay"] is None


def test_expected_final_state_is_what_the_timeline_leaves(flights: pd.DataFrame) -> None:
    region: dict[str, Any] = {}
    for op in timeline(flights):
        if op.stage is Stage.CREATE:
            assert op.key not in region
        else:
            assert op.key in region
        if op.stage is Stage.DESTROY:
            del region[op.key]
        else:
            region[op.key] = op.value
    assert region == expected_final_state(flights)


def test_interest_regexes_match_whole_keys() -> None:
    assert re.fullmatch(carrier_regex("UA"), NORMAL)
    assert not re.fullmatch(carrier_regex("UA"), "AUA-1-EWR-2013-01-01")
    assert re.fullmatch(day_regex(pd.Timestamp("2013-01-02").date()), NEXT_DAY)
    assert not re.fullmatch(day_regex(pd.Timestamp("2013-01-02").date()), NORMAL)


def test_load_flights_keeps_the_first_days() -> None:
    two_days = load_flights(2)
    assert set(zip(two_days["month"], two_days["day"], strict=True)) == {(1, 1), (1, 2)}
    assert list(two_days.index) == list(range(len(two_days)))
    with pytest.raises(ValueError):
        load_flights(0)


def test_real_data_keys_are_unique() -> None:
    flights = load_flights()
    keys = flight_keys(flights)
    assert len(keys) == 336_776
    assert len(set(keys)) == len(keys)
