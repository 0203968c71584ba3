"""The held-out and the development real-run families, and their counterfactual-twin labels.

Every detector threshold of trainsignals was chosen while looking at ``datasets/real``; this
module builds runs of *other* model families, with other optimizers, schedules and fault
variants, for a held-out suite (``datasets/real_heldout``) on which no threshold is ever chosen.
:mod:`trainsignals.curves.real_runs` trains them (same adapter, same pinned CPU kernels, same
recorder) when a spec's family is one of :data:`HELDOUT_FAMILIES`.

**Families** (:data:`HELDOUT_FAMILIES`):

* ``rnnlm`` — a recurrent character LM: embedding, a 1- or 2-layer GRU or LSTM, a ReLU
  projection and a softmax, predicting every next character of 16..32-character windows of
  the standard-library corpus (:func:`trainsignals.curves.training.corpus`);
* ``tflm`` — a pre-LayerNorm transformer character LM: token and position embeddings, 1 or 2
  blocks (causal self-attention, an FFN with GELU, or ReLU in the dead-unit runs), a final
  LayerNorm and a linear head;
* ``deepmlp`` — a deep MLP of 10..20 layers on the 8x8 digits: ReLU with He init, or tanh with
  Xavier init (the saturation runs); some healthy runs start from a small init (an initial
  plateau the run escapes);
* ``tabular`` — a ReLU/GELU/tanh MLP on scikit-learn's bundled wine or breast-cancer sets or on
  ``make_classification`` (made in code);
* ``mse`` — mean-squared-error training: an autoencoder of the digits or a regression on
  ``make_regression``.

Optimizers SGD, SGD with momentum 0.9 or Nesterov, Adam, AdamW and RMSprop; schedules constant,
cosine, warmup + cosine, step decay and cosine with warm restarts; batches of 8 to 128; 300 to
3000 steps (most under 1200).

**Faults** (besides the learning-rate faults of :mod:`~trainsignals.curves.real_runs`):
stalls by a learning-rate cut of x1e-6..x1e-3 *or* by a frozen optimizer (gradients computed,
``step()`` never called again); vanishing gradients by scaling 3..6 consecutive layers down or by
saturating tanh layers with a bias shift; dead units on 60..100 % of a ReLU/GELU layer (a
transformer's FFN included); gradient explosions by persistently scaled inputs or by scaling one
layer (in the LMs the output projection or the final LayerNorm's gain); silent collapse ramped
in over 1..200 steps at 25..70 % of the run (targets replaced by the majority character/class,
or the mean target); overfitting on 16..48 examples or, in the LMs, a 200..800-character snippet.

**Counterfactual twins.** At the onset of every faulty run the model, the optimizer and the
batch sampler are copied and a *twin* continues from there without the fault, on the same
batches, for the kind's detection window, recorded by its own adapter. The label then needs,
on top of :func:`trainsignals.curves.labels.label_run`'s rule check, that the faulty trace
differs from its twin's beyond noise (:func:`twin_check`). A run whose fault made no difference
to its kind's signal is relabelled ``healthy`` when it is indistinguishable from its twin in
every recorded signal (:func:`untouched`: every kind's check, and the levels of the grad norm,
learning rate and update ratio) and the healthy check passes on it (its name then ends in
``-nofault-<kind>``), and dropped otherwise; the manifest records the twin figures per run.

**Development families** (:data:`DEV_FAMILIES`, :func:`plan_dev`, ``datasets/real_dev``): more
*tuning* data, of families that are neither those of ``datasets/real`` nor held-out ones, trained
by the same machinery (:class:`HeldoutData`, :func:`build_model`, :func:`build_optimizer`,
:func:`inject_weights`, :func:`corrupt`, the twin check) from their own seeded draws
(:func:`draw_dev_spec`), so the held-out plan is left as it was:

* ``resnet`` — a small residual CNN on the 8x8 digits: a stride-2 3x3 stem (to 4x4) of 8 or 12
  channels, 2 or 3 residual blocks (3 or 4 in the vanishing-gradient runs; conv, norm, ReLU,
  conv, norm, skip, ReLU; BatchNorm, or GroupNorm of 2 or 4 groups in a third of the draws),
  global average pooling and a linear head;
* ``vit`` — a patch transformer classifier of the digits: 2x2 or 4x4 patches, 1 or 2
  pre-LayerNorm blocks (bidirectional self-attention, a GELU FFN, or ReLU in half of the
  dead-unit runs), mean pooling or a CLS token, a final LayerNorm and a linear head;
* ``linear`` — softmax regression, or a 1-hidden-layer MLP 256..1024 wide, on the digits or on
  scikit-learn's bundled iris, a quarter of the digit runs with label smoothing 0.05 or 0.1.

Optimizers: the held-out ones plus Adagrad, NAdam and Adamax (:data:`DEV_OPTIMIZERS`); schedules
the held-out ones plus ``late_step`` (x0.1 for the last 15 % of the run); batches of 8 to 128 (the
residual net and the transformer 8..32, 8..16 at 12 channels or with 2x2 patches: the portable
CPU kernels' cost grows with them); 300 to 3000 steps (the CNN and the transformer at most 700,
validated on 256 images). The edge-of-stability sweep (oscillation) runs in the linear family
and the transformer. Healthy hard cases: small batches at 1.5x the learning rate, a shrunken init (an
initial plateau the adaptive optimizers escape), near-zero training loss of the wide MLPs,
warm restarts, late drops. Faults as above, with these variants: vanishing gradients by scaling
the two norm gains of 2..4 consecutive residual branches by x1e-5..x1e-3 (a branch regrows its
gains within tens of steps, so a shallower cut shows no vanishing); dead units through the
norm before a ReLU of the residual net (its shift), the transformer's FFN or the MLP's hidden
layer; gradient explosions by the head's weights or the first norm's gain (the residual net's
stem norm, the transformer's final LayerNorm), in the linear family by a layer or the inputs;
loss spikes by random labels (a normalised net undoes an input scaling), in the linear family
also by scaled inputs; overfitting on 16..48 digits.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from trainsignals.curves import HEALTHY
from trainsignals.curves.labels import (
    CheckResult,
    check_healthy,
    divergence_verdict,
    label_run,
    oscillation_verdict,
    relabel,
    robust_sd,
    running_median,
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

__all__ = ["DEV_FAMILIES", "DEV_FAULT_FAMILIES", "DEV_OPTIMIZERS", "DEV_OVERSAMPLE", "HELDOUT_FAMILIES",
           "HELDOUT_FAULT_FAMILIES", "NOFAULT", "injected", "draw_dev_spec", "draw_spec", "label_with_twin", "plan_dev", "plan_heldout", "record_twin",
           "train", "twin_check", "untouched"]

NOFAULT = "-nofault-"
"""What the name of a run relabelled healthy holds (``healthy-<family>-<n>-nofault-<kind>``):
a fault was injected and made no visible difference to its twin."""


def injected(name: str) -> bool:
    """Whether run ``name`` had a fault injected that made no visible difference (a ``-nofault-`` run).

    Example:
        >>> injected("healthy-vit-3-nofault-oscillation"), injected("healthy-vit-4")
        (True, False)
    """
    return NOFAULT in name


HELDOUT_FAMILIES: tuple[str, ...] = ("rnnlm", "tflm", "deepmlp", "tabular", "mse")
"""The held-out suite's model families (never in the committed ``datasets/real``): no detector
threshold is chosen on their runs."""

_ALL = HELDOUT_FAMILIES
HELDOUT_FAULT_FAMILIES: dict[str, tuple[str, ...]] = {
    "divergence": _ALL,
    "stall": _ALL,
    "oscillation": ("tabular", "deepmlp", "mse"),
    "loss_spike": _ALL,
    "grad_explosion": _ALL,
    "vanishing_gradient": ("deepmlp",),
    "dead_units": ("tflm", "tabular", "deepmlp", "mse", "rnnlm"),
    "silent_collapse": ("tabular", "rnnlm", "deepmlp", "tflm", "mse"),
    "overfitting": ("tflm", "rnnlm", "tabular", "deepmlp", "mse"),
}
"""Which held-out families each fault is injected into."""

#: Healthy peak learning rates per (family, optimizer group).
_HLR: dict[tuple[str, str], tuple[float, float]] = {
    ("rnnlm", "adam"): (2e-3, 8e-3), ("rnnlm", "rmsprop"): (1e-3, 4e-3),
    ("rnnlm", "sgd"): (0.2, 0.8), ("rnnlm", "sgdm"): (0.02, 0.08),
    ("tflm", "adam"): (1e-3, 4e-3), ("tflm", "rmsprop"): (5e-4, 2e-3),
    ("tflm", "sgd"): (0.2, 0.8), ("tflm", "sgdm"): (0.03, 0.1),
    ("deepmlp", "adam"): (3e-4, 1.5e-3), ("deepmlp", "rmsprop"): (2e-4, 8e-4),
    ("deepmlp", "sgd"): (0.01, 0.04), ("deepmlp", "sgdm"): (1e-3, 4e-3),
    ("tabular", "adam"): (1e-3, 1e-2), ("tabular", "rmsprop"): (5e-4, 4e-3),
    ("tabular", "sgd"): (0.03, 0.2), ("tabular", "sgdm"): (0.005, 0.03),
    ("mse", "adam"): (1e-3, 5e-3), ("mse", "rmsprop"): (3e-4, 2e-3),
    ("mse", "sgd"): (0.01, 0.05), ("mse", "sgdm"): (1e-3, 5e-3),
}
_OPT_GROUP = {"sgd": "sgd", "sgdm": "sgdm", "nesterov": "sgdm", "adam": "adam", "adamw": "adam", "rmsprop": "rmsprop"}
_MIN_STEPS, _MID_STEPS, _MAX_STEPS = 300, 1200, 3000


# ------------------------------------------------------------------------------------ the plan


def draw_spec(kind: str, family: str, seed: int, index: int) -> RunSpec:
    """Draw one held-out run's configuration from ``(seed, kind, family, index)``."""
    rng = seeded_rng(seed, "heldout", kind, family, index)
    frng = seeded_rng(seed, "heldout", kind, family, index, "fault")
    run_seed = int(rng.integers(0, 2**31 - 1))
    long_run = rng.random() < 0.15
    steps = int(round(log_uniform(rng, _MID_STEPS, _MAX_STEPS) if long_run
                      else log_uniform(rng, _MIN_STEPS, _MID_STEPS)))
    lm = family in ("rnnlm", "tflm")
    if lm:      # the LMs cost 3..10 ms a step on the pinned kernels: shorter runs
        steps = int(round(log_uniform(rng, 300, 500)))
    optimizer = pick(rng, ("sgd", "sgdm", "nesterov", "adam", "adamw", "rmsprop"), (1, 1, 1, 2, 2, 1))
    if family in ("rnnlm", "tflm", "deepmlp") and optimizer == "sgd" and rng.random() < 0.5:
        optimizer = "adam"
    lr = log_uniform(rng, *_HLR[(family, _OPT_GROUP[optimizer])])
    weight_decay = log_uniform(rng, 1e-4, 3e-2) if optimizer == "adamw" else (
        0.0 if rng.random() < 0.6 else log_uniform(rng, 1e-5, 3e-4))
    schedule = pick(rng, ("constant", "cosine", "warmup_cosine", "step", "cosine_restarts"), (2, 2, 3, 2, 2))
    if family == "tflm" and schedule == "constant":
        schedule = "warmup_cosine"
    warmup = int(rng.uniform(0.02, 0.1) * steps) if schedule.startswith("warmup") else 0
    batch_size = int(pick(rng, (8, 16), (1, 2))) if lm else int(pick(rng, (8, 16, 32, 64, 128), (1, 2, 3, 2, 1)))
    if batch_size == 8 and kind == HEALTHY and rng.random() < 0.5:
        lr *= 1.5        # a hard healthy case: small batches at a high learning rate
    act = pick(rng, ("relu", "gelu", "tanh"), (3, 2, 1))
    arch: dict[str, Any]
    if family == "rnnlm":
        arch = {"cell": pick(rng, ("gru", "lstm")), "context": 16,
                "embed": 16, "hidden": int(pick(rng, (32, 48))),
                "layers": int(pick(rng, (1, 2), (3, 1))), "head": int(pick(rng, (48, 64)))}
    elif family == "tflm":
        arch = {"context": 16, "d_model": 32,
                "heads": int(pick(rng, (2, 4))), "blocks": int(pick(rng, (1, 2))),
                "ffn_act": "relu" if kind == "dead_units" and rng.random() < 0.5 else "gelu"}
    elif family == "deepmlp":
        tanh = kind == "vanishing_gradient" and rng.random() < 0.5
        arch = {"depth": int(rng.integers(10, 17)), "width": int(pick(rng, (32, 48, 64))),
                "activation": "tanh" if tanh else "relu",
                "init_scale": float(log_uniform(rng, 0.5, 0.8)) if kind == HEALTHY and rng.random() < 0.2 else 1.0}
        if tanh:
            optimizer = pick(rng, ("adam", "adamw", "rmsprop"))
            lr = log_uniform(rng, *_HLR[(family, _OPT_GROUP[optimizer])])
    elif family == "tabular":
        arch = {"dataset": pick(rng, ("wine", "breast_cancer", "synthetic"), (1, 1, 2)),
                "widths": [int(pick(rng, (32, 64, 128)))] * int(pick(rng, (1, 2, 3))),
                "activation": "relu" if kind == "dead_units" else act}
    else:
        task = pick(rng, ("autoencoder", "regression"))
        arch = {"task": task, "activation": "relu" if kind == "dead_units" else act,
                "widths": [int(pick(rng, (64, 96))), int(pick(rng, (8, 16)))] if task == "autoencoder"
                else [int(pick(rng, (32, 64)))] * int(pick(rng, (2, 3)))}
    augment = (0.0, float(pick(rng, (0.0, 0.05, 0.1)))) if family in ("deepmlp",) else (0.0, 0.0)
    val_every = int(pick(rng, (25, 50), (1, 1)))
    per_layer = pick(rng, ("module", "parameter"), (3, 2))
    clip = float(pick(rng, (1.0, 2.0, 5.0))) if rng.random() < 0.3 else 0.0
    onset = int(frng.uniform(0.3, 0.7) * steps) if kind != HEALTHY else -1
    fault: dict[str, Any] = {}
    adaptive = _OPT_GROUP[optimizer] in ("adam", "rmsprop")
    if kind == "divergence":
        lo, hi = (30.0, 1000.0) if adaptive else (20.0, 300.0)
        fault = {"lr_mult": log_uniform(frng, lo, hi), "ramp": int(pick(frng, (0, 0, 10, 30, 60)))}
    elif kind == "stall":
        onset = int(frng.uniform(0.2, 0.45) * steps)
        if frng.random() < 0.35:
            fault = {"freeze": True}
        else:
            fault = {"lr_mult": log_uniform(frng, 1e-6, 1e-3), "ramp": int(pick(frng, (0, 0, 5, 30)))}
        if schedule in ("constant", "step", "cosine_restarts"):
            schedule, warmup = "warmup_cosine", int(0.03 * steps)
        steps = max(steps, 500 if lm else 700)
        onset = int(frng.uniform(0.2, 0.45) * steps)
    elif kind == "oscillation":
        fault = {"lr_mult": "edge", "start": 2.0 if adaptive else 1.5, "factor": 1.4, "tries": 10}
        schedule, warmup = "constant", 0
    elif kind == "loss_spike":
        onset = int(frng.uniform(0.45, 0.8) * steps)
        mode = "labels" if family in ("rnnlm", "tflm") else pick(frng, ("labels", "inputs"))
        fault = {"n_bad": int(pick(frng, (1, 1, 2, 3))), "mode": mode, "scale": log_uniform(frng, 3.0, 20.0)}
    elif kind == "grad_explosion":
        if family in ("rnnlm", "tflm"):
            target = "head" if family == "rnnlm" else pick(frng, ("head", "ln_f"))
            fault = {"mode": "weights", "target": target, "scale": log_uniform(frng, 5.0, 100.0)}
        else:
            mode = pick(frng, ("weights", "inputs"))
            fault = {"mode": mode, "target": int(frng.integers(0, 2)), "scale": log_uniform(frng, 5.0, 100.0)}
    elif kind == "vanishing_gradient":
        depth = int(arch["depth"])
        k = int(frng.integers(3, 7))
        start = int(frng.integers(1, depth - k - 1))
        if arch["activation"] == "tanh":
            fault = {"mode": "saturate", "layers": list(range(start, start + k)),
                     "shift": log_uniform(frng, 3.0, 30.0)}
        else:
            fault = {"mode": "scale", "layers": list(range(start, start + k)), "scale": log_uniform(frng, 1e-3, 3e-2)}
    elif kind == "dead_units":
        frac = float(frng.uniform(0.6, 0.9)) if frng.random() < 0.25 else float(frng.uniform(0.9, 1.0))
        fault = {"layer": int(frng.integers(0, _n_dead_targets(family, arch))), "fraction": frac,
                 "bias": -log_uniform(frng, 10.0, 100.0)}
    elif kind == "silent_collapse":
        onset = int(frng.uniform(0.25, 0.7) * steps)
        fault = {"ramp": int(pick(frng, (1, 20, 60, 200)))}
        if schedule.startswith("warmup"):
            warmup = min(warmup, onset - 1)
    elif kind == "overfitting":
        onset = int(frng.uniform(0.2, 0.4) * steps)
        steps = max(steps, 600 if lm else 900)
        onset = int(frng.uniform(0.2, 0.4) * steps)
        fault = {"n_examples": int(pick(frng, (200, 400, 800))) if family in ("rnnlm", "tflm")
                 else int(pick(frng, (16, 24, 32, 48)))}
        augment = (0.0, 0.0)
        val_every = 25
    return RunSpec(
        name=f"{kind}-{family}-{index}", kind=kind, family=family, seed=run_seed, steps=steps,
        optimizer=optimizer, lr=lr, weight_decay=weight_decay, schedule=schedule, warmup=warmup,
        batch_size=batch_size, arch=arch, augment=augment, val_every=val_every,
        val_at_zero=bool(rng.random() < 0.3), per_layer=per_layer, clip=clip, onset=onset, fault=fault,
    )


