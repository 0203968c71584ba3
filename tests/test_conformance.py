"""Generic checks every detector must pass (repr, clone, pickle, state, reset, NaN, config)."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest
from conftest import SCALAR_FACTORIES, scalar_streams

import trainsignals as ts


def same(a, b):
    """Events equal, with NaN values equal to each other."""
    return [e.to_dict() for e in a] == [e.to_dict() for e in b]


def feed(det, arrays, start=0, stop=None):
    out = []
    stop = len(arrays[0]) if stop is None else stop
    for t in range(start, stop):
        ev = det.update(*(float(a[t]) for a in arrays), step=t)
        if ev is not None:
            out.append(ev)
    return out


def test_fires_on_the_failing_stream(scalar_detector):
    arrays = scalar_streams(scalar_detector)
    events = feed(scalar_detector, arrays)
    assert events, f"{scalar_detector!r} raised nothing on a stream built to make it fire"
    assert all(isinstance(e, ts.Event) for e in events)
    assert [e.step for e in events] == sorted(e.step for e in events)
    for e in events:
        assert e.onset_step <= e.step
        assert e.severity in ("info", "warning", "critical")
        line = str(e)
        assert "\n" not in line and str(e.step) in line and e.kind.value in line


def test_repr_and_clone(scalar_detector):
    text = repr(scalar_detector)
    assert text.startswith(type(scalar_detector).__name__ + "(")
    twin = scalar_detector.clone()
    assert repr(twin) == text
    arrays = scalar_streams(scalar_detector)
    assert same(feed(twin, arrays), feed(scalar_detector, arrays))


@pytest.mark.parametrize("cut", [37, 260, 455])
def test_state_dict_roundtrip_resumes_identically(scalar_detector, cut):
    arrays = scalar_streams(scalar_detector)
    whole = feed(scalar_detector.clone(), arrays)
    first = scalar_detector.clone()
    before = feed(first, arrays, 0, cut)
    snap = json.loads(json.dumps(first.state_dict()))
    resumed = scalar_detector.clone()
    resumed.load_state_dict(snap)
    assert same(before + feed(resumed, arrays, cut), whole)


def test_pickle_roundtrip_resumes_identically(scalar_detector):
    arrays = scalar_streams(scalar_detector)
    whole = feed(scalar_detector.clone(), arrays)
    first = scalar_detector.clone()
    before = feed(first, arrays, 0, 300)
    again = pickle.loads(pickle.dumps(first))
    assert same(before + feed(again, arrays, 300), whole)


def test_reset_equals_fresh(scalar_detector):
    arrays = scalar_streams(scalar_detector)
    fresh = scalar_detector.clone().state_dict()
    feed(scalar_detector, arrays)
    scalar_detector.reset()
    assert scalar_detector.state_dict() == fresh


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_nonfinite_leaves_statistics_untouched(scalar_detector, bad):
    arrays = scalar_streams(scalar_detector)
    feed(scalar_detector, arrays, 0, 100)
    before = scalar_detector.state_dict()
    args = [bad] + [float(a[100]) for a in arrays[1:]]
    ev = scalar_detector.update(*args, step=100)
    after = scalar_detector.state_dict()
    before["state"]["last_step"] = after["state"]["last_step"]
    if isinstance(scalar_detector, ts.NonFinite):
        assert ev is not None and ev.kind is ts.Kind.NONFINITE and ev.severity == "critical"
        assert after["state"]["bad"] is True
    else:
        assert ev is None
        assert after == before


def test_type_errors_name_the_signal(scalar_detector):
    args = ["x"] + [1.0] * (len(scalar_detector.signals) - 1)
    with pytest.raises(TypeError, match=scalar_detector.signals[0]):
        scalar_detector.update(*args)
    with pytest.raises(TypeError):
        scalar_detector.update(*([1.0] * (len(scalar_detector.signals) + 1)))


def test_foreign_state_is_refused(scalar_detector):
    other = ts.NonFinite() if not isinstance(scalar_detector, ts.NonFinite) else ts.EWMASpike()
    with pytest.raises(ValueError, match="not"):
        scalar_detector.load_state_dict(other.state_dict())
    snap = scalar_detector.state_dict()
    key = next(iter(snap["state"]))
    del snap["state"][key]
    with pytest.raises(ValueError, match=key):
        scalar_detector.load_state_dict(snap)
    with pytest.raises(ValueError):
        scalar_detector.load_state_dict({"detector": "x"})


@pytest.mark.parametrize(
    ("factory", "param", "value"),
    [
        (ts.EWMASpike, "alpha", 1.5),
        (ts.EWMASpike, "threshold", -1),
        (ts.EWMASpike, "direction", "sideways"),
        (ts.EWMASpike, "warmup", 1),
        (ts.SlopeDivergence, "window", 3),
        (ts.SlopeDivergence, "min_ratio", 0.5),
        (ts.SlopeDivergence, "early_steps", 40),
        (ts.CUSUMPlateau, "patience", 0),
        (ts.CUSUMPlateau, "progress_mult", 0.5),
        (ts.Oscillation, "frac", 0.0),
        (ts.Oscillation, "warmup", 3),
        (ts.LossGradCoupling, "lag", 1),
        (ts.LRAnomaly, "jump_factor", 1.0),
        (ts.UpdateRatioBand, "high", 1e-9),
        (ts.UpdateRatioBand, "ref_alpha", 0.5),
        (ts.TrainValGap, "patience", 0),
        (ts.LayerGradCliff, "gap", 0),
        (ts.ActivationHealth, "dead_threshold", 1.5),
    ],
)
def test_bad_configuration_names_the_parameter(factory, param, value):
    with pytest.raises(ValueError, match=param):
        factory(**{param: value})


def test_error_message_states_constraint_and_value():
    with pytest.raises(ValueError, match=r"alpha must be in \(0, 1\), got 1.5"):
        ts.EWMASpike(alpha=1.5)


@pytest.mark.parametrize("name", sorted(SCALAR_FACTORIES))
def test_every_detector_is_in_the_protocol(name):
    det = SCALAR_FACTORIES[name]()
    assert isinstance(det, ts.DetectorProtocol)


def test_vector_detectors_state_and_pickle():
    rng = np.random.default_rng(3)
    norms = np.exp(rng.normal(0, 0.2, (300, 6)))
    norms[150:, 0] *= 1e-5
    det = ts.LayerGradCliff()
    evs = [det.update({f"l{j}": v for j, v in enumerate(row)}, step=t) for t, row in enumerate(norms[:100])]
    snap = json.loads(json.dumps(det.state_dict()))
    twin = ts.LayerGradCliff()
    twin.load_state_dict(snap)
    again = pickle.loads(pickle.dumps(det))
    rest = [[d.update({f"l{j}": v for j, v in enumerate(row)}, step=100 + t) for t, row in enumerate(norms[100:])]
            for d in (det, twin, again)]
    assert rest[0] == rest[1] == rest[2]
    fired = [e for e in rest[0] if e]
    assert fired and fired[0].layer == "l0" and fired[0].kind is ts.Kind.VANISHING_GRADIENT
    assert not any(evs)
    with pytest.raises(ValueError, match="layers changed"):
        det.update({"other": 1.0})
