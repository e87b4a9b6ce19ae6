"""Rollout collection and scoring, as a component any module calls: a generation engine, a
reward function and the reward-term callbacks turn a prompt batch into a scored :class:`Rollout`.

The module never imports a concrete engine or reward: both are injected (class paths in YAML).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from lit_rlhf.algos.advantages import tied_group_share
from lit_rlhf.rewards.adapt import as_reward
from lit_rlhf.rewards.base import RewardFunction
from lit_rlhf.rewards.guarded import REWARD_ERROR_KEY, failed_samples
from lit_rlhf.rollout.base import (
    EngineContractError,
    GenerationEngine,
    check_generation,
    engine_refusal,
)
from lit_rlhf.training.multiturn import MultiTurnRollout
from lit_rlhf.training.protocols import RewardContext, reward_terms
from lit_rlhf.types import GenerationOutput, Rollout


class RolloutCollector:
    """Samples responses for prompt batches and scores them.

    Args:
        engine: the generation engine (HF generate, the decode loop, vLLM, or any
            :class:`GenerationEngine`).
        reward: the reward: any callable (a :class:`RewardFunction`, a plain function, a
            TRL-style reward; see :mod:`lit_rlhf.rewards.adapt`).
        fallback: the score of a sample the reward gave no score (None / NaN); such samples
            are counted in the info column ``unscored`` (logged as ``reward/unscored``, a
            fraction).
        multiturn: multi-turn episodes with an environment
            (:class:`~lit_rlhf.training.multiturn.MultiTurnRollout`); None: one response per
            sample. An episode's score is the reward on its whole transcript plus the sum of its
            turn rewards (``env.budget_penalty`` instead for an episode a budget cut, if set).
    """

    def __init__(
        self,
        engine: GenerationEngine,
        reward: RewardFunction | Callable[..., Any],
        fallback: float = 0.0,
        multiturn: MultiTurnRollout | None = None,
    ) -> None:
        if not callable(reward):
            raise TypeError(f"reward must be a RewardFunction (callable), got {type(reward)}")
        if not callable(getattr(engine, "generate", None)):
            raise EngineContractError(engine_refusal(engine) or f"{engine!r} has no generate")
        if not math.isfinite(fallback):
            raise ValueError(f"reward_fallback must be a finite score, got {fallback}")
        self.engine = engine
        self.reward = reward  # the object itself: its state (if any) goes into checkpoints
        self.fallback = float(fallback)
        self.multiturn = multiturn
        self._score = as_reward(reward)
        self._warned_unscored = False

    @torch.no_grad()
    def collect(
        self,
        policy: nn.Module,
        tokenizer: Any,
        batch: dict[str, Any],
        *,
        samples_per_prompt: int,
        greedy: bool = False,
        log_probs: bool = True,
        trainer: Any = None,
        module: Any = None,
    ) -> Rollout:
        """Sample ``samples_per_prompt`` responses per prompt of ``batch`` (a prompt batch as
        ``PromptDataModule`` makes it) and score them. ``log_probs``: ask the engine for the
        sampled tokens' log-probs. With ``trainer`` given, the reward-term callbacks of
        ``trainer.callbacks`` add their terms to the scores (training rollouts)."""
        g = samples_per_prompt
        if self.multiturn is not None:
            prompt_ids, prompt_mask, expand = _expanded(batch, g)
            return self._collect_episodes(
                policy, tokenizer, batch, prompt_ids, prompt_mask, expand,
                greedy=greedy, log_probs=log_probs, trainer=trainer, module=module,
            )  # fmt: skip
        out = self.generate(
            policy, tokenizer, batch, samples_per_prompt=g, greedy=greedy, log_probs=log_probs
        )
        return self.scored(
            tokenizer, batch, out, samples_per_prompt=g, trainer=trainer, module=module
        )

    @torch.no_grad()
    def generate(
        self,
        policy: nn.Module,
        tokenizer: Any,
        batch: dict[str, Any],
        *,
        samples_per_prompt: int,
        greedy: bool = False,
        log_probs: bool = True,
    ) -> GenerationOutput:
        """The engine's ``samples_per_prompt`` responses per prompt of ``batch`` (single-turn),
        unscored; :meth:`scored` scores them (one-step-off training generates in a worker thread
        and scores in the main one)."""
        prompt_ids, prompt_mask, _ = _expanded(batch, samples_per_prompt)
        out = self.engine.generate(
            policy, prompt_ids, prompt_mask, tokenizer, greedy=greedy, log_probs=log_probs
        )
        check_generation(out, len(prompt_ids), self.engine)
        return out

    @torch.no_grad()
    def scored(
        self,
        tokenizer: Any,
        batch: dict[str, Any],
        out: GenerationOutput,
        *,
        samples_per_prompt: int,
        trainer: Any = None,
        module: Any = None,
    ) -> Rollout:
        """The rollout of :meth:`generate`'s output, scored (with the reward-term callbacks of
        ``trainer`` when given)."""
        prompt_ids, prompt_mask, expand = _expanded(batch, samples_per_prompt)
        texts = tokenizer.batch_decode(out.response_ids, skip_special_tokens=True)
        rollout = self._scored(prompt_ids, prompt_mask, out, expand, batch, texts)
        if trainer is not None:
            self._add_reward_terms(rollout, trainer, module)
        return rollout

    def _collect_episodes(
        self, policy: nn.Module, tokenizer: Any, batch: dict[str, Any], prompt_ids: Tensor,
        prompt_mask: Tensor, expand: list[int], *, greedy: bool, log_probs: bool, trainer: Any,
        module: Any,
    ) -> Rollout:  # fmt: skip
        """Multi-turn episodes (one per sample, grouped by their initial prompt), scored."""
        assert self.multiturn is not None
        rows = [batch["row"][i] for i in expand]
        episodes = self.multiturn.generate(
            self.engine, policy, tokenizer, prompt_ids, prompt_mask, rows,
            greedy=greedy, log_probs=log_probs,
        )  # fmt: skip
        out = episodes.generation
        texts = tokenizer.batch_decode(out.response_ids, skip_special_tokens=True)
        rollout = self._scored(prompt_ids, prompt_mask, out, expand, batch, texts)
        rollout.agent_mask, rollout.cut = episodes.agent_mask, episodes.cut
        rollout.turn_ends, rollout.turn_rewards = episodes.turn_ends, episodes.turn_rewards
        turn_sum = episodes.turn_rewards.sum(1).to(rollout.scores)
        rollout.reward_info["env_reward"] = turn_sum.cpu()
        rollout.scores = rollout.scores + turn_sum
        penalty = self.multiturn.budget_penalty
        if penalty is not None:
            rollout.scores = rollout.scores.masked_fill(episodes.cut.to(turn_sum.device), penalty)
        if trainer is not None:
            self._add_reward_terms(rollout, trainer, module)
        rollout.term_stats.update(episodes.stats)
        return rollout

    def _scored(
        self,
        prompt_ids: Tensor,
        prompt_mask: Tensor,
        out: GenerationOutput,
        expand: list[int],
        batch: dict[str, Any],
        responses: list[str],
    ) -> Rollout:
        prompts = [batch["prompt"][i] for i in expand]
        rows = [batch["row"][i] for i in expand]
        scores, info = self.score(prompts, responses, rows, device=prompt_ids.device)
        return Rollout(
            prompt_ids=prompt_ids,
            prompt_mask=prompt_mask,
            response_ids=out.response_ids,
            response_mask=out.response_mask,
            sample_log_probs=out.log_probs,
            group_ids=torch.tensor(expand, device=prompt_ids.device),
            query_ids=[batch["query_id"][i] for i in expand],
            tasks=[batch["task"][i] for i in expand],
            rows=rows,
            prompts=prompts,
            responses=responses,
            scores=scores,
            reward_info=info,
            token_versions=out.token_versions,
        )

    def score(
        self, prompts: list[str], responses: list[str], rows: list[Any], *, device: Any = None
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """The injected reward's scores [B] (checked: one number per response, refused in one
        line otherwise; an unscored sample gets ``fallback``) and its per-sample info."""
        result = self._score(prompts, responses, rows)
        info = {k: torch.as_tensor(v).float() for k, v in result.info.items()}
        unscored = result.scores.isnan()
        info["unscored"] = unscored.float()
        if unscored.any() and not self._warned_unscored:
            self._warned_unscored = True
            warnings.warn(
                f"reward {self._score.name!r} gave no score (None/NaN) to "
                f"{int(unscored.sum())} of {len(responses)} samples; they are scored "
                f"reward_fallback={self.fallback} and counted in reward/unscored (warned once)",
                RuntimeWarning,
                stacklevel=2,
            )
        scores = result.scores.masked_fill(unscored, self.fallback).to(device)
        return scores, info

    def _add_reward_terms(self, rollout: Rollout, trainer: Any, module: Any) -> None:
        ctx = RewardContext(
            prompts=rollout.prompts,
            responses=rollout.responses,
            rows=rollout.rows,
            query_ids=rollout.query_ids,
            tasks=rollout.tasks,
            group_ids=rollout.group_ids,
            scores=rollout.scores,
        )
        extra, rollout.term_stats = reward_terms(trainer, module, ctx)
        rollout.scores = rollout.scores + extra


def _expanded(batch: dict[str, Any], g: int) -> tuple[Tensor, Tensor, list[int]]:
    """The prompt ids and mask of ``batch`` repeated ``g`` times each, and each row's prompt."""
    prompt_ids = batch["input_ids"].repeat_interleave(g, dim=0)
    prompt_mask = batch["attention_mask"].bool().repeat_interleave(g, dim=0)
    return prompt_ids, prompt_mask, [i for i in range(len(batch["prompt"])) for _ in range(g)]


