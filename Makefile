# The two commands of the README: `make demo` and `make test`.
# Both create .venv on first use and (re)install the project when pyproject.toml changes.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# torch is pinned to the CPU wheel this machine provides; an unpinned torch pulls
# gigabytes of CUDA wheels.
TORCH_PIN := torch==2.13.0
export KERAS_BACKEND := torch

.PHONY: demo test install bench clean bytecode

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet $(TORCH_PIN)
	$(BIN)/pip install --quiet -e '.[dev]' $(TORCH_PIN)
	touch $(STAMP)

install: $(STAMP)

# The package's bytecode, written once: with PYTHONDONTWRITEBYTECODE set (as on these
# machines) every process (each dask worker, each DataLoader worker) would otherwise
# compile the package's modules again on import. Only changed files are compiled.
bytecode: $(STAMP)
	$(BIN)/python -m compileall -q pipeline

demo: $(STAMP) bytecode
	$(BIN)/pipeline demo-data data/raw --per-instrument --rows-per-day 200000
	$(BIN)/pipeline run configs/orderbook.yaml --set output.overwrite=true
	$(BIN)/python examples/train_keras.py data/orderbook.zarr
	$(BIN)/python examples/train_torch.py data/orderbook.zarr
	$(BIN)/python examples/deeplob.py

# The test files spread over a process per core (at most 4), each file's tests in one
# process (--dist loadfile: a module's fixtures are built once). The slowest 15 are
# listed at the end: the suite is kept under 10 minutes on 2 cores.
test: $(STAMP) bytecode
	$(BIN)/python -m pytest -q -n auto --maxprocesses 4 --dist loadfile --durations=15

bench: $(STAMP) bytecode
	for f in benchmarks/bench_*.py; do $(BIN)/python $$f || exit 1; done

clean:
	rm -rf $(VENV) data .pytest_cache .hypothesis
