"""The overfitting rules on the real-run suite (``datasets/real``) and the synthetic suite.

The real overfitting runs are small PyTorch trainings whose training set shrinks to a few dozen
examples at the onset: the training loss then collapses (often by decades) while the validation
loss, measured every 25 to 50 steps, stops improving and climbs, sometimes inside the range it
meandered over while the model still generalised. The detector must catch them within the
bench's window after the onset (the onset is the best validation), stay quiet on healthy runs
(validation plateaus that meander while the train loss creeps down) and not fire before the
onset of other faults. Three rules share the work (a trend break-out, a level step, a memorisation
climb: :class:`BreakoutOverfitting`, :class:`LevelStepOverfitting`,
:class:`MemorisationClimbOverfitting`); the default suite runs all three. Rates are asserted over
the suites, never per curve.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from trainsignals import Kind
from trainsignals.curves import load_suite
from trainsignals.detectors import BreakoutOverfitting, LevelStepOverfitting, MemorisationClimbOverfitting
from trainsignals.eval.bench import default_window

sys.path.insert(0, str(Path(__file__).parent))
from test_scan_equivalence import close_state  # noqa: E402

ROUTES = (BreakoutOverfitting, LevelStepOverfitting, MemorisationClimbOverfitting)  # the default suite's
NO_CLIMB = (BreakoutOverfitting, LevelStepOverfitting)  # the suite without the memorisation climb
CLIMB_ONLY = (MemorisationClimbOverfitting,)
PHRASE = {BreakoutOverfitting: "beyond its earlier wobble", LevelStepOverfitting: "on a level above the one it held",
          MemorisationClimbOverfitting: "rising at each of the last"}


def has_val(curve) -> bool:
    return curve.val_steps is not None and len(curve.val_steps) > 0


def scan(rule, loss, val):
    return [e for e in rule().scan(loss=loss, val_loss=val) if e.kind == Kind.OVERFITTING]


def events(curve, routes=ROUTES):
    evs = [e for rule in routes for e in scan(rule, curve.loss, (curve.val_steps, curve.val_loss))]
    return sorted(evs, key=lambda e: e.step)


def caught(curve, routes=ROUTES) -> bool:
    hi = curve.onset_step + default_window("overfitting", len(curve.loss))
    return any(curve.onset_step <= e.step <= hi for e in events(curve, routes))


def early(curve, routes=ROUTES) -> bool:
    return any(e.step < curve.onset_step for e in events(curve, routes))


@pytest.fixture(scope="module")
def real():
    return [c for c in load_suite("datasets/real") if has_val(c)]


@pytest.fixture(scope="module")
def synthetic():
    return [c for c in load_suite() if has_val(c)]


def of_kind(curves, kind):
    return [c for c in curves if str(c.kind) == kind]


def faulty(curves):
    return [c for c in curves if str(c.kind) not in ("healthy", "overfitting")]


def test_real_overfitting_runs_are_caught_within_the_window(real):
    runs = of_kind(real, "overfitting")
    assert len(runs) >= 10
    rate = np.mean([caught(c) for c in runs])
    assert rate >= 0.9, rate


def test_the_memorisation_climb_catches_what_the_break_out_misses(real):
    runs = of_kind(real, "overfitting")
    both = np.mean([caught(c) for c in runs])
    breakout_only = np.mean([caught(c, NO_CLIMB) for c in runs])
    climb_only = np.mean([caught(c, CLIMB_ONLY) for c in runs])
    assert both > breakout_only, (both, breakout_only)
    assert climb_only > 0


def test_healthy_runs_stay_quiet(real, synthetic):
    real_rate = np.mean([bool(events(c)) for c in of_kind(real, "healthy")])
    assert real_rate <= 0.02, real_rate
    assert not any(events(c) for c in of_kind(synthetic, "healthy"))


def test_the_memorisation_climb_alone_never_fires_on_healthy_runs_or_before_an_onset(real, synthetic):
    for curves in (real, synthetic):
        assert not any(events(c, CLIMB_ONLY) for c in of_kind(curves, "healthy"))
        assert not any(early(c, CLIMB_ONLY) for c in faulty(curves))


def test_no_alarm_before_the_onset_of_other_faults(real, synthetic):
    assert np.mean([early(c) for c in faulty(real)]) <= 0.02
    assert not any(early(c) for c in faulty(synthetic))


def test_the_event_names_the_best_validation_and_the_route(real):
    for c in of_kind(real, "overfitting"):
        for rule in ROUTES:
            for e in scan(rule, c.loss, (c.val_steps, c.val_loss)):
                assert e.onset_step in set(c.val_steps.tolist())
                assert e.onset_step < e.step
                assert "restore the step-" in e.message
                assert e.detector == rule.__name__ and PHRASE[rule] in e.message, e.message
                assert [p in e.message for p in PHRASE.values()].count(True) == 1 + (rule is LevelStepOverfitting)


@pytest.mark.parametrize("rule", ROUTES, ids=lambda r: r.__name__)
@pytest.mark.parametrize("kind", ["overfitting", "healthy"])
def test_scan_matches_update_on_real_runs(real, kind, rule):
    for c in of_kind(real, kind)[:6]:
        batch = rule()
        got = batch.scan(loss=c.loss, val_loss=(c.val_steps, c.val_loss))
        stream = rule()
        val = dict(zip(c.val_steps.tolist(), c.val_loss.tolist()))
        want = [e for s, x in enumerate(c.loss.tolist()) for e in stream.update(loss=x, val_loss=val.get(s), step=s)]
        assert [(e.step, e.onset_step, e.message) for e in got] == [(e.step, e.onset_step, e.message) for e in want]
        assert close_state(batch.state_dict(), stream.state_dict())


def plateau_then(tail, **kw):
    """Break-out events on a validation curve that reaches its best (0.5) at step 400, then ``tail``."""
    vals = [1.0, 0.8, 0.6, 0.5] + [0.5 * x for x in tail]
    val = {100 * (i + 1): v for i, v in enumerate(vals)}
    det = BreakoutOverfitting(**kw)
    evs = [e for s in range(0, 100 * len(vals) + 1, 10)
           for e in det.update(loss=1.0 / (1 + s / 100), val_loss=val.get(s), step=s)]
    return [(e.step, e.onset_step) for e in evs]


def test_the_trend_test_uses_the_student_t_critical_value_of_its_degrees_of_freedom():
    # best + 3 validations: slope t = 3.9 on 2 degrees of freedom, below t(0.975, 2) = 4.30
    tail = [1.05, 1.05, 1.13]
    assert plateau_then(tail) == []
    assert plateau_then(tail, confidence=0.95) == [(700, 400)]  # t(0.95, 2) = 2.92
    # one more rise: 5 validations, 3 degrees of freedom, critical value 3.18
    assert plateau_then(tail + [1.15]) == [(800, 400)]


@pytest.mark.parametrize("rule, kw, name", [
    (BreakoutOverfitting, {"confidence": 0.5}, "confidence"),
    (BreakoutOverfitting, {"confidence": 1.0}, "confidence"),
    (LevelStepOverfitting, {"confidence": float("nan")}, "confidence"),
    (MemorisationClimbOverfitting, {"rises": 1}, "rises"),
    (MemorisationClimbOverfitting, {"rises": 2.5}, "rises"),
    (MemorisationClimbOverfitting, {"train_fall": 0.0}, "train_fall"),
    (LevelStepOverfitting, {"train_fall": 1.0}, "train_fall"),
    (LevelStepOverfitting, {"train_fall": float("nan")}, "train_fall"),
    (BreakoutOverfitting, {"cooldown": -1}, "cooldown"),
])
def test_bad_config_names_the_parameter(rule, kw, name):
    with pytest.raises(ValueError, match=name):
        rule(**kw)


def stepped_run(seed: int, train_drop: float, lift: float = 1.7, n_val: int = 24):
    """A run that generalises to its best validation at step 500, then its validation loss
    jumps ``lift`` times onto a noisy level (overshooting first, so neither a steady climb nor a
    run of rises shows), while the train loss, flat before, falls ``train_drop`` times over the
    next three evaluations. Returns ``(loss, (val_steps, val_values))``."""
    rng = np.random.default_rng(seed)
    every, best = 50, 500
    steps = np.arange(every * n_val + 1)
    train = 2.3 * np.exp(-np.minimum(steps, best) / 300) + 0.3
    train = train * train_drop ** -np.clip((steps - best) / (3 * every), 0, 1)
    train = train * np.exp(rng.normal(0, 0.05, len(steps)))
    vs = np.arange(1, n_val + 1) * every
    val = 2.3 * np.exp(-np.minimum(vs, best) / 300) + 0.5
    val = val * np.where(vs == best + every, lift * 1.15, np.where(vs > best, lift, 1.0))
    val = val * np.exp(rng.normal(0, 0.03, n_val))
    return train, (vs, val)


@pytest.mark.parametrize("seed", range(6))
def test_a_jump_onto_a_higher_level_while_the_train_loss_collapses_is_caught(seed):
    loss, val = stepped_run(seed, train_drop=50.0)
    evs = sorted((e for rule in ROUTES for e in scan(rule, loss, val)), key=lambda e: e.step)
    assert evs, "missed"
    assert evs[0].onset_step == 500 and evs[0].step <= 500 + 6 * 50


@pytest.mark.parametrize("seed", range(6))
def test_the_same_jump_while_the_train_loss_creeps_is_left_alone(seed):
    # a validation bump while the train loss falls 20 %: a meander a healthy run takes back,
    # not a gap that widened by 1 / (1 - climb_train_fall)
    loss, val = stepped_run(seed, train_drop=1.25)
    assert scan(LevelStepOverfitting, loss, val) == []


@pytest.mark.parametrize("seed", range(3))
def test_the_level_step_fires_where_the_other_routes_are_silent(seed):
    loss, val = stepped_run(seed, train_drop=50.0)
    level = scan(LevelStepOverfitting, loss, val)
    assert level, "missed"
    assert all(e.step > level[0].step for rule in (BreakoutOverfitting, MemorisationClimbOverfitting)
               for e in scan(rule, loss, val))


def twice_run(seed: int, comes_back: bool = True):
    """A run that generalises, its validation loss meandering up 12 % once, to its best
    validation at step 500; the validation loss then climbs 40 % by step 700 while the train
    loss keeps falling, and either comes back to 3 % above its best by step 800 (inside the
    earlier meanders, never a new best) and climbs 40 % again from step 1100, or stays up."""
    rng = np.random.default_rng(seed)
    every, best = 50, 500
    steps = np.arange(2001)
    train = (2.3 * np.exp(-steps / 300) + 0.3) * 10 ** -np.clip((steps - best) / 1500, 0, None)
    train = train * np.exp(rng.normal(0, 0.05, len(steps)))
    vs = np.arange(1, 41) * every
    val = 2.3 * np.exp(-np.minimum(vs, best) / 300) + 0.5
    first = np.clip((vs - best) / 200, 0, 1)
    if comes_back:
        first = np.where(vs >= 800, 0.075, first) + np.clip((vs - 1100) / 200, 0, 1)
    val = val * np.where(vs == 300, 1.25, 1.0)  # a meander on the way down: 12 % up
    noise = np.where(vs < best, rng.normal(0, 0.02, len(vs)), rng.normal(0, 0.005, len(vs)) * (vs > best))
    val = val * (1 + 0.4 * first) * np.exp(noise)
    return train, (vs, val)


@pytest.mark.parametrize("seed", range(4))
def test_an_overfit_taken_back_then_resumed_is_reported_again(seed):
    # once the validation loss comes back at least halfway from the rise the first alarm
    # reported, that rise was taken back: the second climb, which never beats the best, is news
    steps = [e.step for e in scan(BreakoutOverfitting, *twice_run(seed))]
    assert len(steps) == 2 and 500 < steps[0] <= 800 and 1100 < steps[1] <= 1500, steps
    stays = [e.step for e in scan(BreakoutOverfitting, *twice_run(seed, comes_back=False))]
    assert len(stays) == 1 and 500 < stays[0] <= 800, stays


def test_streaming_rearms_like_the_scan():
    loss, (vs, vals) = twice_run(0)
    a, b = BreakoutOverfitting(), BreakoutOverfitting()
    ea = a.scan(loss=loss, val_loss=(vs, vals))
    val_at = dict(zip(vs.tolist(), vals.tolist()))
    eb = [e for s, x in enumerate(loss.tolist()) for e in b.update(loss=x, val_loss=val_at.get(s), step=s)]
    assert [(e.step, e.onset_step, e.message) for e in ea] == [(e.step, e.onset_step, e.message) for e in eb]
    assert len(ea) == 2
    assert close_state(a.state_dict(), b.state_dict())


def test_a_climb_inside_a_wide_earlier_wobble_is_reported_once():
    # the memorisation climb fires inside the wobble (a 58 % meander before the best); the
    # validation loss then keeps creeping up: one alarm, not one every other evaluation
    steps = np.arange(1001)
    train = np.where(steps < 300, 1.0 - steps / 600, 0.5 * 10 ** (-(steps - 300) / 150))
    vs = np.arange(1, 21) * 50
    val = np.array([0.56, 0.40, 0.275, 0.434, 0.404, 0.252] + [0.252 * (1.16 + 0.006 * k) for k in range(14)])
    val[6:9] = 0.252 * np.array([1.08, 1.13, 1.16])
    evs = scan(MemorisationClimbOverfitting, train, (vs, val))
    assert len(evs) == 1 and evs[0].onset_step == 300, [e.step for e in evs]
    assert all(len(scan(rule, train, (vs, val))) <= 1 for rule in ROUTES)


# the memorisation rules and the validation metric: a climb while the model still gets better is no overfit
_CLIMB_VAL = {100: 1.0, 200: 0.7, 300: 0.9, 400: 0.69, 500: 0.70, 600: 0.71, 700: 0.72, 800: 0.73}


def _climb(rule, metric: dict[int, float] | None, **kw) -> list[tuple[int, int]]:
    """The docstring's climb (val up at each evaluation from step 400, the train loss collapsing)."""
    det = rule(**kw)
    out = []
    for s in range(0, 801, 10):
        loss = 1.0 / (1 + s / 100) if s <= 400 else 0.2 * 10 ** ((400 - s) / 200)
        sig = {"loss": loss, "val_loss": _CLIMB_VAL.get(s), "val_metric": None if metric is None else metric.get(s)}
        out += [(e.step, e.onset_step) for e in det.update(step=s, **sig)]
    return out


