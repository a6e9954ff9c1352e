"""``pipeline inspect --plot``: sample windows from across a split, feature histograms over
a sample of its chunks, and the label distribution of every split, in one image (PNG,
JPEG, PDF, SVG...: the format follows the file's extension).

Reads go through the streamer's store source, so virtual stores (windows assembled from
the stored features) are drawn exactly as they are streamed.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from pipeline.errors import ConfigError, MissingDependencyError, PipelineError, StoreError
from pipeline.storage.store import ATTRS_KEY, open_store_group, store_root_attrs

__all__ = ["PLOT_CHUNKS", "PlotSample", "feature_labels", "plot_formats", "plot_sample", "plot_store", "plot_target",
           "spread_chunks"]


#: Chunks of a split read for its feature histograms and label counts, spread evenly:
#: the split's distribution, at the cost of a few chunk reads however large it is.
PLOT_CHUNKS = 16
#: Samples kept per chunk for the feature histograms (a seeded subset beyond): bounds
#: what the plot holds when chunks are large.
_HIST_ROWS = 1 << 16
#: Base features given a histogram panel each; the rest are named in the title.
_MAX_HIST_PANELS = 40
#: Above this many columns a sample window is drawn as an image rather than as lines.
_MAX_LINES = 12
#: Integer labels of more distinct values are drawn as a histogram, not as class bars.
_MAX_CLASSES = 50


@dataclass(frozen=True, slots=True)
class PlotSample:
    """Which samples of a split :func:`plot_store` reads.

    Attributes
    ----------
    windows
        ``(chunk, row in the chunk, index in the split)`` of each sample window, in
        split order.
    chunks
        The chunks whose samples feed the histograms, in split order.
    """

    windows: tuple[tuple[int, int, int], ...]
    chunks: tuple[int, ...]


def spread_chunks(lengths: Sequence[int], k: int) -> tuple[int, ...]:
    """Up to ``k`` non-empty chunks evenly spaced over a split, its first and last among them.

    Parameters
    ----------
    lengths
        Samples per chunk, in split order (empty chunks are skipped).
    k
        How many chunks at most.
    """
    nonempty = np.flatnonzero(np.asarray(lengths, dtype=np.int64) > 0)
    if nonempty.size <= k:
        return tuple(int(c) for c in nonempty)
    if k <= 0:
        return ()
    # Steps of at least one chunk between picks: rounding keeps them distinct.
    picks = np.round(np.linspace(0, nonempty.size - 1, k)).astype(np.int64)
    return tuple(int(c) for c in nonempty[picks])


def plot_sample(lengths: Sequence[int], *, n_windows: int, max_chunks: int = PLOT_CHUNKS, seed: int = 0) -> PlotSample:
    """The sample windows and histogram chunks of a split of chunks ``lengths``.

    The split's samples are cut into ``n_windows`` stretches of equal length and one
    window is drawn from each with a generator seeded by ``seed``: the windows cover
    the whole split, not its first chunk, and the same seed draws the same windows.
    Histograms read :func:`spread_chunks` of ``max_chunks``.
    """
    sizes = np.asarray(lengths, dtype=np.int64)
    total = int(sizes.sum())
    n = max(0, min(int(n_windows), total))
    bounds = np.linspace(0, total, n + 1).astype(np.int64)
    rng = np.random.default_rng(seed)
    picks = bounds[:-1] + (rng.random(n) * np.diff(bounds)).astype(np.int64)
    stops = np.cumsum(sizes)
    chunk = np.searchsorted(stops, picks, side="right")
    rows = picks - (stops[chunk] - sizes[chunk])
    return PlotSample(windows=tuple((int(c), int(r), int(i)) for c, r, i in zip(chunk, rows, picks)),
                      chunks=spread_chunks(sizes, max_chunks))


def _scales(attrs: dict[str, Any]) -> list[int]:
    geometry = attrs.get("windows") or attrs.get("virtual") or {}
    return [int(s) for s in geometry.get("scales") or [1]] if isinstance(geometry, dict) else [1]


def feature_labels(attrs: dict[str, Any], width: int) -> tuple[list[str], list[str]]:
    """Names of the ``width`` columns of ``x`` and of its base features.

    From the store's ``features`` attribute; with several window scales the columns
    hold the features once per scale and are named ``name@s``. Without names that fit,
    ``f0, f1, ...``.

    Returns
    -------
    (columns, base)
        One label per column of ``x``, and one per feature (``base`` equals
        ``columns`` with a single scale).
    """
    names = [str(n) for n in attrs.get("features") or []]
    scales = _scales(attrs)
    if len(scales) > 1 and width % len(scales) == 0:
        base = names if len(names) * len(scales) == width else [f"f{i}" for i in range(width // len(scales))]
        return [f"{n}@{s}" for s in scales for n in base], base
    base = names if len(names) == width else [f"f{i}" for i in range(width)]
    return base, base


def _as_steps(block: np.ndarray) -> np.ndarray:
    """Samples as ``(n, steps, columns)``: a window's steps, or one step for row samples."""
    n = block.shape[0]
    if block.ndim == 1:
        return block.reshape(n, 1, 1)
    return block.reshape(n, -1, block.shape[-1])


