"""The LightningModules: PPO on task prompts, a generative reward model (an LLM judge), and a
scalar (Bradley-Terry) reward model."""

from lit_rlhf.modules.grm import GenerativeRewardModule
from lit_rlhf.modules.ppo import PPOModule
from lit_rlhf.modules.reward_model import RewardModelModule

__all__ = ["GenerativeRewardModule", "PPOModule", "RewardModelModule"]
