"""pipeline.streaming.api: what ``stream`` itself does with its arguments.

The references are independent of the module: its source parsed with :mod:`ast`, and
streams opened one by one with the same arguments, whose batches numpy compares.
"""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np

import pipeline
from pipeline.storage import write
from pipeline.streaming import api

LIMIT = 120  # lines per function, its docstring included (the project's review limit)


def test_every_function_of_the_module_is_within_the_line_limit():
    tree = ast.parse(Path(api.__file__).read_text())
    long = [(n.name, n.end_lineno - n.lineno) for n in ast.walk(tree)
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.end_lineno - n.lineno > LIMIT]
    assert long == []


def _store(path: Path, tag: int, n: int) -> str:
    """A store whose split 'val' holds x, y and z; y is ``tag * 1000 + index``."""
    y = tag * 1000 + np.arange(n, dtype=np.int64)
    x = np.repeat(y[:, None], 2, axis=1).astype(np.float32)
    write(str(path), {"train": {"x": x[:8], "y": y[:8], "z": -y[:8]}, "val": {"x": x, "y": y, "z": -y}},
          chunk_samples=8, progress=False, gap=0)
    return str(path)


def test_weights_pass_every_other_argument_on_to_each_source(tmp_path):
    """stream(weights=) hands its other arguments to each source's stream: a source's
    stream inside the mix is the one stream(source, ...) opens alone, batch for batch."""
    sizes = (40, 56)
    sources = [_store(tmp_path / f"{tag}.zarr", tag, n) for tag, n in enumerate(sizes, 1)]
    kw = dict(split="val", arrays=("z", "x"), batch_size=3, shuffle=False, seed=7, buffer_chunks=2,
              drop_last=True, rank=1, world_size=2, prefetch=1, threads=1, read_niceness=3, keep_mapped=0)
    m = pipeline.stream(sources, weights=[1, 2], **kw)
    try:
        assert len(m.streams) == 2
        for path, n, inside in zip(sources, sizes, m.streams):
            alone = pipeline.stream(path, **kw)
            try:
                for key in ("names", "batch_size", "shuffle", "seed", "buffer_chunks", "drop_last", "rank",
                            "world_size", "prefetch", "threads", "read_niceness", "follow"):
                    assert getattr(inside, key) == getattr(alone, key), key
                got, want = list(inside), list(alone)
                assert len(got) == len(want) == n // 2 // 3  # rank 1's half, whole batches of 3 only
                for a, b in zip(got, want):
                    np.testing.assert_array_equal(a[0], b[0])
                    np.testing.assert_array_equal(a[1], b[1])
                    np.testing.assert_array_equal(a[0], -a[1][:, 0])  # z first, then x, as asked
            finally:
                alone.close()
    finally:
        m.close()


def documented_batch_sizes(n: int, world_size: int, batch_size: int, drop_last: bool) -> list[list[int]]:
    """Each rank's batch sizes as the stream docstring and the API reference state them:
    shares ``N*r//W`` to ``N*(r+1)//W``; ``ceil(ceil(N/W)/B)`` batches on every rank, full
    then the rest, an empty rest taking one sample from the batch before; with
    ``drop_last``, ``floor(floor(N/W)/B)`` full batches."""
    shares = [n * (r + 1) // world_size - n * r // world_size for r in range(world_size)]
    if drop_last:
        return [[batch_size] * ((n // world_size) // batch_size) for _ in shares]
    count = -(-(-(-n // world_size)) // batch_size)
    out = []
    for share in shares:
        sizes = [batch_size] * (count - 1) + [share - batch_size * (count - 1)]
        if sizes[-1] == 0:
            sizes[-2:] = [batch_size - 1, 1]
        out.append(sizes)
    return out


def test_per_rank_batch_sizes_are_as_documented_on_a_store(tmp_path):
    """The API reference's table: 1000 samples, batch_size=333, served from a store on
    disk: every sample once, batches of the sizes it lists."""
    import zarr

    n = 1000
    group = zarr.open_group(str(tmp_path / "s.zarr"), mode="w")
    group.create_array("x", data=np.arange(n * 2, dtype="f4").reshape(n, 2), chunks=(100, 2))
    group.create_array("y", data=np.arange(n), chunks=(100,))
    table = {(1, False): [[333, 333, 333, 1]], (3, False): [[332, 1], [332, 1], [333, 1]],
             (3, True): [[333], [333], [333]]}
    for (world_size, drop_last), expected in table.items():
        assert documented_batch_sizes(n, world_size, 333, drop_last) == expected
        served, sizes = [], []
        for rank in range(world_size):
            with pipeline.stream(str(tmp_path / "s.zarr"), batch_size=333, rank=rank, world_size=world_size,
                                 drop_last=drop_last) as s:
                ys = [yb.copy() for _, yb in s]
            sizes.append([len(y) for y in ys])
            served.extend(ys)
        assert sizes == expected
        ids = np.concatenate(served)
        assert len(ids) == len(set(ids.tolist())) == (n if not drop_last else 999)


def test_per_rank_batch_sizes_follow_the_documented_rule():
    for n in range(1, 41):
        for world_size in range(1, min(n, 4) + 1):
            for batch_size in (2, 3, 5, 8, 64):
                for drop_last in (False, True):
                    expected = documented_batch_sizes(n, world_size, batch_size, drop_last)
                    if drop_last and not expected[0]:
                        continue  # no whole batch: refused, as test_streamer checks
                    got = []
                    for rank in range(world_size):
                        s = pipeline.stream({"x": np.arange(n)}, arrays=("x",), batch_size=batch_size, rank=rank,
                                            world_size=world_size, drop_last=drop_last)
                        got.append(list(s.plan().batch_sizes))
                        assert len(s) == len(got[-1])
                        s.close()
                    assert got == expected, (n, world_size, batch_size, drop_last)


def test_ranks_come_from_the_launchers_environment_before_a_process_group(monkeypatch):
    """torchrun sets RANK and WORLD_SIZE before the script runs: a stream opened before
    ``init_process_group`` served the whole epoch on every rank (each sample twice on
    2 ranks). An explicit rank/world_size still wins; values that are no rank are left
    alone."""
    data = {"x": np.arange(300, dtype=np.float32)[:, None], "y": np.arange(300)}
    served = []
    for rank in range(3):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "3")
        s = pipeline.stream(data, batch_size=10, seed=0)
        assert (s.rank, s.world_size) == (rank, 3)
        served += [int(v) for _, y in s for v in y]
    assert sorted(served) == list(range(300))
    assert (pipeline.stream(data, batch_size=10, rank=0, world_size=1).world_size) == 1
    for rank, world in (("2", "2"), ("x", "2"), ("0", "")):
        monkeypatch.setenv("RANK", rank)
        monkeypatch.setenv("WORLD_SIZE", world)
        assert (pipeline.stream(data, batch_size=10).rank, pipeline.stream(data, batch_size=10).world_size) == (0, 1)
