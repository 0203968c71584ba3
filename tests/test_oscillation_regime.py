"""The Oscillation detector's second path (a noisier plateau after a jump), on generated runs.

A run converges, then at ``ONSET`` its step size is raised past the edge of stability: within
``RAMP`` steps the loss jumps to ``lift`` times its level and bounces there with its usual
noise in log space (so swings ``lift`` times as wide in loss units) and no net progress, while
the grad norm, kicked up at the jump, then either swings wider or sits higher. The jump (of
both signals at once) arms the watch, but the plateau can
only be compared with what came before once the current window (48 values) has left the jump,
so the watch must outlast it.
"""

from __future__ import annotations

import numpy as np
import pytest

from trainsignals import Kind, Monitor
from trainsignals.detectors import Oscillation

N, ONSET, RAMP = 700, 400, 1
SEEDS = range(8)


def run(seed: int, lift: float = 4.0, grad_level: float = 1.0, grad_swing: float = 1.0):
    """``(loss, grad_norm)`` of a run whose loss is lifted ``lift`` times from ``ONSET``; the grad
    norm is lifted ``grad_level`` times and its log-space noise widened ``grad_swing`` times."""
    rng = np.random.default_rng(seed)
    t = np.arange(N)
    log_level = np.log(2.3 * np.exp(-t / 120) + 0.3)
    ramp = np.clip((t - ONSET) / RAMP, 0.0, 1.0)
    loss = np.exp(log_level + ramp * np.log(lift) + rng.normal(0, 0.1, N))
    g_sd = np.where(t >= ONSET, 0.1 * grad_swing, 0.1)
    grad = np.exp(ramp * np.log(grad_level) + rng.normal(0, 1, N) * g_sd)
    if lift != 1.0:
        grad[ONSET] *= 4.0  # the first step at the raised step size
    return loss, grad


def regime_events(loss, grad):
    det = Oscillation()
    return [e for e in det.scan(loss, grad) if e.kind == Kind.OSCILLATION and e.threshold == det.shift]


def within(evs, lo=ONSET, hi=ONSET + 100):
    return [e.step for e in evs if lo <= e.step <= hi]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("grad", [dict(grad_swing=2.0), dict(grad_level=2.0)], ids=["grad-swings", "grad-rises"])
def test_a_noisier_plateau_after_a_ramp_is_caught(seed, grad):
    loss, g = run(seed, **grad)
    evs = regime_events(loss, g)
    assert within(evs), [e.step for e in evs]
    assert all(e.step >= ONSET for e in evs)
    assert all(e.onset_step >= ONSET for e in evs if e.step <= ONSET + 100)


@pytest.mark.parametrize("seed", SEEDS)
def test_quiet_without_the_lift_or_when_the_grad_norm_holds(seed):
    assert regime_events(*run(seed, lift=1.0, grad_level=2.0)) == []   # the loss holds its band
    assert regime_events(*run(seed, lift=4.0)) == []                    # the grad norm does not move


@pytest.mark.parametrize("seed", SEEDS[:3])
def test_the_monitor_reports_it_as_oscillation(seed):
    loss, g = run(seed, grad_level=2.0)
    evs = Monitor().scan(loss=loss, grad_norm=g)
    assert any(e.kind == Kind.OSCILLATION and ONSET <= e.step <= ONSET + 100 for e in evs)


@pytest.mark.parametrize("seed", SEEDS[:3])
def test_streaming_gives_the_scan_events(seed):
    loss, g = run(seed, grad_swing=2.0)
    a, b = Oscillation(), Oscillation()
    ea = a.scan(loss, g)
    eb = [e for x, gg in zip(loss.tolist(), g.tolist()) if (e := b.update(x, gg)) is not None]
    assert [(e.step, e.onset_step, e.value) for e in ea] == [(e.step, e.onset_step, e.value) for e in eb]
