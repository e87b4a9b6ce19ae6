"""From a scored rollout to an :class:`Experience`: the rollout policy's and the reference's
log-probs, critic values and advantages, for the whole rollout before any update.

References: GAE (arXiv 1506.02438), GRPO's group-normalised advantages (arXiv 2402.03300),
RLOO (arXiv 2402.14740), KL in the reward (Ziegler et al., arXiv 1909.08593).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from functools import partial
from typing import Any

import torch
from torch import Tensor, nn

from lit_rlhf.algos import (
    explained_variance,
    gae,
    group_advantages,
    kl_penalty,
    masked_whiten,
    reinforce_pp_advantages,
    rloo_advantages,
    token_level_rewards,
)
from lit_rlhf.rollout.scorer import TokenScorer
from lit_rlhf.settings import AdvantageSettings
from lit_rlhf.training.packing import rollout_critic_values, rollout_forward
from lit_rlhf.training.reward_mask import kept_advantages, kept_samples, masked_reward_stats
from lit_rlhf.training.settings import PPOSettings
from lit_rlhf.training.teacher import mix_distillation
from lit_rlhf.types import CriticTargets, Experience, Rollout


@torch.no_grad()
def build_experience(
    rollout: Rollout,
    *,
    policy: nn.Module,
    settings: PPOSettings,
    temperature: float,
    kl_coef: float,
    critic: nn.Module | None = None,
    ref_policy: nn.Module | None = None,
    use_current_as_old: bool = False,
    reference_mode: Callable[[], AbstractContextManager[Any]] = nullcontext,
    left_out: Tensor | None = None,
    teacher: TokenScorer | None = None,
) -> Experience:
    """Everything the update reads, computed once per rollout. ``use_current_as_old``: the
    rollout gets one update, whose own detached log-probs are the old ones; if the engine
    returned none they are written into the experience during that update
    (``Experience.old_from_update``). Otherwise the engine's log-probs are used, or recomputed
    with a forward pass when ``update.recompute_old_log_probs``. ``reference_mode``: the context
    the reference forward runs in (under LoRA ``ref_policy`` is the policy itself and this
    switches its adapters off). ``left_out`` [B] bool: samples dropped as failed ones are.
    ``teacher``: on-policy distillation's teacher, whose per-token advantages are mixed in
    (:func:`~.teacher.mix_distillation`)."""
    budget = settings.packed  # packed forwards of this many tokens (None: padded)
    forward, values = _policy_forward(policy, critic, rollout, settings, temperature)
    old = forward if settings.recompute else rollout.sample_log_probs
    ref = None
    if ref_policy is not None:
        with reference_mode():
            ref = rollout_forward(ref_policy, rollout, budget, temperature=temperature)[0]
    if old is None and not use_current_as_old:
        raise ValueError(
            "several updates per rollout need the rollout's log-probs, but the engine returned "
            "none. Fix: call generate(..., log_probs=True) or set recompute_old_log_probs."
        )
    kl_reward = kl_coef if settings.kl_in_reward else 0.0
    kept = kept_samples(rollout, settings.advantage.estimator, left_out)  # failed, left out
    compute = partial(compute_advantages, settings=settings, kl_coef=kl_reward)
    advantages, returns = kept_advantages(
        kept, compute, rollout, old_log_probs=old, ref_log_probs=ref, values=values
    )
    if teacher is not None:
        mask = _agent_tokens(rollout) if kept is None else _agent_tokens(rollout) & kept[:, None]
        advantages = mix_distillation(
            advantages, rollout, settings.distill, student=policy, teacher=teacher,
            budget=budget, temperature=temperature, mask=mask,
        )  # fmt: skip
    return Experience(
        rollout=rollout,
        old_log_probs=torch.zeros_like(rollout.response_mask, dtype=torch.float32)
        if old is None
        else old,
        advantages=advantages,
        ref_log_probs=ref,
        critic=None if values is None or returns is None else CriticTargets(values, returns),
        old_from_update=old is None,
        kept=kept,
    )


def _policy_forward(
    policy: nn.Module,
    critic: nn.Module | None,
    rollout: Rollout,
    settings: PPOSettings,
    temperature: float,
) -> tuple[Tensor | None, Tensor | None]:
    """(the trainer's log-probs [B, R] of the rollout, or None; the critic's values [B, R], or
    None): the policy's forward runs when the old log-probs are recomputed or for a value
    head's hidden states."""
    budget = settings.packed
    value_head = critic is not None and settings.value_head
    log_probs: Tensor | None = None
    values: Tensor | None = None
    if settings.recompute or value_head:
        log_probs, hidden = rollout_forward(
            policy, rollout, budget, temperature=temperature, with_hidden=value_head
        )
        if value_head and critic is not None and hidden is not None:
            values = critic(hidden).float()
    if critic is not None and not value_head:
        values = rollout_critic_values(critic, rollout, budget)
    return log_probs, values


