"""Helpers to unit-test detectors and training loops on labeled failure curves, and a pytest plugin.

The assertions run a detector over a :class:`~trainsignals.curves.Curve` and check what it
said::

    from trainsignals.curves import generate
    from trainsignals.testing import assert_detects, assert_quiet

    assert_detects(TrendDivergence(), generate("divergence", seed=3, difficulty="easy"))
    assert_quiet(TrendDivergence(), generate("healthy", seed=3))

A detector may be a :class:`trainsignals.Monitor` (fed every signal of the curve), a
detector of the contract (its ``scan`` is given the curve's signals its ``inputs`` name), any
other object whose ``scan`` takes the Monitor's keywords, or a plain callable
``f(curve) -> list[Event]``. :func:`check_detector` runs the conformance checks every detector
of the package passes on a detector of your own.

Installed with trainsignals, this module is also a pytest plugin (entry point ``pytest11``)
that provides the fixtures ``failure_curves`` (the committed suite, loaded once per session)
and ``failure_curve_factory`` (:func:`trainsignals.curves.generate`); :func:`curve_params`
builds parameter lists for ``pytest.mark.parametrize``. The plugin is loaded by every pytest
run in an environment where trainsignals is installed, so this module imports nothing heavy
at import time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from ._events import Event
    from .curves import Curve

try:  # the fixtures need pytest; the assertions do not
    import pytest as _pytest
except ImportError:  # pragma: no cover
    _pytest = None  # type: ignore[assignment]

__all__ = [
    "assert_detects",
    "assert_quiet",
    "curve_params",
    "default_within",
    "run_detector",
]

_ALARMS = ("warning", "critical")


def default_within(curve: Curve) -> int:
    """The default detection window of :func:`assert_detects`: ``max(50, 10 % of total_steps)``."""
    return max(50, int(0.1 * curve.total_steps))


def _is_monitor(detector: Any) -> bool:
    try:
        from trainsignals import Monitor
    except ImportError:  # pragma: no cover - the core is always there once installed
        return False
    return isinstance(detector, Monitor)


def run_detector(detector: Any, curve: Curve) -> list[Event]:
    """Run a detector over a whole curve and return its events, in the order it gave them.

    Args:
        detector: A ``trainsignals.Monitor`` (reset, then ``scan(**curve.signals())``: every
            signal); an object with ``scan`` and an ``inputs`` tuple of
            :class:`trainsignals.Input` (every :class:`trainsignals.Detector` declares one: reset
            if it can, then ``scan(steps=curve.steps, **those signals)``, each named input the
            curve has, in the form :meth:`~trainsignals.curves.Curve.signals` gives it);
            another object with ``scan`` (reset if it can, then ``scan(**curve.signals())``, the
            Monitor's keywords); or a callable ``f(curve) -> list[Event]``.
        curve: The curve.

    Returns:
        The events.

    Raises:
        TypeError: the detector is none of these, or the curve has none of its ``inputs``.
    """
    if _is_monitor(detector):
        detector.reset()
        return list(detector.scan(**curve.signals()))
    scan = getattr(detector, "scan", None)
    if scan is not None and callable(scan):
        reset = getattr(detector, "reset", None)
        if callable(reset):
            reset()
        inputs = getattr(detector, "inputs", None)
        sig = curve.signals()
        if inputs is None:
            return list(scan(**sig))
        kw = {i.name: sig[i.name] for i in inputs if sig.get(i.name) is not None}
        if not kw:
            raise TypeError(f"{type(detector).__name__} reads {[i.name for i in inputs]}, which this curve does not have")
        return list(scan(steps=sig.get("step"), **kw))
    if callable(detector):
        return list(detector(curve))
    raise TypeError(
        f"cannot run {type(detector).__name__!s}: expected a Monitor, an object with scan(), or a callable"
    )


def _check_kind(kind: Any) -> str:
    """``kind`` as a :class:`trainsignals.Kind` value; a ValueError naming it when it is none."""
    from ._events import Kind

    kinds = [k.value for k in Kind]
    value = str(getattr(kind, "value", kind))
    if value not in kinds:
        raise ValueError(f"kind must be a trainsignals.Kind or one of {', '.join(kinds)}; got {kind!r}")
    return value


def _check_severities(severities: Iterable[str]) -> set[str]:
    """The severities an assertion fails on; a ValueError for an empty set or one that is not a severity."""
    from ._events import SEVERITIES

    given = [severities] if isinstance(severities, str) else list(severities)
    bad = [s for s in given if str(s) not in SEVERITIES]
    if bad:
        raise ValueError(f"severities must be among {', '.join(SEVERITIES)}; got {', '.join(repr(s) for s in bad)}")
    if not given:
        raise ValueError(f"severities is empty: nothing could fail the assertion; give some of {', '.join(SEVERITIES)}")
    return {str(s) for s in given}


def _kind(event: Any) -> str:
    k = getattr(event, "kind", None)
    return str(getattr(k, "value", k))


def _describe(events: Sequence[Any], limit: int = 8) -> str:
    if not events:
        return "  (no events)"
    lines = [
        f"  step {e.step} {str(e.severity).upper()} {_kind(e)} (onset {getattr(e, 'onset_step', '?')}) "
        f"from {getattr(e, 'detector', '?')} on {getattr(e, 'signal', '?')}"
        for e in events[:limit]
    ]
    if len(events) > limit:
        lines.append(f"  ... and {len(events) - limit} more")
    return "\n".join(lines)


def assert_detects(
    detector: Any,
    curve: Curve,
    kind: str | None = None,
    within: int | None = None,
    allow_early: bool = False,
) -> Event:
    """Assert that a detector names a curve's failure, in time and not before it began.

    Passes when the detector raises an event of ``kind`` (any severity) at a step in
    ``[curve.onset_step, curve.onset_step + within]`` and, unless ``allow_early``, no
    ``warning`` or ``critical`` event (of any kind) before ``curve.onset_step``.

    Args:
        detector: What to run (see :func:`run_detector`).
        curve: A failure curve.
        kind: The expected kind (a :class:`trainsignals.Kind` or its value); defaults to
            ``curve.kind``.
        within: Steps allowed after the onset; defaults to :func:`default_within`.
        allow_early: Accept warning and critical events before the onset.

    Returns:
        The first matching event.

    Raises:
        AssertionError: no matching event, or an alarm before the onset; the message lists
            what the detector said.
        ValueError: the curve is healthy (use :func:`assert_quiet`), ``kind`` is not a
            :class:`trainsignals.Kind` (or its value), or ``within`` < 0.
    """
    if curve.onset_step < 0:
        raise ValueError(f"{curve.name} is a healthy curve with no onset: use assert_quiet")
    want = _check_kind(kind) if kind is not None else curve.kind
    window = default_within(curve) if within is None else int(within)
    if window < 0:
        raise ValueError(f"within must be >= 0, got {within}")
    onset = curve.onset_step
    events = run_detector(detector, curve)
    label = f"{type(detector).__name__} on {curve.name} (onset {onset}, {curve.total_steps} steps)"
    if not allow_early:
        early = [e for e in events if e.step < onset and str(e.severity) in _ALARMS]
        if early:
            raise AssertionError(
                f"{label}: {len(early)} alarm(s) before the onset, the first at step {early[0].step}:\n"
                + _describe(early)
            )
    hi = onset + window
    for e in events:
        if _kind(e) == want and onset <= e.step <= hi:
            return e
    same = [e for e in events if _kind(e) == want]
    if same:
        where = ", ".join(str(e.step) for e in same[:5])
        reason = f"{want!r} events only outside the window [{onset}, {hi}], at step(s) {where}"
    else:
        reason = f"no {want!r} event in the window [{onset}, {hi}]"
    raise AssertionError(f"{label}: {reason}; the detector said:\n" + _describe(events))


def assert_quiet(
    detector: Any, curve: Curve, severities: Iterable[str] = _ALARMS
) -> list[Event]:
    """Assert that a detector raises no event of the given severities on a curve.

    Args:
        detector: What to run (see :func:`run_detector`).
        curve: Usually a healthy curve.
        severities: The severities that fail the assertion: some of ``"info"``, ``"warning"``
            and ``"critical"`` (one such string alone is one severity).

    Returns:
        All events the detector raised (those of other severities).

    Raises:
        AssertionError: an event of one of ``severities``; the message lists them.
        ValueError: ``severities`` is empty or names something that is not a severity.
    """
    bad_sev = _check_severities(severities)
    events = run_detector(detector, curve)
    bad = [e for e in events if str(e.severity) in bad_sev]
    if bad:
        raise AssertionError(
            f"{type(detector).__name__} on {curve.name} ({curve.kind}, {curve.total_steps} steps): "
            f"{len(bad)} {'/'.join(sorted(bad_sev))} event(s), the first at step {bad[0].step}:\n"
            + _describe(bad)
        )
    return events


def curve_params(kinds: Iterable[str] | str | None = None, n: int = 3) -> list[Any]:
    """Generated curves as parameters for ``pytest.mark.parametrize``, with readable ids.

    For each kind, ``n`` curves with seeds ``0 .. n-1`` and difficulties cycling through
    easy, medium, hard.

    Args:
        kinds: Failure kinds and/or ``"healthy"``; defaults to every failure kind.
        n: Curves per kind.

    Returns:
        ``pytest.param(curve, id=curve.name)`` objects (plain curves without pytest).

    Raises:
        ValueError: a kind that is neither a failure kind nor ``"healthy"``, or ``n`` < 1.

    Example:
        >>> [p.id for p in curve_params(["stall"], n=2)]
        ['stall-easy-0', 'stall-medium-1']
    """
    from .curves import DIFFICULTIES, HEALTHY, KINDS, generate

    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be an integer >= 1 (curves per kind), got {n!r}")
    if kinds is None:
        chosen: Sequence[str] = KINDS
    elif isinstance(kinds, str):
        chosen = (kinds,)
    else:
        chosen = [str(getattr(k, "value", k)) for k in kinds]
    bad = [k for k in chosen if k not in (*KINDS, HEALTHY)]
    if bad:
        raise ValueError(f"kinds must be failure kinds of a single run ({', '.join(KINDS)}) or {HEALTHY!r}; got {bad}")
    out: list[Any] = []
    for kind in chosen:
        for i in range(n):
            c = generate(kind, i, DIFFICULTIES[i % len(DIFFICULTIES)])
            out.append(_pytest.param(c, id=c.name) if _pytest is not None else c)
    return out


if _pytest is not None:

    @_pytest.fixture(scope="session")
    def failure_curves() -> list[Curve]:
        """The committed suite of labeled curves (``datasets/synthetic``), loaded once.

        Skips the test when the datasets are not there (an installed package without the
        repository).
        """
        from .curves import load_suite

        try:
            return load_suite()
        except FileNotFoundError as exc:
            _pytest.skip(str(exc))
            raise  # pragma: no cover

    @_pytest.fixture
    def failure_curve_factory() -> Callable[..., Curve]:
        """:func:`trainsignals.curves.generate`: ``factory(kind, seed, difficulty="medium", n_steps=None)``."""
        from .curves import generate

        return generate


# -- conformance: the checks every detector passes, ours and users' --------------------------------

def example_inputs(detector: Any, n: int = 600, seed: int = 0) -> dict[str, Any]:
    """Made-up inputs for every input a detector declares: ``{name: data}`` for :func:`check_detector`.

    Scalars are aligned arrays of ``n`` positive values with noise, a spike, a sawtooth, a climb
    and one NaN (the learning rate is piecewise constant with a jump; ``pred_top_share`` a
    fraction that climbs to 1 from the middle on, ``pred_spread`` a spread that shrinks to 0 from
    there); ``val_loss`` and ``val_metric`` (an accuracy
    that falls back to chance) are ``(steps, values)`` pairs every 20 steps; per-layer inputs are ``{layer: array}`` with one
    layer collapsing; activations are ``{layer: {"dead_frac": array, "saturation": array}}``.
    """
    import numpy as np

    from .signals import SIGNALS

    rng = np.random.default_rng(seed)
    t = np.arange(n)
    out: dict[str, Any] = {}
    for inp in detector.inputs:
        form = SIGNALS[inp.name].form
        if inp.name == "val_loss":
            vs = np.arange(0, n, 20)
            out[inp.name] = (vs, np.exp(-vs / 300) + np.where(vs > n // 2, 0.002 * (vs - n // 2), 0.0))
        elif inp.name == "val_metric":
            vs = np.arange(0, n, 20)
            out[inp.name] = (vs, np.where(vs > 2 * n // 3, 0.1, 0.9 - 0.8 * np.exp(-vs / 60)))
        elif inp.name == "pred_top_share":
            x = np.clip(0.2 + rng.normal(0, 0.02, n) + np.clip((t - n // 2) / 40, 0, 0.8), 0, 1)
            x[min(n - 1, 7 * n // 8)] = np.nan
            out[inp.name] = x
        elif inp.name == "pred_spread":
            x = np.minimum(1.0, 0.1 + t / 100) * np.exp(-5 * np.clip((t - n // 2) / 40, 0, 1) + rng.normal(0, 0.1, n))
            x[min(n - 1, 5 * n // 8)] = 0.0
            x[min(n - 1, 7 * n // 8)] = np.nan
            out[inp.name] = x
        elif inp.name == "lr":
            lr = np.where(t < n // 2, 1e-3, 3e-2)
            out[inp.name] = lr.astype(float)
        elif form == "scalar":
            y = np.log(2.0) - t / 400 + rng.standard_t(5, n) * 0.03
            y[n // 4] += 1.5
            y[n // 2:n // 2 + 80] += np.where(np.arange(min(80, n - n // 2)) % 2 == 0, 0.5, -0.5)
            y[3 * n // 4:] += 0.04 * np.arange(n - 3 * n // 4)
            x = np.exp(y) * (1e-3 if inp.name == "update_ratio" else 1.0)
            x[min(n - 1, 7 * n // 8)] = np.nan
            out[inp.name] = x
        elif form == "layers":
            norms = np.exp(rng.normal(0, 0.2, (n, 4))) * np.array([1.0, 0.5, 0.3, 0.2])
            norms[n // 2:, 1] *= 1e-5
            out[inp.name] = {f"l{j}": norms[:, j] for j in range(4)}
        else:
            dead = np.clip(0.2 + np.where(t > n // 3, (t - n // 3) / 100, 0), 0, 0.99)
            sat = np.where(t > n // 2, 0.8, 0.1)
            out[inp.name] = {"relu": {"dead_frac": dead, "saturation": np.zeros(n)},
                             "tanh": {"dead_frac": np.zeros(n), "saturation": sat}}
    return out


def _rows(detector: Any, data: Mapping[str, Any]) -> list[tuple[int, dict[str, Any]]]:
    """``data`` as the per-step keyword arguments of ``update``, in step order."""
    from collections.abc import Mapping as _M

    import numpy as np

    per_step: dict[int, dict[str, Any]] = {}
    for name, value in data.items():
        if isinstance(value, tuple):
            steps, value = value
        else:
            steps = None
        entries: list[Any]
        if isinstance(value, _M) and value and all(isinstance(v, _M) for v in value.values()):  # activations
            n = len(next(iter(next(iter(value.values())).values())))
            entries = [{lay: {k: float(a[i]) for k, a in stats.items()} for lay, stats in value.items()}
                       for i in range(n)]
        elif isinstance(value, _M):
            n = len(next(iter(value.values())))
            entries = [{lay: float(a[i]) for lay, a in value.items()} for i in range(n)]
        else:
            entries = [float(v) for v in np.asarray(value, dtype=float)]
        st = range(len(entries)) if steps is None else [int(s) for s in steps]
        for s, e in zip(st, entries):
            per_step.setdefault(s, {})[name] = e
    required = {i.name for i in detector.inputs if i.required}
    return [(s, kw) for s, kw in sorted(per_step.items()) if required <= set(kw)]


def _chunk(data: Mapping[str, Any], lo: int, hi: int) -> dict[str, Any]:
    """The part of ``data`` at steps ``[lo, hi)``."""
    from collections.abc import Mapping as _M

    import numpy as np

    out: dict[str, Any] = {}
    for name, value in data.items():
        if isinstance(value, tuple):
            st = np.asarray(value[0])
            keep = (st >= lo) & (st < hi)
            out[name] = (st[keep], np.asarray(value[1])[keep])
        elif isinstance(value, _M) and value and all(isinstance(v, _M) for v in value.values()):
            out[name] = {lay: {k: np.asarray(a)[lo:hi] for k, a in stats.items()} for lay, stats in value.items()}
        elif isinstance(value, _M):
            out[name] = {lay: np.asarray(a)[lo:hi] for lay, a in value.items()}
        else:
            out[name] = np.asarray(value)[lo:hi]
    return out


def close_events(a: Sequence[Any], b: Sequence[Any]) -> bool:
    """Whether two event lists agree: kind, severity, steps, detector and layer exactly, values to 1e-9."""
    import math

    if len(a) != len(b):
        return False
    for e, f in zip(a, b):
        if (e.kind, e.severity, e.step, e.onset_step, e.detector, e.layer) != (
                f.kind, f.severity, f.step, f.onset_step, f.detector, f.layer):
            return False
        for u, v in ((e.value, f.value), (e.threshold, f.threshold)):
            if not (u == v or (math.isnan(u) and math.isnan(v)) or math.isclose(u, v, rel_tol=1e-9, abs_tol=1e-12)):
                return False
    return True


def close_state(a: Any, b: Any) -> bool:
    """Whether two state dicts agree: structure exactly, floats to 1e-10 (NaN equals NaN)."""
    import math

    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(close_state(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(close_state(x, y) for x, y in zip(a, b))
    if isinstance(a, float) or isinstance(b, float):
        if a is None or b is None:
            return a is b
        return a == b or (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-10, abs_tol=1e-10)
    return bool(a == b)


def _bad_value(default: Any) -> Any:
    """A value no numeric or named setting accepts (None: the parameter takes anything)."""
    if isinstance(default, bool):
        return None
    if default is None or isinstance(default, (int, float)):
        return float("nan")
    if isinstance(default, str):
        return "<not a valid setting>"
    return None


def check_detector(factory: Callable[[], Any], data: Mapping[str, Any] | None = None, *,
                   cuts: Sequence[int] = (37, 260, 455), seed: int = 0) -> None:
    """The conformance checks every detector passes; ours run them over every class in the package.

    ``factory()`` builds the detector (a :class:`~trainsignals.Detector`); ``data`` holds its
    inputs in the forms of :func:`example_inputs` (the default). Checked:

    * what the base class needs (:meth:`~trainsignals.Detector.check_contract`): each
      constructor argument kept as the attribute of its name, ``_last_step`` in the state;
    * ``repr`` names the class and ``clone()`` rebuilds the same configuration;
    * every event is an :class:`~trainsignals.Event` whose one-line ``str`` names its step and
      kind, in step order, with ``onset_step <= step``;
    * ``scan`` gives the events and state of ``update`` step by step, whole and in random chunks;
    * ``state_dict()`` through JSON, and pickle, resume bit-identically at each of ``cuts``;
    * ``reset()`` equals a fresh detector;
    * a non-finite value leaves the state untouched (unless the detector reports it as a
      ``nonfinite`` event);
    * a bad setting of any numeric or named constructor parameter raises ``ValueError`` naming it;
    * a foreign or incomplete state dict is refused, naming what differs.

    Raises:
        AssertionError: a check failed; the message says which.
    """
    import inspect
    import json
    import math
    import pickle

    import numpy as np

    from .signals import SIGNALS

    det = factory()
    name = type(det).__name__
    try:
        det.check_contract()
    except TypeError as err:
        raise AssertionError(str(err)) from None
    data = dict(example_inputs(det, seed=seed) if data is None else data)
    rows = _rows(det, data)
    assert rows, f"{name}: no step has every required input"

    def stream(d: Any, part: Sequence[tuple[int, dict[str, Any]]]) -> list[Any]:
        out: list[Any] = []
        for s, kw in part:
            got = d.update(step=s, **kw)
            assert isinstance(got, list), f"{name}.update must return a list of events, got {type(got).__name__}"
            out.extend(got)
        return out

    text = repr(det)
    assert text.startswith(name + "("), f"{name}: repr {text!r} does not name the class"
    assert repr(det.clone()) == text, f"{name}: clone() does not rebuild the same configuration"
    whole = stream(det, rows)
    for e in whole:
        line = str(e)
        assert "\n" not in line and str(e.step) in line and e.kind.value in line, f"{name}: event text {line!r}"
        assert e.onset_step <= e.step, f"{name}: onset after the step in {line!r}"
    assert [e.step for e in whole] == sorted(e.step for e in whole), f"{name}: events out of step order"
    last = rows[-1][0] + 1
    rng = np.random.default_rng(seed)
    for trial in range(3):
        bounds = sorted({0, last, *(int(c) for c in rng.integers(0, last, trial * 3))})
        batched = factory()
        evs: list[Any] = []
        for lo, hi in zip(bounds[:-1], bounds[1:]):
            part = _chunk(data, lo, hi)
            aligned = {k: v for k, v in part.items() if not isinstance(v, tuple)}
            steps = np.arange(lo, hi) if aligned else None
            part = {k: v for k, v in part.items() if not (isinstance(v, tuple) and len(v[0]) == 0)}
            required = {i.name for i in batched.inputs if i.required}
            if not part or not required <= set(part):
                continue
            evs += batched.scan(steps=steps, **part)
        assert close_events(whole, evs), f"{name}: scan in chunks {bounds} differs from update step by step"
        assert close_state(det.state_dict(), batched.state_dict()), f"{name}: scan leaves another state than update"
    for cut in cuts:
        first = factory()
        head = [r for r in rows if r[0] < cut]
        tail = [r for r in rows if r[0] >= cut]
        before = stream(first, head)
        resumed = factory()
        resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))
        again = pickle.loads(pickle.dumps(first))
        assert close_events(before + stream(resumed, tail), whole), f"{name}: JSON state resumed at {cut} differs"
        assert close_events(before + stream(again, tail), whole), f"{name}: pickle resumed at {cut} differs"
    fresh = factory().state_dict()
    det.reset()
    assert det.state_dict() == fresh, f"{name}: reset() differs from a fresh detector"
    # a non-finite value of each scalar input leaves the statistics untouched
    for inp in det.inputs:
        if SIGNALS[inp.name].form != "scalar":
            continue
        d = factory()
        head = [r for r in rows if r[0] < cuts[-1]]
        stream(d, head)
        s, kw = next((r for r in rows if r[0] >= cuts[-1]), rows[-1])
        sig = SIGNALS[inp.name]
        for bad in (math.nan,) if sig.fraction else (math.nan, math.inf) if sig.nonneg else (
                math.nan, math.inf, -math.inf):
            snap = d.state_dict()
            got = d.update(step=s, **{**kw, inp.name: bad})
            after = d.state_dict()
            d.load_state_dict(snap)
            if any(e.kind.value == "nonfinite" for e in got):
                continue
            if inp.required:  # the step's value is refused as a whole: only the step moves
                want = json.loads(json.dumps(snap))
                want["state"]["last_step"] = after["state"].get("last_step")
            else:  # an optional input that is not finite counts as not measured
                twin = factory()
                twin.load_state_dict(snap)
                rest = {k: v for k, v in kw.items() if k != inp.name}
                if not rest:
                    continue
                twin.update(step=s, **rest)
                want = twin.state_dict()
            assert close_state(after, want), f"{name}: a {bad} {inp.name} changed the state"
    # bad settings name the parameter
    cls = type(det)
    params = inspect.signature(cls.__init__).parameters
    needed: dict[str, Any] = {q: getattr(det, q) for q, p in params.items()  # a required argument: the factory's value
                if q != "self" and p.default is inspect.Parameter.empty and p.kind is p.POSITIONAL_OR_KEYWORD}
    for pname, p in params.items():
        if pname == "self" or p.default is inspect.Parameter.empty:
            continue
        bad = _bad_value(p.default)
        if bad is None:
            continue
        try:
            cls(**{**needed, pname: bad})
        except ValueError as exc:
            assert pname in str(exc), f"{name}({pname}={bad!r}): the error does not name it: {exc}"
        else:
            raise AssertionError(f"{name}({pname}={bad!r}) was accepted")
    # a foreign or incomplete state is refused
    snap = factory().state_dict()
    for broken in ({**snap, "detector": "Other"}, {**snap, "state": dict(list(snap["state"].items())[1:])},
                   {"detector": name}):
        try:
            factory().load_state_dict(broken)
        except ValueError:
            continue
        raise AssertionError(f"{name}.load_state_dict accepted a foreign or incomplete state")


__all__ += ["check_detector", "close_events", "close_state", "example_inputs"]
