"""pipeline.mix: whole batches from several sources in proportion to their weights.

Every source's labels carry its number (``y = 100_000 * source + sample index``), so the
tests read which source served a batch, and which samples, from the batch itself. The
references are computed here independently: the epoch length by search, the counts by
exact fractions, each source's batch sequence by a separate stream of that source.
"""

from __future__ import annotations

import collections
import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pipeline
from pipeline.errors import StreamError
from pipeline.storage import write

TAG = 100_000


def arrays(source: int, n: int, width: int = 3) -> dict[str, np.ndarray]:
    """In-memory arrays of one source: y holds the source's tag and the sample index."""
    y = TAG * source + np.arange(n, dtype=np.int64)
    return {"x": np.broadcast_to(y[:, None].astype(np.float32), (n, width)).copy(), "y": y}


def store(path, source: int, n: int, shape: tuple[int, ...], chunk: int = 32, splits=None) -> str:
    y = TAG * source + np.arange(n, dtype=np.int64)
    x = np.broadcast_to(y.reshape((n,) + (1,) * len(shape)).astype(np.float32), (n, *shape)).copy()
    write(path, {"x": x, "y": y}, chunk_samples=chunk, progress=False, splits=splits,
          gap=0 if splits else None)
    return str(path)


def source_of(batch) -> int:
    sources = set((np.asarray(batch[1]) // TAG).tolist())
    assert len(sources) == 1, f"a batch mixes sources {sources}"
    return sources.pop()


def labels(m) -> list[np.ndarray]:
    """One epoch's labels, batch by batch (copied: batches are views of reused buffers)."""
    return [np.array(b[1]) for b in m]


def reference_steps(lengths, weights) -> int:
    """The fewest steps in which every weighted source serves its whole epoch, by search."""
    total = sum(Fraction(w) for w in weights)
    n = 1
    while any(Fraction(w) / total * n < length for w, length in zip(weights, lengths) if w > 0):
        n += 1
    return n


def reference_counts(steps: int, weights) -> list[int]:
    """Largest remainders, ties to the lower index (written apart from the module's)."""
    total = sum(Fraction(w) for w in weights)
    quotas = [Fraction(w) / total * steps for w in weights]
    counts = [q.numerator // q.denominator for q in quotas]
    order = sorted(range(len(weights)), key=lambda i: (counts[i] - quotas[i], i))
    for i in order[: steps - sum(counts)]:
        counts[i] += 1
    return counts


# -- proportions --------------------------------------------------------------------------


@pytest.mark.parametrize(("weights", "sizes", "batch"), [
    ([0.7, 0.3], [1000, 300], 32),
    ([1, 1], [400, 400], 16),
    ([3, 2, 5], [500, 700, 90], 10),
    ([0.5, 0.0, 0.5], [100, 100, 300], 7),
])
def test_epoch_length_and_counts_match_the_weights(weights, sizes, batch):
    m = pipeline.mix([arrays(i, n) for i, n in enumerate(sizes)], weights=weights, batch_size=batch, seed=3)
    lengths = [math.ceil(n / batch) for n in sizes]
    steps = reference_steps(lengths, weights)
    assert len(m) == steps
    counts = collections.Counter(source_of(b) for b in m)
    want = reference_counts(steps, weights)
    assert [counts[i] for i in range(len(sizes))] == want
    total = sum(Fraction(w) for w in weights)
    for w, c, length in zip(weights, want, lengths):
        assert abs(c - Fraction(w) / total * steps) < 1
        assert w == 0 or c >= length  # every weighted source serves at least its whole epoch


def _within_quota(sequence: list[int], counts: list[int]) -> None:
    """Every prefix between floor and ceiling of its share; every window, across epoch
    boundaries too, from floor(share) - 1 to ceil(share) + 1."""
    n = sum(counts)
    for i, c in enumerate(counts):
        prefix = np.concatenate([[0], np.cumsum(np.asarray(sequence) == i)])
        for h in range(len(sequence) + 1):
            share = Fraction(h * c, n) if h <= n else None
            if share is not None:
                assert math.floor(share) <= prefix[h] <= math.ceil(share), (i, h, prefix[h], share)
        for k in range(1, len(sequence) + 1):
            got = prefix[k:] - prefix[:-k]
            share = Fraction(k * c, n)
            assert got.min() >= math.floor(share) - 1 and got.max() <= math.ceil(share) + 1, (i, k)


@settings(max_examples=40, deadline=None)
@given(weights=st.lists(st.integers(0, 9), min_size=1, max_size=5).filter(lambda w: sum(w) > 0),
       lengths=st.lists(st.integers(1, 12), min_size=5, max_size=5),
       seed=st.integers(0, 2**16), epoch=st.integers(0, 50))
def test_schedule_keeps_every_prefix_and_window_within_quota(weights, lengths, seed, epoch):
    """The pure schedule, on counts and weights hypothesis picks (no store needed)."""
    from pipeline.streaming.mix import apportion, epoch_steps, quota_schedule, shares, tie_order

    lengths = lengths[: len(weights)]
    parts = shares(weights, len(weights))
    steps = epoch_steps(lengths, parts)
    assert steps == reference_steps(lengths, weights)
    counts = list(apportion(steps, parts))
    assert counts == reference_counts(steps, weights)
    one = quota_schedule(counts, tie_order(len(weights), seed, epoch)).tolist()
    two = quota_schedule(counts, tie_order(len(weights), seed, epoch + 1)).tolist()
    assert [one.count(i) for i in range(len(weights))] == counts
    _within_quota(one, counts)
    _within_quota(one + two, counts)  # windows across an epoch boundary


def test_served_batches_follow_the_schedule_and_stay_within_quota_over_epochs():
    m = pipeline.mix([arrays(0, 640), arrays(1, 200), arrays(2, 330)], weights=[5, 2, 3], batch_size=10, seed=7)
    served = []
    for epoch in range(3):
        m.set_epoch(epoch)
        got = [source_of(b) for b in m]
        assert got == m.schedule(epoch).tolist()
        served += got
    _within_quota(served, list(m.counts))


def test_a_zero_weight_source_is_never_drawn():
    m = pipeline.mix([arrays(0, 100), arrays(1, 100)], weights=[1, 0], batch_size=10)
    assert {source_of(b) for b in m} == {0} and len(m) == 10 and m.counts == (10, 0)


# -- what each source serves ---------------------------------------------------------------


def _source_sequence(data: dict, batch: int, seed: int, n_batches: int, **kw) -> list[np.ndarray]:
    """The reference: a source's own stream, epoch after epoch, cut at ``n_batches``."""
    s = pipeline.stream(data, batch_size=batch, seed=seed, **kw)
    out, epoch = [], 0
    while len(out) < n_batches:
        s.set_epoch(epoch)
        out += labels(s)
        epoch += 1
    return out[:n_batches]


@pytest.mark.parametrize("epoch_length", [None, 7, 50])
def test_each_source_runs_through_its_own_epochs_across_mix_epochs(epoch_length):
    """A source's batches in mix epochs 0, 1, 2 are its own stream's epochs back to back:
    nothing is skipped or repeated, whether the epoch is the default or given."""
    data = [arrays(0, 330), arrays(1, 120)]
    m = pipeline.mix(data, weights=[0.6, 0.4], batch_size=16, seed=5, epoch_length=epoch_length)
    per_source = collections.defaultdict(list)
    for epoch in range(3):
        m.set_epoch(epoch)
        for y in labels(m):
            per_source[source_of((None, y))].append(y)
    for i, d in enumerate(data):
        assert len(per_source[i]) == 3 * m.counts[i]
        want = _source_sequence(d, 16, 5, 3 * m.counts[i])
        assert all(np.array_equal(a, b) for a, b in zip(per_source[i], want))


def test_stores_of_different_shapes_and_a_store_split_pair(tmp_path):
    a = store(tmp_path / "a.zarr", 0, 500, (4, 3))
    b = store(tmp_path / "b.zarr", 1, 300, (2, 5), splits={"train": 0.5, "val": 0.5})
    m = pipeline.mix([a, (b, "val")], weights=[0.7, 0.3], batch_size=25, seed=2)
    val = {int(v) for _, yb in pipeline.stream(b, split="val", batch_size=50) for v in yb}
    seen = collections.defaultdict(list)
    for xb, yb in m:
        i = source_of((xb, yb))
        assert xb.shape[1:] == [(4, 3), (2, 5)][i]
        assert np.array_equal(xb.reshape(len(xb), -1)[:, 0], yb)  # x and y stay aligned
        seen[i] += yb.tolist()
    assert len(m) == reference_steps([20, 6], [0.7, 0.3])
    assert set(seen[0]) == set(range(500)) and set(seen[1]) == val


def test_made_streams_are_used_as_they_are():
    a = pipeline.stream(arrays(0, 200), batch_size=20, seed=1)
    b = pipeline.stream(arrays(1, 90), batch_size=9, seed=4)
    m = pipeline.mix([a, b], weights=[1, 1])
    assert m.streams == (a, b) and m.lengths == (10, 10)
    sizes = {source_of(batch): len(batch[1]) for batch in m}
    assert sizes == {0: 20, 1: 9}


# -- determinism and resume ----------------------------------------------------------------


def test_same_seed_same_epoch_and_another_seed_another_order():
    def run(seed, epoch):
        m = pipeline.mix([arrays(0, 300), arrays(1, 300)], weights=[1, 1], batch_size=10, seed=seed)
        m.set_epoch(epoch)
        return labels(m)

    first = run(0, 0)
    assert all(np.array_equal(a, b) for a, b in zip(first, run(0, 0)))
    # Equal weights: the schedule alternates, and the seeded tie order picks which
    # source leads; it changes with the epoch and the seed.
    orders = {tuple(source_of((None, y)) for y in run(seed, epoch)) for seed, epoch in
              [(0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (2, 0)]}
    assert orders == {(0, 1) * 30, (1, 0) * 30}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(weights=st.lists(st.integers(0, 6), min_size=2, max_size=3).filter(lambda w: sum(w) > 0),
       sizes=st.lists(st.integers(20, 200), min_size=3, max_size=3),
       batch=st.integers(2, 33), epoch=st.integers(0, 3), at=st.floats(0, 1), seed=st.integers(0, 99))
def test_resume_mid_epoch_serves_the_rest_as_an_uninterrupted_run(weights, sizes, batch, epoch, at, seed):
    data = [arrays(i, n) for i, n in enumerate(sizes[: len(weights)])]

    def make():
        return pipeline.mix(data, weights=weights, batch_size=batch, seed=seed, threads=1)

    whole = make()
    whole.set_epoch(epoch)
    want = labels(whole)
    cut = int(at * len(want))
    first = make()
    first.set_epoch(epoch)
    it = iter(first)
    head = [np.array(next(it)[1]) for _ in range(cut)]
    state = first.state_dict()
    it.close()
    assert state["batches_served"] == cut
    resumed = make()
    resumed.load_state_dict(state)
    rest = labels(resumed)
    assert len(head) + len(rest) == len(want)
    assert all(np.array_equal(a, b) for a, b in zip(head + rest, want))
    # The epoch after the resumed one is the uninterrupted run's next epoch.
    whole.set_epoch(epoch + 1)
    resumed.set_epoch(epoch + 1)
    assert all(np.array_equal(a, b) for a, b in zip(labels(resumed), labels(whole)))


def test_resume_refuses_another_configuration():
    m = pipeline.mix([arrays(0, 100), arrays(1, 100)], weights=[1, 1], batch_size=10)
    other = pipeline.mix([arrays(0, 100), arrays(1, 100)], weights=[3, 1], batch_size=10)
    with pytest.raises(StreamError, match=r"steps_per_epoch=20, this mix has 40"):
        other.load_state_dict(m.state_dict())
    with pytest.raises(StreamError, match=r"seed=5, this mix has 0"):
        m.load_state_dict({**m.state_dict(), "seed": 5})
    with pytest.raises(StreamError, match=r"batches_served must be 0 to 20, got 21"):
        m.load_state_dict({"epoch": 0, "batches_served": 21})


# -- ranks and workers --------------------------------------------------------------------


@pytest.mark.parametrize("world", [1, 2, 3])
def test_ranks_take_equal_steps_from_the_same_sources_and_share_every_sample_once(tmp_path, world):
    a = store(tmp_path / "a.zarr", 0, 410, (4, 3))
    b = store(tmp_path / "b.zarr", 1, 170, (2, 5))
    runs = []
    for rank in range(world):
        m = pipeline.mix([a, b], weights=[2, 1], batch_size=12, seed=9, rank=rank, world_size=world)
        runs.append((m, labels(m)))
    assert len({len(got) for _, got in runs}) == 1 and all(len(got) == len(m) for m, got in runs)
    schedules = [[source_of((None, y)) for y in got] for _, got in runs]
    assert all(s == schedules[0] for s in schedules)
    for i, n in enumerate((410, 170)):
        # Each rank's first len(stream) batches of source i are its share of that
        # source's epoch 0: together, every sample exactly once.
        counts = collections.Counter()
        for m, got in runs:
            mine = [y for y in got if source_of((None, y)) == i][: m.lengths[i]]
            counts.update(np.concatenate(mine).tolist())
        assert sorted(counts) == list(range(TAG * i, TAG * i + n)) and set(counts.values()) == {1}


@pytest.mark.parametrize("workers", [0, 2])
def test_torch_dataloader_workers_serve_the_epoch_and_resume(workers):
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    data = [arrays(0, 300), arrays(1, 200)]
    m = pipeline.mix(data, weights=[0.6, 0.4], batch_size=16, seed=1)
    single = labels(m)
    loader = DataLoader(m.torch(), batch_size=None, num_workers=workers)
    got = [yb.numpy().copy() for _, yb in loader]
    assert isinstance(next(iter(loader))[0], torch.Tensor)
    key = sorted(tuple(y.tolist()) for y in got)
    assert key == sorted(tuple(y.tolist()) for y in single) and len(got) == len(m)
    for consumed in (7, 8):
        m.load_state_dict({"epoch": 0, "batches_served": consumed})
        rest = [yb.numpy().copy() for _, yb in DataLoader(m.torch(), batch_size=None, num_workers=workers)]
        # Exactly the batches not yet served, in the uninterrupted order (an odd count on 2
        # workers too: the workers take the turns up where the interrupted loader stopped).
        assert [y.tolist() for y in rest] == [y.tolist() for y in got[consumed:]]


def test_keras_fit_on_a_mix(tmp_path, monkeypatch):
    monkeypatch.setenv("KERAS_BACKEND", "torch")
    keras = pytest.importorskip("keras")
    if keras.backend.backend() != "torch":
        pytest.skip(f"keras was imported with the {keras.backend.backend()} backend")
    a = store(tmp_path / "a.zarr", 0, 300, (4, 3), splits={"train": 0.6, "val": 0.4})
    m = pipeline.mix([a, (a, "val")], weights=[0.5, 0.5], batch_size=20, seed=0)
    ds = m.keras()
    assert len(ds) == len(m)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input(shape=(4, 3)), keras.layers.Flatten(), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    history = model.fit(ds, epochs=2, verbose=0)
    assert len(history.history["loss"]) == 2 and np.isfinite(history.history["loss"]).all()
    assert m.epoch >= 2  # on_epoch_end moved the mix on


# -- errors --------------------------------------------------------------------------------


@pytest.mark.parametrize(("weights", "message"), [
    ([1, -0.5], r"weights must be 0 or more, got -0\.5 for source 1"),
    ([0, 0.0], r"weights must have a positive sum, got \[0, 0\.0\]"),
    ([1], r"expected 2 weights \(one per source\), got 1: \[1\]"),
    ([1, 2, 3], r"expected 2 weights \(one per source\), got 3"),
    ([1, float("nan")], r"weight 1 must be a finite number, got nan"),
    ([True, 1], r"weight 0 must be a finite number, got True"),
    ("11", r"weights must be a sequence of 2 numbers, got '11'"),
])
def test_bad_weights_are_refused_naming_what_came(weights, message):
    with pytest.raises(StreamError, match=message):
        pipeline.mix([arrays(0, 10), arrays(1, 10)], weights=weights, batch_size=5)


def test_other_bad_input_is_refused():
    a, b = arrays(0, 50), arrays(1, 50)
    with pytest.raises(StreamError, match=r"sources must be a non-empty list"):
        pipeline.mix([], weights=[], batch_size=5)
    with pytest.raises(StreamError, match=r"batch_size is needed to open source 0"):
        pipeline.mix([a, b], weights=[1, 1])
    with pytest.raises(StreamError, match=r"epoch_length must be a positive integer or None, got 0"):
        pipeline.mix([a, b], weights=[1, 1], batch_size=5, epoch_length=0)
    s = pipeline.stream(a, batch_size=5)
    with pytest.raises(StreamError, match=r"sources 0 and 1 are the same stream object"):
        pipeline.mix([s, s], weights=[1, 1])
    with pytest.raises(StreamError, match=r"source 1 is a stream with rank=0, the mix was given rank=1"):
        pipeline.mix([b, s], weights=[1, 1], batch_size=5, rank=1, world_size=2)
    with pytest.raises(StreamError, match=r"source 1 has weight 1 but no batches on rank 0 of 1"):
        pipeline.mix([a, arrays(1, 4)], weights=[1, 1], batch_size=5, drop_last=True)
    # a seed every rank shares, checked before any source is opened
    for seed, message in ((None, "seed=None is refused"), (-2, "got -2"), ("7", "got '7'"), (2.0, "got 2.0")):
        with pytest.raises(StreamError, match=f"^mix: .*{message}"):
            pipeline.mix([a, "/nonexistent.zarr"], weights=[1, 1], batch_size=5, seed=seed)
    assert pipeline.mix([a, b], weights=[1, 1], batch_size=5, seed=np.uint8(3)).state_dict()["seed"] == 3


def test_an_iteration_after_a_break_continues_the_epoch_and_says_so():
    m = pipeline.mix([arrays(0, 300), arrays(1, 200)], weights=[0.6, 0.4], batch_size=16, seed=1)
    full = labels(m)
    head = []
    for batch in m:
        head.append(np.array(batch[1]))
        if len(head) == 3:
            break
    with pytest.warns(RuntimeWarning, match=f"mix: iterating again continues epoch 0, which an earlier iteration "
                                            f"left after 3 of its {len(full)} batches"):
        rest = labels(m)
    assert [y.tolist() for y in head + rest] == [y.tolist() for y in full]


def test_stream_with_weights_is_the_mix(tmp_path):
    paths = [store(tmp_path / f"s{i}.zarr", i, n, (3,)) for i, n in enumerate((300, 120))]
    via_stream = pipeline.stream(paths, weights=[0.6, 0.4], batch_size=16, seed=5)
    via_mix = pipeline.mix(paths, weights=[0.6, 0.4], batch_size=16, seed=5)
    assert len(via_stream) == len(via_mix)
    for a, b in zip(via_stream, via_mix):
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)


def test_stream_with_weights_passes_every_option_on(tmp_path):
    import zarr

    paths = []
    for i, n in enumerate((96, 64)):
        root = zarr.open_group(tmp_path / f"xr{i}.zarr", mode="w", zarr_format=3)
        root.create_array("x", data=np.full((n, 3), i, np.float32), chunks=(32, 3), dimension_names=("sample", "f"))
        root.create_array("y", data=np.arange(n), chunks=(32,), dimension_names=("sample",))
        paths.append(str(tmp_path / f"xr{i}.zarr"))
    s = pipeline.stream(paths, weights=[0.5, 0.5], batch_size=16, dim="sample")
    seen = {0: [], 1: []}
    for xb, yb in s:
        seen[int(xb[0, 0])].extend(yb.tolist())
    assert sorted(seen[0]) == list(range(96)) and set(seen[1]) == set(range(64))
    with pytest.raises(StreamError, match="nope"):
        pipeline.stream(paths, weights=[0.5, 0.5], batch_size=16, dim="nope")
    with pytest.raises(StreamError, match="cache_bytes"):
        pipeline.stream(paths, weights=[0.5, 0.5], batch_size=16, cache_dir=tmp_path / "cache")


def test_a_mix_state_served_in_this_process_records_one_server():
    """A mix's plain loop (or DataLoader(num_workers=0)) is one server: its state says so,
    resumes on one and is refused by a loader of 2 workers, which would take turns over
    shares the loop never had."""
    def make():
        return pipeline.mix([arrays(0, 300), arrays(1, 200)], weights=[3, 2], batch_size=10, seed=4)

    m = make()
    it = iter(m)
    first = [next(it) for _ in range(5)]
    state = m.state_dict()
    assert state["num_workers"] == 1 and state["batches_served"] == 5
    it.close()
    r = make()
    r.load_state_dict(state)
    assert len(first) + len(list(r)) == r.steps
    r.load_state_dict(state)
    with pytest.raises(StreamError, match=r"saved while one server \(a loop in one process, or one worker\) served, here 2 DataLoader workers"):
        next(r.iter_resumed(0, 2))


def test_a_mix_state_of_another_rank_is_refused_saying_what_to_do():
    """Rank 0's state of a mix of per-rank streams, loaded on rank 1: refused, naming
    per-rank states and global_batch_size (whose mix state any rank loads)."""
    def arrays(n):
        y = np.arange(n)
        return {"x": y[:, None].astype(np.float32), "y": y}

    m0, m1 = (pipeline.mix([arrays(100), arrays(60)], weights=[1, 1], batch_size=10, seed=1, rank=r, world_size=2)
              for r in range(2))
    it = iter(m0)
    next(it)
    state = m0.state_dict()
    it.close()
    with pytest.raises(StreamError, match=r"saved with rank=0, this mix has 1; .*save each rank's own "
                                          r"state_dict\(\) .* global_batch_size="):
        m1.load_state_dict(state)
