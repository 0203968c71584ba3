"""Oscillation: the loss bounces with large swings and makes no net progress."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from functools import lru_cache
from itertools import islice
from typing import Any

import numpy as np

from .._events import Event, Kind, make_event
from .._validate import check_range, check_signal
from ._base import Detector, Input
from ._ops import ewma, first_true, shifted

_log = math.log
_NAN = math.nan


def _residuals(win: Sequence[float]) -> tuple[list[float], float]:
    """Residuals of the window around its least-squares line, and the line's rise over the window."""
    pts = [(k, v) for k, v in enumerate(win) if v == v]
    m = len(pts)
    if m < 4:
        return [], 0.0
    kb = sum(k for k, _ in pts) / m
    vb = sum(v for _, v in pts) / m
    skk = sum((k - kb) ** 2 for k, _ in pts)
    slope = sum((k - kb) * (v - vb) for k, v in pts) / skk
    return [v - vb - slope * (k - kb) for k, v in pts], slope * (len(win) - 1)


def _scale(res: list[float]) -> float:
    """Robust noise scale of residuals: 1.4826 x median |r| (floored at 1e-3 in log space)."""
    if not res:
        return math.inf
    a = sorted(abs(r) for r in res)
    m = len(a)
    med = a[m // 2] if m % 2 else 0.5 * (a[m // 2 - 1] + a[m // 2])
    return max(1.4826 * med, 1e-3)


def _median(v: Sequence[float]) -> float:
    """Median of the finite values (nan when none)."""
    a = sorted(x for x in v if x == x)
    m = len(a)
    if not m:
        return math.nan
    return a[m // 2] if m % 2 else 0.5 * (a[m // 2 - 1] + a[m // 2])


def _ljung_box(res: list[float], lags: int) -> float:
    """Ljung-Box statistic ``Q = m (m + 2) sum_k r_k^2 / (m - k)`` of the residuals over lags
    1..``lags`` (``r_k`` their autocorrelation at lag ``k``). Under white noise ``Q`` follows a
    chi-square law with ``lags`` degrees of freedom; a sawtooth, an alternation or a repeated
    spike-and-collapse correlates at its period and makes it large.
    """
    m = len(res)
    if m <= lags + 2:
        return 0.0
    mu = sum(res) / m
    r = [v - mu for v in res]
    den = sum(v * v for v in r)
    if den <= 0.0:
        return 0.0
    q = 0.0
    for k in range(1, lags + 1):
        ac = sum(r[i] * r[i - k] for i in range(k, m)) / den
        q += ac * ac / (m - k)
    return m * (m + 2) * q


@lru_cache(maxsize=64)
def _chi2_crit(p: float, dof: int) -> float:
    """The chi-square quantile at ``1 - p`` with ``dof`` degrees of freedom (cached: the
    detector's hot path keeps few attributes, so its critical values live here).
    """
    from scipy.stats import chi2  # SciPy on first use: `import trainsignals` stays light

    return float(chi2.isf(p, dof))


def _batch_residuals(wins: np.ndarray) -> np.ndarray:
    """Residuals of each row around its least-squares line (rows of finite values)."""
    w = wins.shape[1]
    kc = np.arange(w) - (w - 1) / 2.0
    dev = wins - wins.mean(axis=1, keepdims=True)
    slope = dev @ kc / float(kc @ kc)
    return dev - slope[:, None] * kc[None, :]


def _batch_ljung_box(res: np.ndarray, lags: int) -> np.ndarray:
    """Row-wise twin of :func:`_ljung_box`."""
    m = res.shape[1]
    r = res - res.mean(axis=1, keepdims=True)
    den = (r * r).sum(axis=1)
    ok = den > 0
    q = np.zeros(len(r))
    for k in range(1, lags + 1):
        ac = (r[:, k:] * r[:, :-k]).sum(axis=1) / np.where(ok, den, 1.0)
        q += ac * ac / (m - k)
    return np.where(ok, m * (m + 2) * q, 0.0)


def _frac_out(res: list[float], scale: float) -> float:
    """Fraction of residuals larger than ``scale``."""
    return sum(1 for r in res if abs(r) > scale) / len(res) if res else 0.0


def _spread(res: list[float]) -> float:
    """10-90 % range of the residuals."""
    srt = sorted(res)
    return srt[(9 * len(srt)) // 10 - 1] - srt[len(srt) // 10] if len(srt) >= 10 else 0.0


def _shift_test(ys: Sequence[float], gs: Sequence[float], w2: int, efficiency: float,
                ls: Sequence[float] = ()) -> tuple[float, float, float]:
    """``(loss swing ratio, grad-norm swing ratio)`` of the last ``w2`` values against the first
    ``w2``; ``0, 0`` when the loss made progress (its median fell) or its line moves within the
    window by more than ``efficiency`` times its residuals' 10-90 % range. The loss ratio is that
    of the robust residual scales carried to loss units (times ``exp`` of the median log-level
    change); the grad-norm ratio is ``inf`` when either window lacks grad norms. The third value
    is the learning-rate ratio: the smallest learning rate of the current window over the median
    of the reference's (0 when either lacks one). ``ys`` holds finite values.
    """
    m = len(ys)
    cur, ref = sorted(islice(ys, m - w2, m)), sorted(islice(ys, 0, w2))
    h = w2 // 2
    lvl = (cur[h] - ref[h]) if w2 % 2 else 0.5 * (cur[h - 1] + cur[h] - ref[h - 1] - ref[h])
    if not lvl >= 0.0:  # the loss fell since the reference window: progress
        return 0.0, 0.0, 0.0
    res, rise = _residuals(list(islice(ys, m - w2, m)))
    if abs(rise) > efficiency * _spread(res):  # a climb or a fall within the window: it moves
        return 0.0, 0.0, 0.0
    rl = _scale(res) / _scale(_residuals(list(islice(ys, 0, w2)))[0]) * math.exp(lvl)
    rlr = 0.0
    if len(ls) == m:
        lcur = [v for v in islice(ls, m - w2, m) if v == v]
        lref = _median(list(islice(ls, 0, w2)))
        if lcur and lref > 0.0:
            rlr = min(lcur) / lref
    gcur, gref = list(islice(gs, m - w2, m)), list(islice(gs, 0, w2))
    gc, gr = _residuals(gcur)[0], _residuals(gref)[0]
    if not (gc and gr):
        return rl, math.inf, rlr
    # the grad norm moved too: its swings widened, or its level rose (a sharper region)
    return rl, max(_scale(gc) / _scale(gr), math.exp(_median(gcur) - _median(gref))), rlr


def _kept(i: int, name: str) -> Any:
    """A read-only setting stored at ``_cfg_wts[i]`` (keeps the instance's attributes few)."""
    return property(lambda self: self._cfg_wts[i], doc=f"The ``{name}`` setting.")


class Oscillation(Detector):
    """Flags an oscillation: the loss swings far beyond its usual noise and makes no net progress.

    Inputs: the loss and, optionally, the grad norm and the learning rate (``nan`` when
    unknown); the loss and the grad norm are watched in log space, the learning rate only by
    the second path below. For the loss and the grad norm, the detector keeps a local swing ``v`` (EWMA, weight ``var_alpha``, of the
    step-to-step change ``|y[t] - y[t-1]|``: a steady trend does not inflate it, and heavy
    tails inflate it less than a variance) and the run's own baseline ``b`` (EWMA of ``v``,
    weight ``base_alpha``). A window is examined when ``v > ratio * b`` for either
    signal (cheap, linear recurrences); it is an oscillation when, over the last ``window``
    values, around the window's least-squares line,

    * at least ``frac`` of the log-loss residuals exceed ``spread`` times the run's usual
      residual noise — measured the same way on the window ``3 * window`` values earlier
      (robustly: 1.4826 x median absolute residual, so correlated or heavy-tailed noise sets
      its own scale) and carried to the current level: where the loss has fallen since that
      window (median log-loss lower by ``d``), its usual noise is taken ``exp(d)`` times larger.
      A falling minibatch loss keeps roughly its noise in loss units, so its noise in log
      space grows as ``1 / level`` (a few hard examples dominate a small loss); a run that
      stopped progressing at its level gets no such allowance. When the grad norm is known,
      its residuals must swing too, measured the same way (without the level allowance):
      ``frac`` of one and ``frac / 2`` of the other (the grad norm spikes and collapses
      repeatedly, the signature of a too-high learning rate); a lone spike is one or two
      values;
    * the line's rise over the window is at most ``efficiency`` times the residuals' 10-90 %
      range: no net progress (a divergence or a fast descent moves);
    * nor since the reference window: the window's median log-loss lies at most ``drop``
      times that 10-90 % range below the reference window's median. A minibatch run that is
      still learning fails this test: as its loss falls its noise grows in log space (a few
      hard examples dominate a small loss), so its swings look large against the noise of
      ``3 * window`` values earlier, but its level has moved far below;
    * the swings have a pattern: the Ljung-Box statistic ``Q`` of the log-loss residuals
      over lags 1..``L`` (``L = window // 3``: a pattern that repeats at least three times in
      the window) — plus that of the grad-norm residuals when the grad norm is known —
      exceeds the chi-square quantile of ``L`` (``2 L``) degrees of freedom at
      ``1 - pattern_p``. White noise, however loud, passes rarely — the chi-square law is the
      large-sample one: at 32 values and 10 lags Gaussian white noise passes about 1 % of
      the time for ``pattern_p = 1e-3`` (measured) — while a sawtooth, an alternation or a
      repeated spike-and-collapse correlates at its period. (By contrast the largest
      ``|autocorrelation|`` over 8 lags of 32 white residuals exceeds 0.4 about 11 % of the
      time: a bare correlation threshold is a weak test.) Summing the two statistics treats
      the loss and grad-norm noises as independent.

    A second path catches the edge of stability, where minibatch swings are loud but not
    periodic (white noise fails the pattern test): the loss jumps to a higher, much noisier
    plateau, or its noise band widens, and it makes no net progress. It compares the last
    ``3 * window // 2`` values (the current window) with the first ``3 * window // 2`` of the
    ``4 * window`` kept (the reference, ``window`` values before it) and fires when

    * the loss makes no net progress: the current median log-loss is not below the reference's,
      and the current window's least-squares line rises or falls by at most ``efficiency``
      times the 10-90 % range of its residuals (the bouncing regime fills the window: a climb
      is a divergence, a fall is learning, and a jump still inside the window is not yet a
      regime);
    * the loss swings ``shift`` times as wide as in the reference, in loss units: the ratio of
      the robust residual scales (1.4826 x median absolute residual around each window's line,
      in log space) times ``exp`` of the rise of the median log-loss. A minibatch loss that
      falls while keeping its noise in loss units keeps this ratio near 1 (its log-space noise
      grows as ``1 / level``: the level allowance of the first path); a loss that jumps up and
      bounces at the higher level, or whose band widens, does not;
    * when the grad norm is known in both windows, it moved too: its robust residual scale (log
      space) or its median is at least ``grad_shift`` times the reference's. A step size past
      the edge of stability makes the grad norm swing wider, or lifts it as a whole (the run
      moves to a sharper region), and often both. Or, instead, the learning rate rose and
      stayed up: the smallest one in the current window is at least ``lr_rise`` times the
      reference window's median. The step size grew and the loss answered with wider swings
      and no progress, which is the cause the event then names (small networks at the edge of
      stability often keep their grad norm where it was). The whole current window must be at
      the raised rate: a warm restart's loss bump, while the window still holds the jump, is
      not yet a regime, and once the window has left it the loss is falling again.
    * with the learning rate's word, and when its last jump took it ``lr_rise`` times above the
      highest rate the run had used before, a loss swing ``lr_shift`` times as wide (2, the
      real-run suite's own definition of an oscillation, :mod:`trainsignals.curves.real_runs`) is
      enough instead of ``shift``. ``shift``'s margin guards against a loss band that merely
      wanders (healthy real runs reach 2.5-2.9 in this test); a step size the run never trained
      with is the cause seen directly. A jump back to a rate the run already used (a warm
      restart to its peak) keeps ``shift``: the loss band after it is often just the band the
      run had at that rate, wider than the quiet end of the previous cycle.

    The second path is examined every 4th value while *armed*: for ``4 * window - 3 * window //
    2`` values (80 at the default window) after a value at which the local swing ``v`` of the
    loss exceeds ``shift_ratio`` times its baseline ``b``, and so does the grad norm's when it
    is known (both swing at once), or at which the learning rate is ``lr_rise`` times the last
    known one or more (a jump: a warmup's gradual climb does not arm it). A watch that only a
    learning-rate jump armed takes only the learning rate's word in the test (a warm restart
    lifts the grad norm and the loss together for a while; its learning rate then decays, and
    once the current window has left the jump the loss is falling). That is as long as the reference window still lies before
    the arming value: a jump onto a noisier plateau arms the watch, and the comparison of the
    plateau with what came before is possible only once the current window has left the
    jump, ``3 * window // 2`` values later. Steady runs pay nothing; the test itself costs
    about as much as the first path's.

    ``onset_step`` is the start of the examined window (the last ``window`` values, or the
    current window of the second path). No event in the first ``warmup`` values; quiet for
    ``cooldown`` values after an event.

    Args:
        window: values in the window, >= 8.
        ratio: local-to-baseline swing ratio that opens a window for examination, > 1.
        frac: fraction of far values that fires, in (0, 1].
        spread: residual size that counts as far, in usual noises ``sigma``, > 0.
        efficiency: largest net-change / spread ratio that counts as no progress, in (0, 1].
        drop: largest fall of the median log-loss since the reference window, in 10-90 %
            ranges of the current window's residuals, that counts as no progress, >= 0.
        pattern_p: p-value of the pattern test under the Ljung-Box chi-square law (its
            large-sample false-alarm probability on white noise), in (0, 1).
        shift: swing ratio in loss units, current window over reference, that fires the second
            path, > 1.
        grad_shift: ratio of the grad norm's swing, or of its level, that the second path also
            needs when the grad norm is known, > 0.
        shift_ratio: local-to-baseline swing ratio (of the loss and of the grad norm) that arms
            the second path, in (1, ratio].
        lr_rise: learning-rate ratio that arms the second path (over the last known one) and
            that stands in for the grad norm's move in its test (the current window's smallest
            over the reference's median), > 1.
        lr_shift: the swing ratio that fires the second path instead of ``shift`` on the learning
            rate's word after a jump to a rate ``lr_rise`` times above any the run had used,
            in (1, shift].
        var_alpha: weight of the local swing, in (0, 1).
        base_alpha: weight of the baseline swing, in (0, var_alpha).
        warmup: values before any event, >= 4 * window.
        cooldown: values without events after an event, >= 0.
        signal: the signal name used in events.

    Example:
        A loss that converges, then alternates by +-40 % from step 150:

        >>> import numpy as np
        >>> rng = np.random.default_rng(2)
        >>> t = np.arange(300)
        >>> loss = np.exp(-np.minimum(t, 150) / 100) * np.exp(rng.normal(0, 0.02, 300))
        >>> loss[150:] *= np.where(t[150:] % 2 == 0, 1.4, 1 / 1.4)
        >>> [(e.step, e.onset_step) for e in Oscillation().scan(loss=loss)]
        [(180, 149)]
    """

    _state_keys = ("n", "ml", "vl", "bl", "ng", "mg", "vg", "bg", "ys", "gs", "ls", "ss", "cooldown_left", "lr_only",
                   "lr_top", "lr_new", "last_step")

    def __init__(
        self,
        window: int = 32,
        ratio: float = 2.0,
        frac: float = 0.4,
        spread: float = 2.0,
        efficiency: float = 0.5,
        drop: float = 1.0,
        pattern_p: float = 1e-3,
        shift: float = 2.5,
        grad_shift: float = 1.5,
        shift_ratio: float = 1.5,
        lr_rise: float = 1.5,
        lr_shift: float = 2.0,
        var_alpha: float = 0.1,
        base_alpha: float = 0.005,
        warmup: int = 128,
        cooldown: int = 100,
        signal: str = "loss",
    ) -> None:
        check_range("window", window, 8, None, integer=True)
        check_range("ratio", ratio, 1, None, lo_open=True)
        check_range("frac", frac, 0, 1, lo_open=True)
        check_range("spread", spread, 0, None, lo_open=True)
        check_range("efficiency", efficiency, 0, 1, lo_open=True)
        check_range("drop", drop, 0, None)
        check_range("pattern_p", pattern_p, 0, 1, lo_open=True, hi_open=True)
        check_range("shift", shift, 1, None, lo_open=True)
        check_range("grad_shift", grad_shift, 0, None, lo_open=True)
        check_range("shift_ratio", shift_ratio, 1, ratio, lo_open=True)
        check_range("lr_rise", lr_rise, 1, None, lo_open=True)
        check_range("lr_shift", lr_shift, 1, shift, lo_open=True)
        check_range("var_alpha", var_alpha, 0, 1, lo_open=True, hi_open=True)
        check_range("base_alpha", base_alpha, 0, var_alpha, lo_open=True, hi_open=True)
        check_range("warmup", warmup, 4 * window, None, integer=True)
        check_range("cooldown", cooldown, 0, None, integer=True)
        self.window = window
        self.ratio = ratio
        self.frac = frac
        self.spread = spread
        self.efficiency = efficiency
        self.shift = shift
        self.grad_shift = grad_shift
        self.shift_ratio = shift_ratio
        self.warmup = warmup
        self.cooldown = cooldown
        # the EWMA weights (and the settings read only there) in one tuple: few instance
        # attributes keep attribute access fast (CPython shares an instance dict's keys, and
        # specialises its lookups, only up to 30 of them; about 20 ns a value here)
        self._wts = (float(var_alpha), 1.0 - float(var_alpha), float(base_alpha), 1.0 - float(base_alpha))
        check_signal("signal", signal)
        self.inputs = (Input(signal), Input("grad_norm", required=False), Input("lr", required=False))
        self._cfg_wts = (var_alpha, base_alpha, lr_rise, drop, pattern_p, lr_shift, signal)
        self._reset()

    # settings read off the hot path, kept in one tuple (see ``__init__``)
    var_alpha = _kept(0, "var_alpha")
    base_alpha = _kept(1, "base_alpha")
    lr_rise = _kept(2, "lr_rise")
    drop = _kept(3, "drop")
    pattern_p = _kept(4, "pattern_p")
    lr_shift = _kept(5, "lr_shift")
    signal = _kept(6, "signal")

    def _fires(self, rl: float, rg: float, rlr: float, lr_only: bool, lr_new: bool) -> bool:
        """The second path's verdict on :func:`_shift_test`'s ratios: the loss swings ``shift``
        times as wide and the learning rate rose, or the grad norm moved (not on a watch that a
        learning-rate jump alone armed); or only ``lr_shift`` times as wide when the learning
        rate rose and its last jump took it where the run had never been (``lr_new``).
        """
        if rlr >= self.lr_rise:
            return rl >= (self.lr_shift if lr_new else self.shift)
        return not lr_only and rl >= self.shift and rg >= self.grad_shift

    def _reset(self) -> None:
        w = self.window
        self._n = 0
        self._ml = self._vl = self._bl = 0.0
        self._ng = 0
        self._mg = self._vg = self._bg = 0.0
        self._ys: deque[float] = deque(maxlen=4 * w)
        self._gs: deque[float] = deque(maxlen=4 * w)
        # the learning rate (nan: unknown), aligned with ys once one was seen (empty before)
        self._ls: deque[float] = deque(maxlen=4 * w)
        self._ss: deque[int] = deque(maxlen=3 * w // 2)
        # > 0: values left in the cooldown; < 0: values left in the second path's watch (armed)
        self._cooldown_left = 0
        self._lr_only = False  # the watch was armed by a learning-rate jump alone
        self._lr_top = 0.0  # the highest learning rate so far (0: none known)
        self._lr_new = False  # the last jump took the learning rate lr_rise times above lr_top
        self._last_step = -1

    def _set_state(self, state: dict[str, Any]) -> None:
        super()._set_state(state)
        w = self.window
        self._ys = deque(state["ys"], maxlen=4 * w)
        self._gs = deque((math.nan if v is None else v for v in state["gs"]), maxlen=4 * w)
        self._ls = deque((math.nan if v is None else v for v in state["ls"]), maxlen=4 * w)
        self._ss = deque(state["ss"], maxlen=3 * w // 2)

    def _get_state(self) -> dict[str, Any]:
        st = super()._get_state()
        st["gs"] = [None if v != v else v for v in self._gs]
        st["ls"] = [None if v != v else v for v in self._ls]
        return st

    # the decision, shared by both paths ---------------------------------------------------
    def _confirm(self, ys: Sequence[float], gs: Sequence[float]) -> tuple[bool, float, float]:
        w = self.window
        cur, ref = ys[-w:], ys[:w]
        res, rise = _residuals(cur)
        far = self.spread * _scale(_residuals(ref)[0])
        fl = _frac_out(res, far)
        if fl < 0.5 * self.frac:  # necessary in every branch below: most candidates stop here
            return False, fl, 0.0
        fall = _median(ref) - _median(cur)  # > 0: the loss fell since the reference window
        if fall > 0.0:  # its usual noise, carried to the current level
            fl = _frac_out(res, far * math.exp(fall))
            if fl < 0.5 * self.frac:
                return False, fl, 0.0
        fg = 0.0
        gres: list[float] = []
        gref = _residuals(gs[:w])[0]
        if gref:
            gres = _residuals(gs[-w:])[0]
            fg = _frac_out(gres, self.spread * _scale(gref))
        if gref:  # with a grad norm, both must swing (the grad norm spikes and collapses too)
            ok = (fl >= self.frac and fg >= 0.5 * self.frac) or (fl >= 0.5 * self.frac and fg >= self.frac)
        else:
            ok = fl >= self.frac
        spread = _spread(res)
        if not ok or abs(rise) > self.efficiency * spread:
            return False, fl, fg
        if fall > self.drop * spread:   # still falling since the reference
            return False, fl, fg
        lags = w // 3
        if gref:
            return _ljung_box(res, lags) + _ljung_box(gres, lags) >= _chi2_crit(self.pattern_p, 2 * lags), fl, fg
        return _ljung_box(res, lags) >= _chi2_crit(self.pattern_p, lags), fl, fg

    def _keep_lr(self, lr: float) -> bool:
        """Keep ``lr`` (nan when unknown) aligned with the losses; whether it jumped (``lr_rise``
        times the last known one, or more).
        """
        ls = self._ls
        if not (lr - lr == 0.0 and lr > 0.0):
            if ls:
                ls.append(_NAN)
            return False
        top = self._lr_top
        if lr > top:
            self._lr_top = lr
        if not ls:  # the first one: align it with the losses
            ls.extend([_NAN] * (len(self._ys) - 1))
            ls.append(lr)
            return False
        prev = next((v for v in reversed(ls) if v == v), _NAN)  # the last known one
        ls.append(lr)
        rise = self.lr_rise
        if lr >= rise * prev:
            self._lr_new = lr >= rise * top
            return True
        return False

    def _learn(self, y: float, m: float, v: float, b: float, n: int) -> tuple[float, float, float]:
        if n == 0:
            return y, 0.0, 0.0
        d = y - m
        m = y
        va, vb, ba, bb = self._wts
        v = va * abs(d) + vb * v
        if n < self.warmup:
            an = max(ba, 1.0 / n)
            b = an * v + (1.0 - an) * b
        else:
            b = ba * v + bb * b
        return m, v, b

    def _step(self, x: float, grad: float, lr: float, step: int) -> Event | None:
        self._last_step = step
        if x - x != 0.0 or x <= 0.0:
            return None
        y = _log(x)
        n = self._n
        warm = n >= self.warmup
        bl_prev, bg_prev = self._bl, self._bg
        if warm:  # the steady state, inlined (same arithmetic as _learn)
            va, vb, ba, bb = self._wts
            d = y - self._ml
            self._ml = y
            self._vl = vl = va * abs(d) + vb * self._vl
            self._bl = ba * vl + bb * bl_prev
        else:
            self._ml, vl, self._bl = self._learn(y, self._ml, self._vl, self._bl, n)
            self._vl = vl
        g = _NAN
        if grad - grad == 0.0 and grad > 0.0:
            g = _log(grad)
            if self._ng >= self.warmup:
                va, vb, ba, bb = self._wts
                d = g - self._mg
                self._mg = g
                self._vg = vg = va * abs(d) + vb * self._vg
                self._bg = ba * vg + bb * bg_prev
            else:
                self._mg, vg, self._bg = self._learn(g, self._mg, self._vg, self._bg, self._ng)
                self._vg = vg
            self._ng += 1
        else:
            vg = self._vg
        self._n = n + 1
        self._ys.append(y)
        self._gs.append(g)
        ls = self._ls
        if ls and 0.0 < lr <= ls[-1]:  # the usual step: a known rate that did not rise
            ls.append(lr)
            jumped = False
        elif ls or lr == lr:
            jumped = self._keep_lr(lr)
        else:  # no learning rate so far
            jumped = False
        self._ss.append(step)
        cl = self._cooldown_left
        if cl:
            if cl > 0:
                self._cooldown_left = cl - 1
                return None
            self._cooldown_left = cl + 1  # armed: one value fewer left in the watch
        if not warm:
            return None
        if jumped:  # the step size jumped: (re)arm the second path, on the learning rate's word
            w = self.window
            if not cl:
                self._lr_only = True
            self._cooldown_left = cl = -(4 * w - 3 * w // 2)
        r2 = self.shift_ratio
        if vl > r2 * bl_prev or (bg_prev > 0.0 and vg > r2 * bg_prev):
            w = self.window
            if vl > r2 * bl_prev and (bg_prev <= 0.0 or vg > r2 * bg_prev):
                self._cooldown_left = -(4 * w - 3 * w // 2)  # (re)arm the second path
                self._lr_only = False
            if vl > self.ratio * bl_prev or (bg_prev > 0.0 and vg > self.ratio * bg_prev):
                ok, fl, fg = self._confirm(list(self._ys), list(self._gs))
                if ok:
                    self._cooldown_left = self.cooldown
                    msg = (f"{self.signal} swings widely with no net progress: {100 * fl:.0f}% of the last {w} "
                           f"values lie beyond {self.spread:g} usual deviations"
                           + (f", and {100 * fg:.0f}% of the grad norms" if fg > 0 else "") + ": sawtooth")
                    return make_event(Kind.OSCILLATION, "warning", step, self._ss[-w], type(self).__name__,
                                      self.signal, fl, self.frac, msg)
            if self._cooldown_left >= 0 or n & 3:
                return None
        elif not cl or n & 3:  # the second path: every 4th value while armed
            return None
        rl, rg, rlr = _shift_test(self._ys, self._gs, 3 * self.window // 2, self.efficiency, self._ls)
        if not self._fires(rl, rg, rlr, self._lr_only, self._lr_new):
            return None
        self._cooldown_left = self.cooldown
        w2 = len(self._ss)
        msg = (f"{self.signal} swings {rl:.3g}x as wide ({self.signal} units) over the last {w2} values as over "
               f"the {w2} before the last {w2 + self.window}, with no net progress"
               + (f"; the grad norm moved {rg:.3g}x (its swing or its level)"
                  if self.grad_shift <= rg < math.inf else "")
               + (f"; the learning rate rose {rlr:.3g}x" if rlr >= self.lr_rise else "")
               + (", above any rate the run had used" if rlr >= self.lr_rise and self._lr_new else "")
               + ": step size at the edge of stability")
        return make_event(Kind.OSCILLATION, "warning", step, self._ss[0], type(self).__name__, self.signal,
                          rl, self.lr_shift if rlr >= self.lr_rise and self._lr_new else self.shift, msg)

    def _lr_only_after(self, jumps: np.ndarray, swings: np.ndarray, until: int, watch: int,
                       points: list[int]) -> list[bool]:
        """Whether the watch was armed by a learning-rate jump alone, after the armings at or
        before each of ``points`` (increasing, relative to the block like ``jumps`` and
        ``swings``; ``until`` is the last value the carried-in watch covers). The streaming
        order: a jump arms first, a swing at the same value clears the flag.
        """
        evs = sorted([(int(a), 0) for a in jumps] + [(int(a), 1) for a in swings])
        lr_only, pos, out = self._lr_only, 0, []
        for e in points:
            while pos < len(evs) and evs[pos][0] <= e:
                a, swing = evs[pos]
                if swing:
                    lr_only = False
                elif a > until:
                    lr_only = True
                until = a + watch
                pos += 1
            out.append(lr_only)
        return out

    def _fast(self, arrays: Sequence[np.ndarray], steps: np.ndarray, i: int, j: int) -> int:
        if self._n < self.warmup or self._cooldown_left > 0 or 0 < self._ng < self.warmup:
            return 0
        with np.errstate(divide="ignore", invalid="ignore"):
            y = np.log(arrays[0][i:j])
            g = np.log(arrays[1][i:j])
        g_ok = np.isfinite(g)
        # the loss must be usable; the grad norm must be uniformly present or absent
        if self._ng == 0:
            bad = ~np.isfinite(y) | g_ok
        else:
            bad = ~np.isfinite(y) | ~g_ok
        lim = first_true(bad)
        if lim == 0:
            return 0
        y = y[:lim]
        d = y - shifted(y, self._ml)
        va, vb, ba, bb = self._wts
        vl = ewma(np.abs(d), va, vb, self._vl)
        bl = ewma(vl, ba, bb, self._bl)
        blp = shifted(bl, self._bl)
        ai = np.flatnonzero(vl > self.shift_ratio * blp)  # the loss swings enough to arm
        cand = vl > self.ratio * blp
        if self._ng:
            gg = g[:lim]
            dg = gg - shifted(gg, self._mg)
            vg = ewma(np.abs(dg), va, vb, self._vg)
            bg = ewma(vg, ba, bb, self._bg)
            bgp = shifted(bg, self._bg)
            ai = ai[(bgp[ai] <= 0.0) | (vg[ai] > self.shift_ratio * bgp[ai])]  # and so does the grad norm
            cand |= (bgp > 0.0) & (vg > self.ratio * bgp)
        lr = arrays[2][i:i + lim]
        with np.errstate(invalid="ignore"):
            lr = np.where(np.isfinite(lr) & (lr > 0.0), lr, np.nan)  # unknown: nan, inf and <= 0
        jumps = np.zeros(0, dtype=np.int64)
        new = np.zeros(0, dtype=bool)  # whether each jump went lr_rise times above the highest rate so far
        known = ~np.isnan(lr)
        if self._ls or known.any():  # a learning rate was seen: its jumps arm the watch too
            last0 = next((v for v in reversed(self._ls) if v == v), _NAN)
            idx = np.maximum.accumulate(np.where(known, np.arange(lim), -1))
            ff = np.where(idx >= 0, lr[np.maximum(idx, 0)], last0)  # the last known rate up to each value
            with np.errstate(invalid="ignore"):
                jumps = np.flatnonzero(known & (lr >= self.lr_rise * shifted(ff, last0)))
            top = np.fmax.accumulate(np.concatenate(([self._lr_top], lr)))  # top[i]: the highest before value i
            new = lr[jumps] >= self.lr_rise * top[jumps]
        swings = ai
        if len(jumps):
            ai = np.union1d(ai, jumps)
        w = self.window
        w2, w4 = 3 * w // 2, 4 * w
        # the second path's watch: value indices n0 .. until0 carried in, then a + w4 - w2 after
        # each arming index a; merged into stretches, examined at the multiples of 4 they cover
        watch = w4 - w2
        n0, end = self._n, self._n + lim - 1
        until0 = n0 - self._cooldown_left - 1
        arms = (n0 + ai).tolist()
        stretches: list[tuple[int, int]] = [(n0, until0)] if until0 >= n0 else []
        for a in arms:
            if stretches and a <= stretches[-1][1] + 1:
                stretches[-1] = (stretches[-1][0], max(stretches[-1][1], a + watch))
            else:
                stretches.append((a, a + watch))
        es = np.array([e - n0 for lo, hi in stretches for e in range(-(-lo // 4) * 4, min(hi, end) + 1, 4)],
                      dtype=np.int64)
        # whether each examined value's watch was armed by a learning-rate jump alone
        lr_armed = bool(len(jumps)) or self._lr_only
        flags = np.zeros(len(es), dtype=bool)
        if lr_armed:
            flags[:] = self._lr_only_after(jumps, swings, until0 - n0, watch, es.tolist())
        k = lim
        yext = gext = lext = np.empty(0)
        off = len(self._ys)
        if cand.any() or len(es):
            yext = np.concatenate((np.asarray(self._ys), y))
            gext = np.concatenate((np.asarray(self._gs, dtype=np.float64), g[:lim]))
            lext = np.concatenate((np.full(off - len(self._ls), np.nan), np.asarray(self._ls, dtype=np.float64), lr))
        if cand.any():
            cs = np.flatnonzero(cand)
            # vectorised first stage of the confirmation (its necessary condition), then the
            # shared scalar confirmation on the few windows that pass
            views = np.lib.stride_tricks.sliding_window_view(yext, w)
            cur = _batch_residuals(views[off + cs + 1 - w])
            ref = _batch_residuals(views[off + cs + 1 - w4])
            scale = np.maximum(1.4826 * np.median(np.abs(ref), axis=1), 1e-3)
            fl = (np.abs(cur) > (self.spread * scale)[:, None]).mean(axis=1)
            keep = fl >= 0.5 * self.frac - 1e-9
            if keep.any():  # a looser twin of the pattern test, on the survivors only
                q = _batch_ljung_box(cur[keep], w // 3)
                passed = q >= _chi2_crit(self.pattern_p, w // 3) * (1 - 1e-6)
                if self._ng:
                    gviews = np.lib.stride_tricks.sliding_window_view(gext, w)
                    gw = gviews[off + cs[keep] + 1 - w]
                    qg = _batch_ljung_box(_batch_residuals(gw), w // 3)
                    # a window with a missing grad norm is left to the scalar check (it drops the gaps)
                    qg[~np.isfinite(gw).all(axis=1)] = np.inf
                    passed |= q + qg >= _chi2_crit(self.pattern_p, 2 * (w // 3)) * (1 - 1e-6)
                keep[keep] = passed
            for c in cs[keep]:
                lo = max(0, off + c + 1 - w4)
                if self._confirm(yext[lo:off + c + 1].tolist(), gext[lo:off + c + 1].tolist())[0]:
                    k = int(c)
                    break
        flags, es = flags[es < k], es[es < k]
        if len(es):  # the second path: a vectorised looser twin, then the shared scalar test
            views = np.lib.stride_tricks.sliding_window_view(yext, w2)
            m = len(es)
            both = views[np.concatenate((off + es + 1 - w2, off + es + 1 - w4))]  # current rows, then reference
            med = np.median(both, axis=1)
            lvl = med[:m] - med[m:]
            keep = lvl >= -1e-12
            if keep.any():
                es, lvl, flags = es[keep], lvl[keep], flags[keep]
                both = both[np.concatenate((keep, keep))]
                sc = np.maximum(1.4826 * np.median(np.abs(_batch_residuals(both)), axis=1), 1e-3)
                with np.errstate(over="ignore"):
                    keep = sc[:len(es)] / sc[len(es):] * np.exp(np.maximum(lvl, 0.0)) >= self.lr_shift * (1 - 1e-6)
            if self._ng and keep.any():
                gviews = np.lib.stride_tricks.sliding_window_view(gext, w2)
                gc, gr = gviews[off + es + 1 - w2], gviews[off + es + 1 - w4]
                gsc = np.maximum(1.4826 * np.median(np.abs(_batch_residuals(gc)), axis=1), 1e-3)
                gsr = np.maximum(1.4826 * np.median(np.abs(_batch_residuals(gr)), axis=1), 1e-3)
                with np.errstate(over="ignore", invalid="ignore"):
                    glv = np.exp(np.median(gc, axis=1) - np.median(gr, axis=1))
                gk = np.maximum(gsc / gsr, glv) >= self.grad_shift * (1 - 1e-6)
                # a window with a missing grad norm is left to the scalar test (it drops the gaps)
                gk |= ~(np.isfinite(gc).all(axis=1) & np.isfinite(gr).all(axis=1))
                if not gk.all():  # or the learning rate rose (a window missing one: the scalar test)
                    lviews = np.lib.stride_tricks.sliding_window_view(lext, w2)
                    lc, lrf = lviews[off + es + 1 - w2], lviews[off + es + 1 - w4]
                    lmin = np.where(np.isnan(lc), np.inf, lc).min(axis=1)
                    holes = np.asarray(np.isnan(lrf).any(axis=1))
                    lref = np.median(np.where(holes[:, None], 1.0, lrf), axis=1)
                    with np.errstate(invalid="ignore"):
                        lk = lmin >= self.lr_rise * lref * (1 - 1e-6)
                    lk &= np.isfinite(lmin)
                    gk = gk | holes | lk
                keep &= gk
            at = np.searchsorted(jumps, es[keep], side="right") - 1  # the last jump at or before each
            lr_new = np.where(at >= 0, new[np.maximum(at, 0)] if len(new) else False, self._lr_new)
            for c, only, fresh in zip(es[keep].tolist(), flags[keep].tolist(), lr_new.tolist()):
                lo = off + c + 1 - w4
                rl, rg, rlr = _shift_test(yext[lo:off + c + 1].tolist(), gext[lo:off + c + 1].tolist(), w2,
                                          self.efficiency, lext[lo:off + c + 1].tolist())
                if self._fires(rl, rg, rlr, only, fresh):
                    k = int(c)
                    break
        if k:
            last = max([until0] + [a + watch for a in arms if a < n0 + k])
            if known[:k].any():  # the learning-rate record as of the last value consumed
                self._lr_top = max(self._lr_top, float(np.nanmax(lr[:k])))
                before = jumps[jumps < k]
                if len(before):
                    self._lr_new = bool(new[len(before) - 1])
            if lr_armed:  # the flag as of the last value consumed
                self._lr_only = self._lr_only_after(jumps, swings, until0 - n0, watch, [k - 1])[0]
            self._cooldown_left = min(0, n0 + k - 1 - last)
            self._ml, self._vl, self._bl = float(y[k - 1]), float(vl[k - 1]), float(bl[k - 1])
            if self._ng:
                self._mg, self._vg, self._bg = float(gg[k - 1]), float(vg[k - 1]), float(bg[k - 1])
                self._ng += k
            self._ys.extend(y[max(0, k - w4):k].tolist())
            self._gs.extend(g[max(0, k - w4):k].tolist())
            if self._ls or not np.isnan(lr[:k]).all():  # kept once a learning rate was seen
                if len(self._ls) < len(self._ys):  # (ys gets its new values below)
                    self._ls.extend([_NAN] * (len(self._ys) - len(self._ls)))
                self._ls.extend(lr[max(0, k - w4):k].tolist())
            self._ss.extend(steps[i + max(0, k - w2):i + k].tolist())
            self._n += k
            self._last_step = int(steps[i + k - 1])
        return k
