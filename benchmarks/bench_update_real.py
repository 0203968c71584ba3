"""Streaming cost on real runs: ``Monitor.update`` a step over the healthy runs of a labeled suite.

``bench_core.py`` times the Monitor on a generated healthy stream; real runs are noisier, and
rules that examine a window only when the loss swings (the sawtooth and edge-of-stability rules)
cost more on them. This feeds each healthy run's loss, grad norm and learning rate to a fresh
``Monitor(total_steps=...)``, one ``update`` a step, and prints the best of ``--repeat`` passes
in microseconds a step. It uses the public API only, so it also times another checkout of the
package: ``PYTHONPATH=/path/to/other/checkout python benchmarks/bench_update_real.py``.
"""

from __future__ import annotations

import argparse
import time

import trainsignals as ts
from trainsignals.curves import load_suite


def main(argv: list[str] | None = None) -> float:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", default="datasets/real", help="a labeled suite folder (default: datasets/real)")
    ap.add_argument("--runs", type=int, default=40, help="the first N healthy runs (default: 40)")
    ap.add_argument("--repeat", type=int, default=3, help="passes over the runs; the best is kept (default: 3)")
    args = ap.parse_args(argv)
    runs = [c for c in load_suite(args.suite) if str(c.kind) == "healthy"][:args.runs]
    data = []
    for c in runs:
        sig = c.signals()
        data.append((c.total_steps, sig["loss"].tolist(), sig["grad_norm"].tolist(), sig["lr"].tolist()))
    ts.Monitor().scan(loss=[1.0] * 300, grad_norm=[1.0] * 300)  # lazy imports (SciPy) before the clock
    best = float("inf")
    for _ in range(args.repeat):
        spent, steps = 0.0, 0
        for total, loss, grad, lr in data:
            up = ts.Monitor(total_steps=total).update
            t0 = time.perf_counter()
            for a, b, c in zip(loss, grad, lr):
                up(loss=a, grad_norm=b, lr=c)
            spent += time.perf_counter() - t0
            steps += len(loss)
        best = min(best, spent / steps)
    print(f"Monitor.update (loss, grad_norm, lr) on {len(data)} healthy runs of {args.suite} "
          f"({steps:,} steps): {best * 1e6:.2f} us a step (best of {args.repeat})")
    return best


if __name__ == "__main__":
    main()