def _n_dead_targets(family: str, arch: Mapping[str, Any]) -> int:
    if family == "rnnlm":
        return 1
    if family in ("tflm", "vit"):
        return int(arch["blocks"])
    if family == "resnet":
        return 1 + int(arch["blocks"])
    if family == "deepmlp":
        return int(arch["depth"])
    return len(arch["widths"])


#: Held-out kinds planned more often (their injections pass their checks less often).
HELDOUT_OVERSAMPLE: dict[str, float] = {"oscillation": 1.5, "silent_collapse": 1.5}


def plan_heldout(seed: int = 1000, per_kind: int = 7, n_healthy: int = 40) -> list[RunSpec]:
    """The held-out runs: ``per_kind`` runs per fault kind (times :data:`HELDOUT_OVERSAMPLE`),
    families rotating within a kind, then ``n_healthy`` healthy runs over every family.
    """
    out = []
    plan = [(k, int(round(per_kind * HELDOUT_OVERSAMPLE.get(k, 1.0)))) for k in FAULT_KINDS] + [(HEALTHY, n_healthy)]
    for kind, count in plan:
        fams = HELDOUT_FAULT_FAMILIES.get(kind, HELDOUT_FAMILIES)
        for i in range(count):
            out.append(draw_spec(kind, fams[i % len(fams)], int(seed), i))
    return out


