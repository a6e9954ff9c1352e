"""A state saved mid-epoch resumes only a stream with the same order: one with another
batch size, buffer, shuffle, drop_last or number of samples is refused, naming the key
and both values, instead of silently skipping and repeating samples."""

from __future__ import annotations

import numpy as np
import pytest

import pipeline
from pipeline.errors import StreamError
from tests.streaming.conftest import in_turns


def _arrays(n: int) -> dict[str, np.ndarray]:
    y = np.arange(n)
    return {"x": np.broadcast_to(y[:, None].astype(np.float32), (n, 2)).copy(), "y": y}


def _state_after(s, k: int) -> dict:
    it = iter(s)
    for _ in range(k):
        next(it)
    state = s.state_dict()
    it.close()
    return state


def _labels(s) -> list[int]:
    return np.concatenate([np.array(y) for _, y in s]).tolist()


BASE = dict(batch_size=7, buffer_chunks=2, seed=1)


@pytest.mark.parametrize("key, value", [("batch_size", 14), ("buffer_chunks", 3), ("shuffle", False),
                                        ("drop_last", True)])
def test_a_state_saved_mid_epoch_is_refused_by_a_stream_with_another_order(store, key, value):
    state = _state_after(pipeline.stream(store, **BASE), 10)
    assert state[key] == BASE.get(key, {"shuffle": True, "drop_last": False}.get(key))
    other = pipeline.stream(store, **{**BASE, key: value})
    saved = state[key]
    with pytest.raises(StreamError, match=f"saved mid-epoch with {key}={saved!r}, this stream has {key}={value!r}"):
        other.load_state_dict(state)
    assert other.state_dict()["batches_served"] == 0  # a refused state changes nothing


def test_a_state_resumes_a_stream_like_the_one_that_saved_it(store):
    whole = _labels(pipeline.stream(store, **BASE))
    s = pipeline.stream(store, **BASE)
    head = np.concatenate([np.array(next(it)[1]) for it in [iter(s)] for _ in range(10)]).tolist()
    state = s.state_dict()
    assert {k: state[k] for k in ("batch_size", "buffer_chunks", "shuffle", "drop_last", "n_samples")} == {
        "batch_size": 7, "buffer_chunks": 2, "shuffle": True, "drop_last": False, "n_samples": 1000}
    resumed = pipeline.stream(store, **BASE)
    resumed.load_state_dict(state)
    assert head + _labels(resumed) == whole


def test_an_epoch_start_and_an_old_state_load_as_before(store):
    # nothing served yet: any stream starts the epoch from its start, whatever its batch
    state = pipeline.stream(store, **BASE).state_dict()
    other = pipeline.stream(store, **{**BASE, "batch_size": 14})
    other.load_state_dict({**state, "epoch": 3})
    assert other.epoch == 3 and len(_labels(other)) == 1000
    # a state saved before the order was recorded holds only epoch and count
    s = pipeline.stream(store, **BASE)
    s.load_state_dict({"epoch": 0, "batches_served": 10, "seed": 1, "rank": 0, "world_size": 1})
    assert len(_labels(s)) == 1000 - 70


def test_a_state_saved_before_the_samples_changed_is_refused():
    saved = _state_after(pipeline.stream(_arrays(1000), **BASE), 10)
    assert saved["n_samples"] == 1000
    grown = pipeline.stream(_arrays(1100), **BASE)
    with pytest.raises(StreamError, match="saved mid-epoch with n_samples=1000, this stream has n_samples=1100"):
        grown.load_state_dict(saved)


def test_the_samples_are_those_of_the_version_the_state_names():
    """A versioned store: the state names the version it was saved on; the count is
    checked on that version (the one the resumed stream switches to), not the newest."""
    old, new = pipeline.stream(_arrays(1000), **BASE), pipeline.stream(_arrays(1100), **BASE)
    for s in (old, new):
        s.source.version = 0 if s is old else 1
        s.source.at_version = lambda v: (old if v == 0 else new).source
    saved = _state_after(old, 10)
    assert saved["version"] == 0 and saved["n_samples"] == 1000
    resumed = pipeline.stream(_arrays(1100), **BASE)
    resumed.source.version, resumed.source.at_version = 1, old.source.at_version
    resumed.load_state_dict(saved)  # switches to version 0, whose 1000 samples match
    assert resumed.version == 0 and len(_labels(resumed)) == 1000 - 70
    stale = pipeline.stream(_arrays(1100), **BASE)
    stale.source.version, stale.source.at_version = 1, old.source.at_version
    with pytest.raises(StreamError, match=r"n_samples=900, this stream has n_samples=1000 at version 0"):
        stale.load_state_dict({**saved, "n_samples": 900})
    assert stale.version == 1  # refused before switching


