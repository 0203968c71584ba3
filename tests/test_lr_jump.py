"""LRJumpAnomaly on logs written every N steps: a schedule moves between two rows unseen."""

from __future__ import annotations

import numpy as np

import trainsignals as ts


def cosine_restarts(steps: np.ndarray, period: int, peak: float = 3e-3) -> np.ndarray:
    """A cosine schedule restarted every ``period`` steps, to 0.1 % of its peak."""
    phase = (steps % period) / period
    return peak * (0.001 + 0.999 * 0.5 * (1 + np.cos(np.pi * phase)))


def test_warm_restarts_seen_in_a_few_rows_a_cycle_stay_quiet_dense_or_sparse():
    for every in (1, 10, 50):
        steps = np.arange(0, 1500, every)
        lr = cosine_restarts(steps, 130)
        assert ts.LRJumpAnomaly().scan(steps=steps, lr=lr) == [], every
    # the rows a 50-step log kept of a held-out character model's 150-step cycles: up at the restart,
    # up again, then 38x down by the next row
    rows = np.tile([1.42e-3, 3.87e-3, 1.02e-4], 6)
    assert ts.LRJumpAnomaly().scan(steps=np.arange(49, 49 + 50 * len(rows), 50), lr=rows) == []
    assert ts.LRJumpAnomaly().scan(lr=rows)                      # the same rows one step apart: a jump


def test_a_drop_from_a_held_or_falling_rate_is_named_in_a_sparse_log_too():
    steps = np.arange(0, 1500, 50)
    held = np.where(steps < 700, 1e-3, 1e-6)                   # a constant rate cut 1000x
    assert [e.step for e in ts.LRJumpAnomaly().scan(steps=steps, lr=held)] == [700]
    falling = 1e-3 * np.exp(-steps / 3000)
    falling[steps >= 700] *= 1e-3                               # a slow decay cut 1000x
    assert [e.step for e in ts.LRJumpAnomaly().scan(steps=steps, lr=falling)] == [700]


def test_a_drop_right_after_a_rise_is_named_when_the_rows_are_one_step_apart():
    lr = np.r_[np.full(100, 1e-3), np.full(1, 2e-3), np.full(100, 1e-5)]  # up 2x, then down 200x the next step
    assert [e.step for e in ts.LRJumpAnomaly().scan(lr=lr)] == [101]
    steps = np.arange(len(lr)) * 50                                        # the same rows 50 steps apart
    assert ts.LRJumpAnomaly().scan(steps=steps, lr=lr) == []


def test_streaming_equals_scanning_on_a_sparse_log_and_the_state_resumes():
    rng = np.random.default_rng(5)
    steps = np.cumsum(rng.choice([1, 1, 10, 50], size=800))
    lr = cosine_restarts(steps, 300) * np.where(rng.random(800) < 0.01, 1e-3, 1.0)
    lr[rng.random(800) < 0.03] = np.nan
    det = ts.LRJumpAnomaly()
    streamed = [e for s, v in zip(steps.tolist(), lr.tolist()) for e in det.update(step=s, lr=v)]
    first = ts.LRJumpAnomaly()
    part = first.scan(steps=steps[:333], lr=lr[:333])
    again = ts.LRJumpAnomaly()
    again.load_state_dict(first.state_dict())
    rest = again.scan(steps=steps[333:], lr=lr[333:])
    assert [(e.step, e.message) for e in part + rest] == [(e.step, e.message) for e in streamed]
    assert streamed and again.state_dict() == det.state_dict()
