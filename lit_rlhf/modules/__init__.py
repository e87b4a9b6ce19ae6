"""The LightningModules."""

from lit_rlhf.modules.ppo import PPOModule

__all__ = ["PPOModule"]
