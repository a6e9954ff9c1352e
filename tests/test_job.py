"""What a run prints at its end (pipeline/job.py)."""

from __future__ import annotations

from pipeline.job import RunSummary


def _summary(**kw) -> RunSummary:
    return RunSummary(store="s.zarr", rows_read=1000, samples={"train": 80, "val": 10}, bytes_written=2**20,
                      uncompressed_bytes=2**22, seconds=2.0, **kw)


def test_the_summary_says_what_the_splits_left_out():
    lines = _summary(left_out={"outside": 1234, "embargo": {"train": 5, "val": 0}}).format().splitlines()
    assert "windows left out: 1,234 outside every split; by the embargo: train 5" in lines
    assert lines.index("windows per split: train 80, val 10") + 1 == lines.index(
        "windows left out: 1,234 outside every split; by the embargo: train 5")
    assert not any(x.startswith("windows left out") for x in _summary().format().splitlines())
    assert not any(x.startswith("windows left out") for x in _summary(left_out={"embargo": {"train": 0}}).format()
                   .splitlines())