def _column_ranges(columns: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Finite minimum and span of each column of ``(steps, width)`` (span 1 where flat)."""
    finite = np.where(np.isfinite(columns), columns, np.nan)
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # an all-NaN column: drawn empty
        lo, hi = np.nanmin(finite, axis=0), np.nanmax(finite, axis=0)
    span = hi - lo
    return np.nan_to_num(lo), np.where(np.isfinite(span) & (span > 0), span, 1.0)


def _draw_window(ax: Any, window: np.ndarray, labels: list[str]) -> None:
    """One sample: lines per column, an image when there are many, bars for one step."""
    steps, width = window.shape
    if steps == 1:
        ax.bar(np.arange(width), window[0])
        ax.set_xticks(np.arange(width), labels, rotation=90, fontsize=6)
        return
    w = window.astype(np.float64)
    lo, span = _column_ranges(w)
    if width <= _MAX_LINES:
        # Raw features differ in range by orders of magnitude (a price of 100 beside a
        # spread of 0.01): drawn to one scale, all but the largest are flat lines.
        scaled = width > 1 and float(np.max(lo + span) - np.min(lo)) > 10 * float(np.median(span))
        for j in range(width):
            ax.plot((w[:, j] - lo[j]) / span[j] if scaled else w[:, j], linewidth=0.8, label=labels[j])
        ax.legend(fontsize=6, ncol=2 if width > 6 else 1)
        ax.set_xlabel("step in window" + (" (each line scaled to its range)" if scaled else ""), fontsize=8)
        return
    ax.imshow(((w - lo) / span).T, aspect="auto", interpolation="nearest", cmap="viridis")
    every = max(1, -(-width // 40))
    ax.set_yticks(np.arange(0, width, every), labels[::every], fontsize=5)
    ax.set_xlabel("step in window (each row scaled to its range)", fontsize=8)


def _horizon_names(label_attrs: dict[str, Any], n: int) -> list[str | None]:
    """Legend names of the ``n`` label columns: ``k=<horizon>``, or none for one column."""
    if n == 1:
        return [None]
    horizons = list(label_attrs.get("horizons") or [])
    return [f"k={horizons[h]}" if h < len(horizons) else f"column {h}" for h in range(n)]


def _labels_of_split(location: str, split: str, attrs: dict[str, Any], max_chunks: int,
                     storage_options: dict[str, Any] | None) -> dict[str, Any] | None:
    """What the label panel of a split draws: class counts per horizon, or label values
    (``None`` for a split without labels).

    Integer labels are classes: counted from the store's ``class_balance`` when it
    records the split, else over :func:`spread_chunks` of ``max_chunks``. Integers of
    more than :data:`_MAX_CLASSES` values (sample ids, counts) are drawn as values.
    """
    from pipeline.streaming.sources import StoreSource

    try:
        source = StoreSource(location, split, ("y",), partial=True, storage_options=storage_options)
    except PipelineError:
        return None
    reader = source.readers["y"]
    balance = attrs.get("class_balance")
    balance = balance.get(split) if isinstance(balance, dict) else None
    if reader.dtype.kind in "iub" and balance:
        per = balance if isinstance(balance[0], list) else [balance]
        n_classes = max(len(row) for row in per)
        return {"kind": "classes", "classes": np.arange(n_classes),
                "counts": np.array([list(row) + [0] * (n_classes - len(row)) for row in per]),
                "note": f"{sum(per[0]):,} labels (recorded class balance)"}
    chunks = spread_chunks(source.lengths, max_chunks)
    if not chunks:
        return {"kind": "empty", "note": "no labels"}
    values = np.concatenate([source.read("y", c) for c in chunks])
    # A column per horizon; labels of more dimensions (masks, say) as one distribution.
    values = values.reshape(values.shape[0], -1) if len(reader.tail_shape) <= 1 else values.reshape(-1, 1)
    note = f"{len(values):,} of {sum(source.lengths):,} labels, {len(chunks)} of {len(source.lengths)} chunks"
    if reader.dtype.kind in "iub":
        classes = np.unique(values)
        if classes.size <= _MAX_CLASSES:
            counts = np.stack([np.bincount(np.searchsorted(classes, values[:, h]), minlength=classes.size)
                               for h in range(values.shape[1])])
            return {"kind": "classes", "classes": classes, "counts": counts, "note": note}
    return {"kind": "values", "values": values.astype(np.float64), "note": note}


def _read_sample(source: Any, sample: PlotSample, seed: int) -> tuple[dict[int, np.ndarray], np.ndarray]:
    """The sample windows (by index in the split) as ``(steps, columns)``, and every
    column's value at the last step of the histogram chunks' samples, ``(n, columns)``.

    One chunk in memory at a time; each chunk read once for both.
    """
    windows: dict[int, np.ndarray] = {}
    parts: list[np.ndarray] = []
    rng = np.random.default_rng(seed)
    wanted = set(sample.chunks)
    for c in sorted(wanted | {w[0] for w in sample.windows}):
        block = source.read("x", c)
        for chunk, row, index in sample.windows:
            if chunk == c:
                windows[index] = _as_steps(block[row : row + 1])[0].copy()
        if c in wanted:
            last = _as_steps(block)[:, -1, :]
            keep = np.sort(rng.choice(len(last), _HIST_ROWS, replace=False)) if len(last) > _HIST_ROWS else slice(None)
            parts.append(np.array(last[keep], dtype=np.float64))
    width = int(source.readers["x"].tail_shape[-1]) if source.readers["x"].tail_shape else 1
    return windows, np.concatenate(parts) if parts else np.empty((0, width))


def _draw_histograms(axes: Sequence[Any], values: np.ndarray, columns: list[str], base: list[str], shown: int
                     ) -> None:
    """A panel for each of the first ``shown`` base features (the other panels hidden);
    one line per scale where the scales' values differ."""
    n_scales = len(columns) // len(base)
    for k, ax in enumerate(axes):
        if k >= shown:
            ax.set_visible(False)
            continue
        drawn: list[np.ndarray] = []
        for s in range(n_scales):
            v = values[:, s * len(base) + k]
            v = v[np.isfinite(v)]
            # Every scale's window ends at the same step: unless windows were normalized
            # one by one, their last steps agree, and one line shows them all.
            if any(v.shape == d.shape and np.array_equal(v, d) for d in drawn):
                continue
            drawn.append(v)
            if v.size:
                ax.hist(v, bins=50, histtype="step", label=columns[s * len(base) + k] if n_scales > 1 else None)
        if not any(d.size for d in drawn):
            ax.text(0.5, 0.5, "no finite values", ha="center", va="center", transform=ax.transAxes, fontsize=7)
        if len(drawn) > 1:
            ax.legend(fontsize=5)
        ax.set_title(base[k], fontsize=8)
        ax.tick_params(labelsize=6)


def _draw_labels(ax: Any, split: str, info: dict[str, Any], label_attrs: dict[str, Any]) -> None:
    """A split's label distribution: grouped bars of class counts, or float histograms."""
    if info["kind"] == "empty":
        ax.text(0.5, 0.5, "no labels", ha="center", va="center", transform=ax.transAxes)
    elif info["kind"] == "classes":
        counts, classes = info["counts"], info["classes"]
        names = label_attrs.get("classes") or []
        ticks = [names[int(c)] if classes.dtype.kind in "iu" and 0 <= int(c) < len(names) else str(c) for c in classes]
        bar = 0.8 / len(counts)
        for h, (row, name) in enumerate(zip(counts, _horizon_names(label_attrs, len(counts)))):
            ax.bar(np.arange(len(classes)) + (h - (len(counts) - 1) / 2) * bar, row, width=bar, label=name)
        ax.set_xticks(np.arange(len(classes)), ticks, fontsize=7)
        ax.set_ylabel("count", fontsize=7)
    else:
        values = info["values"]
        for h, name in enumerate(_horizon_names(label_attrs, values.shape[1])):
            v = values[:, h][np.isfinite(values[:, h])]
            if v.size:
                ax.hist(v, bins=50, histtype="step", label=name)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=6)
    ax.set_title(f"{split}: {info['note']}", fontsize=8)
    ax.tick_params(labelsize=6)


