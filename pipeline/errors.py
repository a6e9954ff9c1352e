"""Every error the package raises, in one place.

Each class carries a message template. Messages state *where* (file path, key path,
chunk index), *what was expected* and *what arrived*, so a user can fix the input
without reading a traceback. The CLI prints ``str(error)`` and exits with status 2 for
:class:`ConfigError` and 1 for the other :class:`PipelineError` subclasses.
"""

from __future__ import annotations

__all__ = [
    "ChunkAlignmentError",
    "ClusterError",
    "ConfigError",
    "CorruptChunkError",
    "EmptyInputError",
    "FeatureError",
    "FormatMismatchError",
    "IncompleteStoreError",
    "InvalidValueError",
    "KeptBatchesWarning",
    "LoaderError",
    "MissingColumnError",
    "MissingDependencyError",
    "PipelineError",
    "PriceResolutionWarning",
    "SessionGapWarning",
    "ShapeMismatchError",
    "StoreConflictError",
    "StoreError",
    "StoreLockedError",
    "StreamError",
    "UnwrittenChunksWarning",
    "WindowError",
]


class PipelineError(Exception):
    """Base class of every error raised on purpose by this package."""


class ConfigError(PipelineError, ValueError):
    """A configuration value is missing, unknown or of the wrong type.

    Parameters
    ----------
    path
        Dotted key path of the offending value, for example ``"windows.size"``.
    expected
        What the key accepts, for example ``"a positive integer"``.
    got
        The value that arrived (rendered with ``repr``), or a free-form description.
    """

    def __init__(self, path: str, expected: str, got: object = None, *, detail: str | None = None):
        self.path = path
        self.expected = expected
        self.got = got
        # Key paths are made of the config's own keys: one with a newline or another
        # control character is shown escaped, so the error stays one line.
        shown = path if path.isprintable() else path.encode("unicode_escape").decode("ascii")
        if detail is not None:
            msg = f"{shown}: {detail}"
        else:
            msg = f"{shown}: expected {expected}, got {got!r}"
        super().__init__(msg)


class MissingDependencyError(PipelineError, ImportError):
    """An optional dependency is needed for the requested feature.

    Parameters
    ----------
    feature
        What the user asked for, for example ``"the PyTorch adapter"``.
    package
        The package that is missing, for example ``"PyTorch"``.
    extra
        The extra of this project that installs it, for example ``"torch"``.
    detail
        The message instead of "please install", where the package is installed but
        does not import (Keras without its configured backend).
    """

    def __init__(self, feature: str, package: str, extra: str, *, detail: str | None = None):
        super().__init__(
            f"{feature}: {detail}" if detail is not None else
            f"{feature} depends on {package}. Please install it with "
            f"pip install 'pipeline[{extra}]'"
        )


class ClusterError(PipelineError):
    """The dask cluster could not be started or reached."""


# -- loaders ---------------------------------------------------------------------------


class LoaderError(PipelineError):
    """A raw input file could not be read. Messages always name the file."""

    def __init__(self, path: str, problem: str):
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{path}: {problem}")


class EmptyInputError(LoaderError):
    """A glob or file list matched no file, or every file it matched holds no data rows
    (then ``files_without_rows`` lists them, as a build records its files)."""

    files_without_rows: list[dict] | None = None


class FormatMismatchError(LoaderError):
    """A file's content is not the format its suffix or ``format:`` says."""


class ShapeMismatchError(LoaderError):
    """Files that are stacked or concatenated have incompatible shapes."""


class MissingColumnError(LoaderError):
    """A requested table column is absent from a file."""


class InvalidValueError(LoaderError):
    """NaN or inf values were found and the ``nan`` policy is ``raise``."""


# -- features --------------------------------------------------------------------------


class FeatureError(PipelineError):
    """A feature specification or a feature hook is invalid."""


class WindowError(FeatureError):
    """Window parameters do not fit the data (for example the series is too short)."""


# -- storage ---------------------------------------------------------------------------


class StoreError(PipelineError):
    """A zarr store is missing, malformed or cannot be written."""


class IncompleteStoreError(StoreError):
    """A store was opened for reading before its writer marked it complete."""

    def __init__(self, path: str, detail: str = ""):
        extra = f" ({detail})" if detail else ""
        super().__init__(
            f"{path}: the store is incomplete{extra}; rerun the same `pipeline run` (or "
            "`pipeline.write` call) to finish it, or open it with partial=True to read what is there"
        )


class StoreConflictError(StoreError):
    """An existing store was written by a different configuration."""


class StoreLockedError(StoreError):
    """Another process holds the write lock of a store."""


class ChunkAlignmentError(StoreError):
    """Dask chunks would make two tasks write the same zarr chunk or shard."""


class CorruptChunkError(StoreError):
    """A stored chunk failed to decode or did not match its recorded checksum.

    Parameters
    ----------
    store
        The store's location.
    split
        The split (or ``_shared`` group) holding the chunk.
    array
        The array's name in the split.
    index
        Chunk index along the sample axis.
    problem
        What went wrong, for example ``"checksum mismatch"``.
    """

    def __init__(self, store: str, split: str, array: str, index: int, problem: str):
        self.store = store
        self.split = split
        self.array = array
        self.index = index
        super().__init__(f"{store}: {split}/{array} chunk {index}: {problem}")


class PriceResolutionWarning(RuntimeWarning):
    """Prices read in float32 move by less than float32 resolves near them: their ticks
    (spreads, one-tick returns) are lost. Set ``source.dtype: float64``
    (:mod:`pipeline.loaders.precision`)."""


class UnwrittenChunksWarning(UserWarning):
    """Rows of an HDF5 dataset read as its fill value because their chunks were never
    written (a writer killed before closing the file, or one that never wrote them):
    :mod:`pipeline.loaders.hdf5`. Filter it where such rows are expected."""


# -- streaming -------------------------------------------------------------------------


class StreamError(PipelineError):
    """A stream was configured inconsistently (arrays of different lengths, bad rank)."""


class KeptBatchesWarning(UserWarning):
    """Batches the training loop keeps hold more group buffers than a stream reuses.

    A batch is a view of its group's buffer (no copy), so a kept batch keeps the whole
    buffer from being reused, and the stream makes new ones meanwhile.
    """

    def __init__(self, buffers: int, nbytes: int):
        super().__init__(
            f"{buffers} group buffers ({nbytes / 2**20:,.1f} MiB) are held by batches kept by the training loop "
            "(a batch is a view of its group's buffer), and the stream makes new ones; copy the batches you "
            "keep (np.copy(batch), tensor.clone()) to hold only their own samples"
        )


# -- sessions --------------------------------------------------------------------------


class SessionGapWarning(UserWarning):
    """Steps inside a session far longer than its typical step (an outage in hourly
    data, a feed that stopped): windows, features' lookback and labels span them, as
    over any other step. ``source.sessions: {gap: <duration>}`` starts a new session at
    each such gap (:func:`pipeline.loaders.segments.open_segmented`)."""
