"""TrainValGap: validation loss rises while training loss keeps falling (overfitting)."""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from .._events import Event, Kind, make_event
from .._validate import check_range
from ._base import Detector, Input
from ._ops import ewma, first_true
from .slope_divergence import window_trend


class TrainValGap(Detector):
    """Flags overfitting, with early-stopping semantics: remembers the best validation step.

    Train loss arrives every step, validation loss every N steps; either may be missing.
    The detector keeps an EWMA (weight ``alpha``) of ``log(train loss)`` and, at each
    validation, the best ``log(val_loss)``; a validation that does not beat the best by
    ``log(1 + min_delta)`` counts toward ``patience``. Overfitting is the validation loss
    rising while the training loss falls, so every alarm needs

    * ``patience`` validations in a row that failed to improve, the latest at least
      ``min_rise`` (relative) above the best;
    * the smoothed train loss at least ``min_train_fall`` (relative) below its value at the
      best validation (train still falling; both rising is a divergence, not overfitting);

    and then one of three kinds of evidence that the rise is not the validation loss's own
    wobble:

    * **break-out**: since the best, validation loss climbs *steadily* -- the least-squares
      slope of ``log(val_loss)`` over the ``n`` validations since the best (the best
      included, the latest ``max_window`` of them) is positive in a one-sided Student-t
      test at level ``1 - confidence``: its t-statistic is at least the ``confidence``
      quantile of Student's t with ``n - 2`` degrees of freedom -- and each of the last
      ``patience`` validations lies further above the best than (a) the largest rise
      ``log(val[j]) - min(log(val[i]), i < j)`` the validation loss made over the
      ``wobble_window`` validations before the best and (b) the largest fall it made from a
      peak since the best. A validation curve measured on a few hundred samples meanders
      by a few percent on its plateau, slowly (a t-statistic over four values does not see
      it as noise), and its best is often one low draw: a rise no larger than the
      meanders it already made, before the best or since, is one more meander, while
      overfitting leaves, and stays out of, the range the curve held while it generalised;
    * **memorisation climb**: the validation loss rose at each of the last ``climb``
      validations while the smoothed train loss fell by at least ``climb_train_fall``
      (relative) over that run of rises. This catches a model that starts memorising a
      small training set right after a noisy phase: the validation loss climbs inside
      the range it meandered over before (so no break-out yet), but a monotone run of
      rises while the training loss collapses -- the generalisation gap widening by a
      factor ``1 / (1 - climb_train_fall)`` or more in a few validations -- is the
      definition of overfitting, not a meander (on a plateau the train loss creeps, it
      does not halve in a few evaluations);
    * **level step**: the validation loss jumped onto a higher level and stays there (a model
      that memorises a small training set within a few evaluations: no steady climb for the
      trend test, and a dip after the jump breaks the run of rises). The last ``patience``
      log validations lie above the ``patience + 1`` up to and including the best in a
      one-sided Welch two-sample t-test at ``confidence`` (Welch-Satterthwaite degrees of
      freedom, so a noisy new level needs a larger gap), each lies beyond the wobble as for
      the break-out, and the smoothed train loss fell by ``climb_train_fall`` since the best:
      a bump of the validation loss while the train loss creeps is a meander that a healthy
      run takes back, while a gap that widens by ``1 / (1 - climb_train_fall)`` is not.

    The trend test's critical value follows its degrees of freedom rather than a fixed
    number: a slope fitted to 4 validations (the best and ``patience = 3`` more) has 2
    degrees of freedom, so its residual scale is itself a noisy estimate and a t-statistic
    of 3 to 4 arises from a flat, noisy curve far more often than a normal tail suggests;
    at ``confidence = 0.975`` the critical value is 4.30 there, 3.18 at 5 validations,
    2.78 at 6 and 2.45 at ``max_window = 8``. Early in a run, when the best validation
    was one low draw, this is what keeps a 4-point wobble from passing as a climb. The
    quantiles are computed with :func:`scipy.stats.t.ppf` once per ``(confidence,
    degrees of freedom)`` and cached, so a validation costs O(1).

    ``onset_step`` and :attr:`best_step` are the step of the best validation: the checkpoint
    to restore. Fires once per new best, and again after a validation has come back at least
    halfway (in log space) from the rise the alarm reported towards the best: that rise was
    taken back, and a run that overfits again later, without ever beating that best, is
    reported again. A validation loss that keeps climbing, or holds its new level, is reported
    once.

    Args:
        patience: validations without improvement, >= 2.
        min_delta: relative improvement that counts as a new best, >= 0.
        min_rise: relative rise above the best that counts as rising, >= 0.
        threshold: ``None`` (default) or a fixed t-statistic, > 0, used *instead of* the
            Student-t critical value (``confidence`` is then ignored); kept for configs
            written before ``confidence`` existed, which used ``threshold=3.0``.
        max_window: most validations in the trend, >= patience + 1.
        min_train_fall: relative fall of the train loss since the best validation, in [0, 1).
        alpha: EWMA weight of the train loss, in (0, 1].
        wobble_window: validations before the best whose largest rise the climb must beat,
            >= 1.
        climb: validations in a row that must each rise over the one before for the
            memorisation climb, >= 2.
        climb_train_fall: relative fall of the smoothed train loss over that run of rises (and,
            for the level step, since the best), in (0, 1).
        confidence: one-sided confidence of the break-out's trend test, in (0.5, 1); the
            slope's t-statistic must reach Student's t quantile at ``confidence`` for the
            window's degrees of freedom.

    Example:
        >>> det = TrainValGap()
        >>> val = {100: 1.0, 200: 0.8, 300: 0.7, 400: 0.72, 500: 0.78, 600: 0.85}
        >>> evs = [det.update(loss=1.0 / (1 + s / 100), val_loss=val.get(s), step=s) for s in range(0, 601, 10)]
        >>> [(e.step, e.onset_step) for evl in evs for e in evl]
        [(600, 300)]

        A climb no larger than a rise the curve already made and took back (0.70 -> 0.74)
        is one more meander:

        >>> det = TrainValGap()
        >>> val = {100: 1.0, 200: 0.8, 300: 0.7, 400: 0.74, 500: 0.69, 600: 0.66, 700: 0.68, 800: 0.69, 900: 0.7}
        >>> [det.update(loss=1.0 / (1 + s / 100), val_loss=val.get(s), step=s) for s in range(0, 901, 10)].count([])
        91

        A climb inside an earlier wobble (0.70 -> 0.90) still counts when it rises at each
        of three validations while the train loss collapses (memorising):

        >>> det = TrainValGap()
        >>> val = {100: 1.0, 200: 0.7, 300: 0.9, 400: 0.69, 500: 0.70, 600: 0.71, 700: 0.72, 800: 0.73}
        >>> loss = lambda s: 1.0 / (1 + s / 100) if s <= 400 else 0.2 * 10 ** ((400 - s) / 200)
        >>> evs = [det.update(loss=loss(s), val_loss=val.get(s), step=s) for s in range(0, 801, 10)]
        >>> [(e.step, e.onset_step) for evl in evs for e in evl]
        [(700, 400)]

        Three rises after the best make a slope with t = 3.9 on 2 degrees of freedom, short
        of the 4.30 that confidence 0.975 asks there; a fourth rise (3 degrees of freedom,
        critical value 3.18) makes it a climb:

        >>> det = TrainValGap()
        >>> val = {100: 1.0, 200: 0.8, 300: 0.6, 400: 0.5, 500: 0.525, 600: 0.525, 700: 0.565, 800: 0.575}
        >>> evs = [det.update(loss=1.0 / (1 + s / 100), val_loss=val.get(s), step=s) for s in range(0, 801, 10)]
        >>> [(e.step, e.onset_step) for evl in evs for e in evl]
        [(800, 400)]
    """

    inputs = (Input("loss", required=False), Input("val_loss", required=False))
    _state_keys = ("n", "train", "best", "best_step", "best_train", "bad", "fired", "since", "hist", "wobble",
                   "peak", "fall", "prev", "rises", "run_train", "last_step")

    def __init__(self, patience: int = 3, min_delta: float = 1e-3, min_rise: float = 0.02,
                 threshold: float | None = None, max_window: int = 8, min_train_fall: float = 0.01,
                 alpha: float = 0.05, wobble_window: int = 32, climb: int = 3,
                 climb_train_fall: float = 0.5, confidence: float = 0.975) -> None:
        check_range("patience", patience, 2, None, integer=True)
        check_range("min_delta", min_delta, 0, None)
        check_range("min_rise", min_rise, 0, None)
        check_range("confidence", confidence, 0.5, 1, lo_open=True, hi_open=True)
        if threshold is not None:
            check_range("threshold", threshold, 0, None, lo_open=True)
        check_range("max_window", max_window, patience + 1, None, integer=True)
        check_range("min_train_fall", min_train_fall, 0, 1, hi_open=True)
        check_range("alpha", alpha, 0, 1, lo_open=True)
        check_range("wobble_window", wobble_window, 1, None, integer=True)
        check_range("climb", climb, 2, None, integer=True)
        check_range("climb_train_fall", climb_train_fall, 0, 1, lo_open=True, hi_open=True)
        self.patience = patience
        self.min_delta = min_delta
        self.min_rise = min_rise
        self.confidence = confidence
        self.threshold = threshold
        self.max_window = max_window
        self.min_train_fall = min_train_fall
        self.alpha = alpha
        self.wobble_window = wobble_window
        self.climb = climb
        self.climb_train_fall = climb_train_fall
        self._a, self._b = float(alpha), 1.0 - float(alpha)
        self._ld = math.log1p(min_delta)
        self._lr = math.log1p(min_rise)
        self._tf = -math.log1p(-min_train_fall)
        self._ctf = -math.log1p(-climb_train_fall)
        self._reset()

    def _reset(self) -> None:
        self._n = 0
        self._train: float | None = None
        self._best: float | None = None
        self._best_step = -1
        self._best_train: float | None = None
        self._bad = 0
        self._fired: float | None = None  # the log rise above the best that alarmed (None: armed)
        self._since: list[float] = []
        self._hist: list[float] = []  # the latest wobble_window log validation losses
        self._wobble = 0.0  # the largest rise among them, taken at the best
        self._peak = 0.0  # the highest log validation since the best
        self._fall = 0.0  # the largest fall from a peak since the best
        self._prev: float | None = None  # the previous log validation
        self._rises = 0  # validations in a row, up to the latest, that rose over the one before
        self._run_train: float | None = None  # smoothed log train loss where that run of rises began
        self._last_step = -1

    @property
    def best_step(self) -> int:
        """Step of the best validation loss so far (-1 before any): the checkpoint to keep."""
        return self._best_step

    def _learn_train(self, loss: float) -> None:
        if loss - loss != 0.0 or loss <= 0.0:
            return
        u = math.log(loss)
        self._train = u if self._train is None else self._a * u + self._b * self._train

    def _val(self, val: float, step: int) -> Event | None:
        if val - val != 0.0 or val <= 0.0:
            return None
        v = math.log(val)
        self._n += 1
        if self._prev is not None and v > self._prev:
            self._rises += 1
        else:
            self._rises = 0
            self._run_train = self._train
        self._prev = v
        if self._best is None or v < self._best - self._ld:
            self._wobble = _largest_rise(self._hist)
            self._push(v)
            self._best = v
            self._best_step = step
            self._best_train = self._train
            self._bad = 0
            self._fired = None
            self._since = [v]
            self._peak = v
            self._fall = 0.0
            return None
        self._push(v)
        self._bad += 1
        self._since.append(v)
        if len(self._since) > self.max_window:
            del self._since[0]
        if v > self._peak:
            self._peak = v
        elif self._peak - v > self._fall:
            self._fall = self._peak - v
        if self._fired is not None:
            if v - self._best <= 0.5 * self._fired:  # half the rise it reported taken back: a new one may alarm
                self._fired = None
            return None
        if self._bad < self.patience or v - self._best < self._lr:
            return None
        tr = self._train
        if tr is None or self._best_train is None or tr > self._best_train - self._tf:
            return None
        held = min(self._since[-self.patience:]) - self._best  # the rise the last `patience` all hold
        wobble = max(self._wobble, self._fall)
        if held > wobble and window_trend(self._since)[1] >= self._critical(len(self._since)):
            how = f"beyond its earlier wobble ({math.expm1(wobble) * 100:.2g}%)"
        elif held > wobble and tr <= self._best_train - self._ctf and self._stepped_up():
            how = (f"on a level above the one it held up to its best, beyond its earlier wobble "
                   f"({math.expm1(wobble) * 100:.2g}%)")
        elif self._rises >= self.climb and self._run_train is not None and tr <= self._run_train - self._ctf:
            how = (f"rising at each of the last {self._rises} evaluations as the train loss fell "
                   f"{-math.expm1(tr - self._run_train) * 100:.3g}% over them (memorising)")
        else:
            return None
        self._fired = v - self._best
        rise = math.expm1(v - self._best) * 100
        fall = -math.expm1(tr - self._best_train) * 100
        msg = (f"val_loss {val:.4g} is {rise:.2g}% above its best {math.exp(self._best):.4g} "
               f"(step {self._best_step}) after {self._bad} evaluations, {how}, while the train loss "
               f"fell {fall:.2g}% since the best: restore the step-{self._best_step} checkpoint")
        return make_event(Kind.OVERFITTING, "warning", step, self._best_step, type(self).__name__, "val_loss",
                          v - self._best, self._lr, msg)

    def _stepped_up(self) -> bool:
        """Whether the last ``patience`` log validations sit above the ``patience + 1`` up to and
        including the best: a one-sided Welch test at ``confidence``.
        """
        k = self.patience
        end = len(self._hist) - 1 - self._bad  # the best's place in the history
        if end + 1 < k + 1:
            return False
        post = self._hist[-k:]
        pre = self._hist[end - k:end + 1]
        mp, mq = sum(post) / k, sum(pre) / (k + 1)
        vp = sum((x - mp) ** 2 for x in post) / (k - 1) / k
        vq = sum((x - mq) ** 2 for x in pre) / k / (k + 1)
        se2 = vp + vq
        if se2 <= 0.0:
            return mp > mq
        dof = se2 * se2 / (vp * vp / (k - 1) + vq * vq / k)  # Welch-Satterthwaite
        return (mp - mq) / math.sqrt(se2) >= self._critical_dof(max(1, int(dof)))

    def _critical(self, n: int) -> float:
        """The t-statistic a slope fitted to ``n`` validations must reach (``n >= 3``)."""
        return self._critical_dof(n - 2)

    def _critical_dof(self, dof: int) -> float:
        """The t-statistic a test with ``dof`` degrees of freedom must reach: ``threshold`` when
        set, else Student's t quantile at ``confidence``.
        """
        if self.threshold is not None:
            return float(self.threshold)
        return _t_quantile(float(self.confidence), dof)

    def _push(self, v: float) -> None:
        self._hist.append(v)
        if len(self._hist) > self.wobble_window:
            del self._hist[0]

    def _step(self, loss: float, val: float, step: int) -> Event | None:
        self._last_step = step
        self._learn_train(loss)
        return self._val(val, step) if val == val else None

    def _fast(self, arrays: Sequence[np.ndarray], steps: np.ndarray, i: int, j: int) -> int:
        """Steps without a validation only move the smoothed train level: one vectorised EWMA."""
        k = first_true(np.isfinite(arrays[1][i:j]))
        if k:
            with np.errstate(divide="ignore", invalid="ignore"):
                u = np.log(arrays[0][i:i + k])
            ug = u[np.isfinite(u)]  # _learn_train skips non-finite and non-positive losses
            if len(ug):
                if self._train is None:
                    self._train, ug = float(ug[0]), ug[1:]
                if len(ug):
                    self._train = float(ewma(ug, self._a, self._b, self._train)[-1])
            self._last_step = int(steps[i + k - 1])
        return k


