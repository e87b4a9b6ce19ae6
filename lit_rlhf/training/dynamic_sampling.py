"""DAPO's dynamic sampling (Yu et al. 2025, arXiv 2503.14476, sec. 3.2) as a rollout option of
the shared core: keep only the groups whose rewards differ, and keep drawing prompt batches
until the update holds exactly as many groups as one batch has prompts.

Each ``training_step`` draws one prompt batch from the loader as usual and generates for it;
its informative groups join a buffer. While the buffer holds fewer groups than the batch size,
the step ends without an update (the policy does not move, so every buffered group comes from
the same policy); once it holds enough, the update runs on exactly that many groups (the first
ones, in drawing order) and the surplus is dropped, as DAPO does. ``max_rounds`` batches in a
row without filling stop the run with an error that names the fix (the prompts are all solved
or all failed). Under DDP every rank fills its own buffer and the ranks update together, when
all of them are full (a collective minimum), so they take the same optimizer steps. The buffer
is saved in checkpoints, so a run killed between two updates resumes with the groups it had.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import Tensor

from lit_rlhf.algos import informative_groups
from lit_rlhf.rewards.guarded import failed_samples
from lit_rlhf.types import Rollout

_ROW_FIELDS = ("query_ids", "tasks", "rows", "prompts", "responses")


def select_rows(rollout: Rollout, index: Tensor) -> Rollout:
    """The rollout's samples ``index`` [b] (long), in that order."""
    rows = index.tolist()
    picked: dict[str, Any] = {
        "prompt_ids": rollout.prompt_ids[index],
        "prompt_mask": rollout.prompt_mask[index],
        "response_ids": rollout.response_ids[index],
        "response_mask": rollout.response_mask[index],
        "sample_log_probs": None
        if rollout.sample_log_probs is None
        else rollout.sample_log_probs[index],
        "group_ids": rollout.group_ids[index],
        "scores": rollout.scores[index],
        "reward_info": {k: v[index] for k, v in rollout.reward_info.items()},
        "term_stats": dict(rollout.term_stats),
        "weight_version": rollout.weight_version,
        "token_versions": None if rollout.token_versions is None else rollout.token_versions[index],
    }
    for name in _ROW_FIELDS:
        values = getattr(rollout, name)
        picked[name] = [values[i] for i in rows]
    return Rollout(**picked)


def _pad(tensors: list[Tensor], value: Any, *, left: bool) -> Tensor:
    width = max(t.shape[1] for t in tensors)
    out = []
    for t in tensors:
        fill = t.new_full((t.shape[0], width - t.shape[1]), value)
        out.append(torch.cat([fill, t] if left else [t, fill], dim=1))
    return torch.cat(out)


def concat_rollouts(parts: list[Rollout], pad_id: int) -> Rollout:
    """One rollout of ``parts`` (prompts re-padded on the left, responses on the right, token
    versions with -1); group ids are renumbered so that groups of different parts never share
    an id; its weight version is the oldest part's (None if a part has none)."""
    offset, groups = 0, []
    for part in parts:
        groups.append(part.group_ids - part.group_ids.min() + offset)
        offset = int(groups[-1].max()) + 1 if len(part) else offset
    logps = [p.sample_log_probs for p in parts]
    tags = [p.token_versions for p in parts]
    versions = [p.weight_version for p in parts]
    keys = set.intersection(*(set(p.reward_info) for p in parts))
    merged: dict[str, Any] = {
        "prompt_ids": _pad([p.prompt_ids for p in parts], pad_id, left=True),
        "prompt_mask": _pad([p.prompt_mask for p in parts], False, left=True),
        "response_ids": _pad([p.response_ids for p in parts], pad_id, left=False),
        "response_mask": _pad([p.response_mask for p in parts], False, left=False),
        "sample_log_probs": None
        if any(x is None for x in logps)
        else _pad([x for x in logps if x is not None], 0.0, left=False),
        "group_ids": torch.cat(groups),
        "scores": torch.cat([p.scores for p in parts]),
        "reward_info": {k: torch.cat([p.reward_info[k] for p in parts]) for k in sorted(keys)},
        "term_stats": dict(parts[-1].term_stats),
        "weight_version": None if None in versions else min(versions),  # type: ignore[type-var]
        "token_versions": None
        if any(x is None for x in tags)
        else _pad([x for x in tags if x is not None], -1, left=False),
    }
    for name in _ROW_FIELDS:
        merged[name] = [x for p in parts for x in getattr(p, name)]
    return Rollout(**merged)


