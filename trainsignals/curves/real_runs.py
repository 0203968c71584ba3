"""Labeled curves from real training runs: small PyTorch models on CPU, faults injected at a known step.

The synthetic suite (:mod:`trainsignals.curves`) is only as honest as its generator. This module
trains real small networks and records what trainsignals' PyTorch adapter
(:class:`trainsignals.adapters.torch.TorchWatcher`) measures, so the detectors can be scored on
curves nobody designed.

**Families** (every one fits in a few milliseconds a step on one CPU thread):

* ``mlp`` — a ReLU MLP (2 or 3 hidden layers) on scikit-learn's 8x8 digits;
* ``cnn`` — two 3x3 convolutions, max-pooling and two linear layers (ReLU) on the same digits;
* ``deep`` — a deep MLP on the digits, Xavier-initialised: tanh with 6 to 10 hidden layers, or
  sigmoid with 6 (trained with AdamW: deeper sigmoid nets barely move in a few hundred steps);
* ``charlm`` — a character-level language model (an embedding of the last 8 to 16 characters,
  one or two hidden layers, a softmax over the characters) on the source of a few standard-library
  modules (``textwrap``, ``string``, ``fnmatch``, ``glob``, ``shlex``, ``tokenize``): text that ships
  with Python, nothing is downloaded.

The digits are split 75/25 (train/validation) per run; training batches of 16 to 64 are drawn
with replacement and, in most digit runs, augmented (a random shift of up to one pixel and a
little Gaussian noise), which keeps the training loss noisy and away from zero as in real
training. Optimizers: SGD, SGD with momentum 0.9 and AdamW; schedules: constant, cosine,
warmup + cosine, warmup + linear decay, step decay. The learning rate is set in the optimizer
before every step (the schedule times the fault's multiplier) and read back by the adapter.

**Signals** — everything the core understands, through the adapter's public API
(``TorchWatcher(model, optimizer, monitor, per_layer=..., update_ratio_every=1,
activations_every=10)``, ``update(loss=..., val_loss=...)``, ``close()``): per step the loss,
the global grad norm, the learning rate, the update ratio and the per-layer grad norms (per
module or per parameter tensor, drawn per run); the validation loss every 25 to 100 steps; the
fraction of dead ReLU units and of saturated sigmoid/tanh units every 10 steps. The Monitor the
watcher feeds has every detector switched off and only records (``recorder=``): the labels never
depend on the detectors.

**Faults**, injected at ``onset_step`` (30..70 % of the run unless said otherwise):

===================== ==========================================================================
kind                  injection
===================== ==========================================================================
divergence            learning rate multiplied up (x30..x300 for SGD, x50..x1000 for AdamW), at
                      once or along a geometric ramp of 10..60 steps
stall                 learning rate multiplied down (x1e-4..x1e-3), at once or over 5..30 steps,
                      at 20..45 % of the run (a decaying schedule, so the loss is still falling)
oscillation           learning rate raised to the edge of stability: at the onset a sweep
                      (x1.5 for SGD, x2 for AdamW, then x1.25 each try, up to 20 tries) trains
                      a copy of the run with each multiplier over the check's window and
                      keeps the first that makes the loss swing (the oscillation check below)
                      without diverging; one that makes it diverge ends the sweep and is used;
                      constant schedule
loss_spike            1..3 corrupted batches at 45..80 % of the run: random labels (``charlm``:
                      random characters in and out), or inputs scaled x4..x15
grad_explosion        ReLU families: the first or second layer's weights scaled up x20..x100,
                      or (digits) every later input scaled up x30..x100
vanishing_gradient    ``deep`` only: 3 or 4 consecutive middle layers' weights scaled down
                      x0.001..x0.005
dead_units            a ReLU layer's bias set to -20..-100 on 92..100 % of its units
silent_collapse       every later training label set to the majority class (the most frequent
                      digit or character), early in the run (4..15 %) while the loss is still
                      near chance, so the loss keeps falling
overfitting           from 20..45 % of the run, batches drawn from 16..48 training examples
                      only; the onset is the validation step of the lowest validation loss
                      at or after the last validation before that point (the checkpoint to
                      restore)
===================== ==========================================================================

Scaling a saturating (sigmoid/tanh) net's weights or inputs up saturates its units and makes the
gradients *smaller*, so gradient explosions are injected into the ReLU families only; vanishing
gradients need the deep saturating net, dead units a ReLU net. 30 % of the runs clip their
gradients (max norm 1, 2 or 5); the adapter then measures the norms before clipping
(``TorchWatcher.capture_grads``).

**Labels are checked.** Every run's label is verified by an automatic check on the recorded
signals (never on a detector's output); a run whose check fails is relabelled to its fallback
kind if that kind's check passes, or dropped; the manifest lists the dropped runs with their
checks. Learning-rate bumps are checked for a divergence first: a bump meant to make the loss
oscillate that made the run diverge is a divergence; a bump meant to make it diverge that
made it swing without diverging is an oscillation. The checks (:func:`check_label`); "level" is a median,
"smoothed" a centred running median of 9 steps, the "pre-onset level" the level of the 50
steps before the onset, ``W`` the bench's detection window of the kind
(:func:`trainsignals.kinds.default_window`):

* ``divergence``: within ``W`` steps of the onset the loss becomes non-finite, or its smoothed
  value climbs to 4x the pre-onset level (or to 2x and above the run's initial level: the run
  lost all its progress) and the level of the window's last 20 steps is still at least 2x the
  pre-onset level (no recovery: a transient jump is not a divergence);
* ``stall``: the log-loss fell by at least 0.05 per 100 steps before the onset (levels of the
  two 50..100-step blocks before it), and over the ``W`` steps after it falls at less than a
  tenth of that rate (levels of the first and last 75 steps) and rises by less than 25 %;
* ``oscillation``: the robust spread (1.4826 MAD) of the loss around its running median (21
  steps) over onset + 5 .. onset + ``W`` is at least twice that of the 100 steps before the
  onset, the loss makes no net progress (its level is not below the pre-onset level) and
  stays finite;
* ``loss_spike``: a loss within 3 steps of the onset is at least 2x the pre-onset level and 8
  robust noise units (spread around the running median) above it, and the smoothed loss is
  back within 1.5x of that level within 30 steps;
* ``grad_explosion``: a grad norm within 3 steps of the onset is at least 10x its level over
  the 50 steps before (or non-finite);
* ``vanishing_gradient``: some layer's grad norm level over onset + 10 .. onset + 60 is at
  least 2 decades below its pre-onset level, while another layer keeps at least a tenth of its
  own;
* ``dead_units``: an activation layer that was less than 50 % dead before the onset is at
  least 90 % dead in 3 consecutive samples within ``W`` steps;
* ``silent_collapse``: after the onset the smoothed loss never rises above 1.25x its value at
  the onset within 100 steps, falls to at most half of it within ``W`` steps, the grad norm
  level falls at least a decade, and the validation loss (on the true labels) rises at least
  25 % above its last value before the onset;
* ``overfitting``: at least 5 validations after the onset; they rise (Kendall's tau against
  their steps >= 0.5, the last three at least 10 % above the onset's) while the training loss
  level of the last 50 steps is at least 10 % below that around the onset;
* ``healthy``: finite everywhere; the loss level of the last 5 % is at most 0.7x that of the
  first 20 steps; the smoothed (51-step) loss never gives back more than 25 % of the progress
  made so far; no steady rise of the validation loss after its best (5 validations, Kendall's
  tau >= 0.5, 10 % up); no activation layer 90 % dead or 50 % saturated in 3 consecutive
  samples; the grad norm level of the last 10 % is at least 1/30 of that of steps 10..60; every
  layer's grad norm level (second half) is within 3 decades of the median layer's.

**Storage**: :func:`build` writes ``datasets/real`` in exactly the format of the synthetic suite
(:func:`trainsignals.curves.write_suite`: one zstd Arrow IPC file per kind plus
``manifest.json``), so ``trainsignals.curves.load_suite("real")`` loads it and ``trainsignals
bench --suite real`` scores it. The ``difficulty`` field holds the model family. The manifest
adds the command, the torch/Python/NumPy versions, the text corpus' SHA-256, every run's
configuration and check, and the dropped runs. A run is reproducible given the seed, the torch
version and the Python version (the text corpus comes from the standard library):
``torch.manual_seed``, ``torch.use_deterministic_algorithms(True)``, one thread, and the same
CPU kernels on every x86-64 machine. torch picks its kernels by the CPU's vector extensions
(AVX2, AVX-512, ...), and so do MKL (matrix products) and oneDNN (convolutions); their sums
round differently, training drifts apart in the last bits, and borderline label checks flip
(the suite committed before this was pinned, rebuilt on another machine, kept 262 runs instead
of 261: a run dropped before was kept with another label, and one more changed its label). :func:`build` therefore trains in worker processes started
with :data:`CPU_KERNELS` in their environment (torch's portable kernels, MKL's conditional
numerical reproducibility mode) and with oneDNN off (:func:`train_with_info` turns it off for
its run). To reproduce a run in your own process, set :data:`CPU_KERNELS` in the environment
before importing torch (not in a process that also uses ``torch.compile``: with
``ATEN_CPU_CAPABILITY=default`` inductor's generated C++ failed to compile here).

**Held-out suite**: ``build --heldout`` trains the families of :data:`HELDOUT_FAMILIES`
(:mod:`trainsignals.curves.families`: recurrent and transformer character LMs, deep ReLU/tanh MLPs,
tabular classification, MSE autoencoders and regressions) into ``datasets/real_heldout``, each
faulty run's label also checked against a counterfactual twin continued from the onset without
the fault; no detector threshold is ever chosen on that suite.

Command::

    python -m trainsignals.curves.real_runs build --seed 0 [--out DIR] [--jobs 2]
    python -m trainsignals.curves.real_runs build --heldout --seed 1000 --jobs 2 --out datasets/real_heldout

``import trainsignals`` never imports torch; this module imports it inside the functions that
train (and needs scikit-learn for the digits).
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import math
import platform
import time
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from trainsignals.curves import HEALTHY, Curve, write_suite

#: Environment that pins the CPU kernels of :func:`build`'s workers, so that a run gives the same
#: values on every x86-64 CPU: ``ATEN_CPU_CAPABILITY=default`` (torch's portable kernels rather
#: than those for the CPU's AVX2 or AVX-512) and ``MKL_CBWR=COMPATIBLE,STRICT`` (MKL's
#: conditional numerical reproducibility: the same code path on every CPU, results independent
#: of memory alignment). Both are read when torch loads.
CPU_KERNELS: dict[str, str] = {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE,STRICT"}

__all__ = [
    "FAMILIES",
    "FAULT_FAMILIES",
    "HELDOUT_FAMILIES",
    "FAULT_KINDS",
    "CheckResult",
    "RunSpec",
    "build",
    "check_label",
    "default_directory",
    "label_run",
    "plan_suite",
    "run",
    "train",
    "train_with_info",
]

FAMILIES: tuple[str, ...] = ("mlp", "cnn", "deep", "charlm")
"""The model families."""

HELDOUT_FAMILIES: tuple[str, ...] = ("rnnlm", "tflm", "deepmlp", "tabular", "mse")
"""The held-out suite's model families (:mod:`trainsignals.curves.families`; never in the
committed ``datasets/real``): no detector threshold is chosen on their runs."""

FAULT_KINDS: tuple[str, ...] = (
    "divergence", "stall", "oscillation", "loss_spike", "grad_explosion",
    "vanishing_gradient", "dead_units", "silent_collapse", "overfitting",
)
"""The failure kinds injected, in :class:`trainsignals.Kind` order."""

FAULT_FAMILIES: dict[str, tuple[str, ...]] = {
    "divergence": FAMILIES,
    "stall": FAMILIES,
    "oscillation": FAMILIES,
    "loss_spike": FAMILIES,
    "grad_explosion": ("mlp", "cnn", "charlm"),
    "vanishing_gradient": ("deep",),
    "dead_units": ("mlp", "cnn", "charlm"),
    "silent_collapse": FAMILIES,
    "overfitting": FAMILIES,
}
"""Which families each fault is injected into: vanishing gradients need a deep saturating net,
dead units a ReLU net; scaling a saturating net's weights or inputs up saturates its units and
makes the gradients smaller, not larger, so gradient explosions are injected into ReLU nets."""

#: Kinds a run is relabelled to, in order, when the check of its intended kind fails.
FALLBACKS: dict[str, tuple[str, ...]] = {
    "divergence": ("oscillation",),
    "oscillation": ("divergence",),
}

#: Kinds checked *before* the intended one: a learning-rate bump that blew the run up (the loss
#: lost all its progress or climbed 4x, and did not come back) is a divergence, whatever it was
#: meant to do.
PRECEDENCE: dict[str, tuple[str, ...]] = {"oscillation": ("divergence",)}

FORMAT_NOTE = "trainsignals real runs: difficulty = model family"
_CORPUS_MODULES = ("textwrap", "string", "fnmatch", "glob", "shlex", "tokenize")
_CORPUS_CHARS = 60_000
_MIN_STEPS, _MAX_STEPS = 600, 2000


def default_directory(heldout: bool = False) -> Path:
    """Where the committed real-run suite lives: ``<repository>/datasets/real``
    (``datasets/real_heldout`` for the held-out suite).
    """
    return Path(__file__).resolve().parents[2] / "datasets" / ("real_heldout" if heldout else "real")


# ------------------------------------------------------------------------------------ the plan


@dataclass(frozen=True)
class RunSpec:
    """Everything that defines one run: model, data, optimizer, schedule and the fault.

    Attributes:
        name: ``"{kind}-{family}-{seed}"``.
        kind: The intended label: ``"healthy"`` or a fault kind.
        family: One of :data:`FAMILIES`.
        seed: Seed of the run (torch and the batch sampler).
        steps: Optimizer steps.
        optimizer: ``"sgd"``, ``"sgdm"`` (momentum 0.9) or ``"adamw"``.
        lr: Peak learning rate.
        weight_decay: Weight decay.
        schedule: ``"constant"``, ``"cosine"``, ``"warmup_cosine"``, ``"warmup_linear"`` or ``"step"``.
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
        fault: The fault's parameters (see the module docstring).
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


