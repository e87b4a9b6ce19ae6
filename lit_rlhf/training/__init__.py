"""The training core every LightningModule of lit-rlhf composes (and any other may).

- :class:`OptimizerStep`: micro-batch backward, gradient hooks, clipping and the optimizer step,
  the same under one process, DDP and DeepSpeed; it sets the lr of every step from the modules'
  ``optim`` group (:class:`~lit_rlhf.settings.OptimSettings`: warmup, then constant / linear /
  cosine; :mod:`.lr_schedule`).
- :class:`NonFiniteSkips` / :class:`CheckpointOnInterrupt` (:mod:`.faults`): the optimizer step's
  skip of non-finite steps, and a resumable checkpoint on SIGTERM / Ctrl-C.
- :class:`FrozenModules` / :func:`freeze`: frozen models (a reference policy, a frozen decoder)
  kept out of checkpoints and put back on load.
- :func:`export_pretrained` (:mod:`.export`): the end-of-fit Hugging Face folder of a trained
  model and its tokenizer (ZeRO-3 partitions gathered first).
- :class:`AtomicCheckpointIO`: checkpoint files written under a temporary name, then renamed.
- :class:`EpochEndLoaderReset`: a callback; a resume from a checkpoint taken at an epoch's last
  batch starts the next epoch with a fresh train loader (not the spent epoch's position).
- :class:`GlobalRNGState`: a callback that keeps the global generators' states (torch, Python,
  NumPy) in checkpoints and carries them from one training batch to the next.
- :class:`RolloutCollector`: generation engine + reward + reward-term callbacks -> a scored
  :class:`~lit_rlhf.types.Rollout`.
- :func:`build_experience` / :class:`PPOUpdate` / :class:`PPOSettings`: advantages and the
  clipped policy update, driven by a validated settings record; :class:`PolicyStep` runs one
  rollout -> experience -> updates -> logs cycle on a module's networks, and
  :func:`build_policy_networks` builds them (policy, critic, frozen reference).
- :func:`check_trainable_precision` / :func:`resolve_precision` (:mod:`.precision`): trainable
  weights are never stepped in 16 bits without float32 masters; ``precision: auto`` resolved
  for the hardware.
- The callback protocols (:mod:`lit_rlhf.training.protocols`): loss terms, reward terms,
  gradient hooks and per-task gradients (the backward task by task, :mod:`.task_backward`), with
  :class:`Gradients` as the strategy-aware gradient accessor.
"""

from lit_rlhf.training.batching import critic_values, minibatches, trim_columns
from lit_rlhf.training.checkpoint_io import AtomicCheckpointIO
from lit_rlhf.training.experience import build_experience, compute_advantages, experience_stats
from lit_rlhf.training.export import export_pretrained
from lit_rlhf.training.faults import CheckpointOnInterrupt, NonFiniteSkips
from lit_rlhf.training.frozen import FrozenModules, freeze
from lit_rlhf.training.gradients import Gradients
from lit_rlhf.training.loader_position import EpochEndLoaderReset
from lit_rlhf.training.lr_schedule import LRSchedule
from lit_rlhf.training.model_hooks import ExportedModelHooks
from lit_rlhf.training.networks import PolicyNetworks, begin_configure_model, build_policy_networks
from lit_rlhf.training.optimization import OptimizerStep
from lit_rlhf.training.policy_step import PolicyStep
from lit_rlhf.training.ppo_update import MicroBatch, PPOUpdate
from lit_rlhf.training.precision import check_trainable_precision, resolve_precision
from lit_rlhf.training.protocols import (
    GradientHook,
    PolicyLossContext,
    PolicyLossTerm,
    RewardContext,
    RewardTerm,
    TaskGradientHook,
    gradient_hooks,
    policy_loss_terms,
    reward_terms,
    task_gradient_hook,
)
from lit_rlhf.training.rng import GlobalRNGState
from lit_rlhf.training.rollouts import RolloutCollector, rollout_stats
from lit_rlhf.training.settings import PPOSettings

__all__ = [
    "AtomicCheckpointIO",
    "CheckpointOnInterrupt",
    "EpochEndLoaderReset",
    "ExportedModelHooks",
    "FrozenModules",
    "GlobalRNGState",
    "GradientHook",
    "Gradients",
    "LRSchedule",
    "MicroBatch",
    "NonFiniteSkips",
    "OptimizerStep",
    "PPOSettings",
    "PPOUpdate",
    "PolicyLossContext",
    "PolicyLossTerm",
    "PolicyNetworks",
    "PolicyStep",
    "RewardContext",
    "RewardTerm",
    "RolloutCollector",
    "TaskGradientHook",
    "begin_configure_model",
    "build_experience",
    "build_policy_networks",
    "check_trainable_precision",
    "compute_advantages",
    "critic_values",
    "experience_stats",
    "export_pretrained",
    "freeze",
    "gradient_hooks",
    "minibatches",
    "policy_loss_terms",
    "resolve_precision",
    "reward_terms",
    "rollout_stats",
    "task_gradient_hook",
    "trim_columns",
]
