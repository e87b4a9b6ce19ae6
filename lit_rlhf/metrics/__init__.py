"""Evaluation metrics (torchmetrics) shared by the modules."""

from lit_rlhf.metrics.judge import JudgeMetrics, PositionalConsistency, majority_verdict

__all__ = ["JudgeMetrics", "PositionalConsistency", "majority_verdict"]
