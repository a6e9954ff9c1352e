"""Keras 3 (torch backend) trains from stream.keras() without materializing the store."""

from __future__ import annotations

import os

os.environ.setdefault("KERAS_BACKEND", "torch")

import keras  # noqa: E402
import numpy as np  # noqa: E402

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

    reads = []
    original = chunks.ChunkReader.read
    monkeypatch.setattr(chunks.ChunkReader, "read", lambda self, i, out=None: reads.append(i) or original(self, i, out))
    ds = pipeline.stream(store, batch_size=50, seed=0, buffer_chunks=4).keras()
    events = []
    cls = type(ds)
    get, end = cls.__getitem__, cls.on_epoch_end
    monkeypatch.setattr(cls, "__getitem__", lambda self, i: (lambda b: events.append(b[1].copy()) or b)(get(self, i)))
    monkeypatch.setattr(cls, "on_epoch_end", lambda self: (events.append("end"), end(self))[1])
    model = keras.Sequential([keras.Input(shape=(4, 3)), keras.layers.Flatten(), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    model.fit(ds, epochs=1, verbose=0, shuffle=True)
    first_end = next(i for i, e in enumerate(events) if isinstance(e, str))
    epoch = events[first_end + 1 : -1]  # after Keras' peek and its on_epoch_end
    assert len(epoch) == 20 and sorted(np.concatenate(epoch).tolist()) == list(range(1000))
    # 2 arrays x 16 chunks for the epoch, plus what the peek prefetched; seeking per
    # shuffled index would read a whole group per batch (about 10x more).
    assert len(reads) <= 2 * 2 * 16