def compute_advantages(
    rollout: Rollout,
    settings: PPOSettings,
    *,
    old_log_probs: Tensor | None,
    ref_log_probs: Tensor | None,
    values: Tensor | None,
    kl_coef: float,
) -> tuple[Tensor, Tensor | None]:
    """(advantages [B, R], returns [B, R] for GAE else None). ``kl_coef`` > 0 here means KL in
    the reward: per token for GAE and REINFORCE++, summed per sequence for the group
    baselines. In multi-turn rollouts only the agent's tokens count (``Rollout.agent_mask``)
    and, for GAE, each turn's reward sits on the turn's last agent token."""
    mask = _agent_tokens(rollout)
    kl = None
    if kl_coef > 0 and ref_log_probs is not None:
        if old_log_probs is None:
            raise RuntimeError(
                "a KL penalty in the reward needs the rollout's log-probs before the update, but "
                "the engine returned none. Fix: call generate(..., log_probs=True)."
            )
        kl = kl_penalty(old_log_probs, ref_log_probs, estimator=settings.kl.estimator)
        kl = kl.masked_fill(~mask, 0.0)
    advantage = settings.advantage
    estimator, gamma = advantage.estimator, advantage.gamma
    if estimator == "gae":
        if values is None:
            raise ValueError("advantage='gae' needs critic values: pass the critic")
        rewards = _token_rewards(rollout, mask)
        if kl is not None:
            rewards = rewards - kl_coef * kl
        adv, returns = gae(rewards, values, mask, gamma=gamma, lam=advantage.lam)
        return (masked_whiten(adv, mask) if advantage.whiten else adv), returns
    if estimator in ("reinforce_pp", "reinforce_pp_baseline"):
        baseline = estimator == "reinforce_pp_baseline"
        adv = reinforce_pp_advantages(
            rollout.scores, mask, kl=kl, kl_coef=kl_coef, gamma=gamma,
            group_ids=rollout.group_ids if baseline else None,
        )  # fmt: skip
        return adv, None
    scores = rollout.scores if kl is None else rollout.scores - kl_coef * kl.sum(1)
    return _group_advantages(scores, rollout.group_ids, estimator, advantage)[:, None] * mask, None


def _agent_tokens(rollout: Rollout) -> Tensor:
    """[B, R] bool: the response tokens the policy sampled (all of them in single-turn)."""
    mask = rollout.response_mask
    return mask if rollout.agent_mask is None else mask & rollout.agent_mask


def _token_rewards(rollout: Rollout, mask: Tensor) -> Tensor:
    """[B, R]: the score on the last counted token; in multi-turn rollouts the turn rewards on
    their turns' last agent tokens and the rest of the score (the final reward) on the last."""
    if rollout.turn_ends is None or rollout.turn_rewards is None:
        return token_level_rewards(rollout.scores, mask)
    turns = rollout.turn_rewards.to(rollout.scores)
    rewards = token_level_rewards(rollout.scores - turns.sum(1), mask)
    ends = rollout.turn_ends.to(rewards.device)
    taken = ends >= 0
    return rewards.scatter_add(1, ends.clamp(min=0), turns.masked_fill(~taken, 0.0))


def _group_advantages(
    scores: Tensor, group_ids: Tensor, estimator: str, advantage: AdvantageSettings
) -> Tensor:
    if estimator == "grpo":
        return group_advantages(
            scores, group_ids, scale_by_std=advantage.scale_by_std, eps=advantage.eps
        )
    if estimator == "rloo":
        return rloo_advantages(scores, group_ids)
    raise ValueError(
        f"unknown advantage.estimator {estimator!r}; expected gae, grpo, rloo, reinforce_pp or "
        "reinforce_pp_baseline"
    )


def experience_stats(experience: Experience) -> dict[str, Tensor]:
    """The per-sequence KL of the rollout policy to the reference (``rollout/kl``, k1, when there
    is a reference) and the critic's explained variance (``ppo/explained_variance``, GAE), over
    the kept samples (:mod:`~lit_rlhf.training.reward_mask`, whose counts are added)."""
    stats: dict[str, Tensor] = masked_reward_stats(experience)
    mask = _agent_tokens(experience.rollout)
    kept = experience.kept  # the samples trained on (the others may hold no old log-probs)
    if kept is not None:
        mask = mask & kept[:, None]
    if experience.ref_log_probs is not None and (kept is None or bool(kept.any())):
        kl = kl_penalty(experience.old_log_probs, experience.ref_log_probs, estimator="k1")
        per_sequence = (kl * mask).sum(1)
        stats["rollout/kl"] = (per_sequence if kept is None else per_sequence[kept]).mean()
    if experience.critic is not None:
        targets = experience.critic
        stats["ppo/explained_variance"] = explained_variance(targets.values, targets.returns, mask)
    return stats
