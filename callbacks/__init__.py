"""Reusable Lightning callbacks (import path ``lit_rlhf.callbacks``).

- :class:`AdaptiveKL`: the adaptive KL coefficient rule, checkpointed.
- :class:`MetricsPlot`: PNG of logged metrics per step at the end of fit.
- :class:`TrustRegionEntropy` (TRE), :class:`EntropyBonus`, :class:`ForkingTokens`,
  :class:`KLCov`: exploration terms added to the policy loss.
- :func:`policy_loss_terms` / :class:`PolicyLossContext`: the protocol by which a callback adds a
  per-token term to a module's policy loss.
"""

from lit_rlhf.callbacks.adaptive_kl import AdaptiveKL
from lit_rlhf.callbacks.exploration import EntropyBonus, ForkingTokens, KLCov, TrustRegionEntropy
from lit_rlhf.callbacks.loss_terms import PolicyLossContext, PolicyLossTerm, policy_loss_terms
from lit_rlhf.callbacks.reward_plot import MetricsPlot

__all__ = [
    "AdaptiveKL",
    "EntropyBonus",
    "ForkingTokens",
    "KLCov",
    "MetricsPlot",
    "PolicyLossContext",
    "PolicyLossTerm",
    "TrustRegionEntropy",
    "policy_loss_terms",
]
