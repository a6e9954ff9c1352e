"""stream.keras() under a real model.fit: every sample the model trains on is counted
(x[i] = i in every cell), through Keras's peek before the first epoch, a resume, epochs
shorter than the stream's, validation, and Keras's own workers (refused)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap

os.environ.setdefault("KERAS_BACKEND", "torch")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import pipeline  # noqa: E402
from pipeline.errors import StreamError  # noqa: E402

KW = dict(batch_size=100, seed=4, buffer_chunks=2)


class Seen(keras.layers.Layer):
    """Passes its input on, logging the sample ids of each batch the model runs on."""

    def __init__(self, log: list, **kwargs):
        super().__init__(**kwargs)
        self.sink = log.append  # a list set on a layer would be tracked as a copy

    def call(self, x, training=None):
        try:
            ids = keras.ops.convert_to_numpy(x)[:, 0, 0].astype(np.int64)
        except Exception:  # a symbolic tensor, while Keras builds the model
            return x
        self.sink(("train" if training else "test", ids.tolist()))
        return x


class Epochs(keras.callbacks.Callback):
    def __init__(self, log: list):
        super().__init__()
        self.log = log

    def on_epoch_begin(self, epoch, logs=None):
        self.log.append(("epoch", epoch))


def _model(log: list):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input(shape=(4, 3)), Seen(log), keras.layers.Flatten(), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse", run_eagerly=True)
    return model


def _per_epoch(log: list, kind: str = "train") -> list[list[int]]:
    """The ids the model ran on (``train`` or ``test``) in each Keras epoch of a fit."""
    out: list[list[int]] = []
    for what, value in log:
        if what == "epoch":
            out.append([])
        elif what == kind and out:
            out[-1].extend(value)
    return out


def _order(store, epoch: int, skip: int = 0) -> list[int]:
    s = pipeline.stream(store, **KW)
    s.set_epoch(epoch)
    return np.concatenate([np.array(y) for _, y in s][skip:]).tolist()


def test_fit_trains_on_every_sample_once_per_epoch_after_keras_peeks(store):
    train = pipeline.stream(store, **KW)
    val = pipeline.stream(store, batch_size=300, shuffle=False)
    ds = train.keras()
    asked = []

    class Counted(type(ds)):
        def __getitem__(self, index):
            asked.append(index)
            return super().__getitem__(index)

    ds.__class__ = Counted
    log: list = []
    _model(log).fit(ds, validation_data=val.keras(), epochs=2, verbose=0, callbacks=[Epochs(log)])
    assert len(asked) == 1 + 2 * len(train)  # Keras looked at one batch before the first epoch
    # Each Keras epoch is the stream's epoch, whole and in its order: the batch Keras
    # looked at is served again, from the epoch's start, not skipped.
    assert _per_epoch(log) == [_order(store, 0), _order(store, 1)]
    assert [sorted(ids) for ids in _per_epoch(log, "test")] == [list(range(1000))] * 2
    assert train.epoch == 2


def _tensorflow_fit(ds, epochs: int) -> list[list[int]]:
    """The calls Keras on TensorFlow makes of a PyDataset in one ``fit`` (its
    ``PyDatasetAdapter`` and ``TFEpochIterator``, TensorFlow not needed): the first two
    batches read for their shapes when the epoch iterator is made, before any epoch
    begins (``get_tf_dataset``); ``reset()``, which ends an epoch; then each epoch
    between ``on_epoch_begin`` and ``on_epoch_end``, its indices shuffled. Returns the
    ids trained on in each epoch."""
    from keras.src.trainers.data_adapters.py_dataset_adapter import PyDatasetAdapter

    adapter = PyDatasetAdapter(ds, shuffle=True)
    [adapter._standardize_batch(ds[i]) for i in range(2)]  # get_tf_dataset's look
    adapter.on_epoch_end()  # epoch_iterator.reset()
    out = []
    for _ in range(epochs):
        adapter.on_epoch_begin()
        out.append(np.concatenate([np.asarray(y) for _, y in adapter.get_numpy_iterator()]).tolist())
        adapter.on_epoch_end()
    return out


def test_each_fit_on_tensorflow_trains_whole_epochs_after_its_look_at_two_batches(store):
    """Keras on TensorFlow reads two batches for their shapes at the start of every fit
    (of evaluate and predict too), not only the first: a second fit on the same
    adapter skipped the stream epoch's first two batches, and every later epoch ran two
    batches into the next."""
    s = pipeline.stream(store, **KW)
    ds = s.keras()
    assert _tensorflow_fit(ds, 1) == [_order(store, 0)]
    assert _tensorflow_fit(ds, 2) == [_order(store, 1), _order(store, 2)]
    assert (s.state_dict()["epoch"], s.state_dict()["batches_served"]) == (3, 0)
    # Epochs of two steps still go on with the stream's epoch (no look to tell apart).
    log: list = []
    _model(log).fit(s.keras(repeat=True), epochs=3, steps_per_epoch=2, verbose=0, callbacks=[Epochs(log)])
    assert sum(_per_epoch(log), []) == _order(store, 3)[:600]


def test_a_resumed_fit_finishes_the_interrupted_epoch_then_whole_epochs(store):
    first = pipeline.stream(store, **KW)
    it = iter(first)
    head = np.concatenate([np.array(next(it)[1]) for _ in range(5)]).tolist()
    state = first.state_dict()
    it.close()
    resumed = pipeline.stream(store, **KW)
    resumed.load_state_dict(state)
    ds = resumed.keras()
    assert len(ds) == len(resumed) - 5
    log: list = []
    model = _model(log)
    model.fit(ds, epochs=1, verbose=0, callbacks=[Epochs(log)])  # Keras peeks first: a new model
    assert _per_epoch(log) == [_order(store, 0, skip=5)]
    assert sorted(head + _per_epoch(log)[0]) == list(range(1000))
    assert resumed.epoch == 1 and len(ds) == len(resumed)
    log.clear()
    model.fit(ds, epochs=2, verbose=0, callbacks=[Epochs(log)])  # whole epochs, in another fit
    assert _per_epoch(log) == [_order(store, 1), _order(store, 2)]


def test_epochs_shorter_than_the_stream_go_on_with_its_epoch(store):
    s = pipeline.stream(store, **KW)
    log: list = []
    with pytest.warns(UserWarning, match="ran out of data"):  # Keras's own, when its count ends a pass
        _model(log).fit(s.keras(), epochs=4, steps_per_epoch=6, verbose=0, callbacks=[Epochs(log)])
    per_epoch = _per_epoch(log)
    assert [len(ids) for ids in per_epoch] == [600, 400, 600, 400]
    # the Keras epochs take the stream's epochs 0 and 1 in order, each sample once in each
    assert sum(per_epoch, []) == _order(store, 0) + _order(store, 1)


def test_with_repeat_keras_epochs_go_on_across_the_streams_epochs(store, recwarn):
    """stream.keras(repeat=True): every Keras epoch takes steps_per_epoch batches, going
    on into the next stream epoch where one ends (without it: 6, 4, 6, 4 steps and
    Keras's "ran out of data"); the stream's epochs follow one another, each sample once
    in each."""
    s = pipeline.stream(store, **KW)
    log: list = []
    ds = s.keras(repeat=True)
    assert ds.num_batches is None and len(ds) == 10
    _model(log).fit(ds, epochs=4, steps_per_epoch=6, verbose=0, callbacks=[Epochs(log)])
    per_epoch = _per_epoch(log)
    assert [len(ids) for ids in per_epoch] == [600, 600, 600, 600]
    assert sum(per_epoch, []) == _order(store, 0) + _order(store, 1) + _order(store, 2)[:400]
    assert not [w for w in recwarn if "ran out of data" in str(w.message)]


def test_a_second_repeat_fit_goes_on_where_the_first_left_the_stream_without_a_warning(store, recwarn):
    # A new repeat dataset of the same stream, for another fit: it goes on inside the
    # stream epoch the first fit stopped in, on purpose (it warned of a broken-off loop).
    s = pipeline.stream(store, **KW)
    log: list = []
    model = _model(log)
    model.fit(s.keras(repeat=True), epochs=1, steps_per_epoch=6, verbose=0, callbacks=[Epochs(log)])
    model.fit(s.keras(repeat=True), epochs=2, steps_per_epoch=6, verbose=0, callbacks=[Epochs(log)])
    assert sum(_per_epoch(log), []) == _order(store, 0) + _order(store, 1)[:800]
    assert not [str(w.message) for w in recwarn if issubclass(w.category, RuntimeWarning)]


def test_initial_epoch_serves_kerass_epoch_with_the_epoch_callback(store):
    s = pipeline.stream(store, **KW)
    ds = s.keras()
    log: list = []
    _model(log).fit(ds, initial_epoch=2, epochs=4, verbose=0, callbacks=[ds.epoch_callback(), Epochs(log)])
    # what an uninterrupted fit trains on in its epochs 2 and 3
    assert _per_epoch(log) == [_order(store, 2), _order(store, 3)]
    assert s.epoch == 4


class Preempted(Exception):
    pass


class Preempt(keras.callbacks.Callback):
    """Stops a fit inside epoch 1, as a lost node would."""

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if self.epoch == 1 and batch == 3:
            raise Preempted


@pytest.mark.parametrize("save_freq", ["epoch", 2])
def test_backup_and_restore_restarts_the_interrupted_epoch_in_its_order(store, tmp_path, save_freq):
    backup = str(tmp_path / f"backup-{save_freq}")

    def fit(extra):
        log: list = []
        ds = pipeline.stream(store, **KW).keras()
        callbacks = [keras.callbacks.BackupAndRestore(backup, save_freq=save_freq), ds.epoch_callback(),
                     Epochs(log), *extra]
        _model(log).fit(ds, epochs=3, verbose=0, callbacks=callbacks)
        return _per_epoch(log)

    with pytest.raises(Preempted):
        fit([Preempt()])
    # A new process: Keras restarts epoch 1 whole (from the weights of its backup), and
    # the stream serves epochs 1 and 2 as the uninterrupted fit did.
    assert fit([]) == [_order(store, 1), _order(store, 2)]


def test_the_epoch_callback_leaves_a_stream_inside_an_epoch_where_it_stands(store):
    resumed = pipeline.stream(store, **KW)
    resumed.load_state_dict({"epoch": 3, "batches_served": 4})
    ds = resumed.keras()
    log: list = []
    model = _model(log)
    model.fit(ds, epochs=1, verbose=0, callbacks=[ds.epoch_callback(), Epochs(log)])
    assert _per_epoch(log) == [_order(store, 3, skip=4)]  # the rest of the resumed epoch, not epoch 0
    log.clear()
    model.fit(ds, initial_epoch=4, epochs=5, verbose=0, callbacks=[ds.epoch_callback(), Epochs(log)])
    assert _per_epoch(log) == [_order(store, 4)]
    # Keras epochs of another length than the stream's are not its epochs: not followed
    # an epoch served whole that Keras runs again (a state saved after its last batch)
    done = pipeline.stream(store, **KW)
    done.load_state_dict({"epoch": 2, "batches_served": 10})
    again = done.keras()
    again.keras_epoch_begins(2, 10)
    assert len(again) == 10 and again[0][1].tolist() == _order(store, 2)[:100]
    short = pipeline.stream(store, **KW).keras()
    log.clear()
    _model(log).fit(short, initial_epoch=1, epochs=3, steps_per_epoch=5, verbose=0,
                    callbacks=[short.epoch_callback(), Epochs(log)])
    assert sum(_per_epoch(log), []) == _order(store, 0)


def test_a_mix_through_fit(tmp_path):
    from tests.streaming.conftest import make_store

    a, b = make_store(tmp_path / "a.zarr", n=300), make_store(tmp_path / "b.zarr", n=200)
    m = pipeline.mix([a, b], weights=[1, 1], batch_size=50, seed=2)
    want = np.concatenate([np.array(y) for _, y in pipeline.mix([a, b], weights=[1, 1], batch_size=50, seed=2)])
    log: list = []
    _model(log).fit(m.keras(), epochs=1, verbose=0, callbacks=[Epochs(log)])
    assert _per_epoch(log) == [want.tolist()]
    assert m.epoch == 1


def test_the_pass_protocol(store):
    """What Keras's calls do, one by one: a pass starts where the stream stands; an
    epoch end after the whole pass moves to the next epoch, after a peek starts the pass
    again (once), and after part of it goes on; a stream moved by its caller starts a
    new pass where it now stands."""
    s = pipeline.stream(store, **KW)
    ds = s.keras()
    # Indices out of order, as Keras's shuffled ones: the index does not choose the batch
    # (index 0 again after 0, 1, ... in order is a new iteration: see the next test).
    ids = lambda: ds[len(ds) - 1][1].tolist()  # noqa: E731
    epoch0 = [_order(store, 0)[i * 100:(i + 1) * 100] for i in range(10)]
    assert ids() == epoch0[0]
    ds.on_epoch_end()  # a peek: the pass starts again
    assert [ids() for _ in range(3)] == epoch0[:3]
    ds.on_epoch_end()  # steps_per_epoch=3: the pass goes on
    assert len(ds) == 10 and s.epoch == 0
    assert [ids() for _ in range(7)] == epoch0[3:]
    ds.on_epoch_end()  # the whole pass: the next epoch
    assert s.epoch == 1 and ids() == _order(store, 1)[:100]
    s.load_state_dict({**s.state_dict(), "epoch": 3, "batches_served": 7})
    assert len(ds) == 3 and ids() == _order(store, 3)[700:800]
    assert ids() == _order(store, 3)[800:900] and ids() == _order(store, 3)[900:]
    assert ids() == _order(store, 4)[:100]  # asked for more with no epoch end: the next epoch
    # a state saved after an epoch's last batch, before the stream saw its end
    t = pipeline.stream(store, **KW)
    t.load_state_dict({"epoch": 2, "batches_served": 10})
    other = t.keras()
    assert len(other) == 10 and other[0][1].tolist() == _order(store, 3)[:100]


def test_index_zero_after_indices_in_order_serves_the_pass_again(store):
    """Keras iterating the dataset again from index 0 (evaluate, validation_steps) gets
    the pass's first batches again; indices out of order (shuffled training) never do."""
    s = pipeline.stream(store, **KW)
    ds = s.keras()
    epoch0 = [_order(store, 0)[i * 100:(i + 1) * 100] for i in range(10)]
    assert [ds[i][1].tolist() for i in range(4)] == epoch0[:4]
    assert [ds[i][1].tolist() for i in range(2)] == epoch0[:2]  # a new iteration
    assert [ds[i][1].tolist() for i in (5, 0, 3)] == epoch0[2:5]  # shuffled: the pass goes on
    assert ds[0][1].tolist() == epoch0[5]


@pytest.mark.parametrize("kwargs", [dict(workers=2), dict(workers=2, use_multiprocessing=True),
                                    dict(use_multiprocessing=True)])
def test_keras_workers_are_refused(store, kwargs):
    s = pipeline.stream(store, **KW)
    with pytest.raises(StreamError, match="already reads and decodes ahead on its own threads"):
        s.keras(**kwargs)
    ds = s.keras(workers=1, max_queue_size=4)
    with pytest.raises(StreamError, match=r"workers=3"):
        ds.workers = 3
    with pytest.raises(StreamError, match="use_multiprocessing"):
        ds.use_multiprocessing = True


_JAX_SCRIPT = """
import json, os
import numpy as np, keras, jax, pipeline
if {ahead}:  # the trainer's path on an accelerator: each batch is taken one step ahead
    jax.default_backend = lambda: "gpu"
store, kw = {store!r}, dict(batch_size=100, seed=4, buffer_chunks=2)
def order(epoch, skip=0):
    s = pipeline.stream(store, **kw); s.set_epoch(epoch)
    return np.concatenate([np.array(y) for _, y in s][skip:]).tolist()
log = []
class Seen(keras.layers.Layer):
    def call(self, x, training=None):
        try:
            ids = keras.ops.convert_to_numpy(x)[:, 0, 0].astype(np.int64).tolist()
        except Exception:
            return x
        if training:
            log.extend(ids)
        return x
first = pipeline.stream(store, **kw)
it = iter(first)
[next(it) for _ in range(5)]
state = first.state_dict(); it.close()
s = pipeline.stream(store, **kw); s.load_state_dict(state)
model = keras.Sequential([keras.Input(shape=(4, 3)), Seen(), keras.layers.Flatten(), keras.layers.Dense(1)])
model.compile(optimizer="adam", loss="mse", run_eagerly=True)
model.fit(s.keras(), epochs=1, verbose=0)
resumed = log == order(0, skip=5)
log.clear()
model.fit(s.keras(), epochs=2, verbose=0)
print(json.dumps({{"backend": keras.backend.backend(), "resumed": resumed, "whole": log == order(1) + order(2)}}))
"""


@pytest.mark.parametrize("ahead", [False, True], ids=["cpu", "one-batch-ahead"])
def test_resume_on_jax(store, ahead):
    """On JAX; on an accelerator Keras's peek takes two batches (the one it looks at and
    the next, moved to the device ahead), which must not be skipped either."""
    if importlib.util.find_spec("jax") is None:
        pytest.skip("jax is not installed")
    env = {**os.environ, "KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu"}
    script = textwrap.dedent(_JAX_SCRIPT.format(store=store, ahead=ahead))
    result = subprocess.run([sys.executable, "-c", script],
                            capture_output=True, text=True, timeout=240, env=env)
    assert result.returncode == 0, result.stderr[-6000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == {"backend": "jax", "resumed": True, "whole": True}


# -- what the Keras recipe says ---------------------------------------------------------------

RECIPE = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "pages", "recipes", "keras.md")
SHUFFLE_IGNORED = r"`shuffle=True` was passed, but will be ignored"


def _recipe_block(containing: str) -> str:
    """The Keras recipe's python code block that holds ``containing``."""
    import re

    text = open(RECIPE, encoding="utf-8").read()
    blocks = [b for b in re.findall(r"```python[^\n]*\n(.*?)```", text, flags=re.S) if containing in b]
    assert len(blocks) == 1, f"the Keras recipe has {len(blocks)} python blocks with {containing!r}"
    return blocks[0]


def test_the_recipes_repeat_fit_gives_keras_no_shuffle_to_ignore(store):
    """Keras warns that it ignores fit's default shuffle=True on an endless PyDataset
    (repeat=True), as it does on any; the recipe passes shuffle=False, and following it
    warns of nothing (that warning is an error here)."""
    import warnings

    model = _model([])
    with pytest.warns(UserWarning, match=SHUFFLE_IGNORED):
        model.fit(pipeline.stream(store, **KW).keras(repeat=True), steps_per_epoch=2, epochs=1, verbose=0)
    train = pipeline.stream(store, **KW)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=SHUFFLE_IGNORED)
        exec(compile(_recipe_block("keras(repeat=True)"), "keras.md", "exec"), {"train": train, "model": model})
    # 2 Keras epochs of 50 steps: the stream's 10-batch epochs 0 to 9, whole, and on to 10
    assert train.state_dict()["epoch"] == 10 and train.state_dict()["batches_served"] == 0


