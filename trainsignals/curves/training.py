"""The building blocks the real-run families share: the run's spec, seeded draws, the data, the
learning-rate factors, the recorder and the assembly of a recorded run into a :class:`Curve`.

:mod:`trainsignals.curves.real_runs` (the tuning families and the builder) and
:mod:`trainsignals.curves.families` (the held-out families) both train on these; this module
imports neither of them, and no torch (the functions that need it are given it).

* :class:`RunSpec` — everything that defines one run; :data:`FAULT_KINDS` the kinds injected;
* :func:`seeded_rng`, :func:`log_uniform`, :func:`pick` — the draws of a run's configuration;
* :func:`corpus` (the character LMs' text: the source of a few standard-library modules) and
  :func:`digits` (scikit-learn's 8x8 digits);
* :func:`schedule_factor` and :func:`fault_lr_factor` — the learning rate's multipliers;
* :func:`train_step` — one training step, fault and all, given a family set's :class:`StepKit`;
* :class:`Collector` and :func:`watch` — a ``TorchWatcher`` feeding a Monitor that runs no
  detector and records every step; :func:`to_curve` turns what it recorded into a
  :class:`~trainsignals.curves.Curve`.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from trainsignals.curves import Curve

__all__ = [
    "FAULT_KINDS",
    "Collector",
    "RunSpec",
    "StepKit",
    "corpus",
    "digits",
    "fault_lr_factor",
    "log_uniform",
    "pick",
    "schedule_factor",
    "seeded_rng",
    "to_curve",
    "train_step",
    "watch",
]

FAULT_KINDS: tuple[str, ...] = (
    "divergence", "stall", "oscillation", "loss_spike", "grad_explosion",
    "vanishing_gradient", "dead_units", "silent_collapse", "overfitting",
)
"""The failure kinds injected, in :class:`trainsignals.Kind` order."""

_CORPUS_MODULES = ("textwrap", "string", "fnmatch", "glob", "shlex", "tokenize")
_CORPUS_CHARS = 60_000


# ------------------------------------------------------------------------------------ the spec


@dataclass(frozen=True)
class RunSpec:
    """Everything that defines one run: model, data, optimizer, schedule and the fault.

    Attributes:
        name: ``"{kind}-{family}-{seed}"``.
        kind: The intended label: ``"healthy"`` or a fault kind.
        family: One of :data:`trainsignals.curves.real_runs.FAMILIES`,
            :data:`trainsignals.curves.families.HELDOUT_FAMILIES` or
            :data:`trainsignals.curves.families.DEV_FAMILIES`.
        seed: Seed of the run (torch and the batch sampler).
        steps: Optimizer steps.
        optimizer: ``"sgd"``, ``"sgdm"`` (momentum 0.9) or ``"adamw"``; in the held-out
            families also ``"nesterov"``, ``"adam"`` and ``"rmsprop"``; in the development
            families also ``"adagrad"``, ``"nadam"`` and ``"adamax"``.
        lr: Peak learning rate.
        weight_decay: Weight decay.
        schedule: ``"constant"``, ``"cosine"``, ``"warmup_cosine"``, ``"warmup_linear"`` or ``"step"``;
            in the held-out families also ``"cosine_restarts"``; in the development families also
            ``"late_step"``.
        warmup: Warmup steps (linear from ``lr / warmup``).
        batch_size: Batch size.
        arch: Architecture settings of the family (widths, depth, activation...).
        augment: Digits only: ``(shift probability, noise sd)``.
        val_every: Steps between validations (validation at step 0 too when ``val_at_zero``).
        val_at_zero: Whether to validate at step 0.
        per_layer: ``TorchWatcher``'s ``per_layer``: ``"module"`` or ``"parameter"``.
        clip: Gradient clipping's max norm (``clip_grad_norm_``), 0 for none; the grad norms are
            measured before clipping (``TorchWatcher.capture_grads``).
        onset: Injection step; ``-1`` for a healthy run.
        fault: The fault's parameters (see :mod:`trainsignals.curves.real_runs` and
            :mod:`trainsignals.curves.families`).
    """

    name: str
    kind: str
    family: str
    seed: int
    steps: int
    optimizer: str
    lr: float
    weight_decay: float
    schedule: str
    warmup: int
    batch_size: int
    arch: dict[str, Any]
    augment: tuple[float, float]
    val_every: int
    val_at_zero: bool
    per_layer: str
    clip: float = 0.0
    onset: int = -1
    fault: dict[str, Any] = field(default_factory=dict)


def seeded_rng(*parts: Any) -> np.random.Generator:
    """A NumPy generator seeded by ``parts`` (integers as they are, anything else by the CRC-32
    of its ``str``), so that a run's draws depend on its suite seed, kind, family and index only.
    """
    entropy = [p if isinstance(p, int) else zlib.crc32(str(p).encode()) for p in parts]
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(entropy)))


def log_uniform(rng: np.random.Generator, lo: float, hi: float) -> float:
    """A draw from ``rng`` uniform in ``log`` between ``lo`` and ``hi`` (both > 0)."""
    return float(math.exp(rng.uniform(math.log(lo), math.log(hi))))


def pick(rng: np.random.Generator, options: Sequence[Any], p: Sequence[float] | None = None) -> Any:
    """One of ``options`` drawn from ``rng``, with weights ``p`` (normalised; uniform when None)."""
    i = int(rng.choice(len(options), p=None if p is None else np.asarray(p) / np.sum(p)))
    return options[i]


# ------------------------------------------------------------------------------------ data


_CACHE: dict[str, Any] = {}


def corpus() -> str:
    """The character-level language model's text: the source of a few standard-library modules.

    Printable ASCII only (anything else becomes ``?``), the first 60,000 characters.
    """
    if "corpus" not in _CACHE:
        import importlib.util

        parts = []
        for mod in _CORPUS_MODULES:
            spec = importlib.util.find_spec(mod)
            if spec is None or spec.origin is None:
                raise RuntimeError(f"standard-library module {mod!r} has no source file")
            parts.append(Path(spec.origin).read_text(encoding="utf-8"))
        text = "\n".join(parts)
        text = "".join(ch if (32 <= ord(ch) < 127 or ch == "\n") else "?" for ch in text)
        _CACHE["corpus"] = text[:_CORPUS_CHARS]
    return str(_CACHE["corpus"])


def digits() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's 8x8 digits: ``(X, y)``, ``X`` float32 in [0, 1] (1797 x 64), ``y`` int64."""
    if "digits" not in _CACHE:
        from sklearn.datasets import load_digits

        X, y = load_digits(return_X_y=True)
        _CACHE["digits"] = (np.asarray(X, dtype=np.float32) / 16.0, np.asarray(y, dtype=np.int64))
    return _CACHE["digits"]  # type: ignore[no-any-return]


