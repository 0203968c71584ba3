"""Per-step cost of :class:`trainsignals.adapters.torch.TorchWatcher` against the usual recipes.

For a 100-layer MLP (width 256) and a small CNN, times one training step (forward, backward,
``optimizer.step()``, ``zero_grad()``) bare and with each way of measuring per-parameter grad
norms every step:

* ``watcher``: ``watcher.update(loss=loss)`` (fused ``torch._foreach_norm`` in the optimizer
  pre-hook, one host transfer, plus ``Monitor.update``), update ratio off, then every 10 steps;
* (a) ``recipe``: ``{n: p.grad.norm().item() for n, p in model.named_parameters()}`` plus
  ``loss.item()`` (one host sync per parameter);
* (c) ``foreach``: a bare ``torch._foreach_norm`` over the same grads, ``torch.stack`` with the
  loss and one ``.tolist()`` (the floor for the measurement itself, no Monitor).

Prints the added cost per step (median over repeats) in ms and as % of the bare step, and
the watcher's cost as a ratio to (a) and (c).

Run: ``python benchmarks/bench_torch.py [--steps 50] [--repeats 5] [--device cpu]``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from trainsignals.adapters.torch import TorchWatcher


def deep_mlp(depth: int = 100, width: int = 256) -> nn.Module:
    layers: list[nn.Module] = [nn.Linear(64, width), nn.ReLU()]
    for _ in range(depth - 2):
        layers += [nn.Linear(width, width), nn.ReLU()]
    layers.append(nn.Linear(width, 10))
    return nn.Sequential(*layers)


def small_cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        nn.Linear(64, 10),
    )


def time_variant(make: Callable[[], nn.Module], x: torch.Tensor, y: torch.Tensor, variant: str,
                 steps: int, device: torch.device) -> float:
    """Seconds per step of ``steps`` training steps with the given measurement."""
    torch.manual_seed(0)
    model = make().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    watcher: TorchWatcher | None = None
    if variant.startswith("watcher"):
        watcher = TorchWatcher(model, opt, update_ratio_every=10 if variant == "watcher+ratio" else 0)
    named = list(model.named_parameters())
    params = [p for _, p in named]
    sink: Any = None

    def step() -> None:
        nonlocal sink
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        if watcher is not None:
            sink = watcher.update(loss=loss)
        elif variant == "recipe":
            sink = ({n: p.grad.norm().item() for n, p in named if p.grad is not None}, loss.item())
        elif variant == "foreach":
            norms = torch._foreach_norm([p.grad for p in params if p.grad is not None])
            sink = torch.stack([loss.detach(), *norms]).tolist()
        else:
            sink = loss.detach()
        opt.zero_grad()

    for _ in range(5):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    if watcher is not None:
        watcher.close()
    del sink
    return (time.perf_counter() - t0) / steps


VARIANTS = ("bare", "watcher", "watcher+ratio", "recipe", "foreach")


def bench(name: str, make: Callable[[], nn.Module], x: torch.Tensor, y: torch.Tensor, steps: int,
          repeats: int, device: torch.device) -> None:
    per: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for _ in range(repeats):                      # interleave the variants: drift hits all alike
        for v in VARIANTS:
            per[v].append(time_variant(make, x, y, v, steps, device))
    med = {v: statistics.median(t) for v, t in per.items()}
    n_params = sum(1 for _ in make().parameters())
    bare = med["bare"]
    print(f"\n{name}: {n_params} parameter tensors, bare step {bare * 1e3:.2f} ms (median of {repeats})")
    added = {v: med[v] - bare for v in VARIANTS if v != "bare"}
    for v, a in added.items():
        print(f"  {v:14s} step {med[v] * 1e3:8.2f} ms   added {a * 1e3:+7.3f} ms  ({100 * a / bare:+6.2f} % of the step)")
    w = added["watcher"]
    print(f"  watcher / recipe (a) added cost: {w / added['recipe']:.2f}x" if added["recipe"] > 0 else
          "  recipe (a) added no measurable cost")
    print(f"  watcher / foreach (c) added cost: {w / added['foreach']:.2f}x" if added["foreach"] > 0 else
          "  foreach (c) added no measurable cost")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    device = torch.device(args.device)
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, device {device}, {torch.get_num_threads()} threads")
    bench("MLP 100 layers x 256, batch 64", deep_mlp, torch.randn(64, 64, device=device),
          torch.randint(0, 10, (64,), device=device), args.steps, args.repeats, device)
    bench("CNN 3 conv layers, 32x32x3, batch 32", small_cnn, torch.randn(32, 3, 32, 32, device=device),
          torch.randint(0, 10, (32,), device=device), args.steps, args.repeats, device)


if __name__ == "__main__":
    main()
