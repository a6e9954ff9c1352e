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
