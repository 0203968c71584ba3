"""``SwingRatioEdgeOfStability`` with a measured learning rate: a swing at a rate the run trained at before
is judged against the band it had at that rate (``trainsignals.detectors._swings.RateBands``).

The stream: a loss under cosine warm restarts that, like a run at a large step size, sits higher and
swings wider in log units while the rate is high. At every restart the loss jumps onto that band
again. Without the rate the rule reads each restart as the edge of stability; with it, the run
swung so at that rate in its first cycle, so the restarts stay quiet. The same run pushed to a rate
it never used (3x its peak) is still named. Seeds are drawn fresh for each check.
"""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest

from trainsignals.detectors import SwingRatioEdgeOfStability


def restarts(seed: int, *, raised_at: int | None = None, n: int = 1600, cycle: int = 400
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(loss, grad_norm, lr)`` of a run with cosine warm restarts every ``cycle`` steps (peak 0.05),
    its rate raised to 0.15 from ``raised_at`` on if given."""
    rng = np.random.default_rng(seed)
    t = np.arange(n)
    lr = 0.05 * 0.5 * (1 + np.cos(np.pi * (t % cycle) / cycle)) + 1e-4
    if raised_at is not None:
        lr = np.where(t >= raised_at, 0.15, lr)
    rel = lr / 0.05
    y = np.log(2.0 * np.exp(-t / 300) + 0.05) + 1.5 * rel + rng.normal(0, 1, n) * (0.05 + 0.8 * rel ** 2)
    grad = np.exp(0.8 * rel + rng.normal(0, 1, n) * (0.05 + 0.5 * rel ** 2))
    return np.exp(y), grad, lr


@pytest.mark.parametrize("seed", [11, 23, 37])
def test_warm_restarts_are_judged_against_the_band_the_run_had_at_that_rate(seed: int) -> None:
    loss, grad, lr = restarts(seed)
    blind = [e.step for e in SwingRatioEdgeOfStability().scan(loss=loss, grad_norm=grad)]
    assert len(blind) >= 2 and all(any(0 < s - r < 100 for r in (400, 800, 1200)) for s in blind)
    assert SwingRatioEdgeOfStability().scan(loss=loss, grad_norm=grad, lr=lr) == []


@pytest.mark.parametrize("seed", [11, 23, 37])
def test_a_rate_new_to_the_run_is_still_the_edge_of_stability(seed: int) -> None:
    loss, grad, lr = restarts(seed, raised_at=1000)
    events = SwingRatioEdgeOfStability().scan(loss=loss, grad_norm=grad, lr=lr)
    assert events and 1000 <= events[0].step <= 1000 + 64
    assert all(e.step >= 1000 for e in events)      # the restarts before it stay quiet


def test_streaming_equals_scanning_and_the_state_round_trips_with_a_rate() -> None:
    loss, grad, lr = restarts(5, raised_at=1000)
    a, b = SwingRatioEdgeOfStability(), SwingRatioEdgeOfStability()
    ea = a.scan(loss=loss, grad_norm=grad, lr=lr)
    eb = []
    for k in range(len(loss)):
        if k == 700:   # a resume half way: the bands at each rate come back with the state
            b2 = SwingRatioEdgeOfStability()
            b2.load_state_dict(json.loads(json.dumps(b.state_dict())))
            b = pickle.loads(pickle.dumps(b2))
        eb += b.update(step=k, loss=float(loss[k]), grad_norm=float(grad[k]), lr=float(lr[k]))
    assert [(e.step, e.onset_step, e.value) for e in ea] == [(e.step, e.onset_step, e.value) for e in eb]
    assert a.state_dict() == b.state_dict()
    assert a.state_dict()["state"]["rates"][0]   # blocks were recorded