def test_elastic_states_check_the_global_batch_not_the_ranks_share(store):
    kw = dict(global_batch_size=16, buffer_chunks=2, seed=2)
    saved = _state_after(pipeline.stream(store, rank=1, world_size=2, **kw), 3)
    assert saved["batch_size"] == 8 and saved["n_samples"] == 1000
    on_four = pipeline.stream(store, rank=0, world_size=4, **kw)  # 4 samples per rank and step
    on_four.load_state_dict(saved)
    for key, value in (("shuffle", False), ("drop_last", True)):
        other = pipeline.stream(store, rank=0, world_size=2, **kw, **{key: value})
        with pytest.raises(StreamError, match=f"saved mid-epoch with {key}="):
            other.load_state_dict(saved)
    smaller = pipeline.stream(_arrays(992), rank=0, world_size=2, **kw)
    with pytest.raises(StreamError, match="n_samples=1000, this stream has n_samples=992"):
        smaller.load_state_dict(saved)


def test_a_mix_refuses_other_weights_or_another_source_order():
    kw = dict(batch_size=10, seed=3, epoch_length=30)
    m = pipeline.mix([_arrays(100), _arrays(200)], weights=[1, 1], **kw)
    state = _state_after(m, 4)
    assert state["counts"] == [15, 15] and state["sources"][1]["n_samples"] == 200
    same = pipeline.mix([_arrays(100), _arrays(200)], weights=[1, 1], **kw)
    same.load_state_dict(state)
    with pytest.raises(StreamError, match=r"counts=\[15, 15\], this mix has \[20, 10\]"):
        pipeline.mix([_arrays(100), _arrays(200)], weights=[2, 1], **kw).load_state_dict(state)
    with pytest.raises(StreamError, match="source 1's n_samples=200, this mix's source 1 has n_samples=210"):
        pipeline.mix([_arrays(100), _arrays(210)], weights=[1, 1], **kw).load_state_dict(state)
    other = pipeline.mix([_arrays(100), pipeline.stream(_arrays(200), batch_size=20, seed=3)], weights=[1, 1], **kw)
    with pytest.raises(StreamError, match="source 1's batch_size=10, this mix's source 1 has batch_size=20"):
        other.load_state_dict(state)
    # a source's position runs on across mix epochs: checked at an epoch's start too
    with pytest.raises(StreamError, match="source 1's n_samples=200"):
        pipeline.mix([_arrays(100), _arrays(210)], weights=[1, 1], **kw).load_state_dict(
            {**state, "epoch": 2, "batches_served": 0})


def test_a_mix_state_and_a_stream_state_do_not_load_into_each_other():
    kw = dict(batch_size=10, seed=3, epoch_length=30)
    mix_state = _state_after(pipeline.mix([_arrays(100), _arrays(200)], weights=[1, 1], **kw), 4)
    with pytest.raises(StreamError, match="saved by a pipeline.mix"):
        pipeline.stream(_arrays(100), batch_size=10, seed=3).load_state_dict(mix_state)
    stream_state = _state_after(pipeline.stream(_arrays(100), batch_size=10, seed=3), 4)
    with pytest.raises(StreamError, match="saved by a single stream"):
        pipeline.mix([_arrays(100), _arrays(200)], weights=[1, 1], **kw).load_state_dict(stream_state)


@pytest.mark.parametrize("kw", [dict(batch_size=10), dict(global_batch_size=8)])
def test_a_count_since_the_resume_is_refused_the_epochs_count_taken(kw):
    """batches_served counts the epoch's batches: after resuming a state of 4, a loop that
    took 3 more saves 7; 3 would serve those 3 again."""
    s = pipeline.stream(_arrays(200), seed=1, **kw)
    s.load_state_dict({**s.state_dict(), "batches_served": 4, "num_workers": 2})
    with pytest.raises(StreamError, match="counts this epoch's batches, at least the 4 served before this "
                                          "iteration began; got 3"):
        s.state_dict(batches_served=3, num_workers=2)
    state = s.state_dict(batches_served=7, num_workers=2)
    full = pipeline.stream(_arrays(200), seed=1, **kw)
    ref = [b for _, b in _loader_turns(full, 2)]
    rest = pipeline.stream(_arrays(200), seed=1, **kw)
    rest.load_state_dict(state)
    assert [b for _, b in _loader_turns(rest, 2)] == ref[7:]


def test_a_mix_refuses_a_count_since_the_resume():
    m = pipeline.mix([_arrays(100), _arrays(60)], weights=[1, 1], batch_size=10, seed=1)
    m.load_state_dict({**m.state_dict(), "batches_served": 5})
    with pytest.raises(StreamError, match="^mix: .*at least the 5 served before this iteration began; got 2"):
        m.state_dict(batches_served=2)
    assert m.state_dict(batches_served=9, num_workers=0)["batches_served"] == 9


