"""Deploy files parse, and their images, commands and versions agree with pyproject.toml."""

from __future__ import annotations

import ast
import re
import shlex
import tomllib
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
VERSION = PYPROJECT["project"]["version"]
IMAGE = f"pipeline:{VERSION}"


def pins() -> dict[str, str]:
    out = {}
    for line in (DEPLOY / "requirements.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            req = Requirement(line)
            (spec,) = req.specifier
            assert spec.operator == "==", f"{line}: every runtime dependency is pinned exactly"
            out[req.name.lower()] = spec.version
    return out


def images(node) -> list[str]:
    found = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "image" and isinstance(value, str):
                found.append(value)
            elif key == "image" and isinstance(value, dict):  # helm: repository + tag
                found.append(f"{value['repository']}:{value['tag']}")
            else:
                found += images(value)
    elif isinstance(node, list):
        for value in node:
            found += images(value)
    return found


def yaml_files() -> list[Path]:
    return sorted(DEPLOY.rglob("*.yml")) + sorted(DEPLOY.rglob("*.yaml"))


@pytest.mark.parametrize("path", yaml_files(), ids=lambda p: str(p.relative_to(DEPLOY)))
def test_every_yaml_file_parses_and_uses_the_project_image(path):
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    assert docs
    found = [img for d in docs for img in images(d)]
    assert found, f"{path}: no image"
    assert set(found) == {IMAGE}, f"{path}: images {set(found)} != {IMAGE}"


def test_pins_satisfy_pyproject():
    pinned = pins()
    deps = [Requirement(d) for d in PYPROJECT["project"]["dependencies"]]
    for dep in deps:
        name = dep.name.lower()
        assert name in pinned, f"deploy/requirements.txt does not pin {name}"
        assert dep.specifier.contains(pinned[name]), f"{name}=={pinned[name]} violates {dep}"
    assert pinned["dask"] == pinned["distributed"], "dask and distributed are released together"
    # Client, scheduler and workers share the image, so they share these exact versions;
    # the pins must also be ones this project accepts (checked above).


def test_dockerfile_installs_the_pins_on_the_supported_python():
    text = (DEPLOY / "Dockerfile").read_text()
    base = re.search(r"^FROM python:(\d+\.\d+)", text, re.M)
    assert base, "Dockerfile must start from an official python image"
    low = PYPROJECT["project"]["requires-python"].removeprefix(">=")
    assert tuple(map(int, base.group(1).split("."))) >= tuple(map(int, low.split(".")))
    assert "pip install -r deploy/requirements.txt" in text
    assert "-c deploy/requirements.txt" in text  # the project install cannot move a pin
    assert "EXPOSE 8786 8787" in text


def test_compose_wires_scheduler_workers_and_a_job_on_a_shared_volume():
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    services = compose["services"]
    assert set(services) >= {"scheduler", "worker", "job"}
    assert {"8786:8786", "8787:8787"} <= set(services["scheduler"]["ports"])
    assert services["worker"]["command"][:3] == ["dask", "worker", "tcp://scheduler:8786"]
    job = services["job"]["command"]
    assert job[:4] == ["pipeline", "run", "--scheduler", "tcp://scheduler:8786"]
    assert Path(job[-1]).name == "orderbook.yaml" and (ROOT / "configs" / Path(job[-1]).name).exists()
    for name in ("scheduler", "worker", "job"):
        assert any(v.startswith("data:") for v in services[name]["volumes"]), name


def test_kubernetes_job_runs_pipeline_against_the_operator_scheduler():
    job = yaml.safe_load((DEPLOY / "kubernetes" / "daskjob.yaml").read_text())
    assert job["apiVersion"] == "kubernetes.dask.org/v1" and job["kind"] == "DaskJob"
    (container,) = job["spec"]["job"]["spec"]["containers"]
    command = shlex.split(container["args"][0])
    assert command[:4] == ["pipeline", "run", "--scheduler", "$DASK_SCHEDULER_ADDRESS"]
    cluster = yaml.safe_load((DEPLOY / "kubernetes" / "daskcluster.yaml").read_text())
    assert cluster["kind"] == "DaskCluster"


def test_slurm_example_is_valid_python_that_runs_pipeline():
    source = (DEPLOY / "slurm" / "run_slurm.py").read_text()
    ast.parse(source)
    assert "SLURMCluster" in source and '"pipeline", "run", "--scheduler"' in source


def test_the_image_gives_dask_workers_the_allocator_settings_of_a_local_cluster():
    """``dask worker`` in the image gets what a LocalCluster's workers get
    (``pipeline.cluster.WORKER_MALLOC``): glibc's thresholds, one arena, pyarrow on it."""
    from pipeline.cluster import WORKER_MALLOC

    text = (DEPLOY / "Dockerfile").read_text()
    env = dict(re.findall(r"^\s*(?:ENV\s+)?([A-Z_]+)=(\S+?)\s*\\?$", text, re.M))
    assert {k: env.get(k) for k in WORKER_MALLOC} == WORKER_MALLOC


def test_pins_are_the_versions_make_install_puts_in_the_venv():
    """The client runs from the Makefile's .venv and the workers from the image built on
    these pins: a pin other than the installed version is a client and workers that
    differ (dask and distributed refuse that; cloudpickle and pyyaml change silently)."""
    import importlib.metadata

    differ = {}
    for name, pinned in pins().items():
        try:
            installed = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue  # an extra this environment does not install
        if installed != pinned:
            differ[name] = (pinned, installed)
    assert not differ, f"deploy/requirements.txt pins differ from the installed versions (pin, installed): {differ}"


def test_the_image_installs_the_plot_extra_for_inspect_plot():
    text = (DEPLOY / "Dockerfile").read_text()
    (extras,) = re.findall(r"'\.\[([a-z0-9,]+)\]'", text)
    assert "plot" in extras.split(",") and "matplotlib" in pins()


def test_slurm_script_help_works_without_dask_jobqueue_and_exports_the_worker_settings():
    import importlib.util
    import subprocess
    import sys

    from pipeline.cluster import WORKER_MALLOC

    script = DEPLOY / "slurm" / "run_slurm.py"
    result = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "--jobs" in result.stdout, result.stderr
    if importlib.util.find_spec("dask_jobqueue") is None:
        result = subprocess.run([sys.executable, str(script), "c.yaml"], capture_output=True, text=True, timeout=60)
        assert result.returncode == 2 and "pip install dask-jobqueue" in result.stderr
    spec = importlib.util.spec_from_file_location("run_slurm", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    lines = module.worker_prologue()
    for key, value in {**WORKER_MALLOC, "DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED": "False"}.items():
        assert f"export {key}={value}" in lines
