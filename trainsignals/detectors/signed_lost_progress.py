"""SignedLostProgress: a loss that goes below zero climbed back and gave up its progress."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from .._events import Event
from ._base import Knob
from ._ops import before_first_negative
from .lost_progress import LOST_KEYS, LostProgress

#: a block of values this many times as noisy as the run's blocks so far is a bad batch, not the run's
#: noise: it counts at that many times (a cap of an order of magnitude, not chosen on any run)
BLOCK_CAP = 10.0


def _fold(total: float, count: int, block: list[float]) -> float:
    """``total`` (the sum of ``count`` capped block means) with ``block``'s mean folded in, capped (a mean
    that overflowed counts at the cap, or as 0 without a block before it).
    """
    m = sum(block) / len(block)
    if count and total > 0.0:
        return total + (m if m <= BLOCK_CAP * total / count else BLOCK_CAP * total / count)
    return total + (m if m - m == 0.0 else 0.0)


class SignedLostProgress(LostProgress):
    """Flags a loss that takes negative values and gave back a share of its progress, in its own units.

    :class:`LostProgress` judges ``log(loss)``, where a rise is a ratio; a loss that goes below
    zero (a policy loss, a negated return, the NLL of a continuous density) has no log, and a
    return that collapses from -2 to -0.5 never shows there. This rule is idle until the first
    finite negative value; from there it takes :class:`LostProgress`'s rule on the values
    themselves: with ``level`` the EWMA of the loss (weight ``2 / (window + 1)``) and ``best``
    its lowest value so far, it fires when the median of the last ``window`` values is at
    least ``max(lost, z * sd)`` above ``best`` and ``level`` is ``lost`` above it, where
    ``lost`` is the share ``frac`` of the progress the run had made (``start - low``: the level
    once the first ``window`` values are in, less the lowest level since). A run that made no
    progress has none to lose: the rule waits, and progress no larger than ``z`` times the run's
    noise scale is none (a policy loss that sits at zero by design, logged to four decimals,
    "progresses" by a rounding step). The run's noise scale: from the first negative value on, the
    mean absolute second difference of each block of ``window`` values, averaged over the blocks
    with each block capped at :data:`BLOCK_CAP` times the average so far (so one bad batch does not
    raise it for the rest of the run), over ``NOISE_PER_SD``. ``sd`` is the window's noise scale, as for
    :class:`LostProgress`; onset, cooldown and re-arm are its too.

    The event is a critical ``divergence``. **Rate:** not calibrated (no knob): the tuning
    suites hold no healthy run with a negative loss; on the healthy signed losses drawn fresh
    by ``tests/test_signed_loss.py`` it raises nothing.

    Args:
        window: values in the median and the noise scale (and the level's span), >= 5.
        z: how many noise standard deviations the rise must also exceed, >= 0.
        frac: share of the run's progress whose loss counts as lost progress, in (0, 1].
        cooldown: steps without events after an event, >= 0.
        signal: the signal it reads (and names in its events).

    Example:
        A negated return that improves from -0.2 to -2, then collapses back to -0.5 at step 500:

        >>> import numpy as np
        >>> rng = np.random.default_rng(0)
        >>> t = np.arange(800)
        >>> loss = -0.2 - 1.8 * (1 - np.exp(-t / 100)) + rng.normal(0, 0.05, 800)
        >>> loss[500:] += 1.5
        >>> [(e.step, e.onset_step, e.kind.value) for e in SignedLostProgress().scan(loss=loss)]
        [(510, 503, 'divergence')]
        >>> SignedLostProgress().scan(loss=np.exp(loss))   # a positive loss: LostProgress's business
        []
    """

    # the noise scale's state in slots: the instance keeps CPython's fast attribute layout (29 at most)
    __slots__ = ("_nsum", "_ncount", "_part", "_blk")
    knob: ClassVar[Knob | None] = None
    _units = "value"
    _state_keys: ClassVar[tuple[str, ...]] = (*LOST_KEYS, "signed", "nsum", "ncount", "part")

    def __init__(self, window: int = 20, z: float = 3.0, frac: float = 0.5, cooldown: int = 100,
                 signal: str = "loss") -> None:
        super().__init__(window=window, z=z, frac=frac, cooldown=cooldown, signal=signal)
        self.logs = ()
        self._lost = math.inf  # no cap: a rise in loss units is judged by the progress alone
        self._lmin = self._half_lmin = 0.0

    def _reset(self) -> None:
        super()._reset()
        self._signed = False  # a negative value was seen: the rule watches from it on
        # the absolute second differences since then: their whole blocks' capped means (sum, count), the
        # block under way; in a batch block, the sum and count after each value
        self._nsum, self._ncount = 0.0, 0
        self._part: list[float] = []
        self._blk: tuple[np.ndarray, np.ndarray] | None = None

    def _step(self, x: float, step: int, log_x: float | None = None) -> Event | None:
        if not self._signed:
            if not (x < 0.0 and x > -math.inf):  # positive, zero or not finite: LostProgress's domain
                self._last_step = step
                return None
            self._signed = True
        if x - x == 0.0 and len(buf := self._buf) >= 2:
            d = abs(x - 2.0 * buf[-1] + buf[-2])
            if d - d == 0.0:  # overflowed (values near the float range): says nothing of the noise
                self._part.append(d)
                if len(self._part) == self.window:
                    self._nsum = _fold(self._nsum, self._ncount, self._part)
                    self._ncount, self._part = self._ncount + 1, []
        return super()._step(x, step)

    def _need(self) -> float:
        prog = self._start - self._low
        return self.frac * prog if prog > 0.0 else math.inf

    def _needs(self, prog: np.ndarray) -> np.ndarray:
        with np.errstate(invalid="ignore"):
            return np.where(prog > 0.0, self.frac * prog, math.inf)

    def _lost_ok(self, win: Sequence[float], best: float, lost: float, prog: float, at: int = -1) -> bool:
        total, count = (self._nsum, self._ncount) if at < 0 or self._blk is None else \
            (float(self._blk[0][at]), int(self._blk[1][at]))
        return super()._lost_ok(win, best, lost, prog) and count > 0 and prog >= self._lz * total / count

    def _how_far(self, rise: float) -> str:
        prog = self._start - self._low
        return f"{rise:.3g} above its best level ({rise / prog:.0%} of the progress it had made)"

    def _fast(self, arrays: Sequence[np.ndarray], steps: np.ndarray, i: int, j: int) -> int:
        if self._signed:
            if len(self._buf) < 2:
                return 0
            ext = np.concatenate((list(self._buf)[-2:], arrays[0][i:j]))
            with np.errstate(over="ignore", invalid="ignore"):  # past the first non-finite value: never read
                d2 = np.abs(ext[2:] - 2.0 * ext[1:-1] + ext[:-2])
            ok, w, p = np.isfinite(d2), self.window, len(self._part)
            seq = np.concatenate((self._part, d2[ok]))  # the block under way, continued
            full = len(seq) // w
            folded = [self._nsum]
            for b, block in enumerate(seq[:full * w].reshape(full, w).tolist()):
                folded.append(_fold(folded[-1], self._ncount + b, block))
            blocks = (p + np.cumsum(ok)) // w  # whole blocks after each value
            self._blk = (np.asarray(folded)[blocks], self._ncount + blocks)
            k = super()._fast(arrays, steps, i, j)
            if k:
                self._nsum, self._ncount = float(self._blk[0][k - 1]), int(self._blk[1][k - 1])
                self._part = seq[int(blocks[k - 1]) * w:p + int(ok[:k].sum())].tolist()
            self._blk = None
            return k
        k = before_first_negative(arrays[0], i, j)
        if k:
            self._last_step = int(steps[i + k - 1])
        return k


__all__ = ["SignedLostProgress"]
