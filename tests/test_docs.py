"""The documentation site: it builds strictly, its recipes run, its references cover the code.

- ``mkdocs build --strict`` of ``docs/mkdocs.yml`` (broken links, missing pages, docstrings
  mkdocstrings cannot render, a hook's warnings: all fail it);
- every recipe page (and the getting-started page) runs, block after block, with
  ``docs/run_recipe.py`` in a fresh temp directory on small demo data
  (``--rows-per-day`` shrunk to ``ROWS_PER_DAY``); blocks marked ``<!-- skip: why -->``
  are not run;
- the generated pages cover the code: every error class has a troubleshooting entry,
  every config field and spec field is in the config reference, every CLI option is in
  the CLI reference.

The page runs and the site build are slow mostly for waiting (cluster start-up, process
start), so they start together, a few at a time, when the first of them is asked for.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import subprocess
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
PAGES = DOCS / "pages"
BIN = Path(sys.executable).parent
#: Rows per demo day in the recipes' ``pipeline demo-data`` commands.
ROWS_PER_DAY = 1000
#: Set on every ``pipeline run`` of a recipe: one LocalCluster worker, a thread of the
#: command's own process, which a tiny run starts sooner and with less CPU (0.87-0.90x of
#: both, ``benchmarks/bench_build.py --only startup``); a store depends on neither. The
#: worker processes a user's run starts are the CLI and cluster tests' to test.
RUN_SET = "cluster.n_workers=1 cluster.processes=false"
#: Pages whose code blocks run: the recipes and the getting-started page.
RUN_PAGES = sorted(str(p.relative_to(PAGES)) for p in (PAGES / "recipes").glob("*.md")) + ["index.md"]
#: Pages none of whose blocks run: S3 needs a bucket. Whole configs in their skipped
#: blocks are still validated.
ALL_SKIPPED = {"recipes/s3.md"}
#: Page runs and the site build at the same time: they mostly wait on process start-up.
JOBS = min(4, (os.cpu_count() or 2) + 1)
TIMEOUT = 300


def _module(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


hooks = _module("pipeline_docs_hooks", DOCS / "hooks.py")
recipes = _module("pipeline_docs_run_recipe", DOCS / "run_recipe.py")


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(NO_MKDOCS_2_WARNING="1", RECIPE_ROWS_PER_DAY=str(ROWS_PER_DAY), RECIPE_RUN_SET=RUN_SET,
               PYTHONUNBUFFERED="1")
    env["PATH"] = str(BIN) + os.pathsep + env.get("PATH", "")
    env.setdefault("KERAS_BACKEND", "torch")
    return env


def _run(cmd: list[str], cwd: Path) -> tuple[int, str, float]:
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=cwd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, timeout=TIMEOUT, stdin=subprocess.DEVNULL)
        return proc.returncode, proc.stdout, time.perf_counter() - t0
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        return -1, out + f"\n(timed out after {TIMEOUT} s)", time.perf_counter() - t0


@pytest.fixture(scope="module")
def background(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Future]:
    """The site build and the page runs that this session selected, started together."""
    wanted: set[str] = set()
    for item in request.session.items:
        if Path(str(item.path)) != Path(__file__):
            continue
        callspec = getattr(item, "callspec", None)
        if callspec is not None and "page" in callspec.params:
            wanted.add(callspec.params["page"])
        if item.originalname == "test_site_builds_strictly":
            wanted.add("<site>")
    pool = ThreadPoolExecutor(max_workers=JOBS)
    jobs: dict[str, Future] = {}
    if "<site>" in wanted:
        site = tmp_path_factory.mktemp("site")
        jobs["<site>"] = pool.submit(_run, [str(BIN / "mkdocs"), "build", "--strict", "-f", str(DOCS / "mkdocs.yml"),
                                            "-d", str(site)], REPO)
        jobs["<site-dir>"] = _done(site)
    # The slowest pages first, so that the pool ends together.
    for page in sorted(wanted - {"<site>"}, key=lambda p: (p not in ("recipes/deeplob.md", "index.md"), p)):
        workdir = tmp_path_factory.mktemp(Path(page).stem)
        jobs[page] = pool.submit(_run, [sys.executable, str(DOCS / "run_recipe.py"), str(PAGES / page),
                                        "--workdir", str(workdir)], REPO)
    yield jobs
    pool.shutdown(wait=True, cancel_futures=True)


def _done(value: object) -> Future:
    f: Future = Future()
    f.set_result(value)
    return f


# -- the site --------------------------------------------------------------------------------------


def test_site_builds_strictly(background):
    rc, out, seconds = background["<site>"].result()
    assert rc == 0, f"mkdocs build --strict failed ({seconds:.0f} s):\n{out[-6000:]}"
    site: Path = background["<site-dir>"].result()
    for page in ("index.html", "reference/config/index.html", "reference/cli/index.html",
                 "reference/api/index.html", "troubleshooting/index.html", "recipes/appending/index.html"):
        assert (site / page).is_file(), page
    # The generated pages are in the build, and only there.
    config_html = (site / "reference/config/index.html").read_text(encoding="utf-8")
    assert "cluster.address" in config_html and "FoldSpec" in config_html
    trouble = (site / "troubleshooting/index.html").read_text(encoding="utf-8")
    assert all(f'id="{cls.__name__.lower()}"' in trouble for cls in hooks.error_classes())
    api = (site / "reference/api/index.html").read_text(encoding="utf-8")
    assert ":func:" not in api and ":class:" not in api  # Sphinx roles cleaned up by the hook
    for generated in hooks.GENERATED:
        assert not (PAGES / generated).exists(), f"{generated} is generated: it must not be committed"


# -- the recipes -----------------------------------------------------------------------------------


@pytest.mark.parametrize("page", RUN_PAGES)
def test_recipe_page_runs(background, page):
    rc, out, seconds = background[page].result()
    assert rc == 0, f"{page} failed after {seconds:.0f} s:\n{out[-8000:]}"
    assert f"OK {Path(page).name}" in out


@pytest.mark.parametrize("page", RUN_PAGES)
def test_recipe_page_runs_more_than_it_skips(page):
    blocks = recipes.blocks((PAGES / page).read_text(encoding="utf-8"))
    runnable = [b for b in blocks if b.action in ("python", "bash")]
    skipped = [b for b in blocks if b.action == "skip"]
    assert bool(runnable) != (page in ALL_SKIPPED), f"{page}: {len(runnable)} blocks run"
    for b in skipped:
        assert b.why, f"{page}:{b.line}: a skipped block says why (<!-- skip: why -->)"


def test_every_recipe_is_in_the_navigation():
    nav = (DOCS / "mkdocs.yml").read_text(encoding="utf-8")
    for page in RUN_PAGES:
        assert page in nav, page


def test_blocks_are_read_with_their_markers():
    text = "\n".join([
        "```python", "a = 1", "```",
        "<!-- skip: needs S3 -->", "```python", "b = 2", "```",
        '```yaml title="c.yaml"', "x: 1", "```",
        "<!-- skip -->", "", "text in between", "```bash", "echo d", "```",
        "```text", "shown", "```",
    ])
    got = [(b.action, b.code, b.why) for b in recipes.blocks(text)]
    assert got == [("python", "a = 1\n", ""), ("skip", "b = 2\n", "needs S3"), ("write", "x: 1\n", ""),
                   ("bash", "echo d\n", ""), ("show", "shown\n", "")]


def test_skipped_configs_are_still_validated():
    from pipeline.errors import ConfigError

    good = recipes.Block("yaml", None, True, "source: {paths: x}\nwindows: {size: 4}\noutput: {path: o}\n", 1)
    recipes.validate_skipped_config(good)
    bad = recipes.Block("yaml", None, True, "source: {paths: x}\nwindows: {size: 0}\noutput: {path: o}\n", 1)
    with pytest.raises(ConfigError, match="windows.size"):
        recipes.validate_skipped_config(bad)


# -- the generated references ----------------------------------------------------------------------


def test_every_error_class_has_a_troubleshooting_entry():
    assert hooks.troubleshooting_problems() == []
    problems: list[str] = []
    page = hooks.troubleshooting(problems)
    assert problems == []
    from pipeline import errors

    names = [n for n in errors.__all__ if isinstance(getattr(errors, n), type)]
    assert sorted(c.__name__ for c in hooks.error_classes()) == sorted(names)
    for name in names:
        assert f"\n## {name}\n" in page, name


def test_a_new_error_class_without_an_entry_is_reported():
    entries = hooks.troubleshooting_entries()
    missing = dict(entries)
    missing.pop("StreamError")
    missing["NoSuchError"] = {"cause": "x", "fix": "y"}
    problems = hooks.troubleshooting_problems(missing)
    assert any("StreamError" in p for p in problems) and any("NoSuchError" in p for p in problems)


def test_every_config_field_is_in_the_config_reference():
    from pipeline.config import Config

    problems: list[str] = []
    page = hooks.config_reference(problems)
    assert problems == []  # docs/config_notes.yml names only real keys
    sections = [f.name for f in dataclasses.fields(Config) if f.name != "raw_yaml"]
    assert [name for name, _, _ in hooks.config_sections()] == sections
    for section, cls, _ in hooks.config_sections():
        assert f"\n## {section}\n" in page, section
        for f in dataclasses.fields(cls):
            assert f"| `{section}.{f.name}` |" in page, f"{section}.{f.name}"
    # The specs parsed from YAML values, with their fields.
    from pipeline.features.sessions import DateSpec, InstrumentSpec, SessionSpec
    from pipeline.features.specs import FEATURE_NAMES, FeatureSpec, LabelSpec
    from pipeline.features.splits import FoldSpec, NormalizeSpec
    from pipeline.storage.codecs import CodecSpec

    for cls in (FeatureSpec, SessionSpec, InstrumentSpec, DateSpec, NormalizeSpec, FoldSpec, CodecSpec):
        assert f"\n### {cls.__name__}\n" in page, cls.__name__
        for f in dataclasses.fields(cls):
            assert f"| `{f.name}` |" in page, f"{cls.__name__}.{f.name}"
    for f in dataclasses.fields(LabelSpec):
        assert f"| `labels.{f.name}` |" in page
    for name in FEATURE_NAMES:
        assert f"| `{name}` |" in page, name


def test_every_cli_option_is_in_the_cli_reference():
    import argparse

    from pipeline.cli import _parser

    page = hooks.cli_reference()
    parser = _parser()
    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, sub in subs.choices.items():
        assert f"\n## pipeline {name}\n" in page, name
        for action in sub._actions:
            for option in action.option_strings:
                if option not in ("-h", "--help"):
                    assert option in page, f"pipeline {name} {option}"
    assert "--version" in page


def test_docstring_prose_becomes_markdown():
    assert hooks.rst_to_md("See :func:`open_source` and :class:`~pipeline.storage.CodecSpec`.") == (
        "See `open_source` and `CodecSpec`.")
    assert hooks.rst_to_md("``file``\n    one session per file\n``date``\n    by date") == (
        "- ``file``: one session per file\n- ``date``: by date")


def _api_objects() -> list[tuple[str, object]]:
    """What the API reference renders: each ``::: target`` and, for a module or a class,
    its public members."""
    import importlib
    import inspect

    out = []
    for line in (PAGES / "reference" / "api.md").read_text().splitlines():
        if not line.startswith("::: "):
            continue
        target = line.split()[1]
        try:
            module = importlib.import_module(target)
        except ImportError:
            where, _, name = target.rpartition(".")
            obj = getattr(importlib.import_module(where), name)
            out.append((target, obj))
            if inspect.isclass(obj):
                out += [(f"{target}.{n}", v) for n, v in vars(obj).items()
                        if not n.startswith("_") and (callable(v) or isinstance(v, property))]
        else:
            out += [(f"{target}.{n}", getattr(module, n)) for n in module.__all__]
    return out


def test_the_api_reference_documents_each_parameter_on_its_own():
    # mkdocstrings (griffe) gives every name of a grouped entry ("a, b") the type and
    # default of the first, and the whole group's text: a rendered signature that lies.
    import inspect
    import re

    grouped = []
    for name, obj in _api_objects():
        section = None
        for line in (inspect.getdoc(obj) or "").splitlines():
            if re.fullmatch(r"-{3,}", line.strip()):
                continue
            if line and not line.startswith(" ") and re.fullmatch(r"[A-Z][A-Za-z ]+", line.strip()):
                section = line.strip()
            elif section in ("Parameters", "Other Parameters", "Attributes") and re.fullmatch(
                    r"\*{0,2}\w+(, \*{0,2}\w+)+( : .*)?", line):
                grouped.append(f"{name}: {line}")
    assert len(_api_objects()) > 20
    assert not grouped, "\n".join(grouped)
