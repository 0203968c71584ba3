"""The label checks of the real runs: does a run's recorded trace show the failure it is labelled with?

Every real run's label (:mod:`trainsignals.curves.real_runs`, :mod:`trainsignals.curves.families`)
is verified by an automatic check on the recorded signals, never on a detector's output:
:func:`check_label` checks one kind, :func:`label_run` decides a freshly trained run's label
(dropping a faulty run whose stretch before the onset is not healthy, then checking the kinds of
:data:`PRECEDENCE` first, then the intended kind, then its :data:`FALLBACKS`; a run none of them
passes is dropped), :func:`relabel` gives a curve another label. Learning-rate bumps are checked
for a divergence first: a bump meant to make the loss oscillate that made the run diverge is a
divergence; a bump meant to make it diverge that made it swing without diverging is an
oscillation.

The checks ("level" is a median, "smoothed" a centred running median of 9 steps, the
"pre-onset level" the level of the 50 steps before the onset, ``W`` the bench's detection
window of the kind, :func:`trainsignals.kinds.default_window`):

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
  tau >= 0.5, 10 % up) and no validation climb it ends on (:func:`validation_climb`: the
  validation level, the median of 3 successive validations, ends at least 10 % above its lowest);
  no activation layer 90 % dead or 50 % saturated in 3 consecutive samples; the grad norm level
  of the last 10 % is at least 1/30 of that of steps 10..60; every layer's grad norm level
  (second half) is within 3 decades of the median layer's.

**A faulty run is a healthy run until its onset** (:func:`check_before_onset`): the stretch
before the onset passes the healthy checks that apply to part of a run (finite; no validation
climb it ends on; no activation layer 90 % dead or 50 % saturated in 3 samples). The whole-run
checks (learned, progress given back, grad norm late against early, layers' spread) are left
out: they measure against progress a run may not have made when its fault comes. A run
that already failed on its own before its fault, most often a small data set that its net had
begun to overfit, is dropped by :func:`label_run`: an alarm on it before the onset would be
counted as false while the run's own validation curve says it was true.

:func:`divergence_verdict` and :func:`oscillation_verdict` are the divergence and oscillation
checks on a bare loss series (the edge-of-stability sweep runs them on a copy of the run);
:func:`nanmedian`, :func:`running_median` and :func:`robust_sd` are the robust statistics the
checks are built on.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from trainsignals.curves import HEALTHY, Curve
from trainsignals.kinds import default_window

__all__ = [
    "FALLBACKS",
    "PRECEDENCE",
    "CheckResult",
    "check_before_onset",
    "check_healthy",
    "check_label",
    "divergence_verdict",
    "kendall_tau",
    "label_run",
    "nanmedian",
    "oscillation_stats",
    "oscillation_verdict",
    "overfitting_onset",
    "relabel",
    "robust_sd",
    "running_median",
    "validation_climb",
]

#: Kinds a run is relabelled to, in order, when the check of its intended kind fails.
FALLBACKS: dict[str, tuple[str, ...]] = {
    "divergence": ("oscillation",),
    "oscillation": ("divergence",),
}

#: Kinds checked *before* the intended one: a learning-rate bump that blew the run up (the loss
#: lost all its progress or climbed 4x, and did not come back) is a divergence, whatever it was
#: meant to do.
PRECEDENCE: dict[str, tuple[str, ...]] = {"oscillation": ("divergence",)}


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


def nanmedian(x: np.ndarray) -> float:
    """The median of ``x``'s finite values (NaN when it has none).

    Example:
        >>> nanmedian(np.array([1.0, np.nan, 3.0, np.inf, 2.0]))
        2.0
    """
    x = np.asarray(x, dtype=np.float64)
    x = x[np.isfinite(x)]
    return float(np.median(x)) if x.size else math.nan


def running_median(x: np.ndarray, width: int) -> np.ndarray:
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


def robust_sd(x: np.ndarray) -> float:
    """The robust spread of ``x``'s finite values: 1.4826 times their median absolute deviation
    (NaN when it has none); one outlier does not move it.

    Example:
        >>> robust_sd(np.array([1.0, 2.0, 3.0, 4.0, 100.0]))    # median 3, deviations 2 1 0 1 97
        1.4826
    """
    x = np.asarray(x, dtype=np.float64)
    x = x[np.isfinite(x)]
    if not x.size:
        return math.nan
    return float(1.4826 * np.median(np.abs(x - np.median(x))))


def _log(x: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.log(np.asarray(x, dtype=np.float64))


def kendall_tau(y: np.ndarray) -> float:
    """Kendall's tau of ``y`` against its order (1: every value above all before it; nan under 2 values)."""
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
    return nanmedian(x[max(0, onset - back):onset])


