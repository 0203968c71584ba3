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

import sys
from pathlib import Path

import numpy as np
import pytest

from trainsignals import Kind, Monitor
from trainsignals.detectors import Oscillation

sys.path.insert(0, str(Path(__file__).parent))
from test_scan_equivalence import close_state  # noqa: E402

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
    return [e for e in det.scan(loss=loss, grad_norm=grad) if e.kind == Kind.OSCILLATION and e.threshold in (det.shift, det.lr_shift)]


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
    ea = a.scan(loss=loss, grad_norm=g)
    eb = [e for x, gg in zip(loss.tolist(), g.tolist()) for e in b.update(loss=x, grad_norm=gg)]
    assert [(e.step, e.onset_step, e.value) for e in ea] == [(e.step, e.onset_step, e.value) for e in eb]


def lr_run(seed: int, lift: float = 4.0, lr_jump: float = 3.0, kick: bool = True):
    """The plateau of :func:`run` whose grad norm holds (kicked at the jump, or not at all with
    ``kick=False``, then at its old level and swing), with the learning rate raised ``lr_jump``
    times at ``ONSET`` (every 7th value unknown)."""
    loss, grad = run(seed, lift=lift)
    if not kick and lift != 1.0:
        grad = grad.copy()
        grad[ONSET] /= 4.0
    lr = np.where(np.arange(N) < ONSET, 0.01, 0.01 * lr_jump)
    lr[::7] = np.nan
    return loss, grad, lr


def lr_regime_events(loss, grad, lr=None):
    det = Oscillation()
    return [e for e in det.scan(loss=loss, grad_norm=grad, lr=lr) if e.kind == Kind.OSCILLATION and e.threshold in (det.shift, det.lr_shift)]


@pytest.mark.parametrize("seed", SEEDS)
def test_a_noisier_plateau_after_a_learning_rate_raise_is_caught_though_the_grad_norm_holds(seed):
    loss, g, lr = lr_run(seed)
    assert lr_regime_events(loss, g) == []          # without the learning rate: no corroboration
    evs = lr_regime_events(loss, g, lr)
    assert within(evs), [e.step for e in evs]
    assert "the learning rate rose 3x" in evs[0].message


@pytest.mark.parametrize("seed", SEEDS)
def test_a_learning_rate_raise_the_loss_takes_in_stride_stays_quiet(seed):
    # the step size rose but the loss keeps its band (and keeps learning): not an oscillation
    assert lr_regime_events(*lr_run(seed, lift=1.0)) == []


@pytest.mark.parametrize("seed", SEEDS[:4])
def test_a_warm_restart_stays_quiet(seed):
    # cosine with warm restarts: the learning rate jumps back to its peak every 200 steps, the
    # loss jumps and then falls again
    rng = np.random.default_rng(seed)
    t = np.arange(N)
    phase = t % 200
    lr = 0.05 * 0.5 * (1 + np.cos(np.pi * phase / 200)) + 1e-4
    loss = (1.5 * np.exp(-t / 250) + 0.2) * (1 + 0.6 * np.exp(-phase / 30) * (t >= 200)) * np.exp(rng.normal(0, 0.1, N))
    grad = np.exp(rng.normal(0, 0.2, N)) * (1 + np.exp(-phase / 30))
    assert Oscillation().scan(loss=loss, grad_norm=grad, lr=lr) == []


