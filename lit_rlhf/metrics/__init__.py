"""Evaluation metrics (torchmetrics) shared by the modules."""

from lit_rlhf.metrics.grouped import GroupedMean
from lit_rlhf.metrics.judge import JudgeMetrics, PositionalConsistency, majority_verdict

__all__ = ["GroupedMean", "JudgeMetrics", "PositionalConsistency", "majority_verdict"]
