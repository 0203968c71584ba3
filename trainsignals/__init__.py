"""trainsignals: watch a training run's vital signs and say early, with reasons, what goes wrong.

``import trainsignals`` pulls in NumPy only (SciPy when a batch path first needs it): no framework, no plotting. Adapters live
in ``trainsignals.adapters.<framework>`` and import their framework themselves.
"""

from __future__ import annotations

from ._events import (  # noqa: E402
    DISTRIBUTED_KINDS,
    Event,
    Kind,
    TrainingFailure,
    check_kinds,
    make_event,
)
from ._layers import LayerValues  # noqa: E402
from ._monitor import STATUSES, Monitor, scan  # noqa: E402
from ._recorder import Recorder  # noqa: E402
from ._validate import check_range, to_step  # noqa: E402
from ._version import __version__  # noqa: E402
from .detectors import (  # noqa: E402
    AbruptPlateau,
    BreakoutOverfitting,
    ConfirmedZSpike,
    Detector,
    DetectorProtocol,
    EarlyClimbDivergence,
    EWMAZSpike,
    FlatFractionSaturation,
    FrozenUpdatePlateau,
    GradCollapsePlateau,
    GradCollapseSlowdown,
    GradLossDecoupling,
    Input,
    JointCollapse,
    Knob,
    LayerUpdateRatio,
    LevelShift,
    LevelStepOverfitting,
    LjungBoxSawtooth,
    LostProgress,
    LRCollapseStall,
    LRJumpAnomaly,
    LRRiseEdgeOfStability,
    LRScheduleMismatch,
    MedianGapGradCliff,
    MemorisationClimbOverfitting,
    NeverImprovedPlateau,
    NonFinite,
    OneAnswerLossDrop,
    OwnDropGradCliff,
    PeakRatioSpike,
    RankOutliers,
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
from .policy import EventPolicy  # noqa: E402
from .signals import SIGNALS  # noqa: E402
from .suite import default_suite  # noqa: E402

__all__ = [
    "AbruptPlateau",
    "BreakoutOverfitting",
    "DISTRIBUTED_KINDS",
    "Detector",
    "DetectorProtocol",
    "EarlyClimbDivergence",
    "Event",
    "FlatFractionSaturation",
    "FrozenUpdatePlateau",
    "GradCollapsePlateau",
    "GradCollapseSlowdown",
    "ConfirmedZSpike",
    "EWMAZSpike",
    "EventPolicy",
    "Input",
    "Knob",
    "GradLossDecoupling",
    "JointCollapse",
    "OneAnswerLossDrop",
    "SIGNALS",
    "check_kinds",
    "check_range",
    "to_step",
    "default_suite",
    "interval_settings",
    "make_event",
    "Kind",
    "LRJumpAnomaly",
    "LRScheduleMismatch",
    "LRCollapseStall",
    "LRRiseEdgeOfStability",
    "MedianGapGradCliff",
    "OwnDropGradCliff",
    "LayerUpdateRatio",
    "LayerValues",
    "LevelStepOverfitting",
    "LostProgress",
    "MemorisationClimbOverfitting",
    "LevelShift",
    "LjungBoxSawtooth",
    "Monitor",
    "NeverImprovedPlateau",
    "NonFinite",
    "PeakRatioSpike",
    "RankOutliers",
    "Recorder",
    "SharpTurnOverfitting",
    "SignedLostProgress",
    "SignedZSpike",
    "STATUSES",
    "SpreadCollapse",
    "TopShareCollapse",
    "SwingRatioEdgeOfStability",
    "TrainingFailure",
    "UpdateGapStall",
    "UpdateRatioAboveBand",
    "UpdateRatioBelowBand",
    "ValMetricChance",
    "ZeroFractionDeadUnits",
    "ZeroRunGradCliff",
    "TrendDivergence",
    "__version__",
    "scan",
]


_LAZY = {  # public names served by modules that import pyarrow or matplotlib, loaded on first use
    "TraceWriter": "io.traces",
    "read_trace": "io.traces",
    "write_trace": "io.traces",
    "trace_signals": "io.traces",
    "trace_metadata": "io.traces",
    "trace_events": "io.traces",
    "TraceFormatError": "io.traces",
    "TraceDamagedWarning": "io.traces",
    "Report": "io.report",
    "replay": "io.report",
    "replay_many": "io.report",
    "plot_run": "io.plot",
    "import_run": "io.importers",
}
#: the subpackages beside the core, imported on first use
_SUBPACKAGES = ("testing", "curves", "io", "eval", "cli")


def __getattr__(name: str):  # lazy submodules and names: keep `import trainsignals` light
    import importlib

    if name in _SUBPACKAGES:
        return importlib.import_module(f".{name}", __name__)
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'trainsignals' has no attribute {name!r}")
