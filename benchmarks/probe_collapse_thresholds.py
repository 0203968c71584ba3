"""Where do the silent-collapse rules' thresholds come from? Healthy runs only set them.

usage: python benchmarks/probe_collapse_thresholds.py [--seeds 7000:7200]

For TopShareCollapse: on healthy runs of the synthetic generator (seeds 7000-7199, every
difficulty; never the tests' seeds >= 5000 below 7000, never a faulty run's label) the largest
``(share - base) / (1 - base)`` the fast smoothed share reached after warm-up, at steps where it
was also 6 noise standard deviations above the baseline (the rule's other condition). For
ValMetricChance: the largest share of its gain over the first validation a healthy accuracy gave
back after warm-up, where the gain was above 4 noise scales. ``rise`` and ``back`` sit well above
the largest value seen; the script then reports the alarms per 10,000 healthy steps at the
defaults (the false-alarm budget: below 1) and, for information only, the delay on collapse runs.
"""

from __future__ import annotations

import argparse

import numpy as np

import trainsignals as ts
from trainsignals.curves import DIFFICULTIES, generate
from trainsignals.kinds import default_window


class _Probe(ts.TopShareCollapse):
    """The rule with its largest healthy rise recorded (a probe, not a detector of the suite)."""

    worst = 0.0

    def _step(self, share, loss, step):  # type: ignore[no-untyped-def]
        ev = super()._step(share, loss, step)
        base = self._base  # noqa: SLF001 - the probe reads its own base class's state
        if base is not None and self._n > self.warmup:  # noqa: SLF001
            sd = (self._v * self._noise) ** 0.5  # noqa: SLF001
            f = self._f  # noqa: SLF001
            if f - base >= 6.0 * sd:
                self.worst = max(self.worst, (f - base) / (1.0 - base))
        return ev


def _val_giveback(c) -> float:  # type: ignore[no-untyped-def]
    m = np.asarray(c.val_metric, dtype=float)
    worst = 0.0
    for i in range(3, len(m)):
        first, best = m[0], m[:i].max()
        d2 = np.abs(np.diff(m[:i + 1], 2))[-32:]
        noise = np.sort(d2)[len(d2) // 2] / 3 ** 0.5
        gain = best - first
        if gain > 4 * noise and m[i] < best:
            worst = max(worst, (best - m[i]) / gain)
    return worst


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", default="7000:7200")
    args = ap.parse_args()
    lo, hi = (int(x) for x in args.seeds.split(":"))
    rises, backs, steps, alarms = [], [], 0, {"pred_collapse": 0, "val_metric_chance": 0}
    for seed in range(lo, hi):
        for d in DIFFICULTIES:
            c = generate("healthy", seed, d)
            p = _Probe()
            p.scan(pred_top_share=(c.pred_steps, c.pred_top_share), loss=c.loss, steps=c.steps)
            rises.append(p.worst)
            backs.append(_val_giveback(c))
            steps += c.total_steps
            sig = c.signals()
            alarms["pred_collapse"] += len(ts.TopShareCollapse().scan(
                pred_top_share=sig["pred_top_share"], loss=c.loss, steps=c.steps))
            alarms["val_metric_chance"] += len(ts.ValMetricChance().scan(
                val_metric=sig["val_metric"], loss=c.loss, steps=c.steps))
    print(f"{len(rises)} healthy runs, {steps} steps")
    print(f"TopShareCollapse: largest healthy rise {max(rises):.3f} (99th percentile {np.quantile(rises, 0.99):.3f})")
    print(f"ValMetricChance: largest healthy give-back {max(backs):.3f} (99th percentile {np.quantile(backs, 0.99):.3f})")
    for k, v in alarms.items():
        print(f"{k}: {v} alarms = {1e4 * v / steps:.3f} per 10,000 healthy steps")
    for det_name, make, key in (("pred_collapse", ts.TopShareCollapse, "pred_top_share"),
                                ("val_metric_chance", ts.ValMetricChance, "val_metric")):
        delays, missed = [], 0
        for seed in range(lo, lo + 50):
            for d in DIFFICULTIES:
                c = generate("silent_collapse", seed, d)
                evs = make().scan(**{key: c.signals()[key]}, loss=c.loss, steps=c.steps)
                hit = [e.step - c.onset_step for e in evs if e.step >= c.onset_step]
                if hit and hit[0] <= default_window("silent_collapse", c.total_steps):
                    delays.append(hit[0])
                else:
                    missed += 1
        print(f"{det_name} on 150 collapse runs: {len(delays)} caught, median delay {np.median(delays):.0f} steps, "
              f"90th percentile {np.quantile(delays, 0.9):.0f}, {missed} missed")


if __name__ == "__main__":
    main()
