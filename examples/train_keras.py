"""Train a small Keras 3 model (torch backend) by streaming a store into model.fit.

    python examples/train_keras.py data/orderbook.zarr --epochs 3

Nothing is loaded whole: ``stream.keras()`` is a keras.utils.PyDataset that reads a few
shuffled chunks at a time, in background threads, while the model trains.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("KERAS_BACKEND", "torch")

import keras  # noqa: E402

import pipeline  # noqa: E402


class Throughput(keras.callbacks.Callback):
    """Prints samples per second for each epoch."""

    def __init__(self, samples_per_epoch: int, val_variance: float | None):
        super().__init__()
        self.samples = samples_per_epoch
        self.val_variance = val_variance

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self.t0 = time.perf_counter()

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        dt = time.perf_counter() - self.t0
        logs = logs or {}
        val = ""
        if "val_loss" in logs and self.val_variance:
            val = f", val_loss {logs['val_loss']:.4f} (R2 {1 - logs['val_loss'] / self.val_variance:+.3f})"
        print(f"keras epoch {epoch + 1}: loss {logs.get('loss', float('nan')):.4f}{val}, "
              f"{self.samples / dt:,.0f} samples/s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("store")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--buffer-chunks", type=int, default=4)
    args = parser.parse_args()

    ds = pipeline.open(args.store)
    train = pipeline.stream(args.store, split="train", batch_size=args.batch_size,
                            buffer_chunks=args.buffer_chunks, seed=0)
    val = None
    if "val" in ds.splits:
        val = pipeline.stream(args.store, split="val", batch_size=args.batch_size, shuffle=False).keras()
    size, width = train.shapes["x"][0]  # works for materialized and virtual stores alike
    n = train.n_samples
    print(f"keras backend: {keras.backend.backend()}; train ({n}, {size}, {width}), "
          f"{len(train)} batches/epoch")

    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input(shape=(size, width)),
        keras.layers.Conv1D(16, 5, activation="relu"),
        keras.layers.GlobalAveragePooling1D(),
        keras.layers.Dense(32, activation="relu"),
        keras.layers.Dense(1),
    ])
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="mse")
    # R2 = 1 - MSE / Var(y): 0 means no better than predicting the mean.
    val_var = float(ds["val"]["y"][:].var()) if "val" in ds.splits else None
    model.fit(train.keras(), validation_data=val, epochs=args.epochs, verbose=0,
              callbacks=[Throughput(n, val_var)])


if __name__ == "__main__":
    main()
