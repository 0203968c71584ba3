"""Generic checks every detector must pass (repr, clone, pickle, state, reset, NaN, config).

``trainsignals.testing.check_detector`` holds the checks; it runs here over every detector
class found in the package, so a new class cannot skip them.
"""

from __future__ import annotations

import importlib
import json
import pickle
import pkgutil

import numpy as np
import pytest
from conftest import SCALAR_FACTORIES, feed, scalar_streams

import trainsignals as ts
import trainsignals.detectors
from trainsignals.testing import check_detector


def same(a, b):
    """Events equal, with NaN values equal to each other."""
    return [e.to_dict() for e in a] == [e.to_dict() for e in b]


def _all_detector_classes() -> list[type]:
    for mod in pkgutil.iter_modules(trainsignals.detectors.__path__):
        importlib.import_module(f"trainsignals.detectors.{mod.name}")
    found, todo = set(), [ts.Detector]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub.__module__.startswith("trainsignals.") and sub not in found:
                found.add(sub)
                todo.append(sub)
    # the shared bases of a family of rules live in private modules and are not detectors themselves
    found = {c for c in found if not c.__module__.rsplit(".", 1)[-1].startswith("_")}
    return sorted(found, key=lambda c: c.__name__)


ALL_CLASSES = _all_detector_classes()


def test_every_detector_module_class_is_found():
    names = {c.__name__ for c in ALL_CLASSES}
    assert {"EWMAZSpike", "PeakRatioSpike", "LevelShift", "BreakoutOverfitting", "MedianGapGradCliff", "OwnDropGradCliff",
            "ZeroFractionDeadUnits", "FlatFractionSaturation",
            "NonFinite"} <= names
    assert len(names) >= 13


@pytest.mark.parametrize("cls", ALL_CLASSES, ids=lambda c: c.__name__)
def test_check_detector_passes_for_every_class(cls):
    check_detector(SCALAR_FACTORIES.get(cls.__name__, cls))  # a class with a required argument: its factory


@pytest.mark.parametrize("name", sorted(SCALAR_FACTORIES))
def test_check_detector_passes_on_streams_that_make_it_fire(name):
    det = SCALAR_FACTORIES[name]()
    check_detector(SCALAR_FACTORIES[name], scalar_streams(det))


class Forgetful(ts.EWMAZSpike):
    """A detector whose state dict loses its mean: resuming cannot be identical."""

    def _get_state(self):
        st = super()._get_state()
        st["mean"] = 0.0
        return st


def test_check_detector_catches_a_broken_detector():
    with pytest.raises(AssertionError, match="resumed"):
        check_detector(Forgetful)


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
    first = scalar_detector.inputs[0].name
    if (bad < 0 and ts.SIGNALS[first].nonneg) or (bad > 1 and ts.SIGNALS[first].fraction):
        with pytest.raises(ValueError, match=first):  # impossible, not merely non-finite
            scalar_detector.update(**{first: bad})
        return
    feed(scalar_detector, arrays, 0, 100)
    before = scalar_detector.state_dict()
    ev = scalar_detector.update(step=100, **{k: (bad if k == first else float(a[100])) for k, a in arrays.items()})
    after = scalar_detector.state_dict()
    before["state"]["last_step"] = after["state"]["last_step"]
    if isinstance(scalar_detector, ts.NonFinite):
        assert len(ev) == 1 and ev[0].kind is ts.Kind.NONFINITE and ev[0].severity == "critical"
        assert after["state"]["bad"] is True
    elif scalar_detector.inputs[0].required:
        assert ev == []
        assert after == before
    else:  # an optional input that is not finite is not measured: the step is the other inputs' alone
        twin = scalar_detector.clone()
        feed(twin, arrays, 0, 100)
        twin.update(step=100, **{k: float(a[100]) for k, a in arrays.items() if k != first})
        assert ev == [] and after == twin.state_dict()


