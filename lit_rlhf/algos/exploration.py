"""Exploration baselines that TRE (arXiv 2602.03635) is compared with (the coefficient schedule
they share, ``CoefficientSchedule``, lives in :mod:`lit_rlhf.algos.schedules`; imported here too).

- Forking tokens (Wang et al. 2025, arXiv 2506.01939): the policy loss only on the top 20 % of
  response tokens by entropy.
- KL-Cov (Cui et al. 2025, arXiv 2505.22617): a |log-ratio| penalty on the few tokens with the
  largest centred covariance between advantage and log-prob.

Both select an exact count, ceil(fraction * n_counted) (at least 1), of the counted tokens of the
whole tensor (the micro-batch), ties broken by position. The authors' code differs slightly:
the forking-token recipes keep every token at or above an entropy quantile (ties may add a few),
and KL-Cov takes max(1, floor(fraction * n)).
"""

from __future__ import annotations

import torch
from torch import Tensor

from lit_rlhf.algos.masking import masked_mean
from lit_rlhf.algos.schedules import CoefficientSchedule, ScheduleKind

__all__ = [
    "CoefficientSchedule",
    "ScheduleKind",
    "forking_token_mask",
    "kl_cov_penalty",
    "kl_cov_selection",
]


def _top_fraction_of_counted(scores: Tensor, mask: Tensor, top_fraction: float) -> Tensor:
    """bool mask of the ceil(top_fraction * n) highest-scoring counted elements (>= 1 if n > 0)."""
    if not 0 < top_fraction <= 1:
        raise ValueError(f"top_fraction must be in (0, 1], got {top_fraction}")
    if mask.dtype != torch.bool or mask.shape != scores.shape:
        raise ValueError(
            f"mask must be bool with the scores' shape {tuple(scores.shape)}, got "
            f"{mask.dtype} {tuple(mask.shape)}"
        )
    flat_scores, flat_mask = scores.detach().reshape(-1), mask.reshape(-1)
    # Two stable sorts: by score, then counted-first, so padding can never take a slot even if a
    # counted score is -inf; ties keep position order, which makes the choice deterministic.
    by_score = torch.argsort(flat_scores, descending=True, stable=True)
    counted_first = torch.argsort(flat_mask[by_score].to(torch.uint8), descending=True, stable=True)
    order = by_score[counted_first]
    rank = torch.empty_like(order)
    rank[order] = torch.arange(order.numel(), device=order.device)
    # float64 and a small tolerance: 0.2 * 15 is 3.0000000000000004, whose ceil would be 4.
    n_counted = flat_mask.sum().to(torch.float64)
    n_selected = torch.ceil(n_counted * top_fraction - 1e-6).clamp(min=1)
    return ((rank < n_selected) & flat_mask).reshape(mask.shape)


def forking_token_mask(entropy: Tensor, mask: Tensor, *, top_fraction: float = 0.2) -> Tensor:
    """The highest-entropy ("forking") counted tokens of the batch (arXiv 2506.01939).

    Wang et al. restrict the policy-gradient loss to these tokens: AND this mask into the loss
    mask. Exactly ceil(top_fraction * n_counted) tokens are selected (at least 1 when any token
    counts, none when none does), never a masked-out one.

    Args:
        entropy: [B, R] per-token entropy of the policy (e.g. ``entropy_from_logits``); detached.
        mask: [B, R] bool, True = the token counts.
        top_fraction: share of counted tokens to keep, in (0, 1] (paper: 0.2).

    Returns:
        [B, R] bool, True = keep this token's policy loss.
    """
    return _top_fraction_of_counted(entropy, mask, top_fraction)


def kl_cov_selection(
    advantages: Tensor, log_probs: Tensor, mask: Tensor, *, top_fraction: float = 0.002
) -> Tensor:
    """Tokens with the largest centred covariance of advantage and log-prob (arXiv 2505.22617).

    ``cov_t = (A_t - mean A) * (logp_t - mean logp)``, means over counted tokens, all detached;
    the top ceil(top_fraction * n_counted) counted tokens (at least 1) are selected. These are
    the tokens whose updates drive entropy down fastest (Cui et al.).

    Args:
        advantages: [B, R] per-token advantages.
        log_probs: [B, R] log-probs of the sampled tokens under the current policy.
        mask: [B, R] bool, True = the token counts.
        top_fraction: share of counted tokens to select, in (0, 1] (paper: 0.002, i.e. 0.2 %).

    Returns:
        [B, R] bool, True = penalise this token (``kl_cov_penalty``).
    """
    if advantages.shape != log_probs.shape:
        raise ValueError(
            f"advantages {tuple(advantages.shape)} and log_probs {tuple(log_probs.shape)} "
            "must have the same shape"
        )
    adv, logp = advantages.detach().float(), log_probs.detach().float()
    covariance = (adv - masked_mean(adv, mask)) * (logp - masked_mean(logp, mask))
    return _top_fraction_of_counted(covariance, mask, top_fraction)


def kl_cov_penalty(
    log_probs: Tensor, old_log_probs: Tensor, selected: Tensor, *, coef: float = 1.0
) -> Tensor:
    """Per-token KL-Cov penalty ``coef * |logp - logp_old|`` on the selected tokens.

    Add it to the per-token policy loss before aggregation (arXiv 2505.22617, KL-Cov; the
    authors use coef 1.0). Note the authors add it to the unclipped ``-A * ratio``: KL-Cov
    replaces PPO's clip rather than adding to it.

    Args:
        log_probs: [B, R] log-probs under the policy being trained (the gradient flows here).
        old_log_probs: [B, R] log-probs under the rollout policy (detached).
        selected: [B, R] bool from ``kl_cov_selection``.
        coef: penalty coefficient, >= 0.

    Returns:
        [B, R] penalty, 0 where not selected.
    """
    if coef < 0:
        raise ValueError(f"coef must be >= 0 (it is a penalty), got {coef}")
    penalty = coef * (log_probs - old_log_probs.detach()).abs()
    return torch.where(selected, penalty, 0.0)
