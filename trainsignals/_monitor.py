"""The Monitor: the default suite of detectors behind one ``update`` call."""

from __future__ import annotations

import copy
import inspect
import math
from collections import deque
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

import numpy as np

from . import __version__
from ._events import Event, Kind, check_kinds
from ._recorder import Recorder
from ._validate import check_range, to_float, to_step
from .detectors import (
    ActivationHealth,
    CUSUMPlateau,
    EWMASpike,
    GuardedEWMASpike,
    LayerGradCliff,
    LayerUpdateRatio,
    LossGradCoupling,
    LRAnomaly,
    NonFinite,
    Oscillation,
    SlopeDivergence,
    TrainValGap,
    UpdateRatioBand,
)
from .detectors._base import _as_1d, _jsonable
from .detectors.layer_cliff import as_matrix, as_named_vector
from .detectors.train_val_gap import sparse_pair

__all__ = ["Monitor", "STATUSES", "scan"]

STATUSES = ("warming_up", "healthy", "stalled", "oscillating", "diverging")

#: Which kinds put the run in which failed state (worst first).
_STATE_OF: dict[Kind, str] = {
    Kind.NONFINITE: "diverging",
    Kind.DIVERGENCE: "diverging",
    Kind.GRAD_EXPLOSION: "diverging",
    Kind.OSCILLATION: "oscillating",
    Kind.STALL: "stalled",
}
_RANK = {"diverging": 3, "oscillating": 2, "stalled": 1}

# name -> (factory, the signals it reads). Order = order of events within a step.
_SUITE: tuple[tuple[str, type, tuple[str, ...]], ...] = (
    ("nonfinite_loss", NonFinite, ("loss",)),
    ("nonfinite_grad_norm", NonFinite, ("grad_norm",)),
    ("nonfinite_lr", NonFinite, ("lr",)),
    ("nonfinite_update_ratio", NonFinite, ("update_ratio",)),
    ("nonfinite_val_loss", NonFinite, ("val_loss",)),
    ("loss_spike", EWMASpike, ("loss",)),
    ("divergence", SlopeDivergence, ("loss",)),
    ("stall", CUSUMPlateau, ("loss", "grad_norm", "update_ratio")),
    ("oscillation", Oscillation, ("loss", "grad_norm", "lr")),
    ("grad_explosion", GuardedEWMASpike, ("grad_norm", "loss")),
    ("coupling", LossGradCoupling, ("loss", "grad_norm")),
    ("lr_anomaly", LRAnomaly, ("lr",)),
    ("update_ratio", UpdateRatioBand, ("update_ratio", "lr")),
    ("overfitting", TrainValGap, ("loss", "val_loss")),
    ("layer_cliff", LayerGradCliff, ("layer_grad_norms",)),
    ("layer_update_ratio", LayerUpdateRatio, ("layer_update_ratios",)),
    ("activations", ActivationHealth, ("activations",)),
)
_DEFAULTS: dict[str, dict[str, Any]] = {
    "nonfinite_loss": {"signal": "loss"},
    "nonfinite_grad_norm": {"signal": "grad_norm"},
    "nonfinite_lr": {"signal": "lr"},
    "nonfinite_update_ratio": {"signal": "update_ratio"},
    "nonfinite_val_loss": {"signal": "val_loss"},
    "loss_spike": {"persist_kind": "divergence"},
    "grad_explosion": {"kind": "grad_explosion", "signal": "grad_norm", "min_ratio": 10.0, "threshold": 6.0,
                       "persist_kind": "grad_explosion"},
}
_SCALARS = ("loss", "grad_norm", "lr", "update_ratio", "val_loss")
_NONNEG = ("grad_norm", "lr", "update_ratio")
_NAN = float("nan")
# how Monitor.update calls a detector
_NONFINITE, _ONE, _OPTIONAL, _OPTIONAL3, _OVERFIT, _VECTOR, _PAIR = range(7)


