"""Helpers shared by the benchmark scripts (not part of the package)."""

from __future__ import annotations

import threading
import time
from typing import Any


class MemorySampler:
    """Samples every worker's memory (as the scheduler reports it) while the block runs,
    and notes workers that appear after the start (restarts after being killed)."""

    def __init__(self, client: Any, interval: float = 0.2):
        self.client = client
        self.interval = interval
        self.peaks: dict[str, int] = {}
        self.initial: set[str] = set()
        self.new_workers: set[str] = set()
        self._stop = threading.Event()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                info = self.client.scheduler_info()["workers"]
            except Exception:  # noqa: BLE001 - the cluster is shutting down
                break
            for addr, w in info.items():
                mem = int(w.get("metrics", {}).get("memory", 0))
                self.peaks[addr] = max(self.peaks.get(addr, 0), mem)
                if addr not in self.initial:
                    self.new_workers.add(addr)
            time.sleep(self.interval)

    def __enter__(self) -> "MemorySampler":
        self.initial = set(self.client.scheduler_info()["workers"])
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    @property
    def peak(self) -> int:
        return max(self.peaks.values(), default=0)
