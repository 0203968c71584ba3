"""Bad input never crashes and never loses state (hypothesis, stateful).

A Monitor is fed any mix of values, types and shapes through ``update`` and ``scan``. Only
events, or a ``TypeError``/``ValueError`` naming the signal, may come out; a refused call
changes nothing; ``state_dict()`` always round-trips through JSON and pickle, and a Monitor
loaded from it continues exactly as the original.
"""

from __future__ import annotations

import json
import os
import pickle

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import trainsignals as ts

SCALARS = ("loss", "grad_norm", "lr", "update_ratio", "val_loss")
NAMES_IN_ERRORS = (*ts.SIGNALS, "step", "events", "activations")

numpy_scalars = st.sampled_from([np.float16, np.float32, np.float64, np.int8, np.int32, np.int64, np.uint8,
                                 np.uint64, np.bool_]).flatmap(
    lambda t: st.integers(0, 100).map(lambda v: t(v)))
odd = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-10 ** 400, 10 ** 400),
    numpy_scalars,
    st.floats(-1e6, 1e6).map(np.array),                      # 0-d arrays
    st.lists(st.floats(0, 10), min_size=0, max_size=3).map(np.array),   # n-d arrays
    st.text(max_size=3),
    st.booleans(),
    st.none(),
    st.just(complex(1, 1)),
)
good = st.floats(1e-6, 10.0)
layer_names = st.sampled_from([("a", "b"), ("a", "b", "c"), ()])
layer_value = st.one_of(
    layer_names.flatmap(lambda ns: st.lists(st.one_of(good, odd), min_size=len(ns), max_size=len(ns)).map(
        lambda vs: dict(zip(ns, vs)))),
    st.lists(good, min_size=0, max_size=4),
    st.none(),
    odd,
)
fractions = st.one_of(st.floats(0, 1), st.floats(-1, 2), odd)
act_value = st.one_of(
    layer_names.flatmap(lambda ns: st.lists(fractions, min_size=len(ns), max_size=len(ns)).map(
        lambda vs: {n: {"dead_frac": v, "saturation": 0.0} for n, v in zip(ns, vs)})),
    st.integers(0, 4).flatmap(lambda k: st.lists(fractions, min_size=k, max_size=k).map(
        lambda vs: {"dead_frac": vs, "saturation": [0.0] * len(vs)})),
    st.none(),
    odd,
)


def _snapshot(mon: ts.Monitor) -> str:
    return json.dumps(mon.state_dict(), sort_keys=True)


def _check_refusal(exc: Exception) -> None:
    assert isinstance(exc, (TypeError, ValueError)), f"{type(exc).__name__}: {exc}"
    assert any(name in str(exc) for name in NAMES_IN_ERRORS), f"the error does not name the signal: {exc}"


