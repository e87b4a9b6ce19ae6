"""Guess the number: a multi-turn environment with per-turn feedback, and its prompts.

The agent guesses with ``<guess>N</guess>``; a right guess scores 1 and ends the episode, a
wrong one is answered ``higher`` or ``lower`` (reward 0) and the agent guesses again, up to
``max_guesses`` (and the module's ``max_turns``). Rewards come from the environment only: use
:func:`episode_reward_only` as the module's ``reward``.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from lit_rlhf.envs.base import StepResult
from lit_rlhf.lazy import MYPY, Table, lazy_module
from lit_rlhf.types import RewardOutput

if MYPY:  # the type checker's view (see lit_rlhf.lazy)
    import datasets
else:
    datasets = lazy_module("datasets")  # loaded when data loads: a fast CLI start


_GUESS = re.compile(r"<guess>\s*(-?\d{1,9})\s*</guess>")


class GuessNumberEnv:
    """Args:
    max_guesses: the episode ends after this many guesses.
    """

    def __init__(self, max_guesses: int = 2) -> None:
        if max_guesses < 1:
            raise ValueError(f"max_guesses must be >= 1, got {max_guesses}. Fix: set it to 2.")
        self.max_guesses = max_guesses
        self.target = 0
        self.guesses = 0

    def reset(self, row: Mapping[str, Any]) -> None:
        self.target = int(row["target"])
        self.guesses = 0

    def step(self, turn: str) -> StepResult:
        """1 and done for the right guess; ``higher`` / ``lower`` otherwise; a turn without a
        ``<guess>`` tag is a fault answered with the format."""
        self.guesses += 1
        last = self.guesses >= self.max_guesses
        match = _GUESS.search(turn)
        if match is None:
            return StepResult("Write your guess as <guess>N</guess>.", done=last, fault="no guess")
        guess = int(match.group(1))
        if guess == self.target:
            return StepResult("correct", reward=1.0, done=True)
        return StepResult("higher" if guess < self.target else "lower", done=last)


def episode_reward_only(
    prompts: Sequence[str], completions: Sequence[str], rows: Sequence[Any]
) -> RewardOutput:
    """A final reward of 0 for every episode: the score is the environment's turn rewards."""
    return RewardOutput(scores=torch.zeros(len(completions)))


class GuessNumberPrompts:
    """Prompt source (``PromptDataModule`` train/val) of guess-the-number tasks.

    Rows: ``query_id``, ``task="guess_number"``, ``question``, ``target`` (an int in
    [1, ``max_value``]).
    """

    def __init__(self, num_examples: int = 64, seed: int = 0, max_value: int = 10) -> None:
        if num_examples < 1 or max_value < 2:
            raise ValueError(
                f"num_examples must be >= 1 and max_value >= 2, got {num_examples} and "
                f"{max_value}. Fix: e.g. num_examples: 64, max_value: 10."
            )
        self.num_examples, self.seed, self.max_value = num_examples, seed, max_value

    def load(self) -> Table:
        rng = random.Random(self.seed)
        question = (
            f"I am thinking of a whole number from 1 to {self.max_value}. Guess it: reply with "
            "<guess>N</guess>. After a wrong guess I say higher or lower and you guess again."
        )
        rows = [
            {
                "query_id": f"guess-{self.seed}-{i}",
                "task": "guess_number",
                "question": question,
                "target": rng.randint(1, self.max_value),
            }
            for i in range(self.num_examples)
        ]
        return datasets.Dataset.from_list(rows)