#: matplotlib's file types that are not an image to look at: LaTeX code (which needs a TeX
#: system to be written) and raw pixel buffers.
_NOT_IMAGES = frozenset({"pgf", "raw", "rgba"})


def plot_formats() -> tuple[str, ...]:
    """The extensions :func:`plot_store` writes, sorted: matplotlib's image formats.

    Raises
    ------
    MissingDependencyError
        Without matplotlib.
    """
    try:
        from matplotlib.backend_bases import FigureCanvasBase
    except ImportError:
        raise MissingDependencyError("pipeline inspect --plot", "matplotlib", "plot") from None
    return tuple(sorted(set(FigureCanvasBase.get_supported_filetypes()) - _NOT_IMAGES))


def plot_target(path: str | os.PathLike[str], formats: Sequence[str] | None = None) -> str:
    """The file :func:`plot_store` writes for ``path``, checked before anything is read.

    The image format follows the extension (any case); a name without one gets ``.png``
    added, as matplotlib would add it, so that the path returned is the file written.

    Parameters
    ----------
    path
        The ``--plot`` argument.
    formats
        The extensions accepted (:func:`plot_formats` by default).

    Returns
    -------
    str
        ``path``, or ``path + ".png"`` when it has no extension.

    Raises
    ------
    ConfigError
        An extension that is not an image format (``--plot plot.txt``), naming those
        that are.
    StoreError
        ``path`` is a directory, or its folder does not exist.
    """
    png = os.fspath(path)
    if os.path.isdir(png) or not os.path.basename(png):  # "out/", or a folder that exists
        raise StoreError(f"--plot {png}: a directory; name an image file, such as "
                         f"{os.path.join(png, 'plot.png')}")
    stem, dot_ext = os.path.splitext(png)
    if not dot_ext:
        png, dot_ext = f"{png}.png", ".png"
        if os.path.isdir(png):
            raise StoreError(f"--plot {png}: a directory; name an image file, such as "
                             f"{os.path.join(png, 'plot.png')}")
    known = tuple(formats) if formats is not None else plot_formats()
    if dot_ext[1:].lower() not in known:
        raise ConfigError("--plot", "a file name ending in an image format's extension (the format follows it: "
                          + ", ".join(f".{e}" for e in known) + ")", os.fspath(path))
    folder = os.path.dirname(os.path.abspath(png))
    if not os.path.isdir(folder):
        raise StoreError(f"--plot {png}: the folder {folder} does not exist; create it or choose another file")
    return png