# -- sample and class weights -----------------------------------------------------------------


def _weighted_store(path, y: np.ndarray, w: np.ndarray) -> str:
    from pipeline.storage import write

    x = np.ones((y.size, 4, 3), np.float32)
    write(path, {"x": x, "y": y.astype(np.float32), "w": w.astype(np.float32)}, chunk_samples=32, progress=False)
    return str(path)


def _frozen_loss(store, arrays, **fit_kwargs) -> float:
    """The loss one fit epoch reports for a model that predicts 0 and does not learn."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input(shape=(4, 3)), keras.layers.Flatten(),
                              keras.layers.Dense(1, kernel_initializer="zeros")])
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=0.0), loss="mse")
    s = pipeline.stream(store, arrays=arrays, batch_size=20, seed=1, buffer_chunks=2)
    return float(model.fit(s.keras(), epochs=1, verbose=0, **fit_kwargs).history["loss"][-1])


def test_a_third_array_is_keras_sample_weight(tmp_path):
    """arrays=("x", "y", "w"): Keras weighs each sample's loss by w. Samples of weight 0
    with labels far off leave the loss as it is with those labels at 0; the loss is
    numpy's sum(w * y**2) / N for a model that predicts 0 (Keras's mean over a batch
    divides by its size)."""
    n = 200
    rng = np.random.default_rng(0)
    y = rng.normal(size=n)
    w = rng.uniform(0.5, 2.0, size=n)
    off = rng.choice(n, size=40, replace=False)
    w[off] = 0.0
    far = y.copy()
    far[off] = 1e3
    near = y.copy()
    near[off] = 0.0
    a = _weighted_store(tmp_path / "far.zarr", far, w)
    b = _weighted_store(tmp_path / "near.zarr", near, w)
    weighted = _frozen_loss(a, ("x", "y", "w"))
    assert weighted == pytest.approx(_frozen_loss(b, ("x", "y", "w")), rel=1e-5)
    assert weighted == pytest.approx(float(np.sum(w * far**2) / n), rel=1e-5)
    assert _frozen_loss(a, ("x", "y")) == pytest.approx(float(np.mean(far**2)), rel=1e-5)  # without w


def test_class_weight_weighs_each_sample_by_its_label(tmp_path):
    """fit(class_weight=...) on (x, y) batches: class 1 at weight 0 leaves the loss of the
    class 0 samples alone, sum(y**2 over class 0) / N for a model that predicts 0."""
    y = np.arange(100) % 2
    path = _weighted_store(tmp_path / "c.zarr", y, np.ones(100))
    assert _frozen_loss(path, ("x", "y"), class_weight={0: 1.0, 1: 0.0}) == 0.0  # class 0 has y = 0
    assert _frozen_loss(path, ("x", "y"), class_weight={0: 0.0, 1: 3.0}) == pytest.approx(3.0 * 50 / 100)
    with pytest.raises(ValueError, match="class_weight.*sample_weight"):
        _frozen_loss(path, ("x", "y", "w"), class_weight={0: 1.0, 1: 1.0})


_KERAS_UNUSABLE = """
import sys
if {hide}:
    sys.modules["keras"] = None  # as without Keras installed: import keras fails, find_spec finds none
