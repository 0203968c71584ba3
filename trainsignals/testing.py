"""Helpers to unit-test detectors and training loops on labeled failure curves, and a pytest plugin.

The assertions run a detector over a :class:`~trainsignals.curves.Curve` and check what it
said::

    from trainsignals.curves import generate
    from trainsignals.testing import assert_detects, assert_quiet

    assert_detects(SlopeDivergence(), generate("divergence", seed=3, difficulty="easy"))
    assert_quiet(SlopeDivergence(), generate("healthy", seed=3))

A detector may be a :class:`trainsignals.Monitor` (fed every signal of the curve), a
single-signal detector (an object with ``scan(*arrays, steps=None)`` and a ``signals`` tuple
such as ``("loss",)`` or ``("loss", "grad_norm")``), any other object whose ``scan`` takes the
Monitor's keywords, or a plain callable ``f(curve) -> list[Event]``.

Installed with trainsignals, this module is also a pytest plugin (entry point ``pytest11``)
that provides the fixtures ``failure_curves`` (the committed suite, loaded once per session)
and ``failure_curve_factory`` (:func:`trainsignals.curves.generate`); :func:`curve_params`
builds parameter lists for ``pytest.mark.parametrize``. The plugin is loaded by every pytest
run in an environment where trainsignals is installed, so this module imports nothing heavy
at import time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
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
_STEP_SIGNALS = ("loss", "grad_norm", "lr", "update_ratio")


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
        detector: A ``trainsignals.Monitor`` (reset, then ``scan(**curve.signals())``); an
            object with ``scan`` and a ``signals`` tuple (reset, then ``scan`` with the curve's
            data for those names and the steps they were sampled at: ``loss``, ``grad_norm``,
            ``lr``, ``update_ratio`` per step; ``val_loss`` at ``curve.val_steps``;
            ``layer_grad_norms`` as ``{layer: norms}``; ``activations`` as ``{layer:
            {"dead_frac": ..., "saturation": ...}}`` at ``curve.act_steps``; a generic ``"x"``
            is the signal named by the detector's ``signal`` attribute, ``loss`` by default);
            another object with ``scan`` (reset if it can, then ``scan(**curve.signals())``);
            or a callable ``f(curve) -> list[Event]``.
        curve: The curve.

    Returns:
        The events.

    Raises:
        TypeError: the detector is none of these.
    """
    if _is_monitor(detector):
        detector.reset()
        return list(detector.scan(**curve.signals()))
    scan = getattr(detector, "scan", None)
    if scan is not None and callable(scan):
        reset = getattr(detector, "reset", None)
        if callable(reset):
            reset()
        names = getattr(detector, "signals", None)
        if names is None:
            return list(scan(**curve.signals()))
        inputs = [_signal_input(detector, str(name), curve) for name in names]
        steps = inputs[0][1] if inputs else curve.steps
        if any(st is not steps for _, st in inputs):
            raise TypeError(
                f"{type(detector).__name__} reads signals {tuple(names)} sampled at different steps"
            )
        return list(scan(*[x for x, _ in inputs], steps=steps))
    if callable(detector):
        return list(detector(curve))
    raise TypeError(
        f"cannot run {type(detector).__name__!s}: expected a Monitor, an object with scan(), or a callable"
    )


def _signal_input(detector: Any, name: str, curve: Curve) -> tuple[Any, Any]:
    """The curve's data for one signal a detector reads, and the steps it was sampled at."""
    if name == "x":  # a generic input: the detector says which signal it watches
        name = str(getattr(detector, "signal", "loss"))
    if name in _STEP_SIGNALS:
        return getattr(curve, name), curve.steps
    if name == "val_loss":
        return curve.val_loss, curve.val_steps
    if name == "layer_grad_norms":
        return {n: curve.layer_grad_norms[:, j] for j, n in enumerate(curve.layer_names)}, curve.steps
    if name == "activations":
        return curve.signals()["activations"][1], curve.act_steps
    raise TypeError(
        f"{type(detector).__name__} reads signal {name!r}, which a Curve does not have "
        f"(it has {', '.join(_STEP_SIGNALS)}, val_loss, layer_grad_norms, activations)"
    )


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
        ValueError: the curve is healthy (use :func:`assert_quiet`) or ``within`` < 0.
    """
    if curve.onset_step < 0:
        raise ValueError(f"{curve.name} is a healthy curve with no onset: use assert_quiet")
    want = str(getattr(kind, "value", kind)) if kind is not None else curve.kind
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
        severities: The severities that fail the assertion.

    Returns:
        All events the detector raised (those of other severities).

    Raises:
        AssertionError: an event of one of ``severities``; the message lists them.
    """
    bad_sev = {str(s) for s in severities}
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

    Example:
        >>> [p.id for p in curve_params(["stall"], n=2)]
        ['stall-easy-0', 'stall-medium-1']
    """
    from .curves import DIFFICULTIES, KINDS, generate

    if kinds is None:
        chosen: Sequence[str] = KINDS
    elif isinstance(kinds, str):
        chosen = (kinds,)
    else:
        chosen = [str(getattr(k, "value", k)) for k in kinds]
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
