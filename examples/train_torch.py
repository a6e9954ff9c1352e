"""Train a small PyTorch model from a store through a DataLoader over stream.torch().

    python examples/train_torch.py data/orderbook.zarr --epochs 3 --workers 2

Each DataLoader worker reads its own share of the shuffled chunks, so every sample is
seen exactly once per epoch; batches arrive ready-made (``batch_size=None``).
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn
from torch.utils.data import DataLoader

import pipeline


def evaluate(model: nn.Module, store: str, batch_size: int) -> float:
    s = pipeline.stream(store, split="val", batch_size=batch_size, shuffle=False)
    total, n = 0.0, 0
    with torch.no_grad():
        for xb, yb in s:
            pred = model(torch.from_numpy(xb)).squeeze(-1)
            total += float(((pred - torch.from_numpy(yb).float()) ** 2).sum())
            n += len(yb)
    return total / max(n, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("store")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()

    torch.manual_seed(0)
    ds = pipeline.open(args.store)
    s = pipeline.stream(args.store, split="train", batch_size=args.batch_size, seed=0)
    size, width = s.shapes["x"][0]  # works for materialized and virtual stores alike
    loader = DataLoader(s.torch(), batch_size=None, num_workers=args.workers)
    model = nn.Sequential(nn.Flatten(), nn.Linear(size * width, 64), nn.ReLU(), nn.Linear(64, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    print(f"torch {torch.__version__}; train ({s.n_samples}, {size}, {width}), {len(s)} batches/epoch, "
          f"{args.workers} DataLoader workers")
    for epoch in range(args.epochs):
        s.set_epoch(epoch)
        t0 = time.perf_counter()
        total, n = 0.0, 0
        for xb, yb in loader:
            pred = model(xb).squeeze(-1)
            loss = nn.functional.mse_loss(pred, yb.float())
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.item() * len(yb)
            n += len(yb)
        dt = time.perf_counter() - t0
        val = ""
        if "val" in ds.splits:
            mse = evaluate(model, args.store, args.batch_size)
            # R2 = 1 - MSE / Var(y): 0 means no better than predicting the mean.
            val = f", val_loss {mse:.4f} (R2 {1 - mse / float(ds['val']['y'][:].var()):+.3f})"
        print(f"torch epoch {epoch + 1}: loss {total / n:.4f}{val}, {n / dt:,.0f} samples/s")


if __name__ == "__main__":
    main()
