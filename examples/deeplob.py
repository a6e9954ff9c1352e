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
centers each window's prices on their mean (see ``CenterPrices`` in ``deeplob_model.py``). The demo data
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

import pipeline
from pipeline.config import parse_config
from pipeline.demo import DemoSpec, write_demo_data
from pipeline.errors import InvalidValueError, PipelineError
from pipeline.job import run
from pipeline.loaders.lobster import parse_name
from pipeline.storage.inspect import balance_lines, inspect_store, session_lines

# The model (deeplob_model.py, beside this file) is imported once the data is ready:
# Keras and its backend take seconds to load, and a wrong argument (too few days, a
# split the store lacks) should not wait for them.

HORIZONS = (10, 20, 50, 100)
WINDOW = 100
LEVELS = 10
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
    from deeplob_model import fit_and_evaluate  # Keras loads here

    fit_and_evaluate(store, train_split, val_split, test_split, label_names, batch_size=args.batch_size,
                     epochs=args.epochs)


if __name__ == "__main__":
    main()
