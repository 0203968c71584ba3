"""EWMASpike: a value far above its own exponentially weighted recent level."""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .._events import Event, Kind, make_event
from .._validate import check_choice, check_range, check_signal
from ._base import Detector, Input
from ._ops import ewma, ewvar, first_true, shifted


class EWMASpike(Detector):
    """Flags a value that jumps far above (or below) its exponentially weighted recent level.

    The detector keeps an EWMA level ``m`` (weight ``alpha``; the default 0.1 is a ~20-step
    average, so one batch moves it by a tenth of its deviation and noise in the level adds only
    5 % to the residuals' variance) and an EWMA variance ``v`` of the innovations (weight
    ``var_alpha``) of ``y = log(x)`` (or ``x`` when ``log=False``)::

        d = y - m
        m <- alpha*y + (1-alpha)*m
        v <- (1-var_alpha) * (v + var_alpha*d*d)

    **Judged one step behind.** A value is folded into ``m`` and ``v`` one step after it arrives
    (the "pending" value), and only if the value after it is not anomalous; so each value is
    judged against statistics that do not contain the value just before it. A bad batch often
    spans two or three steps: the first high value then cannot inflate the scale the second is
    measured against, and when an alarm fires, the value before it stays out too if it was
    already part of the same evidence.

    **Evidence accumulates (a CUSUM).** With ``z = d / sqrt(v + floor**2)`` (``floor`` is
    ``1e-3`` in log space, ``1e-3*|m|`` in linear space, so a flat history does not make every
    wiggle an alarm), the detector keeps ``S <- min(h, max(0, S + z - k))`` with the reference
    ``k = slack*threshold`` and ``h = threshold - k`` (one sum per watched direction). A value
    is *anomalous* when ``S + z - k >= h``: a single value with ``z >= threshold`` (the classic
    rule), or consecutive values whose z-scores exceed ``k`` by ``h`` in total (with the
    defaults, two values at ``z >= 5.25``): the CUSUM design for a shift of ``2k``. An anomalous
    value raises an event when it is also a jump of at least ``min_ratio`` times the level
    (``d >= log(min_ratio)``). Nothing fires during the first ``warmup`` values (``m`` and
    ``v`` are then plain running averages). Everything is relative to the stream's own history.

    **Far above anything recent (the peak rule; log mode).** The z-score under-rates a spike of a
    small loss whose minibatch noise is heavy-tailed in log space: values near zero swing
    ``log(x)`` down by decades, which inflates ``v``, while the spike is still far above every
    value the run produced lately. So a value that is an outlier (``z > k``) is also anomalous
    when it is at least ``peak_ratio`` times the largest of the previous ``peak_window`` values
    (``direction="down"``: at most ``1/peak_ratio`` times the smallest), in linear space. The
    detector keeps those values in a ring buffer (one append per value); the maximum is taken
    only for such outliers. Healthy runs' "normal small spikes" stay well inside it: in the real
    and synthetic suites no healthy loss or gradient norm exceeds 4.4x the largest of its
    previous 50 values (3.7x of 100). Such an event reports ``x / max`` against
    ``peak_ratio`` as its value and threshold (z-score events report ``z`` and ``threshold``).

    **Did it come back?** After a jump the detector watches the next ``hold`` values, against
    the level ``m0`` and scale ``s0`` from before the jump. It *came back* when some value of
    the second half of the watch is within ``min_ratio`` of ``m0`` or within ``settle_z*s0`` of
    it (a burst that settles on a plateau well above ``m0`` has not come back, however far
    below the burst the plateau is). It is *still coming back* when the median of the second
    half is at least ``sqrt(min_ratio)`` below that of the first half: the detector watches
    ``hold`` more values. Otherwise the jump *stayed*: the median of the second half becomes the
    new level and, with ``persist_kind``, a ``critical`` event of that kind is raised, with
    ``onset_step`` at the jump (the loss jumped and did not recover: training is lost).

    Other policies: while a jump is watched, no new event is raised for it; anomalous values
    never update ``m``/``v`` (unless ``learn_on_alarm``); more
    than ``hold`` consecutive anomalous values without a jump-sized one make the newest value the
    new level; after an event no new event is emitted for ``cooldown`` values; when
    ``escalate_after`` events fall within ``escalate_window`` steps the event is ``critical``
    (frequent spikes precede divergence). Per value the detector does O(1) work on floats; the
    peak rule's O(``peak_window``) extreme is taken only for outliers.

    Args:
        alpha: EWMA weight of the newest value in the level, in (0, 1).
        var_alpha: EWMA weight of the newest innovation in the variance, in (0, 1).
        threshold: z-score of a single value that counts as anomalous, > 0.
        min_ratio: smallest jump factor that counts, >= 1.
        warmup: values learned before any alarm, >= 2.
        log: watch ``log(x)`` (for positive signals spanning orders of magnitude).
        direction: ``"up"``, ``"down"`` or ``"both"``.
        cooldown: values after an event during which no event is emitted, >= 0.
        hold: values watched after a jump before deciding whether it came back; also the
            longest run of anomalous values before the level is re-based, >= 1.
        learn_on_alarm: let anomalous values update the statistics.
        escalate_after: events within ``escalate_window`` that make an event critical (0: never).
        escalate_window: the window, in steps, for escalation.
        kind: the :class:`~trainsignals.Kind` value of its events.
        signal: the signal name used in events.
        severity: severity of a single event.
        persist_kind: the kind of the ``critical`` event raised when a jump stayed (see above);
            None: just re-base.
        settle_z: how many pre-jump scales from the old level a value may be and still count
            as back, >= 0.
        slack: the CUSUM reference ``k`` as a fraction of ``threshold``, in (0, 1]; 1 judges
            every value on its own (``z >= threshold``).
        peak_ratio: how many times the largest of the previous ``peak_window`` values an
            outlier must reach to be anomalous whatever its z-score (the peak rule, above), > 1;
            None: no peak rule. Used only with ``log=True`` (a ratio needs positive values).
        peak_window: how many previous values the peak rule compares with, >= 1.

    Example:
        A loss that falls with small noise, then jumps 4x for two steps at step 60:

        >>> import numpy as np
        >>> rng = np.random.default_rng(0)
        >>> loss = 2.0 * np.exp(-np.arange(100) / 80) * np.exp(rng.normal(0, 0.02, 100))
        >>> loss[60:62] *= 4.0
        >>> [e.step for e in EWMASpike().scan(loss=loss)]
        [60]

        A network that dies: the loss bursts to 1e6, then sits on a plateau 6x its old level
        (below the burst, but not back; the fall from the burst reads as "still coming back",
        so the verdict comes after a second watch of ``hold`` values):

        >>> loss = 0.4 * np.exp(rng.normal(0, 0.3, 300))
        >>> loss[150:156] = [150.0, 15.0, 20.0, 1e3, 1e6, 3e4]
        >>> loss[156:] = 2.3 * np.exp(rng.normal(0, 0.05, 144))
        >>> [(e.step, e.kind.value, e.onset_step) for e in EWMASpike(persist_kind="divergence").scan(loss=loss)]
        [(150, 'loss_spike', 150), (170, 'divergence', 150)]

        A small loss whose minibatch noise spans decades in log space, then one bad batch: the
        jump's z-score stays below ``threshold``, but it is 32x the largest recent value:

        >>> rng = np.random.default_rng(0)
        >>> loss = 0.05 * np.exp(rng.normal(0, 1.0, 300))
        >>> loss[200] = 10.0
        >>> [e.step for e in EWMASpike(peak_ratio=None).scan(loss=loss)]
        []
        >>> [e.step for e in EWMASpike().scan(loss=loss)]
        [200]
    """

    _state_keys = ("n", "mean", "var", "pending", "has_pending", "run", "acc_up", "acc_dn", "ep",
                   "ep_left", "ep_start", "ep_ref", "ep_scale", "ep_sign", "ep_guard", "ep_gref", "ep_gheld", "glevel",
                   "gn", "cooldown_left", "alarms", "alarm_g", "last_step", "recent")

    def __init__(
        self,
        alpha: float = 0.1,
        var_alpha: float = 0.05,
        threshold: float = 7.0,
        min_ratio: float = 1.5,
        warmup: int = 20,
        log: bool = True,
        direction: str = "up",
        cooldown: int = 5,
        hold: int = 10,
        learn_on_alarm: bool = False,
        escalate_after: int = 3,
        escalate_window: int = 200,
        kind: str = "loss_spike",
        signal: str = "loss",
        severity: str = "warning",
        persist_kind: str | None = None,
        settle_z: float = 2.0,
        slack: float = 0.5,
        peak_ratio: float | None = 5.0,
        peak_window: int = 100,
    ) -> None:
        check_range("alpha", alpha, 0, 1, lo_open=True, hi_open=True)
        check_range("var_alpha", var_alpha, 0, 1, lo_open=True, hi_open=True)
        check_range("threshold", threshold, 0, None, lo_open=True)
        check_range("min_ratio", min_ratio, 1, None)
        check_range("warmup", warmup, 2, None, integer=True)
        check_choice("direction", direction, ("up", "down", "both"))
        check_range("cooldown", cooldown, 0, None, integer=True)
        check_range("hold", hold, 1, None, integer=True)
        check_range("escalate_after", escalate_after, 0, None, integer=True)
        check_range("escalate_window", escalate_window, 1, None, integer=True)
        check_choice("kind", kind, tuple(k.value for k in Kind))
        check_choice("severity", severity, ("info", "warning", "critical"))
        check_range("settle_z", settle_z, 0, None)
        check_range("slack", slack, 0, 1, lo_open=True)
        if peak_ratio is not None:
            check_range("peak_ratio", peak_ratio, 1, None, lo_open=True)
        check_range("peak_window", peak_window, 1, None, integer=True)
        if persist_kind is not None:
            check_choice("persist_kind", persist_kind, tuple(k.value for k in Kind))
        self.alpha = alpha
        self.var_alpha = var_alpha
        self.threshold = threshold
        self.min_ratio = min_ratio
        self.warmup = warmup
        self.log = bool(log)
        self.direction = direction
        self.cooldown = cooldown
        self.hold = hold
        self.learn_on_alarm = bool(learn_on_alarm)
        self.escalate_after = escalate_after
        self.escalate_window = escalate_window
        self.kind = kind
        check_signal("signal", signal)
        self.signal = signal
        self.inputs = self._inputs()
        self.severity = severity
        self.persist_kind = persist_kind
        self.settle_z = settle_z
        self.slack = slack
        self.peak_ratio = peak_ratio
        self.peak_window = peak_window
        # the peak rule's ring buffer; maxlen 0 (appends discard) when the rule is off
        self._peak = float(peak_ratio) if peak_ratio is not None else math.inf
        self._peak_n = peak_window if (self.log and peak_ratio is not None) else 0
        self._k = float(slack) * float(threshold)
        self._h = float(threshold) - self._k
        self._lo_k = -self._k if direction != "up" else -math.inf
        self._hi_k = self._k if direction != "down" else math.inf
        self._up = direction != "down"
        self._dn = direction != "up"
        self._a = float(alpha)
        self._b = 1.0 - float(alpha)
        self._va = float(var_alpha)
        self._vb = 1.0 - float(var_alpha)
        self._vba = self._vb * self._va
        self._min_jump = math.log(min_ratio) if self.log else float(min_ratio) - 1.0
        self._kind = Kind(kind)
        self._reset()

    def _reset(self) -> None:
        self._n = 0
        self._mean = 0.0
        self._var = 0.0
        self._pending = 0.0
        self._has_pending = False
        self._run = 0
        self._acc_up = 0.0
        self._acc_dn = 0.0
        self._ep: list[float] = []
        self._ep_left = 0
        self._ep_start = -1
        self._ep_ref = 0.0
        self._ep_scale = 0.0
        self._ep_sign = 1.0
        self._ep_guard: list[float] = []
        self._ep_gref = 0.0
        self._ep_gheld = False
        self._glevel = 0.0
        self._gn = 0
        self._cooldown_left = 0
        self._alarms: list[int] = []
        self._alarm_g: list[float | None] = []
        self._last_step = -1
        self._recent: deque[float] = deque(maxlen=self._peak_n)

    def _set_state(self, state: dict[str, Any]) -> None:
        super()._set_state(state)
        self._recent = deque(state["recent"], maxlen=self._peak_n)

    def _learn(self) -> None:
        """Fold the pending value into the level and the variance."""
        y = self._pending
        n = self._n
        if n >= self.warmup:
            d = y - self._mean
            self._mean = self._a * y + self._b * self._mean
            self._var = self._vb * self._var + self._vba * (d * d)
        elif n == 0:
            self._mean = y
            self._var = 0.0
        else:
            an = max(self._a, 1.0 / (n + 1))
            d = y - self._mean
            self._mean = self._mean + an * d
            self._var = (1.0 - an) * (self._var + an * d * d)
        self._n = n + 1
        self._has_pending = False

    def _inputs(self) -> tuple[Input, ...]:
        return (Input(self.signal),)

    def _spike(self, x: float, step: int) -> Event | None:
        self._last_step = step
        if x - x != 0.0:
            return None
        if self.log:
            if x <= 0.0:
                return None
            y = math.log(x)
        else:
            y = x
        if self._n < self.warmup:
            if self._has_pending:
                self._learn()
            self._pending = y
            self._has_pending = True
            self._recent.append(x)
            return None
        mean = self._mean
        d = y - mean
        if self.log:
            scale = math.sqrt(self._var + 1e-6)
        else:
            f = 1e-3 * abs(mean)
            scale = math.sqrt(self._var + (f * f + 1e-300))
        z = d / scale
        if (self._lo_k <= z <= self._hi_k and self._has_pending
                and not (self._acc_up or self._acc_dn or self._cooldown_left or self._ep_left or self._run)):
            # the common case: fold the previous value in, this one waits a step
            p = self._pending
            dp = p - mean
            self._mean = self._a * p + self._b * mean
            self._var = self._vb * self._var + self._vba * (dp * dp)
            self._n += 1
            self._pending = y
            self._recent.append(x)
            return None
        return self._judge(x, y, d, z, scale, step)


    _step: Callable[..., Event | list[Event] | None] = _spike
    def _judge(self, x: float, y: float, d: float, z: float, scale: float, step: int) -> Event | None:  # noqa: C901
        mean = self._mean
        k, h = self._k, self._h
        anomalous = False
        sign = 1.0
        peak = None  # (the recent extreme, how many values) when the peak rule made the value anomalous
        was_up, was_dn = self._acc_up > 0.0, self._acc_dn > 0.0
        recent = self._recent
        if self._up:
            raw = self._acc_up + z - k
            anomalous = raw >= h
            self._acc_up = 0.0 if raw < 0.0 else (h if raw > h else raw)
            if not anomalous and z > k and recent:
                top = max(recent)
                if x >= self._peak * top:
                    anomalous, peak = True, (top, len(recent))
        if self._dn:
            raw = self._acc_dn - z - k
            if raw >= h and not anomalous:
                anomalous, sign = True, -1.0
            self._acc_dn = 0.0 if raw < 0.0 else (h if raw > h else raw)
            if not anomalous and -z > k and recent:
                bottom = min(recent)
                if x * self._peak <= bottom:
                    anomalous, sign, peak = True, -1.0, (bottom, len(recent))
        recent.append(x)
        suppress = self._cooldown_left > 0
        if suppress:
            self._cooldown_left -= 1
        ev = None
        watching = self._ep_left > 0
        if watching:
            self._ep.append(y)
            self._ep_left -= 1
        if not anomalous:
            self._run = 0
            if self._has_pending:
                self._learn()
            self._pending = y
            self._has_pending = True
        else:
            self._run += 1
            if self._has_pending:
                # the value before, if it was already part of this jump's evidence, stays out
                if self.learn_on_alarm or not (was_up if sign > 0 else was_dn):
                    self._learn()
                else:
                    self._has_pending = False
            if self.learn_on_alarm:
                self._pending = y
                self._has_pending = True
            da = sign * d
            big = (da if self.log else da / (abs(mean) + 1e-300)) >= self._min_jump
            if big and not watching:
                if not suppress:
                    ev = self._event(x, y, z, mean, step, peak)
                self._ep = []
                self._ep_guard = []
                self._ep_left = self.hold
                self._ep_start = step
                self._ep_ref = mean
                self._ep_scale = scale
                self._ep_sign = sign
                self._ep_gref = self._glevel
                self._ep_gheld = self._gn > 0
            elif self._run > self.hold and not watching:
                self._rebase(y)  # a lasting shift too small to count as a jump: the new normal
        if watching and self._ep_left == 0:
            persisted = self._settle()
            if persisted is not None:
                return persisted
        return ev

    def _settle(self) -> Event | None:
        """``hold`` values after a jump: came back, still coming back (watch on), or stayed up."""
        vals = self._ep
        half = len(vals) // 2
        tail = vals[half:]
        ref = self._ep_ref
        sign = self._ep_sign
        unit = 1.0 if self.log else abs(ref) + 1e-300
        guard = self._ep_guard[len(self._ep_guard) // 2:]
        self._ep = []
        self._ep_guard = []
        rise = min(sign * (v - ref) for v in tail)  # the value that came back the most
        if rise / unit < self._min_jump or rise < self.settle_z * self._ep_scale:
            return None  # came back
        level = statistics.median(tail)
        if half and sign * (statistics.median(vals[:half]) - level) / unit >= 0.5 * self._min_jump:
            self._ep_left = self.hold  # still coming back: watch another hold values
            return None
        self._rebase(level)
        if self.persist_kind is None:
            return None
        fell = None
        if guard and self._ep_gheld:
            fell = (math.exp(self._ep_gref), math.exp(statistics.median(guard)))
            if fell[1] > fell[0]:
                fell = None
        return self._persist_event(level, ref, self._ep_start, self._last_step, fell)

    def _rebase(self, level: float) -> None:
        self._mean = level
        self._has_pending = False
        self._run = 0
        self._acc_up = self._acc_dn = 0.0

    def _persist_event(self, level: float, ref: float, onset: int, step: int,
                       fell: tuple[float, float] | None) -> Event:
        now = math.exp(level) if self.log else level
        before = math.exp(ref) if self.log else ref
        ratio = now / before if before != 0 else math.inf
        msg = (f"{self.signal} jumped at step {onset} and did not come back: {step - onset} steps later its median "
               f"level {now:.4g} is {ratio:.3g}x the level {before:.4g} before the jump")
        severity = "critical"
        if fell is not None:
            severity = "warning"
            msg += (f", while the guard signal did not rise ({fell[0]:.4g} -> {fell[1]:.4g}): not a divergence "
                    f"(a falling loss with a jumped gradient norm points to a silent collapse)")
        return make_event(Kind(self.persist_kind), severity, step, onset, type(self).__name__,
                          self.signal, ratio, self.min_ratio, msg)

    def _event(self, x: float, y: float, z: float, mean: float, step: int,
               peak: tuple[float, int] | None = None) -> Event:
        self._cooldown_left = self.cooldown
        keep = [k for k, s in enumerate(self._alarms) if s > step - self.escalate_window]
        alarms = [self._alarms[k] for k in keep] + [step]
        guards = [self._alarm_g[k] for k in keep] + [self._glevel if self._gn else None]
        self._alarms = alarms
        self._alarm_g = guards
        severity = self.severity
        extra = ""
        if self.escalate_after and len(alarms) >= self.escalate_after:
            severity = "critical"
            extra = f"; {len(alarms)} such events within {self.escalate_window} steps"
            first = guards[0]
            if first is not None and self._glevel <= first:
                severity = self.severity
                extra += f", but the guard signal did not rise ({math.exp(first):.4g} -> {math.exp(self._glevel):.4g})"
        level = math.exp(mean) if self.log else mean
        ratio = x / level if level != 0 else math.inf
        word = "jumped" if (self.direction != "down" and z > 0) else "dropped"
        value, threshold = z, self.threshold
        if peak is not None:
            top, count = peak
            threshold = self._peak
            if x > top:
                value = x / top
                extra = f", {value:.3g}x the largest of the previous {count} values ({top:.4g}){extra}"
            else:
                value = top / x
                extra = f", 1/{value:.3g} of the smallest of the previous {count} values ({top:.4g}){extra}"
        msg = f"{self.signal} {word} to {x:.4g}, {ratio:.3g}x its recent level {level:.4g} (z={z:.1f}){extra}"
        return make_event(self._kind, severity, step, step, type(self).__name__, self.signal,
                          value, threshold, msg)

    def _fast(self, arrays: Sequence[np.ndarray], steps: np.ndarray, i: int, j: int) -> int:
        if (self._n < self.warmup or not self._has_pending or self._cooldown_left or self._run or self._ep_left
                or self._acc_up or self._acc_dn):
            return 0
        x = arrays[0][i:j]
        if self.log:
            with np.errstate(divide="ignore", invalid="ignore"):
                y = np.log(x)
        else:
            y = x
        lim = first_true(~np.isfinite(y))
        if lim == 0:
            return 0
        y = y[:lim]
        # the value learned at each step is the one before it (the pending value first)
        u = np.concatenate(([self._pending], y[:-1]))
        m0, v0 = self._mean, self._var
        m = ewma(u, self._a, self._b, m0)
        mp = shifted(m, m0)
        du = u - mp
        v = ewvar(du * du, self._va, self._vb, v0)
        vp = shifted(v, v0)
        d = y - mp
        if self.log:
            z = d / np.sqrt(vp + 1e-6)
        else:
            f = 1e-3 * np.abs(mp)
            z = d / np.sqrt(vp + (f * f + 1e-300))
        k = lim
        acc_up = acc_dn = 0.0
        if self._up:
            k, acc_up = self._evidence(z, k)
        if self._dn:
            k2, acc_dn = self._evidence(-z, k)
            if k2 < k:
                k, acc_up = k2, self._evidence(z, k2)[1] if self._up else 0.0
        w = self._peak_n
        if w and k:
            c = self._peaked(x, z, k)
            if c < k:
                k = c
                acc_up = self._evidence(z, c)[1] if self._up else 0.0
                acc_dn = self._evidence(-z, c)[1] if self._dn else 0.0
        if k:
            if w:
                self._recent.extend(x[max(0, k - w):k].tolist())
            self._mean = float(m[k - 1])
            self._var = float(v[k - 1])
            self._n += k
            self._pending = float(y[k - 1])
            self._acc_up, self._acc_dn = acc_up, acc_dn
            self._last_step = int(steps[i + k - 1])
        return k

    def _peaked(self, x: np.ndarray, z: np.ndarray, lim: int) -> int:
        """Index of the first outlier in ``x[:lim]`` that the peak rule makes anomalous, or ``lim``."""
        kk, w, r = self._k, self._peak_n, self._peak
        zz = z[:lim]
        up = (zz > kk) if self._up else np.zeros(lim, dtype=bool)
        dn = (zz < -kk) if self._dn else np.zeros(lim, dtype=bool)
        cs = np.flatnonzero(up | dn)
        if not len(cs) or not self._recent:
            return lim
        # the ``w`` values before each outlier: the kept recent values, then this block's
        rec = np.asarray(self._recent, dtype=np.float64)
        pad = max(0, w - len(rec))
        pos = cs + len(rec) + pad
        xs = x[cs]
        hit = np.zeros(len(cs), dtype=bool)
        for side, fill, reduce in ((up, -np.inf, np.max), (dn, np.inf, np.min)):
            sel = side[cs]
            if not sel.any():
                continue
            ext = np.concatenate((np.full(pad, fill), rec, x[:lim]))
            ref = reduce(np.lib.stride_tricks.sliding_window_view(ext, w)[pos[sel] - w], axis=1)
            hit[sel] = xs[sel] >= r * ref if fill < 0 else xs[sel] * r <= ref
        return int(cs[np.argmax(hit)]) if hit.any() else lim

    def _evidence(self, z: np.ndarray, lim: int) -> tuple[int, float]:
        """Run the CUSUM over ``z[:lim]`` from 0: (index of the first anomalous value or ``lim``, the sum there)."""
        kk, h = self._k, self._h
        acc = 0.0
        end = 0
        for c in np.flatnonzero(z[:lim] > kk).tolist():
            if c < end:
                continue
            t = c
            acc = 0.0
            while t < lim:
                raw = acc + float(z[t]) - kk
                if raw >= h:
                    return t, acc
                acc = 0.0 if raw < 0.0 else (h if raw > h else raw)
                if acc == 0.0:
                    break
                t += 1
            end = t + 1
        return lim, acc if end >= lim else 0.0


class GuardedEWMASpike(EWMASpike):
    """:class:`EWMASpike` with a second, optional *guard* signal that vets its ``critical`` events.

    Same rule, arguments and events as :class:`EWMASpike` on its first signal ``x``. The guard
    (the loss, when ``x`` is the gradient norm) only decides whether an event is ``critical``:
    the detector keeps an EWMA (weight ``alpha``) of ``log(guard)``, and

    * a jump that did not come back raises its ``persist_kind`` event as a ``warning`` instead
      of ``critical`` when the median of ``log(guard)`` over the second half of the final watch
      is not above that level just before the jump;
    * frequent events are not escalated to ``critical`` when the guard's level has not risen
      since the first of the ``escalate_after`` events.

    A gradient norm that jumps (or keeps jumping) while the loss falls or stays put is not a run
    being lost: loss down with the grad norm up is the decoupling of a silent collapse, which the
    loss/grad-norm coupling check reports, and a loss that does climb is caught on the loss
    itself. A guard that is missing (``nan``) or non-positive at a step is not used.

    Example:
        A gradient norm that steps up 30x and stays, once with the loss climbing, once with it
        falling fast (labels collapsed to one class):

        >>> import numpy as np
        >>> rng = np.random.default_rng(1)
        >>> g = np.exp(rng.normal(0, 0.05, 200))
        >>> g[100:] *= 30.0
        >>> up = np.exp(rng.normal(0, 0.02, 200))
        >>> up[100:] *= np.exp(np.arange(100) / 20)
        >>> down = 2.0 * np.exp(rng.normal(0, 0.02, 200))
        >>> down[100:] *= np.exp(-np.arange(100) / 5)
        >>> kw = dict(kind="grad_explosion", signal="grad_norm", min_ratio=10.0, threshold=6.0,
        ...           persist_kind="grad_explosion")
        >>> [(e.step, e.severity) for e in GuardedEWMASpike(**kw).scan(grad_norm=g, loss=up) if "come back" in e.message]
        [(110, 'critical')]
        >>> [(e.step, e.severity) for e in GuardedEWMASpike(**kw).scan(grad_norm=g, loss=down) if "come back" in e.message]
        [(110, 'warning')]
    """

    def _inputs(self) -> tuple[Input, ...]:
        return (Input(self.signal), Input("loss", required=False))

    def _step(self, x: float, g: float, step: int) -> Event | None:
        gl = None
        if g - g == 0.0 and g > 0.0:
            gl = math.log(g)
            if self._ep_left > 0 and x - x == 0.0 and (x > 0.0 or not self.log):
                self._ep_guard.append(gl)
        ev = self._spike(x, step)
        if gl is not None:
            self._glevel = self._a * gl + self._b * self._glevel if self._gn else gl
            self._gn += 1
        return ev

    def _fast(self, arrays: Sequence[np.ndarray], steps: np.ndarray, i: int, j: int) -> int:
        k = super()._fast(arrays[:1], steps, i, j)
        if k:
            with np.errstate(divide="ignore", invalid="ignore"):
                lg = np.log(arrays[1][i:i + k])
            vals = lg[np.isfinite(lg)]
            if len(vals) and not self._gn:
                self._glevel = float(vals[0])
                self._gn = 1
                vals = vals[1:]
            if len(vals):
                self._glevel = float(ewma(vals, self._a, self._b, self._glevel)[-1])
                self._gn += len(vals)
        return k
