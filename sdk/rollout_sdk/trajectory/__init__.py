"""Archiving finished rollouts as ATIF trajectory documents (upstream's
``osmosis_ai.rollout.trajectory``), whatever backend ran them."""

from rollout_sdk.trajectory.converter import convert_sample_to_trajectory
from rollout_sdk.trajectory.report import TrajectoryReport, report_from_response
from rollout_sdk.trajectory.save import save_trajectory

__all__ = [
    "TrajectoryReport",
    "convert_sample_to_trajectory",
    "report_from_response",
    "save_trajectory",
]
