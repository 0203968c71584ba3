"""The public suite and the detector contract: a user's own detector, from outside the package,
runs in a Monitor like ours: through ``update``, ``scan``, ``state_dict``, a trace and ``replay``."""

from __future__ import annotations

import json
import math
import pickle

import numpy as np
import pytest

import trainsignals as ts
from trainsignals.testing import check_detector


class LossAboveCeiling(ts.Detector):
    """A user's rule: the loss rose above ``ratio`` times its first value; once per excursion."""

    inputs = (ts.Input("loss"), ts.Input("lr", required=False))
    _state_keys = ("first", "above", "last_step")

    def __init__(self, ratio: float = 3.0) -> None:
        ts.check_range("ratio", ratio, 1, None, lo_open=True)
        self.ratio = ratio
        self._reset()

    def _reset(self) -> None:
        self._first = None
        self._above = False
        self._last_step = -1

    def _step(self, loss: float, lr: float, step: int) -> ts.Event | None:
        self._last_step = step
        if not math.isfinite(loss):
            return None
        if self._first is None:
            self._first = loss
            return None
        limit = self.ratio * self._first
        if loss <= limit:
            self._above = False
            return None
        if self._above:
            return None
        self._above = True
        why = "" if math.isnan(lr) else f" at lr {lr:g}"
        return ts.make_event(ts.Kind.DIVERGENCE, "warning", step, step, type(self).__name__, "loss", loss,
                             limit, f"loss {loss:.3g} is above {self.ratio}x its first value{why}")


def run_loss(n: int = 300, jump_at: int = 200) -> np.ndarray:
    rng = np.random.default_rng(0)
    loss = 2.0 * np.exp(-np.arange(n) / 300) * np.exp(rng.normal(0, 0.01, n))
    loss[jump_at:] *= 20.0
    return loss


def mine(events: list[ts.Event]) -> list[tuple[int, str]]:
    return [(e.step, e.detector) for e in events if e.detector == "LossAboveCeiling"]


def test_the_user_detector_passes_the_conformance_checks():
    check_detector(LossAboveCeiling)


class NoLastStep(LossAboveCeiling):
    _state_keys = ("first", "above")

    def _reset(self) -> None:
        self._first = None
        self._above = False


class PrivateSetting(LossAboveCeiling):
    def __init__(self, limit: float = 3.0) -> None:
        self._limit = limit
        self.ratio = limit
        self._reset()


@pytest.mark.parametrize(("cls", "says"), [(NoLastStep, r"self\._last_step = -1 in _reset\(\)"),
                                           (PrivateSetting, r"keep the constructor argument 'limit' as self\.limit")])
def test_a_detector_missing_what_the_base_needs_is_named_when_it_joins(cls, says):
    """Not an AttributeError from deep in a run: the Monitor and check_detector say what to add."""
    with pytest.raises(TypeError, match=says):
        ts.Monitor(suite={"mine": cls()})
    with pytest.raises(AssertionError, match=says):
        check_detector(cls)


def test_default_suite_is_plain_editable_data():
    suite = ts.default_suite(total_steps=2_000)
    assert list(suite) == list(ts.Monitor().detectors)
    assert {suite[n].patience for n in suite if n.startswith("stall_")} == {200}
    assert all(isinstance(d, ts.Detector) for d in suite.values())
    del suite["sawtooth"]
    suite["loss_spike"] = ts.EWMAZSpike(threshold=9.0)
    mon = ts.Monitor(suite=suite)
    assert "sawtooth" not in mon.detectors and mon.detectors["loss_spike"].threshold == 9.0
    with pytest.raises(TypeError, match="suite"):
        ts.Monitor(suite=suite, loss_spike={"threshold": 3})
    with pytest.raises(ValueError, match="Detector"):
        ts.Monitor(suite={"x": object()})
    with pytest.raises(TypeError, match="not_a_detector"):
        ts.default_suite(not_a_detector={})
    with pytest.raises(ValueError, match="loss_spike.threshold"):
        ts.default_suite(loss_spike={"threshold": -1})