def test_type_errors_name_the_signal(scalar_detector):
    names = [i.name for i in scalar_detector.inputs]
    with pytest.raises(TypeError, match=names[0]):
        scalar_detector.update(**{n: ("x" if n == names[0] else 1.0) for n in names})
    with pytest.raises(TypeError, match="unknown"):
        scalar_detector.update(**{n: 1.0 for n in names}, not_a_signal=1.0)
    with pytest.raises(TypeError):
        scalar_detector.update(1.0)  # keyword-only: the binding is by name


def test_foreign_state_is_refused(scalar_detector):
    other = ts.NonFinite() if not isinstance(scalar_detector, ts.NonFinite) else ts.EWMAZSpike()
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
        (ts.GradCollapsePlateau, "patience", 0),
        (ts.GradCollapsePlateau, "stuck_decades", 0),
        (ts.GradCollapseSlowdown, "slowdown", 1.0),
        (ts.GradCollapseSlowdown, "collapse_decades", -1),
        (ts.FrozenUpdatePlateau, "ratio_alpha", 0),
        (ts.FrozenUpdatePlateau, "cooldown", -1),
        (ts.NeverImprovedPlateau, "hold", 0),
        (ts.AbruptPlateau, "progress_mult", 0.5),
        (ts.AbruptPlateau, "signal", "not_a_signal"),
        (ts.TrendDivergence, "window", 3),
        (ts.TrendDivergence, "min_ratio", 0.5),
        (ts.EarlyClimbDivergence, "steps", 1),
        (ts.EarlyClimbDivergence, "max_share", 0.0),
        (ts.LostProgress, "min_ratio", 3.0),
        (ts.LostProgress, "frac", 0.0),
        (ts.EWMAZSpike, "min_ratio", 0.5),
        (ts.EWMAZSpike, "threshold", -1),
        (ts.EWMAZSpike, "direction", "sideways"),
        (ts.EWMAZSpike, "hold", 0),
        (ts.EWMAZSpike, "cooldown", -1),
        (ts.LevelShift, "peak_ratio", 1.0),
        (ts.LevelShift, "kind", "not_a_kind"),
        (ts.PeakRatioSpike, "peak_ratio", 0.5),
        (ts.PeakRatioSpike, "window", 0),
        (ts.PeakRatioSpike, "min_ratio", 0.9),
        (ts.PeakRatioSpike, "cooldown", 1.5),
        (ts.GradLossDecoupling, "lag", 1),
        (ts.GradLossDecoupling, "loss_tolerance", 0.5),
        (ts.JointCollapse, "span", 1000),
        (ts.LjungBoxSawtooth, "frac", 0.0),
        (ts.LjungBoxSawtooth, "warmup", 3),
        (ts.SwingRatioEdgeOfStability, "shift_ratio", 1.0),
        (ts.SwingRatioEdgeOfStability, "cooldown", -1),
        (ts.LRRiseEdgeOfStability, "shift", 0.5),
        (ts.LRRiseEdgeOfStability, "lr_rise", 1.0),
        (ts.LRJumpAnomaly, "jump_factor", 1.0),
        (ts.UpdateRatioAboveBand, "high", 1e-9),
        (ts.UpdateRatioAboveBand, "ref_alpha", 0.5),
        (ts.UpdateRatioAboveBand, "cooldown", 1.5),
        (ts.UpdateRatioBelowBand, "soft_low", 1e-9),
        (ts.UpdateRatioBelowBand, "lr_explains", 2.0),
        (ts.BreakoutOverfitting, "patience", 0),
        (ts.BreakoutOverfitting, "max_window", 2),
        (ts.LevelStepOverfitting, "train_fall", 1.0),
        (ts.MemorisationClimbOverfitting, "rises", 1),
        (ts.MemorisationClimbOverfitting, "cooldown", -1),
        (ts.MedianGapGradCliff, "gap", 0),
        (ts.OwnDropGradCliff, "drop", 0),
        (ts.OwnDropGradCliff, "cooldown", -1),
        (ts.LayerUpdateRatio, "drop", -1.0),
        (ts.LayerUpdateRatio, "warmup", 0),
        (ts.ZeroFractionDeadUnits, "ratio", 1.0),
        (ts.FlatFractionSaturation, "patience", 0),
        (ts.FlatFractionSaturation, "cooldown", -1),
        (ts.TopShareCollapse, "rise", 1.0),
        (ts.TopShareCollapse, "cooldown", -1),
        (ts.ValMetricChance, "mode", "up"),
        (ts.ValMetricChance, "back", 0.0),
    ],
)
def test_bad_configuration_names_the_parameter(factory, param, value):
    with pytest.raises(ValueError, match=param):
        factory(**{param: value})


