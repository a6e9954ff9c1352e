"""build_training_set against a full numpy pipeline: features, trim, windows, labels,
splits, train-only normalization, NaN policies."""

from __future__ import annotations

import warnings

import dask.array as da
import numpy as np
import pytest

from pipeline.errors import InvalidValueError, WindowError
from pipeline.features import FeatureSpec, LabelSpec, build_training_set
from pipeline.features.sessions import SegmentTable
from tests.features.test_sessions import _times
from tests.features.test_steps import COLS, book, reference
from tests.features.test_windows import reference as windows_ref

SPECS = [FeatureSpec.from_mapping(v, "f") for v in
         ["mid_price", {"name": "imbalance", "levels": 3}, {"name": "rolling_std", "window": 6}]]
SIZE, STRIDE, SCALES, H = 6, 2, (1, 3), 4


def numpy_pipeline(x: np.ndarray, fractions: dict, normalize: str = "global", scale: float = 1.0):
    feats = np.stack([reference(x, s) for s in SPECS], axis=1).astype(np.float32)
    L = max(s.lookback_steps for s in SPECS)
    f = feats[L:]
    mid = (x[:, COLS.index("bid_price_1")].astype(np.float64) + x[:, COLS.index("ask_price_1")]) / 2
    logmid = np.log(mid)[L:]
    T = len(f)
    halo = (SIZE - 1) * max(SCALES)
    ends = np.arange(halo, T - H, STRIDE)
    gap = (halo + H + L) // STRIDE
    n = len(ends)
    avail = n - gap * (len(fractions) - 1)
    ranges, start = {}, 0
    for i, (k, fr) in enumerate(fractions.items()):
        cnt = int(np.floor(fr * avail + 1e-9))
        if i == len(fractions) - 1 and sum(fractions.values()) >= 1 - 1e-9:
            cnt = n - start
        ranges[k] = (start, start + cnt)
        start += cnt + gap
    a, b = next(iter(ranges.values()))
    rows = f[ends[a] - halo : ends[b - 1] + 1].astype(np.float64)
    mean, std = rows.mean(axis=0), rows.std(axis=0)
    if normalize == "global":
        f = ((f - mean.astype(np.float32)) / std.astype(np.float32)).astype(np.float32)
    w = windows_ref(f[: T - H], SIZE, STRIDE, SCALES)
    y = (logmid[ends + H] - logmid[ends]) * scale
    return {k: (w[lo:hi], y[lo:hi]) for k, (lo, hi) in ranges.items()}, mean, std, ends, L


