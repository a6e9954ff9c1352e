"""``python -m pipeline``: the ``pipeline`` command, for environments whose scripts
directory is not on ``PATH`` (or to pick the interpreter explicitly)."""

from __future__ import annotations

from pipeline.cli import entry

if __name__ == "__main__":
    entry()
