"""Correcting the policy gradient for the mismatch between the rollout engine and the trainer.

An engine such as vLLM samples with its own kernels (often in bf16), so the probability it gave
a sampled token differs from the probability the trainer's forward pass gives the same token
under the same weights. The samples then come from ``mu`` (the engine) while the clipped
surrogate assumes ``pi_old`` (the trainer), and the update is silently off-policy. Truncated
importance sampling (TIS; Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You
Off-Policy RL Training", https://fengyao.notion.site/off-policy-rl) weights each token's loss by
``min(pi_old / mu, C)``; the masked variant drops the tokens whose ratio leaves a band
``[low, high]`` instead (masked importance sampling). Both weights are constants (detached).
"""

from __future__ import annotations

import torch
from torch import Tensor

from lit_rlhf.algos.kl import kl_penalty
from lit_rlhf.algos.masking import masked_mean


def _log_ratio(train_log_probs: Tensor, engine_log_probs: Tensor) -> Tensor:
    return (train_log_probs.detach() - engine_log_probs.detach()).float()


def truncated_importance_weights(
    train_log_probs: Tensor, engine_log_probs: Tensor, *, cap: float
) -> Tensor:
    """TIS weights ``min(pi_old / mu, cap)`` per token, detached.

    Args:
        train_log_probs: [B, R] log-probs of the sampled tokens under the trainer's rollout
            policy (``pi_old``: recomputed by a forward pass, or the current policy's when the
            rollout gets one update).
        engine_log_probs: [B, R] the engine's log-probs of the same tokens (``mu``).
        cap: C > 0; the paper's default is 2.

    Returns:
        [B, R] weights in (0, cap]; the caller masks them.
    """
    if not cap > 0:
        raise ValueError(f"cap must be > 0 (the largest importance weight), got {cap}")
    return torch.exp(_log_ratio(train_log_probs, engine_log_probs)).clamp(max=cap)


def masked_importance_weights(
    train_log_probs: Tensor, engine_log_probs: Tensor, mask: Tensor, *, low: float, high: float
) -> Tensor:
    """The masked variant: weight 1 where ``low <= pi_old / mu <= high``, else 0 (the token is
    left out of the loss); 0 outside ``mask``.

    Args:
        train_log_probs, engine_log_probs: [B, R], as in :func:`truncated_importance_weights`.
        mask: [B, R] bool, True = the token counts.
        low, high: the band, ``0 <= low < 1 < high``.

    Returns:
        [B, R] float weights in {0, 1}.
    """
    if not 0 <= low < 1 < high:
        raise ValueError(f"the band must satisfy 0 <= low < 1 < high, got low={low}, high={high}")
    ratio = torch.exp(_log_ratio(train_log_probs, engine_log_probs))
    return (mask & (ratio >= low) & (ratio <= high)).float()


@torch.no_grad()
def mismatch_stats(train_log_probs: Tensor, engine_log_probs: Tensor, mask: Tensor) -> dict:
    """How far the engine's sampling distribution is from the trainer's, over counted tokens:
    ``abs_log_ratio`` (mean ``|log pi_old - log mu|``), ``kl`` (k3 estimate of KL(mu || pi_old),
    the samples being the engine's), ``ratio_max`` and ``ratio_min`` of ``pi_old / mu``.

    Returns:
        dict of 0-d tensors (0 for an empty mask).
    """
    log_ratio = _log_ratio(train_log_probs, engine_log_probs)
    ratio = torch.exp(log_ratio)
    kl = kl_penalty(
        engine_log_probs.detach().float(), train_log_probs.detach().float(), estimator="k3"
    )
    none = not bool(mask.any())
    return {
        "abs_log_ratio": masked_mean(log_ratio.abs(), mask),
        "kl": masked_mean(kl, mask),
        "ratio_max": ratio.new_zeros(()) if none else ratio[mask].max(),
        "ratio_min": ratio.new_zeros(()) if none else ratio[mask].min(),
    }
