"""A stream logged every N steps: detectors' spans scaled to the interval (``interval_settings``, ``log_every``)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import trainsignals as ts
from trainsignals.curves import standard_suite
from trainsignals.detectors import Detector, Input, interval_settings
from trainsignals.detectors._interval import MIN_VALUES, RATE_CAP
from trainsignals.eval.bench import score
from trainsignals.suite import SUITE_NAMES


def _classes() -> list[type]:
    out: list[type] = []
    for name in SUITE_NAMES:
        cls = type(ts.default_suite(calibrated=False)[name])
        if cls not in out:
            out.append(cls)
    return out


def test_one_value_a_step_changes_nothing() -> None:
    for cls in _classes():
        assert interval_settings(cls, 1, {"cooldown": 7}) == {"cooldown": 7}
    assert ts.default_suite(total_steps=3000, log_every=1).keys() == ts.default_suite(total_steps=3000).keys()
    for name, det in ts.default_suite(total_steps=3000, log_every=1).items():
        assert repr(det) == repr(ts.default_suite(total_steps=3000)[name])


def test_spans_shrink_to_the_same_steps_down_to_their_floor() -> None:
    # the coupling rules' lag is 250 steps: 25 values at one every 10 steps, never fewer than MIN_VALUES
    assert interval_settings(ts.GradLossDecoupling, 10)["lag"] == 25
    assert interval_settings(ts.GradLossDecoupling, 100)["lag"] == MIN_VALUES
    # a setting already below its floor stays as the user set it
    assert interval_settings(ts.GradLossDecoupling, 100, {"lag": 5})["lag"] == 5
    # a floor named by another parameter: the reference settles no sooner than the warm-up
    s = interval_settings(ts.UpdateRatioAboveBand, 50, {"warmup": 12})
    assert s["settle"] == 12 and s["warmup"] == 12
    # other settings pass through untouched
    assert interval_settings(ts.GradLossDecoupling, 10, {"orders": 2.0})["orders"] == 2.0


def test_rates_keep_their_memory_in_steps_up_to_the_cap() -> None:
    a = ts.GradLossDecoupling().alpha
    assert interval_settings(ts.GradLossDecoupling, 2)["alpha"] == pytest.approx(1 - (1 - a) ** 2)
    assert interval_settings(ts.GradLossDecoupling, 50)["alpha"] == pytest.approx(RATE_CAP)
    # a rate already above the cap is never made slower
    assert interval_settings(ts.GradLossDecoupling, 50, {"alpha": 0.5})["alpha"] == 0.5


def test_sample_sizes_stay_in_values() -> None:
    # windows of a statistic (a t-test's window, a peak's reference, a swing's robust scale) are sample
    # sizes: their false-alarm rate at a threshold depends on how many values they hold
    for cls in (ts.TrendDivergence, ts.PeakRatioSpike, ts.SwingRatioEdgeOfStability, ts.LostProgress):
        assert interval_settings(cls, 10) == {}


@pytest.mark.parametrize("bad", [0, -3, 2.5, True, "10"])
def test_a_bad_interval_is_refused_naming_it(bad: object) -> None:
    with pytest.raises(ValueError, match="every"):
        interval_settings(ts.GradLossDecoupling, bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="log_every"):
        ts.default_suite(log_every=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="log_every"):
        ts.Monitor(log_every=bad)  # type: ignore[arg-type]


@settings(max_examples=60, deadline=None)
@given(every=st.integers(1, 2000), total=st.one_of(st.none(), st.integers(1, 10**6)))
def test_every_interval_builds_a_valid_default_suite_within_the_floors(every: int, total: int | None) -> None:
    suite = ts.default_suite(total_steps=total, log_every=every)
    plain = ts.default_suite(total_steps=total)
    assert list(suite) == list(SUITE_NAMES)
    for name, det in suite.items():
        for p, least in type(det).spans.items():
            v, before = getattr(det, p), getattr(plain[name], p)
            floor = getattr(det, least) if isinstance(least, str) else least
            assert min(floor, before) <= v <= before
            assert v == max(min(floor, before), before // every)


def test_the_stall_patience_is_ten_percent_of_the_run_in_steps() -> None:
    # 10 % of 5,000 steps is 500 steps: 50 values at one every 10 steps, 10 at one every 50
    assert ts.default_suite(total_steps=5000, log_every=10)["stall_grad_collapse"].patience == 50
    assert ts.default_suite(total_steps=5000, log_every=50)["stall_grad_collapse"].patience == 10
    assert ts.default_suite(total_steps=5000, log_every=500)["stall_grad_collapse"].patience == MIN_VALUES
    # settings given by name are the user's, in values: not scaled
    assert ts.default_suite(log_every=10, joint_collapse={"lag": 300})["joint_collapse"].lag == 300


def test_the_monitor_keeps_its_interval_in_its_configuration() -> None:
    mon = ts.Monitor(total_steps=2000, log_every=20)
    assert mon.log_every == 20 and mon.config()["log_every"] == 20
    assert mon.detectors["grad_decoupling"].lag == 12
    rng = np.random.default_rng(3)
    for i in range(30):
        mon.update(step=20 * i, loss=float(np.exp(-i / 20 + rng.normal(0, 0.02))))
    other = ts.Monitor(total_steps=2000, log_every=20)
    other.load_state_dict(mon.state_dict())
    assert other.state_dict() == mon.state_dict()
    with pytest.raises(ValueError, match="log_every"):
        ts.Monitor(total_steps=2000).load_state_dict(mon.state_dict())
    # a snapshot written before the Monitor had log_every is one value a step
    old = ts.Monitor(total_steps=2000).state_dict()
    del old["config"]["log_every"]
    ts.Monitor(total_steps=2000).load_state_dict(old)
    with pytest.raises(ValueError, match="log_every"):
        ts.Monitor(total_steps=2000, log_every=5).load_state_dict(old)


def test_own_detectors_take_their_interval_when_built() -> None:
    with pytest.raises(TypeError, match="log_every"):
        ts.Monitor(suite=[ts.GradLossDecoupling()], log_every=10)

    class Held(Detector):
        """A user's rule declaring one span: the values a level must hold."""

        inputs = (Input("loss"),)
        spans = {"hold": 3}
        _state_keys = ("n",)

        def __init__(self, hold: int = 30) -> None:
            self.hold = hold
            self._reset()

        def _reset(self) -> None:
            self._n = 0

        def _step(self, loss: float, step: int) -> None:
            self._n += 1

    assert interval_settings(Held, 10) == {"hold": 3}
    assert Held(**interval_settings(Held, 10)).hold == 3


