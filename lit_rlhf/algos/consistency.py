"""ConsistRM's label-free rewards for a generative reward model (arXiv 2604.07484).

No human labels: each pair's pseudo-label is the sign of this round's vote plus the query's
memory of past pseudo-labels (temporal consistency), the answer reward checks each rollout
against it, and a small bonus goes to the correct rollouts whose critiques agree most with
their peers (semantic consistency). Labels are -1 ("Response 1 is better"), +1 ("Response 2 is
better") and 0 (no supervision). Every constant is a keyword argument; defaults are the paper's.

The memory's "mode" (which entry is evicted) follows the authors' code (``get_group_baseline``
in their ``RewardManager``, ``mode_rule="authors"``): +1 counted against everything else, so a 0
counts with the -1s, and a tie gives mode 0. ``mode_rule="plurality"`` (lit-rlhf's earlier
reading of the paper's word) takes the most frequent of -1 / 0 / +1, a tie drawn at random.

Decisions the paper leaves open (the authors' code agrees with the first two):
- a pseudo-label of 0 is appended to the memory like any other (the paper: "append y"), so a
  query that keeps tying pulls its memory score towards 0;
- equally far entries are chosen between at random (with the generator);
- rollouts are sub-grouped by equal answer reward, so with the default constants a disagreeing
  and an unparsable rollout (both -1) share a sub-group.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

_LABELS = (-1, 0, 1)
ModeRule = Literal["authors", "plurality"]
MODE_RULES = ("authors", "plurality")


def _sign(x: int) -> int:
    return (x > 0) - (x < 0)


def _pick(n: int, generator: torch.Generator) -> int:
    return int(torch.randint(n, (1,), generator=generator).item()) if n > 1 else 0


def pseudo_label(online: Sequence[int | None], memory: Sequence[int]) -> int:
    """The pseudo-label of one query, ``y = sign(s_on + s_mem)``: the target of ConsistRM's
    consistency-aware answer reward (arXiv 2604.07484).

    Args:
        online: [K] parsed labels (-1 / +1) of this round's rollouts for the query; None for an
            unparsable or format-invalid rollout, which is left out.
        memory: the query's past pseudo-labels (-1 / 0 / +1).

    Returns:
        -1, 0 or +1, where ``s_on`` is the mean of the valid online labels and ``s_mem`` the
        mean of the memory (each 0 when empty); 0 (no supervision) on a tie or when both are
        empty. Computed in integers, ``sign(sum_on * n_mem + sum_mem * n_on)``, so an exact tie
        is never broken by rounding.
    """
    valid = [label for label in online if label is not None]
    if any(label not in (-1, 1) for label in valid):
        raise ValueError(f"online labels must be -1, +1 or None, got {list(online)}")
    if any(label not in _LABELS for label in memory):
        raise ValueError(f"memory labels must be -1, 0 or +1, got {list(memory)}")
    n_online, n_memory = max(len(valid), 1), max(len(memory), 1)
    return _sign(sum(valid) * n_memory + sum(memory) * n_online)


def memory_mode(memory: Sequence[int], *, rule: ModeRule, generator: torch.Generator) -> int:
    """The mode a memory's eviction measures distances from (ConsistRM, arXiv 2604.07484).

    ``authors`` (their code): +1 if more than half the entries are +1, -1 if fewer than half,
    0 on a tie, so 0 entries count with the -1s. ``plurality``: the most frequent of -1 / 0 /
    +1, a tie drawn with ``generator`` (drawn from only when there is a tie).
    """
    if rule == "authors":
        positive = sum(1 for entry in memory if entry == 1)
        return _sign(2 * positive - len(memory))
    if rule != "plurality":
        raise ValueError(f"mode_rule must be one of {MODE_RULES}, got {rule!r}")
    counts = Counter(memory)
    top = max(counts.values())
    modes = sorted(value for value, count in counts.items() if count == top)
    return modes[_pick(len(modes), generator)]


def update_memory(
    memory: Sequence[int],
    label: int,
    *,
    cap: int = 20,
    generator: torch.Generator,
    mode_rule: ModeRule = "authors",
) -> list[int]:
    """The query's memory after this step's pseudo-label (ConsistRM, arXiv 2604.07484).

    If appending would exceed ``cap``, first one entry farthest from the memory's mode
    (:func:`memory_mode`, ``|entry - mode|``) is dropped, then ``label`` is appended (0
    included), as the authors' code does. Equally far entries are chosen between with
    ``generator``, which is only drawn from when there is a choice. A memory already over ``cap``
    (e.g. a smaller cap on resume) is cut down the same way, one entry at a time.

    Args:
        memory: the query's past pseudo-labels (-1 / 0 / +1), oldest first; not modified.
        label: this step's pseudo-label from :func:`pseudo_label`.
        cap: the most entries the memory keeps (the paper: 20).
        generator: the random source of the tie breaks (checkpoint it with the memory).
        mode_rule: ``authors`` or ``plurality`` (:func:`memory_mode`).

    Returns:
        A new list of at most ``cap`` entries, ``label`` last.
    """
    if cap < 1:
        raise ValueError(f"cap must be >= 1, got {cap}")
    if mode_rule not in MODE_RULES:
        raise ValueError(f"mode_rule must be one of {MODE_RULES}, got {mode_rule!r}")
    if label not in _LABELS or any(entry not in _LABELS for entry in memory):
        raise ValueError(f"labels must be -1, 0 or +1, got label {label}, memory {list(memory)}")
    kept = list(memory)
    while len(kept) + 1 > cap:
        mode = memory_mode(kept, rule=mode_rule, generator=generator)
        distances = [abs(entry - mode) for entry in kept]
        far = max(distances)
        farthest = [i for i, distance in enumerate(distances) if distance == far]
        del kept[farthest[_pick(len(farthest), generator)]]
    kept.append(label)
    return kept


def answer_rewards(
    labels: Sequence[int | None],
    pseudo: int,
    *,
    agree: float = 1.0,
    disagree: float = -1.0,
    unparsable: float = -1.0,
) -> Tensor:
    """The consistency-aware answer reward of each rollout (ConsistRM, arXiv 2604.07484).

    Args:
        labels: [K] parsed labels of the query's rollouts, None when unparsable.
        pseudo: the query's pseudo-label from :func:`pseudo_label`.
        agree, disagree, unparsable: the reward of a rollout whose label equals ``pseudo``,
            differs from it, or could not be read.

    Returns:
        [K] float32; all zeros when ``pseudo`` is 0 (no supervision this step).
    """
    if pseudo not in _LABELS:
        raise ValueError(f"pseudo must be -1, 0 or +1, got {pseudo}")
    if pseudo == 0:
        return torch.zeros(len(labels), dtype=torch.float32)
    values = [
        unparsable if label is None else agree if label == pseudo else disagree for label in labels
    ]
    return torch.tensor(values, dtype=torch.float32)


def critique_bonus(
    embeddings: Tensor, answer_rewards: Tensor, *, bonus: float = 0.1, positive: float = 1.0
) -> tuple[Tensor, Tensor]:
    """The consistency-aware critique reward (ConsistRM, arXiv 2604.07484).

    Rollouts are sub-grouped by equal answer reward; a rollout's consistency is its mean cosine
    similarity to the other members of its sub-group (1.0 when it is alone). Among the rollouts
    whose answer reward equals ``positive`` (n of them), the ``ceil(n / 2)`` most consistent get
    ``bonus``; ties go to the lower index, so the choice is deterministic.

    Args:
        embeddings: [K, D] embeddings of the rollouts' critiques (:func:`critique_text`);
            L2-normalised here, so raw pooled states are fine. Read without gradient.
        answer_rewards: [K] the rollouts' answer rewards (:func:`answer_rewards`).
        bonus: the reward of a selected rollout (the paper: 0.1).
        positive: the answer reward that makes a rollout eligible.

    Returns:
        (bonus [K] float32, consistency [K] float32), on the embeddings' device.
    """
    if embeddings.ndim != 2 or answer_rewards.shape != embeddings.shape[:1]:
        raise ValueError(
            f"embeddings must be [K, D] and answer_rewards [K], got {tuple(embeddings.shape)} "
            f"and {tuple(answer_rewards.shape)}"
        )
    unit = F.normalize(embeddings.detach().float(), dim=-1)
    rewards = answer_rewards.detach().to(unit.device)
    k = rewards.shape[0]
    same_reward = rewards[:, None] == rewards[None, :]
    peers = same_reward & ~torch.eye(k, dtype=torch.bool, device=unit.device)
    n_peers = peers.sum(-1)
    similarity_sum = ((unit @ unit.T) * peers).sum(-1)
    consistency = torch.where(
        n_peers > 0, similarity_sum / n_peers.clamp(min=1), torch.ones_like(similarity_sum)
    )
    eligible = rewards == positive
    ranked = torch.where(eligible, consistency, torch.full_like(consistency, -math.inf))
    order = torch.sort(ranked, descending=True, stable=True).indices
    n_selected = math.ceil(int(eligible.sum()) / 2)
    selected = torch.zeros(k, dtype=torch.float32, device=unit.device)
    selected[order[:n_selected]] = bonus
    return selected, consistency