def _rng(*parts: Any) -> np.random.Generator:
    entropy = [p if isinstance(p, int) else zlib.crc32(str(p).encode()) for p in parts]
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(entropy)))


def _logu(rng: np.random.Generator, lo: float, hi: float) -> float:
    return float(math.exp(rng.uniform(math.log(lo), math.log(hi))))


def _pick(rng: np.random.Generator, options: Sequence[Any], p: Sequence[float] | None = None) -> Any:
    i = int(rng.choice(len(options), p=None if p is None else np.asarray(p) / np.sum(p)))
    return options[i]


#: Healthy peak learning rates per (family, optimizer).
_LR: dict[tuple[str, str], tuple[float, float]] = {
    ("mlp", "sgd"): (0.03, 0.2), ("mlp", "sgdm"): (0.005, 0.03), ("mlp", "adamw"): (5e-4, 3e-3),
    ("cnn", "sgd"): (0.03, 0.15), ("cnn", "sgdm"): (0.004, 0.02), ("cnn", "adamw"): (5e-4, 3e-3),
    ("deep", "sgd"): (0.05, 0.2), ("deep", "sgdm"): (0.01, 0.03), ("deep", "adamw"): (1e-3, 3e-3),
    ("charlm", "sgd"): (0.1, 0.5), ("charlm", "sgdm"): (0.02, 0.08), ("charlm", "adamw"): (1e-3, 5e-3),
}


