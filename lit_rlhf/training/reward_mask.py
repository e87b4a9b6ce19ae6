"""Samples whose reward failed leave the update (``GuardedReward(on_error='mask')``).

A guarded reward marks such a sample in its info column ``reward_masked``
(:func:`lit_rlhf.rewards.guarded.failed_samples`, which also reads the columns of guarded parts
of ``WeightedRewards`` / ``RewardByTask``: one failed part masks the sample). Here the sample
leaves:

- the advantages: the estimator runs on the kept samples only, so every statistic it takes is
  theirs (GRPO's group mean and std, RLOO's leave-one-out mean, REINFORCE++'s batch whitening,
  REINFORCE++-baseline's group mean, GAE's whitening); for the group estimators (``grpo``,
  ``rloo``, ``reinforce_pp_baseline``) a group that lost samples and is left with fewer than
  two is dropped whole (one sample has no baseline);
- the loss: ``Experience.kept`` is False for it, so ``Experience.counted`` leaves its tokens out
  of every loss term, token count and sequence count;
- and a batch with nothing left on any rank makes no optimizer step (a warning, and
  ``fault/empty_update`` = 1 for that step).

Logged when a guarded reward masks: ``fault/reward_masked``, the samples left out of the update
(failed ones and their dropped group mates); ``fault/reward_errors`` counts the failures.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from lit_rlhf.rewards.guarded import REWARD_MASKED_KEY, failed_samples
from lit_rlhf.types import Experience, Rollout

GROUP_ESTIMATORS = ("grpo", "rloo", "reinforce_pp_baseline")
EMPTY_UPDATE_KEY = "fault/empty_update"
MASKED_KEY = "fault/reward_masked"

Advantages = tuple[Tensor, Tensor | None]


def kept_samples(rollout: Rollout, estimator: str, left_out: Tensor | None = None) -> Tensor | None:
    """[B] bool on the rollout's device: the samples the advantages and the loss keep; None when
    no reward failed and nothing is ``left_out`` ([B] bool, samples dropped as failed ones are:
    partial rollouts' too stale samples, :mod:`lit_rlhf.training.partial`)."""
    failed = failed_samples(rollout.reward_info, len(rollout)).to(rollout.group_ids.device)
    if left_out is not None:
        failed = failed | left_out.to(failed.device)
    if not bool(failed.any()):
        return None
    keep = ~failed
    if estimator in GROUP_ESTIMATORS:
        inverse = torch.unique(rollout.group_ids, return_inverse=True)[1]
        n_groups = int(inverse.max()) + 1
        survivors = keep.new_zeros(n_groups, dtype=torch.long).index_add_(0, inverse, keep.long())
        lost = keep.new_zeros(n_groups, dtype=torch.long).index_add_(0, inverse, failed.long())
        keep = keep & ~((lost > 0) & (survivors < 2))[inverse]
    return keep


def rollout_rows(rollout: Rollout, rows: Tensor) -> Rollout:
    """The rollout's samples ``rows`` [b] (long), in that order: every per-sample field (tensor
    or list of length B, reward info, the multi-turn fields) indexed, the rest kept."""
    b, index = len(rollout), rows.tolist()

    def pick(value: Any) -> Any:
        if isinstance(value, Tensor) and value.dim() > 0 and value.shape[0] == b:
            return value[rows.to(value.device)]
        if isinstance(value, list) and len(value) == b:
            return [value[i] for i in index]
        if isinstance(value, dict):
            return {k: pick(v) for k, v in value.items()}
        return value

    fields = dataclasses.fields(rollout)
    return dataclasses.replace(rollout, **{f.name: pick(getattr(rollout, f.name)) for f in fields})


def kept_advantages(
    keep: Tensor | None,
    compute: Callable[..., Advantages],
    rollout: Rollout,
    **per_sample: Tensor | None,
) -> Advantages:
    """``compute(rollout, **per_sample)`` (advantages [B, R], returns [B, R] or None) over the
    kept samples only, so every statistic it takes is over them; the rows left out get 0.
    ``per_sample``: the [B, R] inputs of ``compute`` (log-probs, values), indexed alike."""
    if keep is None:
        return compute(rollout, **per_sample)
    rows = keep.nonzero().squeeze(1)
    subset = {k: None if v is None else v[rows] for k, v in per_sample.items()}
    advantages, returns = compute(rollout_rows(rollout, rows), **subset)
    full = advantages.new_zeros(rollout.response_mask.shape)
    full[rows] = advantages
    if returns is None:
        return full, None
    full_returns = returns.new_zeros(rollout.response_mask.shape)
    full_returns[rows] = returns
    return full, full_returns


def masked_reward_stats(experience: Experience) -> dict[str, Tensor]:
    """With a masking guarded reward in the rollout: ``fault/reward_masked`` (samples left out)
    and ``fault/empty_update`` (0 here; :func:`nothing_to_update` logs 1); else nothing."""
    info = experience.rollout.reward_info
    if not any(k == REWARD_MASKED_KEY or k.endswith(f"/{REWARD_MASKED_KEY}") for k in info):
        return {}
    kept = experience.kept
    left_out = 0.0 if kept is None else float((~kept).sum())
    return {MASKED_KEY: torch.tensor(left_out), EMPTY_UPDATE_KEY: torch.tensor(0.0)}


def nothing_to_update(experience: Experience, step: int) -> dict[str, Tensor] | None:
    """``{fault/empty_update: 1}`` (warned) when no sample is left to train on, on any rank,
    else None. Under DDP the ranks agree (a collective maximum), so they step together: a rank
    with nothing left still runs the update, with zero weight."""
    kept = experience.kept
    if _anywhere(kept is None or bool(kept.any())):
        return None
    warnings.warn(
        f"rollout step {step}: the reward failed on every sample (or it was too stale), or left "
        f"no group with two scored samples ({len(experience)} samples, GuardedReward "
        "on_error=mask, rollout.partial_rollouts): no update "
        f"this step ({EMPTY_UPDATE_KEY} = 1)",
        RuntimeWarning,
        stacklevel=2,
    )
    return {EMPTY_UPDATE_KEY: torch.tensor(1.0)}


def _anywhere(flag: bool) -> bool:
    """``flag`` on any rank (a collective maximum under DDP)."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return flag
    value = torch.tensor([int(flag)], dtype=torch.long)
    if dist.get_backend() == "nccl":
        value = value.cuda()
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())
