"""LossGradCoupling: the loss and the gradient norm stop moving together."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np

from .._events import Event, Kind, make_event
from .._validate import check_range
from ._base import Detector, Input
from ._ops import ewma, first_true

_LN10 = math.log(10.0)


class LossGradCoupling(Detector):
    """Flags silent collapse: the loss keeps falling while the grad norm collapses (or explodes).

    On ``u = log(loss)`` and ``g = log(grad_norm)`` the detector keeps smoothed levels (EWMA,
    weight ``alpha``) and compares each with its own value ``lag`` values earlier (``du``,
    ``dg``) and ``span`` values earlier. It fires ``silent_collapse`` when

    * the grad norm **decoupled** from a loss that did not rise (``du <= log(loss_tolerance)``):
      it rose ``orders`` decades (``dg >= orders * ln 10``: a healthy run's grad norm drifts
      far less in ``lag`` steps), or fell ``orders`` decades more than the loss did — the
      loss looks fine while the gradients died (or blew up); a classifier fitting its data
      drives loss and gradient down together, which is coupled;
    * or loss and grad norm **collapsed together**, too fast to be learning: over the last
      ``span`` values both levels fell at least ``orders`` decades, and the loss is ``orders``
      decades below its level ``lag`` values earlier (or its first level) too, so a loss that
      comes back down after a blow-up does not count. A model that found one
      safe answer (every label the majority class, a constant target) drives its loss and its
      gradients toward zero within a few dozen steps; a healthy run that memorises its data
      gets there gradually, well under a decade per ``span`` steps. This rule needs only
      ``span`` values, so it also watches the first ``lag`` steps, where a collapse to the
      majority class happens while the loss is still near chance.

    If the grad norm fell ``orders`` decades over ``lag`` values while the loss rose instead, it
    is ``vanishing_gradient``. A grad-norm *explosion* with a rising loss is left to
    :class:`EWMAZSpike` on the grad norm. Both are warnings; ``onset_step`` is the first step of
    the held ``lag`` values at which the grad level had left its starting value by a quarter
    of a decade (for a fall: fell a quarter of a decade below its highest level so far, so an
    early rise does not count). After an event the detector stays quiet until the movement
    has cleared (``|dg|`` and the fall over ``span`` back under the threshold), so one collapse
    is one event; no event before ``span`` values were seen, and none of the ``lag`` rules
    before ``lag`` values.

    A loss or grad norm of exactly 0 (a cross-entropy that underflowed once the model put all
    its confidence on one answer, gradients that vanished outright) counts as the lowest
    smoothed level the detector holds for that signal: at least as low as anything the run
    produced lately, so a collapse that ends at 0 keeps being watched. Negative and non-finite
    values are skipped.

    Args:
        lag: span, in values, over which the levels are compared, >= 2.
        alpha: weight of the smoothed levels, in (0, 1].
        orders: decades of grad-norm movement that fire, > 0.
        loss_tolerance: how much the loss may have risen and still count as "not rising", >= 1.
        span: the short span, in values, of a joint collapse of loss and grad norm, in
            [2, lag]; ``None``: two fifths of ``lag`` (100 values for the default ``lag``).

    Example:
        The loss falls smoothly while the grad norm decays by 3 decades from step 200 to 350:

        >>> import numpy as np
        >>> t = np.arange(500)
        >>> loss = 2.0 * np.exp(-t / 300)
        >>> grad = np.maximum(np.where(t < 200, 1.0, 10.0 ** (-(t - 200) / 50)), 1e-3)
        >>> [(e.kind.value, e.step, e.onset_step) for e in LossGradCoupling().scan(loss=loss, grad_norm=grad)]
        [('silent_collapse', 303, 221)]

        A loss near chance that drops 1000-fold in 40 steps from step 150, its grad norm
        100-fold (every label switched to one class):

        >>> rng = np.random.default_rng(0)
        >>> t = np.arange(400)
        >>> drop = np.clip((t - 150) / 40, 0, 1)
        >>> loss = 2.3 * 10.0 ** (-3 * drop) * np.exp(rng.normal(0, 0.05, 400))
        >>> grad = 10.0 ** (-2 * drop) * np.exp(rng.normal(0, 0.1, 400))
        >>> [(e.kind.value, e.step, e.onset_step) for e in LossGradCoupling().scan(loss=loss, grad_norm=grad)]
        [('silent_collapse', 189, 161)]
    """

    inputs = (Input("loss"), Input("grad_norm"))
    _state_keys = ("n", "u", "g", "us", "gs", "ss", "armed", "last_step")

    def __init__(
        self,
        lag: int = 250,
        alpha: float = 0.1,
        orders: float = 1.5,
        loss_tolerance: float = 1.05,
        span: int | None = None,
    ) -> None:
        check_range("lag", lag, 2, None, integer=True)
        check_range("alpha", alpha, 0, 1, lo_open=True)
        check_range("orders", orders, 0, None, lo_open=True)
        check_range("loss_tolerance", loss_tolerance, 1, None)
        if span is not None:
            check_range("span", span, 2, lag, integer=True)
        self.lag = lag
        self.alpha = alpha
        self.orders = orders
        self.loss_tolerance = loss_tolerance
        self.span = span
        self._span = max(2, 2 * lag // 5) if span is None else span
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

    def _step(self, loss: float, grad: float, step: int) -> Event | None:
        self._last_step = step
        if loss - loss != 0.0 or grad - grad != 0.0 or loss < 0.0 or grad < 0.0:
            return None
        if loss == 0.0 or grad == 0.0:  # underflowed: at least as low as the lowest level held
            if not self._us:
                return None
            u = math.log(loss) if loss else min(self._us)
            g = math.log(grad) if grad else min(self._gs)
        else:
            u = math.log(loss)
            g = math.log(grad)
        if self._n:
            u = self._a * u + self._b * self._u
            g = self._a * g + self._b * self._g
        self._u = u
        self._g = g
        self._n += 1
        gs = self._gs
        self._us.append(u)
        gs.append(g)
        self._ss.append(step)
        if len(gs) <= self._span:
            return None
        gap = self._gap
        j = -self._span - 1
        dg = g - gs[0]
        if -gap < dg < gap and g - gs[j] > -gap:  # the common case: nothing moved that far
            self._armed = True
            return None
        ds = g - gs[j]
        moved = abs(dg) >= gap  # before lag values, against the first level held
        if not moved and ds > -gap:
            self._armed = True
            return None
        if not self._armed:
            return None
        big = moved and len(gs) > self.lag
        if not big and ds > -gap:
            return None
        if big:
            du = u - self._us[0]
            falling = du <= self._ltol
            if dg > 0:
                if falling:
                    return self._event(step, dg, du, True, False)
            elif not falling:
                return self._event(step, dg, du, False, False)
            elif -dg - max(0.0, -du) >= gap:
                return self._event(step, dg, du, True, False)  # the grad norm fell orders more than the loss
        dus = u - self._us[j]
        if ds <= -gap and dus <= -gap and u - self._us[0] <= -gap:
            return self._event(step, ds, dus, True, True)
        return None  # the grad norm fell with the loss, at a learning pace (e.g. a classifier fitting its data)

    def _event(self, step: int, dg: float, du: float, falling: bool, together: bool) -> Event:
        self._armed = False
        onset = self._onset(dg < 0)
        kind = Kind.SILENT_COLLAPSE if falling else Kind.VANISHING_GRADIENT
        factor = math.exp(abs(dg))
        if together:
            msg = (f"loss and grad_norm collapsed together in {self._span} steps (since step {onset}): the loss fell "
                   f"{math.exp(-du):.3g}x and the grad norm {factor:.3g}x, too fast for learning: "
                   "the model may have collapsed to one answer (labels of one class?)")
            return make_event(kind, "warning", step, onset, type(self).__name__, "loss",
                              min(-du, -dg) / _LN10, self.orders, msg)
        trend = (f"the loss still fell {-100 * math.expm1(du):.3g}%" if du < 0 else
                 f"the loss changed {100 * math.expm1(du):+.2g}%")
        moved = "collapsed" if dg < 0 else "exploded"
        msg = (f"grad_norm {moved} {factor:.3g}x in {self.lag} steps (since step {onset}) while {trend}: "
               + ("loss and gradients have decoupled" if falling else "the gradients are dying"))
        return make_event(kind, "warning", step, onset, type(self).__name__, "grad_norm",
                          abs(dg) / _LN10, self.orders, msg)

    def _onset(self, fell: bool) -> int:
        """The first step of the held span at which the grad level left its start (for a fall:
        its highest level so far) by a quarter of a decade.
        """
        q = 0.25 * _LN10
        ref = self._gs[0]
        for gv, sv in zip(self._gs, self._ss):
            if fell:
                if gv > ref:
                    ref = gv
                elif ref - gv >= q:
                    return sv
            elif gv - ref >= q:
                return sv
        return self._ss[-1]

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
        o = self.lag + 1 - self._span  # and index c+o is span values back
        ds = gg - gext[o:o + lim]
        big = np.abs(dg) >= self._gap
        drop = ds <= -self._gap
        k = lim
        if not self._armed:  # disarmed: the next thing to happen is the re-arm
            k = first_true(~(big | drop))
        elif big.any() or drop.any():
            uext = np.concatenate((np.asarray(self._us), uu))
            du = uu - uext[1:lim + 1]
            falling = du <= self._ltol
            coupled = -dg - np.maximum(0.0, -du) < self._gap
            together = drop & (uu - uext[o:o + lim] <= -self._gap) & (du <= -self._gap)
            k = first_true((big & np.where(dg > 0, falling, ~falling | ~coupled)) | together)
        if k:
            self._u, self._g = float(uu[k - 1]), float(gg[k - 1])
            m = self.lag + 1
            self._us.extend(uu[max(0, k - m):k].tolist())
            self._gs.extend(gg[max(0, k - m):k].tolist())
            self._ss.extend(steps[i + max(0, k - m):i + k].tolist())
            self._n += k
            self._last_step = int(steps[i + k - 1])
        return k
