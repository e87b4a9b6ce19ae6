"""The LightningModules: PPO on task prompts, a generative reward model (an LLM judge), a
scalar (Bradley-Terry) reward model, a context compressor against a frozen decoder,
supervised fine-tuning (SFT) of a causal LM, and offline preference optimisation (DPO, IPO,
SimPO) on labelled pairs."""

from lit_rlhf.modules.compressor import CompressorDecoderModule
from lit_rlhf.modules.dpo import DPOModule
from lit_rlhf.modules.grm import GenerativeRewardModule
from lit_rlhf.modules.ppo import PPOModule
from lit_rlhf.modules.reward_model import RewardModelModule
from lit_rlhf.modules.sft import SFTModule

__all__ = [
    "CompressorDecoderModule",
    "DPOModule",
    "GenerativeRewardModule",
    "PPOModule",
    "RewardModelModule",
    "SFTModule",
]