@pytest.mark.parametrize("seed", SEEDS)
def test_a_learning_rate_jump_arms_the_watch_when_the_grad_norm_does_not_move(seed):
    # no kick: nothing swings at once, so only the learning rate's jump arms the watch; its
    # test then needs the learning rate's word (up through the whole current window)
    loss, g, lr = lr_run(seed, kick=False)
    assert lr_regime_events(loss, g) == []
    evs = lr_regime_events(loss, g, lr)
    assert within(evs, ONSET + 3 * 32 // 2), [e.step for e in evs]
    assert all("the learning rate rose" in e.message for e in evs)


@pytest.mark.parametrize("seed", SEEDS[:3])
@pytest.mark.parametrize("kick", [True, False])
def test_streaming_gives_the_scan_events_with_a_learning_rate(seed, kick):
    loss, g, lr = lr_run(seed, kick=kick)
    a, b = Oscillation(), Oscillation()
    ea = a.scan(loss=loss, grad_norm=g, lr=lr)
    eb = [e for x, gg, r in zip(loss.tolist(), g.tolist(), lr.tolist()) for e in b.update(loss=x, grad_norm=gg, lr=r)]
    assert [(e.step, e.onset_step, e.value, e.message) for e in ea] == \
        [(e.step, e.onset_step, e.value, e.message) for e in eb]
    assert close_state(a.state_dict(), b.state_dict())


def test_the_monitor_passes_the_learning_rate():
    loss, g, lr = lr_run(0)
    evs = Monitor().scan(loss=loss, grad_norm=g, lr=lr)
    assert any(e.kind == Kind.OSCILLATION and ONSET <= e.step <= ONSET + 100 for e in evs)


def test_bad_lr_rise_names_the_parameter():
    with pytest.raises(ValueError, match="lr_rise"):
        Oscillation(lr_rise=1.0)


def old_ground(lr):
    """``lr`` with its first 150 values at the raised rate: the jump at ``ONSET`` then returns
    the run to a step size it has already trained with."""
    lr = lr.copy()
    lr[:150] = np.where(np.isnan(lr[:150]), np.nan, lr[-1])
    return lr


def test_a_narrower_widening_is_enough_when_the_learning_rate_reaches_new_ground():
    # the loss swings 2.25x as wide (between lr_shift and shift): caught when the learning rate
    # jumped above any rate of the run, seldom when it returned to one the run already used,
    # never without it
    det = Oscillation()
    assert det.lr_shift < 2.25 < det.shift
    new = old = bare = 0
    for seed in SEEDS:
        loss, g, lr = lr_run(seed, lift=2.25)
        new += bool(within(lr_regime_events(loss, g, lr)))
        old += bool(within(lr_regime_events(loss, g, old_ground(lr))))
        bare += bool(within(lr_regime_events(loss, g)))
    assert new >= 6 and old <= 2 and bare == 0, (new, old, bare)
    evs = lr_regime_events(*lr_run(0, lift=2.25))
    assert evs and evs[0].threshold == det.lr_shift
    assert "above any rate the run had used" in evs[0].message


@pytest.mark.parametrize("seed", SEEDS[:3])
@pytest.mark.parametrize("fresh", [True, False])
def test_streaming_gives_the_scan_events_when_the_learning_rate_appears_late(seed, fresh):
    # no learning rate for the first 200 values, then one that jumps at ONSET (to new ground
    # or back to an old rate): the vectorised path must track the highest rate like the scalar
    loss, g, lr = lr_run(seed, lift=2.25)
    lr = lr.copy()
    lr[:200] = np.nan
    if not fresh:
        lr[200:260] = lr[-1]   # the raised rate, used once before
    a, b = Oscillation(), Oscillation()
    ea = a.scan(loss=loss, grad_norm=g, lr=lr)
    eb = [e for x, gg, r in zip(loss.tolist(), g.tolist(), lr.tolist()) for e in b.update(loss=x, grad_norm=gg, lr=r)]
    assert [(e.step, e.threshold, e.message) for e in ea] == [(e.step, e.threshold, e.message) for e in eb]
    assert close_state(a.state_dict(), b.state_dict())
    assert a.state_dict()["state"]["lr_new"] is fresh


def test_bad_lr_shift_names_the_parameter():
    for bad in (1.0, 3.0):  # at most 1, or above shift (2.5)
        with pytest.raises(ValueError, match="lr_shift"):
            Oscillation(lr_shift=bad)
