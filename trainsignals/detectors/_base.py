"""The detector protocol and the shared machinery behind it.

Every detector:

* takes its configuration as public, validated constructor arguments;
* keeps its state in private attributes created in one place, ``_reset``;
* has a scalar ``update(...) -> Event | None`` and a batch twin ``scan(...) -> list[Event]``
  that gives exactly the events the scalar path gives;
* round-trips through ``state_dict()`` / ``load_state_dict()`` (JSON-serialisable) and pickle.

The batch twin works by *speculative vectorisation*: a detector's ``_fast`` method advances its
state over a block of ordinary inputs with NumPy (linear recurrences through
``scipy.signal.lfilter``, windows through sliding views) and stops at the first input that needs
the scalar logic (an alarm candidate, a non-finite value, warm-up, cooldown). That input is then
fed to the scalar ``_step``, so every decision is taken by the same code on both paths.
"""

from __future__ import annotations

import inspect
import math
from collections import deque
from collections.abc import Sequence
from typing import Any, ClassVar, Protocol, runtime_checkable

import numpy as np

from .._events import Event
from .._validate import to_float, to_step

__all__ = ["Detector", "DetectorProtocol"]

_MIN_BLOCK = 2048
_MAX_BLOCK = 1 << 15


@runtime_checkable
class DetectorProtocol(Protocol):
    """What adapters and the Monitor rely on."""

    signals: tuple[str, ...]

    def update(self, *values: Any, step: int | None = None) -> Event | None: ...

    def scan(self, *arrays: Any, steps: Any = None) -> list[Event]: ...

    def reset(self) -> None: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


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
    return v


class Detector:
    """Base class of the streaming detectors (see the module docstring for the protocol).

    Subclasses set ``signals`` (the names of ``update``'s positional inputs), implement
    ``_reset`` (create every state attribute, listed in ``_state_keys``) and ``_step`` (the
    scalar logic, on Python floats), and may implement ``_fast`` (the vectorised advance).
    """

    signals: ClassVar[tuple[str, ...]] = ("x",)
    _state_keys: ClassVar[tuple[str, ...]] = ()

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

    # -- streaming ------------------------------------------------------------------------
    def update(self, x: Any, *more: Any, step: int | None = None) -> Event | None:
        """Feed one observation of each signal in ``signals``; returns an event or ``None``.

        Non-finite values are skipped (the Monitor reports them as ``nonfinite`` events);
        they never touch the statistics.

        Raises:
            TypeError: a value is not a real number (the message names the signal).
        """
        if more or len(self.signals) != 1:
            if len(more) + 1 != len(self.signals):
                raise TypeError(
                    f"{type(self).__name__}.update takes {len(self.signals)} value(s) "
                    f"({', '.join(self.signals)}), got {len(more) + 1}"
                )
            xs = [to_float(name, v) for name, v in zip(self.signals, (x, *more))]
            s = self._last_step + 1 if step is None else to_step(step)  # type: ignore[attr-defined]
            return self._step(*xs, s)  # type: ignore[call-arg, arg-type]
        if type(x) is not float:
            x = to_float(self.signals[0], x)
        if step is None:
            step = self._last_step + 1  # type: ignore[attr-defined]
        elif type(step) is not int:
            step = to_step(step)
        return self._step(x, step)

    def _step(self, x: float, step: int) -> Event | None:
        raise NotImplementedError

    # -- batch ----------------------------------------------------------------------------
    def _fast(self, arrays: Sequence[np.ndarray], steps: np.ndarray, i: int, j: int) -> int:
        """Advance the state over ``[i, j)`` as far as no input needs scalar logic.

        Returns how many inputs were consumed; the input after them (if any) is then fed to
        ``_step``. The default consumes nothing (pure scalar path).
        """
        return 0

    def scan(self, *arrays: Any, steps: Any = None) -> list[Event]:
        """Batch twin of :meth:`update`: feed whole arrays, get the same events.

        Args:
            *arrays: One 1-D array-like per signal in ``signals``, of equal length.
            steps: The step of each value (integers, increasing); defaults to
                consecutive steps after the last one seen.
        """
        if len(arrays) != len(self.signals):
            raise TypeError(
                f"{type(self).__name__}.scan takes {len(self.signals)} array(s) "
                f"({', '.join(self.signals)}), got {len(arrays)}"
            )
        cols = [_as_1d(name, a) for name, a in zip(self.signals, arrays)]
        n = len(cols[0])
        for name, c in zip(self.signals, cols):
            if len(c) != n:
                raise ValueError(f"{name} has {len(c)} values, expected {n}")
        st = _steps_for(steps, n, self._last_step)  # type: ignore[attr-defined]
        return run_scan(self, cols, st)


