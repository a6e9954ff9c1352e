"""The model of ``examples/deeplob.py``: a small DeepLOB-like CNN, trained with Keras 3 on
a store's splits by streaming, and its accuracy per horizon.

A module of its own so that ``deeplob.py`` imports Keras (and its backend: seconds)
only once its data is ready; ``deeplob.py``'s text says what the model keeps of
DeepLOB and what it leaves out.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable

os.environ.setdefault("KERAS_BACKEND", "torch")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import pipeline  # noqa: E402

CLASSES = ("down", "stationary", "up")  # label values 0, 1, 2 of labels: smoothed


class CenterPrices(keras.layers.Layer):
    """Subtracts each window's mean over time from its price columns (sizes unchanged).

    Trailing normalization z-scores a day with the day before's statistics, so the
    prices of a day that drifted away sit far from 0 (many standard deviations on the
    demo data), about the same offset on every price column and event of a window.
    What the labels depend on is the price path inside the window; centering removes
    the offset, which the network would otherwise spend its first epochs learning to
    ignore (without it, two epochs on the demo data learn next to nothing).
    """

    def __init__(self, price_columns: list[int], **kwargs: object):
        super().__init__(**kwargs)
        self.price_columns = list(price_columns)

    def build(self, input_shape: tuple) -> None:
        mask = np.zeros((1, 1, input_shape[-1]), dtype="float32")
        mask[..., self.price_columns] = 1.0
        self.mask = keras.ops.convert_to_tensor(mask)

    def call(self, x: Any) -> Any:  # a backend tensor (torch, jax or tensorflow)
        return x - self.mask * keras.ops.mean(x, axis=1, keepdims=True)

    def get_config(self) -> dict:
        return {**super().get_config(), "price_columns": self.price_columns}


def build_model(width: int, price_columns: list[int], size: int = 100, horizons: int = 4) -> keras.Model:
    """A small DeepLOB-like CNN: (size, width) -> (horizons, 3 class probabilities), or
    3 class probabilities for one horizon stored as ``y`` of shape ``(n,)``.

    ``price_columns`` are the indices of the price columns among the ``width`` book
    columns (ask_price_i, ask_size_i, bid_price_i, bid_size_i for each level i).
    """

    def conv(filters: int, kernel: tuple[int, int], **kwargs: object) -> keras.layers.Layer:
        return keras.layers.Conv2D(filters, kernel, activation=keras.activations.leaky_relu, **kwargs)

    inp = keras.Input(shape=(size, width))
    h = CenterPrices(price_columns)(inp)
    h = keras.layers.Reshape((size, width, 1))(h)
    # The columns come as ask_price, ask_size, bid_price, bid_size per level: the first
    # (1, 2) kernel combines each price with its size, the second each level's ask with
    # its bid, the (1, levels) kernel all levels, leaving one vector per event. Few
    # filters before the levels are collapsed: those activations are the largest.
    h = conv(4, (1, 2), strides=(1, 2))(h)
    h = conv(4, (1, 2), strides=(1, 2))(h)
    h = conv(16, (1, width // 4))(h)
    # Along time; "valid" padding because an even "same" kernel makes torch copy every
    # activation into a padded buffer, and the pooling below does not need 100 steps.
    h = conv(16, (4, 1))(h)
    h = conv(16, (4, 1))(h)
    h = keras.layers.Reshape((-1, 16))(h)
    # DeepLOB ends with an LSTM(64), which runs step by step on a CPU. Instead: the mean
    # over time beside the last step. The smoothed labels compare future prices with
    # the past k prices' mean, so "now against the window's average" carries much of
    # what an LSTM's last state would.
    last = keras.layers.Flatten()(keras.layers.Cropping1D((h.shape[1] - 1, 0))(h))
    h = keras.layers.Concatenate()([keras.layers.GlobalAveragePooling1D()(h), last])
    h = keras.layers.Dense(max(1, horizons) * len(CLASSES))(h)
    if horizons:  # labels (n, horizons): one softmax per horizon; (n,): one
        h = keras.layers.Reshape((horizons, len(CLASSES)))(h)
    return keras.Model(inp, keras.layers.Softmax(axis=-1)(h))


class EpochLog(keras.callbacks.Callback):
    """Prints loss, accuracy and samples per second for each epoch."""

    def __init__(self, samples_per_epoch: int):
        super().__init__()
        self.samples = samples_per_epoch

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self.t0 = time.perf_counter()

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        dt = time.perf_counter() - self.t0
        logs = logs or {}
        val = ""
        if "val_loss" in logs:
            val = f", val_loss {logs['val_loss']:.4f}, val_accuracy {logs.get('val_accuracy', float('nan')):.3f}"
        # The epoch's time includes validation: samples/s counts the training samples.
        print(f"keras epoch {epoch + 1}: loss {logs.get('loss', float('nan')):.4f}, "
              f"accuracy {logs.get('accuracy', float('nan')):.3f}{val}, {self.samples / dt:,.0f} samples/s",
              flush=True)


def evaluate(model: keras.Model, store: str, batch_size: int, split: str, horizons: tuple) -> None:
    """Per-horizon test accuracy beside the majority-class baseline of the test split."""
    test = pipeline.stream(store, split=split, batch_size=batch_size, shuffle=False)
    ys, preds = [], []
    for xb, yb in test:  # the stream's own batches: predictions and labels stay aligned
        preds.append(np.argmax(np.asarray(model.predict_on_batch(xb)), axis=-1))
        ys.append(np.copy(yb))  # a batch is a view of the stream's buffer, reused
    y, p = np.concatenate(ys), np.concatenate(preds)
    y, p = y.reshape(len(y), -1), p.reshape(len(p), -1)  # one horizon: a column of its own
    print(f"{split}: {len(y):,} samples")
    for j, k in enumerate(horizons):
        counts = np.bincount(y[:, j], minlength=len(CLASSES))
        majority = counts.argmax()
        print(f"  k={k:<3} accuracy {np.mean(p[:, j] == y[:, j]):.3f}  "
              f"(majority class '{CLASSES[majority]}': {counts[majority] / len(y):.3f})")


def fit_and_evaluate(store: str, train_split: str, val_split: str | None, test_split: str,
                     label_names: Callable[[dict, tuple], list], *, batch_size: int, epochs: int) -> None:
    """Train the model on ``train_split`` of ``store`` (validated on ``val_split``, if
    any), then print its accuracy per label column on ``test_split``; ``label_names``
    names the columns from the store's ``labels`` attribute and the label shape."""
    ds = pipeline.open(store)
    train = pipeline.stream(store, split=train_split, batch_size=batch_size, seed=0)
    val = pipeline.stream(store, split=val_split, batch_size=batch_size, shuffle=False) if val_split else None
    size, width = train.shapes["x"][0]  # virtual windows: the shape the streamer assembles
    label_shape = train.shapes["y"][0]
    horizons = label_names(ds.attrs.get("labels", {}), label_shape)
    print(f"keras backend: {keras.backend.backend()}; {train_split} ({train.n_samples:,}, {size}, {width}), "
          + (f"{val_split} {val.n_samples:,}, " if val is not None else "") + f"{len(train)} batches/epoch")

    keras.utils.set_random_seed(0)
    names = ds.attrs["features"]  # the stored column names, in the order of x's last axis
    model = build_model(width, [i for i, name in enumerate(names) if "_price_" in name], size,
                        label_shape[0] if label_shape else 0)
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    print(f"model: {model.count_params():,} parameters")
    model.fit(train.keras(), validation_data=val.keras() if val is not None else None, epochs=epochs,
              verbose=0, callbacks=[EpochLog(train.n_samples)])
    evaluate(model, store, batch_size, test_split, tuple(horizons))