# ------------------------------------------------------------------------------------ the learning rate


def schedule_factor(spec: RunSpec, t: int) -> float:
    """The schedule's multiplier of the peak learning rate at step ``t`` (no fault)."""
    n, w = spec.steps, spec.warmup
    if w and t < w:
        return (t + 1) / w
    s = (t - w) / max(n - w, 1)
    if spec.schedule in ("cosine", "warmup_cosine"):
        return 0.02 + 0.98 * 0.5 * (1.0 + math.cos(math.pi * s))
    if spec.schedule == "warmup_linear":
        return 1.0 - 0.95 * s
    if spec.schedule == "step":
        return 1.0 if s < 0.5 else (0.3 if s < 0.75 else 0.1)
    return 1.0


def fault_lr_factor(spec: RunSpec, t: int, mult: float | None = None) -> float:
    """The fault's multiplier of the learning rate at step ``t`` (1 before the onset).

    ``mult`` overrides ``spec.fault["lr_mult"]`` (the edge-of-stability multiplier found at the onset).
    """
    mult = spec.fault.get("lr_mult") if mult is None else mult
    if mult is None or isinstance(mult, str) or t < spec.onset:
        return 1.0
    ramp = int(spec.fault.get("ramp", 0))
    if ramp <= 0:
        return float(mult)
    frac = min((t - spec.onset + 1) / ramp, 1.0)
    return float(mult) ** frac


# ------------------------------------------------------------------------------------ recording


class Collector:
    """A :class:`trainsignals.Recorder` that keeps every step the Monitor sees."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, dict[str, float], Any, Any]] = []

    def record(self, *, step: int, signals: Mapping[str, float], layer_grad_norms: Any,
               activations: Any, events: Sequence[Any]) -> None:
        """Keep the step's signals, per-layer grad norms and activation statistics."""
        self.rows.append((step, dict(signals), layer_grad_norms, activations))

    def record_batch(self, **kwargs: Any) -> None:  # pragma: no cover - the generator streams
        """Not used: the real-run generator only streams updates.

        Raises:
            NotImplementedError: always.
        """
        raise NotImplementedError("the real-run generator only streams updates")


