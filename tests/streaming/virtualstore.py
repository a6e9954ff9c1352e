"""Virtual-window stores for streaming tests, written directly (no cluster): per-step
features in ``_shared/features``, each window's end row in ``ends``, ``y`` = the
window's index, so a batch's windows can be rebuilt from its labels in plain numpy."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from pipeline.storage import write


def make_virtual_store(path, *, steps: int, features: int = 5, size: int = 64, scales: Sequence[int] = (1, 4),
                       chunk: int = 512, feature_chunk: int | None = None, stride: int = 1, seed: int = 0
                       ) -> tuple[str, np.ndarray, np.ndarray]:
    """Write a one-split (``train``) virtual store of every window that fits ``steps``
    rows; return its path, the features and the window ends."""
    f = np.random.default_rng(seed).standard_normal((steps, features)).astype(np.float32)
    halo = (size - 1) * max(scales)
    ends = np.arange(halo, steps, stride, dtype=np.int64)
    y = np.arange(ends.size, dtype=np.int64)
    write(path, {"ends": ends, "y": y}, shared={"features": f},
          shared_chunk_rows=feature_chunk or chunk * stride, chunk_samples=chunk, progress=False,
          attrs={"virtual": {"size": size, "stride": stride, "scales": list(scales), "halo": halo}})
    return str(path), f, ends


def windows_of(features: np.ndarray, ends: np.ndarray, size: int, scales: Sequence[int]) -> np.ndarray:
    """The windows ending at ``ends`` by their definition: row ``t`` of scale ``s`` is
    step ``e - s * (size - 1 - t)``, scales side by side (plain numpy fancy indexing)."""
    t = np.arange(size)
    return np.concatenate([features[ends[:, None] - s * (size - 1 - t)[None, :]] for s in scales], axis=-1)