class DynamicSampler:
    """The buffer of informative groups between updates.

    Args:
        max_rounds: prompt batches drawn in a row without filling the update that stop the run.
    """

    def __init__(self, max_rounds: int) -> None:
        if max_rounds < 1:
            raise ValueError(f"max_rounds must be >= 1, got {max_rounds}")
        self.max_rounds = max_rounds
        self.buffer: list[Rollout] = []
        self.rounds = 0
        self.last_stats: dict[str, Tensor] = {}

    def groups(self) -> int:
        return sum(int(torch.unique(r.group_ids).numel()) for r in self.buffer)

    def add(self, rollout: Rollout, target: int, pad_id: int) -> Rollout | None:
        """Buffer the informative groups of ``rollout``; the update's rollout of exactly
        ``target`` groups once every rank holds that many, else None."""
        keep = _informative(rollout)
        if bool(keep.any()):
            self.buffer.append(select_rows(rollout, keep.nonzero().squeeze(1)))
        self.rounds += 1
        informative = float(keep.float().mean()) if len(rollout) else 0.0
        self.last_stats = {"rollout/informative_groups": torch.tensor(informative)}
        if _everyone_has(self.groups(), target):
            return self._take(target, pad_id)
        if self.rounds >= self.max_rounds:
            raise RuntimeError(
                f"dynamic sampling drew {self.rounds} prompt batches and holds "
                f"{self.groups()} of the {target} groups whose rewards differ that one update "
                "needs: the prompts are (nearly) all solved or all failed by this policy. Fix: "
                "use harder or easier prompts, raise samples_per_prompt, raise "
                "dynamic_sampling_max_rounds, or set dynamic_sampling: false."
            )
        return None

    def _take(self, target: int, pad_id: int) -> Rollout:
        merged = concat_rollouts(self.buffer, pad_id)
        first = torch.unique_consecutive(merged.group_ids)[:target]
        rows = torch.isin(merged.group_ids, first).nonzero().squeeze(1)
        out = select_rows(merged, rows)
        self.last_stats["rollout/dynamic_sampling_rounds"] = torch.tensor(float(self.rounds))
        self.buffer, self.rounds = [], 0
        return out

    def state_dict(self) -> dict[str, Any]:
        return {
            "rounds": self.rounds,
            "buffer": [dataclasses.asdict(r) for r in self.buffer],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rounds = int(state.get("rounds", 0))
        self.buffer = [Rollout(**r) for r in state.get("buffer", [])]


def _informative(rollout: Rollout) -> Tensor:
    """[B] bool: the samples of groups whose scores differ, among the samples whose reward did
    not fail (``GuardedReward(on_error='mask')``: a placeholder score says nothing)."""
    scored = ~failed_samples(rollout.reward_info, len(rollout)).to(rollout.scores.device)
    if bool(scored.all()):
        return informative_groups(rollout.scores, rollout.group_ids)
    groups = rollout.group_ids[scored]
    informative = groups[informative_groups(rollout.scores[scored], groups)]
    return torch.isin(rollout.group_ids, informative)


def _everyone_has(groups: int, target: int) -> bool:
    """Whether every rank holds at least ``target`` groups (a collective minimum under DDP)."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return groups >= target
    fewest = torch.tensor([groups], dtype=torch.long)
    if dist.get_backend() == "nccl":
        fewest = fewest.cuda()
    dist.all_reduce(fewest, op=dist.ReduceOp.MIN)
    return int(fewest.item()) >= target