def watch(model: Any, optimizer: Any, spec: RunSpec) -> tuple[Any, Collector]:
    """A ``TorchWatcher`` on ``model`` and ``optimizer`` feeding a Monitor that runs no detector
    and records every step into the returned :class:`Collector` (``per_layer`` as ``spec``
    says, the update ratio every step, the activation statistics every 10 steps).

    Returns:
        ``(watcher, collector)``.
    """
    import trainsignals as ts
    from trainsignals.adapters.torch import TorchWatcher

    collector = Collector()
    quiet: dict[str, Any] = {name: False for name in ts.Monitor().detectors}   # record only: no detector runs
    monitor = ts.Monitor(total_steps=spec.steps, recorder=collector, **quiet)
    watcher = TorchWatcher(model, optimizer, monitor, per_layer=spec.per_layer,   # type: ignore[arg-type]
                           update_ratio_every=1, activations_every=10)
    return watcher, collector


def top_share(out: Any) -> Any:
    """The share of the most-predicted class among a classifier's outputs ``out`` (classes along
    the last dimension): ``pred_top_share``, as the torch adapter measures it, a 0-d tensor
    taken without gradients (the run is not touched).
    """
    from trainsignals.adapters.torch import pred_top_share

    return pred_top_share(out.detach())


def spread(out: Any) -> Any:
    """The spread of a regression's outputs ``out`` across the batch: ``pred_spread``, as the torch
    adapter measures it, a 0-d tensor taken without gradients.
    """
    from trainsignals.adapters.torch import pred_spread

    return pred_spread(out.detach())


def accuracy(out: Any, y: Any, torch: Any) -> Any:
    """The share of the outputs ``out`` whose most likely class is the true class ``y``
    (``val_metric``), a 0-d tensor taken without gradients.
    """
    with torch.no_grad():
        return (out.detach().argmax(-1) == y).to(torch.float32).mean()


class StepKit(NamedTuple):
    """What a set of families' training step looks up: its schedule, its faults and its loss.

    Attributes:
        lr_factor: ``(spec, t) -> float``, the schedule's multiplier of ``spec.lr`` at step ``t``.
        inject_weights: ``(spec, model, torch)``, the fault's change to the weights at the onset.
        corrupt: ``(spec, data, x, y, t, torch) -> (x, y)``, the fault's change to a batch.
        loss_of: ``(spec, out, y, torch) -> loss``, the run's loss.
    """

    lr_factor: Callable[[Any, int], float]
    inject_weights: Callable[[Any, Any, Any], None]
    corrupt: Callable[[Any, Any, Any, Any, int, Any], tuple[Any, Any]]
    loss_of: Callable[[Any, Any, Any, Any], Any]


def train_step(kit: StepKit, spec: Any, model: Any, opt: Any, data: Any, t: int, torch: Any, *, fault: bool,
               mult: float | None, watcher: Any = None) -> float:
    """Step ``t`` of a run (its fault applied when ``fault``), recorded by ``watcher`` when given.

    The learning rate (the schedule's, times the fault's multiplier, ``mult`` overriding it);
    at the onset the fault's weights, and an overfitting fault's smaller training set; a batch
    (corrupted by the fault); forward, backward, clipping (the watcher takes the norms before it),
    the optimizer's step (none for a frozen optimizer's fault); a validation every
    ``spec.val_every`` steps; the watcher's record of the loss, the validation and, for a
    classifier, its answers (for a regression, the spread of its predictions). Returns the loss.
    """
    lr = spec.lr * kit.lr_factor(spec, t) * (fault_lr_factor(spec, t, mult) if fault else 1.0)
    for group in opt.param_groups:
        group["lr"] = float(np.float32(lr))
    if fault and t == spec.onset:
        kit.inject_weights(spec, model, torch)
        if spec.kind == "overfitting":
            data.restrict(int(spec.fault["n_examples"]))
    x, y = data.batch()
    if fault:
        x, y = kit.corrupt(spec, data, x, y, t, torch)
    out = model(x)
    loss = kit.loss_of(spec, out, y, torch)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    if spec.clip > 0:
        if watcher is not None:
            watcher.capture_grads()  # the norms before clipping
        torch.nn.utils.clip_grad_norm_(model.parameters(), spec.clip)
    if not (fault and spec.fault.get("freeze") and t >= spec.onset):
        opt.step()
    val = acc = None
    if (t % spec.val_every == 0 and t > 0) or (t == 0 and spec.val_at_zero):
        model.eval()
        with torch.no_grad():
            out_val = model(data.x_val)
            val = kit.loss_of(spec, out_val, data.y_val, torch)
        model.train()
        if not data.regression:
            acc = accuracy(out_val, data.y_val, torch)
    if watcher is not None:  # a classifier's answers (the top share of this batch, the validation accuracy),
        # a regression's spread of this batch's predictions
        share, spr = (None, spread(out)) if data.regression else (top_share(out), None)
        watcher.update(loss=loss.detach(), val_loss=val, val_metric=acc, pred_top_share=share, pred_spread=spr)
    return float(loss.detach())


