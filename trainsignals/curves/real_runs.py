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
checks. Every faulty run is also compared with its **counterfactual twin**: at the onset the
model and optimizer are copied and the copy continues without the fault, on the same batches,
for the kind's window (:func:`~trainsignals.curves.families.record_twin`); the label needs the
faulty trace to differ from the twin's beyond noise in the kind's signal, and a fault that made
no difference is relabelled healthy or dropped
(:func:`~trainsignals.curves.families.label_with_twin`, as for the held-out families).
Learning-rate bumps are checked for a divergence first: a bump meant to make the loss oscillate
that made the run diverge is a divergence; a bump meant to make it diverge that made it swing
without diverging is an oscillation. A faulty run must also be healthy until its
onset (:func:`~trainsignals.curves.labels.check_before_onset`): a net that had begun to overfit
its small data set before its fault came is dropped. The checks are those of
:mod:`trainsignals.curves.labels` (:func:`~trainsignals.curves.labels.check_label`,
:func:`~trainsignals.curves.labels.label_run`; its docstring states each check).
``python -m trainsignals.curves.real_runs recheck DIR`` (:func:`recheck`) applies the current
checks to a built suite without training again.

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

**Held-out suite**: ``build --heldout`` trains the families of
:data:`~trainsignals.curves.families.HELDOUT_FAMILIES` (:mod:`trainsignals.curves.families`:
recurrent and transformer character LMs, deep ReLU/tanh MLPs, tabular classification, MSE
autoencoders and regressions) into ``datasets/real_heldout``, each faulty run's label also
checked against a counterfactual twin continued from the onset without the fault; no detector
threshold is ever chosen on that suite.

**Development suite**: ``build --dev`` trains the families of
:data:`~trainsignals.curves.families.DEV_FAMILIES` (a residual CNN with batch or group norm, a
small patch transformer and softmax regressions / wide one-hidden-layer MLPs, on the digits and
iris, with Adagrad, NAdam and Adamax besides the held-out optimizers) into ``datasets/real_dev``,
labels checked against counterfactual twins as in the held-out suite. It is *tuning* data: more
kinds of run to choose thresholds on, none of them a held-out family.

Command::

    python -m trainsignals.curves.real_runs build --seed 0 [--out DIR] [--jobs 2]
    python -m trainsignals.curves.real_runs build --heldout --seed 1000 --jobs 2 --out datasets/real_heldout
    python -m trainsignals.curves.real_runs build --dev --seed 2000 --jobs 2 --out datasets/real_dev

What the families share (:class:`~trainsignals.curves.training.RunSpec`, the seeded draws, the
corpus and the digits, the learning-rate factors, the recorder, the assembly of a curve) is in
:mod:`trainsignals.curves.training`, the label checks in :mod:`trainsignals.curves.labels`; this
module hands the held-out runs to :mod:`~trainsignals.curves.families`, which imports neither it
nor anything private.

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
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from trainsignals.cli.options import check_out_folder, run_command
from trainsignals.curves import HEALTHY, Curve, check_suite_folder, families, write_suite
from trainsignals.curves.families import DEV_FAMILIES, HELDOUT_FAMILIES
from trainsignals.curves.labels import (
    CheckResult,
    check_before_onset,
    check_healthy,
    check_label,
    divergence_verdict,
    label_run,
    oscillation_verdict,
)
from trainsignals.curves.training import (
    FAULT_KINDS,
    RunSpec,
    StepKit,
    corpus,
    digits,
    log_uniform,
    pick,
    schedule_factor,
    seeded_rng,
    to_curve,
    train_step,
    watch,
)
from trainsignals.kinds import default_window