@functools.lru_cache(maxsize=256)
def _t_quantile(confidence: float, dof: int) -> float:
    """Student's t quantile at ``confidence`` with ``dof`` degrees of freedom, cached."""
    from scipy.stats import t as student_t  # SciPy on first use: `import trainsignals` stays light

    return float(student_t.ppf(confidence, dof))


def _largest_rise(v: list[float]) -> float:
    """``max(v[j] - min(v[:j]))`` over ``j`` (0 for a series that never rises)."""
    best = 0.0
    lo = math.inf
    for x in v:
        if x - lo > best:
            best = x - lo
        if x < lo:
            lo = x
    return best


def sparse_pair(name: str, value: Any) -> tuple[np.ndarray, np.ndarray]:
    """Validate a ``(steps, values)`` pair for a signal sampled at its own cadence."""
    try:
        steps, values = value
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name} must be a (steps, values) pair") from exc
    st = np.asarray(steps)
    vals = np.asarray(values, dtype=np.float64)
    if st.ndim != 1 or vals.ndim != 1 or len(st) != len(vals):
        raise ValueError(f"{name} steps and values must be 1-D of equal length, got {st.shape} and {vals.shape}")
    if len(st) and st.dtype.kind not in "iu":
        if st.dtype.kind == "f" and np.all(st == np.round(st)):
            st = st.astype(np.int64)
        else:
            raise TypeError(f"{name} steps must be integers")
    return st.astype(np.int64), vals


__all__ = ["TrainValGap", "sparse_pair"]
