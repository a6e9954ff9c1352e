"""What an append checks of the new files against the stored build's features and label."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.errors import MissingColumnError
from pipeline.features import FeatureSpec, LabelSpec
from pipeline.features.history import check_new_columns

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
