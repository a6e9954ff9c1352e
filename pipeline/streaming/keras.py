"""Keras 3 adapter: a ``keras.utils.PyDataset`` over a :class:`~pipeline.streaming.Stream`.

Keras 3 converts anything array-like handed to ``fit`` into one numpy array: a dask
array passed to ``model.fit`` is loaded whole, every epoch. A PyDataset is iterated
batch by batch instead, on every backend. This class exposes no ``__array__``.

**Passes.** The dataset serves the stream in passes. A pass starts where the stream
stands (an epoch, and the batches of it already served, after
``stream.load_state_dict``) and serves the rest of that epoch; ``len(ds)`` is the
batches of the pending pass. What Keras's ``on_epoch_end`` does depends on how much of
the pass was served:

- all of it: the next pass is the stream's next epoch, from its start;
- at most :data:`PEEK_BATCHES` batches, at the first epoch end of a fit: the pass
  starts again from its start point. Keras takes a batch to build an unbuilt model and
  then calls ``on_epoch_end`` before training; moving on would skip what it looked at
  (on a fresh ``fit`` after a resume, the start of the rest of the epoch). A fit whose
  model is built calls ``on_epoch_end`` first with nothing taken; after that, and after
  any epoch end, Keras epochs of one or two steps are epochs, and the pass goes on;
- more (``steps_per_epoch`` below the pass's length): the next Keras epoch goes on with
  the same pass where this one stopped.

**Keras epochs across stream epochs.** Keras reads a PyDataset's ``num_batches`` (its
``len``) and ends an epoch when its count reaches it: with ``steps_per_epoch`` below
``len(ds)``, a Keras epoch that meets the end of a stream epoch is cut short there
("Your input ran out of data"; 50 steps of a 79-batch stream make epochs of 50, 29, 50,
29 steps). ``stream.keras(repeat=True)`` has no ``num_batches`` (``None``: endless for
Keras), and serves the stream's epochs one after another: every Keras epoch takes
``steps_per_epoch`` batches, going on into the next stream epoch (``set_epoch``, a new
order) where one ends, each sample once per stream epoch. Such a dataset needs
``steps_per_epoch`` (without it one Keras epoch would never end) and is not for
validation.

Keras asking for index 0 again, after the indices ``0, 1, ..., k - 1`` of this pass in
order, starts the pass again from its start point: that is a new iteration of the
dataset, as ``evaluate`` makes every time (``fit``'s ``validation_steps``,
``evaluate(ds, steps=k)``), and Keras serves any other PyDataset's batches ``0 .. k-1``
again then. A frozen model's validation loss stays the same from epoch to epoch.
Training with ``shuffle=True`` (Keras's default) asks for indices out of order, and
``steps_per_epoch`` continues a pass with index ``k``, so neither is taken for one.

Keras reads ``len`` once per ``fit``: after ``load_state_dict``, ``fit(ds, epochs=1)``
finishes the interrupted epoch, and later epochs (whole ones) come from another ``fit``.

**Keras's epoch number.** A PyDataset is not told which epoch Keras runs, so by itself
the dataset serves the stream's epochs in turn from where the stream stands: a
``fit(ds, initial_epoch=2, epochs=3)`` on a fresh stream serves stream epoch 0's order,
not epoch 2's. ``ds.epoch_callback()`` (passed to ``fit``'s ``callbacks``) tells it:
when Keras begins epoch ``k`` and the stream stands at an epoch's start, the pass is
stream epoch ``k``. That is what ``initial_epoch`` and ``BackupAndRestore`` need: a fit
restarted from a backup serves the epochs it trains in the order an uninterrupted fit
served them. A stream standing inside an epoch (a resumed state, or Keras epochs of
``steps_per_epoch`` batches, shorter than the stream's) goes on where it stands.
"""

from __future__ import annotations

import threading
from typing import Any, Iterator

import numpy as np

from pipeline.errors import MissingDependencyError, StreamError

try:
    import keras
except ImportError as exc:  # pragma: no cover - exercised only without the extra, or in a subprocess
    keras = None
    #: Why ``import keras`` failed: told apart from Keras not installed (see _keras_error).
    _IMPORT_ERROR: ImportError | None = exc
