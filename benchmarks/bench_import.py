"""Time of ``import trainsignals`` in a fresh interpreter, beside ``import numpy`` in the same run.

The target (issue "Detectors a newcomer can read and extend"): ``import trainsignals`` <= 0.2 s
on a 2-core machine; NumPy, which it needs, is measured the same way as the floor. Imports are
timed as users meet them, from cached bytecode: ``PYTHONDONTWRITEBYTECODE`` is unset for the
timed interpreters and one warm-up import writes the cache first (without a cache every module
is compiled from source on each import, several times slower).

    python benchmarks/bench_import.py [--repeat 7]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys

ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def timed(module: str) -> float:
    code = f"import time; t = time.perf_counter(); import {module}; print(time.perf_counter() - t)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=ENV)
    return float(out.stdout.strip())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    timed("trainsignals")  # warm-up: writes the bytecode cache
    np_t, ts_t = [], []
    for _ in range(args.repeat):  # interleaved, so load affects both alike
        np_t.append(timed("numpy"))
        ts_t.append(timed("trainsignals"))
    n, t = statistics.median(np_t), statistics.median(ts_t)
    print(f"import numpy        {n * 1e3:7.1f} ms (median of {args.repeat})")
    print(f"import trainsignals {t * 1e3:7.1f} ms = {t / n:.2f}x numpy, {1e3 * (t - n):.1f} ms of its own "
          f"(target <= 200 ms)")


if __name__ == "__main__":
    main()
