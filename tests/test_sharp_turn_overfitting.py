"""SharpTurnOverfitting: a validation loss that turns up at once, judged against its own noise.

The curves are made here from seeds 5000 on (no threshold was chosen on them; the rule's ``z``
comes from the tuning suites' healthy runs): a validation loss that falls along an exponential
to a floor, with multiplicative noise of 0.2 % to 5 % a validation, measured every 20 to 50
steps; a healthy run keeps meandering at its floor, an overfitting one turns up by 15 to 40
noise units a validation from a random validation on. Rates are asserted over many curves.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import trainsignals as ts
from trainsignals import Kind

SEEDS = range(5000, 5080)


def run(seed: int, turn: bool):
    """(train loss per step, (val steps, val values), the best validation's step and the step of the
    turn's second validation (-1 and -1 without a turn))."""
    rng = np.random.default_rng(seed)
    steps = int(rng.integers(600, 2000))
    every = int(rng.choice([20, 25, 50]))
    vs = np.arange(every, steps, every)
    floor, amp, tau = rng.uniform(0.3, 1.5), rng.uniform(0.5, 2.0), steps * rng.uniform(1 / 8, 1 / 3)
    noise = math.exp(rng.uniform(math.log(0.002), math.log(0.05)))
    level = np.log(floor + amp * np.exp(-vs / tau))
    best = second = -1
    if turn:
        k0 = int(rng.integers(int(0.3 * len(vs)), int(0.6 * len(vs))))
        level[k0 + 1:] = level[k0] + rng.uniform(15, 40) * noise * np.arange(1, len(vs) - k0)
    val = level + rng.normal(0, noise, len(vs))
    if turn:
        best, second = int(vs[int(np.argmin(val[:k0 + 1]))]), int(vs[k0 + 2])
    t = np.arange(steps)
    loss = 2.0 * np.exp(-t / (steps / 2)) * np.exp(rng.normal(0, 0.05, steps))
    return loss, (vs, np.exp(val)), best, second


def events(loss, val):
    return [e for e in ts.SharpTurnOverfitting().scan(loss=loss, val_loss=val) if e.kind == Kind.OVERFITTING]


def test_a_turn_far_beyond_the_noise_is_named_by_its_second_validation():
    named = 0
    for seed in SEEDS:
        loss, val, best, second = run(seed, turn=True)
        evs = events(loss, val)
        assert all(e.step > best for e in evs)                # nothing before the turn
        # by the turn's second validation (its first, when a meander had already put the one before above the best)
        named += any(e.onset_step == best and e.step <= second for e in evs)
    assert named / len(SEEDS) >= 0.9, named


def test_healthy_meanders_at_a_floor_stay_quiet():
    alarmed = [bool(events(*run(seed, turn=False)[:2])) for seed in SEEDS]
    assert np.mean(alarmed) <= 0.02, np.mean(alarmed)


def steady(n: int, scatter: float) -> dict[int, float]:
    """Validations every 50 steps falling along a line, alternately ``scatter`` above and below it."""
    return {s: 2.0 * (1 - s / 1250) * (1 + scatter * (-1) ** (s // 50)) for s in range(50, 50 * n + 1, 50)}


def feed(det, val: dict[int, float], end: int) -> list:
    return [e for s in range(0, end + 1, 10) for e in det.update(loss=1.0 / (1 + s / 100), val_loss=val.get(s), step=s)]


def test_the_same_rise_is_a_turn_on_a_smooth_curve_and_noise_on_a_rough_one():
    for scatter, fires in ((0.002, True), (0.03, False)):
        val = steady(10, scatter)
        val.update({550: val[500] * 1.06, 600: val[500] * 1.09})
        evs = feed(ts.SharpTurnOverfitting(), val, 600)
        assert bool(evs) is fires
        if fires:
            assert [(e.step, e.onset_step) for e in evs] == [(600, 500)]
            assert "times its own noise" in evs[0].message


def test_a_turn_is_judged_where_it_happens_after_a_lucky_best():
    val = steady(10, 0.002)
    # the best (500) a low draw, two validations level with it (within 2 %), then the turn
    val.update({550: val[500] * 1.01, 600: val[500] * 1.005, 650: val[500] * 1.1, 700: val[500] * 1.15})
    assert [(e.step, e.onset_step) for e in feed(ts.SharpTurnOverfitting(), val, 700)] == [(700, 500)]


def test_a_climb_whose_first_validations_were_within_the_noise_is_not_judged_again():
    val = steady(10, 0.01)
    # 6 % and 8 % above the best on a curve that scatters 1 %: no turn; the climb goes on (another rule's)
    val.update({550: val[500] * 1.06, 600: val[500] * 1.08, 650: val[500] * 1.5, 700: val[500] * 1.8})
    assert feed(ts.SharpTurnOverfitting(), val, 700) == []
    val[600] = val[500]   # the rise broken: the next two above the best are a new turn
    assert [(e.step, e.onset_step) for e in feed(ts.SharpTurnOverfitting(), val, 700)] == [(700, 500)]


def test_without_six_validations_up_to_the_best_there_is_no_noise_to_judge_by():
    val = steady(5, 0.002)
    val.update({300: val[250] * 1.2, 350: val[250] * 1.4})
    assert feed(ts.SharpTurnOverfitting(), val, 350) == []
    val = steady(6, 0.002)
    val.update({350: val[300] * 1.2, 400: val[300] * 1.4})
    assert [e.onset_step for e in feed(ts.SharpTurnOverfitting(), val, 400)] == [300]


def test_a_rising_train_loss_is_a_divergence_not_overfitting():
    val = steady(10, 0.002)
    val.update({550: val[500] * 1.06, 600: val[500] * 1.09})
    det = ts.SharpTurnOverfitting()
    evs = [e for s in range(0, 601, 10) for e in det.update(loss=1.0 + max(0, s - 500) / 100, val_loss=val.get(s), step=s)]
    assert evs == []


def test_validations_at_uneven_steps_are_judged_against_the_noise_about_their_trend():
    """Validations every 30 to 120 steps of a smooth fall scattering 0.3 %: the line through each
    validation's neighbours takes the uneven steps into account, so a 10 % turn is named as it is
    at a steady cadence (second differences would take the fall's bends for noise)."""
    named = 0
    for seed in range(5100, 5120):
        rng = np.random.default_rng(seed)
        vs = np.cumsum(rng.choice([30, 45, 60, 120], size=24))
        val = (0.4 + np.exp(-vs / 400)) * np.exp(rng.normal(0, 0.003, len(vs)))
        val[16:] = val[15] * (1.0 + 0.1 * np.arange(1, len(vs) - 15))
        t = np.arange(int(vs[-1]) + 1)
        evs = ts.SharpTurnOverfitting().scan(loss=np.exp(-t / 500), val_loss=(vs, val), steps=t)
        named += [(e.step, e.onset_step) for e in evs][:1] == [(int(vs[17]), int(vs[15]))]
    assert named >= 18, named


def test_a_curve_without_noise_says_so_rather_than_giving_a_ratio():
    val = {s: 2.0 * 0.9 ** (s // 50) for s in range(50, 501, 50)}      # a geometric fall: no scatter at all
    val.update({550: val[500] * 1.05, 600: val[500] * 1.08})
    evs = feed(ts.SharpTurnOverfitting(), val, 600)
    assert [(e.step, e.onset_step) for e in evs] == [(600, 500)]
    assert "without measurable noise" in evs[0].message and "e+" not in evs[0].message


@pytest.mark.parametrize(("param", "value"), [("z", 0.0), ("noise_window", 5), ("patience", 1), ("min_rise", -0.1)])
def test_bad_settings_name_their_parameter(param, value):
    with pytest.raises(ValueError, match=param):
        ts.SharpTurnOverfitting(**{param: value})
