"""A weighted sum of reward functions, with every component logged under its own name."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from lit_rlhf.rewards.adapt import as_reward, reward_name
from lit_rlhf.rewards.base import RewardFunction, component_states, load_component_states
from lit_rlhf.types import RewardOutput

# rollout statistics and collector info already use these names under ``reward/``
RESERVED_NAMES = frozenset({"mean", "std", "unscored", "reward_error", "reward_masked"})


class WeightedRewards:
    """score = sum_i w_i * s_i over component rewards, skipping a sample's unscored terms.

    Args:
        rewards: the component rewards: any callable (plain functions, TRL-style rewards, see
            :mod:`lit_rlhf.rewards.adapt`).
        weights: one weight per reward; default all 1.0. A module's ``reward_weights``.
        names: one logging name per reward; default a function's name or the snake_case class
            name without a trailing "Reward" (``CountdownReward`` -> ``countdown``). Repeated
            names, and names the rollout statistics use (``mean``, ``std``, ``unscored``,
            ``reward_error``, ``reward_masked``), get ``_1``, ``_2``, ...

    A component's None/NaN score for a sample is skipped in that sample's sum (TRL's nansum); a
    sample no component scored gets NaN, which the rollout collector turns into the module's
    ``reward_fallback`` (counted as ``reward/unscored``).

    Info: each component's score as ``"<name>"`` and each component info tensor as
    ``"<name>/<key>"``, all [B].

    A component with state (``state_dict`` / ``load_state_dict``) keeps it in checkpoints.
    """

    def __init__(
        self,
        rewards: list[RewardFunction | Callable[..., Any]],
        weights: list[float] | None = None,
        names: list[str] | None = None,
    ) -> None:
        if not rewards:
            raise ValueError("rewards must hold at least one reward function")
        if weights is None:
            weights = [1.0] * len(rewards)
        if len(weights) != len(rewards):
            raise ValueError(
                f"weights has {len(weights)} entries but rewards has {len(rewards)}; "
                "give one weight per reward or leave weights unset for all 1.0"
            )
        if not all(math.isfinite(w) for w in weights):
            raise ValueError(f"weights must be finite numbers, got {weights}")
        if names is None:
            names = [reward_name(r) for r in rewards]
        if len(names) != len(rewards):
            raise ValueError(
                f"names has {len(names)} entries but rewards has {len(rewards)}; "
                "give one name per reward or leave names unset for class-derived names"
            )
        if not all(names):
            raise ValueError(f"names must be non-empty strings, got {names}")
        self.weights = [float(w) for w in weights]
        self.names = _deduplicate(names)
        self.rewards = list(rewards)
        self._adapted = [
            as_reward(reward, name, log_scores=False)
            for reward, name in zip(rewards, self.names, strict=True)
        ]

    def __call__(
        self,
        prompts: Sequence[str],
        completions: Sequence[str],
        rows: Sequence[Mapping[str, Any]],
    ) -> RewardOutput:
        terms = []
        info: dict[str, torch.Tensor] = {}
        for reward, weight, name in zip(self._adapted, self.weights, self.names, strict=True):
            out = reward(prompts, completions, rows)  # scores checked: [B], NaN = no score
            terms.append(weight * out.scores)
            info[name] = out.scores
            for key, value in out.info.items():
                info[f"{name}/{key}"] = value
        stacked = torch.stack(terms)
        total = stacked.nansum(0)
        total[stacked.isnan().all(0)] = math.nan  # no component scored this sample
        return RewardOutput(scores=total, info=info)

    def state_dict(self) -> dict[str, Any]:
        """The components' states, by name (for checkpoints)."""
        return component_states(dict(zip(self.names, self.rewards, strict=True)))

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        load_component_states(dict(zip(self.names, self.rewards, strict=True)), state)


def _deduplicate(names: list[str]) -> list[str]:
    taken = set(names) | RESERVED_NAMES
    seen: set[str] = set()
    unique = []
    for name in names:
        candidate, k = name, 0
        # a suffixed name must not clash with a name another reward was given outright
        while candidate in seen or candidate in RESERVED_NAMES or (k > 0 and candidate in taken):
            k += 1
            candidate = f"{name}_{k}"
        seen.add(candidate)
        unique.append(candidate)
    return unique


def combined_reward(
    reward: RewardFunction | Callable[..., Any] | Sequence[RewardFunction | Callable[..., Any]],
    weights: Sequence[float] | None = None,
) -> RewardFunction | Callable[..., Any]:
    """A module's ``reward`` / ``reward_weights`` as one reward: a list becomes one
    :class:`WeightedRewards` (each part logged as ``reward/<name>``); a single reward is kept
    as it is (weights for it are refused: they would do nothing)."""
    if isinstance(reward, Sequence) and not isinstance(reward, str):
        return WeightedRewards(list(reward), None if weights is None else list(weights))
    if weights is not None:
        raise ValueError(
            f"reward_weights={list(weights)} is set but reward is a single reward; give reward a "
            "list (one weight per reward) or leave reward_weights unset"
        )
    return reward
