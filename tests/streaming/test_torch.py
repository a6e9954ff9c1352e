"""PyTorch DataLoader over stream.torch(): workers and ranks share each epoch exactly once."""

from __future__ import annotations

import collections
import copy
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

import pipeline
from pipeline.errors import StreamError
from tests.streaming.conftest import in_turns, make_store


@pytest.mark.parametrize("workers", [0, 1, 2])
@pytest.mark.parametrize("world", [1, 2, 3])
def test_every_sample_once_across_ranks_and_workers(store, workers, world):
    counts = collections.Counter()
    per_rank = []
    for rank in range(world):
        s = pipeline.stream(store, batch_size=40, rank=rank, world_size=world, seed=1)
        loader = DataLoader(s.torch(), batch_size=None, num_workers=workers)
        n = 0
        for xb, yb in loader:
            assert isinstance(xb, torch.Tensor)
            assert torch.equal(xb[:, 0, 0].long(), yb)
            counts.update(yb.tolist())
            n += 1
        per_rank.append(n)
        assert n == len(s)
    assert len(set(per_rank)) == 1
    assert len(counts) == 1000 and max(counts.values()) == 1


def test_workers_after_the_parent_already_streamed_do_not_hang(store, tmp_path):
    """Fork safety: the parent has live reader threads and zarr's event loop before the
    DataLoader forks; the workers must still run (checked with a timeout)."""
    script = textwrap.dedent(f"""
        import pipeline
        from torch.utils.data import DataLoader
        s = pipeline.stream({store!r}, batch_size=50)
        for _ in s: pass
        n = sum(len(y) for _, y in DataLoader(s.torch(), batch_size=None, num_workers=2))
        assert n == 1000, n
        print("ok")
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr


def test_set_epoch_reaches_the_workers(store):
    s = pipeline.stream(store, batch_size=100, seed=0)
    firsts = []
    for epoch in range(2):
        s.set_epoch(epoch)
        firsts.append(next(iter(DataLoader(s.torch(), batch_size=None, num_workers=1)))[1].numpy())
    assert not np.array_equal(firsts[0], firsts[1])


def _loader_ids(s, workers):
    out = []
    for xb, yb in DataLoader(s.torch(), batch_size=None, num_workers=workers):
        assert torch.equal(xb[:, 0, 0].long(), yb)
        out.append(yb.numpy().copy())
    return out


@pytest.mark.parametrize("workers", [0, 2])
def test_resume_through_the_dataloader_yields_exactly_the_remaining_batches(store, workers):
    kw = dict(batch_size=40, seed=3, buffer_chunks=2, rank=1, world_size=2)
    ref = pipeline.stream(store, **kw)
    ref.set_epoch(1)
    full = _loader_ids(ref, workers)
    assert len(full) == len(ref)
    for consumed in (1, 4, len(full) - 1):
        s = pipeline.stream(store, **kw)
        s.load_state_dict({"epoch": 1, "batches_served": consumed})
        rest = _loader_ids(s, workers)
        assert len(rest) == len(full) - consumed
        # exactly the batches not yet served, each whole, in the uninterrupted order (after an odd
        # count on 2 workers too: the workers take the turns up where the interrupted loader stopped)
        assert [b.tolist() for b in rest] == [b.tolist() for b in full[consumed:]]
        s.set_epoch(2)  # the documented next step: a whole new epoch
        assert len(_loader_ids(s, workers)) == len(full)


def _exactly_once_over_two_ranks(source, workers, n):
    counts = collections.Counter()
    for rank in range(2):
        s = pipeline.stream(source, batch_size=32, rank=rank, world_size=2)
        batches = _loader_ids(s, workers)
        assert len(batches) == len(s)
        counts.update(np.concatenate(batches).tolist())
    assert len(counts) == n and max(counts.values()) == 1


@pytest.mark.parametrize("workers", [0, 2])
def test_in_memory_arrays_through_workers(workers):
    y = np.arange(600)
    arrays = {"x": np.broadcast_to(y[:, None, None].astype(np.float32), (600, 4, 3)).copy(), "y": y}
    _exactly_once_over_two_ranks(arrays, workers, 600)


@pytest.mark.parametrize("workers", [0, 2])
def test_dask_arrays_through_workers(workers):
    import dask.array as da

    y = np.arange(600)
    x = np.broadcast_to(y[:, None, None].astype(np.float32), (600, 4, 3)).copy()
    # Each worker computes its own chunks of the (pickled) graph.
    _exactly_once_over_two_ranks({"x": da.from_array(x, chunks=70) + 0, "y": da.from_array(y, chunks=70) * 1},
                                 workers, 600)


@pytest.mark.parametrize("workers", [0, 2])
def test_zip_store_through_workers(tmp_path, workers):
    from tests.streaming.conftest import make_store

    zipped = make_store(tmp_path / "w.zarr.zip", n=600, chunk=50)
    # forked workers once shared the parent's zip handle and read each other's bytes (BadZipFile);
    # a few epochs, as that race was intermittent
    for _ in range(3):
        _exactly_once_over_two_ranks(zipped, workers, 600)


def test_len_and_tensor_types(store):
    s = pipeline.stream(store, batch_size=64)
    ds = s.torch()
    assert isinstance(ds, torch.utils.data.IterableDataset)
    assert len(ds) == len(s) == 16
    xb, yb = next(iter(DataLoader(ds, batch_size=None)))
    assert xb.dtype == torch.float32 and yb.dtype == torch.int64 and xb.shape == (64, 4, 3)


def test_workers_after_a_parent_stopped_mid_epoch_over_ranks_do_not_hang(store):
    """The parent leaves an iteration half done (live producer thread, pools) before forking."""
    script = textwrap.dedent(f"""
        import collections
        import pipeline
        from torch.utils.data import DataLoader
        counts = collections.Counter()
        for rank in range(2):
            s = pipeline.stream({store!r}, batch_size=50, rank=rank, world_size=2)
            it = iter(s)
            next(it)
            s.set_epoch(0)
            s.load_state_dict({{"epoch": 0, "batches_served": 0}})
            for _, y in DataLoader(s.torch(), batch_size=None, num_workers=2):
                counts.update(y.tolist())
        assert len(counts) == 1000 and max(counts.values()) == 1, counts
        print("ok")
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr


# -- resuming in the order of the uninterrupted loop ------------------------------------------


@pytest.fixture(scope="module")
def two_stores(tmp_path_factory):
    root = tmp_path_factory.mktemp("order")
    return make_store(root / "a.zarr", n=203, chunk=13), make_store(root / "b.zarr", n=97, chunk=7)


#: The three kinds of streams a DataLoader resumes: per-rank batches, global steps, a mix.
KINDS = {
    "batch_size": lambda a, b: pipeline.stream(a, batch_size=10, seed=2, buffer_chunks=2, threads=2),
    "global_batch_size": lambda a, b: pipeline.stream(a, global_batch_size=8, seed=2, buffer_chunks=2, threads=2),
    "mix": lambda a, b: pipeline.mix([a, b], weights=[0.7, 0.3], batch_size=6, seed=4, buffer_chunks=2, threads=2),
}


def _loader_turns(s, workers: int) -> list[tuple[int, ...]]:
    """The labels of each batch a DataLoader of ``workers`` workers hands the loop,
    simulated: each worker iterates its own copy of the stream (as a forked worker
    does) and the loader takes one batch of each in turn from worker 0, skipping a
    worker that is done (torch's _MultiProcessingDataLoaderIter)."""
    n = max(1, workers)
    its = [copy.deepcopy(s).iter_resumed(k, n) for k in range(n)]
    return [tuple(got[-1].tolist()) for _, got in in_turns(its)]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kind=st.sampled_from(sorted(KINDS)), workers=st.integers(0, 3), data=st.data())
