"""Reusable Lightning callbacks (import path ``lit_rlhf.callbacks``).

- :class:`AdaptiveKL`: the adaptive KL coefficient rule, checkpointed.
- :class:`CompressionDiagnostics`: a compressor's faithfulness at validation (effective rank,
  decoder entropy, reconstruction fidelity, overwriting and drift probes).
- :class:`ConsistencyAnswerReward`, :class:`CritiqueConsistencyReward`: ConsistRM's label-free
  rewards for a generative reward model (reward terms).
- :class:`JudgmentRecords`: a judge's per-row validation and test judgments as JSON lines.
- :class:`MetricsPlot`: PNG of logged metrics per step at the end of fit.
- :class:`PeriodicCheckpoint`: ``last.ckpt`` and a checkpoint every N optimizer steps, as a
  resumable RL run needs them (the shipped configs use it).
- :class:`UnloggedRow`: the batch's pending metrics row in every checkpoint, whichever callback
  saves it (lit-rlhf's modules add it themselves; for a Trainer of your own).
- :class:`ModularGradientSurgery` (MGS): PCGrad per parameter group over the domains of each
  optimizer step (per-task gradients through the core's task-by-task backward).
- :class:`TrustRegionEntropy` (TRE), :class:`EntropyBonus`, :class:`ForkingTokens`,
  :class:`KLCov`: exploration terms added to the policy loss.
- :class:`TrustRegionDiagnostics`: mass outside the top-K set / nucleus and the entropy inside
  them, logged for any policy-gradient run (adds no loss).
- The callback protocols of the training core, re-exported: :func:`policy_loss_terms` /
  :class:`PolicyLossContext` (a per-token term added to a module's policy loss),
  :func:`reward_terms` / :class:`RewardContext` (a per-response term added to the rewards),
  :func:`gradient_hooks` / :class:`GradientHook` (read or rewrite gradients before clipping).
  See :mod:`lit_rlhf.training.protocols`.
"""

from lit_rlhf.callbacks.adaptive_kl import AdaptiveKL
from lit_rlhf.callbacks.compression import CompressionDiagnostics
from lit_rlhf.callbacks.consistency import ConsistencyAnswerReward, CritiqueConsistencyReward
from lit_rlhf.callbacks.exploration import EntropyBonus, ForkingTokens, KLCov, TrustRegionEntropy
from lit_rlhf.callbacks.gradient_surgery import ModularGradientSurgery
from lit_rlhf.callbacks.judgment_records import JudgmentRecords
from lit_rlhf.callbacks.reward_plot import MetricsPlot
from lit_rlhf.callbacks.trust_region_diagnostics import TrustRegionDiagnostics
from lit_rlhf.training.protocols import (
    GradientHook,
    PolicyLossContext,
    PolicyLossTerm,
    RewardContext,
    RewardTerm,
    gradient_hooks,
    policy_loss_terms,
    reward_terms,
)
from lit_rlhf.training.run_checkpoint import PeriodicCheckpoint, UnloggedRow

__all__ = [
    "AdaptiveKL",
    "CompressionDiagnostics",
    "ConsistencyAnswerReward",
    "CritiqueConsistencyReward",
    "EntropyBonus",
    "ForkingTokens",
    "GradientHook",
    "JudgmentRecords",
    "KLCov",
    "MetricsPlot",
    "ModularGradientSurgery",
    "PeriodicCheckpoint",
    "PolicyLossContext",
    "PolicyLossTerm",
    "RewardContext",
    "RewardTerm",
    "TrustRegionDiagnostics",
    "TrustRegionEntropy",
    "UnloggedRow",
    "gradient_hooks",
    "policy_loss_terms",
    "reward_terms",
]