def plot_store(location: str | os.PathLike[str], png: str, *, n_windows: int = 4, split: str | None = None,
               seed: int = 0, max_chunks: int = PLOT_CHUNKS,
               storage_options: dict[str, Any] | None = None) -> str:
    """Draw sample windows, feature histograms and label distributions to one image.

    Windows come from across ``split`` (see :func:`plot_sample`); histograms of each
    feature's value at every sample's last step (each time step once, at stride 1)
    from ``max_chunks`` chunks spread evenly over the split; the label distribution of
    every split, class counts (from the store's ``class_balance`` when recorded) or a
    histogram of float labels, per horizon. Features are named by the store's
    ``features`` attribute (see :func:`feature_labels`). Virtual stores (window ends
    and shared features) are drawn from windows assembled as a stream assembles them.

    Parameters
    ----------
    location
        The store.
    png
        Where to write the image; its extension names the format (``.png``, ``.jpg``,
        ``.pdf``, ``.svg``...: :func:`plot_formats`), ``.png`` when it has none.
    n_windows
        Sample windows to draw.
    split
        The split of the windows and histograms; by default the first.
    seed
        Seeds which windows are drawn.
    max_chunks
        Chunks read per split for the histograms and label counts.
    storage_options
        fsspec options of a remote store.

    Returns
    -------
    str
        The file written: ``png``, with ``.png`` added when it has no extension
        (:func:`plot_target`).

    Raises
    ------
    MissingDependencyError
        Without matplotlib.
    ConfigError
        When ``png``'s extension is not an image format's.
    StoreError
        When ``split`` is not in the store, or holds no ``x`` to draw, or ``png`` is a
        directory or its folder does not exist (checked before the store is read).
    """
    png = plot_target(png)  # first: raises MissingDependencyError without matplotlib
    from matplotlib.figure import Figure  # no pyplot: no global backend or state
    from pipeline.streaming.sources import StoreSource, available_splits, is_split_group

    loc = os.fspath(location)
    group = open_store_group(loc, mode="r", storage_options=storage_options)
    if ATTRS_KEY not in group.attrs:  # no splits, windows or feature names to draw by
        raise StoreError(f"{loc}: --plot draws the windows, features and labels of a store pipeline wrote; this "
                         "one another tool wrote (its arrays are listed above)")
    attrs = store_root_attrs(group)
    listed = list(attrs.get("splits") or {})
    present = [name for name, sub in group.groups() if not name.startswith("_") and is_split_group(name, sub)]
    order = [s for s in listed if s in present] + sorted(set(present) - set(listed))
    split = split if split is not None else next(iter(order), None)
    if split not in present:
        raise StoreError(f"{loc}: no split {split!r} to plot; {available_splits(group, attrs)}")
    virtual = "x" not in group[split] and "ends" in group[split] and bool(attrs.get("virtual"))
    if "x" not in group[split] and not virtual:
        raise StoreError(f"{loc}: split {split!r} holds no x (nor virtual window ends) to plot")
    # Partial: an interrupted store is drawn from what it holds (unwritten chunks read
    # as the fill value), as the report describes it.
    source = StoreSource(loc, split, ("x",), partial=True, storage_options=storage_options)
    lengths = source.lengths
    sample = plot_sample(lengths, n_windows=n_windows, max_chunks=max_chunks, seed=seed)
    windows, last = _read_sample(source, sample, seed)
    columns, base = feature_labels(attrs, last.shape[1])
    labels = {s: _labels_of_split(loc, s, attrs, max_chunks, storage_options) for s in order}
    labels = {s: v for s, v in labels.items() if v is not None}

    shown = min(len(base), _MAX_HIST_PANELS)
    hist_cols = min(8, max(shown, 1))
    hist_rows = max(1, -(-shown // hist_cols))
    heights = [4, 1.9 * hist_rows] + ([3.2] if labels else [])
    fig = Figure(layout="constrained", figsize=(max(16, 4 * len(windows)), sum(heights)), dpi=90)
    fig.suptitle(loc, fontsize=10)
    parts = fig.subfigures(len(heights), 1, height_ratios=heights)

    what = "windows" if len(source.readers["x"].tail_shape) > 1 else "samples"
    parts[0].suptitle(f"{split}: {len(windows)} sample {what} drawn across {sum(lengths):,} samples in "
                      f"{len(lengths)} chunks (seed {seed})"
                      + (", virtual: assembled from the shared features" if virtual else ""), fontsize=10)
    chunk_of = {index: chunk for chunk, _, index in sample.windows}
    for ax, (index, window) in zip(parts[0].subplots(1, max(len(windows), 1), squeeze=False)[0],
                                   sorted(windows.items())):
        _draw_window(ax, window, columns)
        ax.set_title(f"sample {index:,} (chunk {chunk_of[index]})", fontsize=9)

    more = f"; the first {shown} of {len(base)} features" if shown < len(base) else ""
    parts[1].suptitle(f"feature values at each sample's last step: {last.shape[0]:,} samples from "
                      f"{len(sample.chunks)} of {len(lengths)} chunks spread evenly over {split}{more}", fontsize=10)
    _draw_histograms(parts[1].subplots(hist_rows, hist_cols, squeeze=False).ravel(), last, columns, base, shown)

    if labels:
        label_attrs = attrs.get("labels") if isinstance(attrs.get("labels"), dict) else {}
        parts[2].suptitle("label distribution per split", fontsize=10)
        for ax, (s, info) in zip(parts[2].subplots(1, len(labels), squeeze=False)[0], labels.items()):
            _draw_labels(ax, s, info, label_attrs)
    try:
        # The format plot_target checked, not one matplotlib infers again.
        fig.savefig(png, format=os.path.splitext(png)[1][1:].lower())
    except OSError as exc:  # no permission, a full disk
        raise StoreError(f"--plot {png}: cannot write the image ({exc.strerror or exc})") from None
    return png