def test_error_message_states_constraint_and_value():
    with pytest.raises(ValueError, match=r"threshold must be in \(0, inf\], got -1"):
        ts.EWMAZSpike(threshold=-1)


@pytest.mark.parametrize("name", sorted(SCALAR_FACTORIES))
def test_every_detector_is_in_the_protocol(name):
    det = SCALAR_FACTORIES[name]()
    assert isinstance(det, ts.DetectorProtocol)


@pytest.mark.parametrize("cls", [ts.MedianGapGradCliff, ts.OwnDropGradCliff])
def test_vector_detectors_state_and_pickle(cls):
    rng = np.random.default_rng(3)
    norms = np.exp(rng.normal(0, 0.2, (300, 6)))
    norms[150:, 0] *= 1e-5
    det = cls()
    evs = [det.update(layer_grad_norms={f"l{j}": v for j, v in enumerate(row)}, step=t)
           for t, row in enumerate(norms[:100])]
    snap = json.loads(json.dumps(det.state_dict()))
    twin = cls()
    twin.load_state_dict(snap)
    again = pickle.loads(pickle.dumps(det))
    rest = [[d.update(layer_grad_norms={f"l{j}": v for j, v in enumerate(row)}, step=100 + t)
             for t, row in enumerate(norms[100:])] for d in (det, twin, again)]
    assert rest[0] == rest[1] == rest[2]
    fired = [e for evl in rest[0] for e in evl]
    assert fired and fired[0].layer == "l0" and fired[0].kind is ts.Kind.VANISHING_GRADIENT
    assert not any(evs)
    with pytest.raises(ValueError, match="layers changed"):
        det.update(layer_grad_norms={"other": 1.0})


