"""The default suite: which detectors a :class:`~trainsignals.Monitor` runs, as plain data.

:func:`default_suite` returns the detectors as an ordinary ``dict`` of name -> detector: edit it
(drop one, change one, add your own :class:`~trainsignals.Detector`) and pass it to
``Monitor(suite=...)``. The order of the dict is the order of events within a step.

Example:
    >>> import trainsignals as ts
    >>> suite = ts.default_suite(total_steps=5_000)
    >>> suite["stall_grad_collapse"].patience       # 10 % of the planned steps
    500
    >>> del suite["sawtooth"]
    >>> mon = ts.Monitor(suite=suite)
    >>> "sawtooth" in mon.detectors
    False

For a log written every 50 steps, the spans cover the same steps in fewer values:

    >>> ts.default_suite(total_steps=5_000, log_every=50)["stall_grad_collapse"].patience
    10
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ._calibration import calibrated as _calibrated
from ._calibration import heldout_rate as _heldout_rate
from ._validate import check_choice, check_range
from .detectors import (
    AbruptPlateau,
    BreakoutOverfitting,
    ConfirmedZSpike,
    Detector,
    EarlyClimbDivergence,
    EWMAZSpike,
    FlatFractionSaturation,
    FrozenUpdatePlateau,
    GradCollapsePlateau,
    GradCollapseSlowdown,
    GradLossDecoupling,
    JointCollapse,
    LayerUpdateRatio,
    LevelShift,
    LevelStepOverfitting,
    LjungBoxSawtooth,
    LostProgress,
    LRCollapseStall,
    LRJumpAnomaly,
    LRRiseEdgeOfStability,
    MedianGapGradCliff,
    MemorisationClimbOverfitting,
    NeverImprovedPlateau,
    NonFinite,
    OneAnswerLossDrop,
    OwnDropGradCliff,
    PeakRatioSpike,
    SharpTurnOverfitting,
    SignedLostProgress,
    SignedZSpike,
    SpreadCollapse,
    SwingRatioEdgeOfStability,
    TopShareCollapse,
    TrendDivergence,
    UpdateGapStall,
    UpdateRatioAboveBand,
    UpdateRatioBelowBand,
    ValMetricChance,
    ZeroFractionDeadUnits,
    ZeroRunGradCliff,
    interval_settings,
)

__all__ = ["default_suite", "SUITE_NAMES"]


def _stall_patience(total_steps: int | None, min_patience: int) -> dict[str, Any]:
    """The stall rules' rule of thumb: no new best loss within 10 % of the planned steps."""
    return {} if total_steps is None else {"patience": max(min_patience, int(round(0.1 * total_steps)))}


#: the grad-norm spike and level-shift rules: a z-score from 6 and a jump of >= 10x the level (the former
#: GuardedEWMASpike row's settings). The spike rule is ConfirmedZSpike: a lone grad-norm spike is common in
#: healthy runs (FAILURE_MODES.md); the peak rule, which fires at one value, asks for orders of magnitude
#: (100x the level, FAILURE_MODES.md's "jumps orders of magnitude above its own recent level")
_GRAD_JUMP: dict[str, Any] = {"signal": "grad_norm", "kind": "grad_explosion", "threshold": 6.0, "min_ratio": 10.0}
_GRAD_PEAK: dict[str, Any] = {"signal": "grad_norm", "kind": "grad_explosion", "min_ratio": 100.0}

# name -> (detector class, its settings in the default suite, settings derived from the run's plan)
_TABLE: tuple[tuple[str, type[Detector], dict[str, Any], Callable[[int | None, int], dict[str, Any]] | None], ...] = (
    ("nonfinite_loss", NonFinite, {"signal": "loss"}, None),
    ("nonfinite_grad_norm", NonFinite, {"signal": "grad_norm"}, None),
    ("nonfinite_lr", NonFinite, {"signal": "lr"}, None),
    ("nonfinite_update_ratio", NonFinite, {"signal": "update_ratio"}, None),
    ("nonfinite_val_loss", NonFinite, {"signal": "val_loss"}, None),
    ("loss_spike", EWMAZSpike, {}, None),
    ("loss_peak", PeakRatioSpike, {}, None),
    ("loss_spike_signed", SignedZSpike, {}, None),
    ("loss_shift", LevelShift, {}, None),
    ("early_climb", EarlyClimbDivergence, {}, None),
    ("trend_divergence", TrendDivergence, {}, None),
    ("lost_progress", LostProgress, {}, None),
    ("lost_progress_signed", SignedLostProgress, {}, None),
    ("stall_grad_collapse", GradCollapsePlateau, {}, _stall_patience),
    ("stall_slowdown", GradCollapseSlowdown, {}, _stall_patience),
    ("stall_frozen_updates", FrozenUpdatePlateau, {}, _stall_patience),
    ("stall_never_improved", NeverImprovedPlateau, {}, _stall_patience),
    ("stall_abrupt", AbruptPlateau, {}, _stall_patience),
    ("lr_collapse", LRCollapseStall, {}, None),
    ("frozen_optimizer", UpdateGapStall, {}, None),
    ("frozen_gradients", UpdateGapStall, {"signal": "grad_norm"}, None),
    ("sawtooth", LjungBoxSawtooth, {}, None),
    ("edge_of_stability", SwingRatioEdgeOfStability, {}, None),
    ("lr_edge_of_stability", LRRiseEdgeOfStability, {}, None),
    ("grad_explosion", ConfirmedZSpike, _GRAD_JUMP, None),
    ("grad_peak", PeakRatioSpike, _GRAD_PEAK, None),
    ("grad_shift", LevelShift, _GRAD_JUMP, None),
    ("grad_decoupling", GradLossDecoupling, {}, None),
    ("joint_collapse", JointCollapse, {}, None),
    ("one_answer", OneAnswerLossDrop, {}, None),
    ("lr_anomaly", LRJumpAnomaly, {}, None),
    ("update_ratio_high", UpdateRatioAboveBand, {}, None),
    ("update_ratio_low", UpdateRatioBelowBand, {}, None),
    ("breakout_overfitting", BreakoutOverfitting, {}, None),
    ("level_step_overfitting", LevelStepOverfitting, {}, None),
    ("sharp_turn_overfitting", SharpTurnOverfitting, {}, None),
    ("climb_overfitting", MemorisationClimbOverfitting, {}, None),
    ("layer_cliff_gap", MedianGapGradCliff, {}, None),
    ("layer_cliff_drop", OwnDropGradCliff, {}, None),
    ("layer_cliff_zero", ZeroRunGradCliff, {}, None),
    ("layer_update_ratio", LayerUpdateRatio, {}, None),
    ("dead_units", ZeroFractionDeadUnits, {}, None),
    ("saturation", FlatFractionSaturation, {}, None),
    ("pred_collapse", TopShareCollapse, {}, None),
    ("spread_collapse", SpreadCollapse, {}, None),
    ("val_metric_chance", ValMetricChance, {}, None),
)