else:
    _IMPORT_ERROR = None

__all__ = ["PEEK_BATCHES", "EpochCallback", "KerasDataset"]

_Base: Any = keras.utils.PyDataset if keras is not None else object
_Callback: Any = keras.callbacks.Callback if keras is not None else object

#: Batches Keras may take before an epoch without training on them: the one batch its
#: ``fit`` and ``evaluate`` look at to build an unbuilt model, and on an accelerator the
#: JAX trainer's next batch, which it moves to the device one step ahead.
PEEK_BATCHES = 2


def _keras_error() -> MissingDependencyError:
    """The error of ``stream.keras()`` without an importable Keras. Keras installed can
    still fail to import: it imports its backend on import (``KERAS_BACKEND``, else
    ``~/.keras/keras.json``'s, ``tensorflow`` by default), and "please install Keras"
    would send its user to reinstall what is there; that case says so, with the error."""
    import importlib.util
    import os

    if importlib.util.find_spec("keras") is None:
        return MissingDependencyError("Stream.keras()", "Keras 3", "keras")
    backend = os.environ.get("KERAS_BACKEND")
    chosen = (f"KERAS_BACKEND={backend}" if backend else
              "KERAS_BACKEND is unset: the backend of ~/.keras/keras.json, else tensorflow")
    return MissingDependencyError("Stream.keras()", "Keras 3", "keras", detail=(
        f"Keras is installed but failed to import ({type(_IMPORT_ERROR).__name__}: {_IMPORT_ERROR}); Keras imports "
        f"its backend when imported ({chosen}): set KERAS_BACKEND=torch or KERAS_BACKEND=jax (a backend that is "
        "installed) before keras is first imported, in the shell or with os.environ at the top of the script"))


def _check_workers(workers: Any, use_multiprocessing: Any) -> None:
    """Refuse Keras's own workers: they call ``__getitem__`` out of order and in other
    processes, while the stream serves its batches in its order from one iteration."""
    if use_multiprocessing:
        raise StreamError("stream.keras(use_multiprocessing=True): a stream serves its batches in its own order "
                          "from one iteration, which Keras's worker processes would each copy (every process "
                          "serving the epoch from its start); the stream already reads and decodes ahead on its "
                          "own threads (threads=, prefetch=): leave use_multiprocessing off")
    if workers is not None and workers > 1:
        raise StreamError(f"stream.keras(workers={workers}): a stream serves its batches in its own order, one "
                          "after another, and Keras's workers would take them out of order (an epoch's batches "
                          "going to other epochs); the stream already reads and decodes ahead on its own threads "
                          "(threads=, prefetch=): leave workers at 1")