# ------------------------------------------------------------------------------------ the development plan


DEV_FAMILIES: tuple[str, ...] = ("resnet", "vit", "linear")
"""The development suite's model families (``datasets/real_dev``): tuning data that is neither a
family of ``datasets/real`` nor a held-out one."""

_DEV = DEV_FAMILIES
DEV_FAULT_FAMILIES: dict[str, tuple[str, ...]] = {
    "divergence": _DEV,
    "stall": _DEV,
    "oscillation": ("linear", "vit"),
    "loss_spike": _DEV,
    "grad_explosion": _DEV,
    "vanishing_gradient": ("resnet",),
    "dead_units": _DEV,
    "silent_collapse": _DEV,
    "overfitting": _DEV,
}
"""Which development families each fault is injected into: vanishing gradients need depth (the
residual net's branches scaled down), dead units a ReLU/GELU layer (every family draws one for
them)."""

DEV_OPTIMIZERS: tuple[str, ...] = ("sgd", "sgdm", "nesterov", "adam", "adamw", "rmsprop", "adagrad", "nadam",
                                   "adamax")
"""The development families' optimizers: the held-out set plus Adagrad, NAdam and Adamax (used in
no other suite)."""

#: Development kinds planned more often (their injections pass their checks less often: in the
#: first build of 87 runs 1 of 8 oscillations, 1 of 5 gradient explosions, 1 of 8 silent collapses,
#: 2 of 5 vanishing gradients and 3 of 5 dead-unit runs were kept).
DEV_OVERSAMPLE: dict[str, float] = {"oscillation": 2.0, "grad_explosion": 2.0, "silent_collapse": 2.0,
                                    "vanishing_gradient": 1.6, "dead_units": 1.6}

#: Healthy peak learning rates per (development family, optimizer group).
_DLR: dict[tuple[str, str], tuple[float, float]] = {
    ("resnet", "sgd"): (0.03, 0.2), ("resnet", "sgdm"): (5e-3, 3e-2), ("resnet", "adam"): (1e-3, 5e-3),
    ("resnet", "rmsprop"): (3e-4, 2e-3), ("resnet", "adagrad"): (1e-2, 5e-2), ("resnet", "adamax"): (2e-3, 1e-2),
    ("vit", "sgd"): (0.03, 0.2), ("vit", "sgdm"): (3e-3, 1.5e-2), ("vit", "adam"): (5e-4, 3e-3),
    ("vit", "rmsprop"): (5e-4, 2e-3), ("vit", "adagrad"): (5e-3, 3e-2), ("vit", "adamax"): (1e-3, 6e-3),
    ("linear", "sgd"): (0.03, 0.3), ("linear", "sgdm"): (3e-3, 3e-2), ("linear", "adam"): (1e-3, 1e-2),
    ("linear", "rmsprop"): (3e-4, 3e-3), ("linear", "adagrad"): (1e-2, 1e-1), ("linear", "adamax"): (2e-3, 2e-2),
}
_DEV_GROUP = {**_OPT_GROUP, "nadam": "adam", "adagrad": "adagrad", "adamax": "adamax"}
#: Validation images of the residual net and the transformer (the rest of the 25 % split is unused).
_DEV_VAL = 256
#: The ``late_step`` schedule's drop: x0.1 from this fraction of the run on.
_LATE_DROP = 0.85


