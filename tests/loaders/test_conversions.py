"""Fixed-point integer prices and "no value" sentinels (``source.scale``, ``source.missing``),
against pandas reading the same files."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.config import parse_config
from pipeline.errors import ConfigError, InvalidValueError, LoaderError
from pipeline.loaders import open_source
from pipeline.loaders.conversions import ValueRules

UNDEF = np.iinfo(np.int64).max  # Databento's undefined price


def mbp(path, day: int, rows: int = 300, seed: int = 0) -> pd.DataFrame:
    """A Databento MBP-10-like day: int64 prices in units of 1e-9, the deepest level
    sometimes empty (the largest int64), uint32 sizes."""
    rng = np.random.default_rng(seed + day)
    ticks = 5_100_000 + np.cumsum(rng.integers(-3, 4, rows))  # 0.001 ticks of about 5,100
    bid = ticks * 1_000_000  # units of 1e-9
    deep = bid - 50_000_000
    deep[rng.random(rows) < 0.2] = UNDEF
    ts = pd.Timestamp(f"2026-03-0{day}T14:30", tz="UTC") + pd.to_timedelta(np.arange(rows) * 10, unit="ms")
    frame = pd.DataFrame({"ts_event": ts, "bid_px_00": bid, "ask_px_00": bid + 250_000_000, "bid_px_01": deep,
                          "bid_sz_00": rng.integers(1, 50, rows).astype(np.uint32)})
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), path)
    return frame


def test_fixed_point_prices_are_scaled_exactly_and_sentinels_read_as_nan(tmp_path):
    frames = [mbp(tmp_path / f"day{d}.parquet", d) for d in (2, 3)]
    src = open_source(str(tmp_path / "*.parquet"), timestamp="ts_event", dtype="float64",
                      scale={"*_px_*": 1e-9}, missing={"*_px_*": [UNDEF]}, nan="fill", fill_value=0.0)
    got = src.array.compute()
    ref = pd.concat(frames)
    for j, name in enumerate(src.columns):
        want = ref[name].to_numpy()
        if name.startswith("bid_px") or name.startswith("ask_px"):
            want = np.where(want == UNDEF, 0.0, want / 1e9)  # the correctly rounded quotient
        np.testing.assert_array_equal(got[:, j], want.astype(np.float64), err_msg=name)
    assert got[:, src.columns.index("bid_px_00")].min() > 5000  # in units, not in 1e-9
    # float32 reads the same prices, each rounded once from the exact quotient.
    f32 = open_source(str(tmp_path / "*.parquet"), timestamp="ts_event", scale={"*_px_*": 1e-9},
                      missing=[UNDEF], nan="fill").array.compute()
    np.testing.assert_array_equal(f32, got.astype(np.float32))


def test_a_sentinel_left_unnamed_is_refused_and_a_named_one_obeys_source_nan(tmp_path):
    mbp(tmp_path / "day2.parquet", 2)
    with pytest.raises(LoaderError, match=r"bid_px_01.*9223372036854775807.*past 2\*\*53.*source.missing"):
        open_source(str(tmp_path / "*.parquet"), timestamp="ts_event", dtype="float64",
                    scale={"*_px_*": 1e-9}).array.compute()
    with pytest.raises(InvalidValueError, match=r"NaN or inf in column 'bid_px_01'"):
        open_source(str(tmp_path / "*.parquet"), timestamp="ts_event", dtype="float64", scale={"*_px_*": 1e-9},
                    missing=[UNDEF]).array.compute()


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_a_sentinel_left_unnamed_is_refused_naming_its_line_or_row_and_the_rule(tmp_path, fmt):
    """The refusal names where the first sentinel is (a CSV's line, counted from 1 with
    the header; a Parquet row in its row group), the column both ways, and the
    source.missing rule under the scale's own pattern."""
    frame = mbp(tmp_path / "day2.parquet", 2, rows=300)
    head = frame.index < 150  # the first empty level in the second row group or later
    frame.loc[head, "bid_px_01"] = frame.loc[head, "bid_px_00"] - 50_000_000
    if fmt == "csv":
        frame.assign(ts_event=frame["ts_event"].astype(np.int64)).to_csv(tmp_path / "day2.csv", index=False)
        (tmp_path / "day2.parquet").unlink()
    else:  # row groups of 100 rows: the sentinel's row counted in its group
        pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), tmp_path / "day2.parquet", row_group_size=100)
    first = int(np.flatnonzero(frame["bid_px_01"].to_numpy() == UNDEF)[0])  # by pandas
    where = f"line {first + 2}" if fmt == "csv" else f"row {first % 100} of row group {first // 100}"
    with pytest.raises(LoaderError) as err:
        open_source(str(tmp_path / f"day2.{fmt}"), timestamp="ts_event", dtype="float64", scale={"*_px_*": 1e-9},
                    rename={"bid_price_2": "bid_px_01"}, chunk_rows=1000).array.compute()
    assert str(err.value).endswith(
        f"day2.{fmt}: column 'bid_price_2' (the file's 'bid_px_01'): the integer {UNDEF} at {where} is past 2**53, "
        "where float64 rounds; if it means 'no value' (an empty level), list it in source.missing "
        f'({{"*_px_*": [{UNDEF}]}}; read as NaN, see source.nan)')


