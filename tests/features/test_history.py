"""What an append checks of the new files against the stored build's features, label and
sessions, and how its refusals name the new data."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.errors import MissingColumnError, WindowError
from pipeline.features import FeatureSpec, LabelSpec
from pipeline.features.history import Prior, check_new_columns, continue_sessions, prior_from_attrs

STEPS = [FeatureSpec.from_mapping(v, "f") for v in ["mid_price", {"name": "imbalance", "levels": 2}]]


def _day(path, columns):
    pq.write_table(pa.table({c: [1.0, 2.0] for c in columns}), path)
    return str(path)


def test_a_new_file_without_a_column_read_is_named_with_the_reader(tmp_path):
    book = ["bid_price_1", "ask_price_1", "bid_size_1", "ask_size_1", "bid_size_2", "ask_size_2"]
    full = _day(tmp_path / "full.parquet", book)
    short = _day(tmp_path / "short.parquet", [c for c in book if c != "bid_size_2"])
    check_new_columns(pq.read_schema(full).names, [full], STEPS, LabelSpec(horizon=2))  # nothing missing
    with pytest.raises(MissingColumnError, match=r"short\.parquet: append: this new file has no column 'bid_size_2', "
                                                 r"which feature 'imbalance' \(features\.steps\[1\]\) reads"):
        check_new_columns(pq.read_schema(short).names, [short], STEPS, LabelSpec(horizon=2))
    label = LabelSpec.from_mapping({"kind": "column", "column": "label_1"}, "labels")
    with pytest.raises(MissingColumnError, match=r"full\.parquet: append: this new file \(and the 1 other new "
                                                 r"file\(s\)\) has no column 'label_1', which label kind 'column'"):
        check_new_columns(pq.read_schema(full).names, [full, short], STEPS, label)


def _stored(sessions: list[tuple[str, str, str, str]]) -> Prior:
    """A stored build's prior from its session table: (instrument, label, first time,
    last time) per segment, 10 rows each, one session per segment in order."""
    rows = [{"rows": [10 * i, 10 * i + 10], "instrument": inst, "session": i, "label": label,
             "start": start, "end": end} for i, (inst, label, start, end) in enumerate(sessions)]
    return prior_from_attrs({"sessions": rows, "instruments": sorted({s[0] for s in sessions})}, {"train": 0})


def _ns(text: str) -> int:
    return int(pd.Timestamp(text).value)


def test_new_data_continuing_a_gap_session_is_named_by_its_instrument_not_its_rank():
    """The refusal said 'append: #0 continues the stored session ...': #0 is the new
    data's first session of an instrument, which no user can find."""
    prior = _stored([("ST_A", "#0", "2026-03-01T00:00", "2026-03-09T23:00"),
                     ("ST_B", "#0", "2026-03-01T00:00", "2026-03-09T23:00")])
    gap = int(pd.Timedelta("90min").value)
    first = np.array([_ns("2026-03-10T03:00"), _ns("2026-03-10T00:00")])  # ST_A starts a new session, ST_B not
    with pytest.raises(WindowError) as info:
        continue_sessions(prior, np.array([0, 1]), ["#0", "#0"], first, "gap", gap)
    text = str(info.value)
    assert text == ("append: the new data of instrument 'ST_B' (from 2026-03-10T00:00:00.000000000) continues the "
                    "stored session of its instrument that ends at 2026-03-09T23:00:00.000000000 (1h later, within "
                    "source.sessions' gap of 90min); an append adds whole new sessions: rebuild with --rebuild")
    assert "#0" not in text
    files = ["raw/ST_A/2026-03-10.parquet", "raw/ST_B/2026-03-10.parquet"]
    first[1] = _ns("2026-03-10T00:30")  # a gap of exactly 90min still continues the session
    with pytest.raises(WindowError, match=r"^append: raw/ST_B/2026-03-10\.parquet \(from 2026-03-10T00:30:00\.0+\) "
                                          r"continues .* \(90min later, within source\.sessions' gap of 90min\)"):
        continue_sessions(prior, np.array([0, 1]), ["#0", "#0"], first, "gap", gap, files=files)
    # Both after the gap: new sessions after every stored one, one per instrument-period.
    first[1] = _ns("2026-03-10T00:31")
    assert continue_sessions(prior, np.array([0, 1]), ["#0", "#0"], first, "gap", gap).tolist() == [2, 2]


