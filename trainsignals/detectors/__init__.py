"""The streaming detectors. Each is usable alone on any stream; the Monitor runs a suite of them."""

from ._base import Detector, DetectorProtocol, Input
from .activation_health import ActivationHealth
from .cusum_plateau import CUSUMPlateau
from .ewma_spike import EWMASpike, GuardedEWMASpike
from .layer_cliff import LayerGradCliff
from .layer_ratio import LayerUpdateRatio
from .ljung_box_sawtooth import LjungBoxSawtooth
from .loss_grad_coupling import LossGradCoupling
from .lr_rise_eos import LRRiseEdgeOfStability
from .rank_outliers import RankOutliers
from .simple import LRAnomaly, NonFinite, UpdateRatioBand
from .slope_divergence import SlopeDivergence
from .swing_ratio_eos import SwingRatioEdgeOfStability
from .train_val_gap import TrainValGap

__all__ = [
    "ActivationHealth",
    "CUSUMPlateau",
    "Detector",
    "DetectorProtocol",
    "EWMASpike",
    "GuardedEWMASpike",
    "Input",
    "LRAnomaly",
    "LRRiseEdgeOfStability",
    "LayerGradCliff",
    "LayerUpdateRatio",
    "LjungBoxSawtooth",
    "LossGradCoupling",
    "NonFinite",
    "RankOutliers",
    "SlopeDivergence",
    "SwingRatioEdgeOfStability",
    "TrainValGap",
    "UpdateRatioBand",
]