#: Environment that pins the CPU kernels of :func:`build`'s workers, so that a run gives the same
#: values on every x86-64 CPU: ``ATEN_CPU_CAPABILITY=default`` (torch's portable kernels rather
#: than those for the CPU's AVX2 or AVX-512) and ``MKL_CBWR=COMPATIBLE,STRICT`` (MKL's
#: conditional numerical reproducibility: the same code path on every CPU, results independent
#: of memory alignment). Both are read when torch loads.
CPU_KERNELS: dict[str, str] = {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE,STRICT"}

__all__ = [
    "FAMILIES",
    "FAULT_FAMILIES",
    "DEV_FAMILIES",
    "HELDOUT_FAMILIES",
    "FAULT_KINDS",
    "CheckResult",
    "RunSpec",
    "build",
    "check_label",
    "default_directory",
    "label_run",
    "plan_suite",
    "recheck",
    "run",
    "train",
    "train_with_info",
]

FAMILIES: tuple[str, ...] = ("mlp", "cnn", "deep", "charlm")
"""The model families."""

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

FORMAT_NOTE = "trainsignals real runs: difficulty = model family"
#: the manifest's ``generator`` of a suite this module built
GENERATOR = "trainsignals.curves.real_runs"
_MIN_STEPS, _MAX_STEPS = 600, 2000


def default_directory(heldout: bool = False, *, dev: bool = False) -> Path:
    """Where the committed real-run suite lives: ``<repository>/datasets/real``
    (``datasets/real_heldout`` for the held-out suite, ``datasets/real_dev`` for the development one).

    Raises:
        ValueError: both ``heldout`` and ``dev``.
    """
    if heldout and dev:
        raise ValueError("heldout and dev: a suite is one or the other")
    name = "real_heldout" if heldout else ("real_dev" if dev else "real")
    return Path(__file__).resolve().parents[2] / "datasets" / name


# ------------------------------------------------------------------------------------ the plan


#: Healthy peak learning rates per (family, optimizer).
_LR: dict[tuple[str, str], tuple[float, float]] = {
    ("mlp", "sgd"): (0.03, 0.2), ("mlp", "sgdm"): (0.005, 0.03), ("mlp", "adamw"): (5e-4, 3e-3),
    ("cnn", "sgd"): (0.03, 0.15), ("cnn", "sgdm"): (0.004, 0.02), ("cnn", "adamw"): (5e-4, 3e-3),
    ("deep", "sgd"): (0.05, 0.2), ("deep", "sgdm"): (0.01, 0.03), ("deep", "adamw"): (1e-3, 3e-3),
    ("charlm", "sgd"): (0.1, 0.5), ("charlm", "sgdm"): (0.02, 0.08), ("charlm", "adamw"): (1e-3, 5e-3),
}


def _draw_spec(kind: str, family: str, seed: int, index: int) -> RunSpec:
    """Draw one run's configuration (and its fault's) from ``(seed, kind, family, index)``."""
    rng = seeded_rng(seed, kind, family, index)
    run_seed = int(rng.integers(0, 2**31 - 1))
    steps = int(round(log_uniform(rng, _MIN_STEPS, _MAX_STEPS)))
    optimizer = pick(rng, ("sgd", "sgdm", "adamw"))
    lr = log_uniform(rng, *_LR[(family, optimizer)])
    deep_act = pick(rng, ("sigmoid", "tanh")) if family == "deep" else "relu"
    if deep_act == "sigmoid":    # deep sigmoid nets train only with Adam in a few hundred steps
        optimizer = "adamw"
        lr = log_uniform(rng, 4e-3, 1e-2)
    if optimizer == "adamw":
        weight_decay = log_uniform(rng, 1e-4, 3e-2)
    else:
        weight_decay = 0.0 if rng.random() < 0.5 else log_uniform(rng, 1e-5, 5e-4)
    schedule = pick(rng, ("constant", "cosine", "warmup_cosine", "warmup_linear", "step"), (2, 2, 3, 2, 2))
    warmup = int(rng.uniform(0.02, 0.1) * steps) if schedule.startswith("warmup") else 0
    batch_size = int(pick(rng, (16, 32, 64)))
    if family == "mlp":
        width = int(pick(rng, (32, 64, 96)))
        arch: dict[str, Any] = {"widths": [width] * int(pick(rng, (2, 3))), "activation": "relu"}
    elif family == "cnn":
        c1 = int(pick(rng, (6, 8, 12)))
        arch = {"channels": [c1, 2 * c1], "hidden": int(pick(rng, (32, 48))), "activation": "relu"}
    elif family == "deep":
        depth = 6 if deep_act == "sigmoid" else int(pick(rng, (6, 8, 10)))
        arch = {"widths": [int(pick(rng, (32, 48)))] * depth, "activation": deep_act}
    else:
        arch = {"context": int(pick(rng, (8, 12, 16))), "embed": int(pick(rng, (8, 16))),
                "widths": [int(pick(rng, (64, 128)))] * int(pick(rng, (1, 2))),
                "activation": "relu" if kind == "dead_units" else pick(rng, ("relu", "tanh"), (3, 1))}
    if family == "charlm":
        augment = (0.0, 0.0)
    else:
        augment = (float(pick(rng, (0.0, 0.5, 0.8), (1, 2, 2))), float(pick(rng, (0.0, 0.05, 0.1))))
    val_every = int(pick(rng, (25, 50, 100), (2, 2, 1)))
    if kind == "overfitting":
        val_every = min(val_every, 50)
    per_layer = pick(rng, ("module", "parameter"), (3, 2))
    clip = float(pick(rng, (1.0, 2.0, 5.0))) if rng.random() < 0.3 else 0.0
    onset = -1
    fault: dict[str, Any] = {}
    frng = seeded_rng(seed, kind, family, index, "fault")
    if kind != HEALTHY:
        onset = int(frng.uniform(0.3, 0.7) * steps)
    if kind == "divergence":
        lo, hi = {"sgd": (30.0, 300.0), "sgdm": (30.0, 300.0), "adamw": (50.0, 1000.0)}[optimizer]
        fault = {"lr_mult": log_uniform(frng, lo, hi), "ramp": int(pick(frng, (0, 0, 10, 30, 60)))}
    elif kind == "stall":
        onset = int(frng.uniform(0.2, 0.45) * steps)
        fault = {"lr_mult": log_uniform(frng, 1e-4, 1e-3), "ramp": int(pick(frng, (0, 0, 5, 30)))}
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
        mode = pick(frng, ("labels", "inputs")) if family != "charlm" else "labels"
        fault = {"n_bad": int(pick(frng, (1, 1, 2, 3))), "mode": mode, "scale": log_uniform(frng, 4.0, 15.0)}
    elif kind == "grad_explosion":
        mode = pick(frng, ("weights", "inputs")) if family != "charlm" else "weights"
        layer = 0 if family == "charlm" else int(frng.integers(0, 2))
        fault = {"mode": mode, "layer": layer,
                 "scale": log_uniform(frng, 20.0, 100.0) if mode == "weights" else log_uniform(frng, 30.0, 100.0)}
    elif kind == "vanishing_gradient":
        depth = len(arch["widths"])
        k = int(frng.integers(3, min(5, depth - 1)))
        start = int(frng.integers(1, depth - k))
        fault = {"layers": list(range(start, start + k)), "scale": log_uniform(frng, 1e-3, 5e-3)}
    elif kind == "dead_units":
        n_hidden = _n_relu_layers(family, arch)
        fault = {"layer": int(frng.integers(0, n_hidden)), "fraction": float(frng.uniform(0.92, 1.0)),
                 "bias": -log_uniform(frng, 20.0, 100.0)}
    elif kind == "silent_collapse":
        onset = int(frng.uniform(0.04, 0.15) * steps)
        if schedule.startswith("warmup"):
            warmup = max(warmup, onset + 1)
        fault = {}
    elif kind == "overfitting":
        onset = int(frng.uniform(0.2, 0.45) * steps)
        fault = {"n_examples": int(pick(frng, (16, 24, 32, 48)))}
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


class _Data:
    """Train/validation tensors and a seeded batch sampler for one run (every one a classifier's)."""

    regression = False

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
            X, y = digits()
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


# ------------------------------------------------------------------------------------ training


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
    if spec.family in HELDOUT_FAMILIES or spec.family in DEV_FAMILIES:
        return families.train(spec, torch)
    torch.manual_seed(spec.seed)
    data = _Data(spec, torch)
    model = _model(spec, data.n_classes, torch)
    opt = _optimizer(spec, model, torch)
    watcher, collector = watch(model, opt, spec)
    info: dict[str, Any] = {}
    mult: float | None = None
    try:
        for t in range(spec.steps):
            if t == spec.onset:
                info["twin"] = _twin(spec, model, opt, data, torch)
                if spec.fault.get("lr_mult") == "edge":
                    history = [r[1].get("loss", math.nan) for r in collector.rows]
                    mult, info["edge_of_stability"] = _edge_of_stability(spec, model, opt, data, history, torch)
                    info["lr_mult"] = mult
            train_step(_KIT, spec, model, opt, data, t, torch, fault=True, mult=mult, watcher=watcher)
    finally:
        watcher.close()
    return to_curve(spec, collector.rows, watcher), info


def _cross_entropy(spec: RunSpec, out: Any, y: Any, torch: Any) -> Any:
    """The loss of every run of these families: a classifier's cross-entropy."""
    return torch.nn.functional.cross_entropy(out, y)


#: these families' schedule, faults and loss, for :func:`~trainsignals.curves.training.train_step`
_KIT = StepKit(schedule_factor, _inject_weights, _corrupt, _cross_entropy)


@contextmanager
def _fork(spec: RunSpec, model: Any, opt: Any, data: _Data, torch: Any) -> Iterator[tuple[Any, Any]]:
    """A copy of the run's model and optimizer to train on (a fresh module: no adapter hooks on it);
    the batch sampler's and the global RNG's states are restored when the block ends, so the run
    itself goes on as if the copy had never trained.
    """
    rng_state = torch.get_rng_state()
    gen_state = data.gen.get_state()
    copy_model = _model(spec, data.n_classes, torch)
    copy_model.load_state_dict(model.state_dict())
    copy_opt = _optimizer(spec, copy_model, torch)
    copy_opt.load_state_dict(copy.deepcopy(opt.state_dict()))   # load_state_dict may share the tensors
    try:
        yield copy_model, copy_opt
    finally:
        data.gen.set_state(gen_state)
        torch.set_rng_state(rng_state)


def _twin(spec: RunSpec, model: Any, opt: Any, data: _Data, torch: Any) -> dict[str, Any]:
    """The counterfactual twin (:func:`trainsignals.curves.families.twin_check`): the run continued
    from the onset without its fault, on a copy of the model and optimizer and on the same batches,
    recorded by its own watcher.
    """
    with _fork(spec, model, opt, data, torch) as (twin, topt):
        return families.record_twin(spec, twin, topt, lambda t, watcher: train_step(
            _KIT, spec, twin, topt, data, t, torch, fault=False, mult=None, watcher=watcher))


def _probe(spec: RunSpec, model: Any, opt: Any, data: _Data, t0: int, mult: float, n_steps: int,
           torch: Any) -> list[float]:
    """The training losses of ``n_steps`` steps from ``t0`` with the learning rate times ``mult``,
    trained on a copy of the model and optimizer (the run itself, the batch sampler and the
    global RNG are left as they were).
    """
    out: list[float] = []
    with _fork(spec, model, opt, data, torch) as (probe, popt):
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
    w = min(default_window("oscillation", n), n - 1 - t0)
    mult = float(f["start"])
    tried: list[list[Any]] = []
    for _ in range(int(f["tries"])):
        losses = _probe(spec, model, opt, data, t0, mult, w + 1, torch)
        series = np.full(n, np.nan)
        series[:t0] = history
        series[t0:t0 + len(losses)] = losses
        if len(losses) < w + 1:
            series[t0 + len(losses):] = math.inf
        if divergence_verdict(series, t0).passed:
            tried.append([mult, "diverges"])
            return mult, tried
        osc = oscillation_verdict(series, t0)
        if osc.passed:
            tried.append([mult, "oscillation"])
            return mult, tried
        tried.append([mult, "stable"])
        mult *= float(f["factor"])
    return mult / float(f["factor"]), tried


# ------------------------------------------------------------------------------------ the suite


def run(spec: RunSpec) -> dict[str, Any]:
    """Train ``spec``, check its label and return ``{"curve": Curve | None, "entry": manifest info}``."""
    t0 = time.perf_counter()
    raw, info = train_with_info(spec)
    twin = info.pop("twin", None)
    curve, decided, made, twin_fig = families.label_with_twin(raw, twin)
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
          heldout: bool = False, dev: bool = False) -> dict[str, Any]:
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
        dev: Plan the development suite instead (:func:`trainsignals.curves.families.plan_dev`:
            the families of :data:`DEV_FAMILIES`, labels checked against twins, per kind 5 and
            36 healthy by default); its default folder is ``datasets/real_dev``.

    Raises:
        ValueError: a bad ``jobs``, or both ``heldout`` and ``dev``.

    Returns:
        The manifest written.
    """
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs must be an integer >= 1, got {jobs!r}")
    if heldout and dev:
        raise ValueError("heldout and dev: a suite is one or the other")
    out = default_directory(heldout, dev=dev) if out is None else Path(out)
    per_kind = _default_per_kind(heldout, dev) if per_kind is None else per_kind
    n_healthy = _default_healthy(heldout, dev) if n_healthy is None else n_healthy
    if specs is not None:
        plan = list(specs)
    elif heldout:
        plan = families.plan_heldout(seed, per_kind, n_healthy)
    elif dev:
        plan = families.plan_dev(seed, per_kind, n_healthy)
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
    manifest["generator"] = GENERATOR
    manifest["note"] = FORMAT_NOTE
    manifest["command"] = f"python -m trainsignals.curves.real_runs build --seed {seed}" + (
        f" --heldout --per-kind {per_kind} --healthy {n_healthy}" if heldout else
        f" --dev --per-kind {per_kind} --healthy {n_healthy}" if dev else "")
    if heldout:
        manifest["heldout"] = True
        manifest["note"] = FORMAT_NOTE + "; held-out: no detector threshold was ever chosen on these runs"
    if dev:
        manifest["dev"] = True
        manifest["note"] = FORMAT_NOTE + "; development families: tuning data, no held-out family"
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


def recheck(folder: str | Path) -> list[dict[str, Any]]:
    """Apply the current label checks to a built suite; drop the runs they reject.

    A healthy run gets :func:`~trainsignals.curves.labels.check_healthy`; a faulty one
    :func:`~trainsignals.curves.labels.check_before_onset` and the check of its kind. The runs
    that pass are written back in their order (their values untouched); the others move to the
    manifest's ``dropped`` list, with the check that rejected them and ``"recheck": true``. The
    builds are deterministic, so a rebuild with the same command trains the same runs and drops
    these too; the recheck does it without training again (a rebuild could instead relabel a
    dropped faulty run healthy when its twin shows no effect on its *intended* kind: the recheck
    has no twin trace to tell). The manifest's ``rechecks`` lists each recheck with what it dropped.

    Returns:
        The manifest entries of the runs dropped now (empty: the suite is unchanged, not rewritten).

    Raises:
        ValueError: the folder's suite was not built by this module (the synthetic suite's
            curves are labelled by construction, not by these checks).
    """
    from trainsignals.curves import load_suite

    folder = Path(folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    if manifest.get("generator") != GENERATOR:
        raise ValueError(f"folder {str(folder)!r} holds no suite built by {GENERATOR} (generator "
                         f"{manifest.get('generator')!r}): its labels are not this builder's")
    entries = {e["name"]: e for e in manifest["curves"]}
    kept, gone = [], []
    for c in load_suite(folder):
        res = check_healthy(c) if c.kind == HEALTHY else check_before_onset(c)
        if res.passed and c.kind != HEALTHY:
            res = check_label(c)
        if res.passed:
            kept.append(c)
            continue
        e = entries[c.name]
        gone.append({"name": c.name, "intended_kind": e.get("intended_kind", c.kind), "kind": c.kind,
                     "checks": [{"kind": res.kind, "passed": False, "reason": res.reason}],
                     **{k: e[k] for k in ("config", "twin") if k in e}, "recheck": True})
    if not gone:
        return []
    write_suite(kept, folder, seed=manifest.get("seed"))
    names = {c.name for c in kept}
    manifest["curves"] = [e for e in manifest["curves"] if e["name"] in names]
    manifest["dropped"] = [*manifest.get("dropped", []), *gone]
    manifest.setdefault("rechecks", []).append(
        {"command": f"python -m trainsignals.curves.real_runs recheck {folder}",
         "dropped": [g["name"] for g in gone]})
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return gone


def _default_per_kind(heldout: bool, dev: bool) -> int:
    return 7 if heldout else (5 if dev else 16)


def _default_healthy(heldout: bool, dev: bool) -> int:
    return 40 if heldout else (36 if dev else 128)


def _plan_index(plan: Sequence[RunSpec], name: str) -> int:
    """Position of the run named ``name`` in ``plan`` (for a stable order)."""
    for i, s in enumerate(plan):
        if s.name == name:
            return i
    return len(plan)


# ------------------------------------------------------------------------------------ CLI


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m trainsignals.curves.real_runs build [--out DIR] [--seed 0] [--jobs 2]``, or ``recheck DIR``."""
    parser = argparse.ArgumentParser(prog="python -m trainsignals.curves.real_runs",
                                     description=(__doc__ or "").splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="train the runs and (re)write the real-run suite")
    b.add_argument("--out", type=Path, default=None, help="output folder (default: datasets/real)")
    b.add_argument("--seed", type=int, default=0, help="suite seed (default: 0)")
    b.add_argument("--jobs", type=int, default=2, help="worker processes (default: 2)")
    b.add_argument("--per-kind", type=int, default=None,
                   help="runs planned per fault kind (default: 16; 7 with --heldout, 5 with --dev)")
    b.add_argument("--healthy", type=int, default=None,
                   help="healthy runs planned (default: 128; 40 with --heldout, 36 with --dev)")
    which = b.add_mutually_exclusive_group()
    which.add_argument("--heldout", action="store_true",
                       help="build the held-out suite (families never tuned on; default folder datasets/real_heldout)")
    which.add_argument("--dev", action="store_true",
                       help="build the development suite (tuning families beside datasets/real; "
                            "default folder datasets/real_dev)")
    r = sub.add_parser("recheck", help="apply the current label checks to a built suite and drop the runs they reject")
    r.add_argument("folder", type=Path, help="the suite's folder (e.g. datasets/real_heldout)")
    args = parser.parse_args(argv)
    if args.command == "recheck":
        try:
            gone = recheck(args.folder)
        except (ValueError, FileNotFoundError) as err:
            print(f"recheck: {err}", file=sys.stderr)
            return 2
        for g in gone:
            print(f"dropped {g['name']}: {g['checks'][0]['reason']}")
        print(f"{args.folder}: {len(gone)} run(s) dropped" + ("" if gone else " (unchanged)"))
        return 0
    if args.per_kind is None:
        args.per_kind = _default_per_kind(args.heldout, args.dev)
    if args.healthy is None:
        args.healthy = _default_healthy(args.heldout, args.dev)
    # an unusable folder is refused now, before the minutes of training, not when the suite is written
    out = check_out_folder(args.out if args.out is not None else default_directory(args.heldout, dev=args.dev))
    check_suite_folder(out)  # another tool's manifest.json or .arrow files of no suite there
    t0 = time.perf_counter()

    def progress(done: int, total: int, result: dict[str, Any]) -> None:
        e = result["entry"]
        verdict = "kept" if result["curve"] is not None else "DROPPED"
        label = result["curve"].kind if result["curve"] is not None else e["intended_kind"]
        print(f"[{done}/{total}] {e['config']['name']}: {verdict} as {label} ({e['seconds']} s) - "
              f"{e['check']['reason']}", flush=True)

    manifest = build(out, args.seed, jobs=args.jobs, per_kind=args.per_kind, n_healthy=args.healthy,
                     progress=progress, heldout=args.heldout, dev=args.dev)
    size = sum(p.stat().st_size for p in Path(out).iterdir() if p.is_file())
    print(f"wrote {len(manifest['curves'])} runs ({len(manifest['dropped'])} dropped) to {out} "
          f"({size / 1e6:.1f} MB) in {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":  # an unusable --out: one ``error:`` line, status 2, as ``trainsignals datasets``
    raise SystemExit(run_command("python -m trainsignals.curves.real_runs", lambda _args: main(), argparse.Namespace()))
