"""A weighted sum of reward functions, with every component logged under its own name."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from lit_rlhf.rewards.base import RewardFunction, component_states, load_component_states
from lit_rlhf.types import RewardOutput


class WeightedRewards:
    """score = sum_i w_i * s_i over component rewards.

    Args:
        rewards: the component reward functions.
        weights: one weight per reward; default all 1.0.
        names: one logging name per reward; default the snake_case class name without a trailing
            "Reward" (``CountdownReward`` -> ``countdown``). Repeated names get ``_1``, ``_2``, ...

    Info: each component's score as ``"<name>"`` and each component info tensor as
    ``"<name>/<key>"``, all [B].

    A component with state (``state_dict`` / ``load_state_dict``) keeps it in checkpoints.
    """

    def __init__(
        self,
        rewards: list[RewardFunction],
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
            names = [default_reward_name(r) for r in rewards]
        if len(names) != len(rewards):
            raise ValueError(
                f"names has {len(names)} entries but rewards has {len(rewards)}; "
                "give one name per reward or leave names unset for class-derived names"
            )
        if not all(names):
            raise ValueError(f"names must be non-empty strings, got {names}")
        self.rewards = list(rewards)
        self.weights = [float(w) for w in weights]
        self.names = _deduplicate(names)

    def __call__(
        self,
        prompts: Sequence[str],
        completions: Sequence[str],
        rows: Sequence[Mapping[str, Any]],
    ) -> RewardOutput:
        total = torch.zeros(len(completions), dtype=torch.float32)
        info: dict[str, torch.Tensor] = {}
        for reward, weight, name in zip(self.rewards, self.weights, self.names, strict=True):
            out = reward(prompts, completions, rows)
            scores = out.scores.detach().to(dtype=torch.float32, device="cpu")
            if scores.shape != total.shape:
                raise ValueError(
                    f"reward {name!r} returned scores of shape {tuple(scores.shape)}, "
                    f"expected {tuple(total.shape)} (one per completion)"
                )
            total = total + weight * scores
            info[name] = scores
            for key, value in out.info.items():
                info[f"{name}/{key}"] = value
        return RewardOutput(scores=total, info=info)

    def state_dict(self) -> dict[str, Any]:
        """The components' states, by name (for checkpoints)."""
        return component_states(dict(zip(self.names, self.rewards, strict=True)))

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        load_component_states(dict(zip(self.names, self.rewards, strict=True)), state)


def default_reward_name(reward: object) -> str:
    """snake_case of the class (or function) name without a trailing "Reward"."""
    name = getattr(reward, "__name__", None) or type(reward).__name__
    if name.endswith("Reward") and len(name) > len("Reward"):
        name = name[: -len("Reward")]
    name = re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", name)
    return name.lower()


def _deduplicate(names: list[str]) -> list[str]:
    taken = set(names)
    seen: set[str] = set()
    unique = []
    for name in names:
        candidate, k = name, 0
        # a suffixed name must not clash with a name another reward was given outright
        while candidate in seen or (k > 0 and candidate in taken):
            k += 1
            candidate = f"{name}_{k}"
        seen.add(candidate)
        unique.append(candidate)
    return unique