def test_a_new_date_session_is_named_with_its_instrument_and_a_file_label_as_it_is():
    prior = _stored([("AAA", "2026-01-05", "2026-01-05T09:30", "2026-01-05T16:00"),
                     ("BBB", "2026-01-05", "2026-01-05T09:30", "2026-01-05T16:00")])
    first = np.array([_ns("2026-01-06T09:30"), _ns("2026-01-05T16:30")])
    with pytest.raises(WindowError, match=r"^append: 2026-01-05 of instrument 'BBB' \(from 2026-01-05T16:30:00\.0+\) "
                                          r"continues the stored session of its instrument that ends at "
                                          r"2026-01-05T16:00:00\.0+ \(on the same session date\)"):
        continue_sessions(prior, np.array([0, 1]), ["2026-01-06", "2026-01-05"], first, "date")
    first[1] = _ns("2026-01-04T09:30")  # a file label names its instrument's folder already
    with pytest.raises(WindowError, match=r"^append: BBB/2026-01-04\.parquet \(from 2026-01-04T09:30:00\.0+\) falls "
                                          r"before or among the stored sessions"):
        continue_sessions(prior, np.array([0, 1]), ["AAA/2026-01-06.parquet", "BBB/2026-01-04.parquet"], first,
                          "file")


def test_column_sessions_append_after_the_stored_ones_in_value_order_not_text_order():
    """Keys of ``sessions: {column: time_id}`` compared as text put time_id=16 before
    time_id=5: an append of later buckets was refused, and new ones numbered out of order."""
    stored = [("S0", f"time_id={v}", "", "") for v in (5, 9, 11)]
    prior = prior_from_attrs({"sessions": [{"rows": [10 * i, 10 * i + 10], "instrument": inst, "session": i,
                                            "label": label} for i, (inst, label, _, _) in enumerate(stored)],
                              "instruments": ["S0"], "session_keys": [s[1] for s in stored]}, {"train": 0})
    new = ["time_id=100", "time_id=16", "time_id=16"]
    got = continue_sessions(prior, np.array([0, 0, 0]), new, None, "column", keys=new)
    assert got.tolist() == [4, 3, 3]  # 16 before 100, both after the stored 11
    with pytest.raises(WindowError, match=r"time_id=10 of instrument 'S0' falls before or among the stored "
                                          r"sessions \(the last stored is time_id=11\)"):
        continue_sessions(prior, np.array([0]), ["time_id=10"], None, "column", keys=["time_id=10"])


def test_an_append_adds_its_left_out_windows_to_the_stored_counts():
    from pipeline.features.history import merge_attrs

    prior = _stored([("AAA", "2026-01-05", "2026-01-05T09:30", "2026-01-05T16:00")])
    prior = prior_from_attrs({**prior.attrs, "split_left_out": {"outside": 3, "embargo": {"train": 2, "val": 0}}},
                             {"train": 0})
    merged = merge_attrs(prior, {"split_left_out": {"outside": 4, "embargo": {"val": 5, "test": 1}}})
    assert merged["split_left_out"] == {"outside": 7, "embargo": {"train": 2, "val": 5, "test": 1}}
    assert merge_attrs(prior, {})["split_left_out"] == {"outside": 3, "embargo": {"train": 2, "val": 0}}


def test_an_append_adds_its_windows_across_a_cut_to_the_stored_count():
    from pipeline.features.history import merge_attrs

    prior = _stored([("AAA", "2026-01-05", "2026-01-05T09:30", "2026-01-05T16:00")])
    prior = prior_from_attrs({**prior.attrs, "split_left_out": {"outside": 0, "across": 15}}, {"train": 0})
    merged = merge_attrs(prior, {"split_left_out": {"outside": 2, "across": 4, "embargo": {"val": 1}}})
    assert merged["split_left_out"] == {"outside": 2, "across": 19, "embargo": {"val": 1}}
    # A store built before the count existed: the append counts its own (the stored ones went uncounted).
    older = prior_from_attrs({**prior.attrs, "split_left_out": {"outside": 3}}, {"train": 0})
    assert merge_attrs(older, {"split_left_out": {"outside": 0, "across": 6}})["split_left_out"] == {
        "outside": 3, "across": 6}


def test_new_data_continuing_the_last_stored_column_session_is_told_so():
    stored = [("S0", f"time_id={v}", "", "") for v in (5, 11)]
    prior = prior_from_attrs({"sessions": [{"rows": [10 * i, 10 * i + 10], "instrument": inst, "session": i,
                                            "label": label} for i, (inst, label, _, _) in enumerate(stored)],
                              "instruments": ["S0"], "session_keys": [s[1] for s in stored]}, {"train": 0})
    with pytest.raises(WindowError, match=r"^append: time_id=11 of instrument 'S0' continues the last stored session "
                                          r"\(time_id=11\); an append adds whole new sessions"):
        continue_sessions(prior, np.array([0]), ["time_id=11"], None, "column", keys=["time_id=11"])
