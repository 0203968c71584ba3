"""How wide do loss swings get in the edge-of-stability rules' test, on healthy and oscillating runs?

For each suite given, evaluates the ratios of :class:`SwingRatioEdgeOfStability` and
:class:`LRRiseEdgeOfStability` (the loss swing in loss units, the grad norm's move, the learning
rate's rise; last 48 values against the 48 that end 80 values earlier) at every other value of
every run, whether or not a watch is armed. Prints, per suite:

* the quantiles of the loss swing ratio over the healthy runs' no-progress windows (ratio > 0):
  the 99th percentile over the committed real and synthetic suites together is
  ``LRRiseEdgeOfStability``'s ``shift`` (1.93; printed last);
* the largest loss swing ratio on healthy runs where the grad norm moved ``grad_shift`` times,
  where the learning rate rose ``lr_rise`` times (2.44: the rule's former bar for a jump back to a
  rate the run had used, 2.5, lay just above it; since 7 December such a jump arms no watch), and
  where it rose after a jump to new ground, with the runs that reach them;
* for each ``oscillation`` run: the real suite's label check's swing ratio, the largest loss swing
  ratio within the detection window with either evidence, whether its last learning-rate jump
  went above every rate the run had used, and the steps where each edge-of-stability rule fires.

Run: ``python benchmarks/probe_oscillation_shift.py real [/tmp/real_seed1 synthetic ...]``.
"""

from __future__ import annotations

import sys

import numpy as np

from trainsignals import Kind
from trainsignals.curves import load_suite
from trainsignals.curves.labels import oscillation_stats
from trainsignals.detectors import LRRiseEdgeOfStability, SwingRatioEdgeOfStability
from trainsignals.detectors._swings import grad_move, lr_rise, swing_ratio
from trainsignals.eval.bench import default_window

DET, LR = SwingRatioEdgeOfStability(), LRRiseEdgeOfStability()
W2, W4 = 3 * DET.window // 2, 4 * DET.window  # the rules' windows
QUANTILES = (0.5, 0.9, 0.99, 0.999)


def ratios(c, lo: int = 2 * W4, hi: int | None = None):
    """``(index, loss ratio, grad ratio, lr ratio)`` at every other value in ``[lo, hi)``."""
    n = len(c.loss)
    with np.errstate(all="ignore"):
        y = np.log(np.where(c.loss > 0, c.loss, np.nan))
        g = np.log(c.grad_norm) if c.grad_norm is not None else np.full(n, np.nan)
    lr = c.lr if c.lr is not None else np.full(n, np.nan)
    for t in range(max(lo, W4), n if hi is None else min(hi, n), 2):
        ys = y[t - W4 + 1:t + 1]
        if np.isfinite(ys).all():
            rl = swing_ratio(ys.tolist(), W2)
            yield (t, rl, grad_move(g[t - W4 + 1:t + 1].tolist(), W2) if rl else 0.0,
                   lr_rise(lr[t - W4 + 1:t + 1].tolist(), W2) if rl else 0.0)


def new_ground(lr: np.ndarray | None, upto: int, rise: float) -> bool:
    """Whether the learning rate's last jump up to index ``upto`` went ``rise`` times above every
    earlier rate (the jumps that arm the detector's watch; gaps are skipped)."""
    if lr is None:
        return False
    seg = lr[:upto + 1]
    ok = np.isfinite(seg) & (seg > 0)
    v = seg[ok]
    jumps = np.flatnonzero(v[1:] >= rise * v[:-1]) + 1
    return bool(len(jumps)) and bool(v[jumps[-1]] >= rise * v[:jumps[-1]].max())


def main(argv: list[str]) -> None:
    det, everything = DET, []
    for name in argv or ["real"]:
        suite = load_suite("datasets/real" if name == "real" else name)
        best_g: tuple[float, str] = (0.0, "-")
        best_l: tuple[float, str] = (0.0, "-")
        best_n: tuple[float, str] = (0.0, "-")
        swings = []
        for c in suite:
            if not c.healthy:
                continue
            for t, rl, rg, rlr in ratios(c):
                if rl > 0:
                    swings.append(rl)
                if rg >= det.grad_shift and rg < np.inf and rl > best_g[0]:
                    best_g = (rl, c.name)
                if rlr >= LR.lr_rise and rl > best_l[0]:
                    best_l = (rl, c.name)
                if rlr >= LR.lr_rise and rl > best_n[0] and new_ground(c.lr, t, LR.lr_rise):
                    best_n = (rl, c.name)
        if name in ("real", "synthetic"):
            everything += swings
        print(f"{name}: healthy no-progress windows {len(swings)}, swing ratio quantiles "
              + ", ".join(f"{q}: {np.quantile(swings, q):.3f}" for q in QUANTILES))
        print(f"{name}: healthy, largest loss swing ratio with the grad norm's move: {best_g[0]:.2f} ({best_g[1]}); "
              f"with the learning rate's rise: {best_l[0]:.2f} ({best_l[1]}); after a jump to new ground: "
              f"{best_n[0]:.2f} ({best_n[1]})")
        for c in suite:
            if str(c.kind) != "oscillation":
                continue
            on, n = c.onset_step, len(c.loss)
            w = default_window("oscillation", n)
            label = oscillation_stats(c.loss, on, min(w, n - 1 - on))[0]
            got = [rl for _, rl, rg, rlr in ratios(c, on, on + w + 1)
                   if rlr >= LR.lr_rise or det.grad_shift <= rg < np.inf]
            grad = [e.step for e in SwingRatioEdgeOfStability().scan(loss=c.loss, grad_norm=c.grad_norm, steps=c.steps)
                    if e.kind == Kind.OSCILLATION]
            lrw = [e.step for e in LRRiseEdgeOfStability().scan(loss=c.loss, lr=c.lr, steps=c.steps)
                   if e.kind == Kind.OSCILLATION]
            print(f"  {c.name:28s} label ratio {label:5.2f}  largest {max(got, default=0.0):6.2f}  "
                  f"new ground {'yes' if new_ground(c.lr, on + 2, LR.lr_rise) else 'no ':3s}  "
                  f"fires at {grad} (grad norm), {lrw} (learning rate)")
    if everything:
        print(f"real + synthetic healthy: 99th percentile of the swing ratio {np.quantile(everything, 0.99):.3f} "
              f"over {len(everything)} windows (LRRiseEdgeOfStability's shift)")


if __name__ == "__main__":
    main(sys.argv[1:])
