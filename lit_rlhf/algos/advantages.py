"""Advantage estimators: GAE for a learned critic, group baselines for critic-free methods.

All of them treat their inputs as constants (they read ``.detach()``-ed tensors), because an
advantage is a fixed weight in the policy loss, never something to differentiate through.

Departures from the papers: GAE here skips masked-out positions instead of treating them as
episode ends, so a right-padded response and a response with interior holes (e.g. tool output
that the policy did not generate) both work; for a right-padded mask this is exactly eq. 16.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lit_rlhf.algos.masking import masked_mean, masked_var

# OpenRLHF's REINFORCE++ normalisation: compute_advantages_and_returns in
# openrlhf/trainer/ppo_utils/experience_maker.py (OpenRLHF/OpenRLHF at commit
# 3c3be6234e0cb353e76bb8019947db9dfe99fca7) divides the squared deviations by the number of
# counted tokens n (not n - 1) and takes rsqrt(max(var, 1e-8)).
_VAR_FLOOR = 1e-8


def gae(
    rewards: Tensor, values: Tensor, mask: Tensor, *, gamma: float, lam: float
) -> tuple[Tensor, Tensor]:
    """Generalised Advantage Estimation (Schulman et al. 2015, arXiv 1506.02438, eq. 16).

    ``A_t = sum_l (gamma * lam)^l * delta_{t+l}`` with
    ``delta_t = r_t + gamma * V_{t+1} - V_t``; the value after the last counted token is 0
    (the response ended). Computed by the backward recursion ``A_t = delta_t + gamma*lam*A_{t+1}``,
    looping over R and vectorised over B.

    Args:
        rewards: [B, R] per-token rewards (usually the score on the last counted token, minus a
            per-token KL penalty when the KL is put in the reward).
        values: [B, R] critic values of each response position.
        mask: [B, R] bool, True = the token counts.
        gamma: discount factor.
        lam: GAE lambda; 1 gives Monte-Carlo returns minus values, 0 gives one-step TD errors.

    Returns:
        (advantages, returns), both [B, R]; ``returns = advantages + values`` is the value target.
        Positions outside the mask are 0 in both.
    """
    rewards, values = rewards.detach(), values.detach()
    batch, length = rewards.shape
    next_value = rewards.new_zeros(batch)
    next_advantage = rewards.new_zeros(batch)
    columns: list[Tensor] = []
    for t in reversed(range(length)):
        counts = mask[:, t]
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        advantage = delta + gamma * lam * next_advantage
        # A masked position passes the running value and advantage through unchanged, so the
        # recursion links the counted tokens on either side of it.
        next_value = torch.where(counts, values[:, t], next_value)
        next_advantage = torch.where(counts, advantage, next_advantage)
        columns.append(torch.where(counts, advantage, torch.zeros_like(advantage)))
    advantages = torch.stack(columns[::-1], dim=1)
    returns = torch.where(mask, advantages + values, torch.zeros_like(advantages))
    return advantages, returns


def _group_index(group_ids: Tensor) -> tuple[Tensor, int]:
    # Relabel arbitrary (non-contiguous) group ids as 0..n_groups-1 for index_add.
    uniques, inverse = torch.unique(group_ids, return_inverse=True)
    return inverse, int(uniques.numel())


def _group_sum(x: Tensor, inverse: Tensor, n_groups: int) -> Tensor:
    return x.new_zeros(n_groups).index_add_(0, inverse, x)


def _varied(scores: Tensor, inverse: Tensor, n_groups: int) -> Tensor:
    """[B] bool: the sample's group has at least two different scores. Tested on the scores
    themselves, not on a float standard deviation: the mean of equal float32 scores is not
    always exactly their value, so a tied group of 8 or 16 had a std near 1e-8 and got a
    constant advantage of about 0.01-0.2 after the division by std + eps."""
    high, low = _group_extremes(scores, inverse, n_groups)
    return (high > low)[inverse]


def _group_extremes(scores: Tensor, inverse: Tensor, n_groups: int) -> tuple[Tensor, Tensor]:
    """[G] each group's highest and lowest score."""
    high = scores.new_full((n_groups,), float("-inf")).scatter_reduce(0, inverse, scores, "amax")
    low = scores.new_full((n_groups,), float("inf")).scatter_reduce(0, inverse, scores, "amin")
    return high, low


