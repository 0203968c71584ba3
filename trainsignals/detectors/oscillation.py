"""Oscillation: the loss bounces with large swings and makes no net progress."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np

from .._events import Event, Kind, make_event
from .._validate import check_range
from ._base import Detector
from ._ops import ewma, first_true, shifted

_TINY = 1e-300


class Oscillation(Detector):
    """Flags a sawtooth: many large swings of ``log(loss)`` with no net progress.

    With ``y = log(x)`` and ``d = y[t] - y[t-1]``, the detector keeps ``base``, an EWMA (weight
    ``alpha``) of ``log|d|`` — the run's own typical step-to-step swing, as a geometric mean so
    single spikes barely move it. A swing is *large* when ``log|d| > base + log(ratio)``. It
    fires when, over the last ``window`` changes,

    * at least ``frac * window`` swings are large (an isolated spike is one or two), and
    * the net change ``|y[t] - y[t-window]|`` is at most ``efficiency`` times the path length
      ``sum |d|`` (no net progress: a divergence or a fast descent has efficiency near 1).

    ``onset_step`` is the first large swing in the window. Quiet for ``cooldown`` values after
    an event; no event in the first ``warmup`` values.

    Args:
        window: changes in the window, >= 4.
        ratio: factor over the typical swing that makes a swing large, > 1.
        frac: fraction of large swings that fires, in (0, 1].
        efficiency: largest net-change / path-length ratio that fires, in (0, 1].
        alpha: weight of the typical-swing EWMA, in (0, 1).
        warmup: values before any event, >= window.
        cooldown: values without events after an event, >= 0.
        signal: the signal name used in events.

    Example:
        A loss that converges, then alternates by +-40 % from step 150:

        >>> import numpy as np
        >>> rng = np.random.default_rng(2)
        >>> t = np.arange(300)
        >>> loss = np.exp(-np.minimum(t, 150) / 100) * np.exp(rng.normal(0, 0.02, 300))
        >>> loss[150:] *= np.where(t[150:] % 2 == 0, 1.4, 1 / 1.4)
        >>> [(e.step, e.onset_step) for e in Oscillation().scan(loss)]
        [(159, 150)]
    """

    signals = ("x",)
    _state_keys = ("n", "base", "prev", "ys", "ss", "big", "cooldown_left", "last_step")

    def __init__(
        self,
        window: int = 20,
        ratio: float = 5.0,
        frac: float = 0.5,
        efficiency: float = 0.3,
        alpha: float = 0.01,
        warmup: int = 50,
        cooldown: int = 100,
        signal: str = "loss",
    ) -> None:
        check_range("window", window, 4, None, integer=True)
        check_range("ratio", ratio, 1, None, lo_open=True)
        check_range("frac", frac, 0, 1, lo_open=True)
        check_range("efficiency", efficiency, 0, 1, lo_open=True)
        check_range("alpha", alpha, 0, 1, lo_open=True, hi_open=True)
        check_range("warmup", warmup, window, None, integer=True)
        check_range("cooldown", cooldown, 0, None, integer=True)
        self.window = window
        self.ratio = ratio
        self.frac = frac
        self.efficiency = efficiency
        self.alpha = alpha
        self.warmup = warmup
        self.cooldown = cooldown
        self.signal = signal
        self._a, self._b = float(alpha), 1.0 - float(alpha)
        self._lr = math.log(ratio)
        self._need = frac * window
        self._reset()

    def _reset(self) -> None:
        w = self.window
        self._n = 0
        self._base = 0.0
        self._prev = 0.0
        self._ys: deque[float] = deque(maxlen=w + 1)
        self._ss: deque[int] = deque(maxlen=w + 1)
        self._big: deque[int] = deque(maxlen=w)
        self._cooldown_left = 0
        self._last_step = -1

    def _set_state(self, state: dict[str, Any]) -> None:
        super()._set_state(state)
        w = self.window
        self._ys = deque(state["ys"], maxlen=w + 1)
        self._ss = deque(state["ss"], maxlen=w + 1)
        self._big = deque(state["big"], maxlen=w)

    def _confirm(self, ys: Sequence[float]) -> tuple[bool, float]:
        path = 0.0
        for k in range(1, len(ys)):
            path += abs(ys[k] - ys[k - 1])
        eff = abs(ys[-1] - ys[0]) / (path + _TINY)
        return eff <= self.efficiency, eff

    def _step(self, x: float, step: int) -> Event | None:
        self._last_step = step
        if x - x != 0.0 or x <= 0.0:
            return None
        y = math.log(x)
        n = self._n
        self._n = n + 1
        self._ys.append(y)
        self._ss.append(step)
        if n == 0:
            return None
        la = math.log(abs(y - self._prev) + _TINY)
        self._prev = y
        if n == 1:
            self._base = la
            self._big.append(0)
            return None
        big = 1 if la > self._base + self._lr else 0
        self._base = self._a * la + self._b * self._base
        self._big.append(big)
        if self._cooldown_left:
            self._cooldown_left -= 1
            return None
        if n < self.warmup or sum(self._big) < self._need:
            return None
        ok, eff = self._confirm(self._ys)
        if not ok:
            return None
        self._cooldown_left = self.cooldown
        w = self.window
        first = next(k for k, b in enumerate(self._big) if b)
        onset = self._ss[len(self._ss) - w + first]
        nbig = sum(self._big)
        msg = (f"{self.signal} swung widely {nbig} times in {w} steps with no net progress "
               f"(net/path {eff:.2f}): sawtooth")
        return make_event(Kind.OSCILLATION, "warning", step, onset, type(self).__name__, self.signal,
                          nbig / w, self.frac, msg)

    def _fast(self, arrays: Sequence[np.ndarray], steps: np.ndarray, i: int, j: int) -> int:
        w = self.window
        if self._n < max(self.warmup, w + 2) or self._cooldown_left:
            return 0
        with np.errstate(divide="ignore", invalid="ignore"):
            y = np.log(arrays[0][i:j])
        lim = first_true(~np.isfinite(y))
        if lim == 0:
            return 0
        y = y[:lim]
        yp = shifted(y, self._prev)
        la = np.log(np.abs(y - yp) + _TINY)
        base = ewma(la, self._a, self._b, self._base)
        bp = shifted(base, self._base)
        big = (la > bp + self._lr).astype(np.int64)
        ext = np.concatenate((np.asarray(self._big, dtype=np.int64), big))
        cs = np.concatenate(([0], np.cumsum(ext)))
        counts = cs[w:] - cs[:-w]  # counts[q] = sum ext[q:q+w]
        cand = counts[len(ext) - w - lim + 1:] >= self._need
        k = lim
        if cand.any():
            yext = np.concatenate((np.asarray(self._ys), y))
            off = len(self._ys)
            for c in np.flatnonzero(cand):
                if self._confirm(yext[off + c - w:off + c + 1].tolist())[0]:
                    k = int(c)
                    break
        if k:
            self._base = float(base[k - 1])
            self._prev = float(y[k - 1])
            self._big.extend(big[max(0, k - w):k].tolist())
            self._ys.extend(y[max(0, k - w - 1):k].tolist())
            self._ss.extend(steps[i + max(0, k - w - 1):i + k].tolist())
            self._n += k
            self._last_step = int(steps[i + k - 1])
        return k
