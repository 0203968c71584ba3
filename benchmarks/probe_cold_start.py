"""The cost of being the first code to run after a training step, on CPU.

Reproduces two figures the README gives for the small CNN of ``bench_torch.py``:

* the first ``torch._foreach_norm`` over the fresh gradients right after ``backward()`` against
  the same call made again at once (the first reader pulls the gradients into its core's cache);
* the first ``Monitor.update`` after a step against a second Monitor fed the same values right
  after it (the Python and NumPy work runs cold after a training step).

Run: ``python benchmarks/probe_cold_start.py [--steps 300]``.
"""

from __future__ import annotations

import argparse
import time

import torch
from bench_torch import small_cnn
from torch.nn import functional as F

import trainsignals as ts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300)
    args = ap.parse_args()
    torch.manual_seed(0)
    x, y = torch.randn(32, 3, 32, 32), torch.randint(0, 10, (32,))
    model = small_cnn()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    params = list(model.parameters())
    first = again = mon1 = mon2 = 0.0
    m1, m2 = ts.Monitor(), ts.Monitor()
    for step in range(args.steps + 5):
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        with torch.no_grad():
            t0 = time.perf_counter()
            torch.stack(torch._foreach_norm([p.grad for p in params]))  # noqa: SLF001 - torch's fused multi-tensor norm has no public name
            t1 = time.perf_counter()
            torch.stack(torch._foreach_norm([p.grad for p in params]))  # noqa: SLF001 - torch's fused multi-tensor norm has no public name
            t2 = time.perf_counter()
        opt.step()
        opt.zero_grad()
        lv = float(loss.detach())
        t3 = time.perf_counter()
        m1.update(step=step, loss=lv, grad_norm=1.0, lr=1e-3)
        t4 = time.perf_counter()
        m2.update(step=step, loss=lv, grad_norm=1.0, lr=1e-3)
        t5 = time.perf_counter()
        if step >= 5:
            first, again, mon1, mon2 = first + t1 - t0, again + t2 - t1, mon1 + t4 - t3, mon2 + t5 - t4
    n = args.steps
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, small CNN, {n} steps (means)")
    print(f"_foreach_norm right after backward: {first / n * 1e6:.0f} us; the same call again: {again / n * 1e6:.0f} us")
    print(f"Monitor.update right after a step: {mon1 / n * 1e6:.0f} us; a second Monitor, same values: "
          f"{mon2 / n * 1e6:.0f} us")


if __name__ == "__main__":
    main()
