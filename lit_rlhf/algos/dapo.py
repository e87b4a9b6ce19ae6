"""DAPO's rollout shaping (Yu et al. 2025, arXiv 2503.14476): dynamic sampling keeps only the
groups whose rewards differ (sec. 3.2), the overlong filter leaves truncated responses out of the
loss and the soft overlong punishment penalises length near the cap (sec. 3.4, eq. 13).
Clip-higher (sec. 3.1) is ``clip_high`` of the PPO loss and the token-level loss (sec. 3.3) is
``aggregate_loss(mode="token_mean")``.
"""

from __future__ import annotations

import torch
from torch import Tensor


def informative_groups(scores: Tensor, group_ids: Tensor, *, atol: float = 0.0) -> Tensor:
    """Dynamic sampling's filter: per sample, whether its group's scores are not all equal
    (a group whose samples all score the same has advantage 0 under any group baseline, so it
    only dilutes the batch).

    Args:
        scores: [B] scalar reward per sample.
        group_ids: [B] long, samples with the same label form a group.
        atol: scores closer than this count as equal.

    Returns:
        [B] bool, True = the sample's group carries a learning signal.
    """
    scores = scores.detach().float()
    uniques, inverse = torch.unique(group_ids, return_inverse=True)
    n = int(uniques.numel())
    high = scores.new_full((n,), -torch.inf).scatter_reduce(0, inverse, scores, reduce="amax")
    low = scores.new_full((n,), torch.inf).scatter_reduce(0, inverse, scores, reduce="amin")
    return ((high - low) > atol)[inverse]


def truncated_responses(response_mask: Tensor, ended: Tensor) -> Tensor:
    """[B] bool: responses cut by the length cap (no end-of-sequence token) and not empty.

    Args:
        response_mask: [B, R] bool.
        ended: [B] bool, True where the response ended with an end-of-sequence token.
    """
    return response_mask.any(dim=-1) & ~ended


def overlong_penalty(
    lengths: Tensor, *, max_length: int, buffer: int, factor: float = 1.0
) -> Tensor:
    """DAPO's soft overlong punishment (eq. 13), added to the reward.

    With ``L_max = max_length`` and ``L_cache = buffer``: 0 for ``|y| <= L_max - L_cache``,
    ``((L_max - L_cache) - |y|) / L_cache`` inside the buffer (from 0 down to -1), and -1
    beyond ``L_max``; scaled by ``factor``.

    Args:
        lengths: [B] response lengths in tokens.
        max_length: L_max, the generation cap.
        buffer: L_cache, 1 <= buffer <= max_length.
        factor: the penalty's weight (1 in the paper).

    Returns:
        [B] float penalties in [-factor, 0].
    """
    if not 1 <= buffer <= max_length:
        raise ValueError(f"buffer must be in [1, max_length={max_length}], got {buffer}")
    if factor < 0:
        raise ValueError(f"factor must be >= 0, got {factor}")
    expected = max_length - buffer
    over = lengths.float() - expected
    penalty = torch.where(over <= 0, torch.zeros_like(over), -over / buffer)
    return factor * penalty.clamp(min=-1.0)
