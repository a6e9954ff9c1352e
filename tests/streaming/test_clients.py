"""Real clients, each in a process of its own: torchrun with DDP, Keras on JAX and on
torch, and a bare ``import pipeline`` that must not import a framework.

Labels hold the sample index (``y = index``, see ``tests/streaming/conftest.py``), so the
clients report which samples they saw and the test counts them.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import pipeline
from pipeline.storage import write
from tests.streaming.conftest import make_store

BIN = Path(sys.executable).parent
B_TAG = 100_000  # labels of a second store: B_TAG + sample index
REPO = Path(__file__).resolve().parents[2]

# One process per rank and two DataLoader workers each, on a machine of 2 cores: no
# thread pools beyond what the stream starts.
_ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}

DDP_SCRIPT = '''
"""DDP over stream.torch() and over a mix, gloo, two DataLoader workers per rank."""
import json
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader

import pipeline


def train(model, opt, loader):
    """One epoch; returns the labels seen, batch by batch."""
    seen = []
    for xb, yb in loader:
        loss = nn.functional.mse_loss(model(xb).squeeze(-1), yb.float())
        opt.zero_grad()
        loss.backward()  # DDP all-reduces the gradients: a rank short of a batch would hang here
        opt.step()
        seen.append(yb.tolist())
    return seen, float(loss)


def main(store_a, store_b, out, epochs=2):
    dist.init_process_group("gloo")  # torchrun sets RANK, WORLD_SIZE, MASTER_ADDR
    rank = dist.get_rank()
    # rank and world_size come from torch.distributed
    stream = pipeline.stream(store_a, split="train", batch_size=48, seed=0)
    loader = DataLoader(stream.torch(), batch_size=None, num_workers=2)
    torch.manual_seed(0)  # the same initial weights on every rank
    model = nn.parallel.DistributedDataParallel(
        nn.Sequential(nn.Flatten(), nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 1)))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    report = {"rank": rank, "world": dist.get_world_size(), "len": len(stream), "epochs": [], "losses": []}
    for epoch in range(epochs):
        stream.set_epoch(epoch)  # a new shuffle, the same on every rank
        seen, loss = train(model, opt, loader)
        report["epochs"].append(seen)
        report["losses"].append(loss)
    mixed = pipeline.mix([store_a, store_b], weights=[0.7, 0.3], batch_size=40, seed=1)
    report["mix_len"] = len(mixed)
    report["mix_counts"] = list(mixed.counts)
    report["mix"], _ = train(model, opt, DataLoader(mixed.torch(), batch_size=None, num_workers=2))
    with open(f"{out}/rank{rank}.json", "w") as f:
        json.dump(report, f)
    dist.barrier()  # every rank done with gloo before any tears its threads down
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:4])
'''


@pytest.mark.slow  # 8 to 21 s measured on 2 busy cores: 2 ranks x 2 DataLoader workers
def test_torchrun_ddp_serves_every_sample_once_with_equal_steps(tmp_path):
    torchrun = BIN / "torchrun"
    if not torchrun.exists():
        pytest.skip(f"no torchrun next to {sys.executable}")
    store_a = make_store(tmp_path / "a.zarr", n=1000, chunk=64)
    store_b = _offset_store(tmp_path / "b.zarr", n=300, offset=B_TAG)
    script = tmp_path / "train_ddp.py"
    script.write_text(DDP_SCRIPT)
    cmd = [str(torchrun), "--standalone", "--nproc_per_node", "2", str(script), store_a, store_b, str(tmp_path)]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=_ENV, cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["world"] for r in reports] == [2, 2]
    for epoch in range(2):
        steps = [len(r["epochs"][epoch]) for r in reports]
        assert steps[0] == steps[1] == reports[0]["len"] == reports[1]["len"], steps
        ids = sorted(i for r in reports for batch in r["epochs"][epoch] for i in batch)
        assert ids == list(range(1000)), f"epoch {epoch}: not every sample exactly once"
    assert all(np.isfinite(r["losses"]).all() for r in reports)
    # The mix: equal steps on both ranks, the same source at every step, its counts per
    # source. Store a (c_a = its length) serves every sample once across the ranks; store
    # b cycles: its epoch 0 whole and the first batches of its epoch 1 on each rank,
    # as its own stream serves them.
    assert len(reports[0]["mix"]) == len(reports[1]["mix"]) == reports[0]["mix_len"]
    sources = [[int(batch[0] >= B_TAG) for batch in r["mix"]] for r in reports]
    assert sources[0] == sources[1]
    counts = reports[0]["mix_counts"]
    assert [sources[0].count(0), sources[0].count(1)] == counts
    a_ids = sorted(i for r in reports for batch in r["mix"] for i in batch if i < B_TAG)
    assert a_ids == list(range(1000))
    want_b = []
    for rank in range(2):
        s = pipeline.stream(store_b, batch_size=40, seed=1, rank=rank, world_size=2)
        cycle = [np.array(y) for _, y in s]
        s.set_epoch(1)
        cycle += [np.array(y) for _, y in s]
        want_b += np.concatenate(cycle[: counts[1]]).tolist()
    b_ids = sorted(i for r in reports for batch in r["mix"] for i in batch if i >= B_TAG)
    assert b_ids == sorted(want_b) and len(set(b_ids)) == 300


def _offset_store(path: Path, n: int, offset: int) -> str:
    """Like ``make_store`` (x[i] = y[i] in every cell), with labels ``offset + index``."""
    y = offset + np.arange(n, dtype=np.int64)
    write(path, {"x": np.broadcast_to(y[:, None, None].astype(np.float32), (n, 4, 3)).copy(), "y": y},
          chunk_samples=64, progress=False)
    return str(path)


def _keras_script(store: str, epochs: int) -> str:
    return textwrap.dedent(f"""
        import json, sys
        import keras
        import numpy as np
        import pipeline

        s = pipeline.stream({store!r}, batch_size=50, seed=0)
        steps = []

        class Count(keras.callbacks.Callback):
            def on_epoch_begin(self, epoch, logs=None):
                steps.append(0)

            def on_train_batch_end(self, batch, logs=None):
                steps[-1] += 1

        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input(shape=(4, 3)), keras.layers.Flatten(), keras.layers.Dense(8),
                                  keras.layers.Dense(1)])
        model.compile(optimizer="adam", loss="mse")
        history = model.fit(s.keras(), epochs={epochs}, verbose=0, callbacks=[Count()])
        print(json.dumps({{"backend": keras.backend.backend(), "loss": history.history["loss"],
                          "steps": steps, "len": len(s), "torch": "torch" in sys.modules}}))
    """)


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_keras_fit_on_backend(store, backend):
    if importlib.util.find_spec(backend) is None:
        pytest.skip(f"{backend} is not installed (pip install 'jax[cpu]' for the JAX backend)")
    env = {**_ENV, "KERAS_BACKEND": backend, "JAX_PLATFORMS": "cpu"}
    result = subprocess.run([sys.executable, "-c", _keras_script(store, 2)], capture_output=True, text=True,
                            timeout=240, env=env)
    assert result.returncode == 0, result.stderr[-6000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["backend"] == backend
    assert len(report["loss"]) == 2 and np.isfinite(report["loss"]).all()
    assert report["loss"][1] < report["loss"][0]  # it trained
    assert report["steps"] == [report["len"], report["len"]] == [20, 20]
    if backend == "jax":
        assert not report["torch"], "Keras on JAX over stream.keras() imported torch"


_IMPORT_SCRIPT = """
import time
start = time.perf_counter()
import sys
import pipeline
s = {call}
batch = next(iter(s))
took = time.perf_counter() - start
loaded = sorted(m for m in ("torch", "keras", "jax", "tensorflow", "zarr", "dask") if m in sys.modules)
print(f"{{took:.3f}} {{','.join(loaded) or '-'}} {{len(batch[0])}}")
"""


@pytest.mark.parametrize("call", [
    "pipeline.stream({a!r}, batch_size=64, seed=0)",
    "pipeline.mix([{a!r}, {b!r}], weights=[2, 1], batch_size=64, seed=0)",
], ids=["stream", "mix"])
def test_streaming_imports_no_framework(tmp_path, call):
    """A numpy loop, or Keras on JAX, must not pay for importing torch: the stream asks
    torch.distributed for the rank only when torch is already imported. Nor for zarr or
    dask: a local store's metadata is read from its zarr.json files."""
    a = make_store(tmp_path / "a.zarr")
    b = make_store(tmp_path / "b.zarr", n=300)
    code = _IMPORT_SCRIPT.format(call=call.format(a=a, b=b))
    env = {k: v for k, v in _ENV.items() if k != "KERAS_BACKEND"}
    times = []
    for _ in range(3):  # the first run warms the page cache; the time is printed, not asserted
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                                env=env, cwd=tmp_path)
        assert result.returncode == 0, result.stderr[-4000:]
        took, loaded, rows = result.stdout.split()
        assert loaded == "-", f"importing pipeline and streaming a batch imported {loaded}"
        assert int(rows) == 64
        times.append(float(took))
    print(f"import pipeline + first batch ({call.split('(')[0]}): {', '.join(f'{t:.3f}' for t in times)} s")
