"""DataLoader(persistent_workers=True): the workers keep their copies of the stream, and
set_epoch and load_state_dict in the main process still reach them (fork and spawn)."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest
from torch.utils.data import DataLoader

import pipeline
from pipeline.errors import StreamError
from pipeline.streaming.torch import StateBoard

KW = dict(batch_size=40, seed=3, buffer_chunks=2)


def _loader(source, persistent: bool, workers: int = 2, context: str | None = None) -> DataLoader:
    return DataLoader(source.torch(), batch_size=None, num_workers=workers, persistent_workers=persistent,
                      multiprocessing_context=context)


def _epoch(loader) -> list[list[int]]:
    return [y.tolist() for _, y in loader]


def _epochs(source, loader, epochs) -> list[list[list[int]]]:
    out = []
    for e in epochs:
        source.set_epoch(e)
        out.append(_epoch(loader))
    return out


def _samples(batches) -> list[int]:
    return sorted(sum(batches, []))


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_persistent_workers_serve_each_epochs_own_order(store, context):
    ref_stream = pipeline.stream(store, **KW)
    want = _epochs(ref_stream, _loader(ref_stream, False), range(3))
    s = pipeline.stream(store, **KW)
    got = _epochs(s, _loader(s, True, context=context), range(3))
    assert got == want  # the order of each epoch, as workers started afresh serve it
    for batches in got:
        assert _samples(batches) == list(range(1000))  # each sample once per epoch
    assert got[0] != got[1] != got[2]


def test_persistent_workers_take_up_a_loaded_state(store):
    ref = pipeline.stream(store, **KW)
    ref.set_epoch(3)
    whole = _epoch(_loader(ref, False))
    s = pipeline.stream(store, **KW)
    loader = _loader(s, True)
    assert _samples(_epoch(loader)) == list(range(1000))  # epoch 0 starts the workers
    s.load_state_dict({**s.state_dict(batches_served=len(s)), "epoch": 3, "batches_served": 6, "num_workers": 2})
    assert _epoch(loader) == whole[6:]  # exactly the rest of epoch 3
    s.set_epoch(4)
    ref.set_epoch(4)
    assert _epoch(loader) == _epoch(_loader(ref, False))


def test_persistent_workers_take_up_an_elastic_state_saved_on_other_workers(store):
    kw = dict(global_batch_size=40, seed=3, buffer_chunks=2)
    saving = pipeline.stream(store, **kw)
    saving.set_epoch(2)
    served = _epoch(_loader(saving, False, workers=3))[:7]
    state = saving.state_dict(batches_served=7, num_workers=3)
    s = pipeline.stream(store, **kw)
    loader = _loader(s, True)
    _epoch(loader)
    s.load_state_dict(state)
    posted = s._board.read()  # the state as saved: 7 batches that three workers served
    assert (posted.epoch, posted.served, posted.workers) == (2, 7, 3)
    rest = _epoch(loader)
    assert len(rest) == len(s) - 7
    assert _samples(served + rest) == list(range(1000))


@pytest.mark.parametrize("kw", [KW, dict(global_batch_size=40, seed=3, buffer_chunks=2)])
def test_persistent_workers_resume_in_the_uninterrupted_order(store, kw):
    ref = pipeline.stream(store, **kw)
    ref.set_epoch(1)
    full = _epoch(_loader(ref, False))
    s = pipeline.stream(store, **kw)
    loader = _loader(s, True)
    _epoch(loader)
    # 5 batches on 2 workers: the rest starts with the second worker's turn.
    s.load_state_dict({**s.state_dict(batches_served=len(s)), "epoch": 1, "batches_served": 5, "num_workers": 2})
    assert _epoch(loader) == full[5:]


def test_a_mix_through_persistent_workers(tmp_path):
    from tests.streaming.conftest import make_store

    a, b = make_store(tmp_path / "a.zarr", n=300), make_store(tmp_path / "b.zarr", n=200)

    def mixed():
        return pipeline.mix([a, b], weights=[2, 1], batch_size=25, seed=1)

    ref = mixed()
    want = _epochs(ref, _loader(ref, False), range(3))
    m = mixed()
    got = _epochs(m, _loader(m, True), range(3))
    assert got == want and got[0] != got[1]


def test_the_board_travels_only_to_a_spawned_process(store):
    s = pipeline.stream(store, **KW)
    ds = s.torch()
    board = s._board
    assert isinstance(board, StateBoard) and s.torch().stream._board is board  # one board per stream
    assert pickle.loads(pickle.dumps(s))._board is None  # a copy of its own, following no board
    assert copy.deepcopy(ds).stream._board is None
    with pytest.raises(StreamError, match="only to a process being spawned"):
        pickle.dumps(board)
    assert board.read() is None  # nothing published yet: workers keep the copy they made
    s.load_state_dict({"epoch": 2, "batches_served": 3})
    got = board.read()
    assert (got.epoch, got.served, got.workers, got.version, got.done) == (2, 3, None, s.version, ())
    s.set_epoch(5)
    assert board.read().epoch == 5 and board.read().served == 0 and board.read().seq > got.seq
    np.testing.assert_equal(len(ds), len(s))


def test_persistent_workers_report_each_epoch_they_serve(store):
    """Persistent workers report anew at each epoch they take up: state_dict() without
    a count is refused after each epoch they served (the count is not 0), and answers
    after set_epoch, before the next one."""
    s = pipeline.stream(store, **KW)
    loader = _loader(s, True)
    for epoch in range(2):
        s.set_epoch(epoch)
        assert (s.state_dict()["epoch"], s.state_dict()["batches_served"]) == (epoch, 0)
        assert _samples(_epoch(loader)) == list(range(1000))
        with pytest.raises(StreamError, match=f"2 DataLoader workers serve epoch {epoch} .* batches_served=n"):
            s.state_dict()
        assert s.state_dict(batches_served=len(s))["batches_served"] == len(s)
