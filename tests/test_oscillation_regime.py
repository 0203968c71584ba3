"""Each oscillation rule on runs generated fresh here (seeds >= 5000: none its thresholds were chosen on).

* :class:`LjungBoxSawtooth` on :func:`trainsignals.curves.generate` ``oscillation`` runs (an
  alternation, a sawtooth or a repeated spike-and-collapse);
* the edge-of-stability rules on a run that converges and then, at ``ONSET``, has its step size
  raised past the edge: the loss jumps to ``lift`` times its level and bounces there with its
  usual log noise (so swings ``lift`` times as wide in loss units) and no net progress, while the
  grad norm swings wider or sits higher (:class:`SwingRatioEdgeOfStability`), or the learning rate
  rose and stayed up (:class:`LRRiseEdgeOfStability`);
* all three quiet on generated healthy runs and on minibatch SGD with momentum 0.9 (a noisy
  least-squares problem) under constant, cosine, warmup and step schedules.
"""

from __future__ import annotations

import numpy as np
import pytest

from trainsignals import Kind, Monitor
from trainsignals.curves import generate
from trainsignals.detectors import LjungBoxSawtooth, LRRiseEdgeOfStability, SwingRatioEdgeOfStability
from trainsignals.testing import close_state, default_within, run_detector

RULES = (LjungBoxSawtooth, SwingRatioEdgeOfStability, LRRiseEdgeOfStability)
N, ONSET = 700, 400
SEEDS = range(5000, 5008)


def run(seed: int, lift: float = 4.0, grad_level: float = 1.0, grad_swing: float = 1.0):
    """``(loss, grad_norm)``: the loss lifted ``lift`` times from ``ONSET``, the grad norm lifted
    ``grad_level`` times and its log noise widened ``grad_swing`` times (kicked 4x at the jump)."""
    rng = np.random.default_rng(seed)
    t = np.arange(N)
    up = t >= ONSET
    loss = (2.3 * np.exp(-t / 120) + 0.3) * np.where(up, lift, 1.0) * np.exp(rng.normal(0, 0.1, N))
    grad = np.where(up, grad_level, 1.0) * np.exp(rng.normal(0, 1, N) * np.where(up, 0.1 * grad_swing, 0.1))
    if lift != 1.0:
        grad[ONSET] *= 4.0
    return loss, grad


def lr_run(seed: int, lift: float = 4.0, lr_jump: float = 3.0):
    """The plateau of :func:`run` whose grad norm holds, the learning rate raised ``lr_jump``
    times at ``ONSET`` (every 7th value unknown)."""
    loss, grad = run(seed, lift=lift)
    lr = np.where(np.arange(N) < ONSET, 0.01, 0.01 * lr_jump)
    lr[::7] = np.nan
    return loss, grad, lr


def steps_of(evs, lo=ONSET, hi=ONSET + 100):
    return [e.step for e in evs if lo <= e.step <= hi]


