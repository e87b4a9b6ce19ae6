"""``env`` and ``eval``: the multi-turn episode limits, and how validation / test score a
policy."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from lit_rlhf.settings.base import Rule, SettingsGroup, is_int


@dataclass(frozen=True)
class EnvironmentSettings(SettingsGroup):
    """Multi-turn episode limits, read when an ``environment`` is set (``model.init_args.env``;
    the cut rule: :mod:`lit_rlhf.training.multiturn`).

    Args:
        max_turns: agent turns per episode.
        max_turn_tokens: tokens per agent turn (null: the engine's ``max_new_tokens``).
        max_episode_tokens: response tokens of a whole episode, agent and environment (null: no
            limit).
        step_timeout: seconds an environment step may take before it is answered with an error
            observation and counted as a fault (``env/faults``).
        budget_penalty: the score of an episode a token budget cut; null: such episodes are left
            out of the loss (their score still enters the group baseline).
    """

    GROUP = "env"
    FLAT_NAMES: ClassVar[dict[str, str]] = {"step_timeout": "env_step_timeout"}

    max_turns: int = 2
    max_turn_tokens: int | None = None
    max_episode_tokens: int | None = None
    step_timeout: float = 5.0
    budget_penalty: float | None = None

    def rules(self) -> list[Rule]:
        turn, episode = self.max_turn_tokens, self.max_episode_tokens
        return [
            ("max_turns", is_int(self.max_turns) and self.max_turns >= 1, ">= 1"),
            ("max_turn_tokens", turn is None or turn >= 1, ">= 1, or null"),
            ("max_episode_tokens", episode is None or episode >= 2, ">= 2, or null"),
            ("step_timeout", 0 < self.step_timeout < math.inf, "> 0 seconds, finite"),
            ("budget_penalty", self.budget_penalty is None or math.isfinite(self.budget_penalty),
             "finite or null (null: cut episodes are masked)"),
        ]  # fmt: skip


@dataclass(frozen=True)
class EvalSettings(SettingsGroup):
    """Validation and test of a policy (``model.init_args.eval``).

    Args:
        greedy: greedy decoding for pass@1 (false: sampled with the engine).
        samples: k > 1 also samples k responses per prompt with the engine and logs
            ``<stage>/pass@<k>`` (share of prompts with at least one passing sample) and
            ``<stage>/sampled_pass@1``; 1: off.
        pass_metric: the reward-info key that decides whether a sample passes (e.g.
            ``correct``); null: the score itself.
        pass_threshold: a sample passes when that value is >= this threshold.
    """

    GROUP = "eval"
    FLAT_NAMES: ClassVar[dict[str, str]] = {"greedy": "val_greedy", "samples": "val_samples"}

    greedy: bool = True
    samples: int = 1
    pass_metric: str | None = None
    pass_threshold: float = 1.0

    def rules(self) -> list[Rule]:
        return [
            ("samples", is_int(self.samples) and self.samples >= 1,
             ">= 1 (1: greedy / one sample only)"),
            ("pass_threshold", math.isfinite(self.pass_threshold), "finite"),
        ]  # fmt: skip
