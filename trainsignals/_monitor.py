"""The Monitor: the default suite of detectors behind one ``update`` call."""

from __future__ import annotations

import copy
import dataclasses
import inspect
import weakref
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from typing import Any

import numpy as np

from ._events import Event, Kind, check_kinds
from ._layers import LayerValues
from ._recorder import Recorder
from ._validate import check_choice, check_range, to_step
from ._version import __version__
from .detectors._base import Detector, _jsonable
from .detectors._interval import MIN_VALUES
from .detectors._ops import log as _log
from .detectors._ops import nondecreasing, sharing
from .policy import EventPolicy
from .signals import DENSE_SIGNALS, SIGNALS, Column, column, dense_values, layers, scalar
from .signals import activations as _activations
from .status import RANK, STATUSES, state_of, warmed_up
from .suite import default_suite

__all__ = ["Monitor", "STATUSES", "scan"]

_NAN = float("nan")
#: steps of dense scalar signals one :meth:`Monitor.scan` pass takes at a time: the arrays its detectors
#: share (about 300 bytes a step for loss and grad norm) stay under 650 MB however long the run
SCAN_CHUNK = 1 << 21
_VECTOR_NAMES = frozenset(name for name, sig in SIGNALS.items() if sig.form != "scalar")
#: the signals ``update`` takes, in the order of a step's row (the per-layer ones last)
_ORDER = ("loss", "grad_norm", "lr", "update_ratio", "val_loss", "val_metric", "pred_top_share", "pred_spread",
          "layer_grad_norms", "layer_update_ratios", "activations")
#: the first bit of a per-layer signal in a step's ``have`` (they come last in ``_ORDER``)
_VECTOR_BITS = 1 << _ORDER.index("layer_grad_norms")


