"""LossGradCoupling: the loss and the gradient norm stop moving together."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np

from .._events import Event, Kind, make_event
from .._validate import check_range
from ._base import PairDetector
from ._ops import ewma, first_true

_LN10 = math.log(10.0)


class LossGradCoupling(PairDetector):
    """Flags silent collapse: the loss keeps falling while the grad norm collapses (or explodes).

    On ``u = log(loss)`` and ``g = log(grad_norm)`` the detector keeps smoothed levels (EWMA,
    weight ``alpha``) and compares each with its own value ``lag`` values earlier. The grad
    norm has *decoupled* when its level moved at least ``orders`` decades over that span
    (``|dg| >= orders * ln 10``) — a healthy run's grad norm drifts far less in ``lag`` steps —
    and, when it fell, it fell ``orders`` decades more than the loss did (a classifier fitting
    its data drives loss and gradient down together: that is coupled, not silent). Then:

    * if the loss did not rise over the span (``du <= log(loss_tolerance)``), it is
      ``silent_collapse`` — the loss looks fine while the gradients died (or blew up);
    * if the grad norm collapsed while the loss rose instead, it is ``vanishing_gradient``.

    A grad-norm *explosion* with a rising loss is left to :class:`EWMASpike` on the grad norm.
    Both are warnings; ``onset_step`` is the first step in the span at which the grad level
    had left its starting value by a quarter of a decade. After an event the detector stays
    quiet until the decoupling has cleared (``|dg|`` back under the threshold), so one
    collapse is one event; no event before ``lag`` values were seen.

    Args:
        lag: span, in values, over which the levels are compared, >= 2.
        alpha: weight of the smoothed levels, in (0, 1].
        orders: decades of grad-norm movement that fire, > 0.
        loss_tolerance: how much the loss may have risen and still count as "not rising", >= 1.

    Example:
        The loss falls smoothly while the grad norm decays by 3 decades from step 200 to 350:

        >>> import numpy as np
        >>> t = np.arange(500)
        >>> loss = 2.0 * np.exp(-t / 300)
        >>> grad = np.maximum(np.where(t < 200, 1.0, 10.0 ** (-(t - 200) / 50)), 1e-3)
        >>> [(e.kind.value, e.step, e.onset_step) for e in LossGradCoupling().scan(loss, grad)]
        [('silent_collapse', 303, 221)]
    """

    signals = ("loss", "grad_norm")
    _state_keys = ("n", "u", "g", "us", "gs", "ss", "armed", "last_step")

    def __init__(
        self,
        lag: int = 250,
        alpha: float = 0.1,
        orders: float = 1.5,
        loss_tolerance: float = 1.05,
    ) -> None:
        check_range("lag", lag, 2, None, integer=True)
        check_range("alpha", alpha, 0, 1, lo_open=True)
        check_range("orders", orders, 0, None, lo_open=True)
        check_range("loss_tolerance", loss_tolerance, 1, None)
        self.lag = lag
        self.alpha = alpha
        self.orders = orders
        self.loss_tolerance = loss_tolerance
        self._a, self._b = float(alpha), 1.0 - float(alpha)
        self._gap = orders * _LN10
        self._ltol = math.log(loss_tolerance)
        self._reset()

    def _reset(self) -> None:
        self._n = 0
        self._u = self._g = 0.0
        self._us: deque[float] = deque(maxlen=self.lag + 1)
        self._gs: deque[float] = deque(maxlen=self.lag + 1)
        self._ss: deque[int] = deque(maxlen=self.lag + 1)
        self._armed = True
        self._last_step = -1

    def _set_state(self, state: dict[str, Any]) -> None:
        super()._set_state(state)
        m = self.lag + 1
        self._us = deque(state["us"], maxlen=m)
        self._gs = deque(state["gs"], maxlen=m)
        self._ss = deque(state["ss"], maxlen=m)

    def _step(self, loss: float, grad: float, step: int) -> Event | None:  # type: ignore[override]
        self._last_step = step
        if loss - loss != 0.0 or grad - grad != 0.0 or loss <= 0.0 or grad <= 0.0:
            return None
        u = math.log(loss)
        g = math.log(grad)
        if self._n == 0:
            self._u, self._g = u, g
        else:
            self._u = self._a * u + self._b * self._u
            self._g = self._a * g + self._b * self._g
        self._n += 1
        self._us.append(self._u)
        self._gs.append(self._g)
        self._ss.append(step)
        if len(self._gs) <= self.lag:
            return None
        dg = self._g - self._gs[0]
        if abs(dg) < self._gap:
            self._armed = True
            return None
        if not self._armed:
            return None
        du = self._u - self._us[0]
        falling = du <= self._ltol
        if dg > 0:
            if not falling:
                return None
        elif falling and -dg - max(0.0, -du) < self._gap:
            return None  # the grad norm fell with the loss (e.g. a classifier fitting its data)
        return self._event(step, dg, du, falling)

    def _event(self, step: int, dg: float, du: float, falling: bool) -> Event:
        self._armed = False
        g0 = self._gs[0]
        onset = step
        for gv, sv in zip(self._gs, self._ss):
            if abs(gv - g0) >= 0.25 * _LN10:
                onset = sv
                break
        kind = Kind.SILENT_COLLAPSE if falling else Kind.VANISHING_GRADIENT
        factor = math.exp(abs(dg))
        trend = (f"the loss still fell {-100 * math.expm1(du):.3g}%" if du < 0 else
                 f"the loss changed {100 * math.expm1(du):+.2g}%")
        moved = "collapsed" if dg < 0 else "exploded"
        msg = (f"grad_norm {moved} {factor:.3g}x in {self.lag} steps (since step {onset}) while {trend}: "
               + ("loss and gradients have decoupled" if falling else "the gradients are dying"))
        return make_event(kind, "warning", step, onset, type(self).__name__, "grad_norm",
                          abs(dg) / _LN10, self.orders, msg)

    def _fast(self, arrays: Sequence[np.ndarray], steps: np.ndarray, i: int, j: int) -> int:
        if len(self._gs) <= self.lag:
            return 0
        with np.errstate(divide="ignore", invalid="ignore"):
            u = np.log(arrays[0][i:j])
            g = np.log(arrays[1][i:j])
        lim = first_true(~(np.isfinite(u) & np.isfinite(g)))
        if lim == 0:
            return 0
        uu = ewma(u[:lim], self._a, self._b, self._u)
        gg = ewma(g[:lim], self._a, self._b, self._g)
        gext = np.concatenate((np.asarray(self._gs), gg))
        dg = gg - gext[1:lim + 1]  # the ring holds lag+1 levels: index c+1 is lag values back
        big = np.abs(dg) >= self._gap
        k = lim
        if not self._armed:  # disarmed: the next thing to happen is the re-arm
            k = first_true(~big)
        elif big.any():
            uext = np.concatenate((np.asarray(self._us), uu))
            du = uu - uext[1:lim + 1]
            falling = du <= self._ltol
            coupled = falling & (-dg - np.maximum(0.0, -du) < self._gap)
            k = first_true(big & np.where(dg > 0, falling, ~coupled))
        if k:
            self._u, self._g = float(uu[k - 1]), float(gg[k - 1])
            m = self.lag + 1
            self._us.extend(uu[max(0, k - m):k].tolist())
            self._gs.extend(gg[max(0, k - m):k].tolist())
            self._ss.extend(steps[i + max(0, k - m):i + k].tolist())
            self._n += k
            self._last_step = int(steps[i + k - 1])
        return k
