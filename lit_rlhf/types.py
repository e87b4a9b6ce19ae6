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

import torch
from torch import Tensor


@dataclass
class GenerationOutput:
    """What a generation engine returns for a left-padded prompt batch."""

    response_ids: Tensor  # [B, R] long, right-padded with the pad id
    response_mask: Tensor  # [B, R] bool, True up to and including EOS
    # [B, R] float32, log-prob of each token under the sampling distribution; None when
    # generate was called with log_probs=False
    log_probs: Tensor | None
    # [B, R] long, the weight version that sampled each token (-1 on padding); None: the engine
    # does not tag tokens (every engine but a server's, whose requests may span weight pushes)
    token_versions: Tensor | None = None


@dataclass
class RewardOutput:
    """A reward function's verdict on a batch of completions."""

    scores: Tensor  # [B] float32, the scalar reward per completion
    info: dict[str, Tensor] = field(default_factory=dict)  # name -> [B] float, logged as means


@dataclass
class Rollout:
    """One rollout batch: G samples for each prompt of a data batch, scored.

    Built whole by :class:`lit_rlhf.training.RolloutCollector` (generation, then the reward and
    the reward-term callbacks); what an update adds on top is an :class:`Experience`.
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
    scores: Tensor  # [B] float32, the reward plus the reward-term callbacks' terms
    reward_info: dict[str, Tensor]  # name -> [B] float, the reward's per-sample info
    term_stats: dict[str, Tensor] = field(default_factory=dict)  # reward terms' diagnostics
    # multi-turn episodes only (None: single-turn). response_ids then hold the agent's and the
    # environment's turns as one token sequence; response_mask covers both (the forward pass
    # attends to every token), agent_mask only the sampled ones (the loss and token counts)
    agent_mask: Tensor | None = None  # [B, R] bool, True = a token the policy sampled
    turn_ends: Tensor | None = None  # [B, K] long, K = max_turns: the last agent token's
    # response index of each turn, -1 for turns not taken
    turn_rewards: Tensor | None = None  # [B, K] float32, the environment's reward per turn
    cut: Tensor | None = None  # [B] bool, the episode was cut by a token budget
    # the weight version (updates done) the engine sampled with; set by one-step-off training
    weight_version: int | None = None
    # [B, R] long, the weight version that sampled each response token (-1 on padding and on
    # tokens the policy did not sample); None when the engine does not tag tokens
    token_versions: Tensor | None = None

    @property
    def input_ids(self) -> Tensor:  # [B, T]
        return torch.cat([self.prompt_ids, self.response_ids], dim=1)

    @property
    def attention_mask(self) -> Tensor:  # [B, T] bool
        return torch.cat([self.prompt_mask, self.response_mask], dim=1)

    def __len__(self) -> int:
        return int(self.response_ids.shape[0])


@dataclass
class CriticTargets:
    """What a learned critic adds to an experience (GAE only)."""

    values: Tensor  # [B, R] critic values when the rollout was collected
    returns: Tensor  # [B, R] value targets


@dataclass
class Experience:
    """A rollout prepared for policy updates.

    ``old_log_probs`` are the rollout policy's log-probs (the ratio's denominator). When
    ``old_from_update`` is set (one update per rollout and the engine was not asked for them)
    they start as zeros and the update writes its own detached log-probs in, micro-batch by
    micro-batch, so afterwards the experience holds them as if the engine had returned them.
    ``loss_mask`` leaves whole responses out of the loss (DAPO's overlong filter) while their
    tokens stay in the forward pass and their scores in the group baselines; ``counted`` is
    the mask every loss and token count reads (in multi-turn rollouts it also leaves out the
    environment's tokens: ``Rollout.agent_mask``). ``kept`` leaves whole samples out of the update
    and out of the advantages' statistics too: those whose reward failed
    (:mod:`lit_rlhf.training.reward_mask`).
    """

    rollout: Rollout
    old_log_probs: Tensor  # [B, R] float32
    advantages: Tensor  # [B, R]
    ref_log_probs: Tensor | None = None  # [B, R] frozen reference log-probs (KL on only)
    critic: CriticTargets | None = None  # GAE only
    old_from_update: bool = False
    loss_mask: Tensor | None = None  # [B] bool, False = the response is left out of the loss
    # [B] bool, False = the sample's reward failed (or its group was left with one sample): out
    # of the advantages and the loss; None: every sample is kept
    kept: Tensor | None = None

    def __len__(self) -> int:
        return len(self.rollout)

    @property
    def counted(self) -> Tensor:
        """[B, R] bool: the response tokens the loss counts."""
        mask = self.rollout.response_mask
        if self.rollout.agent_mask is not None:  # environment tokens carry no loss
            mask = mask & self.rollout.agent_mask
        if self.kept is not None:
            mask = mask & self.kept[:, None]
        return mask if self.loss_mask is None else mask & self.loss_mask[:, None]