def tied_group_share(scores: Tensor, group_ids: Tensor) -> Tensor | None:
    """The share of the prompts' groups (of two samples or more) whose scores all tie: the
    groups a group baseline (GRPO, RLOO) gives zero advantage, so only the KL and the loss
    terms move the policy there. None when no group has two samples."""
    if len(scores) == 0:
        return None
    _, group = group_ids.unique(return_inverse=True)
    n = int(group.max()) + 1
    counted = torch.bincount(group, minlength=n) > 1
    if not counted.any():
        return None
    high, low = _group_extremes(scores, group, n)
    return ((high == low) & counted).sum() / counted.sum()


def _float_scores(scores: Tensor) -> Tensor:
    # Integer scores (e.g. 0/1 correctness) must be averaged in floating point.
    return scores.detach().to(torch.promote_types(scores.dtype, torch.float32))


def group_advantages(
    scores: Tensor, group_ids: Tensor, *, scale_by_std: bool = True, eps: float = 1e-6
) -> Tensor:
    """Group-relative advantages of GRPO (Shao et al. 2024, arXiv 2402.03300, sec. 4.1.2).

    ``A_i = (s_i - mean(s_group)) / (std(s_group) + eps)`` with the unbiased standard deviation.
    ``scale_by_std=False`` gives the mean-centred advantage of Dr. GRPO (Liu et al. 2025,
    arXiv 2503.20783), which drops the up-weighting of groups whose scores barely differ
    (questions that are nearly always solved or nearly never).
    A group of size 1 has no baseline and gets advantage 0.

    Args:
        scores: [B] scalar reward per sample.
        group_ids: [B] long, any labels; samples with the same label form a group.
        scale_by_std: divide by the group standard deviation.
        eps: added to the standard deviation; an all-equal group gets 0 whatever eps is.

    Returns:
        [B] advantages, floating.
    """
    if eps < 0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    scores = _float_scores(scores)
    inverse, n_groups = _group_index(group_ids)
    counts = _group_sum(torch.ones_like(scores), inverse, n_groups)
    mean = _group_sum(scores, inverse, n_groups) / counts
    centered = scores - mean[inverse]
    if scale_by_std:
        sum_sq = _group_sum(centered.square(), inverse, n_groups)
        std = (sum_sq / (counts - 1).clamp(min=1)).sqrt()[inverse]
        centered = torch.where(std > 0, centered / (std + eps), torch.zeros_like(centered))
    # a group of one, or of equal scores, has no signal: exactly 0 (keeps eps=0 NaN-free)
    varied = (counts[inverse] > 1) & _varied(scores, inverse, n_groups)
    return torch.where(varied, centered, torch.zeros_like(centered))


def rloo_advantages(scores: Tensor, group_ids: Tensor) -> Tensor:
    """REINFORCE leave-one-out advantages (Ahmadian et al. 2024, arXiv 2402.14740).

    ``A_i = s_i - mean_{j != i} s_j`` over the other samples of the group, which equals
    ``n / (n - 1) * (s_i - mean(s_group))``. A group of size 1 gets advantage 0.

    Args:
        scores: [B] scalar reward per sample.
        group_ids: [B] long, any labels; samples with the same label form a group.

    Returns:
        [B] advantages, floating.
    """
    scores = _float_scores(scores)
    inverse, n_groups = _group_index(group_ids)
    counts = _group_sum(torch.ones_like(scores), inverse, n_groups)[inverse]
    group_total = _group_sum(scores, inverse, n_groups)[inverse]
    others_mean = (group_total - scores) / (counts - 1).clamp(min=1)
    varied = (counts > 1) & _varied(scores, inverse, n_groups)  # a tied group: exactly 0
    return torch.where(varied, scores - others_mean, torch.zeros_like(scores))


