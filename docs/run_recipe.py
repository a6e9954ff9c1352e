"""Run the code blocks of a documentation page, in order, as a reader would.

    python docs/run_recipe.py docs/pages/recipes/lobster.md            # in a fresh temp dir
    python docs/run_recipe.py docs/pages/recipes/lobster.md --keep     # and keep it

``tests/test_docs.py`` runs every recipe page (and the getting-started page) this way.
The page runs in a new empty directory holding copies of the repository's ``configs/``
and ``examples/``, as a fresh clone would; its fenced blocks are taken in page order:

- ```` ```python ```` blocks are executed in one namespace (``__name__ == "__main__"``),
  so a later block sees what an earlier one defined;
- ```` ```bash ```` blocks run with ``bash -euo pipefail``, with this Python's ``bin``
  directory (``pipeline``, ``dask``, ``torchrun``) first on ``PATH``;
- a block with a title (```` ```yaml title="lobster.yaml" ````, ```` ```python
  title="train_ddp.py" ````) is not run: it is written to that file, for the blocks after
  it to use;
- a block right after a ``<!-- skip -->`` comment (``<!-- skip: why -->``) is neither run
  nor written: it needs something a test machine lacks (a remote cluster, S3, hours). A
  skipped YAML block that is a whole config (it has ``source:``) is still validated with
  ``pipeline.config.parse_config``;
- other blocks (``text``, ``yaml`` without a title, ...) are shown, not run.

To keep a run small and quick, bash blocks are adjusted where the environment asks for it
(the tests set both):

- ``--rows-per-day N`` becomes ``--rows-per-day $RECIPE_ROWS_PER_DAY``;
- every ``pipeline run`` gets ``--set $RECIPE_RUN_SET`` first (for example
  ``cluster.n_workers=1 cluster.processes=false``: a LocalCluster of one worker thread
  starts faster, and the store depends on neither).

Exit status 0 when every block ran; 1, naming the block (``page:line``), when one failed.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import traceback
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
COPIED = ("configs", "examples")

_FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,})(?P<lang>[\w+-]*)(?P<attrs>[^\n`]*)$")
_TITLE = re.compile(r'title="(?P<title>[^"]+)"')
_SKIP = re.compile(r"^\s*<!--\s*skip\b(?P<why>[^>]*)-->\s*$")


@dataclass(frozen=True)
class Block:
    """One fenced code block of a page."""

    lang: str
    title: str | None
    skip: bool
    code: str
    line: int  # 1-based line of the opening fence
    why: str = ""  # the reason a skipped block gives (``<!-- skip: why -->``)

    @property
    def action(self) -> str:
        """``skip``, ``write``, ``python``, ``bash`` or ``show``."""
        if self.skip:
            return "skip"
        if self.title:
            return "write"
        if self.lang in ("python", "py"):
            return "python"
        if self.lang in ("bash", "sh", "shell"):
            return "bash"
        return "show"


def blocks(text: str) -> list[Block]:
    """The fenced blocks of a markdown page, in order (nested fences are not supported)."""
    lines = text.splitlines()
    out: list[Block] = []
    i = 0
    skip_next = False
    why = ""
    while i < len(lines):
        marker = _SKIP.match(lines[i])
        if marker:
            skip_next = True
            why = marker.group("why").strip().lstrip(":").strip()
            i += 1
            continue
        m = _FENCE.match(lines[i])
        if not m:
            if lines[i].strip():
                skip_next = False  # a skip marker applies to the block right after it
            i += 1
            continue
        indent, fence = len(m.group("indent")), m.group("fence")
        title = _TITLE.search(m.group("attrs"))
        start = i
        body: list[str] = []
        i += 1
        while i < len(lines) and lines[i].strip() != fence:
            body.append(lines[i][indent:] if lines[i][:indent].strip() == "" else lines[i])
            i += 1
        out.append(Block(m.group("lang").lower(), title.group("title") if title else None, skip_next,
                         "\n".join(body) + "\n", start + 1, why if skip_next else ""))
        skip_next = False
        why = ""
        i += 1
    return out


def _env() -> dict[str, str]:
    env = dict(os.environ)
    bindir = str(Path(sys.executable).parent)
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    env.setdefault("KERAS_BACKEND", "torch")
    env.setdefault("NO_MKDOCS_2_WARNING", "1")
    return env


def _shrink(code: str) -> str:
    rows = os.environ.get("RECIPE_ROWS_PER_DAY")
    if rows:
        code = re.sub(r"--rows-per-day[ =]\d[\d_]*", f"--rows-per-day {rows}", code)
    for item in os.environ.get("RECIPE_RUN_SET", "").split():
        code = re.sub(r"(?m)^(\s*pipeline run) ", rf"\1 --set {item} ", code)
    return code


def validate_skipped_config(block: Block) -> None:
    """A skipped YAML block that is a whole config still has to be a valid one."""
    import yaml

    from pipeline.config import parse_config

    data = yaml.safe_load(block.code)
    if isinstance(data, dict) and "source" in data:
        parse_config(data)


def run_page(page: Path, workdir: Path) -> int:
    """Run ``page``'s blocks in ``workdir``; 0 on success."""
    page = page.resolve()
    for name in COPIED:
        if (REPO / name).is_dir() and not (workdir / name).exists():
            shutil.copytree(REPO / name, workdir / name)
    os.chdir(workdir)
    os.environ.update({k: v for k, v in _env().items() if k in ("PATH", "KERAS_BACKEND")})
    namespace: dict[str, object] = {"__name__": "__main__", "__file__": str(workdir / "recipe.py")}
    for block in blocks(page.read_text(encoding="utf-8")):
        where = f"{page.name}:{block.line}"
        try:
            if block.action == "skip" and block.lang in ("yaml", "yml"):
                validate_skipped_config(block)
            elif block.action == "write":
                target = workdir / block.title
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(block.code, encoding="utf-8")
            elif block.action == "python":
                print(f"--- {where}: python", flush=True)
                exec(compile(block.code, where, "exec"), namespace)
            elif block.action == "bash":
                print(f"--- {where}: bash", flush=True)
                subprocess.run(["bash", "-euo", "pipefail", "-c", _shrink(block.code)], check=True, env=_env())
        except SystemExit as exc:
            if exc.code not in (0, None):
                print(f"FAILED {where}: SystemExit({exc.code!r})", flush=True)
                return 1
        except subprocess.CalledProcessError as exc:
            print(f"FAILED {where}: the bash block exited with {exc.returncode}", flush=True)
            return 1
        except BaseException:  # noqa: BLE001 - report any failure with the block's place
            traceback.print_exc()
            print(f"FAILED {where}", flush=True)
            return 1
    print(f"OK {page.name}", flush=True)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("page", type=Path)
    parser.add_argument("--workdir", type=Path, help="run here (default: a new temp directory)")
    parser.add_argument("--keep", action="store_true", help="keep the temp directory")
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix=f"recipe-{args.page.stem}-"))
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        return run_page(args.page, workdir.resolve())
    finally:
        if args.workdir is None and not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
        elif args.keep:
            print(f"kept {workdir}")


if __name__ == "__main__":
    sys.exit(main())
