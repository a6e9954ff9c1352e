"""The files a loaded array was joined from, recorded under its dask name so that arrays
computed from it (which lose ``x.attrs``) keep them: rows checked against np.load."""

from __future__ import annotations

from pathlib import Path

import dask.array as da
import numpy as np
import pytest

from pipeline.errors import WindowError
from pipeline.features import filesessions, windows
from pipeline.features.filesessions import file_sessions
from pipeline.loaders import load, open_source
from tests.loaders.test_arrays import write_token_shards


def _npy(folder: Path, shapes: list[tuple[int, ...]]) -> list[str]:
    folder.mkdir(exist_ok=True)
    paths = [str(folder / f"part{i}.npy") for i in range(len(shapes))]
    for i, (path, shape) in enumerate(zip(paths, shapes)):
        np.save(path, np.full(shape, float(i)))
    return paths


def test_an_array_joined_along_time_is_recorded_with_each_files_rows(tmp_path):
    paths = _npy(tmp_path, [(12, 2), (7, 2), (9, 2)])
    x = open_source(paths, combine="concat").array
    record = filesessions._LOADED[x.name]
    assert record.rows == tuple(np.load(p).shape[0] for p in paths) and record.length == 28
    assert record.first.endswith("part0.npy")
    assert file_sessions(x[:, ::-1] + 1) == [12, 7, 9]


def test_files_stacked_one_sample_each_are_not_sessions_after_derivation(tmp_path):
    """combine="stack" of 1-D files: each row is a file, and the series runs across them,
    for the loaded array and for an array computed from it alike."""
    x = load(_npy(tmp_path, [(3,)] * 6), combine="stack")
    assert x.name not in filesessions._LOADED
    assert file_sessions(x) is None and file_sessions(x * 2) is None


def test_the_record_is_bounded_oldest_first(tmp_path, monkeypatch):
    """Loads beyond the bound drop the oldest record (its derived arrays then window as
    one series, as before records existed); the newest stay."""
    monkeypatch.setattr(filesessions, "_MAX_LOADED", 2)
    names = [load(_npy(tmp_path / f"set{k}", [(5 + k, 2), (6, 2)]), combine="concat").name for k in range(3)]
    assert names[0] not in filesessions._LOADED
    assert [filesessions._LOADED[n].rows for n in names[1:]] == [(6, 6), (7, 6)]


def test_a_load_of_one_file_records_nothing(tmp_path):
    x = load(_npy(tmp_path, [(10, 2)]), combine="concat")
    assert x.name not in filesessions._LOADED and file_sessions(x * 2) is None


def test_a_derived_array_of_a_load_keeps_sessions_after_the_load_is_gone(tmp_path):
    paths = _npy(tmp_path, [(4, 3), (5, 3)])
    f = load(paths, combine="concat")[:, :1] * 3  # the loaded array is garbage at once
    assert file_sessions(f) == [np.load(p).shape[0] for p in paths]


def test_1d_shards_made_2d_keep_their_files_as_sessions(tmp_path):
    """x[:, None], reshape and expand_dims keep every row of 1-D shards joined along
    time: each window holds one shard's tokens, as numpy slices them."""
    tokens = write_token_shards(tmp_path, (100, 153, 81))
    x = load(str(tmp_path / "shard_*.npy"), combine="concat")
    size, stride = 17, 8
    expect = np.stack([t[e - size + 1:e + 1] for t in tokens for e in range(size - 1, len(t), stride)])
    for series in (x[:, None], x.reshape(-1, 1), da.expand_dims(x, 1)):
        assert file_sessions(series) == [len(t) for t in tokens]
        for sessions in (None, "file"):
            got = windows(series, size=size, stride=stride, sessions=sessions).compute()
            np.testing.assert_array_equal(got[:, :, 0], expect)


def test_1d_shards_reshaped_to_other_rows_are_refused(tmp_path):
    """Two tokens a row: no shard's end is a row of it, so no files are sessions."""
    write_token_shards(tmp_path, (100, 154))
    x = load(str(tmp_path / "shard_*.npy"), combine="concat")
    with pytest.raises(WindowError, match=r"2 files joined along time .*shard_000000\.npy\) of 254 rows, but has 127"):
        windows(x.reshape(-1, 2), size=4)
