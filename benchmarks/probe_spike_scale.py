"""Can a robust noise scale tell a single bad batch from a heavy-tailed run's own noise?

For each suite given, scores every loss value by how far its log stands above the median of
the previous 100 log-losses, in units of their MAD (x 1.4826), counting only values at least
1.5x that median (a jump ``EWMAZSpike`` could report). Prints the largest score on healthy runs,
and for each ``loss_spike`` run the Monitor misses: its score at the spike and its grad norm
against the largest of the previous 100. This is the check behind the README's paragraph on
the loss spikes missed on unseen seeds.

Run: ``python benchmarks/probe_spike_scale.py real /tmp/real_seed1 [synthetic ...]``.
"""

from __future__ import annotations

import sys

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from trainsignals import Kind, Monitor
from trainsignals.curves import load_suite
from trainsignals.eval.bench import default_window

W = 100


def robust_z(x: np.ndarray) -> np.ndarray:
    """Per value: (log x - median) / (1.4826 MAD) of the previous ``W`` log values; nan where
    the value is under 1.5x that median or there is no full window."""
    with np.errstate(all="ignore"):
        y = np.log(np.where(x > 0, x, np.nan))
        z = np.full(len(y), np.nan)
        if len(y) > W:
            v = sliding_window_view(y[:-1], W)
            med = np.nanmedian(v, axis=1)
            mad = 1.4826 * np.nanmedian(np.abs(v - med[:, None]), axis=1)
            d = y[W:] - med
            z[W:] = np.where(d >= np.log(1.5), d / np.maximum(mad, 1e-3), np.nan)
    return z


def peak_ratio(x: np.ndarray, t: int) -> float:
    """``x[t]`` over the largest of the ``W`` values before it."""
    return float(x[t] / np.nanmax(x[max(0, t - W):t]))


def main(suites: list[str]) -> None:
    for suite in suites:
        curves = load_suite(suite)
        healthy = [(np.nanmax(np.nan_to_num(robust_z(c.loss), nan=0.0)), c.name) for c in curves
                   if str(c.kind) == "healthy"]
        top, name = max(healthy)
        print(f"{suite}: healthy runs reach a robust score of {top:.1f} ({name})")
        for c in curves:
            if str(c.kind) != "loss_spike":
                continue
            on = c.onset_step
            hi = on + default_window("loss_spike", c.total_steps)
            evs = Monitor(total_steps=c.total_steps).scan(**c.signals())
            if any(e.kind == Kind.LOSS_SPIKE and on <= e.step <= hi for e in evs):
                continue
            z = robust_z(c.loss)[on:on + 3]
            g = "-" if c.grad_norm is None else f"{max(peak_ratio(c.grad_norm, t) for t in range(on, on + 3)):.2f}"
            print(f"  missed {c.name}: robust score {np.nanmax(np.nan_to_num(z, nan=0.0)):.1f}, "
                  f"loss {max(peak_ratio(c.loss, t) for t in range(on, on + 3)):.2f}x its previous maximum, "
                  f"grad norm {g}x")


if __name__ == "__main__":
    main(sys.argv[1:] or ["real"])