def test_a_user_detector_fires_through_update_and_scan_in_the_default_suite():
    loss = run_loss()
    suite = {**ts.default_suite(), "ceiling": LossAboveCeiling(3.0)}
    streamed = ts.Monitor(suite=suite)
    evs = [e for t, x in enumerate(loss) for e in streamed.update(step=t, loss=float(x), lr=1e-3)]
    assert mine(evs) == [(200, "LossAboveCeiling")]
    assert "lr 0.001" in next(e for e in evs if e.detector == "LossAboveCeiling").message
    batched = ts.Monitor(suite={**ts.default_suite(), "ceiling": LossAboveCeiling(3.0)})
    evb = batched.scan(loss=loss, lr=np.full(len(loss), 1e-3))
    assert [e.to_dict() for e in evs] == [e.to_dict() for e in evb]
    # a suite given as a list is named by class
    listed = ts.Monitor(suite=[LossAboveCeiling(3.0), LossAboveCeiling(5.0)])
    assert list(listed.detectors) == ["loss_above_ceiling", "loss_above_ceiling_2"]
    assert mine(listed.scan(loss=loss)) == [(200, "LossAboveCeiling"), (200, "LossAboveCeiling")]


class Inputs3(ts.Detector):
    """Records what it is fed: three inputs, one of them optional."""

    inputs = (ts.Input("loss"), ts.Input("update_ratio", required=False), ts.Input("grad_norm"))
    _state_keys = ("last_step",)

    def __init__(self) -> None:
        self.seen: list[tuple[float, float, float, int]] = []
        self._reset()

    def _reset(self) -> None:
        self._last_step = -1

    def _step(self, loss: float, ratio: float, grad: float, step: int) -> None:
        self._last_step = step
        self.seen.append((loss, ratio, grad, step))


def test_the_monitor_feeds_a_detector_of_three_inputs_in_their_order():
    det = Inputs3()
    mon = ts.Monitor(suite={"three": det})
    mon.update(loss=2.0, grad_norm=0.5, lr=1e-3)
    mon.update(grad_norm=0.25, loss=1.0, update_ratio=1e-4)
    mon.update(loss=1.0, lr=1e-3)  # no grad norm: not fed
    assert det.seen[0][0] == 2.0 and math.isnan(det.seen[0][1]) and det.seen[0][2:] == (0.5, 0)
    assert det.seen[1:] == [(1.0, 1e-4, 0.25, 1)]


class Logged(ts.Detector):
    """Records the logs it is handed: it declares the log of its loss and of its optional grad norm."""

    inputs = (ts.Input("loss"), ts.Input("grad_norm", required=False))
    logs = ("loss", "grad_norm")
    _state_keys = ("last_step",)

    def __init__(self) -> None:
        self.seen: list[tuple[float, float, float | None, float | None]] = []
        self._reset()

    def _reset(self) -> None:
        self._last_step = -1

    def _step(self, loss: float, grad: float, step: int, log_loss: float | None = None,
              log_grad: float | None = None) -> None:
        self._last_step = step
        self.seen.append((loss, grad, log_loss, log_grad))


def test_the_monitor_hands_a_detector_the_logs_it_declares():
    det = Logged()
    mon = ts.Monitor(suite={"logged": det})
    mon.update(loss=2.0, grad_norm=0.5, lr=1e-3)
    mon.update(loss=1.5)  # no grad norm: its log is nan, as the grad norm is
    mon.update(loss=-1.0, grad_norm=0.0)  # no log: nan
    (l0, g0, ll0, lg0), (l1, g1, ll1, lg1), (_, _, ll2, lg2) = det.seen
    assert (ll0, lg0) == (math.log(2.0), math.log(0.5)) and ll1 == math.log(1.5)
    assert math.isnan(g1) and math.isnan(lg1) and math.isnan(ll2) and math.isnan(lg2)
    alone = Logged()  # fed alone, or by its batch twin, a detector takes its logs itself
    alone.update(loss=2.0, grad_norm=0.5)
    alone.scan(loss=[1.5])
    assert [e[2:] for e in alone.seen] == [(None, None), (None, None)]
    odd = Logged()
    odd.logs = ("lr",)
    with pytest.raises(ValueError, match="declares the log of 'lr'"):
        ts.Monitor(suite={"odd": odd})