def test_a_resumed_loader_serves_the_rest_in_the_uninterrupted_order(two_stores, kind, workers, data):
    """Stopped after any number of batches, on any number of workers, and again after
    the resume: the rest is the uninterrupted loop's tail, batch for batch."""
    make = lambda: KINDS[kind](*two_stores)  # noqa: E731
    full = _loader_turns(make(), workers)
    assert len(full) == len(make())
    first = data.draw(st.integers(0, len(full)), label="first stop")
    again = data.draw(st.integers(first, len(full)), label="second stop")
    state = make().state_dict(batches_served=first, num_workers=workers)
    resumed = make()
    resumed.load_state_dict(state)
    assert _loader_turns(resumed, workers) == full[first:]
    # The resumed run stopped in turn: its state (the epoch's count) resumes a third run.
    state = resumed.state_dict(batches_served=again, num_workers=workers)
    last = make()
    last.load_state_dict(state)
    assert _loader_turns(last, workers) == full[again:]


@pytest.mark.filterwarnings("ignore:This DataLoader will create")  # 3 workers on a 2-core machine, on purpose
@pytest.mark.parametrize("kind, workers, stops", [("batch_size", 3, (1, 5)), ("global_batch_size", 2, (3,)),
                                                  ("mix", 2, (5,))])