def _draw_spec(kind: str, family: str, seed: int, index: int) -> RunSpec:
    """Draw one run's configuration (and its fault's) from ``(seed, kind, family, index)``."""
    rng = _rng(seed, kind, family, index)
    run_seed = int(rng.integers(0, 2**31 - 1))
    steps = int(round(_logu(rng, _MIN_STEPS, _MAX_STEPS)))
    optimizer = _pick(rng, ("sgd", "sgdm", "adamw"))
    lr = _logu(rng, *_LR[(family, optimizer)])
    deep_act = _pick(rng, ("sigmoid", "tanh")) if family == "deep" else "relu"
    if deep_act == "sigmoid":    # deep sigmoid nets train only with Adam in a few hundred steps
        optimizer = "adamw"
        lr = _logu(rng, 4e-3, 1e-2)
    if optimizer == "adamw":
        weight_decay = _logu(rng, 1e-4, 3e-2)
    else:
        weight_decay = 0.0 if rng.random() < 0.5 else _logu(rng, 1e-5, 5e-4)
    schedule = _pick(rng, ("constant", "cosine", "warmup_cosine", "warmup_linear", "step"), (2, 2, 3, 2, 2))
    warmup = int(rng.uniform(0.02, 0.1) * steps) if schedule.startswith("warmup") else 0
    batch_size = int(_pick(rng, (16, 32, 64)))
    if family == "mlp":
        width = int(_pick(rng, (32, 64, 96)))
        arch: dict[str, Any] = {"widths": [width] * int(_pick(rng, (2, 3))), "activation": "relu"}
    elif family == "cnn":
        c1 = int(_pick(rng, (6, 8, 12)))
        arch = {"channels": [c1, 2 * c1], "hidden": int(_pick(rng, (32, 48))), "activation": "relu"}
    elif family == "deep":
        depth = 6 if deep_act == "sigmoid" else int(_pick(rng, (6, 8, 10)))
        arch = {"widths": [int(_pick(rng, (32, 48)))] * depth, "activation": deep_act}
    else:
        arch = {"context": int(_pick(rng, (8, 12, 16))), "embed": int(_pick(rng, (8, 16))),
                "widths": [int(_pick(rng, (64, 128)))] * int(_pick(rng, (1, 2))),
                "activation": "relu" if kind == "dead_units" else _pick(rng, ("relu", "tanh"), (3, 1))}
    if family == "charlm":
        augment = (0.0, 0.0)
    else:
        augment = (float(_pick(rng, (0.0, 0.5, 0.8), (1, 2, 2))), float(_pick(rng, (0.0, 0.05, 0.1))))
    val_every = int(_pick(rng, (25, 50, 100), (2, 2, 1)))
    if kind == "overfitting":
        val_every = min(val_every, 50)
    per_layer = _pick(rng, ("module", "parameter"), (3, 2))
    clip = float(_pick(rng, (1.0, 2.0, 5.0))) if rng.random() < 0.3 else 0.0
    onset = -1
    fault: dict[str, Any] = {}
    frng = _rng(seed, kind, family, index, "fault")
    if kind != HEALTHY:
        onset = int(frng.uniform(0.3, 0.7) * steps)
    if kind == "divergence":
        lo, hi = {"sgd": (30.0, 300.0), "sgdm": (30.0, 300.0), "adamw": (50.0, 1000.0)}[optimizer]
        fault = {"lr_mult": _logu(frng, lo, hi), "ramp": int(_pick(frng, (0, 0, 10, 30, 60)))}
    elif kind == "stall":
        onset = int(frng.uniform(0.2, 0.45) * steps)
        fault = {"lr_mult": _logu(frng, 1e-4, 1e-3), "ramp": int(_pick(frng, (0, 0, 5, 30)))}
        if schedule == "constant" or schedule == "step":
            schedule = "warmup_cosine"
            warmup = int(0.03 * steps)
    elif kind == "oscillation":
        # the multiplier is found at the onset: the first of start * factor**k that makes the loss swing
        fault = {"lr_mult": "edge", "start": 1.5 if optimizer != "adamw" else 2.0, "factor": 1.25, "tries": 20}
        if schedule != "constant":
            schedule, warmup = "constant", 0
    elif kind == "loss_spike":
        onset = int(frng.uniform(0.45, 0.8) * steps)
        mode = _pick(frng, ("labels", "inputs")) if family != "charlm" else "labels"
        fault = {"n_bad": int(_pick(frng, (1, 1, 2, 3))), "mode": mode, "scale": _logu(frng, 4.0, 15.0)}
    elif kind == "grad_explosion":
        mode = _pick(frng, ("weights", "inputs")) if family != "charlm" else "weights"
        layer = 0 if family == "charlm" else int(frng.integers(0, 2))
        fault = {"mode": mode, "layer": layer,
                 "scale": _logu(frng, 20.0, 100.0) if mode == "weights" else _logu(frng, 30.0, 100.0)}
    elif kind == "vanishing_gradient":
        depth = len(arch["widths"])
        k = int(frng.integers(3, min(5, depth - 1)))
        start = int(frng.integers(1, depth - k))
        fault = {"layers": list(range(start, start + k)), "scale": _logu(frng, 1e-3, 5e-3)}
    elif kind == "dead_units":
        n_hidden = _n_relu_layers(family, arch)
        fault = {"layer": int(frng.integers(0, n_hidden)), "fraction": float(frng.uniform(0.92, 1.0)),
                 "bias": -_logu(frng, 20.0, 100.0)}
    elif kind == "silent_collapse":
        onset = int(frng.uniform(0.04, 0.15) * steps)
        if schedule.startswith("warmup"):
            warmup = max(warmup, onset + 1)
        fault = {}
    elif kind == "overfitting":
        onset = int(frng.uniform(0.2, 0.45) * steps)
        fault = {"n_examples": int(_pick(frng, (16, 24, 32, 48)))}
        augment = (0.0, 0.0)
    return RunSpec(
        name=f"{kind}-{family}-{index}", kind=kind, family=family, seed=run_seed, steps=steps,
        optimizer=optimizer, lr=lr, weight_decay=weight_decay, schedule=schedule, warmup=warmup,
        batch_size=batch_size, arch=arch, augment=augment, val_every=val_every,
        val_at_zero=bool(rng.random() < 0.3), per_layer=per_layer, clip=clip, onset=onset, fault=fault,
    )


def _n_weight_layers(family: str, arch: Mapping[str, Any]) -> int:
    if family == "cnn":
        return 4
    if family == "charlm":
        return len(arch["widths"]) + 2      # embedding, hidden..., output
    return len(arch["widths"]) + 1


def _n_relu_layers(family: str, arch: Mapping[str, Any]) -> int:
    return 3 if family == "cnn" else len(arch["widths"])


#: Kinds whose injection produces the intended behaviour less often get more runs planned
#: (``per_kind`` times this), so that enough pass their check.
OVERSAMPLE: dict[str, float] = {"oscillation": 2.5}


