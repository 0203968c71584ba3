"""The streaming detectors. Each is usable alone on any stream; the Monitor runs a suite of them."""

from ._base import Detector, DetectorProtocol, Input, Knob
from ._interval import interval_settings
from .abrupt_plateau import AbruptPlateau
from .breakout_overfitting import BreakoutOverfitting
from .climb_overfitting import MemorisationClimbOverfitting
from .confirmed_z_spike import ConfirmedZSpike
from .early_climb import EarlyClimbDivergence
from .ewma_z_spike import EWMAZSpike
from .flat_fraction_saturation import FlatFractionSaturation
from .frozen_update_plateau import FrozenUpdatePlateau
from .grad_collapse_plateau import GradCollapsePlateau
from .grad_collapse_slowdown import GradCollapseSlowdown
from .grad_decoupling import GradLossDecoupling
from .joint_collapse import JointCollapse
from .layer_ratio import LayerUpdateRatio
from .level_shift import LevelShift
from .level_step_overfitting import LevelStepOverfitting
from .ljung_box_sawtooth import LjungBoxSawtooth
from .lost_progress import LostProgress
from .lr_collapse_stall import LRCollapseStall
from .lr_jump import LRJumpAnomaly
from .lr_rise_eos import LRRiseEdgeOfStability
from .lr_schedule import LRScheduleMismatch
from .median_gap_cliff import MedianGapGradCliff
from .never_improved_plateau import NeverImprovedPlateau
from .one_answer_loss_drop import OneAnswerLossDrop
from .own_drop_cliff import OwnDropGradCliff
from .peak_ratio_spike import PeakRatioSpike
from .rank_outliers import RankOutliers
from .sharp_turn_overfitting import SharpTurnOverfitting
from .signed_lost_progress import SignedLostProgress
from .signed_z_spike import SignedZSpike
from .simple import NonFinite
from .spread_collapse import SpreadCollapse
from .swing_ratio_eos import SwingRatioEdgeOfStability
from .top_share_collapse import TopShareCollapse
from .trend_divergence import TrendDivergence
from .update_gap_stall import UpdateGapStall
from .update_ratio_above_band import UpdateRatioAboveBand
from .update_ratio_below_band import UpdateRatioBelowBand
from .val_metric_chance import ValMetricChance
from .zero_fraction_dead_units import ZeroFractionDeadUnits
from .zero_run_grad_cliff import ZeroRunGradCliff

__all__ = [
    "AbruptPlateau",
    "BreakoutOverfitting",
    "Detector",
    "DetectorProtocol",
    "EarlyClimbDivergence",
    "FrozenUpdatePlateau",
    "GradCollapsePlateau",
    "GradCollapseSlowdown",
    "ConfirmedZSpike",
    "EWMAZSpike",
    "FlatFractionSaturation",
    "Input",
    "Knob",
    "LRJumpAnomaly",
    "LRScheduleMismatch",
    "LRCollapseStall",
    "LRRiseEdgeOfStability",
    "MedianGapGradCliff",
    "OwnDropGradCliff",
    "LayerUpdateRatio",
    "NeverImprovedPlateau",
    "LevelShift",
    "NonFinite",
    "PeakRatioSpike",
    "RankOutliers",
    "SharpTurnOverfitting",
    "SignedLostProgress",
    "SignedZSpike",
    "SpreadCollapse",
    "TopShareCollapse",
    "UpdateGapStall",
    "UpdateRatioAboveBand",
    "UpdateRatioBelowBand",
    "ValMetricChance",
    "ZeroFractionDeadUnits",
    "ZeroRunGradCliff",
    "GradLossDecoupling",
    "JointCollapse",
    "OneAnswerLossDrop",
    "LevelStepOverfitting",
    "LostProgress",
    "MemorisationClimbOverfitting",
    "TrendDivergence",
    "interval_settings",
    "LjungBoxSawtooth",
    "SwingRatioEdgeOfStability",
]
