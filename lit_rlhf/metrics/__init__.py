"""Evaluation metrics (torchmetrics) shared by the modules."""

from lit_rlhf.metrics.fidelity import EffectiveRank, MeanTokenEntropy, ReconstructionFidelity
from lit_rlhf.metrics.grouped import GroupedMean
from lit_rlhf.metrics.judge import JudgeMetrics, PositionalConsistency, majority_verdict

__all__ = [
    "EffectiveRank",
    "GroupedMean",
    "JudgeMetrics",
    "MeanTokenEntropy",
    "PositionalConsistency",
    "ReconstructionFidelity",
    "majority_verdict",
]