def test_floats_with_fractions_under_a_scale_are_refused_and_whole_floats_are_fixed_point(tmp_path):
    """A day re-exported in dollars is refused; a fixed-point day that pandas stored as
    floats (its column had a missing value) is scaled like the integers."""
    frame = mbp(tmp_path / "day2.parquet", 2)
    promoted = frame.assign(bid_px_01=np.where(frame.bid_px_01 == UNDEF, np.nan, frame.bid_px_01))  # float64
    promoted["ts_event"] += pd.Timedelta(days=1)
    pq.write_table(pa.Table.from_pandas(promoted, preserve_index=False), tmp_path / "day3.parquet")
    src = open_source(str(tmp_path / "*.parquet"), timestamp="ts_event", dtype="float64", scale={"*_px_*": 1e-9},
                      missing=[UNDEF], nan="fill", fill_value=-1.0)
    got = src.array.compute()[:, src.columns.index("bid_px_01")]
    deep = np.concatenate([frame.bid_px_01.to_numpy(), frame.bid_px_01.to_numpy()])
    np.testing.assert_array_equal(got, np.where(deep == UNDEF, -1.0, deep / 1e9))
    dollars = frame.assign(bid_px_00=frame.bid_px_00 / 1e9)
    dollars["ts_event"] += pd.Timedelta(days=1)
    pq.write_table(pa.Table.from_pandas(dollars, preserve_index=False), tmp_path / "day3.parquet")
    with pytest.raises(LoaderError, match=r"day3.parquet: column 'bid_px_00' holds double values with fractions, "
                       r"but source.scale gives it a factor of 1e-09"):
        open_source(str(tmp_path / "*.parquet"), timestamp="ts_event", dtype="float64", scale={"*_px_*": 1e-9},
                    missing=[UNDEF], nan="fill").array.compute()


def test_patterns_match_the_files_own_names_of_renamed_columns(tmp_path):
    frame = mbp(tmp_path / "day2.parquet", 2)
    src = open_source(str(tmp_path / "*.parquet"), timestamp="ts_event", dtype="float64",
                      rename={"bid_price_1": "bid_px_00", "ask_price_1": "ask_px_00"}, scale={"*_px_*": 1e-9},
                      missing={"*_px_*": [UNDEF]}, nan="fill")
    got = src.array.compute()
    np.testing.assert_array_equal(got[:, src.columns.index("bid_price_1")], frame.bid_px_00.to_numpy() / 1e9)
    np.testing.assert_array_equal(got[:, src.columns.index("bid_px_01")],
                                  np.where(frame.bid_px_01 == UNDEF, 0.0, frame.bid_px_01 / 1e9))


def test_csv_integers_in_ten_thousandths_are_scaled_and_a_decimal_csv_column_refused(tmp_path):
    (tmp_path / "a.csv").write_text("timestamp,bid_price_1,bid_size_1\n1,5859400,100\n2,5859300,-1\n3,5859500,7\n")
    src = open_source(str(tmp_path / "a.csv"), timestamp="timestamp", timestamp_unit="s", dtype="float64",
                      scale={"bid_price_1": 1e-4}, missing={"bid_size_1": [-1]}, nan="fill", fill_value=0)
    np.testing.assert_array_equal(src.array.compute(), [[585.94, 100], [585.93, 0], [585.95, 7]])
    (tmp_path / "b.csv").write_text("timestamp,bid_price_1,bid_size_1\n1,585.94,100\n")
    with pytest.raises(LoaderError, match=r"b.csv: column 'bid_price_1' holds double values.*fixed-point"):
        open_source(str(tmp_path / "b.csv"), timestamp="timestamp", timestamp_unit="s",
                    scale={"bid_price_1": 1e-4}).array.compute()


