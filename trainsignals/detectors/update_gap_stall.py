"""UpdateGapStall: the update ratio (or the grad norm) stops coming while the loss keeps coming: the weights no longer move."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .._events import Event, Kind, make_event
from .._validate import check_choice, check_range
from ._base import Detector, Input, Knob
from ._interval import MIN_HOLD
from ._ops import first_unusable, first_usable

#: loss values without an update that fire at least: TorchWatcher's ``FROZEN_AFTER`` (twice its
#: ``max_skipped`` default, since a loop's own conditions can skip a few steps), the same rule on a trace
MISSING = 20
#: the gap must also reach this many times the longest gap between two updates so far, plus one (the
#: watcher's rule: a run that measures its update ratio every k steps has gaps of k - 1)
LONGEST_MULT = 4
#: updates seen before the rule is armed: two gaps between them, so the run's cadence is known
ARM = 3
#: per watched signal: its name in the message, and the likely causes of its gap
_WHAT = {
    "update_ratio": ("update ratio", "optimizer.step() skipped by a condition, a swallowed exception, weights "
                                     "frozen or missing from the optimizer"),
    "grad_norm": ("grad norm", "backward() skipped by a condition, a loss computed under no_grad or detached, "
                               "every parameter frozen"),
}


class UpdateGapStall(Detector):
    """Flags a stall when the weights stop changing: no update ratio (or grad norm) while the loss keeps coming.

    The update ratio ``||dw|| / ||w||`` is measured after an optimizer step. A run whose
    optimizer no longer steps (a condition in the loop that skips ``optimizer.step()``, a
    swallowed exception, an optimizer built over other parameters, weights frozen by mistake)
    gives none, or a ratio of 0, while its loss keeps coming. With ``signal="grad_norm"`` the same
    rule watches the gradient norm, measured after ``backward()``: a run whose backward pass no
    longer reaches the weights (``backward()`` skipped by a condition, a loss computed under
    ``torch.no_grad`` or detached, every parameter frozen) gives none, or a norm of 0, and a user
    who logs no update ratio still sees the weights stop. The rule counts the loss values
    since the latest positive, finite value of ``signal`` (an *update*) and fires when that count
    reaches ``missing`` and :data:`LONGEST_MULT` times the longest such gap between two updates
    so far, plus one, once :data:`ARM` updates came: the threshold is the run's own cadence (an
    update ratio measured every 10 steps has gaps of 9; a gap reported as a stall does not count). A run that never gave an update ratio
    is not watched.

    The event is a ``stall`` warning whose ``onset_step`` is the first loss value without an
    update. Once per gap: the rule re-arms when an update comes, and stays quiet for
    ``cooldown`` steps after an event in any case.

    **Rate**: ``frozen_optimizer`` 0 alarms in 304,819 steps; ``frozen_gradients`` 0 alarms in 304,819 steps
    of the tuning suites' healthy runs at its defaults (``calibration.json``; budget 0.5 per 10,000 steps).
    **Held out**: ``frozen_optimizer`` 0 alarms, ``frozen_gradients`` 0 alarms in 879,581 steps of 1,478
    held-out healthy runs (``calibration.json``).

    Args:
        missing: loss values without an update that fire at least, >= 1.
        cooldown: steps after an event without another, >= 0.
        signal: the signal whose values are the updates: ``"update_ratio"`` or ``"grad_norm"``.

    Example:
        The update ratio every step, then none from step 300 (the optimizer stopped stepping):

        >>> import numpy as np
        >>> ratio = np.r_[np.full(300, 1e-3), np.full(100, np.nan)]
        >>> [(e.kind.value, e.step, e.onset_step) for e in UpdateGapStall().scan(loss=np.ones(400), update_ratio=ratio)]
        [('stall', 319, 300)]
        >>> ratio = np.where(np.arange(400) % 10 == 0, 1e-3, np.nan)  # measured every 10 steps: quiet
        >>> UpdateGapStall().scan(loss=np.ones(400), update_ratio=ratio)
        []

        A grad norm every step, then none from step 250 (no backward pass reaches the weights):

        >>> norm = np.r_[np.full(250, 0.5), np.full(150, np.nan)]
        >>> [(e.signal, e.step, e.onset_step) for e in UpdateGapStall(signal="grad_norm").scan(loss=np.ones(400), grad_norm=norm)]
        [('grad_norm', 269, 250)]
    """

    knob = Knob("missing", 2.0, 500.0)
    spans = {"missing": MIN_HOLD}  # steps a loop may skip on its own: fewer values in a log written every N steps
    _state_keys = ("seen", "unseen", "longest", "onset", "fired", "quiet_until", "last_step")

    def __init__(self, missing: int = MISSING, cooldown: int = 0, signal: str = "update_ratio") -> None:
        check_range("missing", missing, 1, None, integer=True)
        check_range("cooldown", cooldown, 0, None, integer=True)
        check_choice("signal", signal, tuple(_WHAT))
        self.missing, self.cooldown, self.signal = missing, cooldown, signal
        self.inputs = (Input("loss"), Input(signal, required=False))
        self._reset()

    def _reset(self) -> None:
        self._seen = 0       # updates so far
        self._unseen = 0     # loss values since the latest update
        self._longest = 0    # the longest gap between two updates so far
        self._onset = -1     # the step of the first loss value without an update
        self._fired = False  # this gap was reported
        self._quiet_until = -1
        self._last_step = -1

    def _need(self) -> int:
        """The gap that fires now."""
        return max(self.missing, LONGEST_MULT * self._longest + 1)

    def _step(self, loss: float, update: float, step: int) -> Event | None:
        self._last_step = step
        if loss - loss != 0.0:  # a loss that is not finite: the step is not counted
            return None
        if update > 0.0 and update - update == 0.0:  # an update: positive and finite
            if self._seen and not self._fired:  # a gap reported as a stall is no measure of the cadence
                self._longest = max(self._longest, self._unseen)
            self._seen += 1
            self._unseen = 0
            self._onset = -1
            self._fired = False
            return None
        if not self._seen:
            return None
        if not self._unseen:
            self._onset = step
        self._unseen += 1
        need = self._need()
        if self._fired or self._seen < ARM or self._unseen < need or step <= self._quiet_until:
            return None
        self._fired = True
        self._quiet_until = step + self.cooldown if self.cooldown else -1
        n = self._unseen
        what, why = _WHAT[self.signal]
        msg = (f"no {what} above 0 for {n} loss values (since step {self._onset}; the longest gap before was "
               f"{self._longest}): the weights stopped changing: {why}?")
        return make_event(Kind.STALL, "warning", step, self._onset, type(self).__name__, self.signal,
                          float(n), float(need), msg)

    def _fast(self, arrays: Sequence[np.ndarray], steps: np.ndarray, i: int, j: int) -> int:
        """The rows before the first one that could fire, in one vectorised pass.

        A row can fire only where the loss values since the latest update reach ``missing``
        (the threshold is never lower); from there the scalar path decides. Rows whose loss is
        not finite are not counted, as in :meth:`_step`.
        """
        n = j - i
        if first_unusable(arrays[0], i, j) == n:  # every loss counted: the two common columns need no pass
            pos = np.arange(n) if first_unusable(arrays[1], i, j, positive=True) == n else \
                np.zeros(0, dtype=np.int64) if not self._seen and first_usable(arrays[1], i, j, positive=True) == n \
                else None  # an update at every row; or none yet, and none here
            if pos is not None:
                self._advance(pos, n, steps[i:j])
                self._last_step = int(steps[j - 1])
                return n
        loss, u = arrays[0][i:j], arrays[1][i:j]
        ok = np.flatnonzero(np.isfinite(loss))
        uo = u[ok]
        m = len(ok)
        with np.errstate(invalid="ignore"):
            up = (uo > 0.0) & np.isfinite(uo)
        idx = np.arange(m)
        last = np.maximum.accumulate(np.where(up, idx, -1))
        count = np.where(last >= 0, idx - last, self._unseen + idx + 1 if self._seen else 0)
        late = count >= self.missing
        if late.any():
            c = int(np.argmax(late))
            k = int(ok[c])
        else:
            c, k = m, j - i
        if c:
            self._advance(np.flatnonzero(up[:c]), c, steps[i + ok[:c]])
        if k:
            self._last_step = int(steps[i + k - 1])
        return k

    def _advance(self, pos: np.ndarray, n: int, steps: np.ndarray) -> None:
        """The state after ``n`` counted rows at ``steps`` that do not fire, with updates at rows ``pos``."""
        if len(pos):
            gaps = np.diff(np.concatenate(([-1 - self._unseen], pos))) - 1
            if not self._seen or self._fired:
                gaps = gaps[1:]  # the rows before the first update are no gap, nor is a gap reported as a stall
            if len(gaps):
                self._longest = max(self._longest, int(gaps.max()))
            self._seen += len(pos)
            self._fired = False
            self._unseen = n - 1 - int(pos[-1])
            self._onset = int(steps[pos[-1] + 1]) if self._unseen else -1
        elif self._seen:
            if not self._unseen:
                self._onset = int(steps[0])
            self._unseen += n


__all__ = ["UpdateGapStall"]