def test_real_dataloader_workers_resume_in_the_uninterrupted_order(two_stores, kind, workers, stops):
    def run(s, stop=None):
        out = []
        for batch in DataLoader(s.torch(), batch_size=None, num_workers=workers):
            out.append(tuple(batch[-1].tolist()))
            if len(out) == stop:
                break
        return out

    make = lambda: KINDS[kind](*two_stores)  # noqa: E731
    full = run(make())
    for stop in stops:
        s = make()
        head = run(s, stop)
        resumed = make()
        resumed.load_state_dict(s.state_dict(batches_served=stop, num_workers=workers))
        assert head + run(resumed) == full


@pytest.mark.parametrize("via", ["plain", "dataloader0"])
def test_a_state_served_in_this_process_records_one_server(store, via):
    """A plain loop and DataLoader(num_workers=0) are one server in this process: the
    state says so without num_workers=, resumes exactly on 0 workers and is refused on 2
    (which would take turns over shares the loop never had: 7 batches twice, 7 never)."""
    def make():
        s = pipeline.stream(store, batch_size=32, seed=3, buffer_chunks=3)
        s.set_epoch(2)
        return s

    a = make()
    src = iter(a) if via == "plain" else iter(DataLoader(a.torch(), batch_size=None, num_workers=0))
    first = [np.asarray(next(src)[1]).copy() for _ in range(7)]
    state = a.state_dict(batches_served=7)
    assert state["num_workers"] == 1
    b = make()
    b.load_state_dict(state)
    rest = [y.numpy() for _, y in DataLoader(b.torch(), batch_size=None, num_workers=0)]
    np.testing.assert_array_equal(np.sort(np.concatenate(first + rest)), np.arange(1000))
    c = make()
    c.load_state_dict(state)
    with pytest.raises(StreamError, match="saved while 1 server .* served, here 2 DataLoader workers serve; .* global_batch_size"):
        next(c.iter_resumed(0, 2))


def _labels(loader, stop=None):
    """The label batches a loop over ``loader`` takes (all, or its first ``stop``)."""
    out = []
    for _, yb in loader:
        out.append(yb.numpy().copy())
        if stop is not None and len(out) == stop:
            break
    return out


