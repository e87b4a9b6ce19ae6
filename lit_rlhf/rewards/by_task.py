"""Per-domain reward routing for multi-domain RL (MGS, arXiv 2602.02301: math, chat and
instruction following in one run): each row's ``task`` picks the reward that scores it."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from lit_rlhf.rewards.adapt import as_reward
from lit_rlhf.rewards.base import (
    RewardFunction,
    check_batch_lengths,
    component_states,
    load_component_states,
)
from lit_rlhf.types import RewardOutput


class RewardByTask:
    """Routes every completion to the reward of its row's ``task``.

    Args:
        rewards: task name -> reward (e.g. ``math``: ``MathReward``, ``chat``:
            ``ScalarRMReward``, ``ifeval``: ``InstructionReward``); any callable, see
            :mod:`lit_rlhf.rewards.adapt` (a None score is NaN in ``<task>/score``).
        default: the reward of tasks not in ``rewards``; None makes such a row an error.

    Info: ``<task>/score`` and each routed reward's info as ``<task>/<key>``, defined on that
    task's rows and NaN on the others (logged as means over the task's rows only, under
    ``reward/<task>/...``).

    A routed reward with state (``state_dict`` / ``load_state_dict``) keeps it in checkpoints.
    """

    def __init__(
        self, rewards: Mapping[str, RewardFunction], default: RewardFunction | None = None
    ) -> None:
        if not rewards:
            raise ValueError("rewards must map at least one task name to a reward function")
        bad = [task for task, reward in rewards.items() if not callable(reward) or not task]
        if bad:
            raise ValueError(f"tasks {bad}: each needs a non-empty name and a callable reward")
        self.rewards, self.default = dict(rewards), default
        self._adapted = {
            task: as_reward(reward, task, log_scores=False)
            for task, reward in self._components().items()
        }

    def __call__(
        self,
        prompts: Sequence[str],
        completions: Sequence[str],
        rows: Sequence[Mapping[str, Any]],
    ) -> RewardOutput:
        check_batch_lengths(prompts, completions, rows)
        by_task: dict[str, list[int]] = {}
        for i, row in enumerate(rows):
            task = str(row.get("task", ""))
            if task not in self.rewards and self.default is None:
                raise ValueError(
                    f"row {i} (query {row.get('query_id', '?')!r}) has task {task!r}, which no "
                    f"reward handles (tasks: {sorted(self.rewards)}). Fix: add it to rewards, "
                    "set default=, or fix the data source's task."
                )
            by_task.setdefault(task, []).append(i)
        scores = torch.zeros(len(rows))
        info: dict[str, torch.Tensor] = {}
        for task, index in by_task.items():
            reward = self._adapted[task if task in self.rewards else ""]
            out = reward(  # scores checked: one per completion, NaN = no score
                [prompts[i] for i in index],
                [completions[i] for i in index],
                [rows[i] for i in index],
            )
            part = out.scores
            where = torch.tensor(index)
            scores[where] = part
            for key, value in {"score": part, **out.info}.items():
                column = info.setdefault(f"{task}/{key}", torch.full((len(rows),), math.nan))
                column[where] = torch.as_tensor(value, dtype=torch.float32).detach().cpu()
        return RewardOutput(scores=scores, info=info)

    def _components(self) -> dict[str, RewardFunction]:
        # "" is never a routed task name (checked in __init__): the default's key
        return {**self.rewards, **({"": self.default} if self.default is not None else {})}

    def state_dict(self) -> dict[str, Any]:
        """The routed rewards' states, by task (for checkpoints)."""
        return component_states(self._components())

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        load_component_states(self._components(), state)