def _vector_cases():
    rng = np.random.default_rng(7)
    n = 400
    norms = np.exp(rng.normal(0, 0.2, (n, 5))) * np.array([1.0, 0.5, 0.3, 0.2, 0.1])
    norms[250:, 1] *= 1e-5
    norms[100, 2] = np.nan
    names = [f"l{j}" for j in range(5)]
    ratios = np.exp(rng.normal(0, 0.3, (n, 5))) * np.array([1e-3, 5e-4, 3e-4, 2e-4, 1e-4])
    ratios[0, :] = [1.0, 1.0, 0.0, 1.0, 1.0]   # zero-initialised layers: huge, then settling
    ratios[150:, 3] = 0.0                      # a layer frozen: no update at all
    ratios[280:, 0] *= 3e3                     # one layer's updates blow up
    ratios[200, 4] = np.nan
    dead = np.clip(0.2 + np.where(np.arange(n) > 200, (np.arange(n) - 200) / 100, 0), 0, 0.99)
    sat = np.full(n, 0.1)
    sat[300:] = 0.8
    loss = np.exp(-np.arange(n) / 300) * np.exp(rng.normal(0, 0.02, n))
    val = {s: float(np.exp(-s / 300) + (0.002 * (s - 150) if s > 150 else 0)) for s in range(0, n, 20)}
    collapsing = loss * 10.0 ** -np.clip((np.arange(n) - 150) / 100, 0, None)  # the train loss, memorising
    stepped = {s: float(np.exp(-min(s, 150) / 300) * (1.4 if s > 150 else 1.0) * (1 + 0.01 * np.sin(s)))
               for s in range(0, n, 20)}  # the validation loss jumps onto a level 40 % higher
    return [
        *[(cls.__name__, cls,
           lambda d, t: d.update(layer_grad_norms={k: float(v) for k, v in zip(names, norms[t])}, step=t),
           lambda d, lo, hi: d.scan(layer_grad_norms={k: norms[lo:hi, j] for j, k in enumerate(names)},
                                    steps=np.arange(lo, hi))) for cls in (ts.MedianGapGradCliff, ts.OwnDropGradCliff)],
        ("LayerUpdateRatio", ts.LayerUpdateRatio,
         lambda d, t: d.update(layer_update_ratios={k: float(v) for k, v in zip(names, ratios[t])}, step=t),
         lambda d, lo, hi: d.scan(layer_update_ratios={k: ratios[lo:hi, j] for j, k in enumerate(names)},
                                  steps=np.arange(lo, hi))),
        *[(cls.__name__, cls,
           lambda d, t: d.update(activations={"relu": {"dead_frac": float(dead[t]), "saturation": 0.0},
                                              "tanh": {"dead_frac": 0.0, "saturation": float(sat[t])}}, step=t),
           lambda d, lo, hi: d.scan(activations={"relu": {"dead_frac": dead[lo:hi], "saturation": np.zeros(hi - lo)},
                                                 "tanh": {"dead_frac": np.zeros(hi - lo), "saturation": sat[lo:hi]}},
                                    steps=np.arange(lo, hi)))
          for cls in (ts.ZeroFractionDeadUnits, ts.FlatFractionSaturation)],
        _val_case("BreakoutOverfitting", ts.BreakoutOverfitting, loss, val),
        _val_case("MemorisationClimbOverfitting", ts.MemorisationClimbOverfitting, collapsing, val),
        _val_case("LevelStepOverfitting", ts.LevelStepOverfitting, collapsing, stepped),
        _val_case("SharpTurnOverfitting", ts.SharpTurnOverfitting, collapsing, stepped),
    ]


def _val_case(name, factory, loss, val):
    """A case for an overfitting rule: train loss every step, validation loss every 20 steps."""
    return (name, factory,
            lambda d, t: d.update(loss=float(loss[t]), val_loss=val.get(t), step=t),
            lambda d, lo, hi: d.scan(loss=loss[lo:hi],
                                     val_loss=(np.array([s for s in val if lo <= s < hi], dtype=np.int64),
                                               np.array([val[s] for s in val if lo <= s < hi])),
                                     steps=np.arange(lo, hi)))


def _flat(evs):
    out = []
    for e in evs:
        if isinstance(e, list):
            out.extend(e)
        elif e is not None:
            out.append(e)
    return out


@pytest.mark.parametrize("case", _vector_cases(), ids=lambda c: c[0])
@pytest.mark.parametrize("cut", [0, 137, 333])
def test_vector_detectors_stream_scan_state_and_pickle_agree(case, cut):
    _, factory, step_fn, scan_fn = case
    n = 400
    streamed = factory()
    stream_events = _flat(step_fn(streamed, t) for t in range(n))
    assert stream_events, "the case is built to fire"
    batched = factory()
    batch_events = scan_fn(batched, 0, cut) + scan_fn(batched, cut, n) if cut else scan_fn(batched, 0, n)
    assert same(stream_events, batch_events)
    first = factory()
    part = _flat(step_fn(first, t) for t in range(cut))
    resumed = factory()
    resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))
    again = pickle.loads(pickle.dumps(first))
    rest = [_flat(step_fn(d, t) for t in range(cut, n)) for d in (resumed, again)]
    assert same(part + rest[0], stream_events) and same(part + rest[1], stream_events)
    fresh = factory().state_dict()
    streamed.reset()
    assert streamed.state_dict() == fresh