def test_a_csv_day_in_whole_dollars_beside_fixed_point_days_is_refused_under_a_scale(tmp_path):
    """A $1-tick contract's day re-exported in dollars (``17800.0``, whole) beside days of
    1e-9 fixed-point integers: each whole float was scaled as fixed-point, a mid price of
    1.78e-05 stored beside 17,799.5, silently (Parquet files were compared already). An
    unscaled CSV column is not compared: whole prices of one instrument are read as
    integers beside another's decimals at another price level, rightly."""
    (tmp_path / "fx").mkdir()
    (tmp_path / "fx" / "a.csv").write_text("timestamp,bid_price_1,ask_price_1\n1,17801000000000,17802000000000\n"
                                           "2,17800000000000,17801000000000\n")
    (tmp_path / "fx" / "b.csv").write_text("timestamp,bid_price_1,ask_price_1\n3,17800.0,17801.0\n4,17801.0,17802.0\n")
    with pytest.raises(LoaderError, match=r"a.csv: column 'bid_price_1' holds integers up to 1.7801e\+13, but "
                                          r".*b.csv holds floats up to 17801 \(a factor of about 1e\+09\)"):
        open_source(str(tmp_path / "fx" / "*.csv"), timestamp="timestamp", timestamp_unit="s", dtype="float64",
                    scale={"*_price_*": 1e-9})
    # A vendor's sentinel among the integers, and the same units promoted to floats by a
    # missing value (pandas): one unit, joined (a maximum would have taken the sentinel).
    (tmp_path / "ok").mkdir()
    (tmp_path / "ok" / "a.csv").write_text("timestamp,bid_price_1\n1,9223372036854775807\n2,17800000000000\n"
                                           "3,17801000000000\n")
    (tmp_path / "ok" / "b.csv").write_text("timestamp,bid_price_1\n4,\n5,17802000000000.0\n6,17803000000000.0\n")
    src = open_source(str(tmp_path / "ok" / "*.csv"), timestamp="timestamp", timestamp_unit="s", dtype="float64",
                      scale={"*_price_*": 1e-9}, missing=[UNDEF], nan="fill", fill_value=-1.0)
    np.testing.assert_array_equal(src.array.compute()[:, 0], [-1, 17800, 17801, -1, 17802, 17803])
    (tmp_path / "two").mkdir()
    (tmp_path / "two" / "a.csv").write_text("timestamp,bid_price_1\n1,60000\n2,60001\n")
    (tmp_path / "two" / "b.csv").write_text("timestamp,bid_price_1\n3,1.25\n4,1.5\n")
    src = open_source(str(tmp_path / "two" / "*.csv"), timestamp="timestamp", timestamp_unit="s", dtype="float64")
    np.testing.assert_array_equal(src.array.compute()[:, 0], [60000, 60001, 1.25, 1.5])


def test_a_pattern_matching_no_column_and_rules_on_arrays_are_refused(tmp_path):
    mbp(tmp_path / "day2.parquet", 2)
    with pytest.raises(LoaderError, match=r"'bid_price_\*', which matches no column"):
        open_source(str(tmp_path / "*.parquet"), timestamp="ts_event", scale={"bid_price_*": 1e-9})
    np.save(tmp_path / "x.npy", np.zeros((3, 2)))
    with pytest.raises(LoaderError, match="for CSV and Parquet tables"):
        open_source(str(tmp_path / "x.npy"), missing=[-1])


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ({"scale": {"*_px_*": 0}}, r"source.scale.\*_px_\*: expected a positive number"),
        ({"scale": {"*_px_*": "1e-9"}}, r"source.scale.\*_px_\*: expected a positive number"),
        ({"scale": [1e-9]}, r"source.scale: expected a mapping of column name"),
        ({"missing": ["x"]}, r"source.missing: expected a list of numbers"),
        ({"missing": {"bid_sz_*": [True]}}, r"source.missing.bid_sz_\*: expected a list of numbers"),
    ],
)
def test_config_scale_and_missing_errors_name_the_key(source, message):
    with pytest.raises(ConfigError, match=message):
        parse_config({"source": {"paths": "x/*.parquet", **source}, "windows": {"size": 4},
                      "output": {"path": "o.zarr"}})


def test_config_scale_and_missing_reach_the_loader(tmp_path):
    from pipeline.job import _source_kwargs

    frame = mbp(tmp_path / "day2.parquet", 2)
    config = parse_config({"source": {"paths": str(tmp_path / "*.parquet"), "timestamp": "ts_event",
                                      "dtype": "float64", "nan": "fill", "scale": {"*_px_*": 1e-9},
                                      "missing": [UNDEF, -1]},
                           "features": {"steps": ["mid_price"]},
                           "windows": {"size": 4}, "output": {"path": str(tmp_path / "o.zarr")}})
    rules = ValueRules.from_options(config.source.scale, config.source.missing)
    assert rules.factor_of("bid_px_03") == 1e-9 and rules.factor_of("bid_sz_03") is None
    assert rules.sentinels_of("bid_sz_03") == (UNDEF, -1)
    kwargs = _source_kwargs(config)
    kwargs.pop("read")  # the columns the features read: mid_price's canonical names, not these
    src = open_source(config.source.paths, **kwargs)
    got = src.array.compute()
    np.testing.assert_array_equal(got[:, src.columns.index("ask_px_00")], frame.ask_px_00.to_numpy() / 1e9)
