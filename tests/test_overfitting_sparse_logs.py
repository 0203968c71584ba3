"""The overfitting rules on logs written every N steps: the train loss's memory is kept in steps.

Each rule asks the smoothed train loss to have fallen since the best validation (a validation
bump while the train loss rises too is no overfitting). The smoothing weighs a loss by the steps
since the previous one (``train_weight``), so a log with a row every 10 or 50 steps remembers as
many steps as a dense one, not 10 or 50 times more; on a dense log nothing changes.
"""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest

import trainsignals as ts
from trainsignals.detectors._val_gap import TRAIN_ALPHA, train_weight

RULES = (ts.SharpTurnOverfitting, ts.BreakoutOverfitting, ts.LevelStepOverfitting, ts.MemorisationClimbOverfitting)


def run(every: int, spike: bool, seed: int = 0):
    """A converged validation loss that jumps at step 400 and stays 3 % up; the train loss falls
    throughout and, with ``spike``, runs 1.6x high from step 380 to 440 (the bump's cause)."""
    rng = np.random.default_rng(seed)
    steps = np.arange(0, 900, every)
    loss = 2.0 * np.exp(-steps / 400) * np.exp(rng.normal(0, 0.02, len(steps)))
    if spike:
        loss[(steps >= 380) & (steps <= 440)] *= 1.6
    vs = np.arange(25, 900, 25)
    val = (0.8 + 1.5 * np.exp(-vs / 60)) * (1 + 0.001 * rng.normal(size=len(vs)))
    val[vs == 400] *= 1.25
    val[vs > 400] = val[vs == 375] * 1.03
    return steps, loss, (vs, val)


@pytest.mark.parametrize("every", [1, 10, 50])
def test_a_bump_while_the_train_loss_spikes_is_no_overfitting_at_any_interval(every):
    steps, loss, val = run(every, spike=True)
    for rule in RULES:
        assert rule().scan(steps=steps, loss=loss, val_loss=val) == [], (rule.__name__, every)


@pytest.mark.parametrize("every", [1, 10, 25])
def test_a_sharp_turn_with_the_train_loss_falling_is_named_at_any_interval(every):
    steps, loss, (vs, val) = run(every, spike=False)
    val = val.copy()
    val[vs >= 400] = val[vs == 375] * (1.0 + 0.08 * np.arange(1, (vs >= 400).sum() + 1))  # turns up 8 % a validation
    got = [(e.step, e.onset_step) for e in ts.SharpTurnOverfitting().scan(steps=steps, loss=loss, val_loss=(vs, val))]
    assert got and got[0][0] == 425 and 325 <= got[0][1] <= 375, (every, got)   # at the turn's second validation


def test_the_weight_of_a_loss_compounds_with_the_steps_since_the_last():
    assert train_weight(1) == train_weight(0) == TRAIN_ALPHA
    assert train_weight(2) == pytest.approx(1 - (1 - TRAIN_ALPHA) ** 2)
    assert train_weight(10) == train_weight(10_000) == pytest.approx(2 / 9)   # at most a few rows of memory


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.__name__)
def test_streaming_equals_scanning_on_irregular_logs_and_the_state_resumes(rule):
    rng = np.random.default_rng(11)
    gaps = rng.choice([1, 1, 1, 2, 7, 30], size=1200)
    steps = np.cumsum(gaps)
    loss = 2.0 * np.exp(-steps / 3000 - np.maximum(0, steps - 5000) / 300) * np.exp(rng.normal(0, 0.1, len(steps)))
    loss[rng.random(len(steps)) < 0.05] = np.nan
    loss[rng.random(len(steps)) < 0.02] = 0.0
    val = np.full(len(steps), np.nan)
    at = np.diff(steps // 100, prepend=0) > 0   # a validation at the first row of every 100 steps
    val[at] = (0.6 + np.exp(-steps[at] / 2000)) * (1 + np.maximum(0, steps[at] - 5000) / 2000) * np.exp(
        rng.normal(0, 0.002, at.sum()))  # from step 5000 on the model memorises: a turn, then a climb
    streamed = rule()
    ev_stream = [e for s, x, v in zip(steps.tolist(), loss.tolist(), val.tolist())
                 for e in streamed.update(step=s, loss=x, val_loss=None if v != v else v)]
    assert ev_stream, "the stream is built to fire"
    for cut in (1, 37, 500, 1199):
        det = rule()
        first = det.scan(steps=steps[:cut], loss=loss[:cut], val_loss=val[:cut])
        state = json.loads(json.dumps(det.state_dict()))
        again = pickle.loads(pickle.dumps(rule()))
        again.load_state_dict(state)
        rest = again.scan(steps=steps[cut:], loss=loss[cut:], val_loss=val[cut:])
        assert [(e.step, e.onset_step) for e in first + rest] == [(e.step, e.onset_step) for e in ev_stream]
    assert streamed.state_dict() == again.state_dict()