@pytest.mark.parametrize("chunk", [17, 500])
def test_global_normalization_windows_labels_and_splits_equal_numpy(chunk):
    x = book(900, seed=2)
    fr = {"train": 0.6, "val": 0.2, "test": 0.2}
    ts = build_training_set(da.from_array(x, chunks=(chunk, -1)), columns=COLS, features=SPECS, size=SIZE,
                            stride=STRIDE, scales=SCALES, label=LabelSpec(horizon=H, scale=1e4), splits=fr)
    ref, mean, std, ends, L = numpy_pipeline(x, fr, scale=1e4)
    assert list(ts.splits) == list(fr)
    for k, (xr, yr) in ref.items():
        np.testing.assert_allclose(ts.splits[k]["x"].compute(), xr, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(ts.splits[k]["y"].compute(), yr, rtol=1e-4, atol=1e-3)
    norm = ts.attrs["normalization"]
    assert norm["fit_on"] == "train"
    np.testing.assert_allclose(norm["mean"], mean, rtol=1e-5)
    np.testing.assert_allclose(norm["std"], std, rtol=1e-4)
    # No raw step shared: the recorded step ranges of consecutive splits do not overlap.
    spans = list(ts.attrs["split_steps"].values())
    for (a0, a1), (b0, b1) in zip(spans, spans[1:]):
        assert a1 < b0 - L


def test_class_labels_bin_the_return_by_thresholds():
    x = book(600, seed=3)
    label = LabelSpec(kind="class", horizon=H, thresholds=(-2.0, 2.0), scale=1e4)
    ts = build_training_set(da.from_array(x, chunks=(100, -1)), columns=COLS, features=SPECS, size=SIZE,
                            stride=STRIDE, scales=SCALES, label=label, normalize="none")
    ref, *_ = numpy_pipeline(x, {"train": 1.0}, normalize="none", scale=1e4)
    y = ts.splits["train"]["y"].compute()
    assert y.dtype == np.int64
    np.testing.assert_array_equal(y, np.digitize(ref["train"][1], [-2.0, 2.0]))


def test_window_normalization_is_per_window_and_feature():
    x = book(400, seed=4)
    ts = build_training_set(da.from_array(x, chunks=(64, -1)), columns=COLS, features=SPECS, size=SIZE,
                            stride=STRIDE, scales=SCALES, label=LabelSpec(horizon=H), normalize="window")
    w = ts.splits["train"]["x"].compute()
    np.testing.assert_allclose(w.mean(axis=1), 0, atol=1e-4)
    assert np.all((np.abs(w.std(axis=1) - 1) < 1e-3) | (w.std(axis=1) < 1e-6))


@pytest.mark.parametrize("policy", ["drop", "fill", "raise"])
def test_nan_policies(policy):
    x = book(500, seed=5)
    x[200, COLS.index("bid_size_2")] = np.nan  # poisons imbalance at step 200
    arr = da.from_array(x, chunks=(50, -1))
    kwargs = dict(columns=COLS, features=SPECS, size=SIZE, stride=STRIDE, scales=SCALES,
                  label=LabelSpec(horizon=H), normalize="none", nan=policy)
    if policy == "raise":
        with pytest.raises(InvalidValueError, match="NaN or inf"):
            build_training_set(arr, **kwargs)
        return
    ts = build_training_set(arr, **kwargs)
    xs = ts.splits["train"]["x"].compute()
    assert np.isfinite(xs).all()
    clean = build_training_set(da.from_array(book(500, seed=5), chunks=(50, -1)), **{**kwargs, "nan": "drop"})
    n_clean = clean.splits["train"]["x"].shape[0]
    # Windows touching step 200 at scale 1 or 3 (after the lookback trim) are the dropped ones.
    L = max(s.lookback_steps for s in SPECS)
    halo = (SIZE - 1) * max(SCALES)
    ends = np.arange(halo, 500 - L - H, STRIDE)
    touched = sum(any((e - s * np.arange(SIZE) == 200 - L).any() for s in SCALES) for e in ends)
    if policy == "drop":
        assert ts.attrs["nan_windows_dropped"]["train"] == touched > 0
        assert len(xs) == n_clean - touched
    else:
        assert len(xs) == n_clean and ts.attrs["nan_windows_dropped"]["train"] == 0


@pytest.mark.parametrize("unit", [8, 40])  # 8 windows span 16 steps, at least the halo
def test_windows_made_in_write_units_equal_the_default_blocks(unit):
    """With ``block_windows`` (the job passes the writer's task size) every split's x and
    y come in blocks of exactly ``unit`` windows from the split's start, so the writer
    rechunks nothing; the values are those of the numpy pipeline either way."""
    x = book(900, seed=5)
    fr = {"train": 0.6, "val": 0.2, "test": 0.2}
    kw = dict(columns=COLS, features=SPECS, size=SIZE, stride=STRIDE, scales=SCALES,
              label=LabelSpec(horizon=H, scale=1e4), splits=fr)
    ts = build_training_set(da.from_array(x, chunks=(97, -1)), block_windows=unit, **kw)
    ref, *_ = numpy_pipeline(x, fr, scale=1e4)
    for k, (xr, yr) in ref.items():
        xs, ys = ts.splits[k]["x"], ts.splits[k]["y"]
        full, rest = divmod(len(xr), unit)
        # Every unit boundary of the split is a block boundary (a short last unit may be
        # merged into the one before it, when it spans fewer steps than the halo).
        assert xs.chunks[0][:full - 1] == (unit,) * (full - 1) and ys.chunks[0] == xs.chunks[0]
        assert set(np.cumsum(xs.chunks[0]).tolist()) <= set(range(unit, len(xr), unit)) | {len(xr)}
        np.testing.assert_allclose(xs.compute(), xr, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(ys.compute(), yr, rtol=1e-4, atol=1e-3)
    sized = build_training_set(da.from_array(x, chunks=(97, -1)), block_windows=lambda nbytes: nbytes // 100, **kw)
    window_bytes = SIZE * len(SPECS) * len(SCALES) * 4
    assert sized.splits["train"]["x"].chunks[0][0] == window_bytes // 100


def test_arrays_every_pass_reads_are_held_on_a_cluster_only_when_they_fit(monkeypatch):
    import pipeline.features.build as build
    from distributed import Client

    from tests.conftest import in_process_cluster

    a = da.arange(1000, chunks=100, dtype=np.float32)
    assert build.hold(a, None) == (a, None)  # no client: computed again in each pass
    x = book(900, seed=2)
    fr = {"train": 0.6, "val": 0.2, "test": 0.2}
    kwargs = dict(columns=COLS, features=SPECS, size=SIZE, stride=STRIDE, scales=SCALES,
                  label=LabelSpec(horizon=H, scale=1e4), splits=fr)
    again = build_training_set(da.from_array(x, chunks=(97, -1)), **kwargs)
    # In-process: the worker counts this whole process against its memory limit, so a
    # small limit would pause it.
    with in_process_cluster(n_workers=1, threads_per_worker=1, memory_limit="12GiB",
                            dashboard_address=None) as local, Client(local):
        held, none = build.hold(a, None)
        assert none is None and held is not a
        assert len(held.__dask_graph__()) == held.npartitions  # one key per chunk: its result, kept
        np.testing.assert_array_equal(held.compute(), a.compute())
        monkeypatch.setattr(build, "HOLD_FRACTION", 1e-9)  # too large for the budget: left as given
        assert build.hold(a)[0] is a
        monkeypatch.undo()
        ts = build_training_set(da.from_array(x, chunks=(97, -1)), **kwargs)
        for k in fr:
            for name in ("x", "y"):
                np.testing.assert_array_equal(ts.splits[k][name].compute(), again.splits[k][name].compute())


@pytest.mark.parametrize("materialize", [True, False])
def test_float64_prices_are_normalized_from_float64_features(materialize):
    """source.dtype: float64 at a 97,000 level with a std of a few ticks: features rounded
    to float32 before the z-score (0.0078 apart there) moved windows by a tenth of a
    std or more. Windows equal numpy's z-score in float64 of the same statistics."""
    rng = np.random.default_rng(8)
    n = 400
    x = book(n, seed=3).astype(np.float64)
    bid = 97_123.45 + np.round(np.cumsum(rng.integers(-1, 2, n)) * 0.01, 2)
    x[:, COLS.index("bid_price_1")], x[:, COLS.index("ask_price_1")] = bid, bid + 0.01 * rng.integers(1, 3, n)
    specs = [FeatureSpec.from_mapping(v, "f") for v in ("mid_price", "spread")]
    ts = build_training_set(da.from_array(x, chunks=(64, -1)), columns=COLS, features=specs, size=4,
                            label=LabelSpec(horizon=2), splits={"train": 1.0}, materialize=materialize)
    assert all(a.dtype == np.float32 for a in (*ts.splits["train"].values(), *ts.shared.values())
               if a.dtype.kind == "f")
    norm = ts.attrs["normalization"]
    f = np.stack([reference(x, s) for s in specs], axis=1)  # float64
    z = ((f - np.asarray(norm["mean"])) / np.asarray(norm["std"])).astype(np.float32)
    want = windows_ref(z[: n - 2], 4, 1, (1,))
    if materialize:
        got = ts.splits["train"]["x"].compute()
    else:
        ends = ts.splits["train"]["ends"].compute()
        got = np.stack([ts.shared["features"].compute()[e - 3 : e + 1] for e in ends])
    np.testing.assert_allclose(got, want[: len(got)], rtol=0, atol=2e-6)


# -- labels that read an empty price (source.nan: fill) -----------------------------------

ASK_DUMMY, BID_DUMMY = 9_999_999_999, -9_999_999_999


def write_lobster_day(d, n: int, seed: int, empty_ask=(), empty_bid=()):
    """A one-level LOBSTER pair on a cent grid around $200, with the dummy price (and size
    0) on the ask side at rows ``empty_ask`` and on the bid side at ``empty_bid``, as
    LOBSTER writes a one-sided book. Returns the orderbook file."""
    rng = np.random.default_rng(seed)
    bid = 2_000_000 + np.cumsum(rng.integers(-1, 2, n)) * 100
    ask = bid + rng.integers(1, 4, n) * 100
    ask_size, bid_size = rng.integers(1, 500, (2, n)) * 100
    for rows, price, size, dummy in ((empty_ask, ask, ask_size, ASK_DUMMY), (empty_bid, bid, bid_size, BID_DUMMY)):
        price[list(rows)], size[list(rows)] = dummy, 0
    stem = d / "AAA_2012-06-21_34200000_57600000"
    (d / f"{stem.name}_message_1.csv").write_text(
        "".join(f"{34_200 + i / 1000:.9f},1,{10**7 + i},1,2000000,1\n" for i in range(n)))
    path = d / f"{stem.name}_orderbook_1.csv"
    path.write_text("".join(",".join(map(str, r)) + "\n" for r in zip(ask, ask_size, bid, bid_size)))
    return path


def pandas_windows(path, label: LabelSpec, size: int):
    """An independent build with pandas: mid_price and spread features and labels from
    the prices with NaN where empty (source.nan: fill wrote 0 there, which no feature or
    label takes for a price), and only the windows whose every label is finite and
    whose features are (features.nan: drop). Returns the windows, the labels (scaled,
    float32), how many windows each side's emptiness left out for their label, and how
    many with a finite label were left out for a NaN feature."""
    import pandas as pd

    book = pd.read_csv(path, header=None).to_numpy(np.float64)
    empty_ask, empty_bid = book[:, 0] == ASK_DUMMY, book[:, 2] == BID_DUMMY
    ask = pd.Series(np.where(empty_ask, np.nan, book[:, 0] / 10_000))
    bid = pd.Series(np.where(empty_bid, np.nan, book[:, 2] / 10_000))
    filled_ask, filled_bid = ask.fillna(0.0), bid.fillna(0.0)
    feats = np.stack([(bid + ask) / 2, ask - bid], axis=1).astype(np.float32)

    def values(a: pd.Series, b: pd.Series) -> np.ndarray:
        mid = (b + a) / 2
        cols = []
        for k in label.horizon_list:
            if label.kind == "return":
                cols.append(np.log(mid).shift(-k) - np.log(mid))
            else:  # smoothed, past_mean
                past = mid.rolling(k).mean()
                cols.append((past.shift(-k) - past) / past)
        return np.stack(cols, axis=1) * label.scale

    y = values(ask, bid)
    n = len(book)
    back, fwd = max(size - 1, label.reach[0]), label.reach[1]
    ends = np.arange(back, n - fwd)
    labelled = ends[np.isfinite(y[ends]).all(axis=1)]
    finite = np.array([np.isfinite(feats[e - size + 1 : e + 1]).all() for e in labelled], dtype=bool)
    kept = labelled[finite]
    x = np.stack([feats[e - size + 1 : e + 1] for e in kept])
    # Which side's emptiness each left-out window's label reads (the other side priced).
    by_ask = ~np.isfinite(values(ask, filled_bid)[ends]).all(axis=1)
    by_bid = ~np.isfinite(values(filled_ask, bid)[ends]).all(axis=1)
    return (x, y[kept].astype(np.float32).reshape(len(kept), -1), int(by_ask.sum()), int(by_bid.sum()),
            int((~finite).sum()))


@pytest.mark.parametrize("label", [LabelSpec(kind="return", horizons=(1, 3), scale=1e4),
                                   LabelSpec(kind="smoothed", horizons=(2, 4), reference="past_mean")])
def test_windows_whose_label_reads_an_empty_price_are_left_out(tmp_path, label):
    """A one-sided book under source.nan: fill (ask price 0 at three rows, bid price 0 at
    one): no label or price feature is computed from the fill. The build gives exactly
    the windows and labels of a pandas computation that drops the windows whose label
    horizon touches an empty level, and those whose mid_price or spread holds one, and
    warns how many it left out and which price was empty."""
    from pipeline.loaders.segments import open_segmented

    path = write_lobster_day(tmp_path, 160, seed=4, empty_ask=(40, 41, 42), empty_bid=(100,))
    src = open_segmented(str(tmp_path / "*_orderbook_1.csv"), format="lobster", nan="fill", dtype="float64")
    specs = [FeatureSpec.from_mapping(v, "f") for v in ("mid_price", "spread")]
    kw = dict(columns=src.columns, features=specs, size=5, label=label, normalize="none",
              segments=src.segments, timestamps=src.timestamps.rechunk(13))
    with pytest.warns(UserWarning) as caught:
        ts = build_training_set(src.array.rechunk((13, -1)), source_fill=0.0, **kw)
    xr, yr, by_ask, by_bid, nan_windows = pandas_windows(path, label, 5)
    np.testing.assert_array_equal(ts.splits["train"]["x"].compute(), xr)
    y = ts.splits["train"]["y"].compute()
    if label.kind == "return":
        np.testing.assert_array_equal(y, yr)
    else:  # pandas' rolling mean sums in another order: the last bit may differ, and an
        # unchanged mean is exactly 0 in the store (labels.on_boundaries), +-1e-16 in pandas.
        np.testing.assert_allclose(y, yr, rtol=1e-6, atol=1e-14)
    assert np.abs(y).max() < 0.01 * label.scale  # no 69% "move" to a price of 0
    left_out = ts.attrs["window_counts"]["train"] + nan_windows
    assert [str(w.message) for w in caught if str(w.message).startswith("labels:")] == [
        f"labels: {len(np.arange(4, 160 - label.reach[1])) - left_out} windows left out: their label reads "
        f"bid_price_1 ({by_bid} windows) or ask_price_1 ({by_ask} windows) where it was empty (source.nan: fill); "
        "their labels would be computed from the fill value, not a price"]
    # Left out for the label, not counted as NaN; those left out for a feature are.
    assert ts.attrs["nan_windows_dropped"]["train"] == nan_windows > 0
    # The windows that remain are those of a build that does not know the fill, bit for bit.
    blind = build_training_set(src.array, **kw)
    t_all, t_kept = blind.splits["train"]["t"].compute(), ts.splits["train"]["t"].compute()
    same = np.isin(t_all, t_kept)
    assert same.sum() == len(t_kept)
    np.testing.assert_array_equal(blind.splits["train"]["x"].compute()[same], ts.splits["train"]["x"].compute())
    np.testing.assert_array_equal(blind.splits["train"]["y"].compute()[same], y)


def test_class_labels_from_float32_prices_warn_where_exact_prices_could_change_them(tmp_path):
    """source.dtype float32 (the default): a $200 book on a cent grid keeps its ticks, but
    smoothed labels that tie with alpha, as tick moves do, land in either class with the
    prices' float32 rounding. The build warns, counting at least every label whose class
    differs from pandas' float64 computation; with float64 prices the labels equal it and
    nothing warns."""
    import re

    import pandas as pd

    from pipeline.errors import PriceResolutionWarning
    from pipeline.loaders.segments import open_segmented

    path = write_lobster_day(tmp_path, 1500, seed=1)
    book = pd.read_csv(path, header=None).to_numpy(np.float64)
    mid = pd.Series((book[:, 2] / 10_000 + book[:, 0] / 10_000) / 2)
    change = ((mid.shift(-1) - mid) / mid).to_numpy()[:-1]  # FI-2010's label at k = 1
    moves, counts = np.unique(change[change > 0], return_counts=True)
    alpha = float(moves[counts.argmax()])  # the commonest one-tick move: many labels tie with alpha
    label = LabelSpec(kind="smoothed", horizon=1, alpha=alpha)
    exact = np.where(change > alpha, 2, np.where(change < -alpha, 0, 1))
    specs = [FeatureSpec.from_mapping("spread", "f")]
    ys = {}
    for dtype in ("float32", "float64"):
        src = open_segmented(str(tmp_path / "*_orderbook_1.csv"), format="lobster", dtype=dtype)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            ts = build_training_set(src.array, columns=src.columns, features=specs, size=1, label=label,
                                    normalize="none", segments=src.segments, timestamps=src.timestamps)
        ys[dtype] = ts.splits["train"]["y"].compute()
        found = [str(w.message) for w in caught if issubclass(w.category, PriceResolutionWarning)]
        if dtype == "float64":
            assert not found
            np.testing.assert_array_equal(ys[dtype], exact)
            continue
        flipped = int((ys[dtype] != exact).sum())
        assert flipped > 0  # the problem is real: float32 prices change some classes
        assert len(found) == 1 and f"alpha {alpha:g}" in found[0] and "source.dtype: float64" in found[0]
        near, total = (int(v.replace(",", "")) for v in re.match(r"labels: ([\d,]+) of ([\d,]+) ", found[0]).groups())
        assert flipped <= near < total == len(exact)


@pytest.mark.parametrize("split_rows", [(300, 420), (250, 250, 200)])
def test_an_array_joined_from_files_is_built_one_file_at_a_time(tmp_path, split_rows):
    """An array ``pipeline.load`` joined from several ``.npy`` files: no window, feature
    lookback or label spans two files, by default (each file's windows and labels are
    those of the numpy pipeline on that file alone); ``segments=SegmentTable.single``
    makes one series across them, as before."""
    import pipeline
    from pipeline.features.sessions import SegmentTable

    x = book(sum(split_rows), seed=5)
    paths, start = [], 0
    for i, n in enumerate(split_rows):
        paths.append(str(tmp_path / f"rec{i}.npy"))
        np.save(paths[-1], x[start : start + n])
        start += n
    arr = pipeline.load(paths, combine="concat")
    kwargs = dict(columns=COLS, features=SPECS, size=SIZE, stride=STRIDE, scales=SCALES,
                  label=LabelSpec(horizon=H), normalize="none")
    ts = build_training_set(arr, **kwargs)
    xs, ys, start = [], [], 0
    for n in split_rows:
        (xr, yr), = numpy_pipeline(x[start : start + n], {"train": 1.0}, normalize="none")[0].values()
        xs.append(xr)
        ys.append(yr)
        start += n
    np.testing.assert_allclose(ts.splits["train"]["x"].compute(), np.concatenate(xs), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ts.splits["train"]["y"].compute(), np.concatenate(ys), rtol=1e-5, atol=1e-6)
    one = build_training_set(arr, segments=SegmentTable.single(int(arr.shape[0])), **kwargs)
    (xr, _), = numpy_pipeline(x, {"train": 1.0}, normalize="none")[0].values()
    np.testing.assert_allclose(one.splits["train"]["x"].compute(), xr, rtol=1e-5, atol=1e-5)


# -- global statistics: the split named train, per instrument, any chunking ------------------------

def _fitted_rows(ts, split: str, halo: int) -> np.ndarray:
    """The source rows the windows of a virtual split hold: ``[end - halo, end]`` each."""
    used = np.zeros(ts.shared["features"].shape[0], bool)
    for e in ts.splits[split]["ends"].compute():
        used[e - halo : e + 1] = True
    return used


@pytest.mark.parametrize("splits, fit_on", [({"val": 0.3, "train": 0.5, "test": 0.2}, "train"),
                                            ({"early": 0.6, "late": 0.4}, "early")])
@pytest.mark.filterwarnings("ignore:fraction splits in time order as listed")  # listed out of order on purpose
def test_global_statistics_are_fitted_on_the_split_named_train_wherever_it_is_listed(splits, fit_on):
    """A held-out period listed first (val, then train, then test) had its statistics
    applied to train. They come from the split named train, else the first listed."""
    x = book(900, seed=2)
    x[:300, :] *= 3  # the first period at another level: fitted on it, train's mean is off
    ts = build_training_set(da.from_array(x, chunks=(100, -1)), columns=COLS, features=SPECS, size=SIZE,
                            stride=STRIDE, scales=SCALES, label=LabelSpec(horizon=H), splits=splits,
                            materialize=False)
    norm = ts.attrs["normalization"]
    assert norm["fit_on"] == fit_on
    feats = np.stack([reference(x, s) for s in SPECS], axis=1).astype(np.float32).astype(np.float64)
    rows = feats[_fitted_rows(ts, fit_on, (SIZE - 1) * max(SCALES))]
    np.testing.assert_allclose(norm["mean"], rows.mean(axis=0), rtol=1e-6)
    np.testing.assert_allclose(norm["std"], rows.std(axis=0), rtol=1e-5)


def test_global_statistics_fitted_on_a_train_split_without_windows_are_refused_naming_it():
    x = book(600, seed=4)
    t = _times([300, 300], [0, 1])
    kw = dict(columns=COLS, features=SPECS, size=4, label=LabelSpec(horizon=2), timestamps=da.from_array(t, chunks=100),
              segments=SegmentTable.from_lengths([300, 300]))
    # train after the data: a future split, empty; the statistics would have nothing to fit.
    with pytest.raises(WindowError, match="normalize: global fits its statistics on split 'train'"):
        build_training_set(da.from_array(x, chunks=(100, -1)), **kw,
                           splits={"val": {"until": "2026-02-01"}, "train": {"until": "2026-03-01"}, "test": {}})


def _two_instruments():
    """BTC near 42,000 and ETH near 2,300 on the same two days, in float64."""
    lengths = [300, 300, 300, 300]
    x = np.concatenate([book(600, seed=5), book(600, seed=6)]).astype(np.float64)
    prices = [i for i, c in enumerate(COLS) if "price" in c]
    x[:600, prices] *= 42_000 / x[:600, prices].mean()
    x[600:, prices] *= 2_300 / x[600:, prices].mean()
    table = SegmentTable.from_lengths(lengths, instrument=[0, 0, 1, 1], session=[0, 1, 0, 1],
                                      instruments=("BTC", "ETH"))
    return x, table, _times(lengths, [0, 1, 0, 1])


def test_per_instrument_global_statistics_equal_pandas_groupby_over_the_train_rows():
    """One pooled mean and std over a 42,000 and a 2,300 instrument made the z-scored
    prices two constants; per instrument, each is scaled by its own train rows."""
    import pandas as pd

    x, table, t = _two_instruments()
    specs = [FeatureSpec.from_mapping(v, "f") for v in ("mid_price", "spread")]
    ts = build_training_set(da.from_array(x, chunks=(128, -1)), columns=COLS, features=specs, size=4,
                            label=LabelSpec(horizon=2), splits={"train": {"until": "2026-01-06"}, "test": {}},
                            normalize={"kind": "global", "per": "instrument"}, segments=table,
                            timestamps=da.from_array(t, chunks=100), materialize=False)
    norm = ts.attrs["normalization"]
    assert (norm["kind"], norm["per"], norm["instruments"], norm["fit_on"]) == ("global", "instrument",
                                                                              ["BTC", "ETH"], "train")
    feats = pd.DataFrame(np.stack([reference(x, s) for s in specs], axis=1), columns=["mid", "spread"])
    feats["instrument"] = np.repeat(np.array(table.instruments)[table.instrument], 300)
    fitted = feats[_fitted_rows(ts, "train", 3)].groupby("instrument")
    np.testing.assert_allclose(norm["mean"], fitted.mean().loc[["BTC", "ETH"]].to_numpy(), rtol=1e-12)
    np.testing.assert_allclose(norm["std"], fitted.std(ddof=0).loc[["BTC", "ETH"]].to_numpy(), rtol=1e-9)
    # Every row, train or test, scaled by its own instrument's statistics.
    want = ((feats[["mid", "spread"]] - fitted.mean().loc[feats["instrument"]].to_numpy())
            / fitted.std(ddof=0).loc[feats["instrument"]].to_numpy()).to_numpy(np.float32)
    got = ts.shared["features"].compute()
    used = _fitted_rows(ts, "train", 3) | _fitted_rows(ts, "test", 3)
    np.testing.assert_allclose(got[used], want[used], rtol=1e-5, atol=1e-5)


def test_per_instrument_statistics_refuse_an_instrument_without_train_windows():
    x, _, _ = _two_instruments()
    table = SegmentTable.from_lengths([300] * 4, instrument=[0, 0, 1, 1], session=[0, 1, 0, 1],
                                      instruments=("BTC", "ETH"))
    t = _times([300] * 4, [0, 1, 1, 2])  # ETH starts on the day train ends
    with pytest.raises(WindowError, match="instrument 'ETH' has windows but none in split 'train'"):
        build_training_set(da.from_array(x, chunks=(128, -1)), columns=COLS, features=SPECS, size=4,
                           label=LabelSpec(horizon=2), splits={"train": {"until": "2026-01-06"}, "test": {}},
                           normalize={"kind": "global", "per": "instrument"}, segments=table,
                           timestamps=da.from_array(t, chunks=100))


@pytest.mark.parametrize("normalize", ["global", {"kind": "trailing", "sessions": 1}])
def test_statistics_and_stored_windows_are_the_same_bits_for_any_chunking(normalize):
    """Same float64 data, source chunks of 37, 128 and all rows: the same statistics
    and the same windows, bit for bit (the fit's cells, not the chunks, group the sums)."""
    x, table, t = _two_instruments()
    specs = [FeatureSpec.from_mapping(v, "f") for v in ("mid_price", "spread", {"name": "imbalance", "levels": 3})]
    built = [build_training_set(da.from_array(x, chunks=(chunk, -1)), columns=COLS, features=specs, size=4,
                                stride=2, label=LabelSpec(horizon=2), splits={"train": 0.7, "test": 0.3},
                                normalize=normalize, segments=table, timestamps=da.from_array(t, chunks=chunk))
             for chunk in (37, 128, x.shape[0])]
    for ts in built[1:]:
        assert ts.attrs["normalization"] == built[0].attrs["normalization"]
        for split in ("train", "test"):
            np.testing.assert_array_equal(ts.splits[split]["x"].compute().view(np.uint32),
                                          built[0].splits[split]["x"].compute().view(np.uint32))


def test_fraction_splits_of_several_instruments_without_times_point_at_whole_session_folds():
    """Optiver's books have no timestamps: instruments cannot be cut at one instant, and
    the refusal says what splits such data instead."""
    x, table, _ = _two_instruments()
    with pytest.raises(WindowError, match=r"need timestamps; set source.timestamp .*split by whole sessions: "
                                          r"splits: \{train: 1.0\} with output.folds$"):
        build_training_set(da.from_array(x, chunks=(128, -1)), columns=COLS, features=SPECS, size=4,
                           label=LabelSpec(horizon=2), splits={"train": 0.7, "test": 0.3}, segments=table)


# -- trailing normalization over a short session; empty date splits of several horizons ------------

def write_day(d, day: str, n: int, seed: int) -> None:
    """A one-level order book of ``n`` snapshots 200 ms apart on ``day``, as Parquet."""
    import pandas as pd

    rng = np.random.default_rng(seed)
    t = np.datetime64(f"{day}T09:30:00", "ns") + (np.arange(n) * 200_000_000).astype("timedelta64[ns]")
    mid = 100.0 + 0.01 * np.cumsum(rng.choice([-1, 0, 1], n))
    pd.DataFrame({"timestamp": t, "bid_price_1": np.round(mid - 0.01, 2), "ask_price_1": np.round(mid + 0.01, 2),
                  "bid_size_1": rng.integers(1, 500, n), "ask_size_1": rng.integers(1, 500, n)}
                 ).to_parquet(d / f"{day}.parquet", index=False)


def pandas_features(path) -> np.ndarray:
    """mid_price and log_return of one day's file, as float32 (row 0's return is NaN)."""
    import pandas as pd

    book = pd.read_parquet(path)
    mid = (book["bid_price_1"].astype(np.float32).astype(np.float64)
           + book["ask_price_1"].astype(np.float32).astype(np.float64)) / 2
    return np.stack([mid, np.log(mid).diff()], axis=1).astype(np.float32)


def _open_days(d):
    from pipeline.loaders.segments import open_segmented

    return open_segmented(str(d / "*.parquet"), timestamp="timestamp", sessions="file")


@pytest.mark.parametrize("short", [1, 2])
def test_a_session_after_one_too_short_to_fit_trailing_statistics_is_left_out_not_stored_unscaled(tmp_path, short):
    """Trailing normalization, sessions: 1, a day of 1 or 2 rows (0 or 1 row after the
    log return's lookback) before a full day: that day's statistics were 0 and 1 (or a
    std of 0 taken as 1) and its windows were stored at raw scale beside z-scored ones,
    with no word. It makes no window, as the first session, and the build says so; the
    day after it is z-scored with pandas' statistics of the full day before it."""
    days = {"2026-01-05": 200, "2026-01-06": short, "2026-01-07": 150, "2026-01-08": 120}
    for k, (day, n) in enumerate(days.items()):
        write_day(tmp_path, day, n, seed=k)
    src = _open_days(tmp_path)
    specs = [FeatureSpec.from_mapping(v, "f") for v in ("mid_price", "log_return")]
    with pytest.warns(UserWarning) as caught:
        ts = build_training_set(src.array, columns=src.columns, features=specs, size=4, label=LabelSpec(horizon=1),
                                normalize={"kind": "trailing", "sessions": 1}, segments=src.segments,
                                timestamps=src.timestamps)
    said = [str(w.message) for w in caught if "normalize: trailing" in str(w.message)]
    assert len(said) == 1 and "1 session(s) make no window (145 windows left out)" in said[0], said
    assert "session 2 (" in said[0] and "2026-01-07" in said[0] and "fewer than 2 rows" in said[0]
    sessions = ts.attrs["sessions"]
    assert [s["windows"] for s in sessions] == [0, 0, 0, 120 - 4 - 1]  # the left-out day counted as the first
    # Every stored window is day 4's, z-scored with day 3's rows after the lookback.
    history = pandas_features(tmp_path / "2026-01-07.parquet")[1:].astype(np.float64)
    mean, std = history.mean(axis=0), history.std(axis=0)
    norm = ts.attrs["normalization"]
    np.testing.assert_allclose(norm["mean"][3], mean, rtol=1e-12)
    np.testing.assert_allclose(norm["std"][3], std, rtol=1e-9)
    assert norm["mean"][2] == [0.0, 0.0] and norm["std"][2] == [1.0, 1.0]  # makes no window: not fitted
    # Float32 features are scaled in float32 with the statistics rounded to it.
    f = (pandas_features(tmp_path / "2026-01-08.parquet") - np.float32(mean)) / np.float32(std)
    want = np.stack([f[e - 3 : e + 1] for e in range(4, 120 - 1)])
    x = ts.splits["train"]["x"].compute()
    np.testing.assert_allclose(x, want, rtol=1e-5, atol=1e-5)
    assert np.abs(x.std(axis=(0, 1)) - 1).max() < 0.5  # z-scored, not raw (a log return's std is ~1e-4)


def test_a_build_whose_only_windows_follow_a_too_short_session_is_refused_naming_the_reason(tmp_path):
    """The fuzz's case: days of 300, 3 and 300 rows, rolling_std over 4 returns (a
    lookback of 4): the 3-row day holds no usable row, so the last day has nothing to be
    scaled by and no session is left to make a window."""
    for k, (day, n) in enumerate({"2026-01-05": 300, "2026-01-06": 3, "2026-01-07": 300}.items()):
        write_day(tmp_path, day, n, seed=k)
    src = _open_days(tmp_path)
    with pytest.warns(UserWarning, match=r"1 session\(s\) make no window \(292 windows left out\)"), \
            pytest.raises(WindowError, match="and those whose sessions before them hold fewer than 2 rows"):
        build_training_set(src.array, columns=src.columns, features=[FeatureSpec.from_mapping(
                           {"name": "rolling_std", "window": 4}, "f")], size=4, label=LabelSpec(horizon=1),
                           normalize={"kind": "trailing", "sessions": 1}, segments=src.segments,
                           timestamps=src.timestamps)


@pytest.mark.filterwarnings("ignore::pipeline.errors.PriceResolutionWarning")  # float32 prices, as the README's
def test_the_readme_deeplob_config_builds_while_its_test_split_is_still_empty(tmp_path):
    """The README's "Real order-book data" config (smoothed labels at four horizons with
    alpha, trailing normalization, virtual windows, date splits train/val/test) on days
    up to 2026-01-08: test is empty until the next day is appended. Its class balance
    crashed (a reshape of (0, 4)); it is zeros per horizon, and the other splits' equal
    numpy's counts of their stored labels."""
    for k, day in enumerate(["2026-01-06", "2026-01-07", "2026-01-08"]):
        write_day(tmp_path, day, 400, seed=k)
    src = _open_days(tmp_path)
    label = LabelSpec.from_mapping({"kind": "smoothed", "horizons": [10, 20, 50, 100], "reference": "past_mean",
                                    "alpha": 0.00006}, "labels")
    specs = [FeatureSpec.from_mapping({"name": "book", "levels": 1}, "f")]
    ts = build_training_set(src.array, columns=src.columns, features=specs, size=20, label=label,
                            normalize={"kind": "trailing", "sessions": 1}, segments=src.segments,
                            timestamps=src.timestamps, materialize=False,
                            splits={"train": {"until": "2026-01-08"}, "val": {"until": "2026-01-09"}, "test": {}})
    counts = ts.attrs["window_counts"]
    assert counts["test"] == 0 and counts["train"] == counts["val"] == 400 - 99 - 100
    balance = ts.attrs["class_balance"]
    assert balance["test"] == [[0, 0, 0]] * 4
    assert ts.splits["test"]["ends"].shape == (0,)
    for split in ("train", "val"):
        y = ts.splits[split]["y"].compute()
        assert y.shape == (counts[split], 4)
        assert balance[split] == [np.bincount(y[:, j], minlength=3).tolist() for j in range(4)]


def test_global_statistics_with_a_stride_wider_than_the_window_are_the_training_periods_rows(tmp_path):
    """size 1, stride 10: every 10th row is a window. The statistics are those of the
    training period (rows 0..190, from the first window to the last), as documented, not
    of the 20 rows the windows sample: pandas over the same rows."""
    import pandas as pd

    write_day(tmp_path, "2026-01-05", 200, seed=3)
    src = _open_days(tmp_path)
    ts = build_training_set(src.array, columns=src.columns, features=[FeatureSpec.from_mapping(
                            {"name": "imbalance", "levels": 1}, "f")], size=1, stride=10, label=LabelSpec(horizon=1),
                            segments=src.segments, timestamps=src.timestamps)
    book = pd.read_parquet(tmp_path / "2026-01-05.parquet")
    imbalance = ((book.bid_size_1 - book.ask_size_1) / (book.bid_size_1 + book.ask_size_1)).astype(np.float32)
    period = imbalance.iloc[:191].astype(np.float64)
    assert ts.attrs["window_counts"]["train"] == 20
    np.testing.assert_allclose(ts.attrs["normalization"]["mean"], [period.mean()], rtol=1e-9)
    np.testing.assert_allclose(ts.attrs["normalization"]["std"], [period.std(ddof=0)], rtol=1e-9)


def numpy_empty_top(path, *, size: int, horizon: int):
    """An independent build of a one-level LOBSTER book with plain numpy: prices with NaN
    where LOBSTER wrote its dummy, mid_price, spread, log_return and the raw book (0
    where empty, as source.nan: fill gives it), return labels over ``horizon``. Returns
    the per-step features (float64), the window ends whose label is finite, and whether
    each of those windows' features are all finite."""
    raw = np.loadtxt(path, delimiter=",", dtype=np.float64)
    ask = np.where(raw[:, 0] == ASK_DUMMY, np.nan, raw[:, 0] / 10_000)
    bid = np.where(raw[:, 2] == BID_DUMMY, np.nan, raw[:, 2] / 10_000)
    mid = (ask + bid) / 2
    ret = np.concatenate([[np.nan], np.diff(np.log(mid))])
    filled = np.stack([np.nan_to_num(ask), raw[:, 1], np.nan_to_num(bid), raw[:, 3]], axis=1)
    feats = np.column_stack([mid, ask - bid, ret, filled])
    ends = np.arange(1 + size - 1, len(raw) - horizon)  # log_return's lookback of 1 first
    y = np.log(mid[ends + horizon]) - np.log(mid[ends])
    ends = ends[np.isfinite(y)]
    finite = np.array([np.isfinite(feats[e - size + 1 : e + 1]).all() for e in ends], dtype=bool)
    return feats, ends, finite


EMPTY_TOP_FEATURES = ["mid_price", "spread", "log_return", {"name": "book", "levels": 1}]


@pytest.mark.parametrize("nan", ["drop", "fill"])
def test_price_features_read_no_empty_level_1_price_and_features_nan_decides(tmp_path, nan):
    """A one-sided LOBSTER book under source.nan: fill (its dummy prices read as 0): at
    the rows whose best ask or bid was empty, mid_price, spread and log_return (and
    log_return the row after) are NaN, not half a price. drop: the windows holding them
    are absent and counted as NaN windows; fill: they hold features.fill_value there.
    The book keeps the filled 0 either way. Stored windows equal plain numpy."""
    from pipeline.loaders.segments import open_segmented

    path = write_lobster_day(tmp_path, 120, seed=5, empty_ask=(30, 31), empty_bid=(70,))
    src = open_segmented(str(tmp_path / "*_orderbook_1.csv"), format="lobster", nan="fill", dtype="float64")
    specs = [FeatureSpec.from_mapping(v, "f") for v in EMPTY_TOP_FEATURES]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ts = build_training_set(src.array.rechunk((17, -1)), columns=src.columns, features=specs, size=4,
                                label=LabelSpec(horizon=2), normalize="none", nan=nan, fill_value=-7.0,
                                segments=src.segments, timestamps=src.timestamps, source_fill=0.0)
    feats, ends, finite = numpy_empty_top(path, size=4, horizon=2)
    kept = ends[finite] if nan == "drop" else ends
    want = np.stack([feats[e - 3 : e + 1] for e in kept])
    want = np.where(np.isfinite(want), want, -7.0).astype(np.float32)
    np.testing.assert_array_equal(ts.splits["train"]["x"].compute(), want)
    assert (~finite).sum() > 0
    assert ts.attrs["nan_windows_dropped"]["train"] == (int((~finite).sum()) if nan == "drop" else 0)
    fate = ("the windows holding them are left out, counted with the NaN windows" if nan == "drop"
            else "features.nan: fill writes -7 in their place")
    assert [str(w.message) for w in caught if str(w.message).startswith("features:")] == [
        "features: 3 rows hold an empty bid_price_1 (1) or ask_price_1 (2) (source.nan: fill); mid_price, spread, "
        "log_return are NaN there (and where their lookback reads one) rather than computed from the fill value; "
        + fate]


def test_a_price_feature_of_an_empty_level_1_price_is_refused_naming_the_feature_and_row(tmp_path):
    """features.nan: raise refuses the first window that holds a price feature made NaN by
    an empty level-1 price, naming the feature, its row and the empty price; before
    anything is written (build_training_set writes nothing)."""
    from pipeline.loaders.segments import open_segmented

    path = write_lobster_day(tmp_path, 120, seed=5, empty_ask=(30, 31), empty_bid=(70,))
    src = open_segmented(str(tmp_path / "*_orderbook_1.csv"), format="lobster", nan="fill", dtype="float64")
    specs = [FeatureSpec.from_mapping(v, "f") for v in EMPTY_TOP_FEATURES]
    feats, ends, finite = numpy_empty_top(path, size=4, horizon=2)
    e = int(ends[~finite][0])  # the first window the reference finds holding a NaN feature
    row = e - 3 + int(np.flatnonzero(~np.isfinite(feats[e - 3 : e + 1]).all(axis=1))[0])
    assert row == 30
    with pytest.raises(InvalidValueError, match=rf"steps {e - 3}\.\.{e} of the source.*: feature mid_price is nan at "
                                                rf"row {row} of the source, as ask_price_1 was empty at row {row} "
                                                r"\(source.nan: fill wrote 0 there, which is no price\); set "
                                                r"features.nan: drop or fill"):
        build_training_set(src.array.rechunk((17, -1)), columns=src.columns, features=specs, size=4,
                           label=LabelSpec(horizon=2), normalize="none", nan="raise", segments=src.segments,
                           timestamps=src.timestamps, source_fill=0.0)


def test_a_run_over_databento_prices_with_an_empty_best_ask_stores_no_price_made_of_the_fill(tmp_path):
    """`pipeline run` over a Databento MBP-10-like Parquet file (fixed-point prices,
    INT64_MAX where the best ask was empty), configured as the loaders reference shows
    (scale, missing, nan: fill): the stored mid_price and spread windows equal plain
    numpy, and the windows that would hold a mid price of half the bid are absent."""
    import pandas as pd

    from pipeline.config import parse_config
    from pipeline.job import run

    n, empty_rows = 300, [100, 101, 220]
    rng = np.random.default_rng(3)
    bid = 4_770_000_000_000 + np.cumsum(rng.integers(-1, 2, n)) * 250_000_000  # $4770 on a 0.25 tick, 1e-9 units
    ask = bid + 250_000_000
    ask[empty_rows] = np.iinfo(np.int64).max
    pd.DataFrame({"ts_recv": pd.date_range("2024-01-02 14:30", periods=n, freq="100ms"), "bid_px_00": bid,
                  "ask_px_00": ask, "bid_sz_00": rng.integers(1, 50, n), "ask_sz_00": rng.integers(1, 50, n)}
                 ).to_parquet(tmp_path / "mbp10.parquet")
    out = tmp_path / "set.zarr"
    config = parse_config({
        "cluster": {"n_workers": 1, "threads_per_worker": 1, "memory_limit": "1GiB"},
        "source": {"paths": str(tmp_path / "*.parquet"), "timestamp": "ts_recv", "dtype": "float64",
                   "scale": {"*_px_*": 1.0e-9}, "missing": {"*_px_*": [int(np.iinfo(np.int64).max)]},
                   "nan": "fill", "rename": {"bid_price_1": "bid_px_00", "ask_price_1": "ask_px_00"}},
        "features": {"steps": ["mid_price", "spread"], "normalize": "none", "nan": "drop"},
        "windows": {"size": 8},
        "labels": {"kind": "return", "horizon": 3},
        "output": {"path": str(out)},
    })
    with pytest.warns(UserWarning, match=r"^features: 3 rows hold an empty ask_price_1 \(source.nan: fill\)"):
        run(config, log=None, progress=False)
    import pipeline

    stored = pipeline.open(str(out))["train"]["x"][:]
    a = np.where(ask == np.iinfo(np.int64).max, np.nan, ask / 1e9)
    b = bid / 1e9
    feats = np.stack([(a + b) / 2, a - b], axis=1)
    mid = feats[:, 0]
    ends = np.arange(7, n - 3)
    ends = ends[np.isfinite(np.log(mid[ends + 3]) - np.log(mid[ends]))]  # the label reads no empty price
    ends = ends[[np.isfinite(feats[e - 7 : e + 1]).all() for e in ends]]  # features.nan: drop
    np.testing.assert_array_equal(stored, np.stack([feats[e - 7 : e + 1] for e in ends]).astype(np.float32))
    assert stored[..., 0].min() > 4000  # no mid price of half the bid


def test_global_statistics_leave_out_the_price_features_of_an_empty_level_1_price(tmp_path):
    """normalize: global with source.nan: fill: the statistics are fitted in the same pass
    that counts the empty level-1 prices, over the finite values only, as numpy's nanmean
    and nanstd of the fit rows (the first window's first row to the last one's end) give
    them; the empty rows' features, NaN, take no part."""
    from pipeline.loaders.segments import open_segmented

    path = write_lobster_day(tmp_path, 120, seed=5, empty_ask=(30, 31), empty_bid=(70,))
    src = open_segmented(str(tmp_path / "*_orderbook_1.csv"), format="lobster", nan="fill", dtype="float64")
    specs = [FeatureSpec.from_mapping(v, "f") for v in EMPTY_TOP_FEATURES]
    with pytest.warns(UserWarning, match=r"^features: 3 rows hold an empty"):
        ts = build_training_set(src.array.rechunk((17, -1)), columns=src.columns, features=specs, size=4,
                                label=LabelSpec(horizon=2), normalize="global", segments=src.segments,
                                timestamps=src.timestamps, source_fill=0.0)
    feats, _, _ = numpy_empty_top(path, size=4, horizon=2)
    rows = feats[1 : 120 - 2]  # window ends 4 .. 117, each window 4 rows
    stats = ts.attrs["normalization"]
    np.testing.assert_allclose(stats["mean"], np.nanmean(rows, axis=0), rtol=1e-9)
    np.testing.assert_allclose(stats["std"], np.nanstd(rows, axis=0), rtol=1e-6)


@pytest.mark.parametrize("kind", ["numpy", "memmap"])
def test_a_numpy_array_or_a_memory_mapped_file_builds_what_numpy_does(tmp_path, kind):
    # A memory-mapped table is read by each task from its file (as pipeline.windows and
    # pipeline.write read one), not copied into the graph; it failed with an
    # AttributeError ('memmap' object has no attribute 'rechunk').
    x = book(900, seed=2)
    if kind == "memmap":
        np.save(tmp_path / "book.npy", x)
        x_in = np.load(tmp_path / "book.npy", mmap_mode="r")
    else:
        x_in = x
    fr = {"train": 0.6, "val": 0.2, "test": 0.2}
    ts = build_training_set(x_in, columns=COLS, features=SPECS, size=SIZE, stride=STRIDE, scales=SCALES,
                            label=LabelSpec(horizon=H, scale=1e4), splits=fr)
    if kind == "memmap":  # the graph holds the file's path and rows, not its values
        graph = ts.splits["train"]["x"].__dask_graph__()
        assert not any(isinstance(v, np.ndarray) and v.nbytes >= x.nbytes // 2 for v in graph.values())
    ref, _, _, _, _ = numpy_pipeline(x, fr, scale=1e4)
    for k, (xr, yr) in ref.items():
        np.testing.assert_allclose(ts.splits[k]["x"].compute(), xr, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(ts.splits[k]["y"].compute(), yr, rtol=1e-4, atol=1e-3)