def test_a_memorisation_climb_while_the_metric_still_improves_is_left_alone():
    improving = {100: 0.50, 200: 0.60, 300: 0.62, 400: 0.70, 500: 0.72, 600: 0.74, 700: 0.76, 800: 0.78}
    stalled = {**improving, 500: 0.69, 600: 0.70, 700: 0.69, 800: 0.68}
    assert _climb(MemorisationClimbOverfitting, None) == [(700, 400)]
    assert _climb(MemorisationClimbOverfitting, stalled) == [(700, 400)]
    assert _climb(MemorisationClimbOverfitting, improving) == []
    # an error rate improves downwards: the same numbers as an error rate are a metric getting worse
    assert _climb(MemorisationClimbOverfitting, improving, mode="min") == [(700, 400)]
    error = {s: 1.0 - a for s, a in improving.items()}
    assert _climb(MemorisationClimbOverfitting, error, mode="min") == []


def test_the_break_out_reads_no_metric():
    assert "val_metric" not in [i.name for i in BreakoutOverfitting.inputs]
    assert "val_metric" in [i.name for i in LevelStepOverfitting.inputs]
    with pytest.raises(TypeError, match="val_metric"):
        BreakoutOverfitting().update(loss=1.0, val_loss=1.0, val_metric=0.5)
