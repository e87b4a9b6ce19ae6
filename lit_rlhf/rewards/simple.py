"""Cheap rule rewards for smoke tests and throughput benchmarks (no task, no parser)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from lit_rlhf.types import RewardOutput


class DigitFractionReward:
    """Fraction of the completion's non-whitespace characters that are ASCII digits, in [0, 1].

    An empty (or all-whitespace) completion scores 0. A tiny policy learns to raise it within a
    few steps, which makes it a quick end-to-end check that rewards reach the update.
    """

    def __call__(
        self,
        prompts: Sequence[str],
        completions: Sequence[str],
        rows: Sequence[Mapping[str, Any]],
    ) -> RewardOutput:
        scores = [_digit_fraction(text) for text in completions]
        return RewardOutput(scores=torch.tensor(scores, dtype=torch.float32))


def _digit_fraction(text: str) -> float:
    chars = [c for c in text if not c.isspace()]
    if not chars:
        return 0.0
    return sum(c in "0123456789" for c in chars) / len(chars)
