"""trainsignals.testing: the assertions, the ways a detector is run, and the pytest plugin."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import trainsignals
import trainsignals.testing as plugin
from trainsignals._events import Event, Kind
from trainsignals.curves import KINDS, Curve, generate
from trainsignals.testing import assert_detects, assert_quiet, curve_params, default_within, run_detector

# The plugin's fixtures, whether or not the package registers this module as a pytest11 plugin.
failure_curves = plugin.failure_curves
failure_curve_factory = plugin.failure_curve_factory


def ev(step: int, kind: str = "divergence", severity: str = "warning", onset: int | None = None) -> Event:
    return Event(
        Kind(kind), severity, step, step if onset is None else onset, "Fake", "loss", 1.0, 0.5, "fake", "c", "f"
    )


class Scripted:
    """A detector of the contract's shape that says what it is told, relative to the curve's onset."""

    def __init__(self, script: list[tuple[int, str, str]], signals: tuple[str, ...] = ("loss",)) -> None:
        self.script = script
        self.inputs = tuple(trainsignals.Input(n) for n in signals)
        self.resets = 0
        self.seen: dict[str, Any] = {}
        self.seen_steps: Any = None
        self.onset = 0

    def reset(self) -> None:
        self.resets += 1

    def scan(self, *, steps: Any = None, **signals: Any) -> list[Event]:
        self.seen, self.seen_steps = signals, steps
        return [ev(self.onset + d, kind, sev) for d, kind, sev in self.script]


class LossJump:
    """A tiny real detector: warns when the loss exceeds ``factor`` x the median of its last 20 values."""

    inputs = (trainsignals.Input("loss"),)

    def __init__(self, factor: float, kind: str = "divergence") -> None:
        self.factor = factor
        self.kind = kind

    def reset(self) -> None:
        pass

    def scan(self, *, loss: np.ndarray, steps: np.ndarray | None = None) -> list[Event]:
        assert steps is not None
        for i in range(20, len(loss)):
            if not np.isfinite(loss[i]) or loss[i] > self.factor * np.median(loss[i - 20:i]):
                return [ev(int(steps[i]), self.kind)]
        return []


@pytest.fixture
def curve() -> Curve:
    return generate("divergence", 7, "easy")


def scripted(curve: Curve, script: list[tuple[int, str, str]], **kw: Any) -> Scripted:
    det = Scripted(script, **kw)
    det.onset = curve.onset_step
    return det


# ------------------------------------------------------------------------------------ assert_detects


def test_detects_a_real_divergence_with_a_tiny_detector(curve: Curve) -> None:
    e = assert_detects(LossJump(3.0), curve)
    assert e.kind == Kind.DIVERGENCE and curve.onset_step <= e.step <= curve.onset_step + default_within(curve)


def test_tiny_detector_is_quiet_on_a_healthy_run() -> None:
    assert assert_quiet(LossJump(3.0), generate("healthy", 1, "easy")) == []


def test_detects_returns_the_first_match_in_the_window(curve: Curve) -> None:
    det = scripted(curve, [(0, "loss_spike", "info"), (4, "divergence", "warning"), (9, "divergence", "critical")])
    e = assert_detects(det, curve)
    assert e.step == curve.onset_step + 4
    assert det.resets == 1
    assert det.seen["loss"] is curve.loss and det.seen_steps is curve.steps


def test_detects_fails_when_too_late(curve: Curve) -> None:
    late = default_within(curve) + 1
    with pytest.raises(AssertionError, match="outside the window") as info:
        assert_detects(scripted(curve, [(late, "divergence", "warning")]), curve)
    assert curve.name in str(info.value)
    assert_detects(scripted(curve, [(late, "divergence", "warning")]), curve, within=late)


def test_detects_fails_on_the_wrong_kind(curve: Curve) -> None:
    det = scripted(curve, [(2, "loss_spike", "warning")])
    with pytest.raises(AssertionError, match="no 'divergence' event") as info:
        assert_detects(det, curve)
    assert "loss_spike" in str(info.value)
    assert assert_detects(det, curve, kind=Kind.LOSS_SPIKE).kind == Kind.LOSS_SPIKE
    assert assert_detects(det, curve, kind="loss_spike").step == curve.onset_step + 2


def test_detects_fails_on_an_early_alarm(curve: Curve) -> None:
    det = scripted(curve, [(-30, "oscillation", "warning"), (1, "divergence", "critical")])
    with pytest.raises(AssertionError, match="before the onset"):
        assert_detects(det, curve)
    assert assert_detects(det, curve, allow_early=True).step == curve.onset_step + 1
    # info events before the onset are not alarms
    assert_detects(scripted(curve, [(-30, "oscillation", "info"), (1, "divergence", "warning")]), curve)


def test_an_early_event_of_the_kind_does_not_count_as_detection(curve: Curve) -> None:
    det = scripted(curve, [(-5, "divergence", "warning")])
    with pytest.raises(AssertionError, match="outside the window"):
        assert_detects(det, curve, allow_early=True)


def test_detects_fails_when_silent(curve: Curve) -> None:
    with pytest.raises(AssertionError, match="no events"):
        assert_detects(scripted(curve, []), curve)


def test_detects_refuses_a_healthy_curve_and_a_negative_window(curve: Curve) -> None:
    with pytest.raises(ValueError, match="assert_quiet"):
        assert_detects(scripted(curve, []), generate("healthy", 0))
    with pytest.raises(ValueError, match="within"):
        assert_detects(scripted(curve, []), curve, within=-1)


def test_default_window() -> None:
    assert default_within(generate("stall", 0, n_steps=400)) == 50
    assert default_within(generate("stall", 0, n_steps=1500)) == 150


# ------------------------------------------------------------------------------------ assert_quiet


def test_quiet_passes_with_info_events_only() -> None:
    c = generate("healthy", 3)
    det = Scripted([(10, "loss_spike", "info")])
    assert [e.severity for e in assert_quiet(det, c)] == ["info"]


@pytest.mark.parametrize("severity", ["warning", "critical"])
def test_quiet_fails_on_alarms(severity: str) -> None:
    c = generate("healthy", 3)
    with pytest.raises(AssertionError, match="step 10") as info:
        assert_quiet(Scripted([(10, "stall", severity), (20, "stall", "info")]), c)
    assert c.name in str(info.value) and "stall" in str(info.value)


def test_quiet_with_chosen_severities() -> None:
    c = generate("healthy", 3)
    det = Scripted([(10, "loss_spike", "info")])
    with pytest.raises(AssertionError):
        assert_quiet(det, c, severities=("info",))
    assert_quiet(Scripted([(10, "stall", "warning")]), c, severities=("critical",))


# ------------------------------------------------------------------------------------ running detectors


def test_signal_names_map_to_the_curve() -> None:
    c = generate("dead_units", 4)
    det = Scripted([], signals=("loss", "grad_norm"))
    run_detector(det, c)
    assert det.seen["loss"] is c.loss and det.seen["grad_norm"] is c.grad_norm and det.seen_steps is c.steps

    det = Scripted([], signals=("update_ratio",))
    run_detector(det, c)
    assert set(det.seen) == {"update_ratio"} and det.seen["update_ratio"] is c.update_ratio

    det = Scripted([], signals=("val_loss",))
    run_detector(det, c)
    assert det.seen["val_loss"][0] is c.val_steps and det.seen["val_loss"][1] is c.val_loss

    det = Scripted([], signals=("layer_grad_norms",))
    run_detector(det, c)
    assert list(det.seen["layer_grad_norms"]) == list(c.layer_names) and det.seen_steps is c.steps

    det = Scripted([], signals=("activations",))
    run_detector(det, c)
    st, acts = det.seen["activations"]
    assert list(acts) == list(c.act_layer_names) and st is c.act_steps
    np.testing.assert_array_equal(acts[c.act_layer_names[0]]["dead_frac"], c.dead_frac[:, 0])


def test_unknown_signals_are_refused() -> None:
    c = generate("stall", 0)
    with pytest.raises(TypeError, match="weights"):
        run_detector(Scripted([], signals=("weights",)), c)


def test_monitor_like_objects_get_every_signal(monkeypatch: pytest.MonkeyPatch) -> None:
    c = generate("stall", 0)
    calls: list[str] = []

    class FakeMonitor:
        def reset(self) -> None:
            calls.append("reset")

        def scan(self, **signals: Any) -> list[Event]:
            calls.append("scan")
            assert set(signals) == set(c.signals())
            return [ev(c.onset_step + 1, "stall")]

    monkeypatch.setattr(trainsignals, "Monitor", FakeMonitor)
    assert assert_detects(FakeMonitor(), c).kind == Kind.STALL
    assert calls == ["reset", "scan"]

    class KeywordScanner:  # no Monitor, no signals attribute: the Monitor keywords too
        def scan(self, **signals: Any) -> list[Event]:
            return [ev(c.onset_step, "stall")]

    assert assert_detects(KeywordScanner(), c).step == c.onset_step


def test_plain_callables_and_non_detectors() -> None:
    c = generate("loss_spike", 2)
    assert assert_detects(lambda curve: [ev(curve.onset_step, "loss_spike")], c).step == c.onset_step
    with pytest.raises(TypeError, match="cannot run"):
        run_detector(object(), c)


# ------------------------------------------------------------------------------------ the plugin


def test_curve_params() -> None:
    params = curve_params(["stall", "healthy"], n=4)
    assert [p.id for p in params] == [
        "stall-easy-0", "stall-medium-1", "stall-hard-2", "stall-easy-3",
        "healthy-easy-0", "healthy-medium-1", "healthy-hard-2", "healthy-easy-3",
    ]
    assert all(isinstance(p.values[0], Curve) for p in params)
    assert len(curve_params(n=1)) == 14
    assert [p.id for p in curve_params("overfitting", n=1)] == ["overfitting-easy-0"]


@pytest.mark.parametrize("c", curve_params(["loss_spike"], n=2))
def test_curve_params_drive_parametrize(c: Curve) -> None:
    assert_detects(LossJump(1.4, kind="loss_spike"), c)


def test_factory_fixture(failure_curve_factory: Any) -> None:
    assert failure_curve_factory is generate
    assert failure_curve_factory("stall", 1).kind == "stall"


def test_suite_fixture(failure_curves: list[Curve]) -> None:
    kinds = {c.kind for c in failure_curves}
    assert kinds == set(KINDS) | {"healthy"}
    assert len(failure_curves) >= 14 * 30 + 150


# ------------------------------------------------------------------------------------ mistakes refused


@pytest.mark.parametrize("severities", [("warnings",), ("warning", "fatal"), (), ["WARNING"]])
def test_quiet_refuses_what_is_not_a_severity(severities: Any) -> None:
    c = generate("healthy", 3)
    det = Scripted([(10, "stall", "warning")])          # an alarm a typo would let through
    with pytest.raises(ValueError, match="severities"):
        assert_quiet(det, c, severities=severities)
    assert det.seen == {}                                # refused before running anything


def test_quiet_takes_one_severity_as_a_string() -> None:
    c = generate("healthy", 3)
    with pytest.raises(AssertionError, match="1 critical event"):
        assert_quiet(Scripted([(10, "stall", "critical"), (20, "stall", "warning")]), c, severities="critical")


def test_detects_refuses_a_kind_that_is_not_one(curve: Curve) -> None:
    with pytest.raises(ValueError, match="kind must be a trainsignals.Kind .*got 'divergance'"):
        assert_detects(scripted(curve, [(5, "divergence", "warning")]), curve, kind="divergance")
    assert assert_detects(scripted(curve, [(5, "divergence", "warning")]), curve, kind=Kind.DIVERGENCE).kind is \
        Kind.DIVERGENCE


@pytest.mark.parametrize(("kinds", "n", "message"), [
    (["divergance"], 1, "kinds must be failure kinds"),
    (["replica_divergence"], 1, "kinds must be failure kinds of a single run"),
    ("stall", 0, "n must be an integer >= 1"),
])
def test_curve_params_refuses_bad_kinds_and_counts(kinds: Any, n: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        curve_params(kinds, n=n)
