"""The plateau tracker that the stall rules share (one copy of its numerics, scalar and vectorised).

On ``y = log(loss)`` the tracker keeps a smoothed level ``s`` (EWMA, weight :data:`LEVEL_ALPHA`),
its running best ``b`` over ``max(s[t-hold+1..t])`` (a new best must hold for ``hold`` values: a
heavy-tailed dip is not progress) and a noise scale (EWMA, weight :data:`NOISE_ALPHA`, of
``|y - s|``). The smallest improvement that counts is
``delta = max(MIN_DELTA, delta_mult * noise * sqrt(a / (2 - a)))`` (the noise of ``s``). The
best is taken every ``patience // 64`` values (at least 1); at each such checkpoint *then* is the
best ``2 * patience`` values ago, *mid* the best ``patience`` values ago (where the plateau window
begins), and the loss is on a **plateau** when ``mid - best < delta``. A rule (a subclass) says at
each checkpoint whether the run is stuck; the tracker gives the rest:

* ``onset_step``: the first step whose best is within ``delta`` of the current best;
* re-arm: after an event the rule stays quiet until the best improves by ``delta`` again;
* ``cooldown``: no new event within ``cooldown`` steps of the last one (0: none).

Non-positive and non-finite losses are skipped, with the other inputs of their step.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from .._events import Event, Kind, make_event
from .._validate import check_range, check_signal
from ._base import Detector, Input
from ._factors import expm1_or_inf, times
from ._interval import MIN_HOLD, MIN_VALUES
from ._ops import (
    column_id,
    column_log,
    ewma,
    first_true,
    first_unusable,
    first_usable,
    key_float,
    key_floats,
    log,
    log10,
    shared,
    shared_ewma,
    shared_run,
    shifted,
)

#: weight of the smoothed level (CUSUMPlateau's ``alpha`` default since c9205b5, tuned on the synthetic suite)
LEVEL_ALPHA = 0.1
#: weight of the noise scale (CUSUMPlateau's ``noise_alpha`` default since the first engine, 9dbceb6)
NOISE_ALPHA = 0.02
#: smallest improvement in log space whatever the noise (CUSUMPlateau's ``min_delta`` since 9dbceb6)
MIN_DELTA = 1e-4
#: checkpoints per patience window (87619f7: the best taken every patience/64 values, not every value, for speed)
CHECKPOINTS = 64
#: default values without a new best before a stall (CUSUMPlateau's default; the suite uses 10 % of total_steps)
PATIENCE = 200
#: default values a new best must hold (CUSUMPlateau's ``hold`` since 17fce61, against heavy-tailed dips)
HOLD = 10
#: default smallest improvement in noise scales of the level (CUSUMPlateau's ``delta_mult`` since c0bef1b)
DELTA_MULT = 2.0
#: ln 10: a fall of the log-loss divided by it is in decades
LN10 = math.log(10.0)
#: the tracker's state keys (a rule adds its own)
PLATEAU_KEYS = ("n", "s", "recent", "noise", "best", "first", "hist", "shist", "armed", "alarm_best",
                "quiet_until", "last_step")
_NOISE_B = 1.0 - NOISE_ALPHA


def factor(d: float) -> str:
    """A log-space improvement as a percentage, or as a factor when large."""
    pct = expm1_or_inf(d) * 100.0
    return f"{pct:.2g}%" if pct < 100.0 else f"{times(d)}x"


def back(ext: np.ndarray, hl: int, nb: int, lag: int) -> np.ndarray:
    """``ext[max(hl + c - lag, 0)]`` for ``c < nb``: the value ``lag`` places before each of the ``nb`` last ones."""
    lo = hl - lag
    if lo >= 0:
        return ext[lo:lo + nb]
    return ext[np.maximum(np.arange(lo, lo + nb), 0)]  # type: ignore[no-any-return]


class Block(NamedTuple):
    """One vectorised stretch: values ``[0, lim)`` and the checkpoints ``bidx`` among them."""

    lim: int
    s: np.ndarray      # smoothed level after each value
    noise: np.ndarray  # noise scale after each value
    bidx: np.ndarray   # the values that are checkpoints
    bb: np.ndarray     # the best at each checkpoint
    pos: np.ndarray    # each checkpoint's index in ``hist`` extended by this block
    mid: np.ndarray    # the best ``patience`` values back
    old: np.ndarray    # the best ``2 * patience`` values back (*then*)
    delta: np.ndarray  # the smallest improvement at each checkpoint
    full: np.ndarray   # 2 * patience values of history are held (a rule may decide)


class PlateauRule(Detector):
    """Base of the stall rules: the plateau tracker of this module; a subclass adds one rule.

    A subclass sets ``inputs`` (the loss first), implements ``_step`` with :meth:`_level`,
    :meth:`_checkpoint`, :meth:`_ready` and :meth:`_fire`, and for the batch path ``_fire_mask``
    (and ``_fast_extra`` / ``_fast_keep`` when it tracks another input).
    """

    # the tracker's state in slots: a rule's other attributes then stay few enough for CPython's
    # fast per-instance attribute layout (up to 29 attributes in an instance dict)
    __slots__ = tuple("_" + k for k in PLATEAU_KEYS if k != "last_step")
    spans = {"patience": MIN_VALUES, "hold": MIN_HOLD}

    def __init__(self, patience: int, hold: int, delta_mult: float, cooldown: int, signal: str) -> None:
        check_range("patience", patience, 2, None, integer=True)
        check_range("hold", hold, 1, None, integer=True)
        check_range("delta_mult", delta_mult, 0, None)
        check_range("cooldown", cooldown, 0, None, integer=True)
        check_signal("signal", signal)
        self.patience = patience
        self.hold = hold
        self.delta_mult = delta_mult
        self.cooldown = cooldown
        self.signal = signal
        self.inputs = (Input(signal), *self._extra_inputs())
        self.logs = (signal,)
        self._b = 1.0 - LEVEL_ALPHA
        self._dscale = delta_mult * math.sqrt(LEVEL_ALPHA / (2.0 - LEVEL_ALPHA))
        self._stride = max(1, patience // CHECKPOINTS)
        self._q = patience // self._stride
        self._reset()

    def _extra_inputs(self) -> tuple[Input, ...]:
        """The rule's optional inputs after the loss."""
        return ()

    def _reset(self) -> None:
        self._n = 0
        self._s = self._noise = self._best = self._first = 0.0
        self._recent: deque[float] = deque(maxlen=self.hold)
        self._hist: deque[float] = deque(maxlen=2 * self._q + 1)
        self._shist: deque[int] = deque(maxlen=2 * self._q + 1)
        self._armed = True
        self._alarm_best = 0.0
        self._quiet_until: int | None = None
        self._last_step = -1

    def _set_state(self, state: dict[str, Any]) -> None:
        super()._set_state(state)
        m = 2 * self._q + 1
        self._hist = deque(state["hist"], maxlen=m)
        self._shist = deque(state["shist"], maxlen=m)
        self._recent = deque(state["recent"], maxlen=self.hold)

    # -- the scalar path --------------------------------------------------------------------
    def _level(self, y: float) -> bool:
        """Fold one log-loss into the level and the noise; True when this value is a checkpoint."""
        n = self._n
        if n == 0:
            self._s = self._best = self._first = y
            self._recent.append(y)
        else:
            s0 = self._s
            r = abs(y - s0)
            self._noise = r if n == 1 else NOISE_ALPHA * r + _NOISE_B * self._noise
            self._s = s = LEVEL_ALPHA * y + self._b * s0
            self._recent.append(s)
        self._n = n + 1
        return not (n + 1) % self._stride

    def _checkpoint(self, step: int) -> tuple[float, float]:
        """Take the best at a checkpoint; returns it and ``delta``."""
        best = self._best
        if self._s < best:  # else max(recent) >= s >= best: no new best
            top = max(self._recent)
            if top < best:
                self._best = best = top
        self._hist.append(best)
        self._shist.append(step)
        delta = self._dscale * self._noise
        return best, (delta if delta >= MIN_DELTA else MIN_DELTA)

    def _ready(self, best: float, delta: float) -> bool:
        """Whether the rule may decide now: armed (re-arming if the best improved) with a full history."""
        if not self._armed:
            if best < self._alarm_best - delta:
                self._armed = True
            return False
        return len(self._hist) == 2 * self._q + 1

    def _what(self, gain: float, best: float, onset: int) -> str:
        """What the event says happened (the rule says why in ``because``)."""
        how = f"by more than {factor(gain)}" if gain > 0.0 else "at all"  # a best no lower than then: no gain
        return (f"{self.signal} has not improved {how} over {self.patience} values "
                f"(best {math.exp(best):.4g}, plateau since step {onset})")

    def _fire(self, step: int, best: float, delta: float, because: str) -> Event | None:
        """The stall event (``None`` within ``cooldown`` steps of the last one); disarms the rule."""
        if self._quiet_until is not None and step <= self._quiet_until:
            return None
        self._armed = False
        self._alarm_best = best
        if self.cooldown:
            self._quiet_until = step + self.cooldown
        onset = step
        for b, s in zip(reversed(self._hist), reversed(self._shist)):
            if b - best >= delta:
                break
            onset = s
        gain = self._hist[-self._q - 1] - best
        return make_event(Kind.STALL, "warning", step, onset, type(self).__name__, self.signal,
                          gain, delta, f"{self._what(gain, best, onset)} {because}")

    # -- the batch path ---------------------------------------------------------------------
    def _fast_extra(self, arrays: Sequence[np.ndarray], i: int, j: int,
                    ctx: dict[str, Any]) -> np.ndarray | int | None:
        """Values ``[i, j)`` the rule's own inputs send to the scalar path: a mask, or how many values
        come before the first of them (``None``: decline all); what the rule computes here for its
        other hooks goes in ``ctx``.
        """
        return j - i

    def _fire_mask(self, blk: Block, ctx: dict[str, Any]) -> np.ndarray:
        raise NotImplementedError

    def _fast_keep(self, blk: Block, k: int, nu: int, used: np.ndarray, ctx: dict[str, Any]) -> None:
        """Advance the rule's own state over the ``k`` values consumed (``nu`` checkpoints, the last
        ``used`` of them kept in the history).
        """

    def _fast(self, arrays: Sequence[np.ndarray], steps: np.ndarray, i: int, j: int) -> int:
        if self._n < 2 or len(self._recent) < self.hold:
            return 0
        ctx: dict[str, Any] = {}
        extra = self._fast_extra(arrays, i, j, ctx)
        if extra is None:
            return 0
        y = column_log(arrays[0], i, j)
        lim = min(first_unusable(arrays[0], i, j, positive=True), extra if isinstance(extra, int) else first_true(extra))
        if lim == 0:
            return 0
        cid = column_id(arrays[0])
        key = None if cid is None else (
            "plateau", cid, i, lim, self._stride, self._q, self.hold, key_float(self._dscale), self._n % self._stride,
            key_float(self._s), key_float(self._noise), key_float(self._best), key_floats(self._recent),
            key_floats(self._hist))
        blk = shared(key, lambda: self._block(y[:lim], (arrays[0], i)))
        k = lim
        if len(blk.bidx):
            if self._armed:
                fire = self._fire_mask(blk, ctx) & blk.full
                if self._quiet_until is not None:
                    fire &= steps[i + blk.bidx] > self._quiet_until
            else:  # the only thing that can happen while disarmed: the best improves and re-arms
                fire = blk.bb < self._alarm_best - blk.delta
            f = first_true(fire)
            if f < len(blk.bidx):
                k = int(blk.bidx[f])
        if k:
            m = 2 * self._q + 1
            self._s = float(blk.s[k - 1])
            self._recent.extend(blk.s[max(0, k - self.hold):k].tolist())
            self._noise = float(blk.noise[k - 1])
            nu = int(np.searchsorted(blk.bidx, k))  # checkpoints consumed
            if nu:
                self._best = float(blk.bb[nu - 1])
            self._n += k
            used = blk.bidx[:nu][-m:]
            self._hist.extend(blk.bb[max(0, nu - m):nu].tolist())
            self._shist.extend(steps[i + used].tolist())
            self._fast_keep(blk, k, nu, used, ctx)
            self._last_step = int(steps[i + k - 1])
        return k

    def _block(self, y: np.ndarray, at: tuple[np.ndarray, int] | None = None) -> Block:
        """The tracker over a stretch of finite log-losses, as the scalar path would run it (``at``: the
        loss column and the position ``y`` starts at, when ``y`` is its log there).
        """
        lim, q, st, h = len(y), self._q, self._stride, self.hold
        s = ewma(y, LEVEL_ALPHA, self._b, self._s) if at is None else \
            shared_ewma(at[0], at[1], "log", y, LEVEL_ALPHA, self._b, self._s)
        noise = ewma(np.abs(y - shifted(s, self._s)), NOISE_ALPHA, _NOISE_B, self._noise)
        first = -(self._n + 1) % st  # checkpoints: where the count of values is a multiple of the stride
        bidx = np.arange(first, lim, st)
        nb = len(bidx)
        sext = np.concatenate((np.asarray(self._recent), s))  # the hold values before, then the block's
        top = sext[first + h:first + h + st * nb:st].copy()  # max of the last `hold` smoothed values at each checkpoint
        for d in range(1, h):
            np.maximum(top, sext[first + h - d:first + h - d + st * nb:st], out=top)
        bb = np.minimum.accumulate(np.minimum(top, self._best)) if nb else top
        hl = len(self._hist)
        ext = np.concatenate((np.asarray(self._hist), bb))
        pos = np.arange(hl, hl + nb)
        mid, old = back(ext, hl, nb, q), back(ext, hl, nb, 2 * q)  # clipped where not `full` (masked out by the caller)
        delta = np.maximum(MIN_DELTA, self._dscale * noise[first:first + st * nb:st])
        return Block(lim, s, noise, bidx, bb, pos, mid, old, delta, pos >= 2 * q)