@pytest.mark.filterwarnings("ignore:This DataLoader will create")  # 3 workers on a 2-core machine, on purpose
@pytest.mark.parametrize("kind", ["batch_size", "global_batch_size"])
@pytest.mark.parametrize("saved, resumed, stop", [(3, 2, 7), (2, 3, 5), (2, 0, 5), (2, 2, 5)])
def test_a_state_saved_without_num_workers_records_the_loaders_workers(store, kind, saved, resumed, stop):
    """state_dict(batches_served=n) without num_workers=, after a loader of ``saved``
    workers: the state says how many served (their torch dataset told the stream), so a
    resume on another count serves the rest exactly once (global_batch_size) or is
    refused (batch_size); it never serves some samples twice and others never (3 -> 2
    workers served 2048 twice and 2048 never before the workers said so)."""
    make = lambda: pipeline.stream(store, seed=2, buffer_chunks=2, **{kind: 32})  # noqa: E731
    s = make()
    first = _labels(DataLoader(s.torch(), batch_size=None, num_workers=saved), stop)
    state = s.state_dict(batches_served=stop)
    assert state["num_workers"] == saved
    r = make()
    r.load_state_dict(state)
    if kind == "batch_size" and max(1, resumed) != saved:
        # Asked as a worker of that loader would ask: a DataLoader whose workers raise
        # takes torch 5 s per worker to shut down (torch's join timeout), for nothing here.
        with pytest.raises(StreamError, match=f"saved while {saved} DataLoader workers served"):
            next(iter(r) if resumed == 0 else r.iter_resumed(0, resumed))  # num_workers=0 iterates the stream
        return
    loader = DataLoader(r.torch(), batch_size=None, num_workers=resumed)
    served = np.concatenate(first + _labels(loader))
    np.testing.assert_array_equal(np.sort(served), np.arange(1000))


def test_a_count_no_loader_reported_is_refused(store):
    """batches_served beyond what the stream knows, with no worker count it can know
    (its torch dataset's workers never started): refused, naming num_workers=, rather
    than recorded for a resume that might take other turns."""
    s = pipeline.stream(store, batch_size=32, seed=2)
    s.torch()
    with pytest.raises(StreamError, match=r"batches_served=5\): .*cannot tell .* pass num_workers="):
        s.state_dict(batches_served=5)
    assert s.state_dict(batches_served=5, num_workers=2)["num_workers"] == 2
    assert s.state_dict(batches_served=len(s))["batches_served"] == len(s)  # a whole epoch: nothing to share


def test_a_loader_without_workers_counts_what_it_served(store):
    """DataLoader(num_workers=0) is one server, as a plain loop: after a break its
    state_dict() holds the batches taken, and iterating the loader again continues the
    epoch (saying so) instead of serving it again from its start."""
    s = pipeline.stream(store, batch_size=32, seed=7)
    loader = DataLoader(s.torch(), batch_size=None, num_workers=0)
    first = _labels(loader, 10)
    state = s.state_dict()
    assert (state["epoch"], state["batches_served"], state["num_workers"]) == (0, 10, 1)
    with pytest.warns(RuntimeWarning, match="continues epoch 0, which an earlier iteration left after 10"):
        rest = _labels(loader)
    assert len(rest) == len(s) - 10
    np.testing.assert_array_equal(np.sort(np.concatenate(first + rest)), np.arange(1000))
    resumed = pipeline.stream(store, batch_size=32, seed=7)
    resumed.load_state_dict(state)
    np.testing.assert_array_equal(np.concatenate([np.asarray(y) for _, y in resumed]), np.concatenate(rest))


