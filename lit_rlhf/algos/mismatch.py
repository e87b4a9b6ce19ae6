"""Correcting the policy gradient for the mismatch between the rollout engine and the trainer.

An engine such as vLLM samples with its own kernels (often in bf16), so the probability it gave
a sampled token differs from the probability the trainer's forward pass gives the same token
under the same weights. The samples then come from ``mu`` (the engine) while the clipped
surrogate assumes ``pi_old`` (the trainer), and the update is silently off-policy. Truncated
importance sampling (TIS; Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You
Off-Policy RL Training", https://fengyao.notion.site/off-policy-rl) weights each token's loss by
the ratio ``pi_old / mu`` truncated to ``[floor, cap]``; masked importance sampling keeps the
ratio as the weight inside a band ``[low, high]`` and gives 0 outside it (the token leaves the
loss). At the ``sequence`` level one ratio per sequence, the product of its counted tokens'
ratios ``exp(sum_t log(pi_old / mu))``, is truncated or masked and weights every token of the
sequence. The four combinations are TRL 1.16's ``vllm_importance_sampling_mode`` values
``token_truncate``, ``token_mask``, ``sequence_truncate`` and ``sequence_mask`` (bounds
``vllm_importance_sampling_clip_min`` / ``_clip_max``). All weights are constants (detached).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from lit_rlhf.algos.kl import kl_penalty
from lit_rlhf.algos.masking import masked_mean, masked_sum

ImportanceLevel = Literal["token", "sequence"]


def _log_ratio(train_log_probs: Tensor, engine_log_probs: Tensor) -> Tensor:
    return (train_log_probs.detach() - engine_log_probs.detach()).float()


def importance_log_ratios(
    train_log_probs: Tensor,
    engine_log_probs: Tensor,
    mask: Tensor | None = None,
    *,
    level: ImportanceLevel = "token",
) -> Tensor:
    """``log(pi_old / mu)``, detached, float32: per token (``level="token"``), or each row's sum
    over its counted tokens (the log of the product of the token ratios) repeated on every
    position of the row (``level="sequence"``, which needs ``mask``).

    Returns:
        [B, R].
    """
    log_ratio = _log_ratio(train_log_probs, engine_log_probs)
    if level == "token":
        return log_ratio
    if level != "sequence":
        raise ValueError(f"level must be 'token' or 'sequence', got {level!r}")
    if mask is None:
        raise ValueError("a sequence-level ratio sums over the counted tokens: pass mask")
    return masked_sum(log_ratio, mask, dim=-1)[:, None].expand_as(log_ratio)


def truncated_importance_weights(
    train_log_probs: Tensor,
    engine_log_probs: Tensor,
    *,
    cap: float,
    floor: float = 0.0,
    level: ImportanceLevel = "token",
    mask: Tensor | None = None,
) -> Tensor:
    """TIS weights: the ratio ``pi_old / mu`` clamped to ``[floor, cap]``, detached.

    Args:
        train_log_probs: [B, R] log-probs of the sampled tokens under the trainer's rollout
            policy (``pi_old``: recomputed by a forward pass, or the current policy's when the
            rollout gets one update).
        engine_log_probs: [B, R] the engine's log-probs of the same tokens (``mu``).
        cap: C > 0, the largest weight; the paper's default is 2.
        floor: the smallest weight, ``0 <= floor < cap`` (0: no lower bound).
        level: ``token`` (one ratio per token) or ``sequence`` (one per row, the product of the
            counted tokens' ratios, on every position of the row; needs ``mask``).
        mask: [B, R] bool, True = the token counts (read at the sequence level only).

    Returns:
        [B, R] weights in [floor, cap]; the caller masks them.
    """
    if not cap > 0:
        raise ValueError(f"cap must be > 0 (the largest importance weight), got {cap}")
    if not 0 <= floor < cap:
        raise ValueError(f"floor must satisfy 0 <= floor < cap, got floor={floor}, cap={cap}")
    log_ratio = importance_log_ratios(train_log_probs, engine_log_probs, mask, level=level)
    return torch.exp(log_ratio).clamp(min=floor, max=cap)


def masked_importance_weights(
    train_log_probs: Tensor,
    engine_log_probs: Tensor,
    mask: Tensor,
    *,
    low: float,
    high: float,
    level: ImportanceLevel = "token",
) -> Tensor:
    """Masked IS: the ratio ``pi_old / mu`` itself where ``low <= ratio <= high``, 0 where it
    leaves the band (the token, or at the sequence level the whole row, leaves the loss) and 0
    outside ``mask``. Example: ``pi_old = [0.5, 0.2, 0.9]``, ``mu = [0.4, 0.05, 0.9]``, band
    ``[0, 2]`` give ``[1.25, 0, 1]``.

    Args:
        train_log_probs, engine_log_probs: [B, R], as in :func:`truncated_importance_weights`.
        mask: [B, R] bool, True = the token counts.
        low, high: the band, ``0 <= low < 1 < high``.
        level: ``token`` or ``sequence``, as in :func:`truncated_importance_weights`.

    Returns:
        [B, R] float weights, each 0 or in ``[low, high]``.
    """
    if not 0 <= low < 1 < high:
        raise ValueError(f"the band must satisfy 0 <= low < 1 < high, got low={low}, high={high}")
    ratio = torch.exp(importance_log_ratios(train_log_probs, engine_log_probs, mask, level=level))
    kept = mask & (ratio >= low) & (ratio <= high)
    return torch.where(kept, ratio, torch.zeros((), dtype=ratio.dtype, device=ratio.device))


def importance_weights(
    train_log_probs: Tensor,
    engine_log_probs: Tensor,
    mask: Tensor,
    *,
    correction: str,
    level: ImportanceLevel = "token",
    cap: float = 2.0,
    floor: float = 0.0,
    low: float = 0.5,
    high: float = 2.0,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The weights of ``correction`` (``tis``: :func:`truncated_importance_weights` with ``cap``
    and ``floor``; ``mask``: :func:`masked_importance_weights` with ``low`` and ``high``) and
    their diagnostics over the counted tokens: ``weight_mean``; ``capped_fraction`` (and
    ``floored_fraction`` when ``floor > 0``) for ``tis``, ``masked_fraction`` for ``mask``.

    Returns:
        ([B, R] weights, dict of 0-d tensors).
    """
    if correction == "tis":
        weights = truncated_importance_weights(
            train_log_probs, engine_log_probs, cap=cap, floor=floor, level=level, mask=mask
        )
        stats = {"capped_fraction": masked_mean((weights >= cap).float(), mask)}
        if floor > 0:
            stats["floored_fraction"] = masked_mean((weights <= floor).float(), mask)
    elif correction == "mask":
        weights = masked_importance_weights(
            train_log_probs, engine_log_probs, mask, low=low, high=high, level=level
        )
        log_ratio = importance_log_ratios(train_log_probs, engine_log_probs, mask, level=level)
        ratio = torch.exp(log_ratio)
        outside = (ratio < low) | (ratio > high)
        stats = {"masked_fraction": masked_mean(outside.float(), mask)}
    else:
        raise ValueError(f"correction must be 'tis' or 'mask', got {correction!r}")
    stats["weight_mean"] = masked_mean(weights, mask)
    return weights, stats


def sequence_mean_weights(weights: Tensor, mask: Tensor) -> Tensor:
    """Each row's mean weight over its counted tokens, on every position of the row: how TRL
    1.16 weights a GSPO sequence (``importance_sampling_level="sequence"``) by token-level IS
    weights (its [B, 1] sequence loss times the [B, R] weights, averaged per sequence).

    Returns:
        [B, R].
    """
    return masked_mean(weights, mask, dim=-1)[:, None].expand_as(weights)


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
