"""When a run began to learn: the first value at which its smoothed loss left its starting level.

An untrained network often sits on a plateau at chance for tens or hundreds of steps and then
escapes it by itself: its grad norm *rises* as learning starts, and its minibatch losses spread
out as the model starts to tell examples apart (``FAILURE_MODES.md``, "Healthy runs that look
like failures"). A rule that compares the run *now* with the run *then* must not take *then*
from before the run began to learn: what it would measure is learning itself. The rules that
read this (:class:`~trainsignals.GradLossDecoupling` for a rising grad norm,
:class:`~trainsignals.LjungBoxSawtooth` for its reference noise) keep an EWMA level of
``log(loss)`` and its first value, and note the count of values at which the level first lies
:data:`FALL` below that first value. Before then, they do not judge against the past; after, only
against values from then on.
"""

from __future__ import annotations

import math

import numpy as np

from ._ops import column_log, shared_ewma

__all__ = ["FALL", "LEARN_KEYS", "LEVEL_ALPHA", "LEVEL_KEYS", "LearningOnset", "began"]

#: how far the smoothed log loss must fall below its first value: 5 %, the tolerance within which
#: the coupling rules call a smoothed loss level unmoved (their ``loss_tolerance`` default)
FALL = math.log(1.05)
#: the weight of the level (about 20 values of memory) where a rule keeps no level of its own:
#: the coupling rules' default ``alpha``
LEVEL_ALPHA = 0.1
#: the state a rule keeps for it: the first level, the count of values before the one at which the
#: run began to learn (-1: not yet)
LEARN_KEYS = ("u0", "learning")
#: and a rule whose level the mixin smooths (:meth:`LearningOnset._learn`): the level too
LEVEL_KEYS = ("lev", *LEARN_KEYS)
_B = 1.0 - LEVEL_ALPHA


def began(levels: np.ndarray, first: float) -> int:
    """The index of the first of ``levels`` at least :data:`FALL` below ``first``; -1 if none is.

    Example:
        >>> began(np.log([2.30, 2.29, 2.25, 2.17, 1.9]), float(np.log(2.30)))
        3
    """
    hit = np.flatnonzero(levels <= first - FALL)
    return int(hit[0]) if len(hit) else -1


class LearningOnset:
    """Mixin of a detector that keeps when its run began to learn.

    Call :meth:`_learn_reset` from ``_reset``; while ``self._learning < 0``, feed each value's
    level (:meth:`_learn_level`: a rule that smooths the loss itself, whose ``_state_keys`` add
    :data:`LEARN_KEYS`) or log loss (:meth:`_learn`: the mixin smooths it, :data:`LEVEL_KEYS`);
    :meth:`_learned` says whether a value lies at or after the onset. A batch path finds the onset
    among the values it is about to take (:meth:`_onset_ahead`: the rule judges the value at the
    onset as if it had not come, as the scalar step does) and keeps what it took
    (:meth:`_learn_keep`).
    """

    _lev: float
    _u0: float
    _learning: int
    _block: np.ndarray  # a batch path's levels, the onset among them and whether they are the
    _ahead: int  # mixin's own, between _onset_ahead and _learn_keep (not state)
    _own: bool

    def _learn_reset(self, own_level: bool = False) -> None:
        """Forget the onset (and, for a rule that learns through :meth:`_learn`, the level)."""
        self._u0, self._learning = 0.0, -1
        if own_level:
            self._lev = 0.0

    def _learn_level(self, level: float, k: int) -> None:
        """Take the level after the ``k``-th value (0: the first)."""
        if not k:
            self._u0 = level
        elif level <= self._u0 - FALL:
            self._learning = k

    def _learn(self, y: float, k: int) -> None:
        """Take the ``k``-th value's log loss ``y`` into an EWMA level (weight :data:`LEVEL_ALPHA`)."""
        self._lev = LEVEL_ALPHA * y + _B * self._lev if k else y
        self._learn_level(self._lev, k)

    def _learned(self, k: int) -> bool:
        """Whether the ``k``-th value came once the run had begun to learn."""
        return 0 <= self._learning <= k

    def _onset_ahead(self, col: np.ndarray, i: int, n: int, seen: int, a: float = LEVEL_ALPHA,
                     level: float | None = None) -> int:
        """For a batch path about to take the ``n`` usable losses of ``col`` from ``i`` on (``seen``
        values taken before them): the count of values before the one at which the run begins to
        learn, if it is among them (else -1; the onset already noted, if any). Their levels (weight
        ``a``, from ``level`` or the mixin's own) are held for :meth:`_learn_keep`.
        """
        if self._learning >= 0:
            return self._learning
        self._own = level is None
        self._block = shared_ewma(col, i, "log", column_log(col, i, i + n), a, 1.0 - a,
                                  self._lev if level is None else level)
        at = began(self._block, self._u0)
        self._ahead = -1 if at < 0 else seen + at
        return self._ahead

    def _learn_keep(self, k: int, seen: int) -> None:
        """After a batch path took ``k`` values after ``seen``: the onset if it came (and the mixin's level)."""
        if self._learning < 0 and k:
            if 0 <= self._ahead < seen + k:  # the level stops at the onset's, as in the scalar step
                self._learning, k = self._ahead, self._ahead - seen + 1
            if self._own:
                self._lev = float(self._block[k - 1])
