"""The update-ratio band rules on runs generated fresh here (seeds the thresholds were not chosen on)."""

from __future__ import annotations

import numpy as np
import pytest

import trainsignals as ts
from trainsignals.curves import Curve, generate
from trainsignals.kinds import default_window

SEEDS = range(5000, 5030)


def events(det: ts.Detector, curve: Curve) -> list[ts.Event]:
    sig = curve.signals()
    return det.scan(steps=sig["step"], **{i.name: sig[i.name] for i in det.inputs})


@pytest.mark.parametrize(("cls", "kind"), [(ts.UpdateRatioAboveBand, "update_ratio_high"),
                                           (ts.UpdateRatioBelowBand, "update_ratio_low")])
def test_each_side_catches_its_excursions_and_leaves_healthy_runs_alone(cls, kind):
    hits = 0
    for d in ("easy", "medium", "hard"):
        for s in SEEDS:
            c = generate(kind, s, d)
            ev = events(cls(), c)
            hi = c.onset_step + default_window(kind, c.total_steps)
            assert not any(e.step < c.onset_step for e in ev), c.name
            hits += any(e.kind.value == kind and c.onset_step <= e.step <= hi for e in ev)
    assert hits >= 0.9 * 90  # 90 and 87 of 90 today
    assert sum(bool(events(cls(), generate("healthy", s, d))) for d in ("easy", "medium", "hard") for s in SEEDS) <= 1


def test_the_low_side_is_explained_by_a_learning_rate_near_zero():
    c = generate("update_ratio_low", 5001, "easy")
    sig = c.signals()
    assert events(ts.UpdateRatioBelowBand(), c)
    lr = np.where(sig["step"] < c.onset_step, sig["lr"], 0.0)  # the schedule went to 0 at the onset
    assert ts.UpdateRatioBelowBand().scan(steps=sig["step"], update_ratio=sig["update_ratio"], lr=lr) == []


def test_one_report_per_excursion_and_cooldown_in_steps():
    ratio = np.r_[np.full(300, 3e-4), np.full(50, 0.5), np.full(20, 3e-4), np.full(50, 0.5)]
    steps = 10 * np.arange(len(ratio))
    once_each = [e.step for e in ts.UpdateRatioAboveBand().scan(steps=steps, update_ratio=ratio)]
    assert len(once_each) == 2  # back inside the band in between: re-armed
    cooled = [e.step for e in ts.UpdateRatioAboveBand(cooldown=1000).scan(steps=steps, update_ratio=ratio)]
    # the second excursion (from step 3700) is held back until 1000 steps after the first event
    assert once_each[1] < once_each[0] + 1000 and cooled == [once_each[0], once_each[0] + 1010]


@pytest.mark.parametrize("seed", range(6))
def test_a_run_that_starts_above_the_hard_edge_is_judged_from_the_level_it_holds(seed):
    """Fresh ratios: a run whose first updates change its weights by more than a tenth (a small
    initialisation) and settle within 20-150 steps stays quiet; the same run's updates jumping
    above the edge later, from the level it held, fire at once."""
    rng = np.random.default_rng(300 + seed)
    settle = int(rng.integers(20, 150))
    start = 10 ** rng.uniform(-0.9, -0.1)          # 0.13 .. 0.8
    held = 10 ** rng.uniform(-3.5, -2.5)
    n = 600
    ratio = np.r_[np.geomspace(start, held, settle), np.full(n - settle, held)] * np.exp(rng.normal(0, 0.1, n))
    assert ts.UpdateRatioAboveBand().scan(update_ratio=ratio) == []
    jump = int(rng.integers(settle + 100, n - 50))
    ratio[jump:] = 10 ** rng.uniform(-0.7, 0.0)     # 0.2 .. 1: violent, after a held level
    (e, *_) = ts.UpdateRatioAboveBand().scan(update_ratio=ratio)
    assert jump <= e.onset_step <= e.step <= jump + 10   # the level (EWMA) crosses the edge within a few values


@pytest.mark.parametrize("seed", range(5))
def test_a_level_that_settles_at_the_edge_is_one_excursion(seed):
    """Fresh noisy ratios that fall to the hard lower edge (1e-6) and stay there, their level
    crossing it back and forth with the noise, give one event; after a recovery of a decade the
    next fall is a new excursion with its own event. The upper side the same way at its edge."""
    rng = np.random.default_rng(400 + seed)
    noise = rng.normal(0, 0.15, 900)
    low = 10 ** (np.r_[np.full(300, -3.5), np.full(300, -6.0), np.full(100, -3.5), np.full(200, -6.0)] + noise)
    fired = [e.step for e in ts.UpdateRatioBelowBand().scan(update_ratio=low)]
    assert len(fired) == 2 and 300 <= fired[0] < 600 and 700 <= fired[1] < 900, fired
    high = 10 ** (np.r_[np.full(300, -3.5), np.full(300, -1.0), np.full(100, -3.5), np.full(200, -1.0)] + noise)
    fired = [e.step for e in ts.UpdateRatioAboveBand().scan(update_ratio=high)]
    assert len(fired) == 2 and 300 <= fired[0] < 600 and 700 <= fired[1] < 900, fired
