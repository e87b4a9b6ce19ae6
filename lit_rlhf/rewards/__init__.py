"""Reward functions: callables ``(prompts, completions, rows) -> RewardOutput``."""

from lit_rlhf.rewards.base import RewardFunction
from lit_rlhf.rewards.by_task import RewardByTask
from lit_rlhf.rewards.combine import WeightedRewards
from lit_rlhf.rewards.countdown import CountdownReward
from lit_rlhf.rewards.guarded import GuardedReward
from lit_rlhf.rewards.instructions import InstructionReward
from lit_rlhf.rewards.judge import JudgeReward
from lit_rlhf.rewards.math import MathReward
from lit_rlhf.rewards.reward_model import ScalarRMReward
from lit_rlhf.rewards.similarity import ReferenceSimilarityReward
from lit_rlhf.rewards.simple import DigitFractionReward
from lit_rlhf.rewards.verdict import VerdictReward

__all__ = [
    "CountdownReward",
    "DigitFractionReward",
    "GuardedReward",
    "InstructionReward",
    "JudgeReward",
    "MathReward",
    "ReferenceSimilarityReward",
    "RewardByTask",
    "RewardFunction",
    "ScalarRMReward",
    "VerdictReward",
    "WeightedRewards",
]