class FeedAnything(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.mon = ts.Monitor()
        self.step = 0

    def _call(self, fn, **kw) -> None:
        before = _snapshot(self.mon)
        try:
            out = fn(**kw)
        except Exception as exc:  # noqa: BLE001 - the rule is what may come out
            _check_refusal(exc)
            assert _snapshot(self.mon) == before, f"a refused call changed the state: {kw!r}"
            return
        assert isinstance(out, list) and all(isinstance(e, ts.Event) for e in out)

    @rule(loss=st.one_of(good, odd), grad=st.one_of(good, odd, st.none()), lr=st.one_of(good, st.none(), odd),
          ratio=st.one_of(st.none(), good, odd), val=st.one_of(st.none(), good, odd))
    def scalars(self, loss, grad, lr, ratio, val) -> None:
        self.step += 1
        self._call(self.mon.update, step=self.step, loss=loss, grad_norm=grad, lr=lr, update_ratio=ratio,
                   val_loss=val)

    @rule(loss=good, layers=layer_value, ratios=layer_value, acts=act_value)
    def vectors(self, loss, layers, ratios, acts) -> None:
        self.step += 1
        self._call(self.mon.update, step=self.step, loss=loss, layer_grad_norms=layers,
                   layer_update_ratios=ratios, activations=acts)

    @rule(step=st.one_of(st.integers(-5, 5), st.integers(2 ** 62, 2 ** 70), st.floats(), st.text(max_size=2)),
          loss=good)
    def odd_steps(self, step, loss) -> None:
        self._call(self.mon.update, step=step, loss=loss)
        if self.mon.step > self.step:
            self.step = self.mon.step

    @rule(n=st.integers(0, 40), bad=st.sampled_from(["none", "nan", "neg", "text", "2d", "short"]),
          signal=st.sampled_from(SCALARS[:4]))
    def batch(self, n, bad, signal) -> None:
        loss = np.linspace(2.0, 1.0, n)
        other = np.full(n, 0.5)
        if bad == "nan" and n:
            other[n // 2] = np.nan
        elif bad == "neg" and n:
            other[0] = -1.0
        kw: dict = {"loss": loss, signal: other}
        if bad == "text":
            kw[signal] = ["x"] * n
        elif bad == "2d":
            kw[signal] = np.ones((n, 2))
        elif bad == "short":
            kw[signal] = other[: max(0, n - 1)]
        start = self.mon.step + 1
        self._call(self.mon.scan, step=np.arange(start, start + n), **kw)
        self.step = max(self.step, self.mon.step)

    @precondition(lambda self: self.mon.step >= 0)
    @rule()
    def resume(self) -> None:
        """A Monitor loaded from the JSON state, and a pickled copy, continue exactly as the original."""
        loaded = ts.Monitor()
        loaded.load_state_dict(json.loads(json.dumps(self.mon.state_dict())))
        copied = pickle.loads(pickle.dumps(self.mon))
        s = self.mon.step + 1
        want = [e.to_dict() for e in self.mon.update(step=s, loss=1.0, grad_norm=1.0)]
        for other in (loaded, copied):
            assert [e.to_dict() for e in other.update(step=s, loss=1.0, grad_norm=1.0)] == want
            assert other.state_dict() == self.mon.state_dict()
        self.step = s

    @invariant()
    def state_round_trips(self) -> None:
        snap = self.mon.state_dict()
        fresh = ts.Monitor()
        fresh.load_state_dict(json.loads(json.dumps(snap)))
        assert fresh.state_dict() == snap, "a Monitor loaded from its JSON state differs from it"


FeedAnything.TestCase.settings = settings(
    max_examples=int(os.environ.get("TS_EXAMPLES", 100)), stateful_step_count=20, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
test_feeding_anything_gives_events_or_named_errors = FeedAnything.TestCase


def test_known_cases_from_the_issue():
    mon = ts.Monitor()
    ev = mon.update(step=0, loss=10 ** 400)           # beyond float: an infinite loss, reported
    assert [e.kind for e in ev] == [ts.Kind.NONFINITE]
    mon = ts.Monitor()
    mon.update(step=0, loss=1.0, activations={"fc": {"dead_frac": 0.1, "saturation": 0.0}})
    before = _snapshot(mon)
    try:
        mon.update(step=1, loss=1.0, activations={"dead_frac": [0.1, 0.2, 0.3]})
    except ValueError as exc:
        assert "activations" in str(exc)
    assert _snapshot(mon) == before
    try:
        mon.update(step=1, loss=1.0, activations={"fc": {"dead_frac": 2.0}})
    except ValueError as exc:
        assert "dead_frac" in str(exc)
    else:
        raise AssertionError("dead_frac=2.0 was accepted")

    def schedule(step: int) -> float:
        return 1e-3

    def planned() -> dict[str, ts.Detector]:
        suite = ts.default_suite()
        suite["lr_schedule"] = ts.LRScheduleMismatch(schedule)
        return suite

    snap = ts.Monitor(suite=planned()).state_dict()
    json.dumps(snap)
    again = ts.Monitor(suite=planned())
    again.load_state_dict(json.loads(json.dumps(snap)))
    mon = ts.Monitor()
    for t in range(300):
        mon.update(step=t, loss=1.0, layer_grad_norms={} if t % 2 else {"a": 1.0, "b": 0.5},
                   activations={} if t % 3 else {"fc": {"dead_frac": 0.1, "saturation": 0.0}})
    fresh = ts.Monitor()
    fresh.load_state_dict(json.loads(json.dumps(mon.state_dict())))
    assert fresh.state_dict() == mon.state_dict()
