"""PPO's clipped objectives, loss aggregation, and the critic's explained variance.

The losses return PER-TOKEN values [B, R] (0 outside the mask) instead of a scalar: the caller
chooses how to aggregate (``aggregate_loss``), and callbacks can add their own per-token terms
(entropy bonus, KL) before aggregation. Stats are detached masked means, never ``.item()``.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import torch
from torch import Tensor

from lit_rlhf.algos.kl import kl_penalty
from lit_rlhf.algos.masking import masked_mean, masked_sum, masked_var

AggregationMode = Literal[
    "token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm"
]


class PolicyLossStats(NamedTuple):
    clip_fraction: Tensor  # [] share of counted tokens whose gradient a clip zeroed
    approx_kl: Tensor  # [] k3 estimate of KL(old || new), masked mean
    ratio_mean: Tensor  # [] masked mean of pi_new / pi_old
    ratio_max: Tensor  # [] largest ratio over counted tokens (0 when none count)
    dual_clip_fraction: Tensor  # [] share of counted tokens capped by the dual clip


class ValueLossStats(NamedTuple):
    clip_fraction: Tensor  # [] share of counted tokens where the clipped branch is the max
    value_mean: Tensor  # [] masked mean of the predicted values


def _zero_outside(x: Tensor, mask: Tensor) -> Tensor:
    return torch.where(mask, x, torch.zeros((), dtype=x.dtype, device=x.device))


def clipped_policy_loss(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
) -> tuple[Tensor, PolicyLossStats]:
    """PPO's clipped surrogate loss, per token (Schulman et al. 2017, arXiv 1707.06347, eq. 7).

    ``ratio = exp(logp - logp_old)`` and
    ``loss = max(-A * ratio, -A * clip(ratio, 1 - clip_low, 1 + clip_high))``.
    Separate ``clip_low``/``clip_high`` allow DAPO's clip-higher (arXiv 2503.14476).
    With ``dual_clip = c > 1`` (Ye et al. 2020, arXiv 1912.09729), tokens with ``A < 0`` are
    further capped at ``-A * c`` so a huge ratio cannot produce an unbounded loss.

    Args:
        log_probs: [B, R] log-probs of the sampled tokens under the policy being trained.
        old_log_probs: [B, R] the same under the policy that collected the rollout (detached).
        advantages: [B, R] per-token advantages (detached).
        mask: [B, R] bool, True = the token counts.
        clip_low: lower clip range epsilon, ratio >= 1 - clip_low.
        clip_high: upper clip range epsilon, ratio <= 1 + clip_high.
        dual_clip: the dual-clip constant c (> 1), or None to disable.

    Returns:
        (per-token loss [B, R] with 0 outside the mask, PolicyLossStats).
    """
    _check_policy_clips(clip_low, clip_high, dual_clip)
    old_log_probs, advantages = old_log_probs.detach(), advantages.detach()
    ratio = torch.exp(log_probs - old_log_probs)
    return _clipped_surrogate(
        ratio, log_probs, old_log_probs, advantages, mask,
        clip_low=clip_low, clip_high=clip_high, dual_clip=dual_clip,
    )  # fmt: skip


def gspo_policy_loss(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float = 3e-4,
    clip_high: float = 4e-4,
    dual_clip: float | None = None,
) -> tuple[Tensor, PolicyLossStats]:
    """GSPO's sequence-level clipped loss, per token (Zheng et al. 2025, arXiv 2507.18071, eq. 5
    with the length-normalised sequence ratio of eq. 7, in the token form GSPO-token of sec. 4.3).

    The sequence ratio is the geometric mean of the token ratios over the counted tokens,
    ``s_i = exp(mean_t (logp_t - logp_old_t))``. Each token carries ``s_i``'s value with its own
    log-prob's gradient, ``s_it = sg[s_i] * pi_t / sg[pi_t]``, and the PPO surrogate is clipped on
    that value: the clip keeps or drops a whole sequence. With the same advantage on every token
    and ``aggregate_loss(mode="seq_mean_token_mean")`` this is exactly the sequence objective:
    ``grad s_i = s_i * mean_t grad logp_t``. The paper's clip ranges are 3e-4 / 4e-4 (sec. 5.1).
    A sequence with no counted token has ratio 1 and contributes nothing.

    Args and returns: as :func:`clipped_policy_loss`; ``ratio_mean`` / ``ratio_max`` in the
    stats are of the sequence ratios (taken per token, so weighted by length).
    """
    _check_policy_clips(clip_low, clip_high, dual_clip)
    old_log_probs, advantages = old_log_probs.detach(), advantages.detach()
    lengths = mask.sum(dim=-1, keepdim=True).clamp(min=1).to(log_probs.dtype)
    seq_log_ratio = masked_sum(log_probs.detach() - old_log_probs, mask, dim=-1)[:, None] / lengths
    ratio = torch.exp(seq_log_ratio + log_probs - log_probs.detach())
    return _clipped_surrogate(
        ratio, log_probs, old_log_probs, advantages, mask,
        clip_low=clip_low, clip_high=clip_high, dual_clip=dual_clip,
    )  # fmt: skip


def _clipped_surrogate(
    ratio: Tensor,
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float,
    clip_high: float,
    dual_clip: float | None,
) -> tuple[Tensor, PolicyLossStats]:
    """The clipped surrogate on a given importance ratio (token or sequence level)."""
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1 - clip_low, 1 + clip_high)
    loss = torch.maximum(unclipped, clipped)
    # The clipped branch wins strictly only when the ratio left the trust region in the
    # direction the advantage rewards; there its value is constant in the ratio.
    clip_active = clipped > unclipped
    dual_active = torch.zeros_like(clip_active)
    if dual_clip is not None:
        cap = -advantages * dual_clip
        dual_active = (advantages < 0) & (loss > cap)
        loss = torch.where(dual_active, cap, loss)
    stats = _policy_loss_stats(
        log_probs, old_log_probs, ratio, mask, clip_active=clip_active, dual_active=dual_active
    )
    return _zero_outside(loss, mask), stats


def _check_policy_clips(clip_low: float, clip_high: float, dual_clip: float | None) -> None:
    if not 0 <= clip_low < 1:
        raise ValueError(f"clip_low must be in [0, 1) so that 1 - clip_low > 0, got {clip_low}")
    if clip_high < 0:
        raise ValueError(f"clip_high must be >= 0, got {clip_high}")
    if dual_clip is not None and dual_clip <= 1:
        raise ValueError(
            f"dual_clip must be > 1 (it caps the loss at -A * dual_clip for negative "
            f"advantages, Ye et al. 2020), got {dual_clip}; pass None to disable it"
        )


@torch.no_grad()
def _policy_loss_stats(
    log_probs: Tensor,
    old_log_probs: Tensor,
    ratio: Tensor,
    mask: Tensor,
    *,
    clip_active: Tensor,
    dual_active: Tensor,
) -> PolicyLossStats:
    """Detached masked statistics of one ``clipped_policy_loss`` call (all inputs [B, R])."""
    # ratio > 0, so filling uncounted positions with 0 leaves the max of the counted ones
    # (and 0 when none count) without a host sync to ask whether any do.
    ratio_max = torch.where(mask, ratio, 0.0).amax() if ratio.numel() else ratio.new_zeros(())
    return PolicyLossStats(
        clip_fraction=masked_mean((clip_active | dual_active).to(ratio.dtype), mask),
        approx_kl=masked_mean(kl_penalty(old_log_probs, log_probs, estimator="k3"), mask),
        ratio_mean=masked_mean(ratio, mask),
        ratio_max=ratio_max,
        dual_clip_fraction=masked_mean(dual_active.to(ratio.dtype), mask),
    )


def clipped_value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor,
    *,
    clip: float | None = 0.2,
) -> tuple[Tensor, ValueLossStats]:
    """Clipped critic loss, per token, as in PPO implementations.

    ``0.5 * max((V - R)^2, (clip(V, V_old - c, V_old + c) - R)^2)``; with ``clip=None`` it is
    the plain ``0.5 * (V - R)^2``. Value clipping is not in the PPO paper; it comes from the
    OpenAI baselines implementation (Huang et al. 2022, "The 37 Implementation Details of PPO",
    detail 9), which also bounds how far one update moves the critic.

    Args:
        values: [B, R] critic predictions being trained.
        old_values: [B, R] critic predictions when the rollout was collected (detached).
        returns: [B, R] value targets, e.g. from ``gae`` (detached).
        mask: [B, R] bool, True = the token counts.
        clip: the clip range c in value units, or None for no clipping.

    Returns:
        (per-token loss [B, R] with 0 outside the mask, ValueLossStats).
    """
    if clip is not None and clip <= 0:
        raise ValueError(f"clip must be > 0 or None (no value clipping), got {clip}")
    old_values, returns = old_values.detach(), returns.detach()
    unclipped = (values - returns).square()
    if clip is None:
        loss = unclipped
        clip_active = torch.zeros_like(mask)
    else:
        clipped_values = torch.clamp(values, old_values - clip, old_values + clip)
        clipped = (clipped_values - returns).square()
        loss = torch.maximum(unclipped, clipped)
        clip_active = clipped > unclipped
    with torch.no_grad():
        stats = ValueLossStats(
            clip_fraction=masked_mean(clip_active.to(values.dtype), mask),
            value_mean=masked_mean(values, mask),
        )
    return _zero_outside(0.5 * loss, mask), stats


def aggregate_loss(
    per_token: Tensor,
    mask: Tensor,
    *,
    mode: AggregationMode = "token_mean",
    num_tokens: Tensor | float | None = None,
    num_seqs: float | None = None,
    norm_length: int | None = None,
) -> Tensor:
    """Reduce a per-token loss [B, R] to the scalar that is back-propagated.

    - ``token_mean``: sum over counted tokens / ``num_tokens`` (every token weighs the same;
      DAPO's token-level loss, arXiv 2503.14476, sec. 3.3).
    - ``seq_mean_token_mean``: mean over each sequence's counted tokens, then sum over
      sequences / ``num_seqs`` (the original GRPO normalisation, arXiv 2402.03300 eq. 3).
    - ``seq_mean_token_sum``: sum over each sequence's counted tokens, then sum over
      sequences / ``num_seqs``.
    - ``seq_mean_token_sum_norm``: as ``seq_mean_token_sum``, further divided by the constant
      ``norm_length`` (the maximum response length): Dr. GRPO's normaliser as published (Liu et
      al. 2025, arXiv 2503.20783, sec. 3.2), which no sample's length changes.

    To accumulate micro-batches of one mini-batch exactly, pass the mini-batch's total
    ``num_tokens`` (or ``num_seqs``) to every micro-batch and sum the results. When omitted they
    default to this batch's counted tokens, or its sequences with at least one counted token.
    Empty batches give 0, not NaN.

    Args:
        per_token: [B, R] loss per token.
        mask: [B, R] bool, True = the token counts.
        mode: the reduction, see above.
        num_tokens: denominator for ``token_mean``.
        num_seqs: denominator for the ``seq_mean_*`` modes.
        norm_length: the constant of ``seq_mean_token_sum_norm`` (required there, >= 1).

    Returns:
        scalar loss.
    """
    if mode == "token_mean":
        total = masked_sum(per_token, mask)
        if num_tokens is None:
            return total / mask.sum().clamp(min=1).to(total.dtype)
        return total / num_tokens
    if mode not in ("seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm"):
        raise ValueError(
            "mode must be 'token_mean', 'seq_mean_token_mean', 'seq_mean_token_sum' or "
            f"'seq_mean_token_sum_norm', got {mode!r}"
        )
    per_seq = masked_sum(per_token, mask, dim=-1)
    if mode == "seq_mean_token_mean":
        per_seq = per_seq / mask.sum(dim=-1).clamp(min=1).to(per_seq.dtype)
    if mode == "seq_mean_token_sum_norm":
        if norm_length is None or norm_length < 1:
            raise ValueError(
                f"mode='seq_mean_token_sum_norm' divides by a constant length: pass "
                f"norm_length >= 1 (the maximum response length), got {norm_length}"
            )
        per_seq = per_seq / norm_length
    if num_seqs is None:
        return masked_mean(per_seq, mask.any(dim=-1))
    return per_seq.sum() / num_seqs


def explained_variance(values: Tensor, returns: Tensor, mask: Tensor) -> Tensor:
    """How much of the returns' variance the critic explains: ``1 - Var[R - V] / Var[R]``.

    1 is a perfect critic, 0 is no better than predicting the mean, negative is worse than
    that. Variances are unbiased and taken over counted tokens. When ``Var[R] == 0`` (e.g. all
    returns equal, or fewer than two counted tokens) the ratio is undefined and 0 is returned,
    so a logged curve never shows NaN. The critic diagnostic logged by OpenAI baselines' PPO
    (Schulman et al. 2017, arXiv 1707.06347).

    Args:
        values: [B, R] critic predictions.
        returns: [B, R] value targets.
        mask: [B, R] bool, True = the token counts.

    Returns:
        scalar, detached.
    """
    values, returns = values.detach(), returns.detach()
    var_returns = masked_var(returns, mask)
    var_residual = masked_var(returns - values, mask)
    explained = 1 - var_residual / torch.where(var_returns > 0, var_returns, 1.0)
    return torch.where(var_returns > 0, explained, torch.zeros_like(explained))
