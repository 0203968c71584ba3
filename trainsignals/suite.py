"""The default suite: which detectors a :class:`~trainsignals.Monitor` runs, as plain data.

:func:`default_suite` returns the detectors as an ordinary ``dict`` of name -> detector: edit it
(drop one, change one, add your own :class:`~trainsignals.Detector`) and pass it to
``Monitor(suite=...)``. The order of the dict is the order of events within a step.

Example:
    >>> import trainsignals as ts
    >>> suite = ts.default_suite(total_steps=5_000)
    >>> suite["stall"].patience                     # 10 % of the planned steps
    500
    >>> del suite["sawtooth"]
    >>> mon = ts.Monitor(suite=suite)
    >>> "sawtooth" in mon.detectors
    False
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ._validate import check_range
from .detectors import (
    ActivationHealth,
    CUSUMPlateau,
    Detector,
    EWMASpike,
    GuardedEWMASpike,
    LayerGradCliff,
    LayerUpdateRatio,
    LjungBoxSawtooth,
    LossGradCoupling,
    LRAnomaly,
    LRRiseEdgeOfStability,
    NonFinite,
    SlopeDivergence,
    SwingRatioEdgeOfStability,
    TrainValGap,
    UpdateRatioBand,
)

__all__ = ["default_suite", "SUITE_NAMES"]


def _stall_patience(total_steps: int | None, min_patience: int) -> dict[str, Any]:
    """The stall rule of thumb: no new best loss within 10 % of the planned steps."""
    return {} if total_steps is None else {"patience": max(min_patience, int(round(0.1 * total_steps)))}


# name -> (detector class, its settings in the default suite, settings derived from the run's plan)
_TABLE: tuple[tuple[str, type[Detector], dict[str, Any], Callable[[int | None, int], dict[str, Any]] | None], ...] = (
    ("nonfinite_loss", NonFinite, {"signal": "loss"}, None),
    ("nonfinite_grad_norm", NonFinite, {"signal": "grad_norm"}, None),
    ("nonfinite_lr", NonFinite, {"signal": "lr"}, None),
    ("nonfinite_update_ratio", NonFinite, {"signal": "update_ratio"}, None),
    ("nonfinite_val_loss", NonFinite, {"signal": "val_loss"}, None),
    ("loss_spike", EWMASpike, {"persist_kind": "divergence"}, None),
    ("divergence", SlopeDivergence, {}, None),
    ("stall", CUSUMPlateau, {}, _stall_patience),
    ("sawtooth", LjungBoxSawtooth, {}, None),
    ("edge_of_stability", SwingRatioEdgeOfStability, {}, None),
    ("lr_edge_of_stability", LRRiseEdgeOfStability, {}, None),
    ("grad_explosion", GuardedEWMASpike, {"kind": "grad_explosion", "signal": "grad_norm", "min_ratio": 10.0,
                                          "threshold": 6.0, "persist_kind": "grad_explosion"}, None),
    ("coupling", LossGradCoupling, {}, None),
    ("lr_anomaly", LRAnomaly, {}, None),
    ("update_ratio", UpdateRatioBand, {}, None),
    ("overfitting", TrainValGap, {}, None),
    ("layer_cliff", LayerGradCliff, {}, None),
    ("layer_update_ratio", LayerUpdateRatio, {}, None),
    ("activations", ActivationHealth, {}, None),
)

#: The names of the default suite, in order.
SUITE_NAMES: tuple[str, ...] = tuple(row[0] for row in _TABLE)


def default_settings(name: str) -> dict[str, Any]:
    """The settings the default suite gives detector ``name`` (before the run's plan)."""
    for row in _TABLE:
        if row[0] == name:
            return dict(row[2])
    raise KeyError(f"no detector {name!r} in the default suite; names are {list(SUITE_NAMES)}")


def default_suite(total_steps: int | None = None, *, min_patience: int = 50, **settings: Any) -> dict[str, Detector]:
    """The default detectors, freshly built, as ``{name: detector}``.

    Args:
        total_steps: planned run length, if known; sets the stall patience to 10 % of it
            (at least ``min_patience``).
        min_patience: smallest stall patience derived from ``total_steps``.
        **settings: per-detector settings by name, e.g. ``loss_spike={"threshold": 8}``;
            ``name=False`` leaves a detector out.

    Raises:
        TypeError: an unknown detector name.
        ValueError: a bad setting (named as ``detector.parameter``).
    """
    if total_steps is not None:
        check_range("total_steps", total_steps, 1, None, integer=True)
    check_range("min_patience", min_patience, 2, None, integer=True)
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
        kw = {**base, **(planned(total_steps, min_patience) if planned else {}), **opt}
        try:
            suite[name] = cls(**kw)
        except TypeError as exc:
            raise ValueError(f"{name}: {exc}") from exc
        except ValueError as exc:
            raise ValueError(f"{name}.{exc}") from exc
    return suite
