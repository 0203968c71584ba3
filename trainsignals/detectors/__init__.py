"""The streaming detectors. Each is usable alone on any stream; the Monitor runs a suite of them."""

from ._base import Detector, DetectorProtocol, Input
from .activation_health import ActivationHealth
from .cusum_plateau import CUSUMPlateau
from .ewma_spike import EWMASpike, GuardedEWMASpike
from .layer_cliff import LayerGradCliff
from .layer_ratio import LayerUpdateRatio
from .loss_grad_coupling import LossGradCoupling
from .oscillation import Oscillation
from .rank_outliers import RankOutliers
from .simple import LRAnomaly, NonFinite, UpdateRatioBand
from .slope_divergence import SlopeDivergence
from .top_share_collapse import TopShareCollapse
from .train_val_gap import TrainValGap
from .val_metric_chance import ValMetricChance

__all__ = [
    "ActivationHealth",
    "CUSUMPlateau",
    "Detector",
    "DetectorProtocol",
    "EWMASpike",
    "GuardedEWMASpike",
    "Input",
    "LRAnomaly",
    "LayerGradCliff",
    "LayerUpdateRatio",
    "LossGradCoupling",
    "NonFinite",
    "Oscillation",
    "RankOutliers",
    "SlopeDivergence",
    "TopShareCollapse",
    "TrainValGap",
    "UpdateRatioBand",
    "ValMetricChance",
]
