"""The smoothed loss and grad-norm levels the coupling rules compare, kept once for both.

:class:`~trainsignals.GradLossDecoupling` and :class:`~trainsignals.JointCollapse` each hold
the levels their rule reads through this base class: the EWMA (weight ``alpha``) of
``u = log(loss)`` and ``g = log(grad_norm)``, the last ``lag + 1`` of each, the re-arm rule
and the onset search they share, and the vectorised advance of their batch path.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from .._events import Event
from .._validate import check_range
from ._base import Detector, Input
from ._interval import MIN_VALUES
from ._ops import NEVER, column_log, first_true, first_unusable, log, shared_ewma

#: natural log of 10: decades to log units
LN10 = math.log(10.0)
#: the state every coupling rule keeps (a rule adds its own keys to these)
COUPLING_KEYS: tuple[str, ...] = ("n", "u", "g", "us", "gs", "ss", "armed", "cooldown_until", "last_step")
#: how far the grad level must leave its reference for the onset: a quarter of a decade, well
#: above the step-to-step wobble of a smoothed healthy grad norm, well below ``orders``
_ONSET_DECADES = 0.25


class CouplingLevels(Detector):
    """Base of the coupling rules: smoothed log levels of loss and grad norm, and the re-arm.

    After an event a rule stays quiet until the grad level holds still again: it moved less
    than ``orders`` decades over the last ``lag`` values and fell less than that over the
    rule's short span (``span`` values; for a rule without one, the ``lag``), so one collapse is
    one event; and for ``cooldown`` steps in any case. A loss
    or grad norm of exactly 0 counts as the lowest smoothed level held for that signal;
    negative and non-finite values are skipped. A rule implements :meth:`_rule` (the decision at
    a step where it may fire) and, for the batch path, ``_hits``.
    """

    inputs: tuple[Input, ...] = (Input("loss"), Input("grad_norm"))
    logs = ("loss", "grad_norm")
    _state_keys: ClassVar[tuple[str, ...]] = COUPLING_KEYS
    spans = {"lag": MIN_VALUES}
    rates = ("alpha",)

    def _setup(self, lag: int, alpha: float, orders: float, cooldown: int, span: int) -> None:
        check_range("lag", lag, 2, None, integer=True)
        check_range("alpha", alpha, 0, 1, lo_open=True)
        check_range("orders", orders, 0, None, lo_open=True)
        check_range("cooldown", cooldown, 0, None, integer=True)
        self.lag = lag
        self.alpha = alpha
        self.orders = orders
        self.cooldown = cooldown
        self._span = span
        self._a, self._b = float(alpha), 1.0 - float(alpha)
        self._gap = orders * LN10
        self._reset()

    def _reset(self) -> None:
        self._n = 0
        self._u = self._g = 0.0
        self._us: deque[float] = deque(maxlen=self.lag + 1)
        self._gs: deque[float] = deque(maxlen=self.lag + 1)
        self._ss: deque[int] = deque(maxlen=self.lag + 1)
        self._armed = True
        self._cooldown_until = NEVER
        self._last_step = -1

    def _set_state(self, state: dict[str, Any]) -> None:
        super()._set_state(state)
        m = self.lag + 1
        self._us = deque(state["us"], maxlen=m)
        self._gs = deque(state["gs"], maxlen=m)
        self._ss = deque(state["ss"], maxlen=m)

    def _take(self, loss: float, grad: float, step: int, log_loss: float | None = None,
              log_g: float | None = None) -> Event | None:
        """Take one step's values (and their logs, when taken) into the levels; then, where the rule may
        fire at this step (armed, past the cooldown, the grad level moved), :meth:`_rule` decides.

        A rule's ``_step`` is this (its inputs are the two signals) or calls it (a rule that reads more).
        """
        self._last_step = step
        if loss > 0.0 and grad > 0.0 and loss - loss == 0.0 and grad - grad == 0.0:
            u = log(loss) if log_loss is None else log_loss
            g = log(grad) if log_g is None else log_g
        elif loss - loss != 0.0 or grad - grad != 0.0 or loss < 0.0 or grad < 0.0 or not self._us:
            return None
        else:  # underflowed: at least as low as the lowest level held
            u = log(loss) if loss else min(self._us)
            g = log(grad) if grad else min(self._gs)
        n = self._n
        if n:
            a, b = self._a, self._b
            u = a * u + b * self._u
            g = a * g + b * self._g
        self._u, self._g, self._n = u, g, n + 1
        gs = self._gs
        self._us.append(u)
        gs.append(g)
        self._ss.append(step)
        if len(gs) <= self._span:
            return None
        gap = self._gap
        if -gap < g - gs[0] < gap and g - gs[-self._span - 1] > -gap:  # the grad level holds: re-arm
            self._armed = True
            return None
        return self._rule(step) if self._armed and step > self._cooldown_until else None

    def _fired(self, step: int) -> None:
        self._armed = False
        self._cooldown_until = step + self.cooldown

    def _onset(self, fell: bool) -> int:
        """The first step of the held span at which the grad level left its start (for a fall:
        its highest level so far) by a quarter of a decade.
        """
        q = _ONSET_DECADES * LN10
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

    def _hits(self, uu: np.ndarray, gg: np.ndarray, uext: np.ndarray, gext: np.ndarray,
              first: np.ndarray, back: np.ndarray) -> np.ndarray:
        """Batch twin of the rule: where it fires, for levels ``uu``, ``gg`` after ``uext``, ``gext``.

        ``uext``/``gext`` are the held levels followed by the new ones; ``first`` and ``back`` index
        them at each new value: the oldest level held then (``_us[0]``) and the one ``span`` values
        back (``_us[-span - 1]``).
        """
        raise NotImplementedError

    def _rule(self, step: int) -> Event | None:
        """The rule at a step where it may fire, on the levels just taken."""
        raise NotImplementedError

    def _fast(self, arrays: Sequence[np.ndarray], steps: np.ndarray, i: int, j: int) -> int:
        if not self._n:  # the first value is the level itself: the scalar path
            return 0
        u, g = column_log(arrays[0], i, j), column_log(arrays[1], i, j)
        lim = min(first_unusable(arrays[0], i, j, positive=True), first_unusable(arrays[1], i, j, positive=True))
        if lim == 0:
            return 0
        uu = shared_ewma(arrays[0], i, "log", u[:lim], self._a, self._b, self._u)
        gg = shared_ewma(arrays[1], i, "log", g[:lim], self._a, self._b, self._g)
        gext = np.concatenate((np.asarray(self._gs), gg))
        m = self.lag + 1
        pos = np.arange(len(self._gs), len(self._gs) + lim)  # each new level's index in gext
        first = np.maximum(pos + 1 - m, 0)  # the ring (m levels) after taking it starts here
        back = np.maximum(pos - self._span, 0)  # span values back (where the ring holds that many)
        young = pos < self._span  # the ring holds span levels or fewer: no re-arm, no rule
        calm = (np.abs(gg - gext[first]) < self._gap) & (gg - gext[back] > -self._gap) & ~young
        if not self._armed:  # disarmed: the next thing to happen is the re-arm
            k = first_true(calm)
        else:  # armed: only a step where the grad level moved can fire
            live = ~calm & ~young & (steps[i:i + lim] > self._cooldown_until)
            k = first_true(live & self._hits(uu, gg, np.concatenate((np.asarray(self._us), uu)), gext, first, back)) \
                if live.any() else lim
        if k:
            self._u, self._g = float(uu[k - 1]), float(gg[k - 1])
            self._us.extend(uu[max(0, k - m):k].tolist())
            self._gs.extend(gg[max(0, k - m):k].tolist())
            self._ss.extend(steps[i + max(0, k - m):i + k].tolist())
            self._n += k
            self._last_step = int(steps[i + k - 1])
        return k


__all__ = ["COUPLING_KEYS", "LN10", "CouplingLevels"]