def sgdm_run(seed: int, lr: float, schedule: str, n: int = 1200):
    """``(loss, grad_norm, lr)`` of minibatch SGD (momentum 0.9, batch 16) on a noisy least-squares problem."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(4096, 20)) * rng.uniform(0.2, 1.5, 20)
    y = x @ rng.normal(size=20) + rng.normal(0, 0.5, 4096)
    t = np.arange(n)
    lrs = {"constant": np.full(n, lr), "cosine": lr * 0.5 * (1 + np.cos(np.pi * t / n)),
           "warmup": lr * np.minimum(1.0, (t + 1) / 200), "step": lr * 0.1 ** (t // 500)}[schedule]
    w, v, loss, grad = np.zeros(20), np.zeros(20), np.empty(n), np.empty(n)
    for k in range(n):
        idx = rng.integers(0, 4096, 16)
        r = x[idx] @ w - y[idx]
        g = x[idx].T @ r / 16
        loss[k], grad[k] = 0.5 * np.mean(r * r), np.linalg.norm(g)
        v = 0.9 * v + g
        w -= lrs[k] * v
    return loss, grad, lrs


def scan(cls, **data):
    det = cls()
    return det.scan(**{i.name: data[i.name] for i in det.inputs if i.name in data})


def test_the_sawtooth_rule_catches_generated_oscillations():
    curves = [generate("oscillation", s, d) for s in range(5000, 5010) for d in ("easy", "medium")]
    hits = [any(c.onset_step <= e.step <= c.onset_step + default_within(c)
                for e in run_detector(LjungBoxSawtooth(), c)) for c in curves]
    assert np.mean(hits) >= 0.9, np.mean(hits)
    assert [c.name for c in curves if any(e.step < c.onset_step for e in run_detector(LjungBoxSawtooth(), c))] == []


@pytest.mark.parametrize("difficulty", ["easy", "medium", "hard"])
def test_every_rule_is_quiet_on_generated_healthy_runs(difficulty):
    curves = [generate("healthy", s, difficulty) for s in range(5000, 5020)]
    assert [(c.name, cls.__name__) for c in curves for cls in RULES if run_detector(cls(), c)] == []


@pytest.mark.parametrize("schedule", ["constant", "cosine", "warmup", "step"])
def test_every_rule_is_quiet_on_sgd_with_momentum(schedule):
    noisy = []
    for seed in (5000, 5001):
        for lr in (0.01, 0.05):  # effective steps lr / (1 - 0.9) of 0.1 and 0.5, well inside stability
            loss, grad, lrs = sgdm_run(seed, lr, schedule)
            noisy += [(seed, lr, cls.__name__) for cls in RULES if scan(cls, loss=loss, grad_norm=grad, lr=lrs)]
    assert noisy == []


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("grad", [dict(grad_swing=2.0), dict(grad_level=2.0)], ids=["grad-swings", "grad-rises"])
def test_a_noisier_plateau_with_the_grad_norm_moving_is_caught(seed, grad):
    evs = scan(SwingRatioEdgeOfStability, **dict(zip(("loss", "grad_norm"), run(seed, **grad))))
    assert steps_of(evs), [e.step for e in evs]
    assert all(e.step >= ONSET for e in evs)
    assert all(e.onset_step >= ONSET for e in evs if e.step <= ONSET + 100)


@pytest.mark.parametrize("seed", SEEDS)
def test_the_swing_rule_is_quiet_without_the_lift_or_when_the_grad_norm_holds(seed):
    for kw in (dict(lift=1.0, grad_level=2.0), dict(lift=4.0)):
        assert scan(SwingRatioEdgeOfStability, **dict(zip(("loss", "grad_norm"), run(seed, **kw)))) == []


@pytest.mark.parametrize("seed", SEEDS)
def test_a_noisier_plateau_after_a_learning_rate_raise_is_caught(seed):
    loss, grad, lr = lr_run(seed)
    evs = scan(LRRiseEdgeOfStability, loss=loss, lr=lr)
    assert steps_of(evs), [e.step for e in evs]
    assert "the learning rate rose 3x, above any rate the run had used" in evs[0].message
    assert scan(LRRiseEdgeOfStability, loss=loss) == []  # without the learning rate: no word


@pytest.mark.parametrize("seed", SEEDS)
def test_a_learning_rate_raise_the_loss_takes_in_stride_stays_quiet(seed):
    loss, grad, lr = lr_run(seed, lift=1.0)
    assert scan(LRRiseEdgeOfStability, loss=loss, lr=lr) == []


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
    assert [cls.__name__ for cls in RULES if scan(cls, loss=loss, grad_norm=grad, lr=lr)] == []


def old_ground(lr):
    """``lr`` with its first 150 values at the raised rate: the jump at ``ONSET`` returns the run
    to a step size it already trained with."""
    lr = lr.copy()
    lr[:150] = np.where(np.isnan(lr[:150]), np.nan, lr[-1])
    return lr


def test_only_a_jump_to_new_ground_is_the_learning_rates_doing():
    # the loss swings 2.25x as wide: caught when the learning rate jumped above any rate of the
    # run; a return to a rate the run already trained with (a warm restart) is no evidence
    det = LRRiseEdgeOfStability()
    assert det.shift < 2.25
    new = old = 0
    for seed in SEEDS:
        loss, _, lr = lr_run(seed, lift=2.25)
        new += bool(steps_of(scan(LRRiseEdgeOfStability, loss=loss, lr=lr)))
        old += bool(steps_of(scan(LRRiseEdgeOfStability, loss=loss, lr=old_ground(lr))))
    assert new >= 6 and old == 0, (new, old)


@pytest.mark.parametrize("seed", SEEDS[:3])
@pytest.mark.parametrize("late", [False, True], ids=["lr-throughout", "lr-appears-late"])
def test_streaming_gives_the_scan_events_and_state(seed, late):
    loss, grad, lr = lr_run(seed, lift=2.25)
    grad = run(seed, grad_swing=2.0)[1]
    if late:  # no learning rate for the first 200 values, then the raised rate once before the jump
        lr = lr.copy()
        lr[:200] = np.nan
        lr[200:260] = lr[-1]
    data = {"loss": loss, "grad_norm": grad, "lr": lr}
    for cls in RULES:
        a, b = cls(), cls()
        names = [i.name for i in a.inputs]
        ea = a.scan(**{k: data[k] for k in names})
        eb = [e for t in range(N) for e in b.update(**{k: float(data[k][t]) for k in names})]
        assert [(e.step, e.threshold, e.message) for e in ea] == [(e.step, e.threshold, e.message) for e in eb]
        assert close_state(a.state_dict(), b.state_dict())


def test_both_edge_rules_see_it_and_the_monitor_reports_it_once():
    loss, grad, lr = lr_run(5000)
    grad = run(5000, grad_level=2.0)[1]
    for rule, kw in ((SwingRatioEdgeOfStability(), {"grad_norm": grad}), (LRRiseEdgeOfStability(), {"lr": lr})):
        hits = [e.step for e in rule.scan(loss=loss, **kw) if ONSET <= e.step <= ONSET + 100]
        assert hits, type(rule).__name__
    evs = Monitor().scan(loss=loss, grad_norm=grad, lr=lr)
    found = [e for e in evs if e.kind == Kind.OSCILLATION and ONSET <= e.step <= ONSET + 100]
    assert len(found) == 1  # one incident: the event policy merges the second rule's report


@pytest.mark.parametrize(("cls", "kw", "name"), [
    (SwingRatioEdgeOfStability, dict(shift=1.0), "shift"),
    (SwingRatioEdgeOfStability, dict(grad_shift=0.0), "grad_shift"),
    (SwingRatioEdgeOfStability, dict(shift_ratio=1.0), "shift_ratio"),
    (LRRiseEdgeOfStability, dict(lr_rise=1.0), "lr_rise"),
    (LRRiseEdgeOfStability, dict(shift=1.0), "shift"),
    (LjungBoxSawtooth, dict(pattern_p=1.0), "pattern_p"),
    (LjungBoxSawtooth, dict(window=64, warmup=128), "warmup"),
])
def test_bad_config_names_the_parameter(cls, kw, name):
    with pytest.raises(ValueError, match=name):
        cls(**kw)