def draw_dev_spec(kind: str, family: str, seed: int, index: int) -> RunSpec:
    """Draw one development run's configuration from ``(seed, kind, family, index)``.

    Drawn as :func:`draw_spec` draws a held-out run (from its own seeded streams), with the
    optimizers of :data:`DEV_OPTIMIZERS` and a ``late_step`` schedule besides the held-out ones.

    Raises:
        ValueError: ``family`` is not one of :data:`DEV_FAMILIES`.
    """
    if family not in DEV_FAMILIES:
        raise ValueError(f"family must be one of {DEV_FAMILIES}, got {family!r}")
    rng = seeded_rng(seed, "dev", kind, family, index)
    frng = seeded_rng(seed, "dev", kind, family, index, "fault")
    run_seed = int(rng.integers(0, 2**31 - 1))
    long_run = rng.random() < 0.15
    steps = int(round(log_uniform(rng, _MID_STEPS, _MAX_STEPS) if long_run
                      else log_uniform(rng, _MIN_STEPS, _MID_STEPS)))
    if family in ("resnet", "vit"):     # 5..20 ms a step on the pinned kernels: shorter runs
        steps = min(steps, int(round(log_uniform(rng, _MIN_STEPS, 700))))
    optimizer = pick(rng, DEV_OPTIMIZERS, (1, 1, 1, 2, 2, 1, 1, 1, 1))
    group = _DEV_GROUP[optimizer]
    lr = log_uniform(rng, *_DLR[(family, group)])
    weight_decay = log_uniform(rng, 1e-4, 3e-2) if optimizer == "adamw" else (
        0.0 if rng.random() < 0.6 else log_uniform(rng, 1e-5, 3e-4))
    schedule = pick(rng, ("constant", "cosine", "warmup_cosine", "step", "cosine_restarts", "late_step"),
                    (2, 2, 3, 2, 2, 1))
    if family == "vit" and schedule == "constant":
        schedule = "warmup_cosine"
    warmup = int(rng.uniform(0.02, 0.1) * steps) if schedule.startswith("warmup") else 0
    batch_size = int(pick(rng, (8, 16, 32, 64, 128), (1, 2, 3, 2, 1)))
    if batch_size == 8 and kind == HEALTHY and rng.random() < 0.5:
        lr *= 1.5        # a hard healthy case: small batches at a high learning rate
    # a hard healthy case: an initial plateau (escaped in the run's length by the adaptive optimizers)
    small_init = kind == HEALTHY and rng.random() < 0.2 and group in ("adam", "rmsprop", "adamax")
    act = pick(rng, ("relu", "gelu", "tanh"), (3, 2, 1))
    arch: dict[str, Any]
    if family == "resnet":
        norm = pick(rng, ("batch", "group"), (2, 1))
        arch = {"channels": int(pick(rng, (8, 12))), "norm": norm,
                "blocks": int(rng.integers(3, 5)) if kind == "vanishing_gradient" else int(rng.integers(2, 4))}
        if norm == "group":
            arch["groups"] = int(pick(rng, (2, 4)))
    elif family == "vit":
        arch = {"patch": int(pick(rng, (2, 4), (1, 3))), "d_model": 32, "heads": int(pick(rng, (2, 4))),
                "blocks": int(pick(rng, (1, 2))), "pool": pick(rng, ("mean", "cls")),
                "ffn_act": "relu" if kind == "dead_units" and rng.random() < 0.5 else "gelu"}
        if small_init:
            arch["init_scale"] = float(log_uniform(rng, 0.05, 0.3))
    else:
        dataset = "digits" if kind == "overfitting" else pick(rng, ("digits", "iris"), (3, 2))
        hidden = kind == "dead_units" or rng.random() < 0.6
        arch = {"dataset": dataset, "widths": [int(pick(rng, (256, 512, 1024)))] if hidden else [],
                "activation": pick(rng, ("relu", "gelu")) if kind == "dead_units" else act,
                "label_smoothing": float(pick(rng, (0.05, 0.1))) if rng.random() < 0.25 and dataset == "digits" else 0.0}
        if small_init and hidden:
            arch["init_scale"] = float(log_uniform(rng, 0.05, 0.3))
    if family in ("resnet", "vit"):     # the portable kernels' cost grows with batch x channels (x tokens)
        wide = arch.get("channels") == 12 if family == "resnet" else arch["patch"] == 2
        batch_size = min(batch_size, 16 if wide else 32)
    augment = (0.0, float(pick(rng, (0.0, 0.05, 0.1)))) if family in ("resnet", "vit") else (0.0, 0.0)
    val_every = int(pick(rng, (25, 50), (1, 1)))
    per_layer = pick(rng, ("module", "parameter"), (3, 2))
    clip = float(pick(rng, (1.0, 2.0, 5.0))) if rng.random() < 0.3 else 0.0
    onset = int(frng.uniform(0.3, 0.7) * steps) if kind != HEALTHY else -1
    fault: dict[str, Any] = {}
    adaptive = group in ("adam", "rmsprop", "adagrad", "adamax")
    if kind == "divergence":
        lo, hi = (30.0, 1000.0) if adaptive else (20.0, 300.0)
        fault = {"lr_mult": log_uniform(frng, lo, hi), "ramp": int(pick(frng, (0, 0, 10, 30, 60)))}
    elif kind == "stall":
        if frng.random() < 0.35:
            fault = {"freeze": True}
        else:
            fault = {"lr_mult": log_uniform(frng, 1e-6, 1e-3), "ramp": int(pick(frng, (0, 0, 5, 30)))}
        if schedule in ("constant", "step", "cosine_restarts", "late_step"):
            schedule, warmup = "warmup_cosine", int(0.03 * steps)
        steps = max(steps, 700)
        onset = int(frng.uniform(0.2, 0.45) * steps)
    elif kind == "oscillation":
        fault = {"lr_mult": "edge", "start": 2.0 if adaptive else 1.5, "factor": 1.4, "tries": 10}
        schedule, warmup = "constant", 0
    elif kind == "loss_spike":
        onset = int(frng.uniform(0.45, 0.8) * steps)
        # a normalised net (batch/group/layer norm) undoes an input scaling: random labels there
        mode = pick(frng, ("labels", "inputs")) if family == "linear" else "labels"
        fault = {"n_bad": int(pick(frng, (1, 1, 2, 3))), "mode": mode, "scale": log_uniform(frng, 3.0, 20.0)}
    elif kind == "grad_explosion":
        if family == "linear":
            fault = {"mode": pick(frng, ("weights", "inputs")), "target": int(frng.integers(0, len(arch["widths"]) + 1)),
                     "scale": log_uniform(frng, 5.0, 100.0)}
        else:       # the head, or the gain of the first norm (the residual stream's / the final LayerNorm's)
            target = pick(frng, ("head", "stem_norm" if family == "resnet" else "ln_f"))
            fault = {"mode": "weights", "target": target, "scale": log_uniform(frng, 5.0, 100.0)}
    elif kind == "vanishing_gradient":
        blocks = int(arch["blocks"])
        k = int(frng.integers(2, blocks + 1))
        start = int(frng.integers(0, blocks - k + 1))
        # a normalised residual branch regrows its gains within tens of steps: only a deep cut shows
        fault = {"mode": "gain", "blocks": list(range(start, start + k)), "scale": log_uniform(frng, 1e-5, 1e-3)}
    elif kind == "dead_units":
        frac = float(frng.uniform(0.6, 0.9)) if frng.random() < 0.25 else float(frng.uniform(0.9, 1.0))
        fault = {"layer": int(frng.integers(0, _n_dead_targets(family, arch))), "fraction": frac,
                 "bias": -log_uniform(frng, 10.0, 100.0)}
    elif kind == "silent_collapse":
        onset = int(frng.uniform(0.25, 0.7) * steps)
        fault = {"ramp": int(pick(frng, (1, 20, 60, 200)))}
        if schedule.startswith("warmup"):
            warmup = min(warmup, onset - 1)
    elif kind == "overfitting":
        steps = max(steps, 900)
        onset = int(frng.uniform(0.2, 0.4) * steps)
        fault = {"n_examples": int(pick(frng, (16, 24, 32, 48)))}
        augment = (0.0, 0.0)
        val_every = 25
    return RunSpec(
        name=f"{kind}-{family}-{index}", kind=kind, family=family, seed=run_seed, steps=steps,
        optimizer=optimizer, lr=lr, weight_decay=weight_decay, schedule=schedule, warmup=warmup,
        batch_size=batch_size, arch=arch, augment=augment, val_every=val_every,
        val_at_zero=bool(rng.random() < 0.3), per_layer=per_layer, clip=clip, onset=onset, fault=fault,
    )


def plan_dev(seed: int = 2000, per_kind: int = 5, n_healthy: int = 36) -> list[RunSpec]:
    """The development runs: ``per_kind`` runs per fault kind (times :data:`DEV_OVERSAMPLE`),
    families rotating within a kind (:data:`DEV_FAULT_FAMILIES`), then ``n_healthy`` healthy runs
    over every family.

    Raises:
        ValueError: ``per_kind`` or ``n_healthy`` is negative.
    """
    for name, v in (("per_kind", per_kind), ("n_healthy", n_healthy)):
        if v < 0:
            raise ValueError(f"{name} must be >= 0, got {v!r}")
    out = []
    plan = [(k, int(round(per_kind * DEV_OVERSAMPLE.get(k, 1.0)))) for k in FAULT_KINDS] + [(HEALTHY, n_healthy)]
    for kind, count in plan:
        fams = DEV_FAULT_FAMILIES.get(kind, DEV_FAMILIES)
        for i in range(count):
            out.append(draw_dev_spec(kind, fams[i % len(fams)], int(seed), i))
    return out


