"""Pure window and split arithmetic: no dask, no I/O, tested with hypothesis.

Conventions (DESIGN.md): on a series of ``T`` steps, window ``i`` ends at
``e_i = halo + i * stride`` with ``halo = (size - 1) * max(scales)``; at scale ``s`` it
holds steps ``e_i - s*(size-1), ..., e_i - s, e_i``.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from pipeline.errors import WindowError

__all__ = [
    "aligned_window_chunks",
    "block_window_counts",
    "bounded_window_chunks",
    "chunk_bounds",
    "halo",
    "halo_span",
    "input_chunks_for_windows",
    "merge_short_chunks",
    "row_pieces",
    "rows_per_block",
    "split_gap_windows",
    "split_long_chunks",
    "split_ranges",
    "window_count",
    "window_ends",
]


def halo(size: int, scales: Sequence[int]) -> int:
    """Steps of history a window needs before its end step: ``(size-1) * max(scales)``."""
    return (size - 1) * max(scales)


def window_count(n_steps: int, size: int, stride: int, scales: Sequence[int]) -> int:
    """Number of windows whose every step lies in ``[0, n_steps)``."""
    h = halo(size, scales)
    if n_steps - 1 < h:
        return 0
    return (n_steps - 1 - h) // stride + 1


def window_ends(n_windows: int, size: int, stride: int, scales: Sequence[int]) -> np.ndarray:
    """End step of each window, as int64."""
    return halo(size, scales) + stride * np.arange(n_windows, dtype=np.int64)


def block_window_counts(
    chunks: Sequence[int], size: int, stride: int, scales: Sequence[int]
) -> tuple[int, ...]:
    """Windows whose end step falls in each input chunk (each window is made once, by
    the block that holds its end step)."""
    h = halo(size, scales)
    counts = []
    start = 0
    for c in chunks:
        stop = start + c  # end steps in [start, stop)
        first = max(0, -(-(start - h) // stride))  # ceil((start - h) / stride), at least 0
        last = (stop - 1 - h) // stride if stop - 1 >= h else -1
        counts.append(max(0, last - first + 1))
        start = stop
    return tuple(counts)


def merge_short_chunks(chunks: Sequence[int], minimum: int) -> tuple[int, ...]:
    """Merge neighbouring chunks until every chunk (but a lone one) is at least ``minimum``.

    ``dask.array.overlap`` needs each chunk at least as long as the depth it borrows
    from its neighbour; merging keeps the result's chunk boundaries a subset of the
    input's, so the rechunk is cheap.
    """
    out: list[int] = []
    acc = 0
    for c in chunks:
        acc += c
        if acc >= minimum:
            out.append(acc)
            acc = 0
    if acc:
        if out:
            out[-1] += acc
        else:
            out.append(acc)
    return tuple(out)


def split_long_chunks(chunks: Sequence[int], max_len: int) -> tuple[int, ...]:
    """Split chunks longer than ``max_len`` into pieces of ``max_len`` and a remainder.

    With stride 1 a chunk of ``c`` steps makes ``c`` windows of ``size`` steps each: the
    output is ``size`` times the input. Bounding the input chunk bounds the output chunk
    and so a task's memory. (A remainder shorter than the halo is merged into its
    neighbour afterwards by :func:`merge_short_chunks`.)
    """
    step = max(1, int(max_len))
    out: list[int] = []
    for c in chunks:
        full, rest = divmod(c, step)
        out += [step] * full + ([rest] if rest else [])
    return tuple(out)


def rows_per_block(budget_rows: int, reach: int) -> int:
    """The most rows the window ends of one block may cover.

    A block reads ``reach`` rows before its first window's end as well as the rows its
    ends cover, so the ends get the budget less the reach. Never less than the reach
    itself (nor 1): a window longer than the budget still makes progress, its block
    then reading at most twice the rows one window needs.
    """
    return max(1, int(budget_rows) - int(reach), int(reach))


def bounded_window_chunks(
    first: Sequence[int] | np.ndarray,
    count: Sequence[int] | np.ndarray,
    stride: int,
    *,
    span: int,
    max_windows: int,
) -> tuple[int, ...]:
    """Windows per output block, in order, each block at most ``max_windows`` windows
    whose end rows lie within ``span`` rows (``last - first < span``).

    Windows are given as runs in increasing row order: run ``r`` ends windows at
    ``first[r], first[r] + stride, ...`` (``count[r]`` of them), as
    :class:`~pipeline.features.sessions.WindowRuns` holds them. Bounding the count
    alone bounds a block's output but not the rows its task reads: with a stride of 50
    a block of 40,000 small windows read two million rows (the whole source). A block
    holds at least one window whatever the bounds. Packed greedily, a search per block:
    no array of every end.
    """
    first = np.asarray(first, dtype=np.int64)
    count = np.asarray(count, dtype=np.int64)
    keep = count > 0
    first, count = first[keep], count[keep]
    offsets = np.concatenate([[0], np.cumsum(count)])
    n = int(offsets[-1])
    span, max_windows = max(1, int(span)), max(1, int(max_windows))
    out: list[int] = []
    w = 0
    while w < n:
        r = int(np.searchsorted(offsets, w, side="right")) - 1
        limit = int(first[r]) + (w - int(offsets[r])) * stride + span - 1  # the last end row allowed
        # Runs do not overlap: every run before the last one starting by `limit` ends before it.
        last = int(np.searchsorted(first, limit, side="right")) - 1
        upto = int(offsets[last]) + min(int(count[last]), (limit - int(first[last])) // stride + 1)
        stop = max(w + 1, min(w + max_windows, upto))
        out.append(stop - w)
        w = stop
    return tuple(out)


def aligned_window_chunks(n_windows: int, ranges: Mapping[str, tuple[int, int]], unit: int) -> tuple[int, ...]:
    """Window chunks whose boundaries fall on every split's write units.

    Each split ``[lo, hi)`` is cut into ``unit`` windows from ``lo`` (the last piece
    shorter); the windows before, between and after splits (never written) are chunks
    of their own. Slicing a split out of windows chunked this way gives exactly the
    writer's units: no rechunk, and each unit's windows are made by the task that
    writes them.
    """
    unit = max(1, int(unit))
    bounds = {0, int(n_windows)}
    for lo, hi in ranges.values():
        bounds.update(range(int(lo), int(hi), unit))
        bounds.add(int(hi))
    edges = sorted(b for b in bounds if 0 <= b <= n_windows)
    return tuple(b - a for a, b in zip(edges, edges[1:]) if b > a)


def input_chunks_for_windows(
    out_chunks: Sequence[int], n_steps: int, size: int, stride: int, scales: Sequence[int]
) -> tuple[int, ...]:
    """Step chunks whose blocks make ``out_chunks`` windows each (the inverse of
    :func:`block_window_counts`).

    A block shorter than the halo it lends its right neighbour is merged with that
    neighbour (``dask.array.overlap`` cannot borrow more than a block holds): the
    merged block makes the windows of both chunks, so every boundary of the result is
    one of ``out_chunks``' boundaries, but not every one of them survives.

    Raises
    ------
    WindowError
        When ``out_chunks`` do not add up to the windows of ``n_steps`` steps.
    """
    h = halo(size, scales)
    n = window_count(n_steps, size, stride, scales)
    if sum(out_chunks) != n or any(c < 0 for c in out_chunks):
        raise WindowError(f"windows: chunks {tuple(out_chunks)[:5]}... do not add up to the {n} windows "
                          f"of {n_steps} steps")
    # The block making windows [b, ...) starts at window b's end step, h + b * stride.
    bounds = [int(b) for b in np.cumsum([c for c in out_chunks if c > 0])[:-1]]
    starts = [0] + [h + b * stride for b in bounds]
    chunks = tuple(b - a for a, b in zip(starts, starts[1:] + [n_steps]))
    return merge_short_chunks(chunks, h) if h > 0 else chunks


def split_gap_windows(size: int, scales: Sequence[int], stride: int, horizon: int, lookback: int) -> int:
    """Windows to leave out between consecutive time splits.

    The last window ``a`` of a split reaches forward to step ``e_a + horizon`` through
    its label; the first window ``j`` of the next split reaches back to
    ``e_j - halo - lookback`` through its oldest step's feature history. No step is
    shared when ``(j - a) * stride > halo + horizon + lookback``; this returns the number
    of windows strictly between them, ``j - a - 1``.
    """
    reach = halo(size, scales) + horizon + lookback
    return reach // stride


def check_fractions(fractions: Mapping[str, Any]) -> None:
    """Refuse split fractions that are not numbers in ``(0, 1]`` summing to at most 1.

    A sum above 1 used to be served silently (the last split got only what was left),
    and a date split (a mapping) reached the arithmetic as a raw ``TypeError``.

    Raises
    ------
    WindowError
        Naming the split and what it holds.
    """
    for name, value in fractions.items():
        if isinstance(value, Mapping):
            raise WindowError(
                f"split {name!r}: {dict(value)!r} is a date split; splits here are fractions of the samples "
                "(date splits are a config feature, output.splits; or pass arrays already split: "
                "{'train': {'x': ..., 'y': ...}, ...})"
            )
        if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
            raise WindowError(f"split {name!r}: expected a fraction, a number in (0, 1], got {value!r}")
        if not 0 < float(value) <= 1:
            raise WindowError(f"split {name!r}: expected a fraction in (0, 1], got {value!r}")
    total = float(sum(float(v) for v in fractions.values()))
    if total > 1 + 1e-9:
        raise WindowError(f"split fractions {dict(fractions)} sum to {total:g}; they must sum to at most 1")


def split_ranges(n_windows: int, fractions: Mapping[str, float], gap: int) -> dict[str, tuple[int, int]]:
    """Contiguous window ranges ``[start, stop)`` per split, in the mapping's order,
    with ``gap`` windows left out between consecutive splits.

    Raises
    ------
    WindowError
        When a split would get no window, or the fractions are not numbers in
        ``(0, 1]`` that sum to at most 1.
    """
    check_fractions(fractions)
    names = list(fractions)
    available = n_windows - gap * (len(names) - 1)
    out: dict[str, tuple[int, int]] = {}
    start = 0
    for i, name in enumerate(names):
        count = int(np.floor(fractions[name] * available + 1e-9)) if available > 0 else 0
        if i == len(names) - 1 and sum(fractions.values()) >= 1.0 - 1e-9:
            count = max(0, n_windows - start)  # the last split takes the rounding remainder
        if count <= 0:
            raise WindowError(
                f"split {name!r}: no window left ({n_windows} windows in all, {gap} windows of "
                f"gap between splits, fractions {dict(fractions)}); use more data, a larger "
                "fraction, or a smaller window, horizon or stride"
            )
        out[name] = (start, start + count)
        start += count + gap
    return out


def chunk_bounds(chunks: Sequence[int]) -> np.ndarray:
    """The row edges of chunks of these sizes: ``0``, then each chunk's end (int64)."""
    return np.concatenate([[0], np.cumsum(chunks, dtype=np.int64)])


