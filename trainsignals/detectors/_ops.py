"""Vectorised recurrences shared by the batch paths (the scalar paths write them out inline), and
the scalar ``log`` the per-step paths share.

The scalar paths use exactly these forms, ``m = a*x + b*m`` with ``b = 1 - a``, so that
``scipy.signal.lfilter`` and the Python loop evaluate the same expression.

Within one batch run (:func:`sharing`: ``Detector.scan`` and ``Monitor.scan`` open one) the
detectors also share what they compute on the same input columns: the log of a column, where its
unusable values are, and a recurrence run from the same state at the same position (the same
arithmetic on the same numbers gives the same numbers, so sharing changes no value). What is
shared is read-only.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np


def _scalar_twin(vectorised: Callable[[Any], Any], scalar: Callable[[float], float]) -> Callable[[float], float]:
    """``scalar`` (libm's, the fast call) when it gives ``vectorised``'s numbers, else ``vectorised`` on one value.

    NumPy's log runs libm's on most CPUs, but its own vectorised code where AVX-512 is present,
    which differs from libm's in the last bit for a few values in a thousand. Which one runs is
    fixed for the process; 8,192 values over the whole float range tell them apart (a difference
    at that rate shows in dozens of them).
    """
    rng = np.random.default_rng(0)
    x = np.concatenate((np.exp(rng.uniform(-700.0, 700.0, 4096)), rng.uniform(0.01, 10.0, 4096)))
    if all(a == b for a, b in zip(map(scalar, x.tolist()), vectorised(x).tolist(), strict=True)):
        return scalar
    return lambda v: float(vectorised(v))


def _remembering(scalar: Callable[[float], float], doc: str) -> Callable[[float], float]:
    """``scalar`` that remembers its last two arguments (by identity) and their results.

    A Monitor hands the same float objects to all its detectors at a step, so the log of each
    signal is taken once a step rather than once per detector (a look-up here costs a fraction of
    the call). The memo is one tuple, replaced whole, so threads never see an argument with
    another's result.
    """
    memo: tuple[Any, float, Any, float] = (None, 0.0, None, 0.0)

    def call(x: float) -> float:
        nonlocal memo
        m = memo
        if x is m[0]:
            return m[1]
        if x is m[2]:
            return m[3]
        y = scalar(x)
        memo = (x, y, m[0], m[1])
        return y

    call.__doc__ = doc
    return call


log = _remembering(_scalar_twin(np.log, math.log), """The natural log of one value as the batch paths take it, remembered (:func:`_remembering`).

    The batch paths take the log of whole columns with ``np.log`` (:func:`column_log`); the
    per-step paths must get the same numbers bit for bit, or ``scan`` and ``update`` drift apart.
    On CPUs with AVX-512, NumPy's vectorised log is not libm's: it differs from ``math.log`` in the
    last bit for a few values in a thousand. So the scalar log is NumPy's too (on one value it runs
    the same kernel), on every CPU: ``math.log`` where a probe at import finds the two the same,
    NumPy's on one value otherwise (:func:`_scalar_twin`).
    """)
log10 = _remembering(_scalar_twin(np.log10, math.log10), """The base-10 log of one value as
    :func:`column_log` with ``base10`` takes it, remembered (see :func:`log`).
    """)


def lfilter(*args: Any, **kwargs: Any) -> Any:
    """``scipy.signal.lfilter``, imported on first use: ``import trainsignals`` stays light."""
    from scipy.signal import lfilter as _lfilter

    return _lfilter(*args, **kwargs)


_KERNEL: list[Callable[..., Any]] = []  # the first-order filter, found on first use


def _first_order(c: float, b: float, x: np.ndarray, z0: float) -> np.ndarray:
    """``lfilter([c], [1.0, -b], x, zi=[z0])[0]``: ``out[t] = c*x[t] + b*out[t-1]``, ``out[-1]*b = z0``.

    ``lfilter`` checks its arguments and then runs SciPy's filter kernel; the many short stretches
    of a batch run call the kernel directly (the same code on the same arguments), once a test on a
    few values shows that this SciPy's kernel takes them as ``lfilter`` passes them.
    """
    if not _KERNEL:
        _KERNEL.append(_kernel())
    return _KERNEL[0](np.array([c]), np.array([1.0, -b]), x, -1, np.array([z0]))[0]  # type: ignore[no-any-return]


def _kernel() -> Callable[..., Any]:
    from scipy.signal import lfilter as _lfilter

    try:
        from scipy.signal._sigtools import _linear_filter  # SciPy's kernel behind lfilter

        x = np.array([0.5, -1.25, 3.0, 1e-3])
        if np.array_equal(_linear_filter(np.array([0.1]), np.array([1.0, -0.9]), x, -1, np.array([0.3]))[0],
                          _lfilter([0.1], [1.0, -0.9], x, zi=[0.3])[0]):
            return _linear_filter  # type: ignore[no-any-return]
    except (ImportError, TypeError, ValueError, AttributeError):
        pass
    return lambda c, a, x, axis, zi: _lfilter(c, a, x, axis, zi)


def ewma(x: np.ndarray, a: float, b: float, m0: float) -> np.ndarray:
    """``m[t] = a*x[t] + b*m[t-1]`` with ``m[-1] = m0``."""
    return _first_order(a, b, x, b * m0)


def ewvar(d2: np.ndarray, a: float, b: float, v0: float) -> np.ndarray:
    """``v[t] = b*v[t-1] + (b*a)*d2[t]`` with ``v[-1] = v0`` (West's EWMA variance)."""
    return _first_order(b * a, b, d2, b * v0)


def shifted(arr: np.ndarray, first: float) -> np.ndarray:
    """``[first, arr[0], ..., arr[-2]]``: the value before each position."""
    out = np.empty_like(arr)
    out[0] = first
    out[1:] = arr[:-1]
    return out


def first_true(mask: np.ndarray) -> int:
    """Index of the first True in ``mask``, or ``len(mask)``."""
    idx = int(np.argmax(mask)) if len(mask) else 0
    if len(mask) == 0 or not mask[idx]:
        return len(mask)
    return idx


def before_first_negative(column: np.ndarray, i: int, j: int) -> int:
    """How many values of ``column[i:j]`` come before its first finite negative one (``j - i``:
    none): the stretch a rule that wakes at a loss below zero skips.
    """
    return first_true((column[i:j] < 0.0) & (column[i:j] > -np.inf))  # nan compares false


#: a step before any step a run can have (steps lie above -2**62: trainsignals._validate.to_step);
#: the "no event yet" of the detectors' cooldowns
NEVER = -(2**62)



def quiet_after(step: int, cooldown: int, first: int) -> int:
    """The last quiet step after an event at ``step`` whose evidence window began at step ``first``:
    ``cooldown`` steps on, and never before the window has passed, so that a rule's next report rests
    on values this one did not use. At one value a step a window is shorter than the cooldown; in a log
    written every N steps the same window spans N times the steps, and a cooldown in steps alone would
    let a lasting failure be reported again at every row, on the same values.

    >>> quiet_after(500, 100, 481), quiet_after(500, 100, 0)   # a 20-value window, dense and every 25 steps
    (600, 1000)
    """
    return step + max(cooldown, step - first)

class _Shared(threading.local):
    """The computations one batch run shares between its detectors (per thread)."""

    def __init__(self) -> None:
        self.depth = 0
        self.store: dict[Any, Any] = {}


_SHARED = _Shared()
#: the stretches of one average a batch run keeps for reuse (the latest)
_MAX_RUNS = 64
#: values of an average computed before :func:`shared_ewma` looks again for a stored stretch to join:
#: averages of the same values from other states meet within a few hundred values at the weights the
#: rules use (0.05..0.1; the gap shrinks by ``b`` a value), so one span usually suffices
#: (``tests/test_scan_equivalence.py`` checks it at 0.1)
MERGE_SPAN = 2048
#: spans computed before :func:`shared_ewma` stops looking and computes the rest at once (an average
#: with a slow weight, or one that never meets an earlier stretch, costs at most this many extra calls)
MERGE_TRIES = 4


@contextmanager
def sharing() -> Iterator[None]:
    """A batch run whose detectors share what they compute on the same inputs.

    Within it, :func:`column_log` takes the log of a whole input column once, and
    :func:`shared_run` hands a recurrence computed by one detector to every other detector that
    asks for it from the same state at the same position (the same code on the same numbers gives
    the same numbers, so sharing changes no value). Everything is forgotten when the outermost
    ``sharing`` ends: the inputs of the next run may be other arrays, or the same ones changed.
    """
    _SHARED.depth += 1
    try:
        yield
    finally:
        _SHARED.depth -= 1
        if not _SHARED.depth:
            _SHARED.store.clear()


def column_log(x: np.ndarray, i: int, j: int, base10: bool = False) -> np.ndarray:
    """``log(x[i:j])`` (``log10`` with ``base10``), ``nan``/``-inf`` where the log is undefined.

    Inside :func:`sharing` the log of the whole column ``x`` is taken once and sliced.
    """
    if not _SHARED.depth:
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.log10(x[i:j]) if base10 else np.log(x[i:j])  # type: ignore[no-any-return]
    key = ("log10" if base10 else "log", id(x))
    hit = _SHARED.store.get(key)
    if hit is None or hit[0] is not x:
        with np.errstate(divide="ignore", invalid="ignore"):
            hit = _SHARED.store[key] = (x, frozen(np.log10(x) if base10 else np.log(x)))
    return hit[1][i:j]  # type: ignore[no-any-return]


def column_id(x: np.ndarray) -> int | None:
    """A name of the input column ``x`` for :func:`shared_run` keys, valid for the batch run (``None``
    outside :func:`sharing`: nothing is shared).
    """
    if not _SHARED.depth:
        return None
    _SHARED.store.setdefault(("column", id(x)), x)  # held: its id names no other array during the run
    return id(x)


def shared_run(key: tuple[Any, ...] | None, n: int,
               compute: Callable[[], tuple[np.ndarray, ...]]) -> tuple[np.ndarray, ...]:
    """``compute()``: arrays of length ``n``, or the first ``n`` of what a detector of this batch run
    computed under the same ``key`` (which names the column, the position and the exact state the
    recurrence starts from; see :func:`key_float`). ``key=None``: not shared.
    """
    if key is None or not _SHARED.depth:
        return compute()
    hit = _SHARED.store.get(key)
    if hit is not None and len(hit[0]) >= n:
        return tuple(a[:n] for a in hit)
    out = _SHARED.store[key] = frozen(compute())
    return out  # type: ignore[no-any-return]


def shared_ewma(col: np.ndarray, i: int, what: str, y: np.ndarray, a: float, b: float, m0: float) -> np.ndarray:
    """:func:`ewma` of ``y`` from ``m0``, shared within a batch run: ``y`` is ``what`` (say ``"log"``)
    of the input column ``col`` from position ``i`` on.

    An average of the same values with the same weights that an earlier detector of the run computed
    is reused wherever it passes through the state this one is in just before a position (as far as
    it goes; the rest is computed, or reused from where the next stretch starts): from the same state
    the recurrence gives the same numbers, whoever runs it. Two averages of the same values from
    different states meet bit for bit after a few hundred values (the gap shrinks by ``b`` a value
    until rounding closes it), so where an earlier stretch lies ahead, this one is computed
    :data:`MERGE_SPAN` values at a time and looked up again after each (at most :data:`MERGE_TRIES` times).
    """
    cid, n = column_id(col), len(y)
    if cid is None or not n:
        return ewma(y, a, b, m0)
    runs: list[tuple[int, float, np.ndarray]] = _SHARED.store.setdefault(
        ("ewma", cid, what, key_float(a), key_float(b)), [])
    parts: list[np.ndarray] = []
    done, state, tries = 0, m0, 0
    while done < n:
        pos = i + done
        head = _through(runs, pos, state)
        if head is None:
            ahead = tries < MERGE_TRIES and any(i0 + len(out) > pos + MERGE_SPAN for i0, _, out in runs)
            span = MERGE_SPAN if ahead and n - done > MERGE_SPAN else n - done
            head = frozen(ewma(y[done:done + span], a, b, state))
            runs.append((pos, state, head))
            if len(runs) > _MAX_RUNS:
                del runs[0]
            tries += 1
        head = head[:n - done]
        parts.append(head)
        done += len(head)
        state = float(head[-1])
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def _through(runs: list[tuple[int, float, np.ndarray]], pos: int, state: float) -> np.ndarray | None:
    """The rest of a stored stretch of an average from position ``pos`` on, if it is in ``state`` just before."""
    for i0, before, out in runs:  # ``out[t]``: the average after position i0 + t; ``before``: before i0
        at = pos - i0
        if 0 <= at < len(out) and same_float(before if at == 0 else float(out[at - 1]), state):
            return out[at:]
    return None


def same_float(u: float, v: float) -> bool:
    """``u`` and ``v`` are the same float, bit for bit (``-0.0`` is not ``0.0``; a ``nan`` is no float's twin)."""
    return u == v and math.copysign(1.0, u) == math.copysign(1.0, v)


def shared(key: tuple[Any, ...] | None, compute: Callable[[], Any]) -> Any:
    """``compute()``, or what a detector of this batch run computed under the same ``key`` (which names
    the column, the position, the length and the exact state the computation starts from). ``key=None``:
    not shared.
    """
    if key is None or not _SHARED.depth:
        return compute()
    hit = _SHARED.store.get(key)
    if hit is None:
        hit = _SHARED.store[key] = frozen(compute())
    return hit


def frozen(v: Any) -> Any:
    """``v`` (an array, or a tuple of them) made read-only: what one detector shares, no detector changes."""
    for a in v if isinstance(v, tuple) else (v,):
        if isinstance(a, np.ndarray):
            a.flags.writeable = False
    return v


def key_float(v: float) -> str:
    """A float as a key: exact, and ``-0.0``, ``nan`` distinguished as the arithmetic distinguishes them."""
    return float(v).hex()


def key_floats(vs: Any) -> bytes:
    """A sequence of floats as a key, bit for bit."""
    return np.asarray(vs, dtype=np.float64).tobytes()


def rises(x: np.ndarray, i: int, j: int, ratio: float) -> np.ndarray:
    """The positions ``t`` in ``[i, j)`` (``i >= 1``) where ``x[t] >= ratio * x[t - 1]`` (inside :func:`sharing`,
    found once for the whole column).
    """
    if not _SHARED.depth:
        with np.errstate(invalid="ignore", over="ignore"):
            return np.flatnonzero(x[i:j] >= ratio * x[i - 1:j - 1]) + i  # type: ignore[no-any-return]
    key = ("rises", id(x), key_float(ratio))
    hit = _SHARED.store.get(key)
    if hit is None or hit[0] is not x:
        with np.errstate(invalid="ignore", over="ignore"):  # ratio * x may pass the float range: inf
            hit = _SHARED.store[key] = (x, frozen(np.flatnonzero(x[1:] >= ratio * x[:-1]) + 1))
    idx = hit[1]
    return idx[np.searchsorted(idx, i):np.searchsorted(idx, j)]  # type: ignore[no-any-return]


def nondecreasing(st: np.ndarray) -> bool:
    """Whether the steps ``st`` never decrease (inside :func:`sharing`, checked once per array)."""
    key = ("nondecreasing", id(st))
    hit = _SHARED.store.get(key) if _SHARED.depth else None
    if hit is not None and hit[0] is st:
        return hit[1]  # type: ignore[no-any-return]
    ok = not (len(st) > 1 and bool(np.any(st[1:] < st[:-1])))
    if _SHARED.depth:
        _SHARED.store[key] = (st, ok)
    return ok


def first_unusable(x: np.ndarray, i: int, j: int, positive: bool = False) -> int:
    """How many values of ``x[i:j]`` come before the first non-finite one (with ``positive``: the
    first one that is also not > 0, where the log is not finite); ``j - i`` when none.

    Inside :func:`sharing` the whole column is searched once.
    """
    return _first(x, i, j, positive, False)


def first_usable(x: np.ndarray, i: int, j: int, positive: bool = False) -> int:
    """How many values of ``x[i:j]`` come before the first finite one (with ``positive``: finite and
    > 0); ``j - i`` when none. Inside :func:`sharing` the whole column is searched once.
    """
    return _first(x, i, j, positive, True)


def _first(x: np.ndarray, i: int, j: int, positive: bool, usable: bool) -> int:
    if not _SHARED.depth:
        with np.errstate(invalid="ignore"):
            seg = x[i:j]
            good = (np.isfinite(seg) & (seg > 0.0)) if positive else np.isfinite(seg)
        return first_true(good if usable else ~good)
    clean = _SHARED.store.get(("clean", id(x)))
    if clean is None or clean[0] is not x:  # the common column: every value finite and > 0
        with np.errstate(invalid="ignore"):
            clean = _SHARED.store[("clean", id(x))] = (x, bool(np.all(x > 0.0)) and bool(np.isfinite(x).all()))
    if clean[1]:
        return 0 if usable else j - i
    key = ("usable" if usable else "unusable", positive, id(x))
    hit = _SHARED.store.get(key)
    if hit is None or hit[0] is not x:
        with np.errstate(invalid="ignore"):
            good = (np.isfinite(x) & (x > 0.0)) if positive else np.isfinite(x)
        hit = _SHARED.store[key] = (x, np.flatnonzero(good if usable else ~good))
    idx = hit[1]
    at = int(np.searchsorted(idx, i))
    return (min(int(idx[at]), j) if at < len(idx) else j) - i


def add_shares(acc: list[Any], values: np.ndarray) -> None:
    """Add the measured answer shares among ``values`` (those in [0, 1]: nan is none) to ``acc = [sum,
    count, mean]``, summed in order as a scalar path adds them one by one (``np.add.accumulate`` is that
    loop).
    """
    got = values[(values >= 0.0) & (values <= 1.0)]
    if len(got):
        acc[0] = float(np.add.accumulate(np.concatenate(([acc[0]], got)))[-1])
        acc[1] += float(len(got))


def close_shares(acc: list[Any]) -> None:
    """At a validation: the mean of the shares added since the previous one becomes ``acc[2]`` (kept
    as it was when none came) and the sum and count start again.
    """
    if acc[1]:
        acc[0], acc[1], acc[2] = 0.0, 0.0, acc[0] / acc[1]


def step_weight(alpha: float, gap: int, cap: float = 1.0) -> float:
    """The EWMA weight of a value ``gap`` steps after the one before, for a weight ``alpha`` a step:
    ``alpha`` compounded over the steps (``1 - (1 - alpha) ** gap``), at most ``cap``.

    >>> step_weight(0.2, 1), round(step_weight(0.2, 10), 4), step_weight(0.2, 10, cap=0.5)
    (0.2, 0.8926, 0.5)
    """
    return alpha if gap <= 1 else min(cap, 1.0 - (1.0 - alpha) ** gap)


def step_weights(alpha: float, gaps: np.ndarray, cap: float = 1.0) -> np.ndarray:
    """:func:`step_weight` of each of ``gaps`` (the same floats: the compounded ones taken in Python)."""
    w = np.full(len(gaps), alpha)
    far = np.flatnonzero(gaps > 1)
    if len(far):
        w[far] = [step_weight(alpha, g, cap) for g in gaps[far].tolist()]
    return w


def stepwise_ewma(x: np.ndarray, w: np.ndarray, m0: float) -> np.ndarray:
    """``m[t] = w[t]*x[t] + (1 - w[t])*m[t-1]`` from ``m[-1] = m0``: :func:`ewma` over each stretch of
    equal weight in turn, so a scalar path applying the recurrence value by value gives the same floats.
    """
    out = np.empty(len(x))
    cuts = (np.flatnonzero(w[1:] != w[:-1]) + 1).tolist()
    m = m0
    for lo, hi in zip([0, *cuts], [*cuts, len(x)]):
        if hi > lo:
            a = float(w[lo])
            out[lo:hi] = ewma(x[lo:hi], a, 1.0 - a, m)
            m = float(out[hi - 1])
    return out
