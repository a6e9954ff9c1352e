"""DeepLOB-style training set from LOBSTER files, and a small CNN trained on it with Keras 3.

    python examples/deeplob.py                            # synthetic LOBSTER data in data/lobster
    python examples/deeplob.py --data /path/to/lobster    # real LOBSTER files
    python examples/deeplob.py --store data/fi2010.zarr --train fold0/train --test fold0/test   # a store built
                                                          # already (FI-2010's recipe writes one)

DeepLOB (Zhang, Zohren and Roberts, "DeepLOB: Deep Convolutional Neural Networks for
Limit Order Books", IEEE Transactions on Signal Processing, 2019) predicts the direction
of the mid price from the raw limit order book: each sample is the last 100 events of
10 levels of ask price, ask size, bid price and bid size (100 x 40), and each label is
one of down / stationary / up for the smoothed mid-price change over the next ``k``
events, ``k`` = 10, 20, 50 and 100. Convolutions first combine each level's price with
its size, then the ask side with the bid side, then all levels; convolutions along
time and a recurrent layer follow.

What this reproduces with the pipeline:

- the input: 100 events x 40 raw book columns (``features: book, levels: 10``, in
  DeepLOB's column order), z-scored per day with the previous day's statistics, as
  DeepLOB normalizes with the statistics of the preceding days (``normalize: trailing``;
  the first day of each instrument only serves as history and makes no sample);
- the labels: smoothed mid-price changes at ``k`` = 10, 20, 50, 100 against the mean of
  the past ``k`` mid prices (``labels: smoothed, reference: past_mean``), three classes
  split at ``+-alpha``, stored as ``y`` of shape ``(n, 4)``;
- sessions by file: every LOBSTER file is one instrument-day, and no window, no
  normalization statistic and no label spans two days or two instruments (the
  instrument is the ticker in the file name);
- splits by date: train on the first usable days, validate on the day before the last,
  test on the last day. The windows are virtual (``materialize: false``): the store
  holds each day's 40 columns once plus a window index, instead of 100 copies of every
  event, and the streamer assembles the windows while training.

The model is a deliberately small CNN in DeepLOB's spirit, so that an epoch over the
demo data takes seconds on a laptop CPU: the same (1, 2), (1, 2), (1, 10) convolutions
over the columns and (4, 1) convolutions along time, but few filters, no inception
module, and instead of the LSTM the mean over time beside the last event. It also
centers each window's prices on their mean (see :class:`CenterPrices`). The demo data
is synthetic, with a weak planted signal: do not read the paper's results into its
accuracies.

Real LOBSTER files: point ``--data`` at a folder of LOBSTER pairs
(``TICKER_YYYY-MM-DD_START_END_orderbook_10.csv`` beside its ``..._message_10.csv``),
at least four days. Real books have empty levels (LOBSTER's dummy prices
``+-9999999999``), which the loader reads as NaN; the default ``source.nan: raise``
stops at the first one and names its file, row and column. Choose a policy with
``--nan``: ``fill`` (``source.nan: fill`` with ``source.fill_value: 0``: an empty
level gets price 0 and size 0) or ``drop`` (``source.nan: drop`` drops those events). Pick ``--alpha`` for the
instrument's price scale so the three classes are reasonably balanced: the store's class
balance is printed before training.

A store built already: ``--store`` trains on it as it is, on the splits ``--train``,
``--val`` (optional: ``none``) and ``--test`` name (folds too), with one output head per
label column (FI-2010's recipe stores one horizon, ``label_10``, as 0 down, 1 stationary,
2 up) and the window size the store holds.
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
import time
from typing import Any

os.environ.setdefault("KERAS_BACKEND", "torch")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import pipeline  # noqa: E402
from pipeline.config import parse_config  # noqa: E402
from pipeline.demo import DemoSpec, write_demo_data  # noqa: E402
from pipeline.errors import InvalidValueError, PipelineError  # noqa: E402
from pipeline.job import run  # noqa: E402
from pipeline.loaders.lobster import parse_name  # noqa: E402
from pipeline.storage.inspect import balance_lines, inspect_store, session_lines  # noqa: E402

HORIZONS = (10, 20, 50, 100)
WINDOW = 100
LEVELS = 10
CLASSES = ("down", "stationary", "up")  # label values 0, 1, 2 of labels: smoothed
# On the demo data one alpha cannot balance every horizon (|l| grows with k); this one
# gives roughly a third of stationary labels at k = 20, more at k = 10, fewer at k = 100.
DEMO_ALPHA = 6e-5


def orderbook_files(directory: str) -> list[str]:
    """The LOBSTER orderbook files of ``directory`` (10 levels), sorted."""
    return sorted(glob.glob(os.path.join(directory, f"*_orderbook_{LEVELS}.csv")))


def date_splits(files: list[str], history_days: int) -> dict[str, dict[str, str | None]]:
    """Date splits over the days of ``files``: test the last day, validate the one
    before, train on the rest.

    The first ``history_days`` days only feed the trailing normalization (they make no
    window), so they are left out of the count. ``until`` is exclusive: a split ends at
    the midnight that starts the next split's first day.
    """
    days = sorted({parse_name(f)[1].isoformat() for f in files})
    usable = days[history_days:]
    if len(usable) < 3:
        raise SystemExit(f"deeplob: need at least {history_days + 3} days of files (one of history, then train, "
                         f"val and test), found {len(days)}: {', '.join(days) or 'none'}")
    return {"train": {"until": usable[-2]}, "val": {"until": usable[-1]}, "test": {}}


def build_config(data: str, out: str, splits: dict, alpha: float, nan: str) -> dict:
    """The pipeline config, as the YAML of ``pipeline run`` would hold it."""
    return {
        # LOBSTER files name their ticker: the instrument of each file comes from there.
        # float64 prices: a smoothed change that falls on alpha gets the class exact prices
        # give it (float32 rounding moves such ties either way; docs/pages/recipes/deeplob.md).
        "source": {"paths": os.path.join(data, f"*_orderbook_{LEVELS}.csv"), "format": "lobster",
                   "sessions": "file", "nan": nan, "dtype": "float64",
                   **({"fill_value": 0.0} if nan == "fill" else {})},
        "features": {"steps": [{"name": "book", "levels": LEVELS}],
                     "normalize": {"kind": "trailing", "sessions": 1}},
        "windows": {"size": WINDOW, "stride": 1, "scales": [1], "materialize": False},
        "labels": {"kind": "smoothed", "horizons": list(HORIZONS), "reference": "past_mean", "alpha": alpha},
        "output": {"path": out, "splits": splits, "overwrite": True},
    }


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


def build_model(width: int, price_columns: list[int], size: int = WINDOW, horizons: int = len(HORIZONS)
                ) -> keras.Model:
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


def evaluate(model: keras.Model, store: str, batch_size: int, split: str = "test",
             horizons: tuple = HORIZONS) -> None:
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


def label_names(labels: dict, label_shape: tuple) -> list:
    """One name per stored label column: its horizon, or for column labels (FI-2010's
    ``label_10``, or all five of its columns) the column it was read from."""
    columns = labels.get("column", "label")
    columns = list(columns) if isinstance(columns, (list, tuple)) else [columns]
    if labels.get("horizons"):
        return list(labels["horizons"])
    if labels.get("horizon") is not None and label_shape:
        return [labels["horizon"]]
    width = label_shape[0] if label_shape else 1
    return columns if len(columns) == width else [f"label {j}" for j in range(width)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="data/lobster", help="folder of LOBSTER pairs (demo data is written "
                        "there when it holds no *_orderbook_10.csv)")
    parser.add_argument("--out", default="data/deeplob.zarr", help="the store to write (replaced)")
    parser.add_argument("--days", type=int, default=4, help="days of demo data to generate (at least 4: "
                        "history, train, val, test)")
    parser.add_argument("--rows-per-day", type=int, default=10_000,
                        help="events per instrument and day of demo data")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--alpha", type=float, default=DEMO_ALPHA,
                        help="threshold between stationary and up/down for the smoothed labels")
    parser.add_argument("--nan", choices=("raise", "fill", "drop"), default="raise",
                        help="what to do with empty book levels in real files (fill puts 0)")
    parser.add_argument("--store", default=None, help="train on this store as it is (no build), e.g. the one "
                        "the FI-2010 recipe writes")
    parser.add_argument("--train", default="train", help="with --store: the split (or fold) trained on")
    parser.add_argument("--val", default="val", help="with --store: the validation split, or 'none'")
    parser.add_argument("--test", default="test", help="with --store: the split tested on")
    args = parser.parse_args()

    t_start = time.perf_counter()
    if args.store is not None:
        train_model(args.store, args.train, None if args.val == "none" else args.val, args.test, args)
        print(f"total: {time.perf_counter() - t_start:.1f} s")
        return
    files = orderbook_files(args.data)
    if not files:
        written = write_demo_data(args.data, DemoSpec(formats=("lobster",), days=args.days,
                                                      rows_per_day=args.rows_per_day, instruments=("AAA", "BBB")))
        print(f"demo data: {len(written)} LOBSTER files ({args.days} days x AAA, BBB, "
              f"{args.rows_per_day:,} events each) in {args.data}")
        files = orderbook_files(args.data)
    splits = date_splits(files, history_days=1)
    print("splits: " + ", ".join(f"{k} until {v['until']}" if v else f"{k} the rest" for k, v in splits.items()))

    try:
        config = parse_config(build_config(args.data, args.out, splits, args.alpha, args.nan))
        summary = run(config, log=sys.stderr, progress=sys.stderr.isatty())
    except InvalidValueError as exc:  # NaN in the book: empty levels of real files
        raise SystemExit(f"deeplob: {exc}\n(for empty levels in the files, this script sets source.nan with "
                         "--nan drop or --nan fill)") from None
    except PipelineError as exc:
        raise SystemExit(f"deeplob: {exc}") from None
    print(summary.format())
    attrs = inspect_store(args.out).attrs
    print("\n".join(session_lines(attrs) + balance_lines(attrs)), flush=True)

    train_model(args.out, "train", "val", "test", args)
    print(f"total: {time.perf_counter() - t_start:.1f} s")


def train_model(store: str, train_split: str, val_split: str | None, test_split: str,
                args: argparse.Namespace) -> None:
    """Train the model on a store's ``train_split`` (validated on ``val_split``, if any)
    and print its accuracy per horizon on ``test_split``."""
    ds = pipeline.open(store)
    splits = list(ds.splits) + list(ds.folds)
    missing = [s for s in (train_split, val_split, test_split) if s is not None and s not in splits]
    if missing:
        raise SystemExit(f"deeplob: {store} has no split {missing[0]!r}; its splits and folds: {', '.join(splits)}")
    train = pipeline.stream(store, split=train_split, batch_size=args.batch_size, seed=0)
    val = pipeline.stream(store, split=val_split, batch_size=args.batch_size, shuffle=False) if val_split else None
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
    model.fit(train.keras(), validation_data=val.keras() if val is not None else None, epochs=args.epochs,
              verbose=0, callbacks=[EpochLog(train.n_samples)])
    evaluate(model, store, args.batch_size, test_split, tuple(horizons))


if __name__ == "__main__":
    main()
