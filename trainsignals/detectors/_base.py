"""The detector protocol and the shared machinery behind it.

Every detector:

* declares its inputs once, as :class:`Input` s naming signals of the vocabulary
  (:data:`trainsignals.signals.SIGNALS`): the binding to the Monitor's signals is by name;
* takes its configuration as public, validated constructor arguments;
* keeps its state in private attributes created in one place, ``_reset``, listed once in
  ``_state_keys`` (which gives ``reset``, ``state_dict``, ``load_state_dict`` and pickling);
* has a keyword-only ``update(*, step=None, **signals) -> list[Event]`` and a batch twin
  ``scan(*, steps=None, **signals) -> list[Event]`` that gives exactly the events of
  ``update``; the base class coerces the inputs, fills absent optional ones and aligns
  inputs of different cadences, so a subclass writes only ``_step(*values, step)`` (and,
  for speed, ``_fast``).

The batch twin works by *speculative vectorisation*: a detector's ``_fast`` method advances its
state over a block of ordinary inputs with NumPy (linear recurrences through
``scipy.signal.lfilter``, windows through sliding views) and stops at the first input that needs
the scalar logic (an alarm candidate, a non-finite value, warm-up, cooldown). That input is then
fed to the scalar ``_step``, so every decision is taken by the same code on both paths. Within one
batch run the detectors share the logs and recurrences they compute on the same columns
(:func:`trainsignals.detectors._ops.sharing`).
"""

from __future__ import annotations

import inspect
import math
import types
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, NamedTuple, Protocol, runtime_checkable

import numpy as np

from .._events import Event
from .._layers import LayerValues
from .._validate import to_step
from ..signals import SIGNALS, Column, LayerStats, activations, as_steps, column, layers, scalar
from ._ops import nondecreasing, sharing

__all__ = ["Detector", "DetectorProtocol", "Input", "Knob"]

#: per input declaration (by identity, kept alive here): (name, is a scalar, the largest value that needs
#: no check: ``None`` for any value, ``inf`` for a non-negative signal, 1 for a fraction) of each input
_SPECS: dict[int, tuple[tuple[Input, ...], tuple[tuple[str, bool, float | None], ...]]] = {}
_MIN_BLOCK = 1024
_MAX_BLOCK = 1 << 16


class Input(NamedTuple):
    """One input of a detector: a signal of :data:`~trainsignals.signals.SIGNALS`, by name.

    Attributes:
        name: the signal (``"loss"``, ``"grad_norm"``, ``"val_loss"``, ``"layer_grad_norms"``, ...).
        required: the detector runs only at steps that have it; an optional input that is
            absent reaches the detector as ``nan`` (scalars) or ``None`` (other forms).
    """

    name: str
    required: bool = True


class Knob(NamedTuple):
    """The one constructor parameter that sets a rule's sensitivity, for calibration.

    A one-rule detector declares it as its class attribute ``knob``;
    :mod:`trainsignals.eval.calibrate` then sets the parameter from healthy runs for a
    false-alarm budget, searching ``[lo, hi]``.

    Attributes:
        param: the constructor parameter.
        lo: the smallest value that makes sense for the rule.
        hi: the largest.
        quieter: ``"higher"`` when a larger value raises fewer alarms, else ``"lower"``.
        log: search in log space (a ratio or a scale), else linearly.
    """

    param: str
    lo: float
    hi: float
    quieter: str = "higher"
    log: bool = True


@runtime_checkable
class DetectorProtocol(Protocol):
    """What adapters and the Monitor rely on: the detector contract."""

    inputs: tuple[Input, ...]

    def update(self, *, step: int | None = None, **signals: Any) -> list[Event]: ...

    def scan(self, *, steps: Any = None, **signals: Any) -> list[Event]: ...

    def reset(self) -> None: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def _upper(name: str) -> float | None:
    """The largest value of signal ``name`` that needs no check (``None``: any value does)."""
    sig = SIGNALS[name]
    return 1.0 if sig.fraction else math.inf if sig.nonneg else None


