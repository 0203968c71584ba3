"""GradLossDecoupling: the grad norm moved orders of magnitude while the loss did not follow."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from .._events import Event, Kind, make_event
from .._validate import check_range
from ._base import Knob
from ._coupling import COUPLING_KEYS, LN10, CouplingLevels
from ._factors import expm1_or_inf, times
from ._learning import LEARN_KEYS, LearningOnset
from ._ops import first_unusable


class GradLossDecoupling(LearningOnset, CouplingLevels):
    """Flags a grad norm that decoupled from the loss: it collapsed (or exploded) on its own.

    On ``u = log(loss)`` and ``g = log(grad_norm)`` the rule keeps smoothed levels (EWMA,
    weight ``alpha``) and compares each with its own value ``lag`` values earlier (``du``,
    ``dg``). With the loss not rising (``du <= log(loss_tolerance)``) it fires
    ``silent_collapse`` when the grad norm rose ``orders`` decades (``dg >= orders * ln 10``:
    a healthy run's grad norm drifts far less in ``lag`` steps) from a level it held once the run
    had begun to learn (an untrained network's grad norm rises as it escapes its initial plateau:
    :mod:`~trainsignals.detectors._learning`), or fell ``orders`` decades
    more than the loss did: the loss looks fine while the gradients died (or blew up). A
    classifier fitting its data drives loss and gradient down together, which is coupled. If
    the grad norm fell ``orders`` decades while the loss rose instead, it fires
    ``vanishing_gradient``. A grad-norm explosion with a rising loss is left to
    :class:`~trainsignals.EWMAZSpike` on the grad norm. No event before ``lag`` values.

    Both are warnings; ``onset_step`` is the first step of the held ``lag`` values at which the
    grad level had left its starting value by a quarter of a decade (for a fall: fell a quarter
    of a decade below its highest level so far, so an early rise does not count). After an event
    the rule re-arms once the grad level holds still (see
    :class:`~trainsignals.detectors._coupling.CouplingLevels`), and is quiet for ``cooldown``
    steps in any case.

    **Rate**: ``grad_decoupling`` 0 alarms in 304,819 steps of the tuning suites' healthy runs at its defaults
    (``calibration.json``; budget 0.5 per 10,000 steps).
    **Held out**: ``grad_decoupling`` 0 alarms in 879,581 steps of 1,478 held-out healthy runs
    (``calibration.json``).

    Args:
        lag: span, in values, over which the levels are compared, >= 2.
        alpha: weight of the smoothed levels, in (0, 1].
        orders: decades of grad-norm movement that fire, > 0.
        loss_tolerance: how much the loss may have risen and still count as "not rising", >= 1.
        cooldown: steps without events after an event, >= 0.

    Example:
        The loss falls smoothly while the grad norm decays by 3 decades from step 200 to 350:

        >>> import numpy as np
        >>> t = np.arange(500)
        >>> loss = 2.0 * np.exp(-t / 300)
        >>> grad = np.maximum(np.where(t < 200, 1.0, 10.0 ** (-(t - 200) / 50)), 1e-3)
        >>> [(e.kind.value, e.step, e.onset_step) for e in GradLossDecoupling().scan(loss=loss, grad_norm=grad)]
        [('silent_collapse', 303, 221)]
    """

    knob = Knob("orders", 0.5, 5.0)

    def __init__(self, lag: int = 250, alpha: float = 0.1, orders: float = 1.5,
                 loss_tolerance: float = 1.05, cooldown: int = 0) -> None:
        check_range("loss_tolerance", loss_tolerance, 1, None)
        self.loss_tolerance = loss_tolerance
        self._ltol = math.log(loss_tolerance)
        self._setup(lag, alpha, orders, cooldown, lag)

    _state_keys = (*COUPLING_KEYS, *LEARN_KEYS)

    def _reset(self) -> None:
        super()._reset()
        self._learn_reset()

    def _step(self, loss: float, grad: float, step: int, log_loss: float | None = None,
              log_g: float | None = None) -> Event | None:
        ev = self._take(loss, grad, step, log_loss, log_g)
        if self._learning < 0 and self._n:  # the loss level just taken (the rule's own)
            self._learn_level(self._u, self._n - 1)
        return ev

    def _rule(self, step: int) -> Event | None:
        dg = self._g - self._gs[0]
        if abs(dg) < self._gap:
            return None
        du = self._u - self._us[0]
        falling = du <= self._ltol
        if dg > 0:  # a rise from a level held since the run began to learn
            return self._event(step, dg, du, True) if falling and self._learned(self._n - len(self._gs)) else None
        if not falling:
            return self._event(step, dg, du, False)
        if -dg - max(0.0, -du) >= self._gap:  # the grad norm fell orders more than the loss
            return self._event(step, dg, du, True)
        return None  # the grad norm fell with the loss (e.g. a classifier fitting its data)

    def _hits(self, uu: np.ndarray, gg: np.ndarray, uext: np.ndarray, gext: np.ndarray,
              first: np.ndarray, back: np.ndarray) -> np.ndarray:
        dg = gg - gext[first]
        du = uu - uext[first]
        falling = du <= self._ltol
        coupled = -dg - np.maximum(0.0, -du) < self._gap
        at = self._learning if self._learning >= 0 else self._ahead  # the onset of learning (-1: not in sight)
        learned = (at >= 0) & (self._n - len(self._gs) + first >= at)
        return (np.abs(dg) >= self._gap) & np.where(dg > 0, falling & learned, ~falling | ~coupled)

    def _fast(self, arrays: Sequence[np.ndarray], steps: np.ndarray, i: int, j: int) -> int:
        seen = self._n
        if self._n and self._learning < 0:  # where in the block the run begins to learn, if it does
            lim = min(first_unusable(arrays[0], i, j, positive=True), first_unusable(arrays[1], i, j, positive=True))
            self._onset_ahead(arrays[0], i, lim, seen, self._a, self._u)
        k = super()._fast(arrays, steps, i, j)
        self._learn_keep(k, seen)
        return k

    def _event(self, step: int, dg: float, du: float, falling: bool) -> Event:
        self._fired(step)
        onset = self._onset(dg < 0)
        kind = Kind.SILENT_COLLAPSE if falling else Kind.VANISHING_GRADIENT
        trend = (f"the loss still fell {-100 * math.expm1(du):.3g}%" if du < 0 else
                 f"the loss changed {100 * expm1_or_inf(du):+.2g}%")
        moved = "collapsed" if dg < 0 else "exploded"
        msg = (f"grad_norm {moved} {times(abs(dg))}x over {self.lag} values (since step {onset}) while "
               f"{trend}: " + ("loss and gradients have decoupled" if falling else "the gradients are dying"))
        return make_event(kind, "warning", step, onset, type(self).__name__, "grad_norm",
                          abs(dg) / LN10, self.orders, msg)


__all__ = ["GradLossDecoupling"]