@lru_cache(maxsize=256)
def _takes_cached(fn: Any, name: str) -> bool:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return True
    return any(p.name == name or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


def _takes(method: Any, name: str) -> bool:
    """Whether a recorder's method accepts the keyword ``name`` (recorders written before a
    keyword existed are called without it).
    """
    return _takes_cached(getattr(method, "__func__", method), name)


def _given(v: Any) -> bool:
    """A per-layer input that carries values (``None`` and an empty mapping or sequence: not measured)."""
    if v is None:
        return False
    try:
        return isinstance(v, (str, bytes)) or len(v) > 0
    except TypeError:
        return True  # not a container: the coercion names the signal and says what is wrong


def _runner(calls: Sequence[tuple[Any, tuple[int, ...], tuple[int, ...]]], width: int,
            logged: Mapping[int, int]) -> Any:
    """``run(row, step) -> list[Event]``: each ``feed`` of ``calls`` on the row's entries ``idx``
    (``()``: the whole row) and the logs ``lidx`` of entries, in order, collecting the events.

    ``row`` has ``width`` entries; ``logged`` maps the entries whose logs the calls read to where
    the row holds their log (``-1``: the run takes it, :func:`~trainsignals.detectors._ops.log`, ``nan`` where not positive).
    The calls are written out one by one as the source of ``run`` (compiled once per combination
    of given signals): every call site then has one detector, which CPython specialises for it;
    a loop's single call site, seeing every detector, stays generic.
    """
    names = [f"r{i}" for i in range(width)]
    lines = [f"def make({', '.join(f'f{k}' for k in range(len(calls)))}):", "    def run(row, step):",
             f"        {', '.join(names)}{',' if width == 1 else ''} = row"]
    for i, at in logged.items():
        if at < 0:
            lines.append(f"        l{i} = _log(r{i}) if r{i} > 0.0 else _NAN")
    lines.append("        out = []")
    for k, (_, idx, lidx) in enumerate(calls):
        args = "".join(f"r{i}, " for i in idx) if idx else "row, "
        logs = "".join(f", {'l' if logged[i] < 0 else 'r'}{i if logged[i] < 0 else logged[i]}" for i in lidx)
        lines += [f"        ev = f{k}({args}step{logs})",
                  "        if ev is not None:",
                  "            out.extend(ev) if type(ev) is list else out.append(ev)"]
    lines += ["        return out", "    return run"]
    scope: dict[str, Any] = {"_log": _log, "_NAN": _NAN}
    exec(_compiled("\n".join(lines)), scope)
    return scope["make"](*(feed for feed, _, _ in calls))


@lru_cache(maxsize=256)
def _compiled(source: str) -> Any:
    """A plan's source compiled (once per source: every Monitor of a suite has the same plans)."""
    return compile(source, "<trainsignals.Monitor plan>", "exec")


def _snake(name: str) -> str:
    return "".join("_" + c.lower() if c.isupper() and i else c.lower() for i, c in enumerate(name))


def _named(suite: Mapping[str, Any] | Sequence[Any]) -> dict[str, Any]:
    """A suite as ``{name: detector}``: a mapping as it is, a sequence named by class."""
    if isinstance(suite, Mapping):
        return {str(k): v for k, v in suite.items()}
    if isinstance(suite, (str, bytes)) or not isinstance(suite, Sequence):
        raise ValueError(f"suite must be a mapping of name -> detector or a sequence of detectors, got {suite!r}")
    out: dict[str, Any] = {}
    for det in suite:
        base = _snake(type(det).__name__)
        name, k = base, 2
        while name in out:
            name, k = f"{base}_{k}", k + 1
        out[name] = det
    return out


def _given_events(events: Iterable[Any]) -> list[Event]:
    """The findings given to ``update``, as a list; a ``TypeError`` names anything that is not an Event."""
    out = list(events)
    for given in out:
        if not isinstance(given, Event):
            raise TypeError(f"events must hold trainsignals.Event objects, got {type(given).__name__}")
    return out


#: the Monitor each detector runs in (a detector in a suite given to a second live Monitor is refused)
_OWNERS: weakref.WeakKeyDictionary[Detector, weakref.ref[Monitor]] = weakref.WeakKeyDictionary()


def _check_detector(name: str, det: Any) -> None:
    if not isinstance(det, Detector):
        raise ValueError(f"suite[{name!r}] must be a trainsignals.Detector, got {type(det).__name__}")
    det.check_contract()
    ins = det.inputs
    if not ins:
        raise ValueError(f"suite[{name!r}] declares no inputs")
    for inp in ins:
        if inp.name not in SIGNALS:
            raise ValueError(f"suite[{name!r}] reads {inp.name!r}, not a signal; signals are {list(SIGNALS)}")
    scalars = [i.name for i in ins if SIGNALS[i.name].form == "scalar"]
    for lg in det.logs:
        if lg not in scalars:
            raise ValueError(f"suite[{name!r}] declares the log of {lg!r}, not one of its scalar inputs {scalars}")


class Monitor:
    """Watches a training run's signals and reports what goes wrong, and since when.

    Feed it once per step with whatever signals you have (all optional, any cadence)::

        mon = Monitor(total_steps=10_000)
        for step, batch in enumerate(loader):
            ...
            for event in mon.update(step=step, loss=loss, grad_norm=gnorm, lr=lr):
                print(event)
            if mon.should_stop:
                break

    Args:
        total_steps: planned run length, if known; sets the stall patience to 10 % of it
            (at least ``min_patience``), per the "no new best loss within 10 % of the
            planned steps" rule. Without it the patience is 200 steps.
        stop_on: kinds whose *critical* events set :attr:`should_stop` (default: all kinds).
        warmup: values of loss before :attr:`status` leaves ``"warming_up"`` (or 8 values that
            span as many steps: a log written every N steps).
        recovery: steps after its latest event that a failed state lasts (see :attr:`status`);
            keep it above the detectors' cooldowns (100 steps by default), since a detector
            does not repeat an ongoing failure during its cooldown. With ``log_every`` N a
            state lasts at least ``MIN_VALUES`` (8) logged values, ``8 * N`` steps
            (:attr:`recovery_steps`): 200 steps are under one row of a log written every 500.
        min_patience: smallest stall patience derived from ``total_steps``.
        log_every: steps between the updates the Monitor will get, for a stream logged every N
            steps (replaying a log a trainer wrote every ``logging_steps``): the default
            suite's windows, which count values, then cover the same steps, down to the fewest
            values each rule needs (see :func:`trainsignals.default_suite`). Adapters feed
            every step: leave it at 1 there.
        val_metric_mode: the direction of ``val_metric`` for the default suite: ``"max"``
            (higher is better: accuracy, F1) or ``"min"`` (an error rate).
        max_events: events kept in memory (the latest); :attr:`n_events` counts them all.
        recorder: receives every update and its events (e.g. a ``TraceWriter``); see
            :class:`~trainsignals.Recorder`. A recorder with a ``plan`` method is given this
            Monitor's settings here, as a dict (a ``TraceWriter`` keeps them in the trace, so that
            ``replay`` builds the same Monitor).
        policy: what happens to the detectors' events across rules: one jump seen by two rules
            is one event, frequent spikes escalate to critical, and a grad-norm jump while the
            loss has not risen stays a warning (see :class:`~trainsignals.EventPolicy`; when
            None, ``EventPolicy.for_interval(log_every)``: ``EventPolicy()`` at one value a step).
        **settings: per-detector configuration, by suite name, e.g.
            ``loss_spike={"threshold": 8}``; ``name=False`` disables a detector. Suite names:
            :data:`trainsignals.suite.SUITE_NAMES`.

    Raises:
        TypeError: an unknown keyword.
        ValueError: a bad setting (the message names it).

    Example:
        Gradient descent on (w - 3)**2 from w = 10, fed loss and grad norm:

        >>> def run(lr, steps=10):
        ...     mon, w = Monitor(), 10.0
        ...     for step in range(steps):
        ...         grad = 2 * (w - 3)
        ...         w -= lr * grad
        ...         mon.update(step=step, loss=(w - 3) ** 2, grad_norm=abs(grad))
        ...     return mon
        >>> def losses(lr, steps=6):
        ...     w, out = 10.0, []
        ...     for _ in range(steps):
        ...         w -= lr * 2 * (w - 3)
        ...         out.append(round((w - 3) ** 2, 1))
        ...     return out
        >>> losses(0.1), losses(1.1)
        ([31.4, 20.1, 12.8, 8.2, 5.3, 3.4], [70.6, 101.6, 146.3, 210.7, 303.4, 436.9])
        >>> [(e.kind.value, e.step, e.onset_step) for e in run(1.1).events]
        [('divergence', 4, 0)]
        >>> run(1.1).should_stop
        True
        >>> run(0.1).events, run(0.4).events
        ([], [])
    """

    def __init__(
        self,
        total_steps: int | None = None,
        *,
        suite: Mapping[str, Detector] | Sequence[Detector] | None = None,
        stop_on: tuple[str, ...] | None = None,
        warmup: int = 20,
        recovery: int = 200,
        min_patience: int = 50,
        max_events: int = 10_000,
        recorder: Recorder | None = None,
        val_metric_mode: str = "max",
        policy: EventPolicy | None = None,
        log_every: int = 1,
        **settings: Any,
    ) -> None:
        if total_steps is not None:
            check_range("total_steps", total_steps, 1, None, integer=True)
        check_range("warmup", warmup, 0, None, integer=True)
        check_range("recovery", recovery, 1, None, integer=True)
        check_range("min_patience", min_patience, 2, None, integer=True)
        check_range("max_events", max_events, 1, None, integer=True)
        check_choice("val_metric_mode", val_metric_mode, ("max", "min"))
        check_range("log_every", log_every, 1, None, integer=True)
        kinds = tuple(k.value for k in Kind)
        if stop_on is not None:
            stop_on = check_kinds("stop_on", stop_on)
        self.total_steps = total_steps
        self.stop_on = stop_on
        self.warmup = warmup
        self.recovery = recovery
        self.min_patience = min_patience
        self.max_events = max_events
        self.val_metric_mode = val_metric_mode
        self.log_every = log_every
        if recorder is not None and not isinstance(recorder, Recorder):
            raise ValueError(f"recorder must have record() and record_batch() methods, got {recorder!r}")
        self.recorder = recorder
        if policy is not None and not isinstance(policy, EventPolicy):
            raise ValueError(f"policy must be a trainsignals.EventPolicy, got {policy!r}")
        self.policy = policy if policy is not None else EventPolicy.for_interval(log_every)
        self.settings = copy.deepcopy(settings)
        custom_suite = suite is not None
        if suite is None:
            try:
                suite = default_suite(total_steps, min_patience=min_patience, val_metric_mode=val_metric_mode,
                                      log_every=log_every, **settings)
            except TypeError as exc:
                raise TypeError(f"Monitor() got {exc}") from exc
        elif log_every != 1:
            raise TypeError("Monitor() got log_every and a suite: log_every configures the default suite "
                            "(ts.default_suite(log_every=N)); give your own detectors their spans when you build "
                            "them (trainsignals.detectors.interval_settings)")
        elif settings:
            raise TypeError(f"Monitor() got detector settings {sorted(settings)} and a suite: settings by name "
                            "configure the default suite (ts.default_suite(**settings)); configure your own "
                            "detectors when you build them")
        self._suite = _named(suite)
        for name, det in self._suite.items():
            _check_detector(name, det)
            owner = _OWNERS.get(det)
            if owner is not None and owner() is not None:  # two Monitors feeding one detector garble both
                raise ValueError(f"suite[{name!r}] already runs in another Monitor: give each Monitor its own "
                                 "detectors (ts.default_suite() again, or detector.clone())")
        for det in self._suite.values():
            _OWNERS[det] = weakref.ref(self)
        # the streaming path's plan: each detector's bound per-step entry and how to pick its inputs
        self._entries = [(det.feed, tuple(i.name for i in det.inputs),
                          tuple(i.name for i in det.inputs if i.required), tuple(det.logs))
                         for det in self._suite.values()]
        self._plans: dict[int, tuple[tuple[str, ...], Any]] = {}
        # each calibrated rule's healthy-run rates (tuning, held-out), by the (detector, signal) its events carry
        keys = [(type(d).__name__, d.inputs[0].name if d.inputs else "") for d in self._suite.values()]
        rates = ((k, (getattr(d, "healthy_rate", None), getattr(d, "heldout_rate", None)))
                 for k, d in zip(keys, self._suite.values(), strict=True))
        self._rates = {k: r for k, r in rates if keys.count(k) == 1 and r != (None, None)}
        self._stop_kinds = frozenset(stop_on) if stop_on is not None else frozenset(kinds)
        self._reset()
        if recorder is not None and callable(plan := getattr(recorder, "plan", None)):
            plan(self._replay_plan(custom_suite=custom_suite, policy=policy))  # e.g. TraceWriter: for replay

    def _plan_for(self, bits: int) -> tuple[tuple[str, ...], Any]:
        """The given signals and the calls for one combination of them (cached: runs feed few).

        ``bits`` says which signals are given (bit ``k``: ``_ORDER[k]``). A detector runs when every
        required input is given (one without required inputs: when any input is given). The
        step's values come as a row: the given signals in ``_ORDER``'s order, then ``nan`` and
        ``None`` (what an absent optional scalar, or other input, is), then the loss's log
        (``nan`` when the loss is not given). Returns the given signals and
        ``run(row, step) -> list[Event]``, which calls those detectors in the suite's order, each
        with the logs it declares (see :func:`_runner`).
        """
        given = tuple(name for k, name in enumerate(_ORDER) if bits >> k & 1)
        have = set(given)
        g = len(given)
        pos = {name: i for i, name in enumerate(given)}
        calls: list[tuple[Any, tuple[int, ...], tuple[int, ...]]] = []
        logged: dict[int, int] = {g: g}  # an absent input's log: nan, as the input is
        for feed, names, required, logs in self._entries:
            if (required and not have.issuperset(required)) or (not required and not have.intersection(names)):
                continue
            idx = tuple(pos.get(n, g + (SIGNALS[n].form != "scalar")) for n in names)
            lidx = tuple(pos.get(n, g) for n in logs)
            for i in lidx:
                if i not in logged:
                    logged[i] = g + 2 if given[i] == "loss" else -1
            calls.append((feed, idx, lidx))
        self._plans[bits] = (given, _runner(calls, g + 3, logged))
        return self._plans[bits]

    def _replay_plan(self, *, custom_suite: bool, policy: EventPolicy | None) -> dict[str, Any]:
        """What a replay needs to build this Monitor again: its constructor's arguments (a recorder with a
        ``plan`` method gets them; see :class:`~trainsignals.Recorder`). A suite of one's own is only named
        (``"suite": "custom"``): its detectors cannot be rebuilt from a trace.
        """
        return {"total_steps": self.total_steps, "log_every": self.log_every, "val_metric_mode": self.val_metric_mode,
                "warmup": self.warmup, "recovery": self.recovery, "min_patience": self.min_patience,
                "max_events": self.max_events, "stop_on": None if self.stop_on is None else list(self.stop_on),
                "settings": copy.deepcopy(self.settings), "suite": "custom" if custom_suite else "default",
                "policy": None if policy is None else policy.config()}

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_plans"] = {}  # compiled functions: built again on first use
        return state

    # ------------------------------------------------------------------------------------
    def _reset(self) -> None:
        self._events: deque[Event] = deque(maxlen=self.max_events)
        self._n_events = 0
        self._step = -1
        self._n_loss = 0
        self._first_loss = -1  # the step of the first finite loss (-1: none yet)
        self._should_stop = False
        self._last_state_step: dict[str, int] = {}
        self._nonfinite_open = False
        self._layer_names: dict[str, tuple[str, ...]] = {}  # per-layer signals: the layers they carry
        self.policy.reset()

    def reset(self) -> None:
        """Forget the run: every detector back to fresh, events cleared."""
        for det in self._suite.values():
            det.reset()
        self._reset()

    @property
    def detectors(self) -> dict[str, Any]:
        """The detectors of the suite, by name (in the order they run)."""
        return dict(self._suite)

    @property
    def events(self) -> list[Event]:
        """The events so far, in order (the latest ``max_events`` of them: memory stays bounded)."""
        return list(self._events)

    @property
    def n_events(self) -> int:
        """How many events fired in all, including any older than the kept ``max_events``."""
        return self._n_events

    @property
    def step(self) -> int:
        """The last step seen (-1 before any)."""
        return self._step

    def stops_on(self, event: Event) -> bool:
        """Whether ``event`` is one that sets :attr:`should_stop`: critical, of a ``stop_on`` kind.

        Adapters that act on events (stop, raise, roll back) use it to make the same decision
        as the Monitor.

        Example:
            >>> from trainsignals import Kind
            >>> from trainsignals._events import make_event
            >>> ev = make_event(Kind.STALL, "critical", 10, 5, "demo", "loss", 0.0, 0.0, "stuck")
            >>> Monitor().stops_on(ev), Monitor(stop_on=("divergence",)).stops_on(ev)
            (True, False)
        """
        return event.severity == "critical" and event.kind.value in self._stop_kinds

    @property
    def should_stop(self) -> bool:
        """True once a critical event of a kind in ``stop_on`` fired."""
        return self._should_stop

    @property
    def recovery_steps(self) -> int:
        """Steps a failed state lasts after its latest event: ``recovery``, and at least ``MIN_VALUES``
        (8) logged values in a Monitor told ``log_every``.
        """
        return max(self.recovery, MIN_VALUES * self.log_every)

    @property
    def status(self) -> str:
        """``"warming_up" | "healthy" | "stalled" | "oscillating" | "collapsed" | "diverging"``.

        ``warming_up`` until ``warmup`` finite loss values were seen, or 8 that span ``warmup``
        steps (a log written every N steps is judged after 8 rows, as the detectors judge it:
        :func:`~trainsignals.status.warmed_up`). A failed state is entered by
        its events (``nonfinite``, ``divergence``, ``grad_explosion`` -> diverging;
        ``silent_collapse`` -> collapsed; ``oscillation`` -> oscillating; ``stall`` -> stalled)
        and left once :attr:`recovery_steps` (``recovery``, at least 8 logged values)
        steps pass without another event of its kinds — except that a diverging run stays
        diverging after a non-finite value until finite values return, and while its loss has not
        come back to within 10 % of its level before the divergence (the policy's divergence hold,
        :mod:`trainsignals.policy`). The worst live state wins.
        """
        best, rank = "healthy", 0
        for state, last in self._last_state_step.items():
            live = self._step - last < self.recovery_steps or (
                state == "diverging" and (self._nonfinite_open or self.policy.holding))
            if live and RANK[state] > rank:
                best, rank = state, RANK[state]
        if rank == 0 and not warmed_up(self._n_loss, self._first_loss, self._step, self.warmup):
            return "warming_up"
        return best

    # ------------------------------------------------------------------------------------
    def _record(self, events: list[Event]) -> None:
        rates = self._rates
        if rates:  # each event says how often its rule fires on healthy runs
            for i, ev in enumerate(events):
                if ev.healthy_rate is None and ev.heldout_rate is None and (
                        r := rates.get((ev.detector, ev.signal.partition("[")[0]))) is not None:
                    events[i] = dataclasses.replace(ev, healthy_rate=r[0], heldout_rate=r[1])
        self._n_events += len(events)
        for ev in events:
            self._events.append(ev)
            state = state_of(ev)
            if state is not None:
                self._last_state_step[state] = max(self._last_state_step.get(state, ev.step), ev.step)
            if self.stops_on(ev):
                self._should_stop = True

    def update(
        self,
        *,
        step: int | None = None,
        loss: Any = None,
        grad_norm: Any = None,
        lr: Any = None,
        update_ratio: Any = None,
        val_loss: Any = None,
        layer_grad_norms: Any = None,
        activations: Any = None,
        events: Sequence[Event] | None = None,
        layer_update_ratios: Any = None,
        val_metric: Any = None,
        pred_top_share: Any = None,
        pred_spread: Any = None,
    ) -> list[Event]:
        """Feed one step's signals (any subset); returns the events raised at this step.

        ``events`` are findings made outside the Monitor at this step (an adapter's own checks:
        a GradScaler that skips steps, replicas that disagree across ranks). They are recorded
        after the detectors' events and count like them: in :attr:`events`, :attr:`should_stop`
        (critical ones of a ``stop_on`` kind), :attr:`status` (``info`` events never change it)
        and the recorder's row for this step.

        Raises:
            TypeError: a signal is not a number (or mapping/sequence for vectors), or ``events``
                holds something other than :class:`Event`; the message names it. Nothing is
                recorded for that call.
            ValueError: a negative grad norm, learning rate, update ratio or ``pred_spread``, a
                ``pred_top_share`` outside [0, 1]; a decreasing step.
        """
        if step is None:
            s = self._step + 1
        elif (s := to_step(step)) < self._step:
            raise ValueError(f"step must not decrease: got {s} after {self._step}")
        if events is not None:
            events = _given_events(events)
        # every value is coerced and checked before anything changes: a refused call changes nothing;
        # the given values in _ORDER's order make the row, and ``have`` says which they are (a bit each)
        row: list[Any] = []
        have = 0
        if loss is not None:
            row.append(loss if type(loss) is float else scalar("loss", loss))
            have = 1
        if grad_norm is not None:
            row.append(grad_norm if type(grad_norm) is float and grad_norm >= 0.0 else scalar("grad_norm", grad_norm))
            have |= 2
        if lr is not None:
            row.append(lr if type(lr) is float and lr >= 0.0 else scalar("lr", lr))
            have |= 4
        if update_ratio is not None:
            row.append(scalar("update_ratio", update_ratio))
            have |= 8
        if val_loss is not None:
            row.append(val_loss if type(val_loss) is float else scalar("val_loss", val_loss))
            have |= 16
        if val_metric is not None:
            row.append(scalar("val_metric", val_metric))
            have |= 32
        if pred_top_share is not None:
            row.append(scalar("pred_top_share", pred_top_share))
            have |= 64
        if pred_spread is not None:
            row.append(scalar("pred_spread", pred_spread))
            have |= 128
        if layer_grad_norms is not None and _given(layer_grad_norms):
            row.append(layers("layer_grad_norms", layer_grad_norms, self._layer_names.get("layer_grad_norms")))
            have |= 256
        if layer_update_ratios is not None and _given(layer_update_ratios):
            row.append(layers("layer_update_ratios", layer_update_ratios, self._layer_names.get("layer_update_ratios")))
            have |= 512
        if activations is not None and _given(activations):
            row.append(_activations(activations, self._layer_names.get("activations")))
            have |= 1024
        self._step = s
        got = self._plans.get(have)
        if got is None:
            got = self._plan_for(have)
        names, run = got
        if have >= _VECTOR_BITS:  # a per-layer signal (they come last): remember its layers
            for name, v in zip(names, row, strict=True):
                if name in _VECTOR_NAMES and name not in self._layer_names:
                    self._layer_names[name] = v.names
        if have & 1:
            lv = row[0]
            ll = _log(lv) if lv > 0.0 else _NAN  # read by the policy and by every detector declaring it
        else:
            lv = ll = _NAN
        row += (_NAN, None, ll)  # what an absent optional input is, then the loss's log
        out = self.policy.apply(run(row, s), s, lv, ll, events or ())  # only the detectors this step's signals reach
        if have >= _VECTOR_BITS:  # the caller's LayerValues keep no more than their vectors once the step is judged
            for v in (layer_grad_norms, layer_update_ratios):
                if type(v) is LayerValues:
                    v.release()
        if have & 1:
            if lv - lv == 0.0:
                if not self._n_loss:
                    self._first_loss = s
                self._n_loss += 1
                self._nonfinite_open = False
            else:
                self._nonfinite_open = True
        if events:
            out.extend(events)
        if out:
            self._record(out)
        if self.recorder is not None:
            self._record_step(s, dict(zip(names, row, strict=False)), out)
        return out

    def _record_step(self, s: int, vals: dict[str, Any], out: list[Event]) -> None:
        assert self.recorder is not None
        scalars = {k: v for k, v in vals.items() if SIGNALS[k].form == "scalar"}
        lg, lu, acts = vals.get("layer_grad_norms"), vals.get("layer_update_ratios"), vals.get("activations")
        extra = {} if lu is None or not _takes(self.recorder.record, "layer_update_ratios") else {
            "layer_update_ratios": (lu.array, lu.names)}
        self.recorder.record(step=s, signals=scalars, layer_grad_norms=None if lg is None else (lg.array, lg.names),
                             activations=None if acts is None else (acts.matrix, acts.names), events=out, **extra)

    # ------------------------------------------------------------------------------------
    def scan(
        self,
        *,
        step: Any = None,
        loss: Any = None,
        grad_norm: Any = None,
        lr: Any = None,
        update_ratio: Any = None,
        val_loss: Any = None,
        layer_grad_norms: Any = None,
        activations: Any = None,
        layer_update_ratios: Any = None,
        val_metric: Any = None,
        pred_top_share: Any = None,
        pred_spread: Any = None,
        events: Sequence[Event] | None = None,
    ) -> list[Event]:
        """Batch path: whole arrays in, exactly the events of feeding :meth:`update` step by step.

        Dense signals (``loss``, ``grad_norm``, ``lr``, ``update_ratio``) are 1-D arrays aligned
        with ``step``; a gap — a masked entry of a NumPy masked array or a null of a pyarrow
        array — means "not measured at this step" (a NaN is a measured non-finite value). A signal sampled at its own cadence is a ``(steps, values)`` pair:
        ``val_loss=(val_steps, val_values)``, ``layer_grad_norms=(steps, {name: array})`` (and
        ``layer_update_ratios`` the same way) and
        ``activations=(steps, {layer: {"dead_frac": array, "saturation": array}})``;
        ``layer_grad_norms``, ``layer_update_ratios`` and ``activations`` may also be aligned
        with ``step`` directly
        (a ``{name: array}`` mapping or a 2-D array). Accepts lists, NumPy arrays, pandas or
        polars columns and pyarrow arrays. ``val_metric`` is a ``(steps, values)`` pair like
        ``val_loss``; ``pred_top_share`` and ``pred_spread`` are aligned (with gaps) or pairs.
        ``events`` are findings made outside the Monitor during these steps, each at its own
        ``step`` (as :meth:`update`'s ``events``, which a trace records: replaying one gives them
        back), recorded after the detectors' events of their step. Returns the new events; the
        Monitor's state advances as if every step had been fed.

        Raises:
            TypeError: a signal of the wrong type, or ``events`` holding something other than
                :class:`Event` (named).
            ValueError: misaligned or decreasing steps, impossible values (named), or a given
                event whose step lies outside the scanned steps.
        """
        given_events = _given_events(events) if events is not None else []
        given = {"loss": loss, "grad_norm": grad_norm, "lr": lr, "update_ratio": update_ratio, "val_loss": val_loss,
                 "layer_grad_norms": layer_grad_norms, "layer_update_ratios": layer_update_ratios,
                 "activations": activations, "val_metric": val_metric, "pred_top_share": pred_top_share,
                 "pred_spread": pred_spread}
        raw = {k: v for k, v in given.items() if v is not None}
        for name in ("val_loss", "val_metric"):
            if name in raw and not (isinstance(raw[name], tuple) and len(raw[name]) == 2):
                raise TypeError(f"{name} must be a (steps, values) pair: validation has its own cadence")
        cols: dict[str, Column] = {}
        for name, v in raw.items():
            c = column(name, v, self._layer_names.get(name))
            if len(c) or c.steps is None:
                cols[name] = c
        aligned = {c.name: len(c) for c in cols.values() if c.steps is None}
        if len(set(aligned.values())) > 1:
            raise ValueError(f"signals aligned with step must have equal lengths, got {aligned}")
        n = next(iter(aligned.values()), 0)
        if step is None:
            steps = np.arange(self._step + 1, self._step + 1 + n, dtype=np.int64)
        else:
            from .signals import as_steps

            steps = as_steps("step", step, n)
        every = [steps] + [c.steps for c in cols.values() if c.steps is not None]
        for st in every:  # steps made here count up by construction
            if len(st) and (st[0] < self._step or not ((st is steps and step is None) or nondecreasing(st))):
                raise ValueError("step must not decrease")
        if given_events:
            last_step = max([int(st.max()) for st in every if len(st)], default=self._step)
            outside = [e.step for e in given_events if not self._step <= e.step <= last_step]
            if outside:
                raise ValueError(f"events: steps {outside[:5]} lie outside the scanned steps "
                                 f"{max(self._step, 0)}..{last_step}")
            given_events.sort(key=lambda e: e.step)
        if n > SCAN_CHUNK and all(c.steps is None and c.values.ndim == 1 for c in cols.values()):
            # a long run of dense scalar signals, checked whole above: scanned a chunk at a time
            # (the same events as one scan, as any chunking gives; the working memory stays bounded)
            out: list[Event] = []
            for lo in range(0, n, SCAN_CHUNK):
                part = {name: c.values[lo:lo + SCAN_CHUNK] if c.mask is None else
                        np.ma.masked_array(c.values[lo:lo + SCAN_CHUNK], mask=~c.mask[lo:lo + SCAN_CHUNK])
                        for name, c in cols.items()}
                top = int(steps[min(lo + SCAN_CHUNK, n) - 1])
                found = [e for e in given_events if e.step <= top]
                given_events = given_events[len(found):]
                out += self.scan(step=steps[lo:lo + SCAN_CHUNK], events=found or None, **part)
            return out
        for c in cols.values():
            if c.names is not None:
                self._layer_names.setdefault(c.name, c.names)
        per_det: list[list[Event]] = []
        with sharing():  # the detectors and the policy share the logs and recurrences of the same columns
            for det in self._suite.values():
                mine = {i.name: cols[i.name] for i in det.inputs if i.name in cols}
                required = [i.name for i in det.inputs if i.required]
                if not mine or not all(r in mine for r in required):
                    per_det.append([])
                    continue
                per_det.append(det.scan(steps=steps, **mine))
            merged: list[tuple[int, int, int, Event]] = []
            for order, evs in enumerate(per_det):
                for seq, ev in enumerate(evs):
                    merged.append((ev.step, order, seq, ev))
            merged.sort(key=lambda t: t[:3])
            out = [m[3] for m in merged]
            lc = cols.get("loss")  # its measured values and their steps
            if lc is None:
                ls, lv = steps[:0], np.zeros(0)
            elif lc.steps is not None or lc.mask is None:
                ls, lv = (steps if lc.steps is None else lc.steps), lc.values
            else:
                ls, lv = steps[lc.mask], lc.values[lc.mask]
            out = self.policy.apply_scan(out, ls, lv, given_events)
        if given_events:  # after the detectors' events of their step, as update records them
            out = [ev for _, _, ev in sorted([(e.step, 0, e) for e in out] + [(e.step, 1, e) for e in given_events],
                                             key=lambda t: t[:2])]
        # bookkeeping identical to the streaming path
        last = [self._step] + [int(st.max()) for st in every if len(st)]
        if lc is not None:
            fin = np.isfinite(lv)
            if not self._n_loss and fin.any():
                self._first_loss = int(ls[int(np.argmax(fin))])
            self._n_loss += int(fin.sum())
            if len(fin):
                self._nonfinite_open = not bool(fin[-1])
        self._record(out)
        self._step = max(last)
        if self.recorder is not None:
            self._record_scan(steps, cols, raw, out)
        return out

    def _record_scan(self, steps: np.ndarray, cols: dict[str, Column], raw: dict[str, Any], out: list[Event]) -> None:
        assert self.recorder is not None
        rec: dict[str, Any] = {}
        for name, c in cols.items():
            if SIGNALS[name].form == "scalar" and not SIGNALS[name].sparse:
                if c.steps is not None:  # a (steps, values) pair of a dense signal: on the scan's steps
                    full = np.full(len(steps), np.nan)
                    pos = np.searchsorted(steps, c.steps)
                    ok = (pos < len(steps)) & (steps[np.minimum(pos, len(steps) - 1)] == c.steps)
                    full[pos[ok]] = c.values[ok]
                    mask = np.zeros(len(steps), bool)
                    mask[pos[ok]] = True
                    rec[name] = np.ma.masked_array(full, mask=~mask)
                else:
                    rec[name] = c.values if c.mask is None else np.ma.masked_array(c.values, mask=~c.mask)
        vc = cols.get("val_loss")
        val = None if vc is None or vc.steps is None else (vc.steps, vc.values)
        extra: dict[str, Any] = {}
        mc = cols.get("val_metric")
        if mc is not None and mc.steps is not None and _takes(self.recorder.record_batch, "val_metric"):
            extra["val_metric"] = (mc.steps, mc.values)
        lu = self._sparse_or_dense("layer_update_ratios", raw.get("layer_update_ratios"), steps)
        if lu is not None and _takes(self.recorder.record_batch, "layer_update_ratios"):
            extra["layer_update_ratios"] = lu
        self.recorder.record_batch(steps=steps, signals=rec, val_loss=val,
                                   layer_grad_norms=self._sparse_or_dense("layer_grad_norms",
                                                                          raw.get("layer_grad_norms"), steps),
                                   activations=self._acts(raw.get("activations"), steps), events=out, **extra)

    @staticmethod
    def _sparse_or_dense(name: str, value: Any, steps: np.ndarray) -> tuple[np.ndarray, np.ndarray, tuple[str, ...] | None] | None:
        if value is None:
            return None
        if isinstance(value, tuple) and len(value) == 2:
            st = np.asarray(value[0]).astype(np.int64)
            c = column(name, value[1])
        else:
            st = steps
            c = column(name, value)
        mat, names = c.values, c.names
        if mat.shape[0] != len(st):
            raise ValueError(f"{name} has {mat.shape[0]} rows for {len(st)} steps")
        return st, mat, names if isinstance(value, Mapping) or (isinstance(value, tuple) and isinstance(value[1], Mapping)) else None

    @staticmethod
    def _acts(value: Any, steps: np.ndarray) -> tuple[np.ndarray, Mapping[str, Any]] | None:
        if value is None:
            return None
        if isinstance(value, tuple) and len(value) == 2:
            return np.asarray(value[0]).astype(np.int64), value[1]
        if isinstance(value, Mapping):
            return steps, value
        raise TypeError("activations must be (steps, {layer: {stat: array}}) or {layer: {stat: array}}")

    # ------------------------------------------------------------------------------------
    def summary(self) -> str:
        """A short report a person reads: status, steps seen, and what fired, when, why.

        The alarms (warnings and criticals) kept in :attr:`events`, by kind; info events (notes
        such as a rollback) are counted apart, and the oldest events past ``max_events`` are named
        as not kept.
        """
        dropped = self._n_events - len(self._events)
        lines = [f"trainsignals: status {self.status} after step {self._step}; {self._n_events} event(s)"
                 + (f" (the oldest {dropped} not kept: max_events={self.max_events})" if dropped else "")
                 + ("; STOP advised" if self._should_stop else "")]
        by_kind: dict[Kind, list[Event]] = {}
        notes = 0
        for ev in self._events:
            if ev.severity == "info":
                notes += 1
            else:
                by_kind.setdefault(ev.kind, []).append(ev)
        for kind, evs in by_kind.items():
            first = evs[0]
            sev = "critical" if any(e.severity == "critical" for e in evs) else evs[0].severity
            lines.append(f"  {kind.value:<20} x{len(evs):<3} {sev:<8} first at step {first.step} "
                         f"(onset {first.onset_step}): {first.message}")
            lines.append(f"  {'':<20}      cause: {first.cause}; fix: {first.fix}")
        if notes:
            lines.append(f"  and {notes} info event(s): notes, not alarms")
        return "\n".join(lines)

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable snapshot; :meth:`load_state_dict` resumes bit-identically."""
        return {
            "format": "trainsignals.Monitor",
            "version": __version__,
            "config": _jsonable(self.config()),
            "monitor": {
                "step": self._step,
                "n_loss": self._n_loss,
                "first_loss": self._first_loss,
                "should_stop": self._should_stop,
                "last_state_step": dict(self._last_state_step),
                "nonfinite_open": self._nonfinite_open,
                "events": [e.to_dict() for e in self._events],
                "n_events": self._n_events,
                "layer_names": {k: list(v) for k, v in self._layer_names.items()},
                "policy": self.policy.state_dict(),
            },
            "detectors": {name: det.state_dict() for name, det in self._suite.items()},
        }

    def config(self) -> dict[str, Any]:
        """The Monitor's configuration (what a snapshot must match to be loaded)."""
        return {"total_steps": self.total_steps, "stop_on": self.stop_on, "warmup": self.warmup,
                "recovery": self.recovery, "min_patience": self.min_patience, "max_events": self.max_events,
                "val_metric_mode": self.val_metric_mode, "log_every": self.log_every,
                "settings": {k: (v if not callable(v) else repr(v)) for k, v in self.settings.items()},
                "policy": self.policy.config()}

    def load_state_dict(self, state: Mapping[str, Any], *, rewind: bool = False) -> None:
        """Resume from :meth:`state_dict`. Refuses a foreign or mismatched snapshot, naming keys.

        With ``rewind=True`` (a run rolled back to an earlier checkpoint and training on) the
        detectors and the status go back to the snapshot, but the history is kept: the events
        seen since stay in :attr:`events` and :attr:`n_events`, and the step stays where it is,
        so the next update continues the step numbering. :attr:`should_stop` is the snapshot's.
        """
        want = {"format", "version", "config", "monitor", "detectors"}
        if not isinstance(state, Mapping) or set(state) != want:
            got = sorted(state) if isinstance(state, Mapping) else type(state).__name__
            raise ValueError(f"not a Monitor state dict: expected keys {sorted(want)}, got {got}")
        if state["format"] != "trainsignals.Monitor":
            raise ValueError(f"not a Monitor state dict: format {state['format']!r}")
        mine = _jsonable(self.config())
        theirs = {"log_every": 1, **state["config"]}  # snapshots from before log_every: one value a step
        differ = sorted(k for k in mine if mine[k] != theirs.get(k))
        if differ:
            raise ValueError(f"state dict configuration differs in: {', '.join(differ)}")
        dets = state["detectors"]
        names = list(self._suite)
        if sorted(dets) != sorted(names):
            raise ValueError(f"state dict detectors differ: missing {sorted(set(names) - set(dets))}, "
                             f"unexpected {sorted(set(dets) - set(names))}")
        mon = state["monitor"]
        mkeys = {"step", "n_loss", "first_loss", "should_stop", "last_state_step", "nonfinite_open", "events",
                 "n_events", "layer_names", "policy"}
        if set(mon) | {"first_loss"} != mkeys:  # a snapshot from before first_loss: see below
            raise ValueError(f"state dict 'monitor' keys differ: missing {sorted(mkeys - set(mon) - {'first_loss'})}, "
                             f"unexpected {sorted(set(mon) - mkeys)}")
        # everything is read and checked before anything changes: a refused snapshot leaves the Monitor as it was
        n_loss = int(mon["n_loss"])
        # a snapshot from before first_loss counted values as steps: its losses taken as one a step up to its own
        first_loss = int(mon.get("first_loss", int(mon["step"]) - n_loss + 1 if n_loss else -1))
        last_state_step = {str(k): int(v) for k, v in mon["last_state_step"].items()}
        layer_names = {str(k): tuple(str(n) for n in v) for k, v in mon["layer_names"].items()}
        step, n_events = int(mon["step"]), int(mon["n_events"])
        if rewind:  # the snapshot's state as of now: its events as many steps back as they were then
            shift = self._step - step
            last_state_step = {k: v + shift for k, v in last_state_step.items()}
            first_loss = first_loss + shift if first_loss >= 0 else first_loss
        events = deque((Event.from_dict(e) for e in mon["events"]), maxlen=self.max_events)
        for name, det in self._suite.items():
            det.clone().load_state_dict(dets[name])  # a detector refuses a foreign state before any is loaded
        self.policy.load_state_dict(mon["policy"])  # loads whole or not at all
        for name, det in self._suite.items():
            det.load_state_dict(dets[name])
        self._n_loss, self._first_loss = n_loss, first_loss
        self._should_stop = bool(mon["should_stop"])
        self._last_state_step = last_state_step
        self._nonfinite_open = bool(mon["nonfinite_open"])
        self._layer_names = layer_names
        if rewind:
            return
        self._step, self._events, self._n_events = step, events, n_events

    def __repr__(self) -> str:
        return f"Monitor(total_steps={self.total_steps!r}, status={self.status!r}, events={self._n_events})"


def scan(data: Any = None, /, *, total_steps: int | None = None, **signals: Any) -> list[Event]:
    """One-shot batch run of a fresh default :class:`Monitor` over whole arrays.

    ``ts.scan(loss=..., grad_norm=..., ...)`` takes the keywords of :meth:`Monitor.scan`.
    ``data`` may instead hold the columns: a pyarrow ``Table`` (a null is "not measured", a
    NaN a measured non-finite value), a pandas or polars ``DataFrame`` or a mapping of columns,
    named ``step``, ``loss``, ``grad_norm``, ``lr``, ``update_ratio``, ``val_loss``,
    ``val_metric``, ``pred_top_share``, ``pred_spread`` (others are ignored; keywords override columns).
    ``val_loss`` and ``val_metric`` are taken at the rows where they were
    measured: non-null in a pyarrow table; in a DataFrame or mapping, NaN marks the rows without
    validation (pandas' own missing marker).

    Example:
        >>> import numpy as np
        >>> loss = np.r_[np.linspace(2.0, 1.0, 100), 1.0 * 1.2 ** np.arange(1, 30)]
        >>> [(e.kind.value, e.severity, e.step, e.onset_step) for e in scan(loss=loss)][:2]
        [('loss_spike', 'warning', 103, 103), ('divergence', 'critical', 103, 99)]
        >>> [(e.kind.value, e.step) for e in scan({"step": np.arange(129), "loss": loss})][:2]
        [('loss_spike', 103), ('divergence', 103)]
    """
    if data is not None:
        for name, col in _columns(data).items():
            signals.setdefault(name, col)
    return Monitor(total_steps=total_steps).scan(**signals)


def _columns(data: Any) -> dict[str, Any]:
    """Our signals' columns out of a pyarrow Table, a DataFrame or a mapping."""
    if hasattr(data, "column_names") and hasattr(data, "column"):  # pyarrow Table
        cols = {n: data.column(n) for n in data.column_names}
    elif hasattr(data, "columns") and hasattr(data, "__getitem__"):  # pandas / polars DataFrame
        cols = {str(n): np.asarray(data[n]) for n in data.columns}
    elif isinstance(data, Mapping):
        cols = {str(k): v for k, v in data.items()}
    else:
        raise TypeError(f"data must be a pyarrow Table, a DataFrame or a mapping of columns, got {type(data).__name__}")
    out = {k: cols[k] for k in ("step", *DENSE_SIGNALS) if k in cols}
    for name in ("val_loss", "val_metric"):  # the sparse signals: taken at the rows where measured
        if name not in cols:
            continue
        vals, measured = dense_values(name, cols[name])
        if measured is None:
            measured = ~np.isnan(vals) if not hasattr(cols[name], "null_count") else np.ones(len(vals), bool)
        n = len(vals)
        st = np.asarray(cols["step"]) if "step" in cols else np.arange(n)
        out[name] = (np.asarray(st)[measured].astype(np.int64), vals[measured])
    return out

