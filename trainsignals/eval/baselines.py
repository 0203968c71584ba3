"""What users watch their runs with today, re-implemented as honest streaming baselines.

Each baseline re-implements the *documented* semantics of a tool people already use to
guard a training run, and streams through a labeled curve one value at a time, in order,
as the tool would see it during training. The bench (:mod:`trainsignals.eval.bench`) scores
them on the same labeled suites as trainsignals' own detectors.

A baseline has a ``name``, ``reset()`` and ``run(curve) -> list[Alarm]``. ``run`` accepts
any object with the attributes it needs (``steps``, ``loss``, ``grad_norm``,
``val_steps``/``val_loss``); a missing attribute means the tool has nothing to watch and
raises no alarm. Each :class:`Alarm` carries the :class:`~trainsignals.Kind` value that the
tool's semantics imply, so right-kind detection can be scored:

* :class:`NaNStop` (Keras ``TerminateOnNaN``) watches the loss: ``nonfinite``;
* :class:`LightningEarlyStopping` watches the train or validation loss: ``nonfinite``,
  ``divergence``, and ``stall`` (train loss) or ``overfitting`` (validation loss);
* :class:`RiverPageHinkley` and :class:`RiverADWIN` watch the finite train loss:
  ``divergence`` (level up) or ``stall`` (level down);
* :class:`ZClip` watches the gradient norm: ``grad_explosion``;
* the SageMaker Debugger built-in rules, with their published default parameters, each on the
  signal it reads: :class:`SageMakerVanishingGradient` (per-layer grad norms:
  ``vanishing_gradient``), :class:`SageMakerLossNotDecreasing` (train loss: ``stall``),
  :class:`SageMakerOverfit` (train and validation loss: ``overfitting``),
  :class:`SageMakerDeadRelu` (dead-unit fractions: ``dead_units``),
  :class:`SageMakerWeightUpdateRatio` (update ratio: ``update_ratio_high`` /
  ``update_ratio_low``) and :class:`SageMakerExplodingTensor` (every scalar: ``nonfinite``).
  A SageMaker rule stops evaluating once its condition is met (the rule job ends with
  "IssuesFound"), so each raises at most one alarm. A rule's ``kinds`` attribute lists the
  kinds its signal can name; the bench scores it on those kinds only.

The river baselines need the optional ``river`` package (``pip install trainsignals[baselines]``);
it is imported when such a baseline is first run, never by ``import trainsignals``.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from trainsignals._validate import check_choice, check_range

__all__ = [
    "Alarm",
    "Baseline",
    "LightningEarlyStopping",
    "NaNStop",
    "RiverADWIN",
    "RiverPageHinkley",
    "SageMakerDeadRelu",
    "SageMakerExplodingTensor",
    "SageMakerLossNotDecreasing",
    "SageMakerOverfit",
    "SageMakerVanishingGradient",
    "SageMakerWeightUpdateRatio",
    "ZClip",
    "default_baselines",
    "sagemaker_rules",
]


@dataclass(frozen=True, slots=True)
class Alarm:
    """One alarm raised by a baseline (or a normalised detector event in the bench).

    Attributes:
        step: The step at which the alarm was raised.
        kind: The failure kind implied by the tool's semantics (a ``Kind`` value string).
        onset_step: The step the tool says the failure began, where it says one
            (trainsignals events do; the baselines do not, and leave ``None``).
        detector: The rule that raised it, where the tool names one (a trainsignals event's
            ``detector``; ``None`` for the baselines): which rule to look at for a false alarm.
    """

    step: int
    kind: str
    onset_step: int | None = None
    detector: str | None = field(default=None, compare=False)

    def __repr__(self) -> str:
        extra = "" if self.onset_step is None else f", onset_step={self.onset_step}"
        by = "" if self.detector is None else f", detector={self.detector!r}"
        return f"Alarm(step={self.step}, kind={self.kind!r}{extra}{by})"


@runtime_checkable
class Baseline(Protocol):
    """The protocol every baseline follows."""

    name: str

    def reset(self) -> None:
        """Forget everything seen so far."""

    def run(self, curve: Any) -> list[Alarm]:
        """Stream through ``curve`` in step order and return the alarms raised."""


# --------------------------------------------------------------------------- helpers


def _series(curve: Any, attr: str) -> np.ndarray | None:
    values = getattr(curve, attr, None)
    if values is None:
        return None
    arr = np.asarray(values, dtype=np.float64)
    return arr if arr.size else None


def _steps(curve: Any, n: int) -> list[int]:
    steps = getattr(curve, "steps", None)
    if steps is None:
        return list(range(n))
    return [int(s) for s in np.asarray(steps)[:n]]


def _stream(curve: Any, attr: str) -> Iterator[tuple[int, float]]:
    """Yield ``(step, value)`` of a dense per-step signal, in order."""
    values = _series(curve, attr)
    if values is None:
        return iter(())
    return zip(_steps(curve, len(values)), values.tolist(), strict=False)


def _finite_first(values: np.ndarray | None) -> float | None:
    if values is None:
        return None
    finite = values[np.isfinite(values)]
    return float(finite[0]) if finite.size else None


# --------------------------------------------------------------------------- NaN stop


class NaNStop:
    """Keras ``TerminateOnNaN``: stop at the first batch whose loss is NaN or Inf.

    Keras documents the callback as terminating training when a NaN loss is
    encountered; it checks the batch loss at the end of every batch with
    ``isnan or isinf``. Here: the first step whose loss is not finite raises
    ``Alarm(step, "nonfinite")`` and the run stops (nothing later is seen).

    Example:
        >>> import numpy as np
        >>> from types import SimpleNamespace
        >>> run = SimpleNamespace(loss=np.array([2.0, 1.5, np.nan, 1.0, np.inf]))
        >>> NaNStop().run(run)
        [Alarm(step=2, kind='nonfinite')]
    """

    def __init__(self, name: str = "nan-stop") -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"NaNStop(name={self.name!r})"

    def reset(self) -> None:
        """Stateless between runs; nothing to forget."""

    def run(self, curve: Any) -> list[Alarm]:
        """Stream the loss; alarm and stop at the first non-finite value."""
        for step, x in _stream(curve, "loss"):
            if not math.isfinite(x):
                return [Alarm(step, "nonfinite")]
        return []


# --------------------------------------------------------------------------- Lightning


class LightningEarlyStopping:
    """PyTorch Lightning ``EarlyStopping``, checked at its usual cadence.

    Lightning documents ``EarlyStopping(monitor, min_delta=0.0, patience=3, mode="min",
    check_finite=True, stopping_threshold=None, divergence_threshold=None)``. At each
    check, with the monitored value ``v`` (mode ``"min"``; ``"max"`` mirrors it), the
    first rule that applies decides:

    1. ``check_finite`` and ``v`` is NaN/Inf: stop -> ``Alarm(step, "nonfinite")``.
    2. ``stopping_threshold`` is set and ``v < stopping_threshold``: stop because the
       run is good enough. That is success, not a failure: no alarm, the run just stops.
    3. ``divergence_threshold`` is set and ``v > divergence_threshold``: stop ->
       ``Alarm(step, "divergence")``.
    4. ``v < best - min_delta`` (an improvement by more than ``min_delta``; the best
       starts at +inf): ``best = v`` and the wait count goes back to 0.
    5. otherwise the wait count grows by one; when it reaches ``patience``: stop ->
       ``Alarm(step, "stall")`` when monitoring the train loss, ``"overfitting"`` when
       monitoring the validation loss.

    After a stop nothing more is seen, so a run yields at most one alarm.

    Cadence: ``patience`` counts *checks*, not steps. With ``monitor="val_loss"`` a
    check happens at every validation step of the curve. With ``monitor="loss"`` a check
    happens every ``check_every`` steps (after steps ``check_every - 1``,
    ``2 * check_every - 1``...), as when the callback runs at validation end, and sees
    the train loss logged at that step (``self.log`` in ``training_step`` defaults to
    ``on_step=True``, so the callback reads the latest value).

    ``divergence_factor`` is a bench convenience, not a Lightning parameter: when set,
    ``divergence_threshold`` becomes ``divergence_factor`` times the first finite value
    of the monitored series, standing in for a user who knows the scale of their initial
    loss and writes down an absolute threshold. Both cannot be given.

    Args:
        monitor: ``"loss"`` (train loss) or ``"val_loss"``.
        patience: Checks without improvement before stopping (>= 1).
        min_delta: Minimum improvement (>= 0) for a check to count as one.
        check_finite: Stop on a non-finite monitored value.
        divergence_threshold: Stop when the value is worse than this.
        stopping_threshold: Stop (without alarm) when the value is better than this.
        mode: ``"min"`` or ``"max"``.
        check_every: Steps between checks of the train loss (``monitor="loss"`` only).
        divergence_factor: See above.
        name: Display name; defaults to ``"lightning-es(<monitor>)"``.

    Example:
        >>> import numpy as np
        >>> from types import SimpleNamespace
        >>> run = SimpleNamespace(val_steps=np.array([0, 10, 20, 30, 40, 50]),
        ...                       val_loss=np.array([1.0, 0.8, 0.9, 0.85, 0.82, 0.7]))
        >>> LightningEarlyStopping(monitor="val_loss", patience=3).run(run)
        [Alarm(step=40, kind='overfitting')]
    """

    def __init__(
        self,
        monitor: str = "val_loss",
        patience: int = 3,
        min_delta: float = 0.0,
        check_finite: bool = True,
        divergence_threshold: float | None = None,
        stopping_threshold: float | None = None,
        mode: str = "min",
        check_every: int = 50,
        divergence_factor: float | None = None,
        name: str | None = None,
    ) -> None:
        check_choice("monitor", monitor, ("loss", "val_loss"))
        check_choice("mode", mode, ("min", "max"))
        check_range("patience", patience, lo=1, integer=True)
        check_range("min_delta", min_delta, lo=0.0)
        check_range("check_every", check_every, lo=1, integer=True)
        if divergence_threshold is not None:
            check_range("divergence_threshold", divergence_threshold)
        if stopping_threshold is not None:
            check_range("stopping_threshold", stopping_threshold)
        if divergence_factor is not None:
            check_range("divergence_factor", divergence_factor, lo=0.0, lo_open=True)
            if divergence_threshold is not None:
                raise ValueError(
                    "divergence_factor and divergence_threshold are exclusive, got "
                    f"{divergence_factor!r} and {divergence_threshold!r}"
                )
        self.monitor = monitor
        self.patience = int(patience)
        self.min_delta = float(min_delta)
        self.check_finite = bool(check_finite)
        self.divergence_threshold = divergence_threshold
        self.stopping_threshold = stopping_threshold
        self.mode = mode
        self.check_every = int(check_every)
        self.divergence_factor = divergence_factor
        self.name = name or f"lightning-es({monitor})"

    def __repr__(self) -> str:
        return (
            f"LightningEarlyStopping(monitor={self.monitor!r}, patience={self.patience}, "
            f"min_delta={self.min_delta}, check_finite={self.check_finite}, "
            f"divergence_threshold={self.divergence_threshold}, "
            f"stopping_threshold={self.stopping_threshold}, mode={self.mode!r}, "
            f"check_every={self.check_every}, divergence_factor={self.divergence_factor})"
        )

    def reset(self) -> None:
        """Stateless between runs (the state of one run lives in :meth:`run`)."""

    def _checks(self, curve: Any) -> tuple[list[tuple[int, float]], float | None]:
        """The (step, value) pairs the callback sees, and the first finite value."""
        if self.monitor == "val_loss":
            values = _series(curve, "val_loss")
            if values is None:
                return [], None
            steps = getattr(curve, "val_steps", None)
            step_list = list(range(len(values))) if steps is None else [int(s) for s in steps]
            return list(zip(step_list, values.tolist(), strict=False)), _finite_first(values)
        values = _series(curve, "loss")
        if values is None:
            return [], None
        k = self.check_every
        checks = [(s, x) for s, x in _stream(curve, "loss") if (s + 1) % k == 0]
        return checks, _finite_first(values)

    def run(self, curve: Any) -> list[Alarm]:
        """Evaluate the stopping criteria at every check; alarm on the stopping one."""
        checks, first = self._checks(curve)
        div = self.divergence_threshold
        if self.divergence_factor is not None and first is not None:
            div = self.divergence_factor * first
        sign = 1.0 if self.mode == "min" else -1.0  # compare sign * v, smaller is better
        stop_at = None if self.stopping_threshold is None else sign * self.stopping_threshold
        div_at = None if div is None else sign * div
        patience_kind = "stall" if self.monitor == "loss" else "overfitting"
        best = math.inf
        wait = 0
        for step, v in checks:
            if self.check_finite and not math.isfinite(v):
                return [Alarm(step, "nonfinite")]
            x = sign * v
            if stop_at is not None and x < stop_at:
                return []
            if div_at is not None and x > div_at:
                return [Alarm(step, "divergence")]
            if x < best - self.min_delta:
                best = x
                wait = 0
            else:
                wait += 1
                if wait >= self.patience:
                    return [Alarm(step, patience_kind)]
        return []


# --------------------------------------------------------------------------- river


class _RiverDrift:
    """Shared streaming loop for river's drift detectors fed the finite train loss.

    Every drift raises one alarm, and the detector carries on (river resets itself on
    the next update). The kind: compare the mean of the last ``recent`` finite values
    (the level after the drift) with the mean of the values since the previous drift
    (or the start), excluding those last ones (the level before); ``"divergence"`` if
    the level went up, ``"stall"`` otherwise. A drift detector says that the level
    changed, not why; a rising loss is the signature of divergence, and a level change
    downward is the nearest thing a level detector offers to a plateau.
    """

    recent = 10

    def __init__(self, name: str) -> None:
        self.name = name

    def _make(self) -> Any:  # pragma: no cover - overridden
        raise NotImplementedError

    def reset(self) -> None:
        """Stateless between runs (a fresh river detector is built per run)."""

    def run(self, curve: Any) -> list[Alarm]:
        """Feed the finite loss values in order; one alarm per detected drift."""
        det = self._make()
        alarms: list[Alarm] = []
        recent: deque[float] = deque(maxlen=self.recent)
        seg_sum = 0.0
        seg_n = 0
        for step, x in _stream(curve, "loss"):
            if not math.isfinite(x):
                continue
            det.update(x)
            recent.append(x)
            seg_sum += x
            seg_n += 1
            if det.drift_detected:
                rec_sum = sum(recent)
                after = rec_sum / len(recent)
                n_before = seg_n - len(recent)
                before = (seg_sum - rec_sum) / n_before if n_before > 0 else after
                alarms.append(Alarm(step, "divergence" if after > before else "stall"))
                recent.clear()
                seg_sum = 0.0
                seg_n = 0
        return alarms


class RiverPageHinkley(_RiverDrift):
    """``river.drift.PageHinkley`` with its default parameters, fed the train loss.

    river's Page-Hinkley test (defaults ``min_instances=30, delta=0.005,
    threshold=50.0, alpha=0.9999, mode="both"``) accumulates the deviations of each
    value from the running mean and signals a drift when the cumulative deviation
    moves more than ``threshold`` away from its extreme, in either direction. Non-finite
    losses are skipped (river's statistics cannot take them). Each drift is an alarm;
    see the base class for the kind rule (``"divergence"`` if the level rose, else
    ``"stall"``).

    Example:
        >>> import numpy as np
        >>> from types import SimpleNamespace
        >>> run = SimpleNamespace(loss=np.r_[np.full(100, 1.0), np.full(100, 11.0)])
        >>> RiverPageHinkley().run(run)
        [Alarm(step=105, kind='divergence')]
    """

    def __init__(self, name: str = "river-ph") -> None:
        super().__init__(name)

    def __repr__(self) -> str:
        return f"RiverPageHinkley(name={self.name!r})"

    def _make(self) -> Any:
        from river.drift import PageHinkley

        return PageHinkley()


class RiverADWIN(_RiverDrift):
    """``river.drift.ADWIN`` with its default parameters, fed the train loss.

    river's ADaptive WINdowing (defaults ``delta=0.002, clock=32, max_buckets=5,
    min_window_length=5, grace_period=10``) keeps a window of recent values and, every
    ``clock`` values, drops its older part when two sub-windows have means that differ
    more than a Hoeffding-style bound at confidence ``delta`` allows, signalling a drift.
    Non-finite losses are skipped. Each drift is an alarm; see the base class for the
    kind rule.

    Example:
        >>> import numpy as np
        >>> from types import SimpleNamespace
        >>> run = SimpleNamespace(loss=np.r_[np.full(100, 1.0), np.full(100, 11.0)])
        >>> RiverADWIN().run(run)
        [Alarm(step=127, kind='divergence')]
    """

    def __init__(self, name: str = "river-adwin") -> None:
        super().__init__(name)

    def __repr__(self) -> str:
        return f"RiverADWIN(name={self.name!r})"

    def _make(self) -> Any:
        from river.drift import ADWIN

        return ADWIN()


# --------------------------------------------------------------------------- ZClip


class ZClip:
    """ZClip-style EWMA z-score on the global gradient norm.

    ZClip (adaptive gradient clipping for LLM pre-training) keeps an exponential moving
    mean ``m`` and variance ``v`` of the gradient norm. The first ``warmup`` norms only
    fill a buffer; then ``m`` and ``v`` start as that buffer's mean and (population)
    variance. For every later norm ``g``:

    * ``z = (g - m) / (sqrt(v) + eps)``; if ``z > z_thresh`` the norm is a spike:
      ``Alarm(step, "grad_explosion")``, and (ZClip's default "adaptive scaling") it is
      clipped to ``c = m + z_thresh * sqrt(v) / (z / z_thresh)``, a value that shrinks as
      the spike grows, so a spike does not inflate the statistics it is measured against;
    * the statistics then learn the effective value ``e`` (``c`` for a spike, ``g``
      otherwise): ``m = alpha * m + (1 - alpha) * e``, then
      ``v = alpha * v + (1 - alpha) * (e - m) ** 2`` with the updated ``m``.

    Non-finite norms never touch the statistics; ``+inf`` (z = inf) raises an alarm after
    the warm-up, NaN does not (a NaN z-score is never above a threshold).

    Args:
        alpha: EWMA decay in (0, 1) (0.97: each new value weighs 3 %).
        z_thresh: z-score above which a norm is a spike (> 0).
        warmup: Norms collected before the statistics start (>= 2).
        eps: Added to the standard deviation (>= 0).
        name: Display name.

    Example:
        >>> import numpy as np
        >>> from types import SimpleNamespace
        >>> g = np.r_[np.tile([1.0, 1.2], 20), 120.0, 1.1]
        >>> ZClip().run(SimpleNamespace(grad_norm=g))
        [Alarm(step=40, kind='grad_explosion')]
    """

    def __init__(
        self,
        alpha: float = 0.97,
        z_thresh: float = 2.5,
        warmup: int = 25,
        eps: float = 1e-6,
        name: str = "zclip",
    ) -> None:
        check_range("alpha", alpha, lo=0.0, hi=1.0, lo_open=True, hi_open=True)
        check_range("z_thresh", z_thresh, lo=0.0, lo_open=True)
        check_range("warmup", warmup, lo=2, integer=True)
        check_range("eps", eps, lo=0.0)
        self.alpha = float(alpha)
        self.z_thresh = float(z_thresh)
        self.warmup = int(warmup)
        self.eps = float(eps)
        self.name = name

    def __repr__(self) -> str:
        return (
            f"ZClip(alpha={self.alpha}, z_thresh={self.z_thresh}, warmup={self.warmup}, "
            f"eps={self.eps}, name={self.name!r})"
        )

    def reset(self) -> None:
        """Stateless between runs (the state of one run lives in :meth:`run`)."""

    def run(self, curve: Any) -> list[Alarm]:
        """Stream the gradient norm; one alarm per spike (z > ``z_thresh``)."""
        a, zt, eps = self.alpha, self.z_thresh, self.eps
        alarms: list[Alarm] = []
        buffer: list[float] = []
        m = v = 0.0
        ready = False
        for step, g in _stream(curve, "grad_norm"):
            if not ready:
                if math.isfinite(g):
                    buffer.append(g)
                    if len(buffer) >= self.warmup:
                        m = sum(buffer) / len(buffer)
                        v = sum((b - m) ** 2 for b in buffer) / len(buffer)
                        ready = True
                continue
            std = math.sqrt(v)
            if not math.isfinite(g):
                if g > 0:  # +inf: infinitely many standard deviations above the mean
                    alarms.append(Alarm(step, "grad_explosion"))
                continue
            z = (g - m) / (std + eps)
            if z > zt:
                alarms.append(Alarm(step, "grad_explosion"))
                g = m + zt * std / (z / zt)
            m = a * m + (1.0 - a) * g
            v = a * v + (1.0 - a) * (g - m) ** 2
        return alarms


# --------------------------------------------------------------------------- SageMaker Debugger
#
# Re-implemented from the rules' documentation (docs.aws.amazon.com/sagemaker/latest/dg/
# debugger-built-in-rules.html and the smdebug "First Party Rules" page): the default
# parameters, the condition each rule evaluates. The rules read tensors that smdebug saves
# (``save_interval`` 500 steps in the default collection configurations); here every signal is
# read at every step it was recorded, which can only help the rules.


def _matrix(curve: Any, attr: str) -> np.ndarray | None:
    values = getattr(curve, attr, None)
    if values is None:
        return None
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim == 1:
        arr = arr[:, None]
    return arr if arr.size else None


class SageMakerVanishingGradient:
    """SageMaker Debugger ``VanishingGradient``: a gradient whose mean absolute value is below 1e-7.

    The rule evaluates every saved gradient tensor at every step and returns True when one has
    ``mean(|g|) < threshold`` (default ``1e-7``). We record norms, not tensors, so the rule
    reads each layer's L2 grad norm (``curve.layer_grad_norms``, else the global
    ``curve.grad_norm``) in place of ``mean(|g|)``. The proxy never fires where the rule would
    not: ``mean(|g|) <= ||g||_2 / sqrt(n) <= ||g||_2``, so ``||g||_2 < threshold`` implies
    ``mean(|g|) < threshold``; it can stay quiet where the rule fires (a tensor of ``n``
    elements whose norm lies between ``threshold`` and ``threshold * sqrt(n)``). Non-finite
    norms are skipped. The first step with a layer below the threshold raises
    ``Alarm(step, "vanishing_gradient")`` and the rule stops.

    Args:
        threshold: Gradient magnitude below which a gradient vanishes (> 0).
        name: Display name.

    Example:
        >>> import numpy as np
        >>> from types import SimpleNamespace
        >>> g = np.array([[1e-2, 1e-3], [1e-4, 1e-6], [5e-8, 1e-3], [1e-9, 1e-9]])
        >>> SageMakerVanishingGradient().run(SimpleNamespace(layer_grad_norms=g))
        [Alarm(step=2, kind='vanishing_gradient')]
    """

    kinds: tuple[str, ...] = ("vanishing_gradient",)

    def __init__(self, threshold: float = 1e-7, name: str = "sm-vanishing-gradient") -> None:
        check_range("threshold", threshold, lo=0.0, lo_open=True)
        self.threshold = float(threshold)
        self.name = name

    def __repr__(self) -> str:
        return f"SageMakerVanishingGradient(threshold={self.threshold}, name={self.name!r})"

    def reset(self) -> None:
        """Stateless between runs."""

    def run(self, curve: Any) -> list[Alarm]:
        """Stream the per-layer (else global) grad norms; alarm at the first one below the threshold."""
        g = _matrix(curve, "layer_grad_norms")
        if g is None:
            g = _matrix(curve, "grad_norm")
        if g is None:
            return []
        with np.errstate(invalid="ignore"):
            low = (np.isfinite(g) & (g < self.threshold)).any(axis=1)
        if not low.any():
            return []
        i = int(np.argmax(low))
        return [Alarm(_steps(curve, len(g))[i], "vanishing_gradient")]


class SageMakerLossNotDecreasing:
    """SageMaker Debugger ``LossNotDecreasing``: the loss did not go down over ``num_steps`` steps.

    The rule is evaluated every ``num_steps`` steps (default 10): at an evaluation step it
    compares the loss at that step with the loss at the newest saved step at least
    ``num_steps`` behind it, and returns True when the loss has not decreased by at least
    ``diff_percent`` percent (default 0.0: "the rule just checks if the loss is going down",
    so an equal or higher loss fires). The next evaluation is at the first saved step at least
    ``num_steps`` after this one. ``mode`` picks the loss: ``"TRAIN"`` and ``"GLOBAL"`` (the
    default; a curve's one training stream) read ``curve.loss``, ``"EVAL"`` reads
    ``curve.val_loss`` at ``curve.val_steps``. A non-finite loss never counts as a decrease.
    The first evaluation that fires raises ``Alarm(step, "stall")`` (the nearest kind: the
    loss is not improving) and the rule stops.

    Args:
        num_steps: Minimum steps between the two losses compared (>= 1).
        diff_percent: Minimum decrease, in percent of the earlier loss, in [0, 100).
        mode: ``"GLOBAL"``, ``"TRAIN"`` or ``"EVAL"``.
        name: Display name.

    Example:
        >>> import numpy as np
        >>> from types import SimpleNamespace
        >>> loss = np.r_[np.linspace(3.0, 1.0, 30), np.full(20, 1.0)]
        >>> SageMakerLossNotDecreasing().run(SimpleNamespace(loss=loss))
        [Alarm(step=40, kind='stall')]
    """

    kinds: tuple[str, ...] = ("stall",)

    def __init__(self, num_steps: int = 10, diff_percent: float = 0.0, mode: str = "GLOBAL",
                 name: str = "sm-loss-not-decreasing") -> None:
        check_range("num_steps", num_steps, lo=1, integer=True)
        check_range("diff_percent", diff_percent, lo=0.0, hi=100.0, hi_open=True)
        check_choice("mode", mode, ("GLOBAL", "TRAIN", "EVAL"))
        self.num_steps = int(num_steps)
        self.diff_percent = float(diff_percent)
        self.mode = mode
        self.name = name

    def __repr__(self) -> str:
        return (f"SageMakerLossNotDecreasing(num_steps={self.num_steps}, diff_percent={self.diff_percent}, "
                f"mode={self.mode!r}, name={self.name!r})")

    def reset(self) -> None:
        """Stateless between runs."""

    def _saved(self, curve: Any) -> tuple[list[int], list[float]]:
        if self.mode == "EVAL":
            values = _series(curve, "val_loss")
            if values is None:
                return [], []
            steps = getattr(curve, "val_steps", None)
            step_list = list(range(len(values))) if steps is None else [int(s) for s in steps]
            return step_list, values.tolist()
        values = _series(curve, "loss")
        if values is None:
            return [], []
        return _steps(curve, len(values)), values.tolist()

    def run(self, curve: Any) -> list[Alarm]:
        """Evaluate the rule every ``num_steps``; alarm at the first evaluation that fires."""
        steps, values = self._saved(curve)
        keep = 1.0 - self.diff_percent / 100.0
        last_eval: int | None = None
        j = -1  # index of the newest saved step at least num_steps behind the current one
        for i, (s, v) in enumerate(zip(steps, values)):
            while j + 1 < i and steps[j + 1] <= s - self.num_steps:
                j += 1
            if j < 0 or (last_eval is not None and s < last_eval + self.num_steps):
                continue
            last_eval = s
            prev = values[j]
            if not (math.isfinite(v) and math.isfinite(prev) and v < prev * keep):
                return [Alarm(s, "stall")]
        return []


class SageMakerOverfit:
    """SageMaker Debugger ``Overfit``: validation loss too far above the training loss.

    At every validation step at or after ``start_step`` (default 0) the rule compares the mean
    validation loss with the mean training loss: the ratio ``(val - train) / train`` above
    ``ratio_threshold`` (default 0.1) counts one step; ``patience`` (default 1) such
    validations in a row make the model overfit and raise ``Alarm(step, "overfitting")``; the
    rule stops. Here the mean validation loss is the curve's ``val_loss`` at that step (already
    a mean over the validation set) and the mean training loss is the mean of the finite
    training losses since the previous validation (up to and including this step). A
    non-finite mean or validation loss breaks the streak.

    Args:
        start_step: First step evaluated (>= 0).
        patience: Consecutive validations above the threshold that fire (>= 1).
        ratio_threshold: Largest tolerated ``(val - train) / train`` (>= 0).
        name: Display name.

    Example:
        >>> import numpy as np
        >>> from types import SimpleNamespace
        >>> run = SimpleNamespace(loss=np.full(40, 1.0), val_steps=np.array([9, 19, 29, 39]),
        ...                       val_loss=np.array([1.05, 1.08, 1.2, 1.3]))
        >>> SageMakerOverfit().run(run)
        [Alarm(step=29, kind='overfitting')]
    """

    kinds: tuple[str, ...] = ("overfitting",)

    def __init__(self, start_step: int = 0, patience: int = 1, ratio_threshold: float = 0.1,
                 name: str = "sm-overfit") -> None:
        check_range("start_step", start_step, lo=0, integer=True)
        check_range("patience", patience, lo=1, integer=True)
        check_range("ratio_threshold", ratio_threshold, lo=0.0)
        self.start_step = int(start_step)
        self.patience = int(patience)
        self.ratio_threshold = float(ratio_threshold)
        self.name = name

    def __repr__(self) -> str:
        return (f"SageMakerOverfit(start_step={self.start_step}, patience={self.patience}, "
                f"ratio_threshold={self.ratio_threshold}, name={self.name!r})")

    def reset(self) -> None:
        """Stateless between runs."""

    def run(self, curve: Any) -> list[Alarm]:
        """Evaluate the ratio at every validation; alarm after ``patience`` in a row above it."""
        loss = _series(curve, "loss")
        val = _series(curve, "val_loss")
        if loss is None or val is None:
            return []
        vsteps = getattr(curve, "val_steps", None)
        val_steps = list(range(len(val))) if vsteps is None else [int(s) for s in vsteps]
        steps = np.asarray(_steps(curve, len(loss)))
        streak = 0
        prev = -1
        for s, v in zip(val_steps, val.tolist()):
            window = loss[(steps > prev) & (steps <= s)]
            prev = s
            if s < self.start_step:
                continue
            window = window[np.isfinite(window)]
            train = float(window.mean()) if window.size else math.nan
            if not (math.isfinite(v) and math.isfinite(train)):
                streak = 0
                continue
            ratio = (v - train) / train if train > 0 else (math.inf if v > train else 0.0)
            streak = streak + 1 if ratio > self.ratio_threshold else 0
            if streak >= self.patience:
                return [Alarm(s, "overfitting")]
        return []


class SageMakerDeadRelu:
    """SageMaker Debugger ``DeadRelu``: too many inactive ReLUs in a layer.

    A ReLU unit is dead when it is active in less than ``threshold_inactivity`` percent of
    the inputs (default 1.0); the rule returns True when the percentage of dead units in a
    layer is greater than ``threshold_layer`` (default 50.0). The curves record, per
    activation layer and every few steps, the fraction of units that are exactly 0 for every
    sample of the batch (``curve.dead_frac`` at ``curve.act_steps``): a unit active in none of
    the batch's samples. For a batch of fewer than ``100 / threshold_inactivity`` samples
    (100 at the default) that is exactly "active in less than ``threshold_inactivity`` %". The
    first sample with a layer above ``threshold_layer`` raises ``Alarm(step, "dead_units")``
    and the rule stops.

    Args:
        threshold_inactivity: Activity (percent of inputs) below which a unit is dead, in (0, 100].
        threshold_layer: Percentage of dead units in a layer that fires, in [0, 100).
        name: Display name.

    Example:
        >>> import numpy as np
        >>> from types import SimpleNamespace
        >>> run = SimpleNamespace(act_steps=np.array([0, 10, 20]),
        ...                       dead_frac=np.array([[0.1, 0.2], [0.3, 0.5], [0.2, 0.55]]))
        >>> SageMakerDeadRelu().run(run)
        [Alarm(step=20, kind='dead_units')]
    """

    kinds: tuple[str, ...] = ("dead_units",)

    def __init__(self, threshold_inactivity: float = 1.0, threshold_layer: float = 50.0,
                 name: str = "sm-dead-relu") -> None:
        check_range("threshold_inactivity", threshold_inactivity, lo=0.0, hi=100.0, lo_open=True)
        check_range("threshold_layer", threshold_layer, lo=0.0, hi=100.0, hi_open=True)
        self.threshold_inactivity = float(threshold_inactivity)
        self.threshold_layer = float(threshold_layer)
        self.name = name

    def __repr__(self) -> str:
        return (f"SageMakerDeadRelu(threshold_inactivity={self.threshold_inactivity}, "
                f"threshold_layer={self.threshold_layer}, name={self.name!r})")

    def reset(self) -> None:
        """Stateless between runs."""

    def run(self, curve: Any) -> list[Alarm]:
        """Stream the per-layer dead fractions; alarm at the first layer above ``threshold_layer``."""
        dead = _matrix(curve, "dead_frac")
        if dead is None:
            return []
        steps = getattr(curve, "act_steps", None)
        step_list = list(range(len(dead))) if steps is None else [int(s) for s in steps]
        with np.errstate(invalid="ignore"):
            hit = (np.isfinite(dead) & (100.0 * dead > self.threshold_layer)).any(axis=1)
        if not hit.any():
            return []
        return [Alarm(step_list[int(np.argmax(hit))], "dead_units")]


class SageMakerWeightUpdateRatio:
    """SageMaker Debugger ``WeightUpdateRatio``: updates too large or too small for the weights.

    The rule computes, for each weight tensor at consecutive steps, the ratio of the update's
    size to the weights' (``||w_t - w_{t-1}|| / (||w_{t-1}|| + epsilon)``) and returns True
    when it is above ``large_threshold`` (default 10.0) or below ``small_threshold`` (default
    1e-8). The curves record the global ratio ``||dw|| / ||w||`` of every step
    (``curve.update_ratio``), which the rule reads instead of the per-tensor ones; ``epsilon``
    (default 1e-9) only matters for weights of norm near zero, which a global ratio does not
    have. Missing and non-finite ratios are skipped. The first step outside the band raises
    ``Alarm(step, "update_ratio_high")`` or ``Alarm(step, "update_ratio_low")`` and the rule
    stops.

    Args:
        large_threshold: Ratio above which updates are too large (> 0).
        small_threshold: Ratio below which updates are too small (>= 0, below ``large_threshold``).
        epsilon: Added to the weights' norm (>= 0).
        name: Display name.

    Example:
        >>> import numpy as np
        >>> from types import SimpleNamespace
        >>> SageMakerWeightUpdateRatio().run(SimpleNamespace(update_ratio=np.array([1e-3, 2e-4, 5e-9, 1e-3])))
        [Alarm(step=2, kind='update_ratio_low')]
    """

    kinds: tuple[str, ...] = ("update_ratio_high", "update_ratio_low")

    def __init__(self, large_threshold: float = 10.0, small_threshold: float = 1e-8, epsilon: float = 1e-9,
                 name: str = "sm-weight-update-ratio") -> None:
        check_range("large_threshold", large_threshold, lo=0.0, lo_open=True)
        check_range("small_threshold", small_threshold, lo=0.0, hi=float(large_threshold), hi_open=True)
        check_range("epsilon", epsilon, lo=0.0)
        self.large_threshold = float(large_threshold)
        self.small_threshold = float(small_threshold)
        self.epsilon = float(epsilon)
        self.name = name

    def __repr__(self) -> str:
        return (f"SageMakerWeightUpdateRatio(large_threshold={self.large_threshold}, "
                f"small_threshold={self.small_threshold}, epsilon={self.epsilon}, name={self.name!r})")

    def reset(self) -> None:
        """Stateless between runs."""

    def run(self, curve: Any) -> list[Alarm]:
        """Stream the update ratio; alarm at the first one outside ``[small, large]``."""
        for step, r in _stream(curve, "update_ratio"):
            if not math.isfinite(r):
                continue
            if r > self.large_threshold:
                return [Alarm(step, "update_ratio_high")]
            if r < self.small_threshold:
                return [Alarm(step, "update_ratio_low")]
        return []


class SageMakerExplodingTensor:
    """SageMaker Debugger ``ExplodingTensor``: a tensor holds a non-finite value.

    The rule returns True when any saved tensor holds NaN or infinity (only NaN with
    ``only_nan=True``; default False). Here the tensors are the recorded scalars: the loss,
    the global grad norm and the per-layer grad norms. The first step with one raises
    ``Alarm(step, "nonfinite")`` and the rule stops.

    Args:
        only_nan: Watch for NaN only, not for infinities.
        name: Display name.

    Example:
        >>> import numpy as np
        >>> from types import SimpleNamespace
        >>> run = SimpleNamespace(loss=np.array([1.0, 0.9, 0.8]), grad_norm=np.array([1.0, np.inf, np.nan]))
        >>> SageMakerExplodingTensor().run(run), SageMakerExplodingTensor(only_nan=True).run(run)
        ([Alarm(step=1, kind='nonfinite')], [Alarm(step=2, kind='nonfinite')])
    """

    kinds: tuple[str, ...] = ("nonfinite",)

    def __init__(self, only_nan: bool = False, name: str = "sm-exploding-tensor") -> None:
        if not isinstance(only_nan, bool):
            raise ValueError(f"only_nan must be a bool, got {only_nan!r}")
        self.only_nan = only_nan
        self.name = name

    def __repr__(self) -> str:
        return f"SageMakerExplodingTensor(only_nan={self.only_nan}, name={self.name!r})"

    def reset(self) -> None:
        """Stateless between runs."""

    def run(self, curve: Any) -> list[Alarm]:
        """Stream every recorded scalar; alarm at the first step where one is NaN (or infinite)."""
        first: int | None = None
        n_steps = 0
        for attr in ("loss", "grad_norm", "layer_grad_norms"):
            m = _matrix(curve, attr)
            if m is None:
                continue
            n_steps = max(n_steps, len(m))
            bad = np.isnan(m) if self.only_nan else ~np.isfinite(m)
            rows = bad.any(axis=1)
            if rows.any():
                i = int(np.argmax(rows))
                first = i if first is None else min(first, i)
        if first is None:
            return []
        return [Alarm(_steps(curve, n_steps)[first], "nonfinite")]


# --------------------------------------------------------------------------- the bench set


def default_baselines() -> list[Baseline]:
    """The baseline configurations the bench compares against.

    * ``nan-stop``: Keras ``TerminateOnNaN`` (no parameters).
    * ``lightning-es(val_loss)``: ``EarlyStopping(monitor="val_loss")`` with Lightning's
      defaults (patience 3, min_delta 0, check_finite): the configuration in Lightning's
      own documentation, checked at every validation step.
    * ``lightning-es(loss)``: ``EarlyStopping(monitor="loss", patience=3,
      divergence_threshold=10 x initial loss)``, checked every 50 steps: the way users
      guard the *train* loss against blow-ups; 10x the initial loss is far above any
      healthy run's noise yet well before overflow, and 3 checks of 50 steps (150 steps
      without a new best) is as patient as the stall rule in the failure-mode reference
      for a run of ~1500 steps.
    * ``river-ph`` and ``river-adwin``: river's ``PageHinkley`` and ``ADWIN`` with their
      defaults on the train loss.
    * ``zclip``: ZClip's published defaults (alpha 0.97, z 2.5, warm-up 25) on the grad
      norm.
    """
    return [
        NaNStop(),
        LightningEarlyStopping(monitor="val_loss", patience=3),
        LightningEarlyStopping(monitor="loss", patience=3, check_every=50, divergence_factor=10.0),
        RiverPageHinkley(),
        RiverADWIN(),
        ZClip(),
    ]


def sagemaker_rules() -> list[Baseline]:
    """The SageMaker Debugger built-in rules the bench compares against, with their published defaults.

    * ``sm-vanishing-gradient``: ``VanishingGradient(threshold=1e-7)`` on the per-layer grad norms;
    * ``sm-loss-not-decreasing``: ``LossNotDecreasing(num_steps=10, diff_percent=0.0, mode="GLOBAL")``
      on the train loss;
    * ``sm-overfit``: ``Overfit(start_step=0, patience=1, ratio_threshold=0.1)``;
    * ``sm-dead-relu``: ``DeadRelu(threshold_inactivity=1.0, threshold_layer=50.0)``;
    * ``sm-weight-update-ratio``: ``WeightUpdateRatio(large_threshold=10.0, small_threshold=1e-8)``;
    * ``sm-exploding-tensor``: ``ExplodingTensor(only_nan=False)``.

    Each is scored only on the kinds in its ``kinds`` attribute.
    """
    return [
        SageMakerVanishingGradient(),
        SageMakerLossNotDecreasing(),
        SageMakerOverfit(),
        SageMakerDeadRelu(),
        SageMakerWeightUpdateRatio(),
        SageMakerExplodingTensor(),
    ]
