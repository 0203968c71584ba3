"""The streaming detectors. Each is usable alone on any stream; the Monitor runs a suite of them."""

from ._base import Detector, DetectorProtocol, Input, Knob
from .abrupt_plateau import AbruptPlateau
from .activation_health import ActivationHealth
from .ewma_spike import EWMASpike, GuardedEWMASpike
from .frozen_update_plateau import FrozenUpdatePlateau
from .grad_collapse_plateau import GradCollapsePlateau
from .grad_collapse_slowdown import GradCollapseSlowdown
from .layer_cliff import LayerGradCliff
from .layer_ratio import LayerUpdateRatio
from .loss_grad_coupling import LossGradCoupling
from .never_improved_plateau import NeverImprovedPlateau
from .oscillation import Oscillation
from .rank_outliers import RankOutliers
from .simple import LRAnomaly, NonFinite
from .slope_divergence import SlopeDivergence
from .top_share_collapse import TopShareCollapse
from .train_val_gap import TrainValGap
from .update_ratio_above_band import UpdateRatioAboveBand
from .update_ratio_below_band import UpdateRatioBelowBand
from .val_metric_chance import ValMetricChance

__all__ = [
    "AbruptPlateau",
    "ActivationHealth",
    "Detector",
    "DetectorProtocol",
    "EWMASpike",
    "FrozenUpdatePlateau",
    "GradCollapsePlateau",
    "GradCollapseSlowdown",
    "GuardedEWMASpike",
    "Input",
    "Knob",
    "LRAnomaly",
    "LayerGradCliff",
    "LayerUpdateRatio",
    "LossGradCoupling",
    "NeverImprovedPlateau",
    "NonFinite",
    "Oscillation",
    "RankOutliers",
    "SlopeDivergence",
    "TopShareCollapse",
    "TrainValGap",
    "UpdateRatioAboveBand",
    "UpdateRatioBelowBand",
    "ValMetricChance",
]