def plan_suite(seed: int = 0, per_kind: int = 16, n_healthy: int = 128) -> list[RunSpec]:
    """The runs of the suite: ``per_kind`` runs of each fault kind and ``n_healthy`` healthy runs.

    Kinds in :data:`OVERSAMPLE` get proportionally more. Families rotate within each kind
    (over :data:`FAULT_FAMILIES`), so every kind is spread over the families it applies to.

    Args:
        seed: Suite seed (non-negative).
        per_kind: Runs planned per fault kind (before the checks drop any).
        n_healthy: Healthy runs planned.

    Returns:
        The specs, fault kinds in :data:`FAULT_KINDS` order, then the healthy runs.

    Example:
        >>> specs = plan_suite(0, per_kind=4, n_healthy=4)
        >>> len(specs), specs[0].name, specs[-1].kind
        (46, 'divergence-mlp-0', 'healthy')
    """
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    for name, v in (("per_kind", per_kind), ("n_healthy", n_healthy)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
            raise ValueError(f"{name} must be a non-negative integer, got {v!r}")
    out: list[RunSpec] = []
    plan = [(k, int(round(per_kind * OVERSAMPLE.get(k, 1.0)))) for k in FAULT_KINDS] + [(HEALTHY, n_healthy)]
    for kind, count in plan:
        fams = FAULT_FAMILIES.get(kind, FAMILIES)
        for i in range(count):
            out.append(_draw_spec(kind, fams[i % len(fams)], int(seed), i))
    return out


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


def _digits() -> tuple[np.ndarray, np.ndarray]:
    if "digits" not in _CACHE:
        from sklearn.datasets import load_digits

        X, y = load_digits(return_X_y=True)
        _CACHE["digits"] = (np.asarray(X, dtype=np.float32) / 16.0, np.asarray(y, dtype=np.int64))
    return _CACHE["digits"]  # type: ignore[no-any-return]


class _Data:
    """Train/validation tensors and a seeded batch sampler for one run."""

    def __init__(self, spec: RunSpec, torch: Any) -> None:
        self.torch = torch
        self.spec = spec
        rng = np.random.default_rng(spec.seed)
        self.gen = torch.Generator().manual_seed(spec.seed)
        if spec.family == "charlm":
            text = corpus()
            vocab = sorted(set(text))
            self.n_classes = len(vocab)
            lut = np.zeros(128, dtype=np.int64)
            lut[[ord(ch) for ch in vocab]] = np.arange(len(vocab))
            ids = lut[np.frombuffer(text.encode("ascii"), dtype=np.uint8)]
            ctx = int(spec.arch["context"])
            split = int(0.9 * len(ids))
            self.ids = torch.tensor(ids)
            self.ctx = ctx
            self.train_pos = torch.arange(ctx, split)
            val_pos = np.sort(rng.choice(np.arange(split + ctx, len(ids)), size=512, replace=False))
            self.x_val = self._windows(torch.tensor(val_pos))
            self.y_val = self.ids[torch.tensor(val_pos)]
            self.majority = int(np.bincount(ids[:split]).argmax())
        else:
            X, y = _digits()
            perm = rng.permutation(len(X))
            n_train = int(0.75 * len(X))
            tr, va = perm[:n_train], perm[n_train:]
            mean = X[tr].mean(axis=0)
            sd = X[tr].std(axis=0)
            sd[sd == 0] = 1.0
            Xs = (X - mean) / sd
            img = Xs.reshape(-1, 8, 8)
            # the 9 one-pixel shifts of every image (zero padding), for augmentation
            pad = np.pad(img, ((0, 0), (1, 1), (1, 1)))
            shifts = np.stack([pad[:, 1 + dy:9 + dy, 1 + dx:9 + dx] for dy in (-1, 0, 1) for dx in (-1, 0, 1)])
            self.shifted = torch.tensor(shifts[:, tr].reshape(9, len(tr), 64))
            self.x_train = self.shifted[4]
            self.y_train = torch.tensor(y[tr])
            self.x_val = torch.tensor(Xs[va])
            self.y_val = torch.tensor(y[va])
            self.n_classes = 10
            self.majority = int(np.bincount(y[tr]).argmax())
            if spec.family == "cnn":
                self.x_val = self.x_val.reshape(-1, 1, 8, 8)
        self.n_train = len(self.train_pos) if spec.family == "charlm" else len(self.y_train)
        self.subset: Any = None

    def _windows(self, pos: Any) -> Any:
        offs = self.torch.arange(-self.ctx, 0)
        return self.ids[pos[:, None] + offs[None, :]]

    def restrict(self, n: int) -> None:
        """From now on, batches come from ``n`` fixed training examples."""
        self.subset = self.torch.randperm(self.n_train, generator=self.gen)[:n]

    def batch(self) -> tuple[Any, Any]:
        torch = self.torch
        b = self.spec.batch_size
        if self.subset is not None:
            idx = self.subset[torch.randint(0, len(self.subset), (b,), generator=self.gen)]
        else:
            idx = torch.randint(0, self.n_train, (b,), generator=self.gen)
        if self.spec.family == "charlm":
            pos = self.train_pos[idx]
            return self._windows(pos), self.ids[pos]
        p_shift, noise = self.spec.augment
        x = self.x_train[idx]
        if p_shift > 0:
            which = torch.randint(0, 9, (b,), generator=self.gen)
            keep = torch.rand(b, generator=self.gen) >= p_shift
            which = torch.where(keep, torch.full_like(which, 4), which)
            x = self.shifted[which, idx]
        if noise > 0:
            x = x + noise * torch.randn(x.shape, generator=self.gen)
        y = self.y_train[idx]
        if self.spec.family == "cnn":
            x = x.reshape(-1, 1, 8, 8)
        return x, y


# ------------------------------------------------------------------------------------ models


def _model(spec: RunSpec, n_classes: int, torch: Any) -> Any:
    from collections import OrderedDict

    nn = torch.nn
    acts = {"relu": nn.ReLU, "tanh": nn.Tanh, "sigmoid": nn.Sigmoid}
    arch = spec.arch
    layers: OrderedDict[str, Any] = OrderedDict()
    if spec.family == "cnn":
        c1, c2 = arch["channels"]
        layers["conv1"] = nn.Conv2d(1, c1, 3, padding=1)
        layers["relu1"] = nn.ReLU()
        layers["conv2"] = nn.Conv2d(c1, c2, 3, padding=1)
        layers["relu2"] = nn.ReLU()
        layers["pool"] = nn.MaxPool2d(2)
        layers["flatten"] = nn.Flatten()
        layers["fc1"] = nn.Linear(c2 * 16, arch["hidden"])
        layers["relu3"] = nn.ReLU()
        layers["out"] = nn.Linear(arch["hidden"], n_classes)
        return nn.Sequential(layers)
    act = acts[arch["activation"]]
    prev = 64
    if spec.family == "charlm":
        layers["embed"] = nn.Embedding(n_classes, arch["embed"])
        layers["flatten"] = nn.Flatten()
        prev = arch["embed"] * arch["context"]
    for i, w in enumerate(arch["widths"]):
        layers[f"fc{i + 1}"] = nn.Linear(prev, w)
        layers[f"{arch['activation']}{i + 1}"] = act()
        prev = w
    layers["out"] = nn.Linear(prev, n_classes)
    model = nn.Sequential(layers)
    if spec.family == "deep":
        for m in model.modules():
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight, gain=1.0)
                nn.init.zeros_(m.bias)
    return model


def _weight_layers(model: Any, torch: Any) -> list[Any]:
    """The modules with a weight, in order (embedding, linear and convolution layers)."""
    nn = torch.nn
    return [m for m in model if isinstance(m, (nn.Linear, nn.Conv2d, nn.Embedding))]


def _relu_inputs(model: Any, torch: Any) -> list[Any]:
    """The layers whose output goes into a ReLU (their bias can kill the ReLU's units)."""
    mods = list(model)
    return [mods[i - 1] for i, m in enumerate(mods) if isinstance(m, torch.nn.ReLU)]


def _optimizer(spec: RunSpec, model: Any, torch: Any) -> Any:
    params = model.parameters()
    if spec.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=spec.lr, weight_decay=spec.weight_decay)
    momentum = 0.9 if spec.optimizer == "sgdm" else 0.0
    return torch.optim.SGD(params, lr=spec.lr, momentum=momentum, weight_decay=spec.weight_decay)


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


# ------------------------------------------------------------------------------------ training


