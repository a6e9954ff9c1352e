"""A store on S3: written, resumed and read back through a real S3-protocol server
(moto in server mode) on 127.0.0.1, started by the test."""

from __future__ import annotations

import numpy as np
import pytest

import pipeline
from pipeline.errors import IncompleteStoreError
from pipeline.storage import write
from pipeline.storage.writer import written_units


def test_write_resume_and_read_back_on_s3(s3, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    x = np.random.default_rng(0).standard_normal((400, 5, 2)).astype(np.float32)
    url = "s3://training/sets/ob.zarr"
    write(url, {"x": x, "y": np.arange(400)}, splits={"train": .75, "val": .25}, gap=0, chunk_samples=50,
          fingerprint="s3test", storage_options=s3, progress=False)
    ds = pipeline.open(url, storage_options=s3)
    np.testing.assert_array_equal(ds["train"]["x"][:], x[:300])
    np.testing.assert_array_equal(ds["val"]["y"][:], np.arange(300, 400))

    # Simulate a crash: two units lost their markers, the store is not complete.
    group = pipeline.storage.open_store_group(url, mode="r+", storage_options=s3)
    meta = dict(group.attrs["pipeline"])
    meta["complete"] = False
    group.attrs["pipeline"] = meta
    group["train/_written"][2] = 0
    group["train/_written"][5] = 0
    group["train/x"][100:150] = 0  # the torn unit's data
    with pytest.raises(IncompleteStoreError):
        pipeline.open(url, storage_options=s3)
    write(url, {"x": x, "y": np.arange(400)}, splits={"train": .75, "val": .25}, gap=0, chunk_samples=50,
          fingerprint="s3test", storage_options=s3, progress=False)
    ds = pipeline.open(url, storage_options=s3)
    assert written_units(ds.group, "train").all()
    np.testing.assert_array_equal(ds["train"]["x"][:], x[:300])
    ids = np.concatenate([y for _, y in pipeline.stream(url, batch_size=64, storage_options=s3)])
    assert sorted(ids.tolist()) == list(range(300))


def test_a_bucket_that_does_not_exist_is_said_so(s3, monkeypatch):
    """zarr says "no group found" of a missing bucket as of an empty prefix: the user
    was sent looking for a store, not for the bucket."""
    from pipeline.errors import StoreError

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    for opened in (lambda url: pipeline.open(url, storage_options=s3),
                   lambda url: pipeline.stream(url, batch_size=8, storage_options=s3)):
        with pytest.raises(StoreError, match=r"s3://no-such-bucket/set.zarr: the bucket 'no-such-bucket' does not "
                                             r"exist"):
            opened("s3://no-such-bucket/set.zarr")
        with pytest.raises(StoreError, match=r"s3://training/no-such-set.zarr: no zarr group found"):
            opened("s3://training/no-such-set.zarr")  # the bucket exists: the store does not
