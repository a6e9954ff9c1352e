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


def test_out_of_order_index_seeks_through_the_plan(store):
    ds = pipeline.stream(store, batch_size=100, seed=0).keras()
    in_order = [ds[i][1] for i in range(len(ds))]
    ds2 = pipeline.stream(store, batch_size=100, seed=0).keras()
    np.testing.assert_array_equal(ds2[7][1], in_order[7])
    np.testing.assert_array_equal(ds2[8][1], in_order[8])