import pipeline
from pipeline.errors import MissingDependencyError
try:
    pipeline.stream({store!r}, batch_size=100).keras()
except MissingDependencyError as exc:
    print(exc)
"""


@pytest.mark.parametrize("hide", [False, True], ids=["backend-missing", "not-installed"])
def test_keras_installed_without_its_backend_is_told_apart_from_keras_not_installed(store, hide):
    """Keras imports its backend on import (KERAS_BACKEND, else ~/.keras/keras.json's,
    tensorflow by default): installed, it fails to import where that backend is not, and
    the error says so, with Python's, and names the backends to set, not "install Keras".
    KERAS_BACKEND=tensorflow stands for a keras.json naming it, whatever the user's says."""
    if importlib.util.find_spec("tensorflow") is not None:
        pytest.skip("tensorflow is installed: Keras imports with it")
    env = {**os.environ, "KERAS_BACKEND": "tensorflow"}
    result = subprocess.run([sys.executable, "-c", _KERAS_UNUSABLE.format(hide=hide, store=str(store))],
                            capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stderr[-6000:]
    got = result.stdout.strip()
    if hide:
        assert got == "Stream.keras() depends on Keras 3. Please install it with pip install 'pipeline[keras]'"
        return
    assert got.startswith("Stream.keras(): Keras is installed but failed to import (ModuleNotFoundError: No module "
                          "named 'tensorflow'); "), got
    assert "KERAS_BACKEND=tensorflow" in got and "set KERAS_BACKEND=torch or KERAS_BACKEND=jax" in got
    assert "Please install" not in got