#: The names of the default suite, in order.
SUITE_NAMES: tuple[str, ...] = tuple(row[0] for row in _TABLE)


def default_settings(name: str) -> dict[str, Any]:
    """The settings the default suite gives detector ``name`` (before the run's plan)."""
    for row in _TABLE:
        if row[0] == name:
            return dict(row[2])
    raise KeyError(f"no detector {name!r} in the default suite; names are {list(SUITE_NAMES)}")


def default_suite(total_steps: int | None = None, *, min_patience: int = 50, val_metric_mode: str = "max",
                  calibrated: bool = True, log_every: int = 1, **settings: Any) -> dict[str, Detector]:
    """The default detectors, freshly built, as ``{name: detector}``.

    Args:
        total_steps: planned run length, if known; sets the patience of the ``stall_*`` rules
            to 10 % of it (at least ``min_patience``).
        min_patience: smallest stall patience derived from ``total_steps``.
        val_metric_mode: the direction of ``val_metric`` (``"max"``: higher is better, or
            ``"min"``), the ``mode`` of every detector that reads it.
        log_every: steps between the values the detectors will be given (a log written every N
            steps, as Hugging Face's ``logging_steps``): each detector's spans, which count
            values, are shortened to cover the same steps, down to the fewest values each rule
            needs (:func:`~trainsignals.detectors.interval_settings`); ``total_steps`` and
            ``min_patience`` stay in steps. Settings given by name are taken as they are.
        calibrated: apply the values ``trainsignals/calibration.json`` holds for the rules'
            knobs, and give each detector its measured ``healthy_rate`` and ``heldout_rate``
            (False: the classes' defaults and no rate; what calibration itself starts from).
        **settings: per-detector settings by name, e.g. ``loss_spike={"threshold": 8}``;
            ``name=False`` leaves a detector out.

    Raises:
        TypeError: an unknown detector name.
        ValueError: a bad setting (named as ``detector.parameter``).
    """
    if total_steps is not None:
        check_range("total_steps", total_steps, 1, None, integer=True)
    check_range("min_patience", min_patience, 2, None, integer=True)
    check_choice("val_metric_mode", val_metric_mode, ("max", "min"))
    check_range("log_every", log_every, 1, None, integer=True)
    unknown = sorted(set(settings) - set(SUITE_NAMES))
    if unknown:
        raise TypeError(f"unknown detector setting(s) {unknown}; the default suite's detectors are {list(SUITE_NAMES)}")
    suite: dict[str, Detector] = {}
    for name, cls, base, planned in _TABLE:
        opt = settings.get(name, {})
        if opt is False:
            continue
        if opt is True or opt is None:
            opt = {}
        if not isinstance(opt, Mapping):
            raise ValueError(f"{name} must be a mapping of settings or False, got {opt!r}")
        tuned, rate = _calibrated(name) if calibrated else ({}, None)  # trainsignals/calibration.json
        held = _heldout_rate(name) if calibrated else None
        kw = {**interval_settings(cls, log_every, {**base, **tuned, **(planned(total_steps, min_patience)
                                                                       if planned else {})}), **opt}
        if any(i.name == "val_metric" for i in cls.inputs):  # the metric's direction, set once for the run
            kw = {"mode": val_metric_mode, **kw}
        try:
            suite[name] = cls(**kw)
        except TypeError as exc:
            raise ValueError(f"{name}: {exc}") from exc
        except ValueError as exc:
            raise ValueError(f"{name}.{exc}") from exc
        if not opt and log_every == 1:  # the rates were measured at these settings, on logs of one value a step
            suite[name].healthy_rate, suite[name].heldout_rate = rate, held
    return suite