def token_level_rewards(scores: Tensor, response_mask: Tensor) -> Tensor:
    """Place each sequence's scalar score on its last counted token (the sparse RLHF reward).

    This is the reward layout of RLHF with PPO (Ziegler et al. 2019, arXiv 1909.08593): the
    reward model's score arrives when the response ends and every other token gets 0, before
    any per-token KL penalty is subtracted.

    Args:
        scores: [B] scalar reward per sequence.
        response_mask: [B, R] bool, True = the token counts.

    Returns:
        [B, R] rewards; rows with no counted token are all 0.
    """
    scores = scores.detach()
    length = response_mask.shape[1]
    positions = torch.arange(length, device=response_mask.device)
    # Counted positions carry unique values, so argmax finds the last counted index.
    last = torch.where(response_mask, positions, -1).argmax(dim=1)
    has_token = response_mask.any(dim=1)
    rewards = scores.new_zeros(response_mask.shape)
    placed = torch.where(has_token, scores, torch.zeros_like(scores))
    return rewards.scatter(1, last.unsqueeze(1), placed.unsqueeze(1))


def reinforce_pp_advantages(
    scores: Tensor,
    mask: Tensor,
    *,
    kl: Tensor | None = None,
    kl_coef: float = 0.0,
    gamma: float = 1.0,
    group_ids: Tensor | None = None,
) -> Tensor:
    """REINFORCE++ advantages (Hu et al. 2025, arXiv 2501.03262, sec. 3): the return of a
    token-level reward, normalised over the whole batch.

    The reward of token t is ``r_t = [t is the last counted token] * score - kl_coef * kl_t``
    (the KL to the reference, per token, in the reward: eq. 3); the advantage is the discounted
    return ``G_t = sum_{s >= t} gamma^(s-t) r_s`` (eq. 4, no critic), then whitened over every
    counted token of the batch (the global advantage normalisation of sec. 3.2), which replaces
    GRPO's per-prompt normalisation. The whitening is the authors' code's, OpenRLHF's
    ``compute_advantages_and_returns`` (openrlhf/trainer/ppo_utils/experience_maker.py, commit
    3c3be623): ``(G - mean) / sqrt(max(var, 1e-8))`` with the population variance (squared
    deviations over n, not n - 1). With ``group_ids`` (REINFORCE++-baseline, the same paper's
    variant for several samples per prompt) each score first has its group's mean subtracted.
    OpenRLHF forces ``gamma`` to 1 for that variant; here ``gamma`` is honoured as given (the
    default, 1, is OpenRLHF's).

    Args:
        scores: [B] scalar reward per sequence.
        mask: [B, R] bool, True = the token counts.
        kl: [B, R] per-token KL estimate of the sampling policy to the reference, or None.
        kl_coef: its weight in the reward (>= 0).
        gamma: discount (1 in the paper).
        group_ids: [B] prompt labels for the baseline variant, or None.

    Returns:
        [B, R] advantages, 0 outside the mask.
    """
    if kl_coef < 0:
        raise ValueError(f"kl_coef must be >= 0, got {kl_coef}")
    scores = _float_scores(scores)
    if group_ids is not None:
        inverse, n_groups = _group_index(group_ids)
        counts = _group_sum(torch.ones_like(scores), inverse, n_groups)
        scores = scores - (_group_sum(scores, inverse, n_groups) / counts)[inverse]
    rewards = token_level_rewards(scores, mask)
    if kl is not None and kl_coef > 0:
        rewards = rewards - kl_coef * kl.detach().to(rewards.dtype).masked_fill(~mask, 0.0)
    # GAE with zero values and lambda 1 is the discounted return-to-go
    returns, _ = gae(rewards, torch.zeros_like(rewards), mask, gamma=gamma, lam=1.0)
    mean = masked_mean(returns, mask)
    rstd = masked_var(returns, mask, unbiased=False).clamp(min=_VAR_FLOOR).rsqrt()
    return torch.where(mask, (returns - mean) * rstd, torch.zeros_like(returns))