def _check_divergence(c: Curve, onset: int) -> CheckResult:
    return divergence_verdict(c.loss, onset)


def divergence_verdict(loss: np.ndarray, onset: int) -> CheckResult:
    """The divergence check (module docstring) on the loss series ``loss`` from ``onset`` on."""
    n = len(loss)
    hi = min(n, onset + default_window("divergence", n) + 1)
    pre = _pre_level(loss, onset)
    start = nanmedian(loss[:20])
    seg = loss[onset:hi]
    if (~np.isfinite(seg)).any():
        return CheckResult("divergence", True, f"non-finite loss at step {onset + int(np.argmax(~np.isfinite(seg)))}")
    sm = running_median(loss, 9)[onset:hi]
    peak = float(np.nanmax(sm)) if sm.size else math.nan
    end = nanmedian(loss[max(onset, hi - 20):hi])
    climbed = peak >= 4.0 * pre or (peak >= 2.0 * pre and peak > start)
    ok = bool(climbed and end >= 2.0 * pre)
    return CheckResult("divergence", ok, f"smoothed loss peaks at {peak / pre:.3g}x the pre-onset level {pre:.4g} and "
                                          f"{peak / start:.3g}x the run's initial level (needs >= 4x, or >= 2x and above "
                                          f"the initial level, or a non-finite loss) and ends the window at "
                                          f"{end / pre:.3g}x (needs >= 2x: no recovery)")