class _Collector:
    """A :class:`trainsignals.Recorder` that keeps every step the Monitor sees."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, dict[str, float], Any, Any]] = []

    def record(self, *, step: int, signals: Mapping[str, float], layer_grad_norms: Any,
               activations: Any, events: Sequence[Any]) -> None:
        self.rows.append((step, dict(signals), layer_grad_norms, activations))

    def record_batch(self, **kwargs: Any) -> None:  # pragma: no cover - the generator streams
        raise NotImplementedError("the real-run generator only streams updates")


def _inject_weights(spec: RunSpec, model: Any, torch: Any) -> None:
    """The faults that change the weights, applied once, just before the onset step."""
    f = spec.fault
    with torch.no_grad():
        if spec.kind == "grad_explosion" and f["mode"] == "weights":
            _weight_layers(model, torch)[f["layer"]].weight.mul_(f["scale"])
        elif spec.kind == "vanishing_gradient":
            layers = _weight_layers(model, torch)
            for i in f["layers"]:
                layers[i].weight.mul_(f["scale"])
        elif spec.kind == "dead_units":
            layer = _relu_inputs(model, torch)[f["layer"]]
            n = layer.bias.shape[0]
            k = max(1, int(round(f["fraction"] * n)))
            idx = torch.randperm(n, generator=torch.Generator().manual_seed(spec.seed))[:k]
            layer.bias[idx] = f["bias"]


def _corrupt(spec: RunSpec, data: _Data, x: Any, y: Any, t: int, torch: Any) -> tuple[Any, Any]:
    """The faults that change a batch at step ``t``."""
    f = spec.fault
    k = spec.kind
    if t < spec.onset or spec.onset < 0:
        return x, y
    if k == "loss_spike" and t < spec.onset + f["n_bad"]:
        if f["mode"] == "labels":
            y = torch.randint(0, data.n_classes, y.shape, generator=data.gen)
            if spec.family == "charlm":
                x = torch.randint(0, data.n_classes, x.shape, generator=data.gen)
        else:
            x = x * f["scale"]
    elif k == "grad_explosion" and f["mode"] == "inputs":
        x = x * f["scale"]
    elif k == "silent_collapse":
        y = torch.full_like(y, data.majority)
    return x, y


def train(spec: RunSpec) -> Curve:
    """Train one run as ``spec`` says and return what the adapter recorded, labeled as intended.

    The label (``spec.kind``, ``spec.onset``) is not checked here: see :func:`label_run`.
    Deterministic given ``spec``, the torch version, the Python version and the CPU kernels
    (:data:`CPU_KERNELS`: :func:`build` pins them; in your own process, set them in the
    environment before importing torch to get the suite's values on any x86-64 CPU).
    """
    return train_with_info(spec)[0]


def train_with_info(spec: RunSpec) -> tuple[Curve, dict[str, Any]]:
    """:func:`train`, and what was decided during the run (the edge-of-stability multiplier)."""
    import torch

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    was = torch.backends.mkldnn.enabled
    torch.backends.mkldnn.enabled = False  # type: ignore[assignment]  # oneDNN picks its code by the CPU (see CPU_KERNELS)
    try:
        return _train(spec, torch)
    finally:
        torch.backends.mkldnn.enabled = was


def _train(spec: RunSpec, torch: Any) -> tuple[Curve, dict[str, Any]]:
    if spec.family in HELDOUT_FAMILIES:
        from trainsignals.curves import families

        return families.train(spec, torch)
    import trainsignals as ts
    from trainsignals.adapters.torch import TorchWatcher

    torch.manual_seed(spec.seed)
    data = _Data(spec, torch)
    model = _model(spec, data.n_classes, torch)
    opt = _optimizer(spec, model, torch)
    collector = _Collector()
    quiet: dict[str, Any] = {name: False for name in ts.Monitor().detectors}   # record only: no detector runs
    monitor = ts.Monitor(total_steps=spec.steps, recorder=collector, **quiet)
    watcher = TorchWatcher(model, opt, monitor, per_layer=spec.per_layer,   # type: ignore[arg-type]
                           update_ratio_every=1, activations_every=10)
    loss_fn = torch.nn.functional.cross_entropy
    info: dict[str, Any] = {}
    mult: float | None = None
    try:
        for t in range(spec.steps):
            if t == spec.onset and spec.fault.get("lr_mult") == "edge":
                history = [r[1].get("loss", math.nan) for r in collector.rows]
                mult, info["edge_of_stability"] = _edge_of_stability(spec, model, opt, data, history, torch)
                info["lr_mult"] = mult
            lr = spec.lr * schedule_factor(spec, t) * fault_lr_factor(spec, t, mult)
            for group in opt.param_groups:
                group["lr"] = float(np.float32(lr))
            if t == spec.onset:
                _inject_weights(spec, model, torch)
                if spec.kind == "overfitting":
                    data.restrict(int(spec.fault["n_examples"]))
            x, y = data.batch()
            x, y = _corrupt(spec, data, x, y, t, torch)
            loss = loss_fn(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if spec.clip > 0:
                watcher.capture_grads()     # the norms before clipping
                torch.nn.utils.clip_grad_norm_(model.parameters(), spec.clip)
            opt.step()
            val = None
            if (t % spec.val_every == 0 and t > 0) or (t == 0 and spec.val_at_zero):
                model.eval()
                with torch.no_grad():
                    val = loss_fn(model(data.x_val), data.y_val)
                model.train()
            watcher.update(loss=loss.detach(), val_loss=val)
    finally:
        watcher.close()
    return _to_curve(spec, collector.rows, watcher), info


def _probe(spec: RunSpec, model: Any, opt: Any, data: _Data, t0: int, mult: float, n_steps: int,
           torch: Any) -> list[float]:
    """The training losses of ``n_steps`` steps from ``t0`` with the learning rate times ``mult``,
    trained on a copy of the model and optimizer (the run itself, the batch sampler and the
    global RNG are left as they were).
    """
    rng_state = torch.get_rng_state()
    gen_state = data.gen.get_state()
    probe = _model(spec, data.n_classes, torch)       # a fresh module: no adapter hooks on it
    probe.load_state_dict(model.state_dict())
    popt = _optimizer(spec, probe, torch)
    popt.load_state_dict(copy.deepcopy(opt.state_dict()))   # load_state_dict may share the tensors
    out: list[float] = []
    try:
        for t in range(t0, t0 + n_steps):
            for group in popt.param_groups:
                group["lr"] = float(np.float32(spec.lr * schedule_factor(spec, t) * mult))
            x, y = data.batch()
            loss = torch.nn.functional.cross_entropy(probe(x), y)
            popt.zero_grad(set_to_none=True)
            loss.backward()
            if spec.clip > 0:
                torch.nn.utils.clip_grad_norm_(probe.parameters(), spec.clip)
            popt.step()
            out.append(float(loss.detach()))
            if not math.isfinite(out[-1]):
                break
    finally:
        data.gen.set_state(gen_state)
        torch.set_rng_state(rng_state)
    return out


def _edge_of_stability(spec: RunSpec, model: Any, opt: Any, data: _Data, history: list[float],
                       torch: Any) -> tuple[float, list[list[Any]]]:
    """The learning-rate multiplier at the edge of stability, found by a sweep at the onset.

    Multipliers ``start * factor**k`` (``spec.fault``) are tried in turn on a copy of the run,
    each for the checks' window; the first whose losses pass the oscillation check (and not
    the divergence check) is the edge. A multiplier whose losses pass the divergence check is
    past the edge: the sweep stops and uses it (the run is then a divergence). Without either,
    the largest multiplier tried is used.

    Returns:
        ``(multiplier, [[multiplier tried, verdict], ...])``.
    """
    f = spec.fault
    t0 = spec.onset
    n = spec.steps
    w = min(_window("oscillation", n), n - 1 - t0)
    mult = float(f["start"])
    tried: list[list[Any]] = []
    for _ in range(int(f["tries"])):
        losses = _probe(spec, model, opt, data, t0, mult, w + 1, torch)
        series = np.full(n, np.nan)
        series[:t0] = history
        series[t0:t0 + len(losses)] = losses
        if len(losses) < w + 1:
            series[t0 + len(losses):] = math.inf
        if _divergence_verdict(series, t0).passed:
            tried.append([mult, "diverges"])
            return mult, tried
        osc = _oscillation_verdict(series, t0)
        if osc.passed:
            tried.append([mult, "oscillation"])
            return mult, tried
        tried.append([mult, "stable"])
        mult *= float(f["factor"])
    return mult / float(f["factor"]), tried


def _f32(a: Any) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):
        return np.asarray(a, dtype=np.float64).astype(np.float32).astype(np.float64)


def _to_curve(spec: RunSpec, rows: list[tuple[int, dict[str, float], Any, Any]], watcher: Any) -> Curve:
    n = spec.steps
    if len(rows) != n or [r[0] for r in rows] != list(range(n)):
        raise RuntimeError(f"{spec.name}: recorded {len(rows)} steps, expected {n}")

    def dense(key: str) -> np.ndarray:
        return _f32([r[1].get(key, math.nan) for r in rows])

    layer_names = tuple(watcher.layer_names)
    lgn = np.full((n, len(layer_names)), np.nan)
    for i, r in enumerate(rows):
        if r[2] is not None:
            lgn[i] = r[2][0]
    val_steps = np.array([r[0] for r in rows if "val_loss" in r[1]], dtype=np.int64)
    val_loss = _f32([r[1]["val_loss"] for r in rows if "val_loss" in r[1]])
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
        update_ratio=dense("update_ratio"), val_steps=val_steps, val_loss=val_loss,
        layer_names=layer_names, layer_grad_norms=_f32(lgn), act_steps=act_steps,
        act_layer_names=act_names, dead_frac=_f32(dead), saturation=_f32(sat),
        first_nonfinite_step=int(np.argmax(bad)) if bad.any() else -1,
    )


# ------------------------------------------------------------------------------------ the checks


@dataclass(frozen=True)
class CheckResult:
    """The verdict of a label check.

    Attributes:
        kind: The kind checked.
        passed: Whether the recorded signals show that kind's behaviour.
        reason: One line: the measured values against the check's thresholds.
    """

    kind: str
    passed: bool
    reason: str


def _nanmedian(x: np.ndarray) -> float:
    x = np.asarray(x, dtype=np.float64)
    x = x[np.isfinite(x)]
    return float(np.median(x)) if x.size else math.nan


def _running_median(x: np.ndarray, width: int) -> np.ndarray:
    """Centred running median (window ``width``, odd), NaN-aware, shrinking at the ends."""
    x = np.asarray(x, dtype=np.float64)
    h = width // 2
    pad = np.pad(x, h, mode="constant", constant_values=np.nan)
    win = np.lib.stride_tricks.sliding_window_view(pad, width)
    with np.errstate(all="ignore"):
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            return np.asarray(np.nanmedian(win, axis=1))


def _robust_sd(x: np.ndarray) -> float:
    x = np.asarray(x, dtype=np.float64)
    x = x[np.isfinite(x)]
    if not x.size:
        return math.nan
    return float(1.4826 * np.median(np.abs(x - np.median(x))))


def _window(kind: str, n: int) -> int:
    from trainsignals.kinds import default_window

    return default_window(kind, n)


def _log(x: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.log(np.asarray(x, dtype=np.float64))


def _kendall_tau(y: np.ndarray) -> float:
    y = np.asarray(y, dtype=np.float64)
    n = len(y)
    if n < 2:
        return math.nan
    s = 0.0
    for i in range(n - 1):
        s += float(np.sign(y[i + 1:] - y[i]).sum())
    return 2.0 * s / (n * (n - 1))


def _consecutive(mask: np.ndarray, k: int) -> int:
    """First index ending a run of ``k`` True values, or -1."""
    run = 0
    for i, m in enumerate(mask):
        run = run + 1 if m else 0
        if run >= k:
            return i
    return -1


def _pre_level(x: np.ndarray, onset: int, back: int = 50) -> float:
    return _nanmedian(x[max(0, onset - back):onset])


def _check_divergence(c: Curve, onset: int) -> CheckResult:
    return _divergence_verdict(c.loss, onset)


def _divergence_verdict(loss: np.ndarray, onset: int) -> CheckResult:
    n = len(loss)
    hi = min(n, onset + _window("divergence", n) + 1)
    pre = _pre_level(loss, onset)
    start = _nanmedian(loss[:20])
    seg = loss[onset:hi]
    if (~np.isfinite(seg)).any():
        return CheckResult("divergence", True, f"non-finite loss at step {onset + int(np.argmax(~np.isfinite(seg)))}")
    sm = _running_median(loss, 9)[onset:hi]
    peak = float(np.nanmax(sm)) if sm.size else math.nan
    end = _nanmedian(loss[max(onset, hi - 20):hi])
    climbed = peak >= 4.0 * pre or (peak >= 2.0 * pre and peak > start)
    ok = bool(climbed and end >= 2.0 * pre)
    return CheckResult("divergence", ok, f"smoothed loss peaks at {peak / pre:.3g}x the pre-onset level {pre:.4g} and "
                                          f"{peak / start:.3g}x the run's initial level (needs >= 4x, or >= 2x and above "
                                          f"the initial level, or a non-finite loss) and ends the window at "
                                          f"{end / pre:.3g}x (needs >= 2x: no recovery)")


def _check_stall(c: Curve, onset: int) -> CheckResult:
    n = c.total_steps
    w = min(_window("stall", n), n - 1 - onset)
    if onset < 100 or w < 150:
        return CheckResult("stall", False, "fewer than 100 steps before or 150 after the onset")
    lg = _log(c.loss)
    if (~np.isfinite(lg[onset - 100:])).any():
        return CheckResult("stall", False, "non-finite loss")
    b = min(100, onset // 2)
    rate_pre = (_nanmedian(lg[onset - 2 * b:onset - b]) - _nanmedian(lg[onset - b:onset])) / b
    first = _nanmedian(lg[onset:onset + 75])
    last = _nanmedian(lg[onset + w - 75:onset + w + 1])
    rate_post = (first - last) / (w - 75)
    rel = rate_post / rate_pre if rate_pre > 0 else math.inf
    ok = rate_pre >= 0.05 / 100 and rel < 0.1 and last - first < math.log(1.25)
    return CheckResult("stall", ok, f"log-loss fell {100 * rate_pre:.3g} per 100 steps before the onset (needs >= 0.05), "
                                    f"then at {rel:.3g}x that rate (needs < 0.1), changing by {last - first:+.3f} "
                                    f"(needs < +0.22)")


def _oscillation_stats(loss: np.ndarray, onset: int, w: int) -> tuple[float, float, float, bool]:
    """``(swing ratio, level after, level before, finite)`` of the oscillation check."""
    seg = loss[onset:onset + w + 1]
    finite = bool(np.isfinite(seg).all())
    with np.errstate(invalid="ignore"):
        resid = loss - _running_median(loss, 21)
    sd_pre = _robust_sd(resid[onset - 100:onset])
    sd_post = _robust_sd(resid[onset + 5:onset + w + 1])
    pre = _pre_level(loss, onset)
    post = _nanmedian(loss[onset + 5:onset + w + 1])
    ratio = sd_post / sd_pre if sd_pre > 0 else math.inf
    return ratio, post, pre, finite


def _check_oscillation(c: Curve, onset: int) -> CheckResult:
    return _oscillation_verdict(c.loss, onset)


def _oscillation_verdict(loss: np.ndarray, onset: int) -> CheckResult:
    n = len(loss)
    w = min(_window("oscillation", n), n - 1 - onset)
    if onset < 100 or w < 60:
        return CheckResult("oscillation", False, "fewer than 100 steps before or 60 after the onset")
    ratio, post, pre, finite = _oscillation_stats(loss, onset, w)
    if not finite:
        return CheckResult("oscillation", False, "non-finite loss after the onset")
    ok = ratio >= 2.0 and post >= pre
    return CheckResult("oscillation", ok, f"the loss swings {ratio:.3g}x as wide as before the onset (needs >= 2), "
                                          f"level {post:.4g} vs {pre:.4g} before (needs no progress)")


def _check_loss_spike(c: Curve, onset: int) -> CheckResult:
    n = c.total_steps
    if onset < 50 or n - onset < 60:
        return CheckResult("loss_spike", False, "not enough steps around the onset")
    if (~np.isfinite(c.loss[onset:])).any():
        return CheckResult("loss_spike", False, "non-finite loss after the onset")
    pre = _pre_level(c.loss, onset)
    sd = _robust_sd((c.loss - _running_median(c.loss, 21))[onset - 50:onset])
    peak = float(np.max(c.loss[onset:onset + 3]))
    back = float(np.min(_running_median(c.loss, 9)[onset + 3:onset + 34]))
    units = (peak - pre) / sd if sd > 0 else math.inf
    ok = peak >= 2.0 * pre and units >= 8.0 and back <= 1.5 * pre
    return CheckResult("loss_spike", ok, f"loss jumped to {peak / pre:.3g}x its level ({units:.3g} noise units; needs "
                                         f">= 2x and >= 8), smoothed loss back to {back / pre:.3g}x within 30 steps "
                                         f"(needs <= 1.5x)")


def _check_grad_explosion(c: Curve, onset: int) -> CheckResult:
    if onset < 20:
        return CheckResult("grad_explosion", False, "onset too early")
    pre = _nanmedian(c.grad_norm[max(0, onset - 50):onset])
    seg = c.grad_norm[onset:onset + 3]
    peak = math.inf if (~np.isfinite(seg)).any() else float(np.max(seg))
    ok = peak >= 10.0 * pre
    return CheckResult("grad_explosion", ok, f"grad norm jumped to {peak / pre:.3g}x its pre-onset level (needs >= 10x)")


def _check_vanishing(c: Curve, onset: int) -> CheckResult:
    if not c.layer_names or onset < 20 or c.total_steps - onset < 30:
        return CheckResult("vanishing_gradient", False, "no per-layer grad norms, or not enough steps")
    g = c.layer_grad_norms
    pre = np.array([_nanmedian(g[max(0, onset - 50):onset, j]) for j in range(g.shape[1])])
    post = np.array([_nanmedian(g[onset + 10:onset + 61, j]) for j in range(g.shape[1])])
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = post / pre
    rel = np.where(np.isfinite(rel), rel, 1.0)
    worst = int(np.argmin(rel))
    ok = bool(rel[worst] <= 1e-2 and rel.max() >= 0.1)
    return CheckResult("vanishing_gradient", ok, f"{c.layer_names[worst]} fell to {rel[worst]:.3g}x its level "
                                                 f"(needs <= 1e-2) while the best-kept layer holds {rel.max():.3g}x (needs >= 0.1)")


def _check_dead_units(c: Curve, onset: int) -> CheckResult:
    if not c.act_layer_names:
        return CheckResult("dead_units", False, "no activation statistics")
    hi = onset + _window("dead_units", c.total_steps)
    before = c.act_steps < onset
    after = (c.act_steps >= onset) & (c.act_steps <= hi)
    for j, name in enumerate(c.act_layer_names):
        d = c.dead_frac[:, j]
        pre = _nanmedian(d[before]) if before.any() else 0.0
        end = _consecutive(d[after] >= 0.9, 3)
        if end >= 0 and not pre >= 0.5:
            step = int(c.act_steps[after][end])
            return CheckResult("dead_units", True, f"{name}: {pre:.2f} dead before, >= 90 % dead in 3 samples by step {step}")
    return CheckResult("dead_units", False, "no layer became >= 90 % dead for 3 samples after the onset")


def _check_silent_collapse(c: Curve, onset: int) -> CheckResult:
    n = c.total_steps
    w = min(_window("silent_collapse", n), n - 1 - onset)
    if w < 100:
        return CheckResult("silent_collapse", False, "too little of the run left after the onset")
    sm = _running_median(c.loss, 9)
    at = float(sm[onset])
    jump = float(np.nanmax(sm[onset:onset + 101])) / at
    fall = float(np.nanmin(sm[onset:onset + w + 1])) / at
    g_at = _nanmedian(c.grad_norm[max(0, onset - 25):onset + 25])
    g_end = _nanmedian(c.grad_norm[onset + w - 50:onset + w + 1])
    vb = c.val_loss[c.val_steps <= onset]
    va = c.val_loss[c.val_steps > onset]
    v_rise = float(np.nanmax(va)) / float(vb[-1]) if len(vb) and len(va) else math.nan
    ok = jump <= 1.25 and fall <= 0.5 and g_end <= 0.1 * g_at and v_rise >= 1.25 \
        and bool(np.isfinite(c.loss).all())
    return CheckResult("silent_collapse", ok, f"smoothed loss at most {jump:.3g}x its onset value (needs <= 1.25), "
                                              f"down to {fall:.3g}x (needs <= 0.5); grad norm {g_end / g_at:.3g}x "
                                              f"(needs <= 0.1); validation up {v_rise:.3g}x (needs >= 1.25)")


def overfitting_onset(c: Curve, injected: int) -> int:
    """The validation step with the lowest validation loss at or after the last validation
    before ``injected`` (the checkpoint to restore), or -1 without validations there.
    """
    v = c.val_steps
    before = v[v <= injected]
    start = int(before[-1]) if len(before) else injected
    ok = v >= start
    if not ok.any():
        return -1
    vals = c.val_loss[ok]
    vals = np.where(np.isfinite(vals), vals, np.inf)
    return int(v[ok][int(np.argmin(vals))])


def _check_overfitting(c: Curve, onset: int) -> CheckResult:
    after = c.val_steps > onset
    at = c.val_steps == onset
    if after.sum() < 5 or not at.any():
        return CheckResult("overfitting", False, f"{int(after.sum())} validations after the onset (needs >= 5)")
    v0 = float(c.val_loss[at][0])
    va = c.val_loss[after]
    tau = _kendall_tau(va)
    last = _nanmedian(va[-3:]) / v0
    t_at = _nanmedian(c.loss[max(0, onset - 25):onset + 25])
    t_end = _nanmedian(c.loss[-50:])
    ok = tau >= 0.5 and last >= 1.1 and t_end <= 0.9 * t_at and bool(np.isfinite(c.loss).all())
    return CheckResult("overfitting", ok, f"validation after the onset: Kendall tau {tau:.3g} (needs >= 0.5), last three "
                                          f"{last:.3g}x the best (needs >= 1.1); training loss {t_end / t_at:.3g}x (needs <= 0.9)")


def _check_healthy(c: Curve) -> CheckResult:
    n = c.total_steps
    if not (np.isfinite(c.loss).all() and np.isfinite(c.grad_norm).all()):
        return CheckResult(HEALTHY, False, "non-finite loss or grad norm")
    first = _nanmedian(c.loss[:20])
    last = _nanmedian(c.loss[-max(20, n // 20):])
    if last > 0.7 * first:
        return CheckResult(HEALTHY, False, f"did not learn: final loss {last / first:.3g}x the initial (needs <= 0.7)")
    sm = _running_median(c.loss, 51)
    best = np.minimum.accumulate(sm)
    with np.errstate(divide="ignore", invalid="ignore"):
        lost = (sm - best) / np.maximum(first - best, 1e-12)
    regress = float(np.max(lost[50:])) if n > 50 else 0.0
    if regress > 0.25:
        return CheckResult(HEALTHY, False, f"the smoothed loss gave back {regress:.0%} of the progress made (max 25 %)")
    if len(c.val_loss):
        b = int(np.argmin(np.where(np.isfinite(c.val_loss), c.val_loss, np.inf)))
        va = c.val_loss[b + 1:]
        if len(va) >= 5 and _kendall_tau(va) >= 0.5 and _nanmedian(va[-3:]) >= 1.1 * float(c.val_loss[b]):
            return CheckResult(HEALTHY, False, "validation loss rises steadily after its best (overfitting)")
    for j, name in enumerate(c.act_layer_names):
        if _consecutive(c.dead_frac[:, j] >= 0.9, 3) >= 0:
            return CheckResult(HEALTHY, False, f"{name} is >= 90 % dead in 3 samples")
        if _consecutive(c.saturation[:, j] >= 0.5, 3) >= 0:
            return CheckResult(HEALTHY, False, f"{name} is >= 50 % saturated in 3 samples")
    g_early = _nanmedian(c.grad_norm[10:60])
    g_late = _nanmedian(c.grad_norm[-max(20, n // 10):])
    if g_late < g_early / 30.0:
        return CheckResult(HEALTHY, False, f"grad norm collapsed to {g_late / g_early:.3g}x its early level")
    if c.layer_names:
        levels = np.array([_nanmedian(c.layer_grad_norms[n // 2:, j]) for j in range(len(c.layer_names))])
        med = float(np.median(levels))
        if (levels < 1e-3 * med).any():
            j = int(np.argmin(levels))
            return CheckResult(HEALTHY, False, f"{c.layer_names[j]}'s grad norm is 3 decades below the median layer's")
    return CheckResult(HEALTHY, True, f"finite, learned ({last / first:.3g}x), gave back at most {regress:.0%} of "
                                      f"its progress, no overfitting, dead or saturated layer, grad norm "
                                      f"{g_late / g_early:.3g}x its early level")


_CHECKS: dict[str, Callable[[Curve, int], CheckResult]] = {
    "divergence": _check_divergence,
    "stall": _check_stall,
    "oscillation": _check_oscillation,
    "loss_spike": _check_loss_spike,
    "grad_explosion": _check_grad_explosion,
    "vanishing_gradient": _check_vanishing,
    "dead_units": _check_dead_units,
    "silent_collapse": _check_silent_collapse,
    "overfitting": _check_overfitting,
}


def check_label(curve: Curve, kind: str | None = None, onset: int | None = None) -> CheckResult:
    """Whether ``curve``'s recorded signals show ``kind``'s behaviour from ``onset`` on.

    The checks are described in the module docstring. They read the signals only, never a
    detector's output.

    Args:
        curve: A recorded run.
        kind: The kind to check; defaults to the curve's label.
        onset: The onset to check; defaults to the curve's label.

    Returns:
        The :class:`CheckResult`.

    Raises:
        ValueError: an unknown kind, or a fault kind without an onset.
    """
    kind = curve.kind if kind is None else kind
    onset = curve.onset_step if onset is None else onset
    if kind == HEALTHY:
        return _check_healthy(curve)
    if kind not in _CHECKS:
        raise ValueError(f"kind must be 'healthy' or one of {FAULT_KINDS}, got {kind!r}")
    if onset is None or onset < 0:
        raise ValueError(f"onset must be a step >= 0 for kind {kind!r}, got {onset!r}")
    return _CHECKS[kind](curve, int(onset))


def _relabel(curve: Curve, kind: str, onset: int) -> Curve:
    d = {f: getattr(curve, f) for f in curve.__dataclass_fields__}
    d.update(kind=kind, onset_step=int(onset), name=curve.name if kind == curve.kind else
             f"{kind}-{curve.difficulty}-{curve.name.rsplit('-', 1)[-1]}-from-{curve.kind}")
    return Curve(**d)


def label_run(curve: Curve) -> tuple[Curve | None, CheckResult, list[CheckResult]]:
    """Check a freshly trained run's intended label; relabel or drop it when the check fails.

    For an overfitting run the onset becomes the validation step of the lowest validation loss
    at or after the injection (:func:`overfitting_onset`). The kinds in :data:`PRECEDENCE` are
    checked first, then the intended kind, then its :data:`FALLBACKS`; the first that passes
    is the label.

    Returns:
        ``(curve or None when dropped, the deciding check, every check made)``.
    """
    intended = curve.kind
    onset = curve.onset_step
    if intended == HEALTHY:
        res = _check_healthy(curve)
        return (curve if res.passed else None), res, [res]
    if intended == "overfitting":
        onset = overfitting_onset(curve, onset)
        if onset < 0:
            res = CheckResult("overfitting", False, "no validation after the injection")
            return None, res, [res]
    order = [*PRECEDENCE.get(intended, ()), intended, *FALLBACKS.get(intended, ())]
    made: list[CheckResult] = []
    for kind in dict.fromkeys(order):
        res = check_label(curve, kind, onset)
        made.append(res)
        if res.passed:
            return _relabel(curve, kind, onset), res, made
    return None, made[order.index(intended)], made


# ------------------------------------------------------------------------------------ the suite


def run(spec: RunSpec) -> dict[str, Any]:
    """Train ``spec``, check its label and return ``{"curve": Curve | None, "entry": manifest info}``."""
    t0 = time.perf_counter()
    raw, info = train_with_info(spec)
    twin = info.pop("twin", None)
    if spec.family in HELDOUT_FAMILIES:
        from trainsignals.curves.families import label_with_twin

        curve, decided, made, twin_fig = label_with_twin(raw, twin)
    else:
        curve, decided, made = label_run(raw)
        twin_fig = None
    entry: dict[str, Any] = {
        "name": spec.name if curve is None else curve.name,
        "intended_kind": spec.kind,
        "injected_step": spec.onset,
        "config": _jsonable(asdict(spec)),
        "applied": _jsonable(info),
        "check": {"kind": decided.kind, "passed": decided.passed, "reason": decided.reason},
        "checks": [{"kind": r.kind, "passed": r.passed, "reason": r.reason} for r in made],
        "seconds": round(time.perf_counter() - t0, 2),
    }
    if twin_fig is not None:
        entry["twin"] = _jsonable(twin_fig)
    return {"curve": curve, "entry": entry}


def _jsonable(x: Any) -> Any:
    if isinstance(x, Mapping):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, (np.floating, float)):
        return float(x)
    if isinstance(x, (np.integer,)):
        return int(x)
    return x


def _versions() -> dict[str, str]:
    import torch

    return {
        "torch": str(torch.__version__),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "corpus_sha256": hashlib.sha256(corpus().encode()).hexdigest(),
        "cpu_kernels": " ".join(f"{k}={v}" for k, v in CPU_KERNELS.items()) + ", oneDNN off",
    }


def _map(specs: Sequence[RunSpec], jobs: int, progress: Callable[[int, int, dict[str, Any]], None] | None
         ) -> list[dict[str, Any]]:
    """:func:`run` over ``specs`` in ``jobs`` fresh worker processes whose environment holds
    :data:`CPU_KERNELS` (a fresh process: the kernels are chosen when torch loads).
    """
    import multiprocessing as mp
    import os
    from concurrent.futures import ProcessPoolExecutor, as_completed

    results: list[dict[str, Any] | None] = [None] * len(specs)
    saved = {k: os.environ.get(k) for k in CPU_KERNELS}
    os.environ.update(CPU_KERNELS)   # spawned workers inherit the environment as it is when they start
    try:
        with ProcessPoolExecutor(max_workers=jobs, mp_context=mp.get_context("spawn")) as pool:
            futures = {pool.submit(run, s): i for i, s in enumerate(specs)}
            done = 0
            for fut in as_completed(futures):
                i = futures[fut]
                results[i] = fut.result()
                done += 1
                if progress:
                    progress(done, len(specs), results[i])  # type: ignore[arg-type]
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return [r for r in results if r is not None]


def build(out: str | Path | None = None, seed: int = 0, *, jobs: int = 2, per_kind: int | None = None,
          n_healthy: int | None = None, specs: Iterable[RunSpec] | None = None,
          progress: Callable[[int, int, dict[str, Any]], None] | None = None,
          heldout: bool = False) -> dict[str, Any]:
    """Train every run of the plan, check the labels and write the suite.

    Args:
        out: Output folder (default: ``datasets/real``).
        seed: Suite seed.
        jobs: Worker processes.
        per_kind: Runs planned per fault kind (default 16; 7 for the held-out suite).
        n_healthy: Healthy runs planned (default 128; 40 for the held-out suite).
        specs: The runs, instead of :func:`plan_suite`'s.
        progress: Called as ``progress(done, total, result)`` after each run.
        heldout: Plan the held-out suite instead (:func:`trainsignals.curves.families.plan_heldout`:
            the families of :data:`HELDOUT_FAMILIES`, labels checked against counterfactual
            twins); its default folder is ``datasets/real_heldout``.

    Returns:
        The manifest written.
    """
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs must be an integer >= 1, got {jobs!r}")
    out = default_directory(heldout) if out is None else Path(out)
    per_kind = (7 if heldout else 16) if per_kind is None else per_kind
    n_healthy = (40 if heldout else 128) if n_healthy is None else n_healthy
    if specs is not None:
        plan = list(specs)
    elif heldout:
        from trainsignals.curves.families import plan_heldout

        plan = plan_heldout(seed, per_kind, n_healthy)
    else:
        plan = plan_suite(seed, per_kind, n_healthy)
    results = _map(plan, jobs, progress)
    kept = [r for r in results if r["curve"] is not None]
    order = {k: i for i, k in enumerate((*FAULT_KINDS, HEALTHY))}
    kept.sort(key=lambda r: (order.get(r["curve"].kind, len(order)), _plan_index(plan, r["entry"]["config"]["name"])))
    curves = [r["curve"] for r in kept]
    write_suite(curves, out, seed=seed)
    manifest_path = Path(out) / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["generator"] = "trainsignals.curves.real_runs"
    manifest["note"] = FORMAT_NOTE
    manifest["command"] = f"python -m trainsignals.curves.real_runs build --seed {seed}" + (
        f" --heldout --per-kind {per_kind} --healthy {n_healthy}" if heldout else "")
    if heldout:
        manifest["heldout"] = True
        manifest["note"] = FORMAT_NOTE + "; held-out: no detector threshold was ever chosen on these runs"
    manifest["plan"] = {"per_kind": per_kind, "n_healthy": n_healthy, "runs": len(plan)}
    manifest["versions"] = _versions()
    by_name = {r["curve"].name: r["entry"] for r in kept}
    for entry in manifest["curves"]:
        info = by_name[entry["name"]]
        entry["family"] = entry["difficulty"]
        entry.update({k: info[k] for k in ("intended_kind", "injected_step", "check", "config", "applied", "twin")
                      if info.get(k)})
    manifest["dropped"] = [
        {"name": r["entry"]["name"], "intended_kind": r["entry"]["intended_kind"],
         "checks": r["entry"]["checks"], "config": r["entry"]["config"],
         **({"twin": r["entry"]["twin"]} if "twin" in r["entry"] else {})}
        for r in results if r["curve"] is None
    ]
    manifest_path.write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def _plan_index(plan: Sequence[RunSpec], name: str) -> int:
    """Position of the run named ``name`` in ``plan`` (for a stable order)."""
    for i, s in enumerate(plan):
        if s.name == name:
            return i
    return len(plan)


# ------------------------------------------------------------------------------------ CLI


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m trainsignals.curves.real_runs build [--out DIR] [--seed 0] [--jobs 2]``."""
    parser = argparse.ArgumentParser(prog="python -m trainsignals.curves.real_runs",
                                     description=(__doc__ or "").splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="train the runs and (re)write the real-run suite")
    b.add_argument("--out", type=Path, default=None, help="output folder (default: datasets/real)")
    b.add_argument("--seed", type=int, default=0, help="suite seed (default: 0)")
    b.add_argument("--jobs", type=int, default=2, help="worker processes (default: 2)")
    b.add_argument("--per-kind", type=int, default=None,
                   help="runs planned per fault kind (default: 16; 7 with --heldout)")
    b.add_argument("--healthy", type=int, default=None, help="healthy runs planned (default: 128; 40 with --heldout)")
    b.add_argument("--heldout", action="store_true",
                   help="build the held-out suite (families never tuned on; default folder datasets/real_heldout)")
    args = parser.parse_args(argv)
    if args.per_kind is None:
        args.per_kind = 7 if args.heldout else 16
    if args.healthy is None:
        args.healthy = 40 if args.heldout else 128
    t0 = time.perf_counter()

    def progress(done: int, total: int, result: dict[str, Any]) -> None:
        e = result["entry"]
        verdict = "kept" if result["curve"] is not None else "DROPPED"
        label = result["curve"].kind if result["curve"] is not None else e["intended_kind"]
        print(f"[{done}/{total}] {e['config']['name']}: {verdict} as {label} ({e['seconds']} s) - "
              f"{e['check']['reason']}", flush=True)

    manifest = build(args.out, args.seed, jobs=args.jobs, per_kind=args.per_kind, n_healthy=args.healthy,
                     progress=progress, heldout=args.heldout)
    out = args.out if args.out is not None else default_directory(args.heldout)
    size = sum(p.stat().st_size for p in Path(out).iterdir() if p.is_file())
    print(f"wrote {len(manifest['curves'])} runs ({len(manifest['dropped'])} dropped) to {out} "
          f"({size / 1e6:.1f} MB) in {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