def rollout_stats(rollout: Rollout) -> dict[str, Tensor]:
    """Scalar statistics of a scored rollout: the reward (mean and std over the samples whose
    reward did not fail with ``GuardedReward(on_error='mask')``, each part of the reward's info
    averaged over the samples where it is defined, i.e. not NaN, the reward terms'
    diagnostics), the response lengths (the truncated share needs the engine's cap and is
    logged by :class:`~lit_rlhf.training.PolicyStep`) and, with a ``GuardedReward`` anywhere in
    the reward, ``fault/reward_errors``: the samples its reward failed on (summed over every
    guarded part)."""
    mask = rollout.response_mask
    kept = ~failed_samples(rollout.reward_info, len(rollout)).to(mask.device)
    scores = rollout.scores[kept]
    stats = {
        "reward/mean": scores.mean() if len(scores) else scores.new_tensor(float("nan")),
        "reward/std": scores.std() if len(scores) > 1 else scores.new_zeros(()),
        "rollout/response_length": mask.sum(1).float().mean(),
    }
    tied = tied_group_share(scores, rollout.group_ids.to(mask.device)[kept])
    if tied is not None:
        stats["reward/tied_groups"] = tied
    for key, value in rollout.reward_info.items():  # NaN: not defined for that sample
        defined = value.float()[~value.float().isnan()]
        if len(defined):
            stats[f"reward/{key}"] = defined.mean()
    errors = [
        value.float().nansum()
        for key, value in rollout.reward_info.items()
        if key == REWARD_ERROR_KEY or key.endswith(f"/{REWARD_ERROR_KEY}")
    ]
    if errors:
        stats["fault/reward_errors"] = torch.stack(errors).sum()
    stats.update(rollout.term_stats)
    return stats