def _check_stall(c: Curve, onset: int) -> CheckResult:
    n = c.total_steps
    w = min(default_window("stall", n), n - 1 - onset)
    if onset < 100 or w < 150:
        return CheckResult("stall", False, "fewer than 100 steps before or 150 after the onset")
    lg = _log(c.loss)
    if (~np.isfinite(lg[onset - 100:])).any():
        return CheckResult("stall", False, "non-finite loss")
    b = min(100, onset // 2)
    rate_pre = (nanmedian(lg[onset - 2 * b:onset - b]) - nanmedian(lg[onset - b:onset])) / b
    first = nanmedian(lg[onset:onset + 75])
    last = nanmedian(lg[onset + w - 75:onset + w + 1])
    rate_post = (first - last) / (w - 75)
    rel = rate_post / rate_pre if rate_pre > 0 else math.inf
    ok = rate_pre >= 0.05 / 100 and rel < 0.1 and last - first < math.log(1.25)
    return CheckResult("stall", ok, f"log-loss fell {100 * rate_pre:.3g} per 100 steps before the onset (needs >= 0.05), "
                                    f"then at {rel:.3g}x that rate (needs < 0.1), changing by {last - first:+.3f} "
                                    f"(needs < +0.22)")


def oscillation_stats(loss: np.ndarray, onset: int, w: int) -> tuple[float, float, float, bool]:
    """``(swing ratio, level after, level before, finite)`` of the oscillation check over the
    ``w`` steps after ``onset``.
    """
    seg = loss[onset:onset + w + 1]
    finite = bool(np.isfinite(seg).all())
    with np.errstate(invalid="ignore"):
        resid = loss - running_median(loss, 21)
    sd_pre = robust_sd(resid[onset - 100:onset])
    sd_post = robust_sd(resid[onset + 5:onset + w + 1])
    pre = _pre_level(loss, onset)
    post = nanmedian(loss[onset + 5:onset + w + 1])
    ratio = sd_post / sd_pre if sd_pre > 0 else math.inf
    return ratio, post, pre, finite


def _check_oscillation(c: Curve, onset: int) -> CheckResult:
    return oscillation_verdict(c.loss, onset)


def oscillation_verdict(loss: np.ndarray, onset: int) -> CheckResult:
    """The oscillation check (module docstring) on the loss series ``loss`` from ``onset`` on."""
    n = len(loss)
    w = min(default_window("oscillation", n), n - 1 - onset)
    if onset < 100 or w < 60:
        return CheckResult("oscillation", False, "fewer than 100 steps before or 60 after the onset")
    ratio, post, pre, finite = oscillation_stats(loss, onset, w)
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
    sd = robust_sd((c.loss - running_median(c.loss, 21))[onset - 50:onset])
    peak = float(np.max(c.loss[onset:onset + 3]))
    back = float(np.min(running_median(c.loss, 9)[onset + 3:onset + 34]))
    units = (peak - pre) / sd if sd > 0 else math.inf
    ok = peak >= 2.0 * pre and units >= 8.0 and back <= 1.5 * pre
    return CheckResult("loss_spike", ok, f"loss jumped to {peak / pre:.3g}x its level ({units:.3g} noise units; needs "
                                         f">= 2x and >= 8), smoothed loss back to {back / pre:.3g}x within 30 steps "
                                         f"(needs <= 1.5x)")


def _check_grad_explosion(c: Curve, onset: int) -> CheckResult:
    if onset < 20:
        return CheckResult("grad_explosion", False, "onset too early")
    pre = nanmedian(c.grad_norm[max(0, onset - 50):onset])
    seg = c.grad_norm[onset:onset + 3]
    peak = math.inf if (~np.isfinite(seg)).any() else float(np.max(seg))
    ok = peak >= 10.0 * pre
    return CheckResult("grad_explosion", ok, f"grad norm jumped to {peak / pre:.3g}x its pre-onset level (needs >= 10x)")


def _check_vanishing(c: Curve, onset: int) -> CheckResult:
    if not c.layer_names or onset < 20 or c.total_steps - onset < 30:
        return CheckResult("vanishing_gradient", False, "no per-layer grad norms, or not enough steps")
    g = c.layer_grad_norms
    pre = np.array([nanmedian(g[max(0, onset - 50):onset, j]) for j in range(g.shape[1])])
    post = np.array([nanmedian(g[onset + 10:onset + 61, j]) for j in range(g.shape[1])])
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
    hi = onset + default_window("dead_units", c.total_steps)
    before = c.act_steps < onset
    after = (c.act_steps >= onset) & (c.act_steps <= hi)
    for j, name in enumerate(c.act_layer_names):
        d = c.dead_frac[:, j]
        pre = nanmedian(d[before]) if before.any() else 0.0
        end = _consecutive(d[after] >= 0.9, 3)
        if end >= 0 and not pre >= 0.5:
            step = int(c.act_steps[after][end])
            return CheckResult("dead_units", True, f"{name}: {pre:.2f} dead before, >= 90 % dead in 3 samples by step {step}")
    return CheckResult("dead_units", False, "no layer became >= 90 % dead for 3 samples after the onset")


def _check_silent_collapse(c: Curve, onset: int) -> CheckResult:
    n = c.total_steps
    w = min(default_window("silent_collapse", n), n - 1 - onset)
    if w < 100:
        return CheckResult("silent_collapse", False, "too little of the run left after the onset")
    sm = running_median(c.loss, 9)
    at = float(sm[onset])
    jump = float(np.nanmax(sm[onset:onset + 101])) / at
    fall = float(np.nanmin(sm[onset:onset + w + 1])) / at
    g_at = nanmedian(c.grad_norm[max(0, onset - 25):onset + 25])
    g_end = nanmedian(c.grad_norm[onset + w - 50:onset + w + 1])
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
    tau = kendall_tau(va)
    last = nanmedian(va[-3:]) / v0
    t_at = nanmedian(c.loss[max(0, onset - 25):onset + 25])
    t_end = nanmedian(c.loss[-50:])
    ok = tau >= 0.5 and last >= 1.1 and t_end <= 0.9 * t_at and bool(np.isfinite(c.loss).all())
    return CheckResult("overfitting", ok, f"validation after the onset: Kendall tau {tau:.3g} (needs >= 0.5), last three "
                                          f"{last:.3g}x the best (needs >= 1.1); training loss {t_end / t_at:.3g}x (needs <= 0.9)")


def validation_climb(val_loss: np.ndarray) -> float:
    """How far the validation loss ends above its lowest level: the last level over the lowest.

    A level is the median of 3 successive validations, so that one lucky draw neither sets the
    lowest nor ends the run; a climb of 10 % (1.1) is the rise the overfitting check asks for.
    1.0 with fewer than 5 validations or when the last level is the lowest.

    Example:
        >>> round(validation_climb(np.array([1.0, 0.8, 0.7, 0.72, 0.8, 0.85, 0.9])), 3)  # levels .8 .72 .72 .8 .85
        1.181
        >>> round(validation_climb(np.array([1.0, 0.8, 0.5, 0.8, 0.78, 0.79])), 3)  # a lucky 0.5 sets no level
        1.013
    """
    v = np.asarray(val_loss, dtype=np.float64)
    if len(v) < 5:
        return 1.0
    levels = np.array([nanmedian(v[i:i + 3]) for i in range(len(v) - 2)])
    low = float(np.nanmin(levels)) if np.isfinite(levels).any() else math.nan
    end = float(levels[-1])
    return end / low if low > 0.0 and end > low else 1.0


def _gave_back(loss: np.ndarray) -> float:
    """The most of its progress the smoothed (51-step) loss gave back, from step 50 on (0 before):
    a whole-run check, measured against the progress the run made (a stretch may have made none).
    """
    if len(loss) <= 50:
        return 0.0
    first = nanmedian(loss[:20])
    sm = running_median(loss, 51)
    best = np.minimum.accumulate(sm)
    with np.errstate(divide="ignore", invalid="ignore"):
        lost = (sm - best) / np.maximum(first - best, 1e-12)
    return float(np.max(lost[50:]))


def _healthy_stretch(c: Curve, n: int) -> CheckResult | None:
    """The healthy checks that apply to the first ``n`` steps of ``c`` (and its samples before
    step ``n``): finite, no validation climb, no dead or saturated layer. The failed one, or
    ``None`` when all pass.
    """
    if not (np.isfinite(c.loss[:n]).all() and np.isfinite(c.grad_norm[:n]).all()):
        return CheckResult(HEALTHY, False, "non-finite loss or grad norm")
    vals = c.val_loss[c.val_steps < n]
    if len(vals):
        b = int(np.argmin(np.where(np.isfinite(vals), vals, np.inf)))
        va = vals[b + 1:]
        if len(va) >= 5 and kendall_tau(va) >= 0.5 and nanmedian(va[-3:]) >= 1.1 * float(vals[b]):
            return CheckResult(HEALTHY, False, "validation loss rises steadily after its best (overfitting)")
        if (climb := validation_climb(vals)) >= 1.1:
            return CheckResult(HEALTHY, False, f"validation loss ends {climb:.3g}x its lowest level (median of 3 "
                                               "validations; needs < 1.1: overfitting)")
    acts = c.act_steps < n
    for j, name in enumerate(c.act_layer_names):
        if _consecutive(c.dead_frac[acts, j] >= 0.9, 3) >= 0:
            return CheckResult(HEALTHY, False, f"{name} is >= 90 % dead in 3 samples")
        if _consecutive(c.saturation[acts, j] >= 0.5, 3) >= 0:
            return CheckResult(HEALTHY, False, f"{name} is >= 50 % saturated in 3 samples")
    return None


def check_before_onset(c: Curve, onset: int | None = None) -> CheckResult:
    """The healthy checks that apply to part of a run, on the steps of ``c`` before ``onset``
    (default: its label's onset): a faulty run must be a healthy run until its fault.

    Raises:
        ValueError: no onset (a healthy run, or ``onset`` < 0).
    """
    onset = c.onset_step if onset is None else onset
    if onset is None or onset < 0:
        raise ValueError(f"onset must be a step >= 0, got {onset!r}")
    failed = _healthy_stretch(c, int(onset))
    if failed is not None:
        return CheckResult(HEALTHY, False, f"before the onset (step {onset}): {failed.reason}")
    return CheckResult(HEALTHY, True, f"the {onset} steps before the onset pass the healthy checks of a stretch")


def check_healthy(c: Curve) -> CheckResult:
    """The healthy check (module docstring) of the whole run ``c``."""
    n = c.total_steps
    if not (np.isfinite(c.loss).all() and np.isfinite(c.grad_norm).all()):
        return CheckResult(HEALTHY, False, "non-finite loss or grad norm")
    first = nanmedian(c.loss[:20])
    last = nanmedian(c.loss[-max(20, n // 20):])
    if last > 0.7 * first:
        return CheckResult(HEALTHY, False, f"did not learn: final loss {last / first:.3g}x the initial (needs <= 0.7)")
    if (regress := _gave_back(c.loss)) > 0.25:
        return CheckResult(HEALTHY, False, f"the smoothed loss gave back {regress:.0%} of the progress made (max 25 %)")
    if (failed := _healthy_stretch(c, n)) is not None:
        return failed
    g_early = nanmedian(c.grad_norm[10:60])
    g_late = nanmedian(c.grad_norm[-max(20, n // 10):])
    if g_late < g_early / 30.0:
        return CheckResult(HEALTHY, False, f"grad norm collapsed to {g_late / g_early:.3g}x its early level")
    if c.layer_names:
        levels = np.array([nanmedian(c.layer_grad_norms[n // 2:, j]) for j in range(len(c.layer_names))])
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
        return check_healthy(curve)
    if kind not in _CHECKS:
        raise ValueError(f"kind must be 'healthy' or one of {tuple(_CHECKS)}, got {kind!r}")
    if onset is None or onset < 0:
        raise ValueError(f"onset must be a step >= 0 for kind {kind!r}, got {onset!r}")
    return _CHECKS[kind](curve, int(onset))


def relabel(curve: Curve, kind: str, onset: int) -> Curve:
    """``curve`` labelled ``kind`` from ``onset``; a new label changes the name to
    ``"{kind}-{family}-{index}-from-{old kind}"``.
    """
    d = {f: getattr(curve, f) for f in curve.__dataclass_fields__}
    d.update(kind=kind, onset_step=int(onset), name=curve.name if kind == curve.kind else
             f"{kind}-{curve.difficulty}-{curve.name.rsplit('-', 1)[-1]}-from-{curve.kind}")
    return Curve(**d)


def label_run(curve: Curve) -> tuple[Curve | None, CheckResult, list[CheckResult]]:
    """Check a freshly trained run's intended label; relabel or drop it when the check fails.

    For an overfitting run the onset becomes the validation step of the lowest validation loss
    at or after the injection (:func:`overfitting_onset`). The kinds in :data:`PRECEDENCE` are
    checked first, then the intended kind, then its :data:`FALLBACKS`; the first that passes
    is the label. A faulty run whose stretch before the onset fails :func:`check_before_onset`
    is dropped: it failed on its own before its fault.

    Returns:
        ``(curve or None when dropped, the deciding check, every check made)``.
    """
    intended = curve.kind
    onset = curve.onset_step
    if intended == HEALTHY:
        res = check_healthy(curve)
        return (curve if res.passed else None), res, [res]
    if intended == "overfitting":
        onset = overfitting_onset(curve, onset)
        if onset < 0:
            res = CheckResult("overfitting", False, "no validation after the injection")
            return None, res, [res]
    before = check_before_onset(curve, onset)  # a run that failed on its own before its fault fits no label
    if not before.passed:
        return None, before, [before]
    order = [*PRECEDENCE.get(intended, ()), intended, *FALLBACKS.get(intended, ())]
    made: list[CheckResult] = []
    for kind in dict.fromkeys(order):
        res = check_label(curve, kind, onset)
        made.append(res)
        if res.passed:
            return relabel(curve, kind, onset), res, made
    return None, made[order.index(intended)], made