def _f32(a: Any) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):
        return np.asarray(a, dtype=np.float64).astype(np.float32).astype(np.float64)


def to_curve(spec: RunSpec, rows: list[tuple[int, dict[str, float], Any, Any]], watcher: Any) -> Curve:
    """The run ``spec`` as a :class:`~trainsignals.curves.Curve`, labeled as intended, from the
    rows a :class:`Collector` recorded (one a step) and the watcher's layer names.

    Every signal is stored as float32 values (in float64 arrays). Steps where the adapter did
    not record a dense signal (a frozen optimizer never steps: no update ratio) are the curve's
    ``gaps`` (NaN in the array): not measured, which is not a non-finite value.

    Raises:
        RuntimeError: the rows are not steps ``0 .. spec.steps - 1`` in order.
    """
    n = spec.steps
    if len(rows) != n or [r[0] for r in rows] != list(range(n)):
        raise RuntimeError(f"{spec.name}: recorded {len(rows)} steps, expected {n}")

    def dense(key: str) -> np.ndarray:
        return _f32([r[1].get(key, math.nan) for r in rows])

    gaps = {key: absent for key in ("loss", "grad_norm", "lr", "update_ratio")
            if (absent := np.array([key not in r[1] for r in rows], dtype=bool)).any()}

    layer_names = tuple(watcher.layer_names)
    lgn = np.full((n, len(layer_names)), np.nan)
    for i, r in enumerate(rows):
        if r[2] is not None:
            lgn[i] = r[2][0]
    val_steps = np.array([r[0] for r in rows if "val_loss" in r[1]], dtype=np.int64)
    val_loss = _f32([r[1]["val_loss"] for r in rows if "val_loss" in r[1]])
    val_metric = _f32([r[1]["val_metric"] for r in rows if "val_loss" in r[1]]
                      if all("val_metric" in r[1] for r in rows if "val_loss" in r[1]) else [])
    pred_rows = [r for r in rows if "pred_top_share" in r[1] or "pred_spread" in r[1]]
    pred_steps = np.array([r[0] for r in pred_rows], dtype=np.int64)
    pred_top_share = _f32([r[1]["pred_top_share"] for r in pred_rows if "pred_top_share" in r[1]])
    pred_spread = _f32([r[1]["pred_spread"] for r in pred_rows if "pred_spread" in r[1]])
    act_rows = [(r[0], r[3]) for r in rows if r[3] is not None]
    act_names: tuple[str, ...] = tuple(act_rows[0][1][1]) if act_rows else ()
    act_steps = np.array([s for s, _ in act_rows], dtype=np.int64)
    dead = np.array([a[0][0] for _, a in act_rows]).reshape(len(act_rows), len(act_names))
    sat = np.array([a[0][1] for _, a in act_rows]).reshape(len(act_rows), len(act_names))
    loss = dense("loss")
    grad = dense("grad_norm")
    bad = ~(np.isfinite(loss) & np.isfinite(grad))
    return Curve(
        name=spec.name, kind=spec.kind, onset_step=spec.onset, difficulty=spec.family, seed=spec.seed,
        total_steps=n, steps=np.arange(n, dtype=np.int64), loss=loss, grad_norm=grad, lr=dense("lr"),
        update_ratio=dense("update_ratio"), val_steps=val_steps, val_loss=val_loss, val_metric=val_metric,
        pred_steps=pred_steps, pred_top_share=pred_top_share, pred_spread=pred_spread,
        layer_names=layer_names, layer_grad_norms=_f32(lgn), act_steps=act_steps,
        act_layer_names=act_names, dead_frac=_f32(dead), saturation=_f32(sat),
        first_nonfinite_step=int(np.argmax(bad)) if bad.any() else -1, gaps=gaps,
    )