def _jsonable(v: Any) -> Any:
    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, (np.floating,)):
        return float(v)
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (list, tuple, deque)):
        return [_jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if hasattr(v, "value") and isinstance(v.value, str):  # enums
        return v.value
    if callable(v):  # a schedule: named by where it lives (the same in every process)
        return f"callable {getattr(v, '__module__', '?')}.{getattr(v, '__qualname__', type(v).__name__)}"
    return v


class Detector:
    """Base class of the streaming detectors (see the module docstring for the protocol).

    Subclasses declare ``inputs`` (a class attribute, or a property when the configuration
    picks the signal), implement ``_reset`` (create every state attribute, listed in
    ``_state_keys``) and ``_step(*values, step)`` (the per-step logic, on Python floats), and
    may implement ``_fast`` (the vectorised advance of ``scan``).
    """

    inputs: tuple[Input, ...] = ()
    _state_keys: ClassVar[tuple[str, ...]] = ()
    #: the parameter calibration sets (:class:`Knob`); ``None``: not calibrated
    knob: ClassVar[Knob | None] = None
    #: alarms per 10,000 healthy steps at this detector's settings, when measured (the default
    #: suite sets it from the calibration; the Monitor copies it into the events)
    healthy_rate: float | None = None
    #: the same rate on held-out healthy runs (model families and seeds no value was ever chosen on),
    #: when measured: what the default suite sets beside ``healthy_rate`` (``calibration.json``)
    heldout_rate: float | None = None
    #: constructor parameters that are spans counted in values of a per-step signal (windows, holds,
    #: lags), each with the fewest values its statistic needs; and those that are EWMA weights per
    #: value: what :func:`~trainsignals.detectors.interval_settings` scales for a log written every N steps
    spans: ClassVar[Mapping[str, int | str]] = {}
    rates: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Give the subclass its own copy of each method it inherits from a shared base.

        The trackers several rules share (the EWMA jump, the plateau, the coupling levels) are
        base classes, so one method runs on detectors of several classes each step. CPython
        specialises attribute access per call site for one class at a time; a site that sees
        several classes stays generic. With a copy per class (same code, same globals, same
        ``__class__`` cell) every site sees one class.
        """
        super().__init_subclass__(**kwargs)
        for name in {n for base in cls.__mro__[1:] for n in vars(base)}:
            owner = next(b for b in cls.__mro__ if name in vars(b))
            fn = vars(owner)[name]
            if (owner is cls or owner is Detector or owner is object or name.startswith("__")
                    or type(fn) is not types.FunctionType):
                continue
            copy = types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__,
                                      fn.__closure__)
            copy.__kwdefaults__, copy.__qualname__, copy.__doc__ = fn.__kwdefaults__, fn.__qualname__, fn.__doc__
            copy.__dict__.update(fn.__dict__)
            copy.__annotations__ = fn.__annotations__
            setattr(cls, name, copy)

    # -- configuration --------------------------------------------------------------------
    @classmethod
    def _param_names(cls) -> list[str]:
        sig = inspect.signature(cls.__init__)
        return [p for p in sig.parameters if p != "self"]

    def _params(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self._param_names()}

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self._params().items())
        return f"{type(self).__name__}({args})"

    def clone(self) -> Detector:
        """A fresh detector with the same configuration."""
        return type(self)(**self._params())

    def check_contract(self) -> None:
        """Check what the base class needs of a subclass, before a run finds it missing.

        Raises:
            TypeError: a constructor argument not kept as the attribute of its name (``repr``,
                ``clone`` and ``state_dict`` read it there), or no ``_last_step`` created in
                ``_reset`` and listed as ``"last_step"`` in ``_state_keys`` (the step of the last
                value: ``update`` without a step, ``scan`` and a resumed run count on from it).
        """
        cls = type(self).__name__
        for p in self._param_names():
            if not hasattr(self, p):
                raise TypeError(f"{cls}: keep the constructor argument {p!r} as self.{p} "
                                "(repr, clone and state_dict read it there)")
        if not isinstance(getattr(self, "_last_step", None), int) or "last_step" not in self._state_keys:
            raise TypeError(f"{cls}: create self._last_step = -1 in _reset(), set it to the step in _step(), and list "
                            "'last_step' in _state_keys (update without a step, scan and a resumed run count on from it)")

    # -- state ----------------------------------------------------------------------------
    def _reset(self) -> None:
        raise NotImplementedError

    def reset(self) -> None:
        """Forget everything seen; equivalent to a freshly built detector."""
        self._reset()

    def _get_state(self) -> dict[str, Any]:
        return {k: _jsonable(getattr(self, "_" + k)) for k in self._state_keys}

    def _set_state(self, state: dict[str, Any]) -> None:
        for k in self._state_keys:
            v = state[k]
            setattr(self, "_" + k, list(v) if isinstance(v, list) else v)

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable snapshot: detector name, configuration and state."""
        return {
            "detector": type(self).__name__,
            "config": _jsonable(self._params()),
            "state": self._get_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a snapshot taken by :meth:`state_dict`.

        Raises:
            ValueError: the snapshot is of another detector, another configuration, or its
                state keys differ (the offending keys are named).
        """
        if not isinstance(state, dict) or set(state) != {"detector", "config", "state"}:
            keys = sorted(state) if isinstance(state, dict) else type(state).__name__
            raise ValueError(
                f"{type(self).__name__}.load_state_dict expects keys ['config', 'detector', 'state'], got {keys}"
            )
        if state["detector"] != type(self).__name__:
            raise ValueError(
                f"state dict is for detector {state['detector']!r}, not {type(self).__name__!r}"
            )
        mine = _jsonable(self._params())
        theirs = state["config"]
        differ = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
        if differ:
            raise ValueError(
                f"state dict configuration differs from this {type(self).__name__} in: {', '.join(differ)}"
            )
        got = set(state["state"])
        want = set(self._state_keys)
        if got != want:
            missing = sorted(want - got)
            extra = sorted(got - want)
            raise ValueError(
                f"{type(self).__name__} state dict keys differ: missing {missing}, unexpected {extra}"
            )
        self._set_state(state["state"])

    # -- inputs ---------------------------------------------------------------------------
    @property
    def layer_names(self) -> tuple[str, ...] | None:
        """The layer names a per-layer input has carried so far (``None``: none yet, or no such input)."""
        return None

    #: the scalar inputs (by name, in the order of :attr:`inputs`) whose natural log the per-step logic
    #: reads: a Monitor takes each signal's log once a step and hands it to every detector that declares
    #: it (see :attr:`feed`); a detector fed alone, or by its batch twin, takes the logs itself
    logs: tuple[str, ...] = ()

    @property
    def feed(self) -> Callable[..., Event | list[Event] | None]:
        """The per-step entry the Monitor's loop calls: ``feed(*values, step, *logs)``.

        ``values`` come in the order of :attr:`inputs`, already coerced by
        :mod:`trainsignals.signals` (scalars as floats, an absent optional scalar as ``nan``,
        per-layer values as :class:`~trainsignals.LayerValues`); ``logs`` are the natural logs (NumPy's, as the batch path takes them) of the
        inputs :attr:`logs` names, in that order (``nan`` for a value that has none: not positive,
        or absent), and may be left out: the detector then takes them. Returns an event, a list of
        events or ``None``. Subclasses implement it as ``_step``.
        """
        return self._step

    #: the per-step logic: ``_step(*values, step)``, values in the order of :attr:`inputs`
    _step: Callable[..., Event | list[Event] | None]
    #: the last step seen (-1 before any): every detector keeps it in its state
    _last_step: int

    def _coerce(self, name: str, value: Any) -> Any:
        form = SIGNALS[name].form
        if form == "scalar":
            return scalar(name, value)
        if form == "layers":
            return layers(name, value, self.layer_names)
        return activations(value, self.layer_names)

    def _missing(self, signals: Mapping[str, Any]) -> bool:
        return any(i.required and signals.get(i.name) is None for i in self.inputs)

    def _check_names(self, signals: Mapping[str, Any], what: str) -> None:
        known = {i.name for i in self.inputs}
        unknown = sorted(set(signals) - known)
        if unknown:
            raise TypeError(f"{type(self).__name__}.{what}() got unknown signal(s) {unknown}; "
                            f"its inputs are {[i.name for i in self.inputs]}")
        missing = [i.name for i in self.inputs if i.required and signals.get(i.name) is None]
        if missing:
            raise TypeError(f"{type(self).__name__}.{what}() needs {', '.join(missing)}")
        if all(v is None for v in signals.values()):
            raise TypeError(f"{type(self).__name__}.{what}() needs at least one of {[i.name for i in self.inputs]}")

    # -- streaming ------------------------------------------------------------------------
    def update(self, *, step: int | None = None, **signals: Any) -> list[Event]:
        """Feed one step's values of this detector's :attr:`inputs`, by name; returns its events.

        Non-finite values never touch the statistics (the Monitor reports them as
        ``nonfinite`` events). A refused call changes nothing.

        Raises:
            TypeError: an unknown or missing input, or a value that is not a number (named).
            ValueError: an impossible value (a negative grad norm, ...) or a decreasing step.
        """
        ins = self.inputs
        entry = _SPECS.get(id(ins))
        if entry is None or entry[0] is not ins:
            entry = _SPECS[id(ins)] = (ins, tuple(
                (i.name, SIGNALS[i.name].form == "scalar", _upper(i.name)) for i in ins))
        spec = entry[1]
        if len(spec) == 1 and step is None and len(signals) == 1:  # one float, the next step: most calls
            name, is_scalar, hi = spec[0]
            v = signals.get(name)
            if is_scalar and type(v) is float and (hi is None or 0.0 <= v <= hi):
                got = self._step(v, self._last_step + 1)
                return [] if got is None else got if type(got) is list else [got]  # type: ignore[list-item]
        values = []
        given = 0
        for name, is_scalar, hi in spec:
            v = signals.get(name)
            if v is None:
                values.append(math.nan if is_scalar else None)
                continue
            given += 1
            if is_scalar and type(v) is float and (hi is None or 0.0 <= v <= hi):
                values.append(v)  # the common case: a float in range
            else:
                values.append(self._coerce(name, v))
        if given != len(signals) or not given or given < len(spec) and self._missing(signals):
            self._check_names(signals, "update")
        last = self._last_step
        s = last + 1 if step is None else to_step(step)
        if s < last:
            raise ValueError(f"step must not decrease: got {s} after {last}")
        got = self._step(*values, s)
        if got is None:
            return []
        return got if type(got) is list else [got]  # type: ignore[list-item]

    # -- batch ----------------------------------------------------------------------------
    def _fast(self, arrays: Sequence[Any], steps: np.ndarray, i: int, j: int) -> int:
        """Advance the state over ``[i, j)`` as far as no input needs scalar logic.

        Returns how many inputs were consumed; the input after them (if any) is then fed to
        ``_step``. The default consumes nothing (pure scalar path).
        """
        return 0

    def scan(self, *, steps: Any = None, **signals: Any) -> list[Event]:
        """Batch twin of :meth:`update`: whole arrays in, exactly the events of feeding them one by one.

        Args:
            steps: the step of each entry of the aligned inputs (integers, non-decreasing);
                defaults to consecutive steps after the last one seen.
            **signals: this detector's inputs by name: 1-D arrays aligned with ``steps`` (a
                masked entry or a pyarrow null is a gap: not measured), ``(steps, values)``
                pairs for inputs with their own cadence, ``(steps, layers)`` matrices or
                ``{layer: array}`` for per-layer inputs (see :func:`trainsignals.signals.column`).
        """
        self._check_names(signals, "scan")
        cols = {i.name: column(i.name, signals[i.name], self.layer_names)
                for i in self.inputs if signals.get(i.name) is not None}
        with sharing():
            arrays, st = align(self.inputs, cols, steps, self._last_step)
            return self._drive(arrays, st, [cols[i.name].names if i.name in cols else None for i in self.inputs])

    def _drive(self, cols: list[Any], steps: np.ndarray,
             names: Sequence[tuple[str, ...] | None] | None = None) -> list[Event]:
        """The shared batch driver: vectorised advances interleaved with scalar steps.

        Blocks grow while the fast path consumes them whole; stretches that need the scalar path
        (warm-up, an alarm, a run of anomalies) are walked in scalar runs that grow while the fast
        path keeps declining, so the cost never exceeds the streaming path by much. ``cols`` holds
        one array per input: 1-D for scalars, ``(n, layers)`` or ``(n, 2, layers)`` for the other
        forms (rows reach ``_step`` as :class:`~trainsignals.LayerValues` / ``LayerStats`` with
        the layer ``names`` of that input).
        """
        n = len(steps)
        events: list[Event] = []
        i = 0
        block = _MIN_BLOCK
        scalar_run = 1
        fast = self._fast
        step_fn = self._step
        nm = list(names) if names is not None else [None] * len(cols)
        while i < n:
            j = min(n, i + block)
            k = fast(cols, steps, i, j)
            i += k
            if i == j:
                block = min(block * 2, _MAX_BLOCK)
                continue
            block = max(_MIN_BLOCK, block // 4)
            scalar_run = min(scalar_run * 2, 256) if k == 0 else 1
            end = min(n, i + scalar_run)
            for args in zip(*(_rows(c, nm[r], i, end) for r, c in enumerate(cols)), steps[i:end].tolist()):
                ev = step_fn(*args)
                if isinstance(ev, list):
                    events.extend(ev)
                elif ev is not None:
                    events.append(ev)
            i = end
        return events


def align(inputs: Sequence[Input], cols: Mapping[str, Column], steps: Any,
          last_step: int) -> tuple[list[Any], np.ndarray]:
    """The inputs' columns on one grid of steps, in the order of ``inputs``, for the batch driver of :meth:`Detector.scan`.

    Aligned columns share ``steps``; a sparse column (its own steps) joins the grid after the
    aligned rows of the same or an earlier step, merged into a row of the same step. Only the
    rows where every required input was measured (where none is required: any input) are kept;
    an absent scalar is ``nan`` there, an absent row of another form is all ``nan``.
    """
    aligned = [c for c in cols.values() if c.steps is None]
    lens = {len(c) for c in aligned}
    if len(lens) > 1:
        raise ValueError(f"aligned signals must have equal lengths, got {sorted(lens)}")
    n = lens.pop() if lens else 0
    if aligned:
        st = np.arange(last_step + 1, last_step + 1 + n, dtype=np.int64) if steps is None else \
            as_steps("steps", steps, n)
    else:
        st = np.zeros(0, dtype=np.int64)
    if len(st) and (st[0] < last_step or not nondecreasing(st)):
        raise ValueError("step must not decrease")
    sparse = [c for c in cols.values() if c.steps is not None]
    masked = any(c.mask is not None for c in aligned)
    if not sparse and not masked:
        if not aligned:
            return [], st
        arrays = [cols[i.name].values if i.name in cols else _absent(i.name, n, cols) for i in inputs]
        return arrays, st
    # one grid: the aligned steps and the sparse steps that fall between them
    extra = [c.steps for c in sparse if c.steps is not None]
    all_steps = np.concatenate([st, *extra]) if extra else st
    if len(all_steps) and np.any(all_steps < last_step):
        raise ValueError("step must not decrease")
    new = np.unique(np.concatenate(extra)) if extra else np.zeros(0, dtype=np.int64)
    new = new[~np.isin(new, st)]
    grid = np.sort(np.concatenate([st, new]), kind="stable")
    m = len(grid)
    at_dense = np.searchsorted(grid, st, side="left") + _rank_in_runs(st)  # rows of the aligned entries
    present = np.zeros((len(inputs), m), dtype=bool)
    arrays = []
    for r, inp in enumerate(inputs):
        c = cols.get(inp.name)
        out = _absent(inp.name, m, cols, fresh=c is not None)
        if c is not None:
            if c.steps is None:
                rows, vals = at_dense, c.values
                if c.mask is not None:
                    rows, vals = rows[c.mask], vals[c.mask]
            else:
                rows = np.searchsorted(grid, c.steps, side="right") - 1  # the last row of that step
                vals = c.values
            out[rows] = vals
            present[r, rows] = True
        arrays.append(out)
    req = [r for r, i in enumerate(inputs) if i.required]
    keep = present[req].all(axis=0) if req else present.any(axis=0)
    return [a[keep] for a in arrays], grid[keep]


def _rank_in_runs(st: np.ndarray) -> np.ndarray:
    """For non-decreasing steps, each entry's position within its run of equal steps."""
    if not len(st):
        return np.zeros(0, dtype=np.int64)
    idx = np.arange(len(st))
    starts = np.r_[0, np.nonzero(np.diff(st))[0] + 1]
    first = np.repeat(starts, np.diff(np.r_[starts, len(st)]))
    return idx - first


#: the latest all-``nan`` scalar column handed out, read-only: every detector of a batch run that reads an
#: absent scalar input shares it (one allocation, not one per detector; a write raises)
_NAN_COLUMN: list[np.ndarray] = [np.full(0, np.nan)]


def _absent(name: str, n: int, cols: Mapping[str, Column], fresh: bool = False) -> np.ndarray:
    """An input that was not given: ``nan`` for every row (in the shape of its form); with ``fresh``, writable."""
    form = SIGNALS[name].form
    if form == "scalar":
        if fresh:
            return np.full(n, np.nan)
        col = _NAN_COLUMN[0]
        if len(col) != n:
            col = np.full(n, np.nan)
            col.flags.writeable = False
            _NAN_COLUMN[0] = col
        return col
    width = next((len(c.names) for c in cols.values() if c.name == name and c.names is not None), 0)
    return np.full((n, width) if form == "layers" else (n, 2, width), np.nan)


def _rows(c: Any, names: tuple[str, ...] | None, i: int, end: int) -> list[Any]:
    """Entries ``[i, end)`` of one aligned input as ``_step`` takes them."""
    if c.ndim == 1:
        return c[i:end].tolist()
    keys = names if names is not None else tuple(f"layer{k}" for k in range(c.shape[-1]))
    if c.ndim == 2:
        return [LayerValues(keys, row) for row in c[i:end]]
    return [LayerStats(keys, m) for m in c[i:end]]


def isfinite(x: float) -> bool:
    """Fast scalar finiteness test."""
    return x - x == 0.0


__all__ += ["isfinite", "align"]