class PairDetector(Detector):
    """A detector of two signals; the second may be omitted (``nan``: not measured)."""

    def update(self, x: Any, y: Any = math.nan, *, step: int | None = None) -> Event | None:  # type: ignore[override]
        """Feed one value of each signal in ``signals`` (the second may be left out)."""
        if type(x) is not float:
            x = to_float(self.signals[0], x)
        if type(y) is not float:
            y = math.nan if y is None else to_float(self.signals[1], y)
        if step is None:
            step = self._last_step + 1  # type: ignore[attr-defined]
        elif type(step) is not int:
            step = to_step(step)
        return self._step(x, y, step)  # type: ignore[call-arg]

    def scan(self, x: Any, y: Any = None, *, steps: Any = None) -> list[Event]:  # type: ignore[override]
        """Batch twin of :meth:`update`; ``y`` may be left out (all ``nan``)."""
        if y is None:
            y = np.full(len(_as_1d(self.signals[0], x)), np.nan)
        return Detector.scan(self, x, y, steps=steps)


class TripleDetector(Detector):
    """A detector of three signals; the second and third may be omitted (``nan``: not measured)."""

    def update(self, x: Any, y: Any = math.nan, z: Any = math.nan, *,  # type: ignore[override]
               step: int | None = None) -> Event | None:
        """Feed one value of each signal in ``signals`` (the second and third may be left out)."""
        if type(x) is not float:
            x = to_float(self.signals[0], x)
        if type(y) is not float:
            y = math.nan if y is None else to_float(self.signals[1], y)
        if type(z) is not float:
            z = math.nan if z is None else to_float(self.signals[2], z)
        if step is None:
            step = self._last_step + 1  # type: ignore[attr-defined]
        elif type(step) is not int:
            step = to_step(step)
        return self._step(x, y, z, step)  # type: ignore[call-arg]

    def scan(self, x: Any, y: Any = None, z: Any = None, *, steps: Any = None) -> list[Event]:  # type: ignore[override]
        """Batch twin of :meth:`update`; ``y`` and ``z`` may be left out (all ``nan``)."""
        n = len(_as_1d(self.signals[0], x))
        return Detector.scan(self, x, np.full(n, np.nan) if y is None else y,
                             np.full(n, np.nan) if z is None else z, steps=steps)


def _as_1d(name: str, a: Any) -> np.ndarray:
    try:
        arr = np.asarray(a, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name} must be an array of real numbers") from exc
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {arr.shape}")
    return arr


def _steps_for(steps: Any, n: int, last_step: int) -> np.ndarray:
    if steps is None:
        return np.arange(last_step + 1, last_step + 1 + n, dtype=np.int64)
    st = np.asarray(steps)
    if st.ndim != 1 or len(st) != n:
        raise ValueError(f"steps must be 1-D with {n} values, got shape {st.shape}")
    if st.dtype.kind not in "iu":
        if st.dtype.kind == "f" and np.all(np.isfinite(st)) and np.all(st == np.round(st)):
            st = st.astype(np.int64)
        else:
            raise TypeError("steps must be integers")
    return st.astype(np.int64, copy=False)


def run_scan(det: Detector, cols: list[np.ndarray], steps: np.ndarray) -> list[Event]:
    """The shared batch driver: vectorised advances interleaved with scalar steps.

    Blocks grow while the fast path consumes them whole; stretches that need the scalar path
    (warm-up, an alarm, a run of anomalies) are walked in scalar runs that grow while the fast
    path keeps declining, so the cost never exceeds the streaming path by much.
    """
    n = len(steps)
    events: list[Event] = []
    i = 0
    block = _MIN_BLOCK
    scalar_run = 1
    fast = det._fast
    step_fn = det._step
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
        for args in zip(*(c[i:end].tolist() for c in cols), steps[i:end].tolist()):
            ev = step_fn(*args)
            if ev is not None:
                events.append(ev)
        i = end
    return events


def isfinite(x: float) -> bool:
    """Fast scalar finiteness test."""
    return x - x == 0.0


__all__ += ["run_scan", "isfinite", "math"]
