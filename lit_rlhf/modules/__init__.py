"""The LightningModules: PPO on task prompts, and a generative reward model (an LLM judge)."""

from lit_rlhf.modules.grm import GenerativeRewardModule
from lit_rlhf.modules.ppo import PPOModule

__all__ = ["GenerativeRewardModule", "PPOModule"]
