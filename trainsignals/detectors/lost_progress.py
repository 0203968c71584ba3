"""LostProgress: the loss climbed back and sits far above the best level it had reached."""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from .._events import Event, Kind, make_event
from .._validate import check_range, check_signal
from ._base import Detector, Input, Knob
from ._factors import mean_or_inf, times
from ._ops import NEVER, column_log, first_unusable, log, shared_ewma
from ._trend import NOISE_PER_SD

#: share of the lost-progress rise above ``best`` at which the level counts as climbing (and
#: below which a reported climb re-arms): half, so a level near the threshold does not flicker
_CLIMB_SHARE = 0.5
#: the rule's state keys (a subclass that adds state lists them before its own)
LOST_KEYS = ("buf", "level", "best", "start", "low", "climb", "reported", "cooldown_until", "last_step")


class LostProgress(Detector):
    """Flags a loss that jumped or drifted up and stays there: the run lost its progress.

    A learning-rate blow-up that kills the network leaves a noisy plateau at or above the initial loss instead of a
    climb. On ``y = log(x)``, with ``level`` the EWMA of ``y`` (weight ``2 / (window + 1)``) and ``best`` its lowest
    value so far, the rule fires when the median of the last ``window`` values is at least ``max(lost, z * sd)``
    above ``best``, and ``level`` itself is ``lost`` above ``best``. ``lost`` is the share ``frac`` of the progress
    the run had made (``start - low``: the level once the first ``window`` values are in, less the lowest level
    since), capped at ``log(ratio)`` and at least ``log(min_ratio)``: a run that fell from 2.3 to 1.9 and is back at
    2.3 lost all its progress though its loss rose by only 1.2x; a run with less progress than ``log(min_ratio)`` is
    judged by ``ratio`` alone. ``sd`` is the window's noise scale (the mean absolute second difference of its values
    over ``sqrt(12/pi)``, its value for white noise): the median keeps a short burst from counting.

    The event is a critical ``divergence``; ``onset_step`` is the step at which ``level`` last rose more than
    ``lost / 2`` above ``best``. After an event the rule is quiet for ``cooldown`` steps, and it re-arms only
    once ``level`` has come back within ``lost / 2`` of ``best`` (one report per climb). Non-positive and
    non-finite values are skipped. **Rate**: ``lost_progress`` 0 alarms in 304,819 tuning healthy steps, 9 in
    879,581 held-out ones (1,478 runs; ``calibration.json``; budget 0.5 per 10,000).

    Args:
        window: values in the median and the noise scale (and the level's span), >= 5.
        ratio: largest rise above the best level that is needed, as a factor, > 1.
        z: how many noise standard deviations the rise must also exceed, >= 0.
        frac: share of the run's progress whose loss counts as lost progress, in (0, 1].
        min_ratio: smallest progress, and smallest rise, as factors, for the ``frac`` judgement, in (1, ratio].
        cooldown: steps without events after an event, >= 0.
        signal: the signal it reads (and names in its events).

    Example:
        A network killed at step 300 by a learning-rate blow-up: the loss bursts to 1e4, then
        sits on a noisy plateau at 2.3, six times its level before, and climbs no further:

        >>> import numpy as np
        >>> rng = np.random.default_rng(0)
        >>> loss = 2.3 * np.exp(-np.arange(600) / 60) + 0.4
        >>> loss[300:] = 2.3
        >>> loss[300:303] = [50.0, 1e4, 300.0]
        >>> loss *= np.exp(rng.normal(0, 0.1, 600))
        >>> [(e.step, e.onset_step, e.message.split(":")[0]) for e in LostProgress().scan(loss=loss)]
        [(318, 300, 'loss lost its progress')]
    """

    knob: ClassVar[Knob | None] = Knob("z", 1.0, 30.0)
    _units = "log"  # the rule's units (a subclass may judge the values themselves: ``"value"``)
    _state_keys: ClassVar[tuple[str, ...]] = LOST_KEYS

    def __init__(self, window: int = 20, ratio: float = 2.0, z: float = 3.0, frac: float = 0.5,
                 min_ratio: float = 1.1, cooldown: int = 100, signal: str = "loss") -> None:
        check_range("window", window, 5, None, integer=True)
        check_range("ratio", ratio, 1, None, lo_open=True)
        check_range("z", z, 0, None)
        check_range("frac", frac, 0, 1, lo_open=True)
        check_range("min_ratio", min_ratio, 1, ratio, lo_open=True)
        check_range("cooldown", cooldown, 0, None, integer=True)
        check_signal("signal", signal)
        self.window, self.ratio, self.z, self.frac, self.min_ratio = window, ratio, z, frac, min_ratio
        self.cooldown, self.signal = cooldown, signal
        self.inputs, self.logs = (Input(signal),), (signal,)
        self._lost, self._lmin = math.log(ratio), math.log(min_ratio)
        self._half_lmin = _CLIMB_SHARE * self._lmin
        self._lz = z / NOISE_PER_SD
        self._logged = self._units == "log"
        self._la = 2.0 / (window + 1.0)  # the EWMA weight whose mean age is that of the window
        self._lb = 1.0 - self._la
        self._reset()

    def _reset(self) -> None:
        self._buf: deque[float] = deque(maxlen=self.window)  # the last window log values
        self._level = self._best = 0.0
        self._start = self._low = math.inf  # the level once the first window is in, the lowest since (inf: not yet)
        self._climb = -1  # the step the level began climbing (-1: not climbing)
        self._reported = False  # this climb was reported
        self._cooldown_until, self._last_step = NEVER, -1

    def _set_state(self, state: dict[str, Any]) -> None:
        super()._set_state(state)
        self._buf = deque(self._buf, maxlen=self.window)

    def _need(self) -> float:
        """The rise above ``best`` that counts as lost progress (before the noise term)."""
        prog = self._start - self._low  # not finite before the first window: ratio alone
        return self._lost if not prog >= self._lmin else min(max(self.frac * prog, self._lmin), self._lost)

    def _needs(self, prog: np.ndarray) -> np.ndarray:
        return np.where(prog < self._lmin, self._lost, np.clip(self.frac * prog, self._lmin, self._lost))

    def _noise_bar(self, win: Sequence[float]) -> float:  # z * sd: sd from the mean absolute second difference
        w = list(win)
        return self._lz * mean_or_inf([abs(c - 2.0 * b + a) for a, b, c in zip(w, w[1:], w[2:])])

    def _lost_ok(self, win: Sequence[float], best: float, lost: float, prog: float, at: int = -1) -> bool:
        """Whether the median is ``lost`` and the noise bar above ``best`` (``prog``: the progress; ``at``: block place)."""
        return (rise := statistics.median(win) - best) >= lost and rise >= self._noise_bar(win)

    def _step(self, x: float, step: int, log_x: float | None = None) -> Event | None:
        self._last_step = step
        if x - x != 0.0 or x <= 0.0 and self._logged:  # skipped: not finite, or no log
            return None
        y = (log(x) if log_x is None else log_x) if self._logged else x
        buf = self._buf
        level = self._la * y + self._lb * self._level if buf else y
        if not buf:
            self._best = y
        self._level = level
        best = self._best
        if level < self._low:
            self._low = level
        lost = self._need() if level > best + self._half_lmin else self._lost  # below: not climbing
        climbing = level > best + _CLIMB_SHARE * lost
        if climbing:
            if self._climb < 0:
                self._climb = step
        else:
            if level < best:
                best = self._best = level
            if self._climb >= 0:  # a calm step ends a climb (and its report)
                self._climb, self._reported = -1, False
        if len(buf) == self.window - 1:  # the first window is in: the run's starting level
            self._start = self._low = level
        buf.append(y)
        if (step > self._cooldown_until and climbing and level - best >= lost and len(buf) == self.window
                and not self._reported and self._lost_ok(buf, best, lost, self._start - self._low)):
            return self._event(step, statistics.median(buf) - best)
        return None

    def _how_far(self, rise: float) -> str:  # the rise above the best level, in words
        return f"{times(rise)}x its best level"

    def _event(self, step: int, rise: float) -> Event:
        self._cooldown_until, self._reported = step + self.cooldown, True
        msg = (f"{self.signal} lost its progress: the median of its last {self.window} values is "
               f"{self._how_far(rise)}, climbing since step {self._climb}")
        return make_event(Kind.DIVERGENCE, "critical", step, self._climb, type(self).__name__, self.signal,
                          rise, self._need(), msg)

    def _fast(self, arrays: Sequence[np.ndarray], steps: np.ndarray, i: int, j: int) -> int:
        w = self.window
        if len(self._buf) < w:
            return 0
        logged = self._logged
        lim = first_unusable(arrays[0], i, j, positive=logged)
        if lim == 0:
            return 0
        y = column_log(arrays[0], i, i + lim) if logged else arrays[0][i:i + lim]
        ext = np.concatenate((np.asarray(self._buf), y))
        st = steps[i:i + lim]
        level = shared_ewma(arrays[0], i, self._units, y, self._la, self._lb, self._level)
        best = np.minimum.accumulate(np.minimum(level, self._best))
        low = np.minimum.accumulate(np.minimum(level, self._low))
        lost = self._needs(self._start - low)
        with np.errstate(over="ignore", invalid="ignore"):  # a signed loss near the float range: inf, as per step
            calm_mask = level <= best + _CLIMB_SHARE * lost
            cand = (st > self._cooldown_until) & ~calm_mask & (level - best >= lost)
        if self._reported:
            cand &= np.cumsum(calm_mask) > 0
        k = lim
        for c in np.flatnonzero(cand).tolist():
            if self._lost_ok(ext[c + 1:c + w + 1].tolist(), float(best[c]), float(lost[c]), self._start - low[c], c):
                k = int(c)
                break
        if k:
            self._buf = deque(ext[k:k + w].tolist(), maxlen=w)
            self._last_step = int(st[k - 1])
            self._level, self._best, self._low = float(level[k - 1]), float(best[k - 1]), float(low[k - 1])
            calm = np.flatnonzero(calm_mask[:k])
            if len(calm):  # a calm step: the climb ended there (and one may have begun after it)
                self._reported = False
                self._climb = -1 if calm[-1] == k - 1 else int(st[calm[-1] + 1])
            elif self._climb < 0:
                self._climb = int(st[0])
        return k


__all__ = ["LostProgress"]