def _loader_turns(s, workers):
    """(worker, labels) of each batch a DataLoader of ``workers`` workers hands the loop:
    turns from worker 0, each worker iterating its own copy, a finished one skipped."""
    import copy

    its = [copy.deepcopy(s).iter_resumed(k, workers) for k in range(workers)]
    return [(k, np.asarray(got[1]).tolist()) for k, got in in_turns(its)]


def test_a_state_of_another_rank_is_refused_saying_what_to_do():
    """DDP with batch_size=: rank 0's checkpoint loaded on rank 1 is refused, and the
    error says the two ways out: a state per rank, or global_batch_size (whose state
    rank 1 then loads and resumes exactly)."""
    ranks = [pipeline.stream(_arrays(200), batch_size=10, seed=0, rank=r, world_size=2) for r in range(2)]
    state = _state_after(ranks[0], 3)
    with pytest.raises(StreamError, match=r"saved with rank=0, this stream has 1; .*save each rank's own "
                                          r"state_dict\(\) .* or stream with global_batch_size="):
        ranks[1].load_state_dict(state)
    kw = dict(global_batch_size=20, seed=0, world_size=2)
    g0, g1 = (pipeline.stream(_arrays(200), rank=r, **kw) for r in range(2))
    g1.load_state_dict(_state_after(g0, 3))
    full = pipeline.stream(_arrays(200), rank=1, **kw)
    assert _labels(g1) == _labels(full)[30:]  # the rest of rank 1's share, after 3 steps of 10


@pytest.mark.parametrize("kw", [dict(batch_size=10), dict(global_batch_size=8)])
@pytest.mark.parametrize("after_break", [False, True])
def test_a_loop_saves_fewer_batches_than_it_fetched_and_the_resume_serves_the_rest(kw, after_break):
    """A loop that fetched 5 batches and trained on 4 (a step budget, a preemption flag,
    Keras on JAX counting its own steps) saves ``batches_served=4``, as the docs say:
    it was refused ("at least the 5 served before this iteration began"), though the
    iteration began at 0. The resume serves the fifth batch again, then the rest."""
    s = pipeline.stream(_arrays(200), seed=1, **kw)
    whole = _labels(pipeline.stream(_arrays(200), seed=1, **kw))
    it = iter(s)
    seen = [np.array(next(it)[1]).tolist() for _ in range(5)]
    if after_break:
        it.close()
    state = s.state_dict(batches_served=4)
    assert state["batches_served"] == 4
    with pytest.raises(StreamError, match=rf"batches_served must be 0 to {len(s)} .*got {len(s) + 1}"):
        s.state_dict(batches_served=len(s) + 1)  # past the epoch: refused as saved, not at the resume
    rest = pipeline.stream(_arrays(200), seed=1, **kw)
    rest.load_state_dict(state)
    got = [y for batch in seen[:4] for y in batch] + _labels(rest)
    assert got == whole and sorted(got) == list(range(200))


def test_a_mix_saves_fewer_batches_than_its_loop_fetched():
    m = pipeline.mix([_arrays(100), _arrays(60)], weights=[1, 1], batch_size=10, seed=1)
    whole = _labels(pipeline.mix([_arrays(100), _arrays(60)], weights=[1, 1], batch_size=10, seed=1))
    it = iter(m)
    seen = [np.array(next(it)[1]).tolist() for _ in range(3)]
    state = m.state_dict(batches_served=2)
    with pytest.raises(StreamError, match=f"^mix: state_dict: batches_served must be 0 to {m.steps}"):
        m.state_dict(batches_served=m.steps + 1)
    rest = pipeline.mix([_arrays(100), _arrays(60)], weights=[1, 1], batch_size=10, seed=1)
    rest.load_state_dict(state)
    assert [y for batch in seen[:2] for y in batch] + _labels(rest) == whole


def test_a_state_saved_after_a_whole_epoch_warns_that_it_resumes_that_epoch():
    """After a whole pass the count is 0 again: the state resumes the epoch's start, and
    a checkpoint taken at an epoch's end served it again on resume without a word."""
    import warnings

    s = pipeline.stream(_arrays(100), batch_size=10, seed=1)
    _labels(s)
    with pytest.warns(RuntimeWarning, match=r"after epoch 0 was served whole .* call set_epoch\(1\) before saving"):
        state = s.state_dict()
    assert (state["epoch"], state["batches_served"]) == (0, 0)
    s.set_epoch(1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert s.state_dict()["epoch"] == 1  # the next epoch's start: what was meant
        s.state_dict(batches_served=0)  # said by the caller
