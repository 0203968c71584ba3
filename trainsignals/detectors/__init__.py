"""The streaming detectors. Each is usable alone on any stream; the Monitor runs a suite of them."""

from ._base import Detector, DetectorProtocol, Input
from .activation_health import ActivationHealth
from .cusum_plateau import CUSUMPlateau
from .ewma_z_spike import EWMAZSpike
from .layer_cliff import LayerGradCliff
from .layer_ratio import LayerUpdateRatio
from .level_shift import LevelShift
from .loss_grad_coupling import LossGradCoupling
from .oscillation import Oscillation
from .peak_ratio_spike import PeakRatioSpike
from .rank_outliers import RankOutliers
from .simple import LRAnomaly, NonFinite, UpdateRatioBand
from .slope_divergence import SlopeDivergence
from .train_val_gap import TrainValGap

__all__ = [
    "ActivationHealth",
    "CUSUMPlateau",
    "Detector",
    "DetectorProtocol",
    "EWMAZSpike",
    "Input",
    "LRAnomaly",
    "LayerGradCliff",
    "LayerUpdateRatio",
    "LevelShift",
    "LossGradCoupling",
    "NonFinite",
    "Oscillation",
    "PeakRatioSpike",
    "RankOutliers",
    "SlopeDivergence",
    "TrainValGap",
    "UpdateRatioBand",
]
