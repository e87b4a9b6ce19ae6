"""The LightningModules: PPO on task prompts, a generative reward model (an LLM judge), a
scalar (Bradley-Terry) reward model, and a context compressor against a frozen decoder."""

from lit_rlhf.modules.compressor import CompressorDecoderModule
from lit_rlhf.modules.grm import GenerativeRewardModule
from lit_rlhf.modules.ppo import PPOModule
from lit_rlhf.modules.reward_model import RewardModelModule

__all__ = ["CompressorDecoderModule", "GenerativeRewardModule", "PPOModule", "RewardModelModule"]