def test_state_dict_without_a_count_is_refused_while_workers_serve(store):
    """After a break in a loop over DataLoader workers, state_dict() without
    batches_served= once said batches_served=0 (the workers' batches are counted in no
    copy this process sees), and the resume served the batches taken twice: it is
    refused, in this process, asking for the count; with it, the resume serves the rest
    of the epoch once. Before any iteration, after load_state_dict and after set_epoch
    nothing was taken from workers at that position, and state_dict() answers."""
    make = lambda: pipeline.stream(store, batch_size=32, seed=4)  # noqa: E731
    s = make()
    loader = DataLoader(s.torch(), batch_size=None, num_workers=2)
    assert s.state_dict()["batches_served"] == 0  # the loader made, nothing iterated
    first = _labels(loader, 10)
    with pytest.raises(StreamError, match=r"2 DataLoader workers serve epoch 0 .* pass batches_served=n"):
        s.state_dict()
    with pytest.raises(StreamError, match=r"pass batches_served=n"):
        s.state_dict(num_workers=2)  # a worker count is no batch count
    state = s.state_dict(batches_served=10)
    assert (state["batches_served"], state["num_workers"]) == (10, 2)
    r = make()
    r.load_state_dict(state)
    assert r.state_dict()["batches_served"] == 10  # a loaded state: the count is known
    rest = _labels(DataLoader(r.torch(), batch_size=None, num_workers=2))
    served = np.concatenate(first + rest)
    np.testing.assert_array_equal(np.sort(served), np.arange(1000))  # each sample once
    with pytest.raises(StreamError, match=r"from batch 10 of 32 .* \(10 to 32, .* set_epoch\(1\)"):
        r.state_dict()  # the whole epoch was served, by workers this process did not count
    r.set_epoch(1)
    assert {k: r.state_dict()[k] for k in ("epoch", "batches_served")} == {"epoch": 1, "batches_served": 0}


def test_a_mix_refuses_a_state_without_a_count_while_workers_serve(tmp_path):
    a, b = make_store(tmp_path / "a.zarr", n=300), make_store(tmp_path / "b.zarr", n=200)
    m = pipeline.mix([pipeline.stream(a, batch_size=16, seed=1), pipeline.stream(b, batch_size=16, seed=1)],
                     weights=[1, 1], batch_size=16, seed=1)
    assert m.state_dict()["batches_served"] == 0
    _labels(DataLoader(m.torch(), batch_size=None, num_workers=2), 5)
    with pytest.raises(StreamError, match=r"mix: .* 2 DataLoader workers serve epoch 0 .* pass batches_served=n"):
        m.state_dict()
    assert {k: m.state_dict(batches_served=5)[k] for k in ("batches_served", "num_workers")} == \
        {"batches_served": 5, "num_workers": 2}
    m.set_epoch(1)
    assert m.state_dict()["batches_served"] == 0


@pytest.mark.parametrize("persistent", [False, True])
def test_a_loader_iterated_again_where_the_stream_stands_warns_from_its_workers(persistent):
    """With workers, iterating the loader again without set_epoch served the epoch again,
    whole even after a break (1,403 samples of 1,003), silently, where a loop in one
    process warns. A worker says so, on stderr (run as a script: a worker's
    warning reaches no filter of the main process, and pytest's would swallow it);
    after set_epoch, nothing is said."""
    script = textwrap.dedent(f"""
        import sys
        import numpy as np
        import pipeline
        from torch.utils.data import DataLoader

        if __name__ == "__main__":
            s = pipeline.stream({{"x": np.zeros((1000, 2), np.float32), "y": np.arange(1000)}}, batch_size=100, seed=0)
            loader = DataLoader(s.torch(), batch_size=None, num_workers=2, persistent_workers={persistent})
            def serve():
                got = [int(v) for _, y in loader for v in y]
                sys.stderr.flush()
                return got
            first = serve()
            print("PASS 2", file=sys.stderr, flush=True)
            again = serve()
            print("SET_EPOCH", file=sys.stderr, flush=True)
            s.set_epoch(1)
            third = serve()
            s.set_epoch(1)  # the same epoch again, on purpose: said by set_epoch
            serve()
            print(sorted(first) == list(range(1000)), again == first, sorted(third) == list(range(1000)))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["True", "True", "True"]
    said = "a DataLoader iterates epoch 0 again from where its previous iteration began"
    before, _, rest = done.stderr.partition("PASS 2")
    second, _, after = rest.partition("SET_EPOCH")
    assert said not in before and said in second and "iterates epoch" not in after