def _right_kind_rate(scored: object, kind: str) -> float:
    return float(scored.to_dict()["kinds"][kind]["rate"])  # type: ignore[attr-defined]


def test_told_the_interval_a_stall_in_a_sparse_log_is_named_without_more_healthy_alarms() -> None:
    """On a fresh draw of the synthetic suite (seed 11: no threshold was chosen on it), logged every 10 steps."""
    curves = [c.sampled(10) for c in standard_suite(seed=11) if c.kind in ("stall", "healthy")]
    told = score(lambda total_steps=None: ts.Monitor(total_steps=total_steps, log_every=10), curves)
    rows = score(lambda total_steps=None: ts.Monitor(total_steps=None if total_steps is None else total_steps // 10),
                 curves)
    t, r = told.to_dict(), rows.to_dict()
    assert _right_kind_rate(told, "stall") >= 0.4 > _right_kind_rate(rows, "stall") + 0.2
    assert t["healthy_alarm_rate"] <= r["healthy_alarm_rate"] + 0.02


def _restarts(steps: int, cycle: int, peak: float, warm: int, floor: float) -> np.ndarray:
    """Cosine with warm restarts down to ``floor`` x the peak, each cycle after a linear warm-up of ``warm`` steps."""
    t = np.arange(steps) % cycle
    up = peak * (t + 1) / warm
    down = peak * (floor + (1 - floor) / 2 * (1 + np.cos(np.pi * (t - warm) / (cycle - warm))))
    return np.where(t < warm, up, down)


@pytest.mark.parametrize("every", [1, 7, 10, 25])
def test_warm_restarts_seen_through_a_sparse_log_are_not_lr_anomalies(every: int) -> None:
    # down to 1 % or to 0: seen every 25 steps, a cosine to 0 drops 20x or more between its last logged values
    rng = np.random.default_rng(every)
    for _ in range(20):
        cycle, warm = int(rng.integers(150, 600)), int(rng.integers(1, 40))
        floor = float(rng.choice([0.0, 0.01]))
        lr = _restarts(3000, cycle, float(10 ** rng.uniform(-4, -1)), warm, floor)[every - 1::every]
        assert ts.LRJumpAnomaly().scan(lr=lr) == [], (cycle, warm, floor)


@pytest.mark.parametrize("floor", [0.0, 0.01])
def test_a_rate_cut_in_the_middle_of_a_decay_is_still_an_lr_anomaly(floor: float) -> None:
    lr = _restarts(3000, 3000, 1e-3, 10, floor)[9::10].copy()
    lr[120:] /= 100                            # falling by ~1e-6 a value, then by ~5e-4 at once
    assert [e.step for e in ts.LRJumpAnomaly().scan(lr=lr)] == [120]


def test_a_cut_after_a_step_decay_is_still_an_lr_anomaly() -> None:
    # a step decay takes 7.5e-3 off; the cut after it takes less, but the rate held in between
    lr = np.repeat([1e-2, 2.5e-3, 2.5e-5], 50)
    assert [e.step for e in ts.LRJumpAnomaly().scan(lr=lr)] == [100]
    assert [e.step for e in ts.LRJumpAnomaly().scan(lr=lr[9::10])] == [10]


def test_a_rate_set_in_the_wrong_unit_after_a_decay_is_still_an_lr_anomaly() -> None:
    lr = _restarts(3000, 3000, 1e-3, 10, 0.01)[9::10].copy()
    lr[150:] = lr[149] * 1000                  # the decayed rate x1000: far above the peak
    assert [e.step for e in ts.LRJumpAnomaly().scan(lr=lr)] == [150]


def _logged_explosion(every: int, at: int, n: int = 30, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A grad norm logged every ``every`` steps (steps every-1, 2*every-1, ...) that jumps 40x at row ``at`` and stays."""
    rng = np.random.default_rng(seed)
    steps = np.arange(1, n + 1) * every - 1
    grad = np.exp(rng.normal(0.0, 0.1, n)) * np.where(np.arange(n) >= at, 40.0, 1.0)
    return steps, grad


@pytest.mark.parametrize("cls", [ts.EWMAZSpike, ts.ConfirmedZSpike, ts.LevelShift])
def test_the_z_rules_warm_up_on_values_covering_twenty_steps_not_on_twenty_values(cls: type) -> None:
    """In a log written every 50 steps, 20 values are 1,000 steps: the rules judge after 8 rows."""
    settings = {"signal": "grad_norm", "kind": "grad_explosion", "threshold": 6.0, "min_ratio": 10.0}
    steps, grad = _logged_explosion(50, at=10)
    evs = cls(**interval_settings(cls, 50, settings)).scan(steps=steps, grad_norm=grad)
    assert evs and steps[10] <= evs[0].step <= steps[15] and evs[0].onset_step == steps[10]
    # the same values one a step: 20 values are 20 steps, and the jump at the 11th is not judged
    assert cls(**settings).scan(grad_norm=grad) == []
    # before 8 rows nothing is judged, whatever steps they cover
    steps, grad = _logged_explosion(50, at=5)
    assert cls(**interval_settings(cls, 50, settings)).scan(steps=steps, grad_norm=grad) == []


def test_the_peak_rule_warms_up_on_values_covering_twenty_steps() -> None:
    steps, grad = _logged_explosion(50, at=10)
    grad[11:] = grad[:19]  # one value, 40x: a peak, not a level
    evs = ts.PeakRatioSpike(signal="grad_norm", kind="grad_explosion").scan(steps=steps, grad_norm=grad)
    assert [e.step for e in evs] == [steps[10]]
    assert ts.PeakRatioSpike(signal="grad_norm", kind="grad_explosion").scan(grad_norm=grad) == []


def test_told_the_interval_a_grad_explosion_in_a_sparse_log_is_named_without_more_healthy_alarms(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """On a fresh draw of the synthetic suite (seed 13: no threshold was chosen on it), logged every 50 steps;
    against the same Monitor warmed up on 20 values whatever steps they cover."""
    import trainsignals.detectors._interval as interval

    curves = [c.sampled(50) for c in standard_suite(seed=13) if c.kind in ("grad_explosion", "healthy")]
    told = score(lambda total_steps=None: ts.Monitor(total_steps=total_steps, log_every=50), curves).to_dict()
    monkeypatch.setattr(interval, "MIN_WARM", 20)  # the warm-up's 20 values, whatever steps they cover
    values = score(lambda total_steps=None: ts.Monitor(total_steps=total_steps, log_every=50), curves).to_dict()
    assert told["kinds"]["grad_explosion"]["rate"] >= values["kinds"]["grad_explosion"]["rate"] + 0.15
    assert told["healthy_alarm_rate"] <= values["healthy_alarm_rate"]


@pytest.mark.parametrize("every", [1, 25, 1000])
def test_a_lasting_climb_is_reported_again_only_on_values_the_last_report_did_not_use(every: int) -> None:
    # a loss that falls, then climbs 6 % a row through noise for 400 rows, logged every `every` steps:
    # after each report the window rules wait for their cooldown (100 steps) and for their window to pass,
    # so a sparse log is not told of the same climb at every row, on nineteen twentieths of the same values
    rng = np.random.default_rng(11)
    n = 600
    y = np.where(np.arange(n) < 200, -np.arange(n) / 200, -1.0 + 0.06 * (np.arange(n) - 200))
    loss = np.exp(y + rng.normal(0, 0.005, n))
    steps = np.arange(n) * every
    for cls in (ts.TrendDivergence, ts.EarlyClimbDivergence):
        det = cls()
        events = det.scan(loss=loss, steps=steps)
        assert events and all(e.kind.value == "divergence" for e in events)
        assert events[0].onset_step >= 190 * every  # the climb, not the fall before it
        span = (det.window if cls is ts.TrendDivergence else det.steps + 1) - 1  # the evidence window, in rows
        gaps = np.diff([e.step for e in events])
        assert len(gaps) and (gaps > max(det.cooldown, span * every)).all(), (cls.__name__, gaps)
        assert len(events) <= 400 // span + 1  # a report every `every` steps before: 400 of them at every=1000
        if cls is ts.TrendDivergence:  # its fitted rate is per value: per step only at one value a step
            assert ("% per step" in events[0].message) == (every == 1), events[0].message
        fresh = cls()
        streamed = [e for i, x in enumerate(loss) for e in fresh.update(loss=float(x), step=int(steps[i]))]
        assert [(e.step, e.onset_step) for e in streamed] == [(e.step, e.onset_step) for e in events]


@pytest.mark.parametrize("every", [1, 10, 500])
def test_a_failed_state_lasts_at_least_eight_logged_values(every: int) -> None:
    # recovery is 200 steps: at one value a step 200 values, in a log written every 500 steps less than one
    # row, so a status band would show a sliver; it lasts max(200, 8 * every) steps, the same for replay
    mon = ts.Monitor(log_every=every, warmup=0)
    assert mon.recovery == 200 and mon.recovery_steps == max(200, 8 * every)
    shown = []
    for row in range(300):
        step = row * every
        told = [ts.make_event(ts.Kind.OSCILLATION, "warning", step, step, "Told", "loss", 1.0, 1.0, "swings")] \
            if row == 10 else None
        mon.update(step=step, events=told)  # no signal: only the finding told
        shown.append(mon.status)
    rows = -(-mon.recovery_steps // every)  # the rows within recovery_steps of the event's
    assert shown == ["healthy"] * 10 + ["oscillating"] * rows + ["healthy"] * (290 - rows)
