"""The streaming detectors. Each is usable alone on any stream; the Monitor runs a suite of them."""

from ._base import Detector, DetectorProtocol, Input
from .activation_health import ActivationHealth
from .breakout_overfitting import BreakoutOverfitting
from .climb_overfitting import MemorisationClimbOverfitting
from .cusum_plateau import CUSUMPlateau
from .early_climb import EarlyClimbDivergence
from .ewma_spike import EWMASpike, GuardedEWMASpike
from .grad_decoupling import GradLossDecoupling
from .joint_collapse import JointCollapse
from .layer_cliff import LayerGradCliff
from .layer_ratio import LayerUpdateRatio
from .level_step_overfitting import LevelStepOverfitting
from .lost_progress import LostProgress
from .oscillation import Oscillation
from .rank_outliers import RankOutliers
from .simple import LRAnomaly, NonFinite, UpdateRatioBand
from .trend_divergence import TrendDivergence

__all__ = [
    "ActivationHealth",
    "BreakoutOverfitting",
    "CUSUMPlateau",
    "Detector",
    "DetectorProtocol",
    "EarlyClimbDivergence",
    "EWMASpike",
    "GradLossDecoupling",
    "GuardedEWMASpike",
    "Input",
    "JointCollapse",
    "LRAnomaly",
    "LayerGradCliff",
    "LayerUpdateRatio",
    "LevelStepOverfitting",
    "LostProgress",
    "MemorisationClimbOverfitting",
    "NonFinite",
    "Oscillation",
    "RankOutliers",
    "TrendDivergence",
    "UpdateRatioBand",
]