def test_a_user_detector_resumes_from_state_dict_and_pickle():
    loss = run_loss()

    def monitor() -> ts.Monitor:
        return ts.Monitor(suite={"nonfinite_loss": ts.NonFinite(), "ceiling": LossAboveCeiling(3.0)})

    whole = monitor().scan(loss=loss)
    first = monitor()
    head = [e for t in range(150) for e in first.update(step=t, loss=float(loss[t]))]
    resumed = monitor()
    resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))
    again = pickle.loads(pickle.dumps(first))
    for m in (resumed, again):
        tail = [e for t in range(150, len(loss)) for e in m.update(step=t, loss=float(loss[t]))]
        assert [e.to_dict() for e in head + tail] == [e.to_dict() for e in whole]
    other = ts.Monitor(suite={"nonfinite_loss": ts.NonFinite(), "ceiling": LossAboveCeiling(5.0)})
    with pytest.raises(ValueError, match="ratio"):
        other.load_state_dict(first.state_dict())


def test_a_user_detector_in_a_trace_and_replay(tmp_path):
    pytest.importorskip("pyarrow")
    loss = run_loss()
    path = tmp_path / "run.arrow"
    with ts.TraceWriter(path) as writer:
        mon = ts.Monitor(suite={**ts.default_suite(), "ceiling": LossAboveCeiling(3.0)}, recorder=writer)
        for t, x in enumerate(loss):
            mon.update(step=t, loss=float(x))
    assert mine(ts.trace_events(path)) == [(200, "LossAboveCeiling")]
    report = ts.replay(path, ts.Monitor(suite={**ts.default_suite(), "ceiling": LossAboveCeiling(3.0)}))
    assert mine(report.events) == [(200, "LossAboveCeiling")]


def test_the_signal_vocabulary_is_what_the_monitor_and_every_detector_take():
    import inspect

    update = set(inspect.signature(ts.Monitor.update).parameters) - {"self", "step", "events"}
    scan = set(inspect.signature(ts.Monitor.scan).parameters) - {"self", "step", "events"}
    assert update == set(ts.SIGNALS) == scan
    for det in ts.default_suite().values():
        assert {i.name for i in det.inputs} <= set(ts.SIGNALS), det
    from trainsignals.io import importers, traces

    assert set(importers.SIGNALS) | {"layer_grad_norms", "layer_update_ratios", "activations"} == set(ts.SIGNALS)
    assert set(traces.SCALAR_COLUMNS) <= set(ts.SIGNALS)


def test_a_suite_runs_in_one_monitor_at_a_time():
    """Two live Monitors feeding the same detector objects would garble both: the second is refused."""
    import gc

    suite = {**ts.default_suite(), "mine": LossAboveCeiling()}
    first = ts.Monitor(suite=suite)
    with pytest.raises(ValueError, match=r"suite\['nonfinite_loss'\] already runs in another Monitor"):
        ts.Monitor(suite=suite)
    assert first.update(step=0, loss=1.0) == []  # the first is untouched
    del first
    gc.collect()
    again = ts.Monitor(suite=suite)  # the detectors are free once their Monitor is gone
    assert "mine" in again.detectors
    twin = pickle.loads(pickle.dumps(again))  # a copy owns copies
    assert twin.detectors["mine"] is not again.detectors["mine"]
