"""LossGradCoupling: the loss and the gradient norm stop moving together."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from .._events import Event, Kind, make_event
from .._validate import check_range
from ._base import Detector
from ._ops import ewma, first_true


class LossGradCoupling(Detector):
    """Flags silent collapse: the loss keeps falling while the grad norm collapses (or explodes).

    On ``u = log(loss)`` and ``g = log(grad_norm)`` the detector keeps a fast and a slow EWMA of
    each (weights ``fast`` and ``slow``). The grad norm has *decoupled* when its fast level sits
    ``orders`` decades below (or above) its slow level, i.e. ``|g_fast - g_slow| >= orders*ln 10``.
    Then:

    * if the loss is still falling or flat (``u_fast <= u_slow + log(loss_tolerance)``), it is
      ``silent_collapse`` — the loss looks fine while the gradients have died (or blown up);
    * if the grad norm collapsed and the loss is rising instead, it is ``vanishing_gradient``.

    Both are warnings with ``onset_step`` at the last step the fast grad level was within one
    decade of the slow one (tracked exactly). A grad-norm *explosion* with a rising loss is left
    to :class:`EWMASpike` on the grad norm. After an event, quiet for ``cooldown`` values.

    Args:
        fast: weight of the fast EWMAs, in (0, 1).
        slow: weight of the slow EWMAs, in (0, fast).
        orders: decades of decoupling that fire, > 0.
        loss_tolerance: how much the loss may have risen and still count as "falling", >= 1.
        warmup: values before any event, >= 1.
        cooldown: values without events after an event, >= 0.

    Example:
        The loss falls smoothly while the grad norm decays by 3 decades from step 200:

        >>> import numpy as np
        >>> t = np.arange(500)
        >>> loss = 2.0 * np.exp(-t / 300)
        >>> grad = np.where(t < 200, 1.0, 10.0 ** (-(t - 200) / 50))
        >>> [(e.kind.value, e.step) for e in LossGradCoupling().scan(loss, grad)]
        [('silent_collapse', 310)]
    """

    signals = ("loss", "grad_norm")
    _state_keys = ("n", "uf", "us", "gf", "gs", "onset", "cooldown_left", "last_step")

    def __init__(
        self,
        fast: float = 0.1,
        slow: float = 0.005,
        orders: float = 1.5,
        loss_tolerance: float = 1.05,
        warmup: int = 50,
        cooldown: int = 200,
    ) -> None:
        check_range("fast", fast, 0, 1, lo_open=True, hi_open=True)
        check_range("slow", slow, 0, fast, lo_open=True, hi_open=True)
        check_range("orders", orders, 0, None, lo_open=True)
        check_range("loss_tolerance", loss_tolerance, 1, None)
        check_range("warmup", warmup, 1, None, integer=True)
        check_range("cooldown", cooldown, 0, None, integer=True)
        self.fast = fast
        self.slow = slow
        self.orders = orders
        self.loss_tolerance = loss_tolerance
        self.warmup = warmup
        self.cooldown = cooldown
        self._fa, self._fb = float(fast), 1.0 - float(fast)
        self._sa, self._sb = float(slow), 1.0 - float(slow)
        self._gap = orders * math.log(10.0)
        self._ltol = math.log(loss_tolerance)
        self._reset()

    def _reset(self) -> None:
        self._n = 0
        self._uf = self._us = self._gf = self._gs = 0.0
        self._onset = -1
        self._cooldown_left = 0
        self._last_step = -1

    def _step(self, loss: float, grad: float, step: int) -> Event | None:  # type: ignore[override]
        self._last_step = step
        if loss - loss != 0.0 or grad - grad != 0.0 or loss <= 0.0 or grad <= 0.0:
            return None
        u = math.log(loss)
        g = math.log(grad)
        if self._n == 0:
            self._uf = self._us = u
            self._gf = self._gs = g
        else:
            self._uf = self._fa * u + self._fb * self._uf
            self._us = self._sa * u + self._sb * self._us
            self._gf = self._fa * g + self._fb * self._gf
            self._gs = self._sa * g + self._sb * self._gs
        self._n += 1
        dg = self._gf - self._gs
        if abs(dg) < _LN10:
            self._onset = step
        if self._cooldown_left:
            self._cooldown_left -= 1
            return None
        if self._n <= self.warmup or abs(dg) < self._gap:
            return None
        falling = self._uf - self._us <= self._ltol
        if not falling and dg > 0:
            return None
        kind = Kind.SILENT_COLLAPSE if falling else Kind.VANISHING_GRADIENT
        self._cooldown_left = self.cooldown
        moved = "collapsed" if dg < 0 else "exploded"
        trend = "keeps falling" if falling else "stopped falling"
        msg = (f"grad_norm {moved} {10 ** (abs(dg) / _LN10):.3g}x below its slow level "
               f"({math.exp(self._gf):.3g} vs {math.exp(self._gs):.3g}) while the loss {trend}"
               if dg < 0 else
               f"grad_norm exploded {10 ** (dg / _LN10):.3g}x above its slow level while the loss {trend}")
        return make_event(kind, "warning", step, self._onset, type(self).__name__, "grad_norm",
                          abs(dg) / _LN10, self.orders, msg)

    def _fast(self, arrays: Sequence[np.ndarray], steps: np.ndarray, i: int, j: int) -> int:
        if self._n <= self.warmup or self._cooldown_left:
            return 0
        with np.errstate(divide="ignore", invalid="ignore"):
            u = np.log(arrays[0][i:j])
            g = np.log(arrays[1][i:j])
        lim = first_true(~(np.isfinite(u) & np.isfinite(g)))
        if lim == 0:
            return 0
        u, g = u[:lim], g[:lim]
        gf = ewma(g, self._fa, self._fb, self._gf)
        gs = ewma(g, self._sa, self._sb, self._gs)
        dg = gf - gs
        big = np.abs(dg) >= self._gap
        k = lim
        uf: np.ndarray | None = None
        us: np.ndarray | None = None
        if big.any():
            uf = ewma(u, self._fa, self._fb, self._uf)
            us = ewma(u, self._sa, self._sb, self._us)
            falling = uf - us <= self._ltol
            k = first_true(big & (falling | (dg < 0)))
        if k:
            if uf is None:
                uf = ewma(u[:k], self._fa, self._fb, self._uf)
                us = ewma(u[:k], self._sa, self._sb, self._us)
            assert us is not None
            self._uf, self._us = float(uf[k - 1]), float(us[k - 1])
            self._gf, self._gs = float(gf[k - 1]), float(gs[k - 1])
            near = np.flatnonzero(np.abs(dg[:k]) < _LN10)
            if len(near):
                self._onset = int(steps[i + near[-1]])
            self._n += k
            self._last_step = int(steps[i + k - 1])
        return k


_LN10 = math.log(10.0)
