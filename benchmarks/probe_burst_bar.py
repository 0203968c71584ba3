"""How ``EWMAZSpike`` does on heavy-tailed losses whose outlier batches come in bursts.

usage: python benchmarks/probe_burst_bar.py [--runs 40] [--factor 20]

Each healthy stream is a regression's minibatch loss: a decaying level times the batch mean of
16 squared Student-t errors (``df`` degrees of freedom, scaled to mean 1), and a share ``carry``
of each value's excess over the level carried into the next value (an outlier batch's update
raises the next batch's loss too: the bursts of two or three high values such runs show). For
each (df, carry) it prints how many of ``--runs`` streams (seeds 5100 on) the default rule
alarms on in their first 1,200 values, and in how many a ``--factor``-times spike two values long
at value 1,200 is named at once. It measures; it sets nothing.
"""

from __future__ import annotations

import argparse

import numpy as np

import trainsignals as ts


def stream(seed: int, df: float, carry: float, n: int = 1500) -> tuple[np.ndarray, np.ndarray]:
    """A healthy heavy-tailed loss of ``n`` values and its level."""
    rng = np.random.default_rng(seed)
    level = 2.0 * np.exp(-np.arange(n) / 600) + 0.2
    loss = level * (rng.standard_t(df, (n, 16)) ** 2).mean(1) * (df - 2) / df
    loss[1:] += carry * np.maximum(loss[:-1] - level[:-1], 0.0)
    return loss, level


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=40, help="streams per setting")
    ap.add_argument("--factor", type=float, default=20.0, help="the injected spike's size")
    args = ap.parse_args(argv)
    print(f"{'df':>4} {'carry':>5}  healthy alarmed  {args.factor:g}x two-value spike named")
    for df in (4.0, 6.0, 10.0):
        for carry in (0.3, 0.6, 0.9):
            alarmed = named = 0
            for seed in range(5100, 5100 + args.runs):
                loss, _ = stream(seed, df, carry)
                alarmed += bool(ts.EWMAZSpike().scan(loss=loss[:1200]))
                loss[1200:1202] *= args.factor
                named += any(e.step in (1200, 1201) for e in ts.EWMAZSpike().scan(loss=loss))
            print(f"{df:4g} {carry:5.1f}  {alarmed:7d}/{args.runs}  {named:17d}/{args.runs}")


if __name__ == "__main__":
    main()