def row_pieces(bounds: np.ndarray, lo: int, hi: int) -> list[tuple[int, int, int]]:
    """``(chunk, start, stop)`` slices of the chunks whose edges are ``bounds`` (``0``,
    then each chunk's end) that hold rows ``lo .. hi - 1``, in order.

    Raises
    ------
    ValueError
        When ``lo .. hi`` is empty or leaves the rows ``bounds`` covers.
    """
    if not 0 <= lo < hi <= int(bounds[-1]):
        raise ValueError(f"rows {lo}..{hi} outside 0..{int(bounds[-1])}")
    first = int(np.searchsorted(bounds, lo, side="right")) - 1
    out = []
    c = first
    while int(bounds[c]) < hi:
        a, b = max(lo, int(bounds[c])), min(hi, int(bounds[c + 1]))
        if b > a:
            out.append((c, a - int(bounds[c]), b - int(bounds[c])))
        c += 1
    return out


def halo_span(start: int, stop: int, back: int, fwd: int, n: int, cuts: np.ndarray | None = None) -> tuple[int, int]:
    """Rows ``lo .. hi - 1`` a block of rows ``start .. stop - 1`` reads: ``back`` rows
    before it and ``fwd`` after, inside ``0 .. n``, and, given sorted ``cuts`` (the
    rows where sessions begin and end), never past the last cut at or before ``start``
    nor the first at or after ``stop``.

    A value whose reach crosses a cut is never used (features NaN their segment's first
    rows, windows and labels stay inside their segment), so a block that starts or ends
    on a cut reads nothing of its neighbour: its task then depends on its own chunk only.
    """
    lo, hi = max(0, start - back), min(n, stop + fwd)
    if cuts is not None and len(cuts):
        before = int(np.searchsorted(cuts, start, side="right")) - 1
        after = int(np.searchsorted(cuts, stop, side="left"))
        if before >= 0:
            lo = max(lo, min(start, int(cuts[before])))
        if after < len(cuts):
            hi = min(hi, max(stop, int(cuts[after])))
    return lo, hi