class KerasDataset(_Base):
    """Batches of a stream (or of a :class:`~pipeline.streaming.mix.Mix`), reshuffled
    every epoch, in passes (see :mod:`pipeline.streaming.keras`).

    ``model.fit`` shuffles the batch *indices* of a PyDataset by default
    (``shuffle=True``): served literally, every index would seek to another group of
    chunks, turning chunk reads back into random reads. The stream already shuffles
    (chunk order and in-buffer mixing), so the k-th call of a pass returns its k-th
    batch, whatever index Keras asks for: each batch is still served once per epoch,
    chunks are read once, and the background prefetch keeps the next batch ready. To
    resume mid-epoch, call ``stream.load_state_dict`` before ``fit``.

    Raises
    ------
    StreamError
        With ``workers`` above 1 or ``use_multiprocessing``: Keras's workers ask for
        batches out of order, and the stream reads ahead on its own threads anyway.
    """

    def __init__(self, stream: Any, *, repeat: bool = False, **kwargs: Any):
        if keras is None:
            raise _keras_error() from _IMPORT_ERROR
        _check_workers(kwargs.get("workers", 1), kwargs.get("use_multiprocessing", False))
        super().__init__(**kwargs)
        self.stream = stream
        self.repeat = bool(repeat)
        self._iter: Iterator[tuple[np.ndarray, ...]] | None = None
        self._start: dict[str, Any] | None = None  # the pass's start point, once it served a batch
        self._taken = 0  # batches served in the pass (over Keras epochs when it goes on)
        # Keras may yet peek (build the model on a batch, then end the "epoch"): only
        # before the first epoch end of a fit; see on_epoch_end.
        self._peek_possible = True
        self._in_order = True  # Keras asked for the pass's indices 0, 1, ... in order
        # Keras's on_epoch_begin / on_epoch_end bracket each epoch (Keras 3.6 and later
        # call both): batches of a pass all served outside such a bracket were looked at,
        # not trained on. Keras on TensorFlow reads the first two batches for their
        # shapes at the start of every fit, evaluate and predict, before the epoch begins.
        self._begins_seen = False
        self._in_keras_epoch = False
        self._outside = 0  # batches of the pass served outside a Keras epoch
        self._moves = -1  # the stream's moves when the pass started (see _follow_moves)
        self._lock = threading.Lock()

    # Keras reads these when it makes its data adapter; set later, they are refused too.
    @property
    def workers(self) -> int:
        """Keras's workers for this dataset: 1 (the stream reads ahead itself)."""
        return self._workers

    @workers.setter
    def workers(self, value: int) -> None:
        _check_workers(value, False)
        self._workers = value

    @property
    def use_multiprocessing(self) -> bool:
        """Whether Keras's workers are processes: never (see :attr:`workers`)."""
        return self._use_multiprocessing

    @use_multiprocessing.setter
    def use_multiprocessing(self, value: bool) -> None:
        _check_workers(None, value)
        self._use_multiprocessing = value

    @property
    def num_batches(self) -> int | None:
        """Batches Keras counts in an epoch: ``len(self)``, or None (endless) with
        ``repeat``, so that ``steps_per_epoch`` alone ends Keras's epochs."""
        return None if self.repeat else len(self)

    def __len__(self) -> int:
        with self._lock:
            self._follow_moves()
            return self._pass_length()

    def _pass_length(self) -> int:
        """Batches of the pending pass, from its start point. A stream whose epoch is
        all served (a state saved after the epoch's last batch, before the stream saw
        its end) has the next epoch pending."""
        served = self._start["batches_served"] if self._start is not None else self._stream_served()
        left = len(self.stream) - int(served)
        return left if left > 0 or self._start is not None else len(self.stream)

    def _stream_served(self) -> int:
        return int(self.stream.state_dict()["batches_served"])

    def _follow_moves(self) -> None:
        """A stream moved by its caller (``set_epoch``, ``load_state_dict``) since the
        pass started: the pass is dropped, and the next one starts where the stream
        now stands."""
        if self._start is not None and getattr(self.stream, "_moves", self._moves) != self._moves:
            self._end_pass()
            self._peek_possible = True  # a resumed stream: a fresh fit (and model) may peek

    def _end_pass(self) -> None:
        if self._iter is not None:
            self._iter.close()  # releases the reader threads
        self._iter, self._start, self._taken, self._in_order, self._outside = None, None, 0, True, 0

    def _restart_pass(self) -> None:
        """Serve the pass again from its start point (the same batches, in order)."""
        start = self._start
        self._iter.close()
        self._iter, self._taken, self._in_order, self._outside = None, 0, True, 0
        self.stream.load_state_dict(start)
        self._moves = getattr(self.stream, "_moves", -1)

    def __getitem__(self, index: int) -> tuple[np.ndarray, ...]:
        with self._lock:
            self._follow_moves()
            if index < 0 or (index >= self._pass_length() and not self.repeat):
                raise IndexError(index)  # (with repeat, Keras counts on across passes)
            if index == 0 and self._taken and self._in_order and self._iter is not None:
                # A new iteration from index 0 after indices 0 .. k-1 in order: evaluate
                # (validation_steps, steps=) serves the same first batches every time.
                self._restart_pass()
            self._in_order = self._in_order and index == self._taken
            if self._start is not None and self._taken >= self._pass_length():
                # Asked for more after a whole pass, with no on_epoch_end between (an
                # iterator made again within an epoch): the next epoch, as after it.
                self._next_epoch()
            if self._iter is None:
                if self._start is None and self._stream_served() >= len(self.stream):
                    self.stream.set_epoch(self.stream.epoch + 1)  # see _pass_length
                if self._start is None:
                    self._start = self.stream.state_dict()
                    if self.repeat and int(self._start["batches_served"]):
                        # A repeat dataset goes on where the stream stands (a fit before
                        # this one left it inside an epoch): on purpose, not a loop that
                        # broke off, so no warning.
                        self.stream.load_state_dict(self._start)
                self._iter = iter(self.stream)
                self._moves = getattr(self.stream, "_moves", -1)
            batch = next(self._iter)
            self._taken += 1
            self._outside += self._begins_seen and not self._in_keras_epoch
            return batch

    def epoch_callback(self) -> "EpochCallback":
        """A Keras callback that makes this dataset serve Keras's epoch ``k`` as the
        stream's epoch ``k`` (``model.fit(ds, callbacks=[ds.epoch_callback(), ...])``):
        ``initial_epoch``, and ``BackupAndRestore`` restarting a fit at the epoch it was
        interrupted in, then serve what an uninterrupted fit served in those epochs
        (see :mod:`pipeline.streaming.keras`)."""
        return EpochCallback(self)

    def keras_epoch_begins(self, epoch: int, steps: int | None = None) -> None:
        """Keras begins its epoch ``epoch`` of ``steps`` steps (``None``: unknown): a
        stream standing at an epoch's start moves to epoch ``epoch``.

        A stream inside an epoch stays: a resumed state, or a pass that Keras epochs
        shorter than the stream's go through, goes on where it stands; with Keras
        epochs of another length than the stream's, Keras's numbers are not the
        stream's epochs and are not followed.
        """
        with self._lock:
            self._follow_moves()
            if self._taken or (steps is not None and steps != len(self.stream)):
                return
            state = self._start if self._start is not None else self.stream.state_dict()
            served, at = int(state["batches_served"]), int(state["epoch"])
            if 0 < served < len(self.stream):
                return
            if (at, served) == (epoch, 0):
                return
            self._end_pass()
            # (at == epoch: that epoch was served whole, and Keras runs it again, on
            # purpose: set_epoch says so, and the stream does not warn of a repeat.)
            self.stream.set_epoch(epoch)
            if int(self.stream.state_dict()["batches_served"]):
                self.stream.load_state_dict({"epoch": epoch, "batches_served": 0})

    def _next_epoch(self) -> None:
        epoch = self.stream.epoch + 1
        self._end_pass()
        self.stream.set_epoch(epoch)

    def on_epoch_begin(self) -> None:
        with self._lock:
            self._begins_seen = self._in_keras_epoch = True

    def on_epoch_end(self) -> None:
        with self._lock:
            self._follow_moves()
            peek, self._peek_possible = self._peek_possible, False
            looked = self._outside == self._taken  # every batch of the pass served outside an epoch
            self._in_keras_epoch = False
            if self._start is None or self._taken == 0:
                # Nothing served: a fit resetting its iterator before it trains, without a
                # peek (its model is built). Its first epochs may be as short as a peek.
                return
            length = self._pass_length()
            if (self._taken <= PEEK_BATCHES and peek) or looked:
                # Keras looked at the first batches (to build the model, or on TensorFlow
                # for their shapes) and trains from the pass's start next. Told by the
                # batches served outside an epoch, or else only before the first epoch
                # end: later, epochs of so few steps go on with the pass.
                self._restart_pass()
            elif self._taken >= length:
                self._next_epoch()
            # else: steps_per_epoch ended Keras's epoch inside the pass, which goes on.


class EpochCallback(_Callback):
    """Tells a :class:`KerasDataset` the epoch Keras begins (see
    :meth:`KerasDataset.epoch_callback`)."""

    def __init__(self, dataset: KerasDataset):
        super().__init__()
        self.dataset = dataset

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        steps = (getattr(self, "params", None) or {}).get("steps")
        self.dataset.keras_epoch_begins(epoch, steps)