@lru_cache(maxsize=256)
def _takes_cached(fn: Any, name: str) -> bool:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return True
    return any(p.name == name or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


def _takes(method: Any, name: str) -> bool:
    """Whether a recorder's method accepts the keyword ``name`` (recorders written before a
    keyword existed are called without it)."""
    return _takes_cached(getattr(method, "__func__", method), name)
# detectors whose inputs after the first are optional (nan when absent)
_OPTIONAL_SECOND = ("stall", "oscillation", "update_ratio", "grad_explosion")


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
        warmup: values of loss before :attr:`status` leaves ``"warming_up"``.
        recovery: steps after its latest event that a failed state lasts (see :attr:`status`);
            keep it above the detectors' cooldowns (100 steps by default), since a detector
            does not repeat an ongoing failure during its cooldown.
        min_patience: smallest stall patience derived from ``total_steps``.
        max_events: events kept in memory (the latest); :attr:`n_events` counts them all.
        recorder: receives every update and its events (e.g. a ``TraceWriter``); see
            :class:`~trainsignals.Recorder`.
        **settings: per-detector configuration, by suite name, e.g.
            ``loss_spike={"threshold": 8}``; ``name=False`` disables a detector. Suite names:
            ``nonfinite_loss``, ``nonfinite_grad_norm``, ``nonfinite_lr``,
            ``nonfinite_update_ratio``, ``nonfinite_val_loss``, ``loss_spike``, ``divergence``,
            ``stall``, ``oscillation``, ``grad_explosion``, ``coupling``, ``lr_anomaly``,
            ``update_ratio``, ``overfitting``, ``layer_cliff``, ``layer_update_ratio``,
            ``activations``.

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
        stop_on: tuple[str, ...] | None = None,
        warmup: int = 20,
        recovery: int = 200,
        min_patience: int = 50,
        max_events: int = 10_000,
        recorder: Recorder | None = None,
        **settings: Any,
    ) -> None:
        if total_steps is not None:
            check_range("total_steps", total_steps, 1, None, integer=True)
        check_range("warmup", warmup, 0, None, integer=True)
        check_range("recovery", recovery, 1, None, integer=True)
        check_range("min_patience", min_patience, 2, None, integer=True)
        check_range("max_events", max_events, 1, None, integer=True)
        names = [n for n, _, _ in _SUITE]
        unknown = sorted(set(settings) - set(names))
        if unknown:
            raise TypeError(
                f"Monitor() got unknown keyword(s) {unknown}; detector settings are one of {names}"
            )
        kinds = tuple(k.value for k in Kind)
        if stop_on is not None:
            stop_on = check_kinds("stop_on", stop_on)
        self.total_steps = total_steps
        self.stop_on = stop_on
        self.warmup = warmup
        self.recovery = recovery
        self.min_patience = min_patience
        self.max_events = max_events
        if recorder is not None and not isinstance(recorder, Recorder):
            raise ValueError(f"recorder must have record() and record_batch() methods, got {recorder!r}")
        self.recorder = recorder
        self.settings = copy.deepcopy(settings)
        self._plan: list[tuple[str, Any, tuple[str, ...]]] = []
        for name, cls, sigs in _SUITE:
            opt = settings.get(name, {})
            if opt is False:
                continue
            if opt is True or opt is None:
                opt = {}
            if not isinstance(opt, Mapping):
                raise ValueError(f"{name} must be a mapping of settings or False, got {opt!r}")
            kw = dict(_DEFAULTS.get(name, {}))
            if name == "stall" and total_steps is not None:
                kw["patience"] = max(min_patience, int(round(0.1 * total_steps)))
            kw.update(opt)
            try:
                det = cls(**kw)
            except TypeError as exc:
                raise ValueError(f"{name}: {exc}") from exc
            except ValueError as exc:
                raise ValueError(f"{name}.{exc}") from exc
            self._plan.append((name, det, sigs))
        # the streaming path's plan: (how to call, bound _step or the detector, its signals);
        # bound methods looked up once keep the hot loop free of attribute lookups
        self._calls: list[tuple[int, Any, tuple[str, ...]]] = []
        for name, det, sigs in self._plan:
            if isinstance(det, NonFinite):
                self._calls.append((_NONFINITE, det, sigs))
            elif len(sigs) == 1 and sigs[0] in _SCALARS:
                self._calls.append((_ONE, det._step, sigs))
            elif name in _OPTIONAL_SECOND:
                self._calls.append((_OPTIONAL if len(sigs) == 2 else _OPTIONAL3, det._step, sigs))
            elif name == "overfitting":
                self._calls.append((_OVERFIT, det, sigs))
            elif len(sigs) == 1:
                self._calls.append((_VECTOR, det, sigs))
            else:
                self._calls.append((_PAIR, det._step, sigs))
        self._call_cache: dict[tuple[Any, ...], list[tuple[int, Any, tuple[str, ...]]]] = {}
        self._stop_kinds = frozenset(stop_on) if stop_on is not None else frozenset(kinds)
        self._reset()

    @staticmethod
    def _non_negative(name: str, v: Any) -> float:
        f = v if type(v) is float else to_float(name, v)
        if f < 0.0:
            raise ValueError(f"{name} must be >= 0, got {f}")
        return f

    def _layer_vector(self, signal: str, detector: str, value: Any) -> tuple[np.ndarray, tuple[str, ...]] | None:
        """A per-layer input as ``(vector, names)`` (names as its detector knows them), or None."""
        if value is None:
            return None
        det = self.detectors.get(detector)
        got = as_named_vector(signal, value, det._names if det else None)
        if len(got[0]) and got[0].min() < 0:
            raise ValueError(f"{signal} must be >= 0")
        return got

    def _calls_for(self, key: tuple[Any, ...]) -> list[tuple[int, Any, tuple[str, ...]]]:
        """The calls of one combination of given signals (cached: runs feed few combinations)."""
        *given, has_layers, has_ratios, has_acts = key
        have = set(given)
        have.update(name for name, flag in (("layer_grad_norms", has_layers), ("layer_update_ratios", has_ratios),
                                            ("activations", has_acts)) if flag)
        calls = []
        for how, fn, sigs in self._calls:
            if how in (_NONFINITE, _ONE, _OPTIONAL, _OPTIONAL3, _VECTOR):
                use = sigs[0] in have
            elif how == _OVERFIT:
                use = "loss" in have or "val_loss" in have
            else:
                use = all(sg in have for sg in sigs)
            if use:
                calls.append((how, fn, sigs))
        if len(self._call_cache) < 256:
            self._call_cache[key] = calls
        return calls

    # ------------------------------------------------------------------------------------
    def _reset(self) -> None:
        self._events: deque[Event] = deque(maxlen=self.max_events)
        self._n_events = 0
        self._step = -1
        self._n_loss = 0
        self._should_stop = False
        self._last_state_step: dict[str, int] = {}
        self._nonfinite_open = False

    def reset(self) -> None:
        """Forget the run: every detector back to fresh, events cleared."""
        for _, det, _ in self._plan:
            det.reset()
        self._reset()

    @property
    def detectors(self) -> dict[str, Any]:
        """The detectors of the suite, by name (in the order they run)."""
        return {name: det for name, det, _ in self._plan}

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
    def status(self) -> str:
        """``"warming_up" | "healthy" | "stalled" | "oscillating" | "diverging"``.

        ``warming_up`` until ``warmup`` loss values were seen. A failed state is entered by
        its events (``nonfinite``, ``divergence``, ``grad_explosion`` -> diverging;
        ``oscillation`` -> oscillating; ``stall`` -> stalled) and left once ``recovery``
        steps pass without another event of its kinds — except after a non-finite value,
        which keeps the run diverging until finite values return. The worst live state wins.
        """
        best, rank = "healthy", 0
        for state, last in self._last_state_step.items():
            live = self._step - last < self.recovery or (state == "diverging" and self._nonfinite_open)
            if live and _RANK[state] > rank:
                best, rank = state, _RANK[state]
        if rank == 0 and self._n_loss < self.warmup:
            return "warming_up"
        return best

    # ------------------------------------------------------------------------------------
    def _record(self, events: list[Event]) -> None:
        self._n_events += len(events)
        for ev in events:
            self._events.append(ev)
            state = _STATE_OF.get(ev.kind) if ev.severity != "info" else None
            if state is not None and (ev.kind != Kind.GRAD_EXPLOSION or ev.severity == "critical"):
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
            ValueError: a negative grad norm, learning rate or update ratio; a decreasing step.
        """
        s = self._step + 1 if step is None else to_step(step)
        if s < self._step:
            raise ValueError(f"step must not decrease: got {s} after {self._step}")
        if events is not None:
            events = list(events)
            for given in events:
                if not isinstance(given, Event):
                    raise TypeError(f"events must hold trainsignals.Event objects, got {type(given).__name__}")
        vals: dict[str, float] = {}
        if loss is not None:
            vals["loss"] = loss if type(loss) is float else to_float("loss", loss)
        # the non-negative scalars, unrolled (this is the hot path: no tuple of pairs to loop over)
        if grad_norm is not None:
            vals["grad_norm"] = self._non_negative("grad_norm", grad_norm)
        if lr is not None:
            vals["lr"] = self._non_negative("lr", lr)
        if update_ratio is not None:
            vals["update_ratio"] = self._non_negative("update_ratio", update_ratio)
        if val_loss is not None:
            vals["val_loss"] = val_loss if type(val_loss) is float else to_float("val_loss", val_loss)
        layers = ratios = None
        if layer_grad_norms is not None:
            layers = self._layer_vector("layer_grad_norms", "layer_cliff", layer_grad_norms)
        if layer_update_ratios is not None:
            ratios = self._layer_vector("layer_update_ratios", "layer_update_ratio", layer_update_ratios)
        acts = None
        if activations is not None:
            det = self.detectors.get("activations")
            acts = (det or ActivationHealth())._parse(activations)
        self._step = s
        out: list[Event] = []
        key = (*vals, layers is not None, ratios is not None, acts is not None)
        calls = self._call_cache.get(key)
        if calls is None:
            calls = self._calls_for(key)
        for how, fn, sigs in calls:  # only the detectors this step's signals reach
            if how == _NONFINITE:  # NonFinite._step inlined for a finite value (most steps)
                v = vals[sigs[0]]
                if v - v == 0.0:
                    fn._last_step = s
                    fn._bad = False
                    continue
                ev = fn._step(v, s)
            elif how == _ONE:
                ev = fn(vals[sigs[0]], s)
            elif how == _OPTIONAL:
                ev = fn(vals[sigs[0]], vals.get(sigs[1], _NAN), s)
            elif how == _OPTIONAL3:
                ev = fn(vals[sigs[0]], vals.get(sigs[1], _NAN), vals.get(sigs[2], _NAN), s)
            elif how == _PAIR:
                ev = fn(vals[sigs[0]], vals[sigs[1]], s)
            elif how == _OVERFIT:
                fn._last_step = s
                if "loss" in vals:
                    fn._learn_train(vals["loss"])
                ev = fn._val(vals["val_loss"], s) if "val_loss" in vals else None
            else:  # per-layer inputs
                got = layers if sigs[0] == "layer_grad_norms" else ratios if sigs[0] == "layer_update_ratios" else acts
                assert got is not None
                if fn._names is None:
                    fn._names = got[1]
                if sigs[0] == "activations":
                    out.extend(fn._sample(got[0], s))
                    continue
                ev = fn._row(got[0], s)
            if ev is not None:
                out.append(ev)
        if "loss" in vals:
            lv = vals["loss"]
            if lv - lv == 0.0:
                self._n_loss += 1
                self._nonfinite_open = False
            else:
                self._nonfinite_open = True
        if events:
            out.extend(events)
        if out:
            self._record(out)
        if self.recorder is not None:
            extra = {} if ratios is None or not _takes(self.recorder.record, "layer_update_ratios") else {
                "layer_update_ratios": ratios}
            self.recorder.record(step=s, signals=vals, layer_grad_norms=layers,
                                 activations=None if acts is None else (acts[0], acts[1]), events=out, **extra)
        return out

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
        polars columns and pyarrow arrays. Returns the new events; the Monitor's state
        advances as if every step had been fed.
        """
        dense: dict[str, np.ndarray] = {}
        measured: dict[str, np.ndarray] = {}  # where a dense signal has gaps: True = measured
        for name, v in (("loss", loss), ("grad_norm", grad_norm), ("lr", lr), ("update_ratio", update_ratio)):
            if v is not None:
                arr, mask = _dense_column(name, v)
                if name in _NONNEG and np.any(arr < 0):
                    raise ValueError(f"{name} must be >= 0")
                dense[name] = arr
                if mask is not None:
                    measured[name] = mask
        lengths = {len(a) for a in dense.values()}
        if len(lengths) > 1:
            raise ValueError(f"dense signals must have equal lengths, got {sorted(lengths)}")
        n = lengths.pop() if lengths else 0
        if step is None:
            steps = np.arange(self._step + 1, self._step + 1 + n, dtype=np.int64)
        else:
            from .detectors._base import _steps_for

            steps = _steps_for(step, n, self._step)
        if n and (np.any(np.diff(steps) < 0) or steps[0] < self._step):
            raise ValueError("step must not decrease")
        val = sparse_pair("val_loss", val_loss) if val_loss is not None else None
        if val is not None and np.any(val[0] < 0):
            pass
        layers = self._sparse_or_dense("layer_grad_norms", layer_grad_norms, steps)
        ratios = self._sparse_or_dense("layer_update_ratios", layer_update_ratios, steps)
        acts = self._acts(activations, steps)
        per_det: list[list[Event]] = []
        for name, det, sigs in self._plan:
            evs: list[Event] = []
            if name == "overfitting":
                if "loss" in dense or val is not None:
                    evs = det.scan(dense.get("loss"), val, steps=steps if "loss" in dense else None)
            elif sigs == ("val_loss",):
                if val is not None:
                    evs = det.scan(val[1], steps=val[0])
            elif name.startswith("nonfinite_") and sigs[0] in measured:
                # a gap is "not measured", not a non-finite value: the NonFinite detector sees only
                # measured entries; every other detector skips the nan that fills a gap
                mask = measured[sigs[0]]
                evs = det.scan(dense[sigs[0]][mask], steps=steps[mask])
            elif sigs in (("layer_grad_norms",), ("layer_update_ratios",)):
                got = layers if sigs == ("layer_grad_norms",) else ratios
                if got is not None:
                    if np.any(got[1] < 0):
                        raise ValueError(f"{sigs[0]} must be >= 0")
                    evs = det.scan(got[1] if got[2] is None else dict(zip(got[2], got[1].T)), steps=got[0])
            elif sigs == ("activations",):
                if acts is not None:
                    evs = det.scan(acts[1], steps=acts[0])
            elif name in _OPTIONAL_SECOND:
                if sigs[0] in dense:
                    evs = det.scan(*(dense.get(sg, np.full(n, np.nan)) for sg in sigs), steps=steps)
            elif all(s in dense for s in sigs):
                evs = det.scan(*(dense[s] for s in sigs), steps=steps)
            per_det.append(evs)
        merged: list[tuple[int, int, int, Event]] = []
        for order, evs in enumerate(per_det):
            for seq, ev in enumerate(evs):
                merged.append((ev.step, order, seq, ev))
        merged.sort(key=lambda t: t[:3])
        out = [m[3] for m in merged]
        # bookkeeping identical to the streaming path
        last = [self._step]
        if n:
            last.append(int(steps[-1]))
        if val is not None and len(val[0]):
            last.append(int(val[0].max()))
        for sparse in (layers, ratios):
            if sparse is not None and len(sparse[0]):
                last.append(int(sparse[0].max()))
        if acts is not None and len(acts[0]):
            last.append(int(acts[0].max()))
        if "loss" in dense:
            lv = dense["loss"]
            if "loss" in measured:
                lv = lv[measured["loss"]]
            fin = np.isfinite(lv)
            self._n_loss += int(fin.sum())
            if len(fin):
                self._nonfinite_open = not bool(fin[-1])
        self._record(out)
        self._step = max(last)
        if self.recorder is not None:
            rec = {k: (np.ma.masked_array(v, mask=~measured[k]) if k in measured else v) for k, v in dense.items()}
            extra = {} if ratios is None or not _takes(self.recorder.record_batch, "layer_update_ratios") else {
                "layer_update_ratios": ratios}
            self.recorder.record_batch(steps=steps, signals=rec, val_loss=val,
                                       layer_grad_norms=layers, activations=acts, events=out, **extra)
        return out

    @staticmethod
    def _sparse_or_dense(name: str, value: Any, steps: np.ndarray) -> tuple[np.ndarray, np.ndarray, tuple[str, ...] | None] | None:
        if value is None:
            return None
        if isinstance(value, tuple) and len(value) == 2:
            st = np.asarray(value[0]).astype(np.int64)
            mat, names = as_matrix(name, value[1], None)
        else:
            st = steps
            mat, names = as_matrix(name, value, None)
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
        """A short report a person reads: status, steps seen, and what fired, when, why."""
        lines = [f"trainsignals: status {self.status} after step {self._step}; "
                 f"{self._n_events} event(s){'; STOP advised' if self._should_stop else ''}"]
        by_kind: dict[Kind, list[Event]] = {}
        for ev in self._events:
            by_kind.setdefault(ev.kind, []).append(ev)
        for kind, evs in by_kind.items():
            first = evs[0]
            sev = "critical" if any(e.severity == "critical" for e in evs) else evs[0].severity
            lines.append(f"  {kind.value:<20} x{len(evs):<3} {sev:<8} first at step {first.step} "
                         f"(onset {first.onset_step}): {first.message}")
            lines.append(f"  {'':<20}      cause: {first.cause}; fix: {first.fix}")
        return "\n".join(lines)

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable snapshot; :meth:`load_state_dict` resumes bit-identically."""
        return {
            "format": "trainsignals.Monitor",
            "version": __version__,
            "config": _jsonable(self._config()),
            "monitor": {
                "step": self._step,
                "n_loss": self._n_loss,
                "should_stop": self._should_stop,
                "last_state_step": dict(self._last_state_step),
                "nonfinite_open": self._nonfinite_open,
                "events": [e.to_dict() for e in self._events],
                "n_events": self._n_events,
            },
            "detectors": {name: det.state_dict() for name, det, _ in self._plan},
        }

    def _config(self) -> dict[str, Any]:
        return {"total_steps": self.total_steps, "stop_on": self.stop_on, "warmup": self.warmup,
                "recovery": self.recovery, "min_patience": self.min_patience, "max_events": self.max_events,
                "settings": {k: (v if not callable(v) else repr(v)) for k, v in self.settings.items()}}

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
        mine = _jsonable(self._config())
        differ = sorted(k for k in mine if mine[k] != state["config"].get(k))
        if differ:
            raise ValueError(f"state dict configuration differs in: {', '.join(differ)}")
        dets = state["detectors"]
        names = [n for n, _, _ in self._plan]
        if sorted(dets) != sorted(names):
            raise ValueError(f"state dict detectors differ: missing {sorted(set(names) - set(dets))}, "
                             f"unexpected {sorted(set(dets) - set(names))}")
        mon = state["monitor"]
        mkeys = {"step", "n_loss", "should_stop", "last_state_step", "nonfinite_open", "events", "n_events"}
        if set(mon) != mkeys:
            raise ValueError(f"state dict 'monitor' keys differ: missing {sorted(mkeys - set(mon))}, "
                             f"unexpected {sorted(set(mon) - mkeys)}")
        for name, det, _ in self._plan:
            det.load_state_dict(dets[name])
        self._n_loss = int(mon["n_loss"])
        self._should_stop = bool(mon["should_stop"])
        self._last_state_step = {k: int(v) for k, v in mon["last_state_step"].items()}
        self._nonfinite_open = bool(mon["nonfinite_open"])
        if rewind:
            return
        self._step = int(mon["step"])
        self._events = deque((Event.from_dict(e) for e in mon["events"]), maxlen=self.max_events)
        self._n_events = int(mon["n_events"])

    def __repr__(self) -> str:
        return f"Monitor(total_steps={self.total_steps!r}, status={self.status!r}, events={self._n_events})"


def _dense_column(name: str, v: Any) -> tuple[np.ndarray, np.ndarray | None]:
    """A dense signal as float64 with nan in its gaps, and the measured mask (None: no gaps)."""
    if isinstance(v, np.ma.MaskedArray):
        mask = ~np.ma.getmaskarray(v).reshape(-1)
        arr = _as_1d(name, np.ma.getdata(v)).copy()
        arr[~mask] = np.nan
        return arr, (None if mask.all() else mask)
    if type(v).__module__.split(".")[0] == "pyarrow" and hasattr(v, "null_count"):
        if v.null_count:
            import pyarrow.compute as pc

            mask = np.asarray(pc.is_valid(v), dtype=bool)
            arr = _as_1d(name, pc.fill_null(v.cast("float64"), float("nan")).to_numpy())
            return arr, mask
        return _as_1d(name, v.to_numpy()), None
    return _as_1d(name, v), None


def scan(data: Any = None, /, *, total_steps: int | None = None, **signals: Any) -> list[Event]:
    """One-shot batch run of a fresh default :class:`Monitor` over whole arrays.

    ``ts.scan(loss=..., grad_norm=..., ...)`` takes the keywords of :meth:`Monitor.scan`.
    ``data`` may instead hold the columns: a pyarrow ``Table`` (a null is "not measured", a
    NaN a measured non-finite value), a pandas or polars ``DataFrame`` or a mapping of columns,
    named ``step``, ``loss``, ``grad_norm``, ``lr``, ``update_ratio``, ``val_loss`` (others are
    ignored; keywords override columns). ``val_loss`` is taken at the rows where it was
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
    out = {k: cols[k] for k in ("step", "loss", "grad_norm", "lr", "update_ratio") if k in cols}
    if "val_loss" in cols:
        vals, measured = _dense_column("val_loss", cols["val_loss"])
        if measured is None:
            measured = ~np.isnan(vals) if not hasattr(cols["val_loss"], "null_count") else np.ones(len(vals), bool)
        n = len(vals)
        st = np.asarray(cols["step"]) if "step" in cols else np.arange(n)
        out["val_loss"] = (np.asarray(st)[measured].astype(np.int64), vals[measured])
    return out


_ = math
