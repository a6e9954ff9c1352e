"""Keras 3 (torch backend) trains from stream.keras() without materializing the store."""

from __future__ import annotations

import os

os.environ.setdefault("KERAS_BACKEND", "torch")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import pipeline  # noqa: E402


def test_model_fit_trains_two_epochs_from_the_stream(store):
    s = pipeline.stream(store, batch_size=64, seed=0)
    ds = s.keras()
    assert not hasattr(ds, "__array__")  # Keras would load the whole set through it
    assert len(ds) == len(s) == 16
    seen = []

    class Record(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            seen.append(batch)

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input(shape=(4, 3)), keras.layers.Flatten(), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    history = model.fit(ds, epochs=2, verbose=0, callbacks=[Record()])
    assert len(history.history["loss"]) == 2
    assert np.isfinite(history.history["loss"]).all()
    assert len(seen) == 2 * len(s)


def test_each_epoch_is_reshuffled_and_complete(store):
    ds = pipeline.stream(store, batch_size=100, seed=0).keras()
    epochs = []
    for _ in range(2):
        ids = np.concatenate([ds[i][1] for i in range(len(ds))])
        ds.on_epoch_end()
        assert sorted(ids.tolist()) == list(range(1000))
        epochs.append(ids)
    assert not np.array_equal(epochs[0], epochs[1])


def test_fit_with_shuffled_indices_reads_chunks_sequentially_and_sees_every_sample(store, monkeypatch):
    """model.fit shuffles PyDataset indices by default; served literally, every batch
    would seek to another group of chunks. Keras also peeks at one batch and calls
    on_epoch_end before the first epoch. The epoch itself must read each chunk once."""
    from pipeline.streaming import chunks

    reads = []  # every chunk read, whole or scattered, fetches the chunk's bytes once
    original = chunks.ChunkReader._fetch
    monkeypatch.setattr(chunks.ChunkReader, "_fetch", lambda self, i: reads.append(i) or original(self, i))
    s = pipeline.stream(store, batch_size=50, seed=0, buffer_chunks=4)
    ds = s.keras()
    events = []
    cls = type(ds)
    get, end = cls.__getitem__, cls.on_epoch_end
    monkeypatch.setattr(cls, "__getitem__", lambda self, i: (lambda b: events.append(b[1].copy()) or b)(get(self, i)))
    monkeypatch.setattr(cls, "on_epoch_end", lambda self: (events.append("end"), end(self))[1])
    model = keras.Sequential([keras.Input(shape=(4, 3)), keras.layers.Flatten(), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    model.fit(ds, epochs=1, verbose=0, shuffle=True)
    first_end = next(i for i, e in enumerate(events) if isinstance(e, str))
    epoch = events[first_end + 1 : -1]  # after Keras' peek and its on_epoch_end
    assert len(epoch) == 20 and sorted(np.concatenate(epoch).tolist()) == list(range(1000))
    # 2 arrays x 16 chunks for the epoch, plus what the peek and the next epoch's
    # read-ahead read; seeking per shuffled index would read a whole group per batch
    # (20 x 8).
    assert 2 * 16 <= len(reads) <= 2 * 16 + _peek_reads(s)


from pipeline.streaming import chunks as _chunks  # noqa: E402
from pipeline.streaming.keras import KerasDataset  # noqa: E402


class Recording(KerasDataset):
    """Records every batch Keras asks for: (stream epoch, index, labels)."""

    def __init__(self, stream, **kwargs):
        super().__init__(stream, **kwargs)
        self.calls = []
        self.ends = 0

    def __getitem__(self, index):
        batch = super().__getitem__(index)
        self.calls.append((self.stream.epoch, index, np.asarray(batch[1]).copy()))
        return batch

    def on_epoch_end(self):
        self.ends += 1
        super().on_epoch_end()


def _tiny_model():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input(shape=(4, 3)), keras.layers.Flatten(), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    return model


def _epochs(ds):
    """Per stream epoch, the labels of its batches keyed by index, for the epochs fit walked whole."""
    by_epoch = {}
    for epoch, index, labels in ds.calls:
        by_epoch.setdefault(epoch, {})[index] = labels
    return {e: b for e, b in by_epoch.items() if len(b) == len(ds)}


def test_pydataset_contract(store):
    s = pipeline.stream(store, batch_size=64, seed=0)
    ds = s.keras()
    assert isinstance(ds, keras.utils.PyDataset)
    assert not hasattr(ds, "__array__") and not hasattr(type(ds), "__array__")
    assert len(ds) == len(s) == ds.num_batches == 16
    with pytest.raises(IndexError):
        ds[16]
    with pytest.raises(IndexError):
        ds[-1]
    # the k-th call of an epoch is the stream's k-th batch, whatever index Keras asks for
    want = [b.copy() for _, b in pipeline.stream(store, batch_size=64, seed=0)]
    got = []
    for index in (15, 3, 3, 0, *range(12)):
        x, y = ds[index]
        assert (x[:, 0, 0] == y).all()
        got.append(y.copy())
    assert len(got) == 16 and all(np.array_equal(a, b) for a, b in zip(got, want))
    assert len(ds[7][1]) == 64  # a 17th call starts a new pass over the same epoch


@pytest.mark.parametrize("shuffle", [False, True])
def test_fit_two_epochs_serves_each_epoch_whole_and_reshuffled(store, shuffle):
    s = pipeline.stream(store, batch_size=100, seed=0)
    ds = Recording(s)
    history = _tiny_model().fit(ds, epochs=2, verbose=0, shuffle=shuffle)
    assert len(history.history["loss"]) == 2 and np.isfinite(history.history["loss"]).all()
    epochs = _epochs(ds)
    assert len(epochs) >= 2
    orders = []
    for e, batches in sorted(epochs.items())[-2:]:
        ids = np.concatenate([batches[i] for i in range(len(ds))])
        assert sorted(ids.tolist()) == list(range(1000))  # every sample once per epoch
        orders.append(ids)
    assert not np.array_equal(orders[0], orders[1])  # on_epoch_end moved the stream to a new order
    # Keras's peek before the first epoch ends nothing: the pass starts again, so the
    # two epochs of fit are the stream's epochs 0 and 1, and it stands at 2 after them.
    assert s.epoch == 2 and ds.ends == 3


def _count_reads(monkeypatch):
    count = [0]  # every chunk read, whole or scattered, fetches the chunk's bytes once
    original = _chunks.ChunkReader._fetch

    def fetch(self, i):
        count[0] += 1
        return original(self, i)

    monkeypatch.setattr(_chunks.ChunkReader, "_fetch", fetch)
    return count


def test_fit_without_keras_shuffle_reads_each_chunk_about_once(store, monkeypatch):
    count = _count_reads(monkeypatch)
    s = pipeline.stream(store, batch_size=50, seed=0, buffer_chunks=4)
    _tiny_model().fit(s.keras(), epochs=1, verbose=0, shuffle=False)
    n_chunks = 2 * len(s.source.lengths)  # x and y
    assert n_chunks <= count[0] <= n_chunks + _peek_reads(s)


def test_fit_with_keras_default_shuffle_reads_each_chunk_about_once(store, monkeypatch):
    count = _count_reads(monkeypatch)
    s = pipeline.stream(store, batch_size=50, seed=0, buffer_chunks=4)
    _tiny_model().fit(s.keras(), epochs=1, verbose=0)
    n_chunks = 2 * len(s.source.lengths)
    assert n_chunks <= count[0] <= n_chunks + _peek_reads(s)


def _peek_reads(s) -> int:
    """Chunk reads (x and y) besides the epoch's own: Keras peeks at one batch before
    the first epoch, and the stream had read the group it came from, the next one and
    ``prefetch`` groups ahead of that; at the epoch's end the next epoch's first group
    is read ahead. Seeking per shuffled index would read a group per batch instead."""
    return 2 * s.buffer_chunks * (3 + s.prefetch)


def test_validation_steps_and_evaluate_steps_serve_the_same_first_batches_every_time(tmp_path):
    """fit(validation_steps=k) and evaluate(steps=k) validate batches 0..k-1 each time,
    as Keras does with any PyDataset: a frozen model's val_loss is one value (it moved
    between epochs when the pass went on, and EarlyStopping acted on it)."""
    n = 1200
    x = np.broadcast_to(np.arange(n, dtype=np.float32)[:, None, None], (n, 4, 3)).copy()  # the sample's id
    y = np.random.default_rng(0).normal(size=n).astype(np.float32)
    store = pipeline.write(tmp_path / "s.zarr", {"train": {"x": x[:600], "y": y[:600]},
                                                 "val": {"x": x[600:], "y": y[600:]}}, chunk_samples=100,
                           progress=False)
    firsts: list[list[float]] = []

    class Recording(KerasDataset):
        def __getitem__(self, index):
            batch = super().__getitem__(index)
            firsts[-1].append(float(np.asarray(batch[0])[0, 0, 0]))
            return batch

    class Validations(keras.callbacks.Callback):
        def on_test_begin(self, logs=None):
            firsts.append([])

    model = _tiny_model()
    model.compile(keras.optimizers.SGD(learning_rate=0.0), "mse")  # frozen
    for k in (1, 2, 3):
        firsts.clear()
        vds = Recording(pipeline.stream(store, split="val", batch_size=100, shuffle=False))
        train = pipeline.stream(store, split="train", batch_size=100, seed=0)
        h = model.fit(train.keras(), validation_data=vds, validation_steps=k, epochs=4, verbose=0,
                      callbacks=[Validations()])
        assert firsts == [[600.0 + 100 * b for b in range(k)]] * 4, (k, firsts)
        assert len(set(h.history["val_loss"])) == 1
    firsts.append([])
    again = [model.evaluate(vds, steps=2, verbose=0) for _ in range(3)]
    assert len(set(again)) == 1 and firsts[-1] == [600.0, 700.0] * 3


def test_a_second_fit_with_short_epochs_repeats_no_batch(store):
    """A fit of a built model calls on_epoch_end before training with nothing taken; its
    epochs of two steps are epochs, not a peek to serve again (Keras epochs 0 and 1 of a
    second fit trained on the same two batches)."""
    firsts: list[int] = []

    class Recording(KerasDataset):
        def __getitem__(self, index):
            batch = super().__getitem__(index)
            firsts.append(int(np.asarray(batch[1])[0]))
            return batch

    ds = Recording(pipeline.stream(store, batch_size=100, seed=3))
    model = _tiny_model()
    model.fit(ds, epochs=1, verbose=0, callbacks=[ds.epoch_callback()])
    firsts.clear()
    model.fit(ds, steps_per_epoch=2, epochs=3, verbose=0)
    assert len(firsts) == 6 and len(set(firsts)) == 6, firsts