def lr_factor(spec: Any, t: int) -> float:
    """The schedule's multiplier at step ``t``: :func:`~trainsignals.curves.training.schedule_factor`
    plus ``cosine_restarts`` (cosine cycles of a quarter of the run, each restarting at the peak)
    and ``late_step`` (constant, then x0.1 for the last 15 % of the run: a late drop of the loss).
    """
    if spec.schedule == "late_step":
        return 1.0 if t < int(_LATE_DROP * spec.steps) else 0.1
    if spec.schedule == "cosine_restarts":
        period = max(spec.steps // 4, 1)
        s = (t % period) / period
        return 0.02 + 0.98 * 0.5 * (1.0 + math.cos(math.pi * s))
    return schedule_factor(spec, t)


# ------------------------------------------------------------------------------------ data


_CACHE: dict[str, Any] = {}


def _tabular(name: str) -> tuple[np.ndarray, np.ndarray]:
    if name not in _CACHE:
        from sklearn import datasets

        if name == "wine":
            X, y = datasets.load_wine(return_X_y=True)
        elif name == "breast_cancer":
            X, y = datasets.load_breast_cancer(return_X_y=True)
        elif name == "iris":
            X, y = datasets.load_iris(return_X_y=True)
        elif name == "synthetic":
            X, y = datasets.make_classification(n_samples=2000, n_features=20, n_informative=10, n_redundant=4,
                                                n_classes=4, n_clusters_per_class=2, flip_y=0.03, random_state=0)
        elif name == "regression":
            X, y = datasets.make_regression(n_samples=2000, n_features=20, n_informative=12, noise=10.0,
                                            random_state=0)
            y = np.tanh(y / 150.0) * 3.0 + 0.3 * np.sin(X[:, 0] * 2.0)    # a nonlinear target
        else:
            raise ValueError(name)
        _CACHE[name] = (np.asarray(X, dtype=np.float64), np.asarray(y))
    return _CACHE[name]  # type: ignore[no-any-return]


class HeldoutData:
    """Train/validation tensors and a seeded batch sampler for one held-out run.

    ``gen`` draws the batches, ``fgen`` the fault's randomness (random labels, the collapse
    ramp, the overfitting subset), so that a counterfactual twin sees the same batches.
    """

    def __init__(self, spec: Any, torch: Any) -> None:
        self.torch = torch
        self.spec = spec
        rng = np.random.default_rng(spec.seed)
        self.gen = torch.Generator().manual_seed(spec.seed)
        self.fgen = torch.Generator().manual_seed(spec.seed + 1)
        self.lm = spec.family in ("rnnlm", "tflm")
        self.regression = spec.family == "mse"
        self.subset: Any = None
        if self.lm:
            text = corpus()
            vocab = sorted(set(text))
            self.n_classes = len(vocab)
            lut = np.zeros(128, dtype=np.int64)
            lut[[ord(ch) for ch in vocab]] = np.arange(len(vocab))
            ids = lut[np.frombuffer(text.encode("ascii"), dtype=np.uint8)]
            self.ctx = int(spec.arch["context"])
            split = int(0.9 * len(ids))
            self.ids = torch.tensor(ids)
            self.n_train = split - self.ctx - 1
            val_pos = np.sort(rng.choice(np.arange(split, len(ids) - self.ctx - 1), size=64, replace=False))
            self.x_val, self.y_val = self._windows(torch.tensor(val_pos))
            self.majority = int(np.bincount(ids[:split]).argmax())
            return
        if spec.family in ("deepmlp", "resnet", "vit") or (self.regression and spec.arch["task"] == "autoencoder") \
                or (spec.family == "linear" and spec.arch["dataset"] == "digits"):
            X, y = digits()
            X = np.asarray(X, dtype=np.float64)
        elif self.regression:
            X, y = _tabular("regression")
        else:
            X, y = _tabular(spec.arch["dataset"])
        perm = rng.permutation(len(X))
        n_train = int(0.75 * len(X))
        tr, va = perm[:n_train], perm[n_train:]
        if spec.family in ("resnet", "vit"):       # their forward pass is the costly one: 256 validation images
            va = va[:_DEV_VAL]
        mean, sd = X[tr].mean(axis=0), X[tr].std(axis=0)
        sd[sd == 0] = 1.0
        Xs = ((X - mean) / sd).astype(np.float32)
        if self.regression:
            if spec.arch["task"] == "autoencoder":
                Y = Xs
            else:
                ym, ys = y[tr].mean(), y[tr].std()
                Y = ((y - ym) / ys).astype(np.float32)[:, None]
            self.y_train = torch.tensor(Y[tr])
            self.y_val = torch.tensor(Y[va])
            self.majority_target = self.y_train.mean(dim=0)
            self.n_classes = int(Y.shape[1])
        else:
            self.y_train = torch.tensor(np.asarray(y[tr], dtype=np.int64))
            self.y_val = torch.tensor(np.asarray(y[va], dtype=np.int64))
            self.n_classes = int(np.max(y)) + 1
            self.majority = int(np.bincount(np.asarray(y[tr], dtype=np.int64)).argmax())
        self.x_train = torch.tensor(Xs[tr])
        self.x_val = torch.tensor(Xs[va])
        self.n_in = int(Xs.shape[1])
        self.n_train = n_train

    def _windows(self, pos: Any) -> tuple[Any, Any]:
        offs = self.torch.arange(0, self.ctx)
        w = self.ids[pos[:, None] + offs[None, :]]
        return w, self.ids[pos[:, None] + offs[None, :] + 1]

    def restrict(self, n: int) -> None:
        """From now on, batches come from ``n`` fixed examples (LMs: an ``n``-character snippet)."""
        torch = self.torch
        if self.lm:
            start = int(torch.randint(0, self.n_train - n, (1,), generator=self.fgen))
            self.subset = torch.arange(start, start + max(n - self.ctx, 1))
        else:
            self.subset = torch.randperm(self.n_train, generator=self.fgen)[:n]

    def batch(self) -> tuple[Any, Any]:
        torch = self.torch
        b = self.spec.batch_size
        if self.subset is not None:
            idx = self.subset[torch.randint(0, len(self.subset), (b,), generator=self.gen)]
        else:
            idx = torch.randint(0, self.n_train, (b,), generator=self.gen)
        if self.lm:
            return self._windows(idx)
        x = self.x_train[idx]
        noise = self.spec.augment[1]
        if noise > 0:
            x = x + noise * torch.randn(x.shape, generator=self.gen)
        return x, self.y_train[idx]


# ------------------------------------------------------------------------------------ models


def build_model(spec: Any, data: HeldoutData, torch: Any) -> Any:
    """The held-out family's model (seeded by the caller's ``torch.manual_seed``)."""
    nn = torch.nn
    acts = {"relu": nn.ReLU, "gelu": nn.GELU, "tanh": nn.Tanh}
    a = spec.arch
    if spec.family == "rnnlm":
        return _RNNLM(data.n_classes, a, nn)
    if spec.family == "tflm":
        return _TFLM(data.n_classes, a, nn, torch)
    if spec.family == "resnet":
        return _ResNet(data.n_classes, a, nn)
    if spec.family == "vit":
        return _init_scaled(_ViT(data.n_classes, a, nn, torch), a, torch)
    from collections import OrderedDict

    layers: OrderedDict[str, Any] = OrderedDict()
    if spec.family == "deepmlp":
        widths = [int(a["width"])] * int(a["depth"])
        act_name = a["activation"]
    else:
        widths, act_name = list(a["widths"]), a["activation"]
    prev = data.n_in
    for i, w in enumerate(widths):
        layers[f"fc{i + 1}"] = nn.Linear(prev, w)
        layers[f"{act_name}{i + 1}"] = acts[act_name]()
        prev = w
    layers["out"] = nn.Linear(prev, data.n_classes)
    model = nn.Sequential(layers)
    if spec.family == "deepmlp":
        for m in model.modules():
            if isinstance(m, nn.Linear):
                if act_name == "relu":
                    nn.init.kaiming_normal_(m.weight, nonlinearity="relu")
                else:
                    nn.init.xavier_uniform_(m.weight)
                nn.init.zeros_(m.bias)
        scale = float(a.get("init_scale", 1.0))
        if scale != 1.0:
            with torch.no_grad():
                for m in model.modules():
                    if isinstance(m, nn.Linear):
                        m.weight.mul_(scale)
    if spec.family == "linear":
        return _init_scaled(model, a, torch)
    return model


def _init_scaled(model: Any, a: Mapping[str, Any], torch: Any) -> Any:
    """``model`` with its linear weights times ``a["init_scale"]`` (when given): a small init, an
    initial plateau the run escapes.
    """
    scale = float(a.get("init_scale", 1.0))
    if scale != 1.0:
        with torch.no_grad():
            for m in model.modules():
                if isinstance(m, torch.nn.Linear):
                    m.weight.mul_(scale)
    return model


def _rnn_classes(nn: Any) -> tuple[type, type]:
    class RNNLM(nn.Module):  # type: ignore[misc,name-defined]
        def __init__(self, vocab: int, a: Mapping[str, Any]) -> None:
            super().__init__()
            cell = nn.GRU if a["cell"] == "gru" else nn.LSTM
            self.embed = nn.Embedding(vocab, int(a["embed"]))
            self.rnn = cell(int(a["embed"]), int(a["hidden"]), num_layers=int(a["layers"]), batch_first=True)
            self.proj = nn.Linear(int(a["hidden"]), int(a["head"]))
            self.relu = nn.ReLU()
            self.head = nn.Linear(int(a["head"]), vocab)

        def forward(self, x: Any) -> Any:
            h, _ = self.rnn(self.embed(x))
            return self.head(self.relu(self.proj(h)))

    class Block(nn.Module):  # type: ignore[misc,name-defined]
        def __init__(self, d: int, heads: int, act: str, causal: bool = True) -> None:
            super().__init__()
            self.heads = heads
            self.causal = causal
            self.ln1 = nn.LayerNorm(d)
            self.qkv = nn.Linear(d, 3 * d)
            self.attn_out = nn.Linear(d, d)
            self.ln2 = nn.LayerNorm(d)
            self.ffn_in = nn.Linear(d, 4 * d)
            self.act = nn.GELU() if act == "gelu" else nn.ReLU()
            self.ffn_out = nn.Linear(4 * d, d)

        def forward(self, x: Any) -> Any:
            import torch

            b, t, d = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
            hd = d // self.heads
            q, k, v = (z.reshape(b, t, self.heads, hd).transpose(1, 2) for z in (q, k, v))
            att = (q @ k.transpose(-2, -1)) / math.sqrt(hd)
            if self.causal:
                mask = torch.ones(t, t, dtype=torch.bool).triu(1)
                att = att.masked_fill(mask, float("-inf"))
            att = att.softmax(dim=-1)
            y = (att @ v).transpose(1, 2).reshape(b, t, d)
            x = x + self.attn_out(y)
            return x + self.ffn_out(self.act(self.ffn_in(self.ln2(x))))

    return RNNLM, Block


def _RNNLM(vocab: int, a: Mapping[str, Any], nn: Any) -> Any:
    return _rnn_classes(nn)[0](vocab, a)


def _TFLM(vocab: int, a: Mapping[str, Any], nn: Any, torch: Any) -> Any:
    Block = _rnn_classes(nn)[1]

    class TFLM(nn.Module):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            super().__init__()
            d = int(a["d_model"])
            self.tok = nn.Embedding(vocab, d)
            self.pos = nn.Embedding(int(a["context"]), d)
            self.blocks = nn.ModuleList([Block(d, int(a["heads"]), a["ffn_act"]) for _ in range(int(a["blocks"]))])
            self.ln_f = nn.LayerNorm(d)
            self.head = nn.Linear(d, vocab)

        def forward(self, x: Any) -> Any:
            h = self.tok(x) + self.pos(torch.arange(x.shape[1]))[None]
            for blk in self.blocks:
                h = blk(h)
            return self.head(self.ln_f(h))

    return TFLM()


def _ResNet(n_classes: int, a: Mapping[str, Any], nn: Any) -> Any:
    c = int(a["channels"])

    def norm() -> Any:
        return nn.BatchNorm2d(c) if a["norm"] == "batch" else nn.GroupNorm(int(a["groups"]), c)

    class ResBlock(nn.Module):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
            self.norm1 = norm()
            self.relu1 = nn.ReLU()
            self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
            self.norm2 = norm()
            self.relu2 = nn.ReLU()

        def forward(self, x: Any) -> Any:
            h = self.relu1(self.norm1(self.conv1(x)))
            return self.relu2(x + self.norm2(self.conv2(h)))

    class ResNet(nn.Module):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.stem = nn.Conv2d(1, c, 3, stride=2, padding=1, bias=False)     # 8x8 -> 4x4
            self.stem_norm = norm()
            self.stem_relu = nn.ReLU()
            self.blocks = nn.ModuleList([ResBlock() for _ in range(int(a["blocks"]))])
            self.head = nn.Linear(c, n_classes)

        def forward(self, x: Any) -> Any:
            h = self.stem_relu(self.stem_norm(self.stem(x.reshape(-1, 1, 8, 8))))
            for blk in self.blocks:
                h = blk(h)
            return self.head(h.mean(dim=(2, 3)))      # global average pooling

    return ResNet()


def _ViT(n_classes: int, a: Mapping[str, Any], nn: Any, torch: Any) -> Any:
    Block = _rnn_classes(nn)[1]
    p, d = int(a["patch"]), int(a["d_model"])
    g = 8 // p
    cls = a["pool"] == "cls"

    class ViT(nn.Module):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Linear(p * p, d)
            self.cls = nn.Embedding(1, d) if cls else None
            self.pos = nn.Embedding(g * g + int(cls), d)
            self.blocks = nn.ModuleList([Block(d, int(a["heads"]), a["ffn_act"], causal=False)
                                         for _ in range(int(a["blocks"]))])
            self.ln_f = nn.LayerNorm(d)
            self.head = nn.Linear(d, n_classes)

        def forward(self, x: Any) -> Any:
            b = x.shape[0]
            patches = x.reshape(b, g, p, g, p).permute(0, 1, 3, 2, 4).reshape(b, g * g, p * p)
            h = self.embed(patches)
            if self.cls is not None:
                h = torch.cat([self.cls.weight[None].expand(b, -1, -1), h], dim=1)
            h = h + self.pos.weight[None]
            for blk in self.blocks:
                h = blk(h)
            h = self.ln_f(h)
            return self.head(h[:, 0] if self.cls is not None else h.mean(dim=1))

    return ViT()


def _linears(model: Any, torch: Any) -> list[Any]:
    return [m for m in model if isinstance(m, torch.nn.Linear)]


def build_optimizer(spec: Any, model: Any, torch: Any) -> Any:
    params = model.parameters()
    o = spec.optimizer
    if o == "adamw":
        return torch.optim.AdamW(params, lr=spec.lr, weight_decay=spec.weight_decay)
    if o == "adam":
        return torch.optim.Adam(params, lr=spec.lr, weight_decay=spec.weight_decay)
    if o == "rmsprop":
        return torch.optim.RMSprop(params, lr=spec.lr, alpha=0.99, weight_decay=spec.weight_decay)
    if o == "adagrad":
        return torch.optim.Adagrad(params, lr=spec.lr, weight_decay=spec.weight_decay)
    if o == "nadam":
        return torch.optim.NAdam(params, lr=spec.lr, weight_decay=spec.weight_decay)
    if o == "adamax":
        return torch.optim.Adamax(params, lr=spec.lr, weight_decay=spec.weight_decay)
    momentum = 0.9 if o in ("sgdm", "nesterov") else 0.0
    return torch.optim.SGD(params, lr=spec.lr, momentum=momentum, nesterov=o == "nesterov",
                           weight_decay=spec.weight_decay)


def loss_of(spec: Any, out: Any, y: Any, torch: Any) -> Any:
    F = torch.nn.functional
    if spec.family == "mse":
        return F.mse_loss(out, y)
    if spec.family in ("rnnlm", "tflm"):
        return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
    smoothing = float(spec.arch.get("label_smoothing", 0.0))
    if smoothing > 0:
        return F.cross_entropy(out, y, label_smoothing=smoothing)
    return F.cross_entropy(out, y)


# ------------------------------------------------------------------------------------ faults


def inject_weights(spec: Any, model: Any, torch: Any) -> None:
    """The faults that change the weights, applied once at the onset."""
    f, k = spec.fault, spec.kind
    with torch.no_grad():
        if k == "grad_explosion" and f["mode"] == "weights":
            if spec.family in ("rnnlm", "tflm", "resnet", "vit"):
                getattr(model, f["target"]).weight.mul_(f["scale"])
            else:
                _linears(model, torch)[int(f["target"])].weight.mul_(f["scale"])
        elif k == "vanishing_gradient" and f["mode"] == "gain":   # a residual branch's norm gains, scaled down
            for i in f["blocks"]:
                model.blocks[int(i)].norm1.weight.mul_(f["scale"])
                model.blocks[int(i)].norm2.weight.mul_(f["scale"])
        elif k == "vanishing_gradient":
            layers = _linears(model, torch)
            for i in f["layers"]:
                if f["mode"] == "scale":
                    layers[i].weight.mul_(f["scale"])
                else:       # saturate the tanh units: every pre-activation pushed far from 0
                    layers[i].bias.add_(f["shift"])
        elif k == "dead_units":
            if spec.family == "rnnlm":
                layer = model.proj
            elif spec.family in ("tflm", "vit"):
                layer = model.blocks[int(f["layer"])].ffn_in
            elif spec.family == "resnet":     # the norm before a ReLU: its shift pushes the units below 0
                i = int(f["layer"])
                layer = model.stem_norm if i == 0 else model.blocks[i - 1].norm1
            else:
                layer = _linears(model, torch)[int(f["layer"])]
            n = layer.bias.shape[0]
            cnt = max(1, int(round(f["fraction"] * n)))
            idx = torch.randperm(n, generator=torch.Generator().manual_seed(spec.seed))[:cnt]
            layer.bias[idx] = f["bias"]


def corrupt(spec: Any, data: HeldoutData, x: Any, y: Any, t: int, torch: Any) -> tuple[Any, Any]:
    """The faults that change a batch at step ``t`` (their randomness from ``data.fgen``)."""
    f, k = spec.fault, spec.kind
    if spec.onset < 0 or t < spec.onset:
        return x, y
    if k == "loss_spike" and t < spec.onset + int(f["n_bad"]):
        if f["mode"] == "inputs":
            return x * f["scale"], y
        if data.lm:
            return (torch.randint(0, data.n_classes, x.shape, generator=data.fgen),
                    torch.randint(0, data.n_classes, y.shape, generator=data.fgen))
        if data.regression:
            return x, y + f["scale"] * torch.randn(y.shape, generator=data.fgen)
        return x, torch.randint(0, data.n_classes, y.shape, generator=data.fgen)
    if k == "grad_explosion" and f["mode"] == "inputs":
        return x * f["scale"], y
    if k == "silent_collapse":
        p = min(1.0, (t - spec.onset + 1) / max(int(f["ramp"]), 1))
        shape = y.shape[:1] if data.regression else y.shape
        hit = torch.rand(shape, generator=data.fgen) < p
        if data.regression:
            return x, torch.where(hit[:, None], data.majority_target.expand_as(y), y)
        return x, torch.where(hit, torch.full_like(y, data.majority), y)
    return x, y


# ------------------------------------------------------------------------------------ training


#: this module's families' schedule, faults and loss, for :func:`~trainsignals.curves.training.train_step`
STEP_KIT = StepKit(lr_factor, inject_weights, corrupt, loss_of)


class _Ctx:
    def __init__(self, spec: Any, torch: Any) -> None:
        self.spec, self.torch = spec, torch
        torch.manual_seed(spec.seed)
        self.data = HeldoutData(spec, torch)
        self.model = build_model(spec, self.data, torch)
        self.opt = build_optimizer(spec, self.model, torch)

    def fork(self) -> _Ctx:
        """A copy of the model and optimizer (no hooks), sharing the data (its generators'
        states must be saved and restored by the caller).
        """
        other = copy.copy(self)
        other.model = build_model(self.spec, self.data, self.torch)
        other.model.load_state_dict(self.model.state_dict())
        other.opt = build_optimizer(self.spec, other.model, self.torch)
        other.opt.load_state_dict(copy.deepcopy(self.opt.state_dict()))
        return other

    def step(self, t: int, *, fault: bool, mult: float | None, watcher: Any = None) -> float:
        return train_step(STEP_KIT, self.spec, self.model, self.opt, self.data, t, self.torch, fault=fault, mult=mult,
                          watcher=watcher)


def _states(ctx: _Ctx) -> tuple[Any, Any, Any]:
    return ctx.torch.get_rng_state(), ctx.data.gen.get_state(), ctx.data.fgen.get_state()


def _restore(ctx: _Ctx, s: tuple[Any, Any, Any]) -> None:
    ctx.torch.set_rng_state(s[0])
    ctx.data.gen.set_state(s[1])
    ctx.data.fgen.set_state(s[2])


def twin_length(spec: Any) -> int:
    """Steps the counterfactual twin runs from the onset: the kind's window (plus 10), at most
    to the end of the run.
    """
    return min(spec.steps - spec.onset, default_window(spec.kind, spec.steps) + 10)


def record_twin(spec: Any, model: Any, opt: Any, step: Callable[[int, Any], Any]) -> dict[str, Any]:
    """The counterfactual twin's trace: ``step(t, watcher)`` for the :func:`twin_length` steps from
    ``spec.onset``, on ``model`` and ``opt`` (a copy of the run at its onset) watched by a recorder
    of their own. The caller saves and restores the batch sampler's and the global RNG's states.
    """
    n = twin_length(spec)
    watcher, collector = watch(model, opt, spec)
    try:
        for t in range(spec.onset, spec.onset + n):
            step(t, watcher)
    finally:
        watcher.close()
    rows = collector.rows
    lgn = np.array([r[2][0] if r[2] is not None else np.full(len(watcher.layer_names), np.nan) for r in rows],
                   dtype=np.float64)
    acts = [r[3] for r in rows if r[3] is not None]
    return {
        "start": spec.onset,
        "loss": np.array([r[1].get("loss", math.nan) for r in rows]),
        "grad_norm": np.array([r[1].get("grad_norm", math.nan) for r in rows]),
        "lr": np.array([r[1].get("lr", math.nan) for r in rows]),
        "update_ratio": np.array([r[1].get("update_ratio", math.nan) for r in rows]),
        "layer_grad_norms": lgn.reshape(len(rows), len(watcher.layer_names)),
        "val_steps": np.array([spec.onset + r[0] for r in rows if "val_loss" in r[1]], dtype=np.int64),
        "val_loss": np.array([r[1]["val_loss"] for r in rows if "val_loss" in r[1]]),
        "dead_frac": np.array([a[0][0] for a in acts]).reshape(len(acts), -1) if acts else np.zeros((0, 0)),
    }


def _run_twin(ctx: _Ctx) -> dict[str, Any]:
    """The run continued from the onset without the fault, on the same batches, recorded."""
    saved = _states(ctx)
    twin = ctx.fork()
    try:
        return record_twin(ctx.spec, twin.model, twin.opt,
                           lambda t, watcher: twin.step(t, fault=False, mult=None, watcher=watcher))
    finally:
        _restore(ctx, saved)


def _edge(ctx: _Ctx, history: list[float]) -> tuple[float, list[list[Any]]]:
    """The edge-of-stability multiplier, swept on copies of the run (as in
    :mod:`~trainsignals.curves.real_runs`).
    """
    spec = ctx.spec
    f, t0, n = spec.fault, spec.onset, spec.steps
    w = min(default_window("oscillation", n), n - 1 - t0)
    mult = float(f["start"])
    tried: list[list[Any]] = []
    for _ in range(int(f["tries"])):
        saved = _states(ctx)
        probe = ctx.fork()
        losses: list[float] = []
        try:
            for t in range(t0, t0 + w + 1):
                losses.append(probe.step(t, fault=True, mult=mult))
                if not math.isfinite(losses[-1]):
                    break
        finally:
            _restore(ctx, saved)
        series = np.full(n, np.nan)
        series[:t0] = history
        series[t0:t0 + len(losses)] = losses
        if len(losses) < w + 1:
            series[t0 + len(losses):] = math.inf
        if divergence_verdict(series, t0).passed:
            tried.append([mult, "diverges"])
            return mult, tried
        if oscillation_verdict(series, t0).passed:
            tried.append([mult, "oscillation"])
            return mult, tried
        tried.append([mult, "stable"])
        mult *= float(f["factor"])
    return mult / float(f["factor"]), tried


def train(spec: Any, torch: Any) -> tuple[Any, dict[str, Any]]:
    """Train a held-out run; ``(curve, info)``, ``info["twin"]`` the counterfactual twin's trace
    (faulty runs), ``info["lr_mult"]`` the edge-of-stability multiplier (oscillation runs).
    """
    ctx = _Ctx(spec, torch)
    watcher, collector = watch(ctx.model, ctx.opt, spec)
    info: dict[str, Any] = {}
    mult: float | None = None
    try:
        for t in range(spec.steps):
            if t == spec.onset:
                info["twin"] = _run_twin(ctx)
                if spec.fault.get("lr_mult") == "edge":
                    history = [r[1].get("loss", math.nan) for r in collector.rows]
                    mult, info["edge_of_stability"] = _edge(ctx, history)
                    info["lr_mult"] = mult
            ctx.step(t, fault=True, mult=mult, watcher=watcher)
    finally:
        watcher.close()
    return to_curve(spec, collector.rows, watcher), info


# ------------------------------------------------------------------------------------ twin labels


def _resid_sd(x: np.ndarray) -> float:
    with np.errstate(invalid="ignore"):
        return robust_sd(x - running_median(x, 21))


def _lg(x: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.log(np.maximum(np.asarray(x, dtype=np.float64), 1e-30))


def _level_effect(f: np.ndarray, tw: np.ndarray, sd: float) -> tuple[float, float]:
    """How far a faulty signal's level strays from its twin's, and how far is beyond noise: the
    largest 9-step running median of their log-ratio's size against ``max(4 sd / 3, log 1.1)``
    (``sd``: the twin's step noise). A non-finite faulty value is a difference of its own (``inf``).
    """
    if not np.isfinite(f).all():
        return math.inf, 0.0
    return float(np.nanmax(np.abs(running_median(_lg(f) - _lg(tw), 9)))), max(4 * sd / 3, math.log(1.1))


#: The kinds whose twin checks :func:`untouched` asks, one per distinct check (``stall``'s is
#: ``divergence``'s, ``silent_collapse``'s is ``overfitting``'s).
_ALL_CHECKS = ("divergence", "oscillation", "loss_spike", "grad_explosion", "vanishing_gradient", "dead_units",
               "overfitting")
#: The twin's recorded scalar signals, besides the loss, checked for a change of level.
_LEVELS = ("grad_norm", "lr", "update_ratio")


def untouched(curve: Any, twin: Mapping[str, Any]) -> str | None:
    """``None`` when the faulty ``curve`` is indistinguishable from its twin in every signal
    the twin recorded, else what differs: every kind's twin check (:func:`twin_check`) and a
    level check of the grad norm, learning rate and update ratio (a learning-rate fault shows
    in the learning rate; a frozen optimizer in the update ratio). Only such a run may be
    relabelled healthy: a fault that shows in any signal the Monitor reads is not a healthy run.
    """
    for kind in _ALL_CHECKS:
        if twin_check(curve, kind, twin)["visible"]:
            return kind
    s, n = int(twin["start"]), len(twin["loss"])
    for name in _LEVELS:
        tw = np.asarray(twin[name], dtype=np.float64)
        f = np.asarray(getattr(curve, name)[s:s + n], dtype=np.float64)
        fin = np.isfinite(tw)
        if (np.isfinite(f) != fin).any():  # finite in one run only: not measured (no optimizer step) or blown up
            return name
        if fin.any() and (e := _level_effect(f[fin], tw[fin], _resid_sd(_lg(tw[fin]))))[0] >= e[1]:
            return name
    return None


def twin_check(curve: Any, kind: str, twin: Mapping[str, Any]) -> dict[str, Any]:
    """Whether the faulty ``curve`` differs from its counterfactual ``twin`` beyond noise, in
    the signal that shows ``kind``.

    With ``d`` the log-ratio of the faulty signal to the twin's from the onset on and ``sd``
    the twin's step noise (1.4826 MAD of its log-signal around a 21-step running median):

    * ``divergence``, ``stall``: the largest 9-step running median of ``|d|`` (loss) is at
      least ``max(4 sd / 3, log 1.1)``, or the faulty loss is non-finite;
    * ``oscillation``: the faulty loss' step noise is at least 1.5x the twin's;
    * ``loss_spike``: ``d`` of the loss within 3 steps of the onset is at least
      ``max(4 sd, log 1.5)``; ``grad_explosion`` the same on the grad norm, ``max(4 sd, log 3)``;
    * ``vanishing_gradient``: some layer's grad norm (median over onset + 10..60) is at most
      0.1x the twin's;
    * ``dead_units``: some activation layer's median dead fraction over the window is at least
      0.3 above the twin's;
    * ``silent_collapse``, ``overfitting``: the validation loss at the twin's last validation
      is at least 1.1x the twin's.

    Returns:
        ``{"kind", "visible", "effect", "threshold", "noise"}`` (the figures the manifest records).
    """
    s = int(twin["start"])
    n = len(twin["loss"])
    out: dict[str, Any] = {"kind": kind, "twin_start": s, "twin_steps": n}
    if kind in ("divergence", "stall", "oscillation", "loss_spike"):
        f, tw = np.asarray(curve.loss[s:s + n], dtype=np.float64), twin["loss"]
    else:
        f, tw = np.asarray(curve.grad_norm[s:s + n], dtype=np.float64), twin["grad_norm"]
    sd = _resid_sd(_lg(tw))
    out["noise"] = sd
    if kind in ("divergence", "stall"):
        effect, thr = _level_effect(f, tw, sd)
    elif kind == "oscillation":
        sf = _resid_sd(_lg(f)) if np.isfinite(f).all() else math.inf
        effect, thr = (sf / sd if sd > 0 else math.inf), 1.5
    elif kind in ("loss_spike", "grad_explosion"):
        seg = f[:3]
        effect = math.inf if not np.isfinite(seg).all() else float(np.max(_lg(seg) - _lg(tw[:3])))
        thr = max(4 * sd, math.log(1.5 if kind == "loss_spike" else 3.0))
    elif kind == "vanishing_gradient":
        g_f = np.asarray(curve.layer_grad_norms[s + 10:s + 61], dtype=np.float64)
        g_t = np.asarray(twin["layer_grad_norms"][10:61], dtype=np.float64)
        with np.errstate(all="ignore"):
            rel = np.nanmedian(g_f, axis=0) / np.nanmedian(g_t, axis=0)
        rel = np.where(np.isfinite(rel), rel, 1.0)
        effect, thr = float(-math.log(max(float(rel.min()), 1e-30))), math.log(10.0)
    elif kind == "dead_units":
        mask = (curve.act_steps >= s) & (curve.act_steps < s + n)
        d_f = np.nanmedian(np.asarray(curve.dead_frac[mask], dtype=np.float64), axis=0) if mask.any() else np.zeros(1)
        d_t = np.nanmedian(np.asarray(twin["dead_frac"], dtype=np.float64), axis=0) if len(twin["dead_frac"]) \
            else np.zeros_like(d_f)
        effect, thr = float(np.nanmax(d_f - d_t)) if d_f.size else 0.0, 0.3
    else:       # silent_collapse, overfitting: the validation loss against the twin's
        vs, vt = twin["val_steps"], twin["val_loss"]
        if not len(vs):
            effect, thr = 0.0, math.log(1.1)
        else:
            last = int(vs[-1])
            vf = curve.val_loss[curve.val_steps == last]
            effect = float(_lg(vf[0]) - _lg(vt[-1])) if len(vf) else 0.0
            effect = math.inf if len(vf) and not math.isfinite(float(vf[0])) else effect
            thr = math.log(1.1)
    out.update(effect=effect, threshold=thr, visible=bool(effect >= thr))
    return out


def label_with_twin(raw: Any, twin: Mapping[str, Any] | None) -> tuple[Any, Any, list[Any], dict[str, Any] | None]:
    """:func:`~trainsignals.curves.labels.label_run`, then the twin check of the label it gives.

    A faulty run whose fault made no visible difference to its twin (on the kind it was
    labelled, or, when the rule check dropped it, on its intended kind) is relabelled healthy
    when it is indistinguishable from its twin in every recorded signal (:func:`untouched`)
    and the healthy check passes on it, and dropped otherwise.

    Returns:
        ``(curve or None, the deciding check, every check made, the twin figures or None)``.
    """
    curve, decided, made = label_run(raw)
    if twin is None or raw.kind == HEALTHY:
        return curve, decided, made, None
    kind = curve.kind if curve is not None else raw.kind
    tc = twin_check(raw, kind, twin)
    if tc["visible"]:
        return curve, decided, made, tc
    if (shows := untouched(raw, twin)) is not None:  # the fault shows, though not as its kind: no label fits
        tc["shows"] = shows
        res = CheckResult(HEALTHY, False, f"the fault made no visible {kind}, but the run differs from its "
                                          f"twin ({shows})")
        return None, res, [*made, res], tc
    res = check_healthy(raw)
    made = [*made, res]
    if not res.passed:
        return None, res, made, tc
    healthy = relabel(raw, HEALTHY, -1)
    d = {f: getattr(healthy, f) for f in healthy.__dataclass_fields__}
    d["name"] = f"healthy-{raw.difficulty}-{raw.name.rsplit('-', 1)[-1]}{NOFAULT}{raw.kind}"
    return type(healthy)(**d), res, made, tc
