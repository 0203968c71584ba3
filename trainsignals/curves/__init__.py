"""Seeded generator of labeled training curves: healthy runs and the failures trainsignals names.

Every curve is a whole synthetic training run, with the signals a real run logs: per-step loss,
global gradient norm, learning rate and update ratio, per-layer gradient norms, validation loss
every 25 to 100 steps and activation statistics every 10 steps. A failure curve starts as a
healthy run and turns into its failure at ``onset_step``; everything else about it stays healthy.

How a run is made (the same recipe for every curve; only its draws differ):

* The learning rate follows a schedule (constant, warmup + cosine to zero or to a floor, step
  decay, warm restarts, linear decay, inverse square root).
* Training progress is the cumulative relative learning rate ``tau``; the log-loss decays from
  the initial loss ``L0`` (0.05 .. 20) toward a floor as an exponential, a power law or a mix
  of both in ``tau``, so the loss slows down when the rate decays and stops when it is zero.
  Near the floor a higher learning rate costs a little loss (the "noise ball"), so the loss
  dips at a step decay and rises a little at a warm restart.
* The loss carries multiplicative Student-t noise (3 to 8 degrees of freedom, clipped at 6
  scale units, scale 0.005 .. 0.08 in log space), a slow AR(1) wander and, in some runs, rare
  one-step spikes of at most 1.3x.
* Per-layer gradient norms share a decaying trend, a common noise term (correlated with the
  loss noise: a bad batch moves both) and their own noise; the global norm is exactly the root
  sum of squares of the layer norms.
* The update ratio is ``u_peak * lr / peak_lr`` (``u_peak`` in 1.5e-4 .. 8e-4), lowered a
  little as the weights grow and as the gradient norm falls, with its own noise; it follows
  the learning rate down at the end of a decaying schedule.
* Every value is a float32 number (as logged from float32 training) held in float64 arrays.

Every curve is reproducible on its own: :func:`generate` seeds a PCG64 generator from
``(seed, kind, difficulty)``.

Example:
    >>> c = generate("divergence", seed=7, difficulty="easy")
    >>> c.name, c.kind, c.onset_step, c.total_steps, c.first_nonfinite_step
    ('divergence-easy-7', 'divergence', 288, 618, 346)
    >>> sorted(c.signals())
    ['activations', 'grad_norm', 'layer_grad_norms', 'loss', 'lr', 'step', 'update_ratio', 'val_loss']
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from trainsignals.kinds import KINDS as KIND_FACTS

__all__ = [
    "DIFFICULTIES",
    "HEALTHY",
    "KINDS",
    "SUITE_FOLDERS",
    "WITHHOLDABLE",
    "Curve",
    "check_suite_folder",
    "default_directory",
    "generate",
    "load_suite",
    "standard_suite",
    "suite_directory",
    "write_suite",
]

KINDS: tuple[str, ...] = tuple(k.value for k, info in KIND_FACTS.items() if info.injected)
"""The failure kinds a single run's curves show: the kinds :data:`trainsignals.kinds.KINDS` marks
``injected``, in :class:`trainsignals.Kind` order (not the distributed ones,
:data:`trainsignals.DISTRIBUTED_KINDS`: they need several ranks)."""

HEALTHY = "healthy"
DIFFICULTIES: tuple[str, ...] = ("easy", "medium", "hard")

FORMAT = "trainsignals-curves/1"
_MANIFEST = "manifest.json"
#: the dense series of a curve (aligned with its steps; a curve's ``gaps`` name steps they were not measured)
_DENSE: tuple[str, ...] = ("loss", "grad_norm", "lr", "update_ratio")
#: the series a suite file may lack (written before they existed): they load empty
_OPTIONAL_SERIES: tuple[str, ...] = ("val_metric", "pred_steps", "pred_top_share", "pred_spread")
#: the signals :meth:`Curve.withheld` can take away (every signal a curve holds but the loss)
WITHHOLDABLE: tuple[str, ...] = ("grad_norm", "lr", "update_ratio", "val_loss", "layer_grad_norms", "activations",
                                 "pred_top_share", "pred_spread", "val_metric")
_MIN_STEPS = 400
_MAX_STEPS = 2000

SUITE_FOLDERS: dict[str, str] = {
    "synthetic": "synthetic",
    "real": "real",
    "real_dev": "real_dev",
    "dev": "real_dev",
    "real_heldout": "real_heldout",
    "heldout": "real_heldout",
}
"""The names of the committed suites (:func:`load_suite`, ``trainsignals bench --suite``), each
the folder of the repository's ``datasets`` it names: ``"dev"`` and ``"heldout"`` are short for
``real_dev`` and ``real_heldout``."""

#: the command that builds each committed suite into its folder of ``datasets``
_BUILDERS: dict[str, str] = {
    "synthetic": "python -m trainsignals.curves build",
    "real": "python -m trainsignals.curves.real_runs build",
    "real_dev": "python -m trainsignals.curves.real_runs build --dev",
    "real_heldout": "python -m trainsignals.curves.real_runs build --heldout",
}


# ------------------------------------------------------------------------------------ the curve


@dataclass(frozen=True, eq=False)
class Curve:
    """One labeled training run: its signals, its failure kind and when the failure began.

    Arrays are read-only. Non-finite values after a blow-up are real values of the run, not
    missing ones; steps where a dense signal was not measured at all (a frozen optimizer never
    steps, so no update ratio is recorded) are named by :attr:`gaps` and hold NaN in the array.

    Attributes:
        name: Unique name, ``"{kind}-{difficulty}-{seed}"``.
        kind: A :class:`trainsignals.Kind` value, or ``"healthy"``.
        onset_step: Step at which the failure began; ``-1`` for a healthy run.
        difficulty: ``"easy"``, ``"medium"`` or ``"hard"``.
        seed: The seed given to :func:`generate`.
        total_steps: Planned length of the run (``len(steps)``).
        steps: ``0 .. total_steps - 1`` (int64).
        loss: Training loss per step.
        grad_norm: Global gradient norm per step (before clipping).
        lr: Learning rate applied at each step.
        update_ratio: Global ``||dw|| / ||w||`` per step.
        val_steps: Steps at which validation ran (int64).
        val_loss: Validation loss at ``val_steps``.
        layer_names: Names of the layers whose gradient norms are logged.
        layer_grad_norms: ``(total_steps, len(layer_names))`` per-layer gradient norms.
        act_steps: Steps at which activation statistics were sampled (every 10 steps).
        act_layer_names: Layers with activation statistics.
        dead_frac: ``(len(act_steps), len(act_layer_names))`` fraction of ReLU outputs
            exactly 0.
        saturation: Same shape, fraction of tanh/sigmoid outputs at their limits.
        first_nonfinite_step: First step where ``loss`` or ``grad_norm`` is not finite, ``-1``
            if none.
        val_metric: Validation accuracy at ``val_steps`` (synthetic: healthy and
            ``silent_collapse`` curves, empty for the other kinds; real runs: every
            classifier, every step of the real-run suites built since these were recorded;
            empty for MSE runs).
        pred_steps: Steps at which a batch's predictions were sampled (int64; same curves;
            the real-run builder samples every step's training batch).
        pred_top_share: Share of the most-predicted class in that batch, at ``pred_steps``
            (classifiers; empty otherwise).
        pred_spread: Spread of that batch's predictions, at ``pred_steps`` (regressions: the
            standard deviation across the batch, averaged over the outputs; empty otherwise).
        gaps: ``{signal: bool array over steps}``, True where the dense signal (``loss``,
            ``grad_norm``, ``lr`` or ``update_ratio``) was not measured; signals measured at
            every step are absent. :meth:`signals` hands those steps to ``Monitor.scan`` as
            masked entries (not measured), not as non-finite values.
    """

    name: str
    kind: str
    onset_step: int
    difficulty: str
    seed: int
    total_steps: int
    steps: np.ndarray
    loss: np.ndarray
    grad_norm: np.ndarray
    lr: np.ndarray
    update_ratio: np.ndarray
    val_steps: np.ndarray
    val_loss: np.ndarray
    layer_names: tuple[str, ...]
    layer_grad_norms: np.ndarray
    act_steps: np.ndarray
    act_layer_names: tuple[str, ...]
    dead_frac: np.ndarray
    saturation: np.ndarray
    first_nonfinite_step: int
    val_metric: np.ndarray = field(default_factory=lambda: np.zeros(0))
    pred_steps: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    pred_top_share: np.ndarray = field(default_factory=lambda: np.zeros(0))
    pred_spread: np.ndarray = field(default_factory=lambda: np.zeros(0))
    gaps: Mapping[str, np.ndarray] = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = self.total_steps
        for field_name in ("steps", "loss", "grad_norm", "lr", "update_ratio"):
            arr = getattr(self, field_name)
            if arr.shape != (n,):
                raise ValueError(f"{field_name} must have shape ({n},), got {arr.shape}")
        if self.layer_grad_norms.shape != (n, len(self.layer_names)):
            raise ValueError(
                f"layer_grad_norms must have shape ({n}, {len(self.layer_names)}), "
                f"got {self.layer_grad_norms.shape}"
            )
        if self.val_loss.shape != self.val_steps.shape:
            raise ValueError("val_loss and val_steps must have the same length")
        shape = (len(self.act_steps), len(self.act_layer_names))
        if self.dead_frac.shape != shape or self.saturation.shape != shape:
            raise ValueError(f"dead_frac and saturation must have shape {shape}")
        if len(self.val_metric) not in (0, len(self.val_steps)):
            raise ValueError("val_metric must be empty or have one value per val_steps entry")
        for field_name in ("pred_top_share", "pred_spread"):
            if len(getattr(self, field_name)) not in (0, len(self.pred_steps)) or getattr(self, field_name).ndim != 1:
                raise ValueError(f"{field_name} must be empty or have one value per pred_steps entry")
        if len(self.pred_steps) and not (len(self.pred_top_share) or len(self.pred_spread)):
            raise ValueError("pred_steps needs pred_top_share or pred_spread at those steps")
        for key, mask in self.gaps.items():
            if key not in _DENSE or mask.shape != (n,) or mask.dtype != np.bool_:
                raise ValueError(f"gaps[{key!r}] must be a bool array of shape ({n},) for one of {_DENSE}")
            mask.setflags(write=False)
        for field_name in (
            "steps", "loss", "grad_norm", "lr", "update_ratio", "val_steps", "val_loss",
            "layer_grad_norms", "act_steps", "dead_frac", "saturation", "val_metric", "pred_steps",
            "pred_top_share", "pred_spread",
        ):
            getattr(self, field_name).setflags(write=False)

    @property
    def healthy(self) -> bool:
        """Whether the run is healthy (``kind == "healthy"``)."""
        return self.kind == HEALTHY

    def signals(self) -> dict[str, Any]:
        """The keyword arguments of ``Monitor.scan`` for this run.

        Returns:
            ``{"step", "loss", "grad_norm", "lr", "update_ratio", "val_loss": (steps, values),
            "layer_grad_norms": {layer: norms}, "activations": (steps, {layer: {"dead_frac":
            ..., "saturation": ...}})}`` (the per-layer ones where the curve has layers), and
            ``"val_metric"``, ``"pred_top_share"``, ``"pred_spread"`` as ``(steps, values)`` pairs
            where the curve has them.
        """
        extra: dict[str, Any] = {}
        if self.layer_names:
            extra["layer_grad_norms"] = {name: self.layer_grad_norms[:, j] for j, name in enumerate(self.layer_names)}
        if self.act_layer_names:
            extra["activations"] = (self.act_steps, {
                name: {"dead_frac": self.dead_frac[:, j], "saturation": self.saturation[:, j]}
                for j, name in enumerate(self.act_layer_names)})
        if len(self.val_metric):
            extra["val_metric"] = (self.val_steps, self.val_metric)
        if len(self.pred_top_share):
            extra["pred_top_share"] = (self.pred_steps, self.pred_top_share)
        if len(self.pred_spread):
            extra["pred_spread"] = (self.pred_steps, self.pred_spread)
        dense = {k: getattr(self, k) if k not in self.gaps else np.ma.MaskedArray(getattr(self, k), mask=self.gaps[k])
                 for k in _DENSE}
        return {
            "step": self.steps,
            **dense,
            "val_loss": (self.val_steps, self.val_loss),
            **extra,
        }

    def withheld(self, *signals: str) -> Curve:
        """This run as a user who does not measure ``signals`` would record it.

        A dense signal (``grad_norm``, ``lr``, ``update_ratio``) becomes a gap at every step
        (:attr:`gaps`); ``val_loss`` (with ``val_metric``), ``layer_grad_norms`` and
        ``activations`` (``dead_frac`` and ``saturation``) become empty; ``pred_top_share``,
        ``pred_spread`` and ``val_metric`` (alone: the validation loss stays) too.
        The label is kept: the failure happened whether or not it was measured.

        Raises:
            ValueError: ``loss`` (every run has one) or a name that is not a signal of a curve.

        Example:
            >>> c = generate("stall", seed=0).withheld("update_ratio")
            >>> bool(c.gaps["update_ratio"].all()), "update_ratio" in generate("stall", seed=0).gaps
            (True, False)
        """
        bad = [s for s in signals if s not in WITHHOLDABLE]
        if bad:
            raise ValueError(f"signals: cannot withhold {bad[0]!r}; choose from {WITHHOLDABLE}")
        n = self.total_steps
        change: dict[str, Any] = {}
        gaps = dict(self.gaps)
        for name in signals:
            if name in _DENSE:
                change[name] = np.full(n, np.nan)
                gaps[name] = np.ones(n, dtype=bool)
            elif name == "val_loss":
                change.update(val_steps=np.zeros(0, dtype=np.int64), val_loss=np.zeros(0), val_metric=np.zeros(0))
            elif name == "layer_grad_norms":
                change.update(layer_names=(), layer_grad_norms=np.zeros((n, 0)))
            elif name == "activations":
                change.update(act_steps=np.zeros(0, dtype=np.int64), act_layer_names=(),
                              dead_frac=np.zeros((0, 0)), saturation=np.zeros((0, 0)))
            elif name == "val_metric":
                change.update(val_metric=np.zeros(0))
            else:  # pred_top_share or pred_spread: the other one's steps stay
                change[name] = np.zeros(0)
                other = "pred_spread" if name == "pred_top_share" else "pred_top_share"
                if not len(change.get(other, getattr(self, other))):
                    change["pred_steps"] = np.zeros(0, dtype=np.int64)
        return dataclasses.replace(self, gaps=gaps, **change)

    def sampled(self, every: int) -> Curve:
        """This run as a logger that writes one row every ``every`` steps would record it.

        As Hugging Face's Trainer and Lightning log: at the last step of each block of
        ``every`` steps the loss is the block's mean, the grad norm, learning rate and update
        ratio that step's values; every other step is a gap (:attr:`gaps`). Validation keeps its
        own cadence; per-layer signals and activations are left out (such logs have none).
        Scan it as :func:`trainsignals.io.report.replay` and ``trainsignals bench --log-every N``
        do, with ``Monitor(total_steps=self.total_steps, log_every=every)``: the run's step count
        (the steps the logged rows span, not the number of rows) and the logging interval.

        Raises:
            ValueError: ``every`` below 1.

        Example:
            >>> c = generate("healthy", seed=0).sampled(10)
            >>> int((~c.gaps["loss"]).sum()) == c.total_steps // 10, bool(c.gaps["lr"][9])
            (True, False)
        """
        if not (isinstance(every, int) and every >= 1):
            raise ValueError(f"every must be an integer >= 1, got {every!r}")
        n = self.total_steps
        ends = np.arange(every - 1, n, every)
        logged = np.zeros(n, dtype=bool)
        logged[ends] = True
        change: dict[str, Any] = {}
        gaps = {}
        for name in _DENSE:
            a = np.asarray(getattr(self, name), dtype=np.float64)
            out = np.full(n, np.nan)
            if name == "loss":
                with np.errstate(invalid="ignore"):
                    out[ends] = a[:len(ends) * every].reshape(len(ends), every).mean(axis=1) if len(ends) else a[ends]
                out = out.astype(np.float32).astype(np.float64)
            else:
                out[ends] = a[ends]
            change[name] = out
            gaps[name] = ~logged | (self.gaps[name] if name in self.gaps else False)
        return dataclasses.replace(
            self.withheld("layer_grad_norms", "activations"), gaps=gaps, **change)

    def __repr__(self) -> str:
        return (
            f"Curve(name={self.name!r}, kind={self.kind!r}, difficulty={self.difficulty!r}, "
            f"onset_step={self.onset_step}, total_steps={self.total_steps}, "
            f"first_nonfinite_step={self.first_nonfinite_step})"
        )


# ------------------------------------------------------------------------------------ helpers


def _rng(kind: str, seed: int, difficulty: str) -> np.random.Generator:
    entropy = [seed, zlib.crc32(kind.encode()), DIFFICULTIES.index(difficulty)]
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(entropy)))


def _u(rng: np.random.Generator, lo: float, hi: float) -> float:
    return float(rng.uniform(lo, hi))


def _logu(rng: np.random.Generator, lo: float, hi: float) -> float:
    return float(math.exp(rng.uniform(math.log(lo), math.log(hi))))


def _by(rng: np.random.Generator, difficulty: str, table: dict[str, tuple[float, float]], log: bool = False) -> float:
    lo, hi = table[difficulty]
    return _logu(rng, lo, hi) if log else _u(rng, lo, hi)


def _ar1(rng: np.random.Generator, n: int, phi: float, sd: float) -> np.ndarray:
    """A stationary AR(1) series with marginal standard deviation ``sd``."""
    from scipy.signal import lfilter

    e = rng.normal(0.0, sd * math.sqrt(1.0 - phi * phi), n)
    x0 = rng.normal(0.0, sd)
    out, _ = lfilter([1.0], [1.0, -phi], e, zi=[phi * x0])
    return np.asarray(out)


def _ema(x: np.ndarray, span: float) -> np.ndarray:
    from scipy.signal import lfilter

    a = 2.0 / (span + 1.0)
    out, _ = lfilter([a], [1.0, -(1.0 - a)], x, zi=[(1.0 - a) * x[0]])
    return np.asarray(out)


def _tnoise(rng: np.random.Generator, df: float, n: int) -> np.ndarray:
    return np.clip(rng.standard_t(df, n), -6.0, 6.0)


def _decay(x: np.ndarray, shape: str, alpha: float, w: float) -> np.ndarray:
    """Decay profile ``g(x)`` with ``g(0) = 1`` falling toward 0."""
    e = np.exp(-x)
    if shape == "exp":
        return e
    p = (1.0 + x) ** (-alpha)
    if shape == "power":
        return p
    return w * e + (1.0 - w) * p


def _solve_decay(target: float, shape: str, alpha: float, w: float) -> float:
    """The ``x`` at which ``_decay(x) == target`` (bisection in log space)."""
    lo, hi = -14.0, 14.0
    for _ in range(80):
        mid = 0.5 * (lo + hi)
        if _decay(np.array([math.exp(mid)]), shape, alpha, w)[0] > target:
            lo = mid
        else:
            hi = mid
    return math.exp(0.5 * (lo + hi))


def _ramp(t: np.ndarray, start: int, length: float) -> np.ndarray:
    """0 before ``start``, rising linearly to 1 over ``length`` steps, 1 after."""
    return np.clip((t - start + 1) / max(length, 1.0), 0.0, 1.0) * (t >= start)


def _smooth_ramp(t: np.ndarray, start: int, length: float) -> np.ndarray:
    x = _ramp(t, start, length)
    return x * x * (3.0 - 2.0 * x)


_KEEP_BITS = 16  # mantissa bits kept: about 5 significant digits, as in a text log


def _f32(x: np.ndarray) -> np.ndarray:
    """Round to float32 with the mantissa cut to ``_KEEP_BITS`` bits (round half up), as float64."""
    with np.errstate(over="ignore", invalid="ignore"):
        a = np.asarray(x, dtype=np.float64).astype(np.float32)
    bits = a.view(np.uint32).copy()
    drop = 23 - _KEEP_BITS
    fin = np.isfinite(a)
    bits[fin] = (bits[fin] + np.uint32(1 << (drop - 1))) & np.uint32((0xFFFFFFFF >> drop) << drop)
    return bits.view(np.float32).astype(np.float64)


def _layer_names(rng: np.random.Generator, n_layers: int) -> tuple[str, ...]:
    style = int(rng.integers(4))
    if style == 0:
        return tuple(f"fc{i + 1}" for i in range(n_layers))
    if style == 1:
        return tuple(f"conv{i + 1}" for i in range(n_layers - 1)) + ("fc",)
    if style == 2:
        return ("stem",) + tuple(f"layer{i + 1}" for i in range(n_layers - 2)) + ("fc",)
    mids = tuple(f"blocks.{i // 2}.{'attn' if i % 2 == 0 else 'mlp'}" for i in range(n_layers - 2))
    return ("embed",) + mids + ("head",)


# ------------------------------------------------------------------------------------ schedules


def _schedule(
    rng: np.random.Generator, n: int, difficulty: str, healthy: bool, flat: bool
) -> tuple[np.ndarray, float, str]:
    """Draw a learning-rate schedule; returns ``(lr, peak, name)``."""
    t = np.arange(n, dtype=np.float64)
    peak = _logu(rng, 1e-5, 1e-1)
    warm = int(_u(rng, 0.01, 0.08) * n) if rng.random() < 0.6 else 0
    names = ["constant", "cosine", "cosine_floor", "step", "sgdr", "linear", "inv_sqrt"]
    if flat:
        name = "constant"
    else:
        p = np.array([0.14, 0.2, 0.16, 0.16, 0.14, 0.1, 0.1])
        if healthy and difficulty == "easy":
            p = np.array([0.3, 0.3, 0.25, 0.05, 0.0, 0.1, 0.0])
        elif healthy and difficulty == "hard":
            p = np.array([0.05, 0.1, 0.1, 0.3, 0.3, 0.05, 0.1])
        name = names[int(rng.choice(len(names), p=p / p.sum()))]
    s = np.maximum(t - warm, 0.0)
    span = float(n - warm)
    if name == "constant":
        rel = np.ones(n)
    elif name == "cosine":
        horizon = span * _u(rng, 1.05, 1.15)
        rel = 0.5 * (1.0 + np.cos(np.pi * s / horizon))
    elif name == "cosine_floor":
        floor = _u(rng, 0.01, 0.1)
        rel = floor + (1.0 - floor) * 0.5 * (1.0 + np.cos(np.pi * s / span))
    elif name == "step":
        factor = 0.1 if rng.random() < 0.6 else 0.5
        k = int(rng.integers(1, 4))
        rel = np.ones(n)
        pos = np.sort(rng.uniform(0.3, 0.9, k))
        pos = pos[np.concatenate([[True], np.diff(pos) > 0.1])]
        for m in pos:
            rel = np.where(t >= int(m * n), rel * factor, rel)
    elif name == "sgdr":
        cycle = max(int(_u(rng, 0.1, 0.35) * span), 20)
        mult = 1 if rng.random() < 0.6 else 2
        eta = _logu(rng, 0.002, 0.05)
        pos_in = np.empty(n)
        start, length = 0, cycle
        for i in range(n):
            while s[i] >= start + length:
                start += length
                length *= mult
            pos_in[i] = (s[i] - start) / length
        rel = eta + (1.0 - eta) * 0.5 * (1.0 + np.cos(np.pi * pos_in))
    elif name == "linear":
        floor = _u(rng, 0.01, 0.1)
        rel = 1.0 - (1.0 - floor) * s / span
    else:  # inv_sqrt
        w0 = max(warm, int(rng.integers(20, 100)))
        rel = np.sqrt(w0 / np.maximum(t, w0))
    if warm:
        rel = np.where(t < warm, (t + 1.0) / warm, rel)
    return peak * rel, peak, name


# ------------------------------------------------------------------------------------ the run


class _Run:
    """A run's drawn parameters, the failure's modifications and their assembly into signals."""

    def __init__(
        self,
        rng: np.random.Generator,
        n: int,
        difficulty: str,
        healthy: bool,
        *,
        flat_schedule: bool = False,
        falling_at: int | None = None,
        val_limit: int | None = None,
    ) -> None:
        self.rng = rng
        self.n = n
        self.t = np.arange(n, dtype=np.float64)
        noise_diff = difficulty if healthy else "any"

        # schedule and progress
        self.lr, self.peak, self.schedule = _schedule(rng, n, difficulty, healthy, flat_schedule)
        rate = np.minimum(self.lr / self.peak, 1.0)
        tau = np.concatenate([[0.0], np.cumsum(rate)[:-1]])
        tau_total = float(tau[-1] + rate[-1])
        self.tau_base = tau

        # loss shape
        self.shape = ["exp", "power", "mix"][int(rng.integers(3))]
        self.alpha = _u(rng, 0.4, 1.5)
        self.mixw = _u(rng, 0.3, 0.8)
        self.log_l0 = math.log(_logu(rng, 0.05, 20.0))
        if falling_at is not None:
            self.drop = _u(rng, 1.0, 3.5)
            target = _u(rng, 0.3, 0.6)
            x = _solve_decay(target, self.shape, self.alpha, self.mixw)
            self.T = max(float(tau[falling_at]), 1.0) / x
        else:
            self.drop = _u(rng, 0.5, 3.5)
            regime = rng.random()
            if regime < 0.3:  # converges early and stays on a noisy plateau
                self.shape = "exp"
                x_end = _u(rng, 6.0, 15.0)
            elif regime < 0.8:
                x_end = _logu(rng, 1.5, 8.0)
            else:  # still falling at the end
                x_end = _u(rng, 0.4, 1.5)
            self.T = tau_total / x_end
            # every run makes real progress: at least 0.4 nats over its length
            g_end = float(_decay(np.array([x_end]), self.shape, self.alpha, self.mixw)[0])
            self.drop = max(self.drop, 0.4 / (1.0 - g_end))
        self.beta = _u(rng, 0.0, 0.15)
        self.lr_span = _u(rng, 5.0, 40.0)

        # loss noise
        sig_range = {
            "easy": (0.005, 0.02), "medium": (0.01, 0.045), "hard": (0.03, 0.08), "any": (0.005, 0.08)
        }[noise_diff]
        df_range = {"easy": (6.0, 8.0), "medium": (4.0, 7.0), "hard": (3.0, 5.0), "any": (3.0, 8.0)}[noise_diff]
        self.sigma = _logu(rng, *sig_range)
        self.df = _u(rng, *df_range)
        self.z_loss = _tnoise(rng, self.df, n)
        ar_hi = 1.0 if noise_diff == "hard" else 0.7
        self.ar = _ar1(rng, n, _u(rng, 0.95, 0.995), self.sigma * _u(rng, 0.2, ar_hi))
        spike_rate = {"easy": 0.0, "medium": 1 / 400, "hard": 1 / 150, "any": 1 / 300}[noise_diff]
        spike_rate *= _u(rng, 0.0, 1.0)
        self.spike_at = rng.random(n) < spike_rate
        self.spike_at[:5] = False
        self.spike_size = np.log(rng.uniform(1.08, 1.3, n)) * self.spike_at

        # gradient norms
        self.layer_names = _layer_names(rng, int(rng.integers(4, 11)))
        n_layers = len(self.layer_names)
        self.log_gf = math.log(_logu(rng, 0.1, 100.0))
        self.g_drop = _u(rng, 0.2, 2.0)
        self.TG = tau_total / _logu(rng, 0.5, 10.0)
        self.beta_g = _u(rng, -0.3, 0.3)
        self.late = _u(rng, 0.0, 0.5) if rng.random() < 0.3 else 0.0
        self.init_a = _u(rng, 0.3, 1.5) if rng.random() < 0.5 else 0.0
        self.init_k = _u(rng, 3.0, 20.0)
        sg_range = {
            "easy": (0.03, 0.12), "medium": (0.06, 0.2), "hard": (0.1, 0.3), "any": (0.03, 0.3)
        }[noise_diff]
        self.sigma_g = _u(rng, *sg_range)
        rho = _u(rng, 0.1, 0.6)
        zs = self.z_loss / math.sqrt(self.df / (self.df - 2.0))
        self.z_common = rho * zs + math.sqrt(1.0 - rho * rho) * _tnoise(rng, _u(rng, 3.0, 10.0), n)
        self.common_a = _u(rng, 0.6, 0.9)
        w = 10.0 ** rng.uniform(-0.5, 0.5, n_layers)
        self.log_w = np.log(w / math.sqrt(float(np.sum(w * w))))
        self.layer_drop = self.g_drop * rng.uniform(0.6, 1.4, n_layers)
        self.layer_sigma = self.sigma_g * rng.uniform(0.4, 0.9, n_layers)
        self.z_layer = rng.normal(0.0, 1.0, (n, n_layers))
        self.grad_spike = np.log(rng.uniform(1.2, 2.5, n)) * self.spike_at

        # update ratio
        self.log_u_peak = math.log(_logu(rng, 1.5e-4, 8e-4))
        self.gamma = _u(rng, 0.0, 0.5)
        self.w_growth = _u(rng, 0.0, 0.7)
        self.sigma_u = _u(rng, 0.02, 0.12)
        self.z_u = rng.normal(0.0, 1.0, n)

        # validation
        v = int(rng.integers(25, 101))
        if val_limit is not None:
            v = max(25, min(v, val_limit))
        self.val_every = v
        vs = np.arange(v, n, v)
        if rng.random() < 0.3:
            vs = np.concatenate([[0], vs])
        self.val_steps = vs.astype(np.int64)
        self.sigma_v = _logu(rng, 0.002, 0.02)
        self.gap0 = _u(rng, 0.0, 0.15)
        self.gap1 = _u(rng, 0.0, 0.1)
        self.z_val = rng.normal(0.0, 1.0, len(vs))

        # activations (every layer but the output one)
        self.act_steps = np.arange(0, n, 10, dtype=np.int64)
        self.act_layers = list(range(n_layers - 1))
        na = len(self.act_layers)
        ta = self.act_steps / n
        units = 10.0 ** rng.uniform(2.7, 4.3, na)
        dead = rng.uniform(0.05, 0.5, na) + np.outer(ta, rng.uniform(-0.05, 0.05, na))
        sat = rng.uniform(0.0, 0.2, na) + np.outer(ta, rng.uniform(-0.03, 0.03, na))
        self.dead_base = np.clip(dead, 0.01, 0.6)
        self.sat_base = np.clip(sat, 0.0, 0.3)
        m = len(self.act_steps)
        ar_sd = rng.uniform(0.002, 0.01, na)
        self.dead_wander = np.stack([_ar1(rng, m, 0.9, s) for s in ar_sd], axis=1)
        self.sat_wander = np.stack([_ar1(rng, m, 0.9, s) for s in ar_sd * 0.5], axis=1)
        self.units = units
        self.z_dead = rng.normal(0.0, 1.0, (m, na))
        self.z_sat = rng.normal(0.0, 1.0, (m, na))

        # the failure's modifications (neutral by default)
        self.prog = np.ones(n)
        self.add_model = np.zeros(n)  # log-loss of the model itself: train and validation
        self.add_train = np.zeros(n)  # log-loss on the training batches only
        self.noise_scale = np.ones(n)
        self.add_layer = np.zeros((n, n_layers))
        self.add_u = np.zeros(n)
        self.u_target: tuple[np.ndarray, np.ndarray] | None = None  # (blend weight, log target)
        self.add_val = np.zeros(n)
        self.val_freeze: int | None = None  # validation stops improving after this step
        self.dead_over: list[tuple[int, Callable[[np.ndarray], np.ndarray]]] = []
        self.sat_over: list[tuple[int, Callable[[np.ndarray], np.ndarray]]] = []
        self.act_grad_q = _u(rng, 0.5, 1.0)
        self.nonfinite: list[tuple[int, int, str, str]] = []  # (start, stop, loss value, grad value)

    # -- the base trends, before the failure's additions -----------------------------------
    def loss_trend(self) -> np.ndarray:
        """The healthy log-loss trend with the current lr and progress (no noise)."""
        lr_rel = self.lr / self.peak
        rate = np.minimum(lr_rel, 1.0) * self.prog
        tau = np.concatenate([[0.0], np.cumsum(rate)[:-1]])
        g = _decay(tau / self.T, self.shape, self.alpha, self.mixw)
        lr_eff = _ema(np.minimum(lr_rel, 1.0), self.lr_span)
        self._tau, self._g, self._lr_eff = tau, g, lr_eff
        return self.log_l0 - self.drop * (1.0 - g) + self.beta * (1.0 - g) * lr_eff

    # -- assembly --------------------------------------------------------------------------
    def assemble(self) -> dict[str, Any]:
        n, t = self.n, self.t
        trend = self.loss_trend()
        tau, g, lr_eff = self._tau, self._g, self._lr_eff
        model = trend + self.add_model
        train = model + self.ar + self.sigma * self.z_loss * self.noise_scale + self.add_train + self.spike_size
        with np.errstate(over="ignore"):
            loss = np.exp(train)

        g_grad = np.exp(-tau / self.TG)
        common = (
            self.log_gf + self.beta_g * lr_eff + self.late * (t / n) ** 2
            + self.init_a * np.exp(-t / self.init_k)
        )
        layer_trend = common[:, None] + self.log_w[None, :] + self.layer_drop[None, :] * g_grad[:, None]
        layer_trend = layer_trend + self.add_layer + self._act_grad_factor()
        noise = (
            self.sigma_g * self.common_a * self.z_common[:, None]
            + self.layer_sigma[None, :] * self.z_layer
            + self.grad_spike[:, None]
        )
        with np.errstate(over="ignore"):
            layers = np.exp(layer_trend + noise)
            grad = np.sqrt(np.sum(layers * layers, axis=1))
            grad_trend = 0.5 * np.log(np.sum(np.exp(2.0 * layer_trend), axis=1))

        with np.errstate(divide="ignore"):
            log_lr = np.log(self.lr / self.peak)
        log_u = (
            self.log_u_peak + log_lr + self.gamma * (grad_trend - grad_trend[0]) - self.w_growth * t / n
            + self.sigma_u * self.z_u + self.gamma * self.sigma_g * self.common_a * self.z_common + self.add_u
        )
        if self.u_target is not None:
            wgt, target = self.u_target
            log_u = np.where(wgt > 0, (1.0 - wgt) * log_u + wgt * (target + self.sigma_u * self.z_u), log_u)
        with np.errstate(over="ignore"):
            upd = np.exp(log_u)

        vs = self.val_steps
        gen = np.minimum(vs, self.val_freeze) if self.val_freeze is not None else vs  # generalisation stops
        val_model = trend[gen] + self.gap1 * (1.0 - g[gen]) + self.add_model[vs]
        with np.errstate(over="ignore"):
            val = np.exp(val_model + self.gap0 + self.sigma_v * self.z_val + self.add_val[vs])

        dead, sat = self._activations(layers)

        loss, grad, layers, upd, val = _f32(loss), _f32(grad), _f32(layers), _f32(upd), _f32(val)
        dead, sat = _f32(dead), _f32(sat)
        lr = _f32(self.lr)
        for start, stop, lval, gval in self.nonfinite:
            sl = slice(start, stop)
            persistent = stop >= n
            if lval != "finite":
                loss[sl] = float(lval)
            if gval != "finite":
                bad = np.zeros(layers.shape[1], dtype=bool)
                if persistent or gval == "nan":
                    bad[:] = True
                else:
                    bad[self.rng.choice(layers.shape[1], int(self.rng.integers(1, 3)), replace=False)] = True
                layers[sl, bad] = float(gval)
                grad[sl] = float(gval) if gval == "nan" else np.inf
            if persistent:
                upd[sl] = np.nan
                val[vs >= start] = np.nan
                dead[self.act_steps >= start] = np.nan
                sat[self.act_steps >= start] = np.nan
            elif gval != "finite":
                upd[sl] = 0.0  # the optimizer skips a step whose gradient overflowed
        return {
            "loss": loss, "grad_norm": grad, "lr": lr, "update_ratio": upd, "val_steps": vs.copy(),
            "val_loss": val, "layer_names": self.layer_names, "layer_grad_norms": layers,
            "act_steps": self.act_steps.copy(),
            "act_layer_names": tuple(self.layer_names[j] for j in self.act_layers),
            "dead_frac": dead, "saturation": sat,
        }

    def _act_curves(self) -> tuple[np.ndarray, np.ndarray]:
        ta = self.act_steps.astype(np.float64)
        dead = self.dead_base.copy()
        sat = self.sat_base.copy()
        for j, fn in self.dead_over:
            dead[:, j] = np.maximum(dead[:, j], fn(ta))
        for j, fn in self.sat_over:
            sat[:, j] = np.maximum(sat[:, j], fn(ta))
        return dead, sat

    def _act_grad_factor(self) -> np.ndarray:
        """Log factor on each layer's gradient norm from its dead or saturated units."""
        out = np.zeros((self.n, len(self.layer_names)))
        if not self.dead_over and not self.sat_over:
            return out
        dead, sat = self._act_curves()
        for j in {j for j, _ in self.dead_over} | {j for j, _ in self.sat_over}:
            alive = (1.0 - dead[:, j]) * (1.0 - sat[:, j])
            alive0 = (1.0 - self.dead_base[:, j]) * (1.0 - self.sat_base[:, j])
            f = np.log(np.maximum(alive, 1e-4) / alive0) * self.act_grad_q
            out[:, self.act_layers[j]] = np.interp(self.t, self.act_steps, f)
        return out

    def _activations(self, layers: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        dead, sat = self._act_curves()
        sd_d = np.sqrt(np.clip(dead * (1 - dead), 0, None) / self.units[None, :])
        sd_s = np.sqrt(np.clip(sat * (1 - sat), 0, None) / self.units[None, :])
        shrink_d = np.clip(1.0 - dead, 0.0, 1.0) / np.clip(1.0 - self.dead_base, 1e-3, 1.0)
        shrink_s = np.clip(1.0 - sat, 0.0, 1.0) / np.clip(1.0 - self.sat_base, 1e-3, 1.0)
        dead = dead + sd_d * self.z_dead + self.dead_wander * np.minimum(shrink_d, 1.0)
        sat = sat + sd_s * self.z_sat + self.sat_wander * np.minimum(shrink_s, 1.0)
        return np.clip(dead, 0.0, 1.0), np.clip(sat, 0.0, 1.0)


# ------------------------------------------------------------------------------------ failures


def _onset(rng: np.random.Generator, n: int, lo: float = 0.3, hi: float = 0.7, late_hi: float = 0.85) -> int:
    if rng.random() < 0.15:
        return int(_u(rng, hi, late_hi) * n)
    return int(_u(rng, lo, hi) * n)


def _blowup(run: _Run, start: int, rng: np.random.Generator) -> None:
    lval = "nan" if rng.random() < 0.6 else "inf"
    gval = "nan" if rng.random() < 0.5 else "inf"
    run.nonfinite.append((start, run.n, lval, gval))


def _divergence(run: _Run, rng: np.random.Generator, d: str, onset: int) -> None:
    n, t = run.n, run.t
    r = _by(rng, d, {"easy": (0.1, 0.3), "medium": (0.03, 0.1), "hard": (0.01, 0.03)}, log=True)
    accel = _u(rng, 0.0, 1.0)
    delta = np.maximum(t - onset, 0.0)
    raw = r * delta * (1.0 + accel * r * delta / 10.0)
    blow = rng.random() < 0.6
    ceiling = _u(rng, 3.0, 12.0)
    if blow:
        growth = _u(rng, 2.5, 8.0)
        hit = np.nonzero(raw >= growth)[0]
        b = int(hit[0]) if len(hit) else n
        if b < n:
            _blowup(run, b, rng)
        add = raw
    else:
        add = ceiling * np.tanh(raw / ceiling)
    run.prog[onset:] = 0.0
    run.add_model += add
    run.noise_scale *= 1.0 + 0.05 * add
    rg = rng.uniform(0.5, 1.5, len(run.layer_names))
    run.add_layer += np.minimum(add[:, None] * rg[None, :], 30.0)
    # the updates are driven by the instability, no longer by the schedule's decay
    with np.errstate(divide="ignore"):
        decayed = np.log(run.lr / run.lr[onset])
    run.add_u += np.minimum(add * _u(rng, 0.5, 1.2), 8.0) - np.minimum(decayed, 0.0) * (run.t >= onset)


def _nonfinite(run: _Run, rng: np.random.Generator, d: str, onset: int) -> None:
    n = run.n
    if d == "easy" or (d == "medium" and rng.random() < 0.3):
        _blowup(run, onset, rng)
        return
    length = int(rng.integers(2, 6)) if d == "medium" else int(rng.integers(1, 3))
    if d == "medium":
        lval = "nan" if rng.random() < 0.5 else "inf"
        gval = "inf" if rng.random() < 0.7 else "nan"
    else:
        lval, gval = ("finite", "inf") if rng.random() < 0.6 else ("inf" if rng.random() < 0.5 else "nan", "finite")
    run.nonfinite.append((onset, min(onset + length, n - 1), lval, gval))
    if rng.random() < 0.4:
        again = onset + int(rng.integers(30, 200))
        if again < n - 5:
            run.nonfinite.append((again, again + 1, lval, gval))


def _grad_explosion(run: _Run, rng: np.random.Generator, d: str, onset: int) -> None:
    n, t = run.n, run.t
    factor = 10.0 ** _by(rng, d, {"easy": (2.5, 3.0), "medium": (1.5, 2.5), "hard": (1.0, 1.5)})
    n_layers = len(run.layer_names)
    if rng.random() < 0.3:
        chosen = np.ones(n_layers, dtype=bool)
    else:
        chosen = np.zeros(n_layers, dtype=bool)
        chosen[rng.choice(n_layers, int(rng.integers(1, min(3, n_layers) + 1)), replace=False)] = True
    w2 = np.exp(2.0 * (run.log_w + run.layer_drop * math.exp(-run.tau_base[onset] / run.TG)))  # layers at onset
    total, part = float(np.sum(w2)), float(np.sum(w2[chosen]))
    mult = math.sqrt(max((factor * factor * total - (total - part)) / part, 1.0))
    pattern = rng.random()
    shape = np.zeros(n)
    if pattern < 0.3:  # sustained to the end
        shape[onset:] = 1.0
    elif pattern < 0.7:  # one long burst, then back
        length = int(rng.integers(5, 151))
        decay = int(rng.integers(1, 20))
        shape = np.where(t >= onset, 1.0, 0.0)
        after = t - (onset + length)
        shape = np.where(after > 0, np.exp(-np.maximum(after, 0.0) / decay), shape)
    else:  # repeated bursts
        start = onset
        for _ in range(int(rng.integers(2, 7))):
            length = int(rng.integers(3, 31))
            shape[start:min(start + length, n)] = 1.0
            start += length + int(rng.integers(10, 151))
            if start >= n:
                break
    jitter = rng.normal(0.0, 0.3, n)
    logm = math.log(mult) * shape + jitter * (shape > 0.5)
    run.add_layer[:, chosen] += logm[:, None]
    run.add_model += _u(rng, 0.01, 0.05) * math.log(factor) * shape
    run.noise_scale *= 1.0 + _u(rng, 0.2, 1.0) * shape
    run.add_u += math.log(_u(rng, 1.5, 5.0)) * shape


def _loss_spike(run: _Run, rng: np.random.Generator, d: str, onset: int) -> None:
    n = run.n

    def spike(at: int) -> None:
        f = _by(rng, d, {"easy": (4.0, 6.0), "medium": (2.2, 4.0), "hard": (1.5, 2.2)})
        m = max(math.log(f), 10.0 * run.sigma)
        length = int(rng.integers(1, 6))
        rho = _u(rng, 0.2, 0.6)
        for k in range(length):
            if at + k < n:
                run.add_train[at + k] += m * rho**k
        if at + length < n:
            run.add_train[at + length] += m * rho**length * 0.5
        gm = math.log(_u(rng, 1.5, 5.0))
        run.add_layer[at:at + max(1, length // 2), :] += gm
        run.add_u[at:at + 1] += math.log(_u(rng, 1.2, 3.0))

    spike(onset)
    if rng.random() < 0.3:
        again = onset + int(rng.integers(30, 300))
        if again < n - 10:
            spike(again)
    run.spike_size[onset:onset + 6] = 0.0


def _stall(run: _Run, rng: np.random.Generator, d: str, onset: int) -> None:
    t = run.t
    after = {"easy": 0.0, "medium": _u(rng, 0.0, 0.01), "hard": _u(rng, 0.02, 0.06)}[d]
    run.prog[onset:] = after
    g_drop = 10.0 ** _by(rng, d, {"easy": (2.0, 3.0), "medium": (1.0, 2.0), "hard": (0.5, 1.0)})
    u_drop = 10.0 ** _by(rng, d, {"easy": (2.5, 3.5), "medium": (1.5, 2.5), "hard": (1.0, 1.5)})
    length = _u(rng, 1.0, 20.0)
    ramp = _smooth_ramp(t, onset, length)
    cause = rng.random()
    if cause < 0.25:  # the learning rate dropped too early (by no more than a normal step decay)
        lr_drop = _u(rng, 0.1, 0.3)
        run.lr = np.where(t >= onset, run.lr * lr_drop, run.lr)
        u_drop = max(u_drop * lr_drop, 1.0)
    elif cause < 0.5:  # units died in one or two layers (short of the dead-units failure)
        for j in rng.choice(len(run.act_layers), min(2, len(run.act_layers)), replace=False):
            base = float(run.dead_base[0, j])
            rise = min(_u(rng, 0.15, 0.35), 0.75 - base)
            ln = length

            def fn(ta: np.ndarray, base: float = base, rise: float = rise, ln: float = ln) -> np.ndarray:
                return base + rise * np.clip((ta - onset) / ln, 0.0, 1.0) * (ta >= onset)

            run.dead_over.append((int(j), fn))
    run.add_layer -= math.log(g_drop) * ramp[:, None]
    run.add_u -= math.log(u_drop) * ramp


def _oscillation(run: _Run, rng: np.random.Generator, d: str, onset: int) -> None:
    n, t = run.n, run.t
    k = _by(rng, d, {"easy": (8.0, 15.0), "medium": (5.0, 8.0), "hard": (3.0, 5.0)})
    floor = {"easy": 0.4, "medium": 0.15, "hard": 0.05}[d]
    amp = max(k * run.sigma, floor * _u(rng, 1.0, 1.5))
    pattern = int(rng.integers(3))
    s = np.maximum(t - onset, 0.0)
    if pattern == 0:  # alternating, every step
        wave = np.where(s.astype(np.int64) % 2 == 0, 1.0, -1.0)
    else:
        period = _u(rng, 3.0, 12.0)
        phase = np.cumsum(np.maximum(rng.normal(1.0, 0.15, n), 0.2)) / period
        phase -= phase[onset]
        frac = phase - np.floor(phase)
        if pattern == 1:  # sawtooth: a jump up, then a slow slide down
            wave = 1.0 - 2.0 * frac
        else:  # a spike, then a collapse
            k = _u(rng, 3.0, 8.0)
            mean = (1.0 - math.exp(-k)) / k
            wave = 2.0 * (np.exp(-frac * k) - mean) / (1.0 - math.exp(-k))
    ramp = _ramp(t, onset, _u(rng, 1.0, {"easy": 5.0, "medium": 15.0, "hard": 30.0}[d]))
    wave = wave * ramp
    run.prog[onset:] = 0.0
    run.add_model += 0.3 * amp * wave
    run.add_train += 0.7 * amp * wave
    amp_g = _by(rng, d, {"easy": (1.5, 2.3), "medium": (1.0, 1.6), "hard": (0.7, 1.1)})
    amp_g = max(amp_g, {"easy": 8.0, "medium": 5.0, "hard": 3.0}[d] * run.sigma_g)
    run.add_layer += (amp_g * wave)[:, None]
    run.add_u += _u(rng, 0.5, 1.5) * amp_g * wave


def _vanishing(run: _Run, rng: np.random.Generator, d: str, onset: int) -> None:
    t = run.t
    n_layers = len(run.layer_names)
    k = int(rng.integers(1, max(1, n_layers // 2) + 1))
    orders = _by(rng, d, {"easy": (5.0, 6.0), "medium": (4.0, 5.0), "hard": (3.3, 4.0)})
    length = _by(rng, d, {"easy": (2.0, 8.0), "medium": (5.0, 25.0), "hard": (15.0, 60.0)})
    ramp = _ramp(t, onset, length)
    for j in range(k):
        run.add_layer[:, j] -= orders * (1.0 - 0.3 * j / k) * math.log(10.0) * ramp
    later = math.log(_u(rng, 0.5, 0.9))
    run.add_layer[:, k:] += later * _smooth_ramp(t, onset, 100.0)[:, None]
    run.prog[onset:] = _u(rng, 0.0, 0.15)
    run.add_u += math.log(_u(rng, 0.3, 0.8)) * _smooth_ramp(t, onset, length)


def _silent_collapse(run: _Run, rng: np.random.Generator, d: str, onset: int) -> None:
    n, t = run.n, run.t
    explode = rng.random() < 0.25
    if explode:
        orders = _by(rng, d, {"easy": (2.7, 3.0), "medium": (2.3, 2.7), "hard": (2.0, 2.3)})
    else:
        orders = _by(rng, d, {"easy": (3.5, 4.0), "medium": (2.5, 3.5), "hard": (2.0, 2.5)})
    length = _by(rng, d, {"easy": (20.0, 60.0), "medium": (50.0, 120.0), "hard": (100.0, 200.0)})
    length = min(length, 0.8 * (n - onset))
    ramp = _ramp(t, onset, length)
    sign = 1.0 if explode else -1.0
    spread = rng.uniform(0.8, 1.2, len(run.layer_names))
    run.add_layer += sign * orders * math.log(10.0) * ramp[:, None] * spread[None, :]
    run.add_u += sign * _u(rng, 0.1, 0.5) * orders * math.log(10.0) * ramp
    extra = _u(rng, 0.05, 0.3)
    run.add_model -= extra * (1.0 - np.exp(-np.maximum(t - onset, 0.0) / (0.5 * (n - onset))))
    run.noise_scale *= 1.0 - _u(rng, 0.3, 0.7) * ramp
    run.spike_size[onset:] = 0.0


def _classifier(run: _Run, rng: np.random.Generator, d: str, onset: int, vs: np.ndarray) -> dict[str, np.ndarray]:
    """A classifier's validation accuracy and the top-class share of sampled batches' predictions.

    Drawn after every other draw, from a generator of their own, so the other signals of a curve
    are those it had before these two existed. ``classes`` in 2 .. 1000 (log-uniform), the
    largest class's frequency 1 .. 3 times ``1 / classes`` (at most 0.8); a batch of 32 .. 512
    predictions sampled every 1, 2 or 5 steps, its top share counted from a multinomial draw.
    At initialisation the predictions concentrate (top share up to 0.6 above the largest class)
    and spread out within the first tenth of the run. The accuracy climbs from the largest
    class's frequency with training progress (``1 - g`` of the loss trend), measured on 500 ..
    20,000 samples. A collapse (``onset >= 0``) drives the top share to 0.8 .. 1 and the
    accuracy to the largest class's frequency over 5 .. 50 steps (smoothstep).
    """
    n = run.n
    k = int(round(_logu(rng, 2.0, 1000.0)))
    major = min(0.8, _logu(rng, 1.0, 3.0) / k)
    batch = int(round(_logu(rng, 32.0, 512.0)))
    every = int(rng.choice([1, 2, 5]))
    ps = np.arange(0, n, every, dtype=np.int64)
    t = ps.astype(np.float64)
    init = _u(rng, 0.0, 0.6) * (1.0 - major)
    share = major + init * np.exp(-t / _u(rng, 5.0, 0.1 * n))
    top = major + _u(rng, 0.3, 0.95) * (1.0 - major)
    n_val = int(round(_logu(rng, 500.0, 20_000.0)))
    acc = major + (top - major) * (1.0 - run._g[vs])  # noqa: SLF001 - this module's own run
    if onset >= 0:
        end = _by(rng, d, {"easy": (0.97, 1.0), "medium": (0.9, 0.97), "hard": (0.8, 0.9)})
        length = _by(rng, d, {"easy": (5.0, 15.0), "medium": (10.0, 30.0), "hard": (25.0, 50.0)})
        share = share + (end - share) * _smooth_ramp(t, onset, length)
        acc = acc + (major - acc) * _smooth_ramp(vs.astype(np.float64), onset, length)
    others = min(k - 1, 50)  # the classes the rest spreads over (at most 50: a larger count of the
    probs = np.empty((len(ps), others + 1))  # runner-up, so the healthy share is noisier, not quieter)
    probs[:, 0] = share
    probs[:, 1:] = ((1.0 - share) / others)[:, None]
    counts = rng.multinomial(batch, probs)
    got = counts.max(axis=1) / batch
    val_acc = rng.binomial(n_val, np.clip(acc, 0.0, 1.0)) / n_val
    return {"val_metric": _f32(val_acc), "pred_steps": ps, "pred_top_share": _f32(got)}


def _update_ratio(run: _Run, rng: np.random.Generator, d: str, onset: int, high: bool) -> None:
    t = run.t
    if high:
        target = _by(rng, d, {"easy": (0.4, 1.0), "medium": (0.2, 0.5), "hard": (0.1, 0.2)}, log=True)
        run.noise_scale *= 1.0 + (_by(rng, d, {"easy": (2.0, 4.0), "medium": (1.0, 2.0), "hard": (0.3, 1.0)})) * _ramp(
            t, onset, 10.0
        )
        run.prog[onset:] = _u(rng, 0.0, 0.3)
    else:
        target = 10.0 ** _by(rng, d, {"easy": (-8.0, -7.3), "medium": (-7.3, -6.6), "hard": (-6.6, -6.0)})
        run.prog[onset:] = _u(rng, 0.0, 0.05)
    length = _by(rng, d, {"easy": (1.0, 5.0), "medium": (5.0, 30.0), "hard": (20.0, 80.0)})
    wgt = _ramp(t, onset, length)
    run.u_target = (wgt, np.full(run.n, math.log(target)))


def _overfitting(run: _Run, rng: np.random.Generator, d: str, onset: int) -> None:
    n, t = run.n, run.t
    rise = _by(rng, d, {"easy": (0.4, 1.0), "medium": (0.15, 0.4), "hard": (0.06, 0.15)})
    rise = max(rise, 8.0 * run.sigma_v)
    p = _u(rng, 0.8, 1.3)
    x = np.clip((t - onset) / (n - 1 - onset), 0.0, 1.0)
    run.add_val += rise * x**p
    run.val_freeze = onset
    mem = _u(rng, 0.1, 0.6)
    run.add_train -= mem * (1.0 - np.exp(-np.maximum(t - onset, 0.0) / ((n - onset) * _u(rng, 0.3, 1.0))))


def _act_climb(run: _Run, rng: np.random.Generator, d: str, onset: int, dead: bool) -> None:
    n = run.n
    na = len(run.act_layers)
    chosen = rng.choice(na, 1 if rng.random() < 0.6 or na < 2 else 2, replace=False)
    if dead:
        tbl = {"easy": (0.97, 1.0), "medium": (0.94, 0.99), "hard": (0.92, 0.96)}
    else:
        tbl = {"easy": (0.9, 0.98), "medium": (0.75, 0.9), "hard": (0.6, 0.75)}
    for j in chosen:
        target = _by(rng, d, tbl)
        length = _by(rng, d, {"easy": (8.0, 30.0), "medium": (25.0, 90.0), "hard": (60.0, 180.0)})
        length = min(length, 0.7 * (n - onset))
        base = run.dead_base if dead else run.sat_base
        b0 = float(base[np.searchsorted(run.act_steps, onset, side="right") - 1, j])

        def fn(ta: np.ndarray, b0: float = b0, target: float = target, length: float = length) -> np.ndarray:
            x = np.clip((ta - onset) / length, 0.0, 1.0)
            return b0 + (target - b0) * x * x * (3.0 - 2.0 * x)

        (run.dead_over if dead else run.sat_over).append((int(j), fn))
    run.prog[onset:] = _u(rng, 0.3, 0.8)


def _lr_anomaly(run: _Run, rng: np.random.Generator, d: str, onset: int, variant: str) -> None:
    n, t = run.n, run.t
    factor = 10.0 ** _by(rng, d, {"easy": (2.3, 3.0), "medium": (1.7, 2.3), "hard": (1.3, 1.7)})
    if variant == "zero":
        run.lr = np.where(t >= onset, 0.0, run.lr)
        return
    if variant == "down":
        run.lr = np.where(t >= onset, run.lr / factor, run.lr)
        run.add_layer += math.log(_u(rng, 0.5, 1.0)) * _smooth_ramp(t, onset, 30.0)[:, None]
        return
    prior_peak = float(np.max(run.lr[: onset + 1]))
    factor = max(factor, 2.0 * prior_peak / float(run.lr[onset]))
    stop = n if rng.random() < 0.7 else min(n, onset + int(rng.integers(20, 201)))
    on = (t >= onset) & (t < stop)
    run.lr = np.where(on, run.lr * factor, run.lr)
    run.prog[on] = 0.0
    lf = math.log10(factor)
    jump = _u(rng, 0.1, 0.3) * lf
    delta = np.maximum(t - onset, 0.0)
    grow = _u(rng, 0.002, 0.01) * lf if factor >= 100 else 0.0
    react = (jump * (1.0 - np.exp(-delta / 3.0)) + 6.0 * np.tanh(grow * delta / 6.0)) * on
    after = t >= stop
    if after.any():
        react = np.where(after, react[stop - 1] * np.exp(-(t - stop) / 20.0), react)
    run.add_model += react
    run.noise_scale *= 1.0 + 0.3 * lf * on
    run.add_layer += (_u(rng, 0.2, 0.5) * math.log(factor) * (1.0 - np.exp(-delta / 5.0)) * on)[:, None]


# ------------------------------------------------------------------------------------ generate


def generate(kind: str, seed: int, difficulty: str = "medium", n_steps: int | None = None) -> Curve:
    """Generate one labeled training run.

    Args:
        kind: A failure kind (a :class:`trainsignals.Kind` value, see :data:`KINDS`) or
            ``"healthy"``.
        seed: Non-negative seed; the curve depends only on ``(kind, seed, difficulty,
            n_steps)``.
        difficulty: ``"easy"`` (obvious), ``"medium"`` or ``"hard"`` (subtle but real). For a
            healthy run, how noisy and tricky it is (heavier tails, restarts, step decays).
        n_steps: Run length; drawn in 400 .. 2000 when ``None``.

    Returns:
        The :class:`Curve`.

    Raises:
        ValueError: unknown kind or difficulty, negative seed, or ``n_steps`` below 200.

    Example:
        >>> c = generate("loss_spike", seed=1, difficulty="easy", n_steps=500)
        >>> c.kind, c.onset_step, len(c.loss)
        ('loss_spike', 285, 500)
        >>> bool(c.loss[c.onset_step] > 3 * c.loss[c.onset_step - 1])
        True
    """
    kind = getattr(kind, "value", kind)
    if kind != HEALTHY and kind not in KINDS:
        raise ValueError(f"kind must be 'healthy' or one of {', '.join(KINDS)}, got {kind!r}")
    if difficulty not in DIFFICULTIES:
        raise ValueError(f"difficulty must be one of {', '.join(DIFFICULTIES)}, got {difficulty!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    if n_steps is not None and (not isinstance(n_steps, (int, np.integer)) or n_steps < 200):
        raise ValueError(f"n_steps must be an integer >= 200, got {n_steps!r}")
    seed = int(seed)
    rng = _rng(kind, seed, difficulty)
    n = int(n_steps) if n_steps is not None else int(round(_logu(rng, _MIN_STEPS, _MAX_STEPS)))
    d = difficulty

    onset = -1
    opts: dict[str, Any] = {}
    variant = ""
    if kind == "divergence":
        onset = 0 if rng.random() < 0.25 else _onset(rng, n)
    elif kind == "stall":
        onset = _onset(rng, n, late_hi=0.75)
        opts["falling_at"] = onset
    elif kind == "silent_collapse":
        onset = _onset(rng, n, late_hi=0.75)
        opts["falling_at"] = onset
    elif kind == "overfitting":
        onset = int(_u(rng, 0.3, 0.7) * n)
        onset = min(max(onset, 100), n - 151)
        opts["val_limit"] = max(25, min((n - 1 - onset) // 6, onset // 4))
    elif kind == "lr_anomaly":
        variant = ["up", "down", "zero"][int(rng.choice(3, p=[0.4, 0.35, 0.25]))]
        opts["flat_schedule"] = variant == "zero"
        onset = _onset(rng, n)
    elif kind != HEALTHY:
        onset = _onset(rng, n)

    run = _Run(rng, n, d, kind == HEALTHY, **opts)
    frng = np.random.Generator(
        np.random.PCG64(np.random.SeedSequence([seed, zlib.crc32(kind.encode()), DIFFICULTIES.index(d), 1]))
    )
    if kind == "overfitting":
        v = run.val_steps
        ok = v[(v > 0) & (v <= onset)]
        onset = int(ok[-1]) if len(ok) else int(v[v > 0][0])
    if kind == "divergence":
        _divergence(run, frng, d, onset)
    elif kind == "nonfinite":
        _nonfinite(run, frng, d, onset)
    elif kind == "grad_explosion":
        _grad_explosion(run, frng, d, onset)
    elif kind == "loss_spike":
        _loss_spike(run, frng, d, onset)
    elif kind == "stall":
        _stall(run, frng, d, onset)
    elif kind == "oscillation":
        _oscillation(run, frng, d, onset)
    elif kind == "vanishing_gradient":
        _vanishing(run, frng, d, onset)
    elif kind == "silent_collapse":
        _silent_collapse(run, frng, d, onset)
    elif kind == "update_ratio_high":
        _update_ratio(run, frng, d, onset, high=True)
    elif kind == "update_ratio_low":
        _update_ratio(run, frng, d, onset, high=False)
    elif kind == "overfitting":
        _overfitting(run, frng, d, onset)
    elif kind == "dead_units":
        _act_climb(run, frng, d, onset, dead=True)
    elif kind == "saturation":
        _act_climb(run, frng, d, onset, dead=False)
    elif kind == "lr_anomaly":
        _lr_anomaly(run, frng, d, onset, variant)

    sig = run.assemble()
    if kind in (HEALTHY, "silent_collapse"):  # a classifier's predictions: from a stream of their own
        crng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(
            [seed, zlib.crc32(kind.encode()), DIFFICULTIES.index(d), 2])))
        sig.update(_classifier(run, crng, d, onset if kind == "silent_collapse" else -1, sig["val_steps"]))
    if kind == "overfitting":
        vl = sig["val_loss"]
        onset = int(sig["val_steps"][int(np.argmin(vl))])
    return _make_curve(kind, seed, d, n, onset, sig)


def _first_nonfinite(loss: np.ndarray, grad: np.ndarray) -> int:
    bad = ~(np.isfinite(loss) & np.isfinite(grad))
    return int(np.argmax(bad)) if bad.any() else -1


def _make_curve(kind: str, seed: int, difficulty: str, n: int, onset: int, sig: dict[str, Any]) -> Curve:
    return Curve(
        name=f"{kind}-{difficulty}-{seed}",
        kind=kind,
        onset_step=int(onset),
        difficulty=difficulty,
        seed=int(seed),
        total_steps=n,
        steps=np.arange(n, dtype=np.int64),
        first_nonfinite_step=_first_nonfinite(sig["loss"], sig["grad_norm"]),
        **sig,
    )


# ------------------------------------------------------------------------------------ the suite


def standard_suite(seed: int = 0) -> list[Curve]:
    """The committed benchmark suite: 33 curves of each failure kind and 165 healthy runs.

    Each kind has 11 curves of each difficulty; curve ``i`` of a (kind, difficulty) pair has
    seed ``1000 * seed + i``. The result depends only on ``seed``.

    Args:
        seed: Suite seed (non-negative).

    Returns:
        The curves, failure kinds in :data:`KINDS` order, then the healthy runs.
    """
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    plan = [(k, 11) for k in KINDS] + [(HEALTHY, 55)]
    out: list[Curve] = []
    for kind, per_difficulty in plan:
        for i in range(per_difficulty):
            for d in DIFFICULTIES:
                out.append(generate(kind, 1000 * int(seed) + i, d))
    return out


def default_directory() -> Path:
    """Where the committed suite lives: ``<repository>/datasets/synthetic``."""
    return Path(__file__).resolve().parents[2] / "datasets" / "synthetic"


def _schema() -> Any:
    import pyarrow as pa

    f32 = pa.list_(pa.float32())
    return pa.schema(
        [
            ("name", pa.string()),
            ("kind", pa.string()),
            ("difficulty", pa.string()),
            ("seed", pa.int64()),
            ("onset_step", pa.int64()),
            ("total_steps", pa.int64()),
            ("first_nonfinite_step", pa.int64()),
            ("loss", f32),
            ("grad_norm", f32),
            ("lr", f32),
            ("update_ratio", f32),
            ("val_steps", pa.list_(pa.int32())),
            ("val_loss", f32),
            ("layer_names", pa.list_(pa.string())),
            ("layer_grad_norms", pa.list_(f32)),
            ("act_steps", pa.list_(pa.int32())),
            ("act_layer_names", pa.list_(pa.string())),
            ("dead_frac", pa.list_(f32)),
            ("saturation", pa.list_(f32)),
            # what a classifier's answers say (empty lists where not measured); files written
            # before these columns existed lack them and load with them empty
            ("val_metric", f32),
            ("pred_steps", pa.list_(pa.int32())),
            ("pred_top_share", f32),
            ("pred_spread", f32),
        ],
        metadata={"format": FORMAT},
    )


def _cell(values: np.ndarray, gaps: np.ndarray | None) -> Any:
    """A series as the values of its Arrow list cell: float32, a step not measured as a null."""
    import pyarrow as pa

    if gaps is None or not gaps.any():
        return values.astype(np.float32)
    return pa.array(values.astype(np.float32), type=pa.float32(), mask=gaps)


def _check_f32(c: Curve) -> None:
    for field_name in ("loss", "grad_norm", "lr", "update_ratio", "val_loss", "layer_grad_norms", "dead_frac", "saturation",
                       "val_metric", "pred_top_share", "pred_spread"):
        a = getattr(c, field_name)
        if not np.array_equal(a.astype(np.float32).astype(np.float64), a, equal_nan=True):
            raise ValueError(f"{c.name}: {field_name} holds values that are not float32 numbers; cannot store exactly")


def _listed_files(directory: Path) -> set[str]:
    """The ``.arrow`` files the curve suite's manifest in ``directory`` lists (empty: no manifest).

    Raises:
        FileExistsError: ``directory`` holds a ``manifest.json`` that is not a curve suite's.
    """
    path = directory / _MANIFEST
    if not path.exists():
        return set()
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise FileExistsError(f"{path} is not a curve suite's manifest ({exc}); write the suite into "
                              "another folder") from exc
    entries = manifest.get("curves") if isinstance(manifest, dict) else None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT or not isinstance(entries, list):
        raise FileExistsError(f"{path} is not a curve suite's manifest (format "
                              f"{manifest.get('format') if isinstance(manifest, dict) else None!r}, expected "
                              f"{FORMAT!r} and a 'curves' list); write the suite into another folder")
    return {e["file"] for e in entries
            if isinstance(e, dict) and isinstance(e.get("file"), str) and _plain_arrow_name(e["file"])}


def _plain_arrow_name(name: str) -> bool:
    """Whether ``name`` is a ``.arrow`` file name in the folder itself (no folder part)."""
    return name.endswith(".arrow") and Path(name).name == name and name not in (".", "..")


def check_suite_folder(directory: Path) -> set[str]:
    """Check that a suite may be written into ``directory``; the previous suite's files there.

    Raises:
        NotADirectoryError: ``directory`` is a file.
        FileExistsError: it holds a ``manifest.json`` that is not a curve suite's, or ``.arrow``
            files that its suite's manifest does not list (they are named).
    """
    if directory.exists() and not directory.is_dir():
        raise NotADirectoryError(f"directory: {directory} is a file, not a folder to write the suite into")
    if not directory.exists():
        return set()
    listed = _listed_files(directory)
    others = sorted(p.name for p in directory.glob("*.arrow") if p.name not in listed)
    if others:
        shown = ", ".join(others[:5]) + (f" and {len(others) - 5} more" if len(others) > 5 else "")
        raise FileExistsError(
            f"{directory} holds .arrow files that are not a curve suite's ({shown}): no manifest.json there "
            "lists them; write the suite into another folder, or move them first")
    return listed


def write_suite(curves: Sequence[Curve], directory: str | Path, *, seed: int | None = None) -> None:
    """Write curves as Arrow IPC files (zstd), one per kind, plus ``manifest.json``.

    Each ``{kind}.arrow`` holds one row per curve; series are list columns (float32 values,
    exactly the curve's values; a step where a dense series was not measured, a :attr:`Curve.gaps`
    entry, is a null), per-layer series are lists of per-layer lists (column
    major). ``val_metric``, ``pred_steps``, ``pred_top_share`` and ``pred_spread`` are lists too
    (empty where not measured); files written before they existed lack these columns, and
    :func:`load_suite` reads their curves with them empty. ``manifest.json`` lists every curve
    in order with its label and file.

    Args:
        curves: The curves (names must be unique).
        directory: Output folder, created if needed. A suite already there (the files its
            ``manifest.json`` lists) is replaced; nothing else in the folder is touched, and a
            folder holding other ``.arrow`` files is refused.
        seed: Suite seed, recorded in the manifest when given.

    Raises:
        ValueError: curve names that repeat, or values that are not float32 numbers.
        NotADirectoryError: ``directory`` is a file.
        FileExistsError: ``directory`` holds ``.arrow`` files that no curve suite's manifest
            there lists (named in the message), or a ``manifest.json`` of another format.
            Nothing is written.
    """
    import pyarrow as pa
    import pyarrow.ipc as ipc

    directory = Path(directory)
    names = [c.name for c in curves]
    if len(set(names)) != len(names):
        raise ValueError("curve names must be unique")
    by_kind: dict[str, list[Curve]] = {}
    for c in curves:
        _check_f32(c)
        by_kind.setdefault(c.kind, []).append(c)
    previous = check_suite_folder(directory)
    directory.mkdir(parents=True, exist_ok=True)
    for name in sorted(previous):  # the previous suite's files, those of kinds this one lacks too
        (directory / name).unlink(missing_ok=True)
    schema = _schema()
    options = ipc.IpcWriteOptions(compression=pa.Codec("zstd", compression_level=19))
    for kind, group in by_kind.items():
        cols: dict[str, list[Any]] = {f.name: [] for f in schema}
        for c in group:
            for key in ("name", "kind", "difficulty", "seed", "onset_step", "total_steps", "first_nonfinite_step"):
                cols[key].append(getattr(c, key))
            for key in ("loss", "grad_norm", "lr", "update_ratio", "val_loss"):
                cols[key].append(_cell(getattr(c, key), c.gaps.get(key)))
            cols["val_steps"].append(c.val_steps.astype(np.int32))
            cols["val_metric"].append(c.val_metric.astype(np.float32))
            cols["pred_steps"].append(c.pred_steps.astype(np.int32))
            cols["pred_top_share"].append(c.pred_top_share.astype(np.float32))
            cols["pred_spread"].append(c.pred_spread.astype(np.float32))
            cols["act_steps"].append(c.act_steps.astype(np.int32))
            cols["layer_names"].append(list(c.layer_names))
            cols["act_layer_names"].append(list(c.act_layer_names))
            cols["layer_grad_norms"].append(list(c.layer_grad_norms.T.astype(np.float32)))
            cols["dead_frac"].append(list(c.dead_frac.T.astype(np.float32)))
            cols["saturation"].append(list(c.saturation.T.astype(np.float32)))
        table = pa.table({k: pa.array(v, type=schema.field(k).type) for k, v in cols.items()}, schema=schema)
        with ipc.new_file(directory / f"{kind}.arrow", schema, options=options) as writer:
            writer.write_table(table)
    manifest: dict[str, Any] = {"format": FORMAT}
    if seed is not None:
        manifest["seed"] = int(seed)
        manifest["command"] = f"python -m trainsignals.curves build --seed {int(seed)}"
    manifest["curves"] = [
        {
            "name": c.name,
            "kind": c.kind,
            "onset_step": c.onset_step,
            "difficulty": c.difficulty,
            "seed": c.seed,
            "total_steps": c.total_steps,
            "first_nonfinite_step": c.first_nonfinite_step,
            "file": f"{c.kind}.arrow",
        }
        for c in curves
    ]
    (directory / _MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")


def suite_directory(suite: str | Path | None = None) -> Path:
    """The folder a suite name or path stands for, as :func:`load_suite` reads it.

    A name of :data:`SUITE_FOLDERS` (a string: ``"synthetic"``, ``"real"``, ``"dev"`` or
    ``"real_dev"``, ``"heldout"`` or ``"real_heldout"``) is that folder of the repository's
    ``datasets``, whatever the current directory holds; ``None`` is ``datasets/synthetic``.
    Anything else is a path, relative to the current directory: write ``"./real"`` for a folder
    of your own named like a committed suite.

    Raises:
        ValueError: an empty string.

    Example:
        >>> suite_directory("heldout") == default_directory().parent / "real_heldout"
        True
        >>> str(suite_directory("./real"))
        'real'
    """
    if suite is None:
        return default_directory()
    if isinstance(suite, str):
        if not suite:
            raise ValueError("directory: an empty string names no suite; give a suite name or a folder")
        if suite in SUITE_FOLDERS:
            return default_directory().parent / SUITE_FOLDERS[suite]
    return Path(suite)


def _missing_suite(path: Path) -> str:
    """Why there is no suite at ``path``, and how to make one."""
    head = f"no curve suite at {path} (missing {_MANIFEST})"
    builder = _BUILDERS.get(path.name) if path.parent == default_directory().parent else None
    if builder is not None:
        return (f"{head}; the committed datasets live in the source repository, or build this suite with "
                f"`{builder}`")
    return (f"{head}; write one with trainsignals.curves.write_suite, or the synthetic suite with "
            f"`python -m trainsignals.curves build --out {path}`")


def _lists(col: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A list column as (offsets, flat values as numpy with NaN for nulls, where they are null)."""
    arr = col.combine_chunks()
    offsets = np.asarray(arr.offsets)
    values = arr.values
    nulls = np.asarray(values.is_null()) if values.null_count else np.zeros(len(values), dtype=bool)
    return offsets, np.asarray(values.to_numpy(zero_copy_only=False)), nulls


def _read_file(path: Path) -> dict[str, Curve]:
    import pyarrow.ipc as ipc

    with ipc.open_file(path) as reader:
        table = reader.read_all()
    cols = {name: table.column(name).to_pylist() for name in (
        "name", "kind", "difficulty", "seed", "onset_step", "total_steps", "first_nonfinite_step",
        "layer_names", "act_layer_names",
    )}
    flat = {k: _lists(table.column(k)) for k in ("loss", "grad_norm", "lr", "update_ratio", "val_steps", "val_loss", "act_steps",
                                                 *_OPTIONAL_SERIES) if k in table.column_names}
    nested = {}
    for k in ("layer_grad_norms", "dead_frac", "saturation"):
        arr = table.column(k).combine_chunks()
        outer = np.asarray(arr.offsets)
        inner = np.asarray(arr.values.offsets)
        values = np.asarray(arr.values.values.to_numpy(zero_copy_only=False))
        nested[k] = (outer, inner, values)
    out: dict[str, Curve] = {}
    for i, name in enumerate(cols["name"]):
        def one(k: str, dtype: Any = np.float64, i: int = i) -> np.ndarray:
            if k not in flat:  # an optional series the file does not have
                return np.zeros(0, dtype=dtype)
            off, vals, _ = flat[k]
            return vals[off[i]:off[i + 1]].astype(dtype)

        def gaps(i: int = i) -> dict[str, np.ndarray]:
            out = {}
            for k in _DENSE:
                off, _, nulls = flat[k]
                if nulls[off[i]:off[i + 1]].any():
                    out[k] = nulls[off[i]:off[i + 1]].copy()
            return out

        def two(k: str, length: int, i: int = i) -> np.ndarray:
            outer, inner, values = nested[k]
            a, b = outer[i], outer[i + 1]
            rows = [values[inner[j]:inner[j + 1]] for j in range(a, b)]
            if not rows:        # no layer (a softmax regression has no activation layer)
                return np.zeros((length, 0))
            return np.stack(rows, axis=1).astype(np.float64)

        n = int(cols["total_steps"][i])
        act_steps = one("act_steps", np.int64)
        out[name] = Curve(
            name=name,
            kind=cols["kind"][i],
            onset_step=int(cols["onset_step"][i]),
            difficulty=cols["difficulty"][i],
            seed=int(cols["seed"][i]),
            total_steps=n,
            steps=np.arange(n, dtype=np.int64),
            loss=one("loss"),
            grad_norm=one("grad_norm"),
            lr=one("lr"),
            update_ratio=one("update_ratio"),
            val_steps=one("val_steps", np.int64),
            val_loss=one("val_loss"),
            val_metric=one("val_metric"),
            pred_steps=one("pred_steps", np.int64),
            pred_top_share=one("pred_top_share"),
            pred_spread=one("pred_spread"),
            layer_names=tuple(cols["layer_names"][i]),
            layer_grad_norms=two("layer_grad_norms", n),
            act_steps=act_steps,
            act_layer_names=tuple(cols["act_layer_names"][i]),
            dead_frac=two("dead_frac", len(act_steps)),
            saturation=two("saturation", len(act_steps)),
            first_nonfinite_step=int(cols["first_nonfinite_step"][i]),
            gaps=gaps(),
        )
    return out


#: the labels a manifest entry repeats from its curve's row
_LABELS: tuple[str, ...] = ("kind", "onset_step", "difficulty", "seed", "total_steps", "first_nonfinite_step")


def _entries(manifest_path: Path) -> list[dict[str, Any]]:
    """The curve entries of a suite's manifest, each with every key :func:`load_suite` reads.

    Raises:
        ValueError: the manifest is not JSON, not of :data:`FORMAT`, has no ``curves`` list, or an
            entry lacks a key or names a file outside the folder (the entry and key are named).
    """
    try:
        manifest = json.loads(manifest_path.read_text())
    except ValueError as exc:  # not JSON (or not text)
        raise ValueError(f"{manifest_path}: not a JSON manifest: {exc}") from exc
    if not isinstance(manifest, dict):
        raise ValueError(f"{manifest_path}: expected a JSON object, got {type(manifest).__name__}")
    if manifest.get("format") != FORMAT:
        raise ValueError(f"{manifest_path}: unknown format {manifest.get('format')!r}, expected {FORMAT!r}")
    entries = manifest.get("curves")
    if not isinstance(entries, list):
        raise ValueError(f"{manifest_path}: no 'curves' list (one entry per curve)")
    keys = ("name", "file", *_LABELS)
    for i, entry in enumerate(entries):
        what = f"{manifest_path}: curve entry {i}"
        if not isinstance(entry, dict):
            raise ValueError(f"{what} is not an object")
        if isinstance(entry.get("name"), str):
            what += f" ({entry['name']!r})"
        missing = [k for k in keys if k not in entry]
        if missing:
            raise ValueError(f"{what} lacks {', '.join(repr(k) for k in missing)}")
        if not isinstance(entry["file"], str) or not _plain_arrow_name(entry["file"]):
            raise ValueError(f"{what}: file {entry['file']!r} is not a .arrow file name in the suite's folder")
    return entries


def load_suite(directory: str | Path | None = None) -> list[Curve]:
    """Load a suite written by :func:`write_suite`, in manifest order.

    Args:
        directory: A committed suite's name (a string of :data:`SUITE_FOLDERS`: ``"synthetic"``,
            ``"real"``, ``"dev"``, ``"heldout"``, ``"real_dev"``, ``"real_heldout"``), always that
            folder of the repository's ``datasets``; or any other folder (``"./real"`` for one of
            your own with such a name; see :func:`suite_directory`); ``None`` is the committed
            synthetic suite (``datasets/synthetic``).

    Returns:
        The curves.

    Raises:
        FileNotFoundError: the folder, its manifest or a file it names is missing (an installed
            package does not ship the datasets; the message names the command that builds the
            suite).
        ValueError: a malformed manifest (not JSON, of another format, no ``curves`` list, an
            entry without a key), a file that is not a readable curve file, or a manifest and
            files that disagree; the message names the file.
    """
    path = suite_directory(directory)
    manifest_path = path / _MANIFEST
    if not manifest_path.is_file():
        raise FileNotFoundError(_missing_suite(path))
    files: dict[str, dict[str, Curve]] = {}
    out: list[Curve] = []
    for entry in _entries(manifest_path):
        fname = entry["file"]
        fpath = path / fname
        if fname not in files:
            if not fpath.is_file():
                raise FileNotFoundError(f"curve file {fpath} named in {manifest_path} is missing")
            try:
                files[fname] = _read_file(fpath)
            except (ValueError, KeyError, TypeError, IndexError, NotImplementedError) as exc:  # ArrowInvalid: a ValueError
                raise ValueError(f"{fpath}: not a readable curve file ({type(exc).__name__}: {exc})") from exc
        curve = files[fname].get(entry["name"])
        if curve is None:
            raise ValueError(f"curve {entry['name']!r} is not in {fpath}")
        for key in _LABELS:
            if getattr(curve, key) != entry[key]:
                raise ValueError(
                    f"curve {entry['name']!r}: {manifest_path} says {key}={entry[key]!r}, {fpath} says "
                    f"{getattr(curve, key)!r}"
                )
        out.append(curve)
    return out


# ------------------------------------------------------------------------------------ CLI


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m trainsignals.curves build [--out DIR] [--seed 0]``.

    Raises:
        FileExistsError: ``--out`` holds ``.arrow`` files that no curve suite's manifest there
            lists, or another tool's ``manifest.json`` (checked before anything is generated).
        NotADirectoryError: ``--out`` is a file. ``python -m trainsignals.curves`` (and
            ``trainsignals datasets``) print these as one ``error:`` line, status 2.
    """
    from trainsignals.cli.options import nonnegative_int

    parser = argparse.ArgumentParser(prog="python -m trainsignals.curves", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build", help="(re)generate the standard suite")
    build.add_argument("--out", type=Path, default=None, help="output folder (default: datasets/synthetic); "
                       "a suite already there is replaced, a folder with other .arrow files refused")
    build.add_argument("--seed", type=nonnegative_int, default=0, help="suite seed (default: 0)")
    args = parser.parse_args(argv)
    out = args.out if args.out is not None else default_directory()
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(f"--out {out} is a file; give the folder to write the suite into")
    check_suite_folder(out)  # before the suite is generated
    curves = standard_suite(args.seed)
    write_suite(curves, out, seed=args.seed)
    size = sum(p.stat().st_size for p in Path(out).iterdir() if p.is_file())
    print(f"wrote {len(curves)} curves to {out} ({size / 1e6:.1f} MB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