class GradPlateauRule(PlateauRule):
    """A plateau rule that also reads the grad norm: a fast level of ``log10(grad_norm)``
    (EWMA, weight :data:`LEVEL_ALPHA`) and that level at each checkpoint (``None`` before the first),
    with the loss's smoothed level there. A subclass implements :meth:`_rule`, the decision at a
    checkpoint.

    The grad norm's fall is taken net of the loss's: the larger of the falls of its best and of
    its smoothed level over the same span. A loss that swings by decades near zero (a net that
    interpolates its data) sets its best on a lucky low that the trend takes long to beat, while
    its level, and its gradients with it, keep falling: progress the best alone does not see.
    """

    def _extra_inputs(self) -> tuple[Input, ...]:
        return (Input("grad_norm", required=False),)

    def _reset(self) -> None:
        super()._reset()
        self._g: float | None = None
        self._ghist: deque[float | None] = deque(maxlen=2 * self._q + 1)
        self._lhist: deque[float] = deque(maxlen=2 * self._q + 1)  # the loss's smoothed level at each checkpoint

    def _set_state(self, state: dict[str, Any]) -> None:
        super()._set_state(state)
        self._ghist = deque(state["ghist"], maxlen=2 * self._q + 1)
        self._lhist = deque(state["lhist"], maxlen=2 * self._q + 1)

    def _step(self, x: float, grad: float, step: int, log_x: float | None = None) -> Event | None:
        self._last_step = step
        if x - x != 0.0 or x <= 0.0:
            return None
        if grad - grad == 0.0 and grad > 0.0:
            g = self._g
            lg = log10(grad)
            self._g = lg if g is None else LEVEL_ALPHA * lg + self._b * g
        if not self._level(log(x) if log_x is None else log_x):
            return None
        best, delta = self._checkpoint(step)
        self._ghist.append(self._g)
        self._lhist.append(self._s)
        return self._rule(step, best, delta)

    def _rule(self, step: int, best: float, delta: float) -> Event | None:
        """The rule at a checkpoint: ``best`` and ``delta`` as :meth:`_checkpoint` took them."""
        raise NotImplementedError

    def _loss_fall(self, best: float) -> float:
        """Decades the loss fell since *then*: the larger of its best's fall and its level's."""
        return max(self._hist[0] - best, self._lhist[0] - self._s) / LN10

    def _net_fall(self, best: float) -> float | None:
        """Decades the grad norm fell since *then*, net of the loss's fall (``None``: not known)."""
        g, then = self._g, self._ghist[0]
        if g is None or then is None:
            return None
        return then - g - self._loss_fall(best)

    def _because(self, best: float) -> str:
        g, then = self._g, self._ghist[0]
        return (f"while the grad norm fell {then - g:.1f} decades and the loss {self._loss_fall(best):.1f}"
                if g is not None and then is not None else "")

    def _fast_extra(self, arrays: Sequence[np.ndarray], i: int, j: int, ctx: dict[str, Any]) -> int:
        ctx["lg"] = column_log(arrays[1], i, j, base10=True)
        ctx["at"] = (column_id(arrays[1]), i)
        # a grad norm appearing, or missing among present ones: scalar (log10 is finite where the log is)
        return (first_usable if self._g is None else first_unusable)(arrays[1], i, j, positive=True)

    def _grad_run(self, ctx: dict[str, Any], n: int) -> np.ndarray:
        """The grad level after each of the first ``n`` values of the block (shared within a batch run)."""
        assert self._g is not None
        cid, i = ctx["at"]
        g0, lg = self._g, ctx["lg"]
        key = None if cid is None else ("grad_level", cid, i, key_float(LEVEL_ALPHA), key_float(g0))
        return shared_run(key, n, lambda: (ewma(lg[:n], LEVEL_ALPHA, self._b, g0),))[0]  # type: ignore[no-any-return]

    def _grad_levels(self, blk: Block, ctx: dict[str, Any]) -> tuple[np.ndarray | None, np.ndarray | None]:
        """The grad level after each value of the block, and at *then* of each checkpoint."""
        if self._g is None:
            return None, None
        ctx["g"] = g = self._grad_run(ctx, blk.lim)
        prev = np.array([np.nan if v is None else v for v in self._ghist], dtype=np.float64)
        ext = np.concatenate((prev, g[blk.bidx]))
        return g, back(ext, len(prev), len(blk.bidx), 2 * self._q)

    def _net_fall_mask(self, blk: Block, ctx: dict[str, Any]) -> np.ndarray | None:
        """:meth:`_net_fall` at each checkpoint of the block (``None``: no grad level yet)."""
        g, then = self._grad_levels(blk, ctx)
        if g is None or then is None:
            return None
        nb, prev = len(blk.bidx), np.asarray(self._lhist, dtype=np.float64)
        lvl = blk.s[blk.bidx]
        lthen = back(np.concatenate((prev, lvl)), len(prev), nb, 2 * self._q)
        with np.errstate(invalid="ignore"):
            return np.asarray(then - g[blk.bidx] - np.maximum(blk.old - blk.bb, lthen - lvl) / LN10)

    def _fast_keep(self, blk: Block, k: int, nu: int, used: np.ndarray, ctx: dict[str, Any]) -> None:
        self._lhist.extend(blk.s[used].tolist())
        if self._g is None:
            self._ghist.extend([None] * len(used))
            return
        g = ctx.get("g")
        if g is None:
            g = self._grad_run(ctx, k)
        self._g = float(g[k - 1])
        self._ghist.extend(g[used].tolist())
