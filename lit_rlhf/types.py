"""Records that flow between rollout, scoring and the PPO update.

Shape legend used across lit-rlhf:
    B  sequences in a rollout batch (prompts x samples per prompt)
    P  prompt length (left-padded)
    R  response length (right-padded)
    T  total length P + R
    V  vocabulary size (the logits' last dimension, padded vocab included)
    G  samples per prompt (group size)

Mask convention, everywhere: ``bool``, ``True`` = the token counts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor


@dataclass
class GenerationOutput:
    """What a generation engine returns for a left-padded prompt batch."""

    response_ids: Tensor  # [B, R] long, right-padded with the pad id
    response_mask: Tensor  # [B, R] bool, True up to and including EOS
    # [B, R] float32, log-prob of each token under the sampling distribution; None when
    # generate was called with log_probs=False
    log_probs: Tensor | None


@dataclass
class RewardOutput:
    """A reward function's verdict on a batch of completions."""

    scores: Tensor  # [B] float32, the scalar reward per completion
    info: dict[str, Tensor] = field(default_factory=dict)  # name -> [B] float, logged as means


@dataclass
class Rollout:
    """One rollout batch: G samples for each prompt of a data batch, and everything scored on them.

    Fields after ``rows`` are filled by the PPO module as the step proceeds.
    """

    prompt_ids: Tensor  # [B, P] long, left-padded
    prompt_mask: Tensor  # [B, P] bool
    response_ids: Tensor  # [B, R] long, right-padded
    response_mask: Tensor  # [B, R] bool
    sample_log_probs: Tensor | None  # [B, R] float32, from the engine; None if not asked for
    group_ids: Tensor  # [B] long, which prompt of the batch the sample came from
    query_ids: list[str]  # [B] stable prompt id, survives epochs and shuffling
    tasks: list[str]  # [B] domain / task label (e.g. "countdown", "math")
    rows: list[Mapping[str, Any]]  # [B] the data rows, read by rewards (targets, answers)
    prompts: list[str]  # [B] prompt text as rendered (chat template applied)
    responses: list[str]  # [B] decoded response text, special tokens stripped
    old_log_probs: Tensor | None = None  # [B, R] policy log-probs before the update
    ref_log_probs: Tensor | None = None  # [B, R] frozen reference log-probs (KL on only)
    values: Tensor | None = None  # [B, R] critic values (GAE only)
    scores: Tensor | None = None  # [B] scalar reward
    advantages: Tensor | None = None  # [B, R]
    returns: Tensor | None = None  # [B, R] value targets (GAE only)

    @property
    def input_ids(self) -> Tensor:  # [B, T]
        import torch

        return torch.cat([self.prompt_ids, self.response_ids], dim=1)

    @property
    def attention_mask(self) -> Tensor:  # [B, T] bool
        import torch

        return torch.cat([self.prompt_mask, self.response_mask], dim=1)

    def __len__(self) -> int:
        return int(self.response_ids.shape[0])
