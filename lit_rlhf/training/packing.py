"""Token-budget micro-batches (``micro_batch_tokens``) for the PPO update and the experience.

The forwards that build the experience (old, reference, critic) are chunked the same way.

With ``micro_batch_tokens`` set, a micro-batch is a set of rows whose real tokens (prompt +
response, no padding) sum to at most the budget, run as one packed, padding-free forward
(:mod:`lit_rlhf.models.chunked`). The plan:

- mini-batches are drawn by shuffling prompt groups, not rows, so a group's samples land in the
  same mini-batch whenever ``mini_batch_size`` is a multiple of the group size;
- inside a mini-batch the units are whole groups (a group whose tokens exceed the budget is
  split into its rows), placed first-fit-decreasing into bins of ``micro_batch_tokens``; a
  single row longer than the budget goes alone;
- with a per-task gradient callback (MGS) each task is planned on its own, so every
  micro-batch holds one task;
- under DDP / ZeRO every rank runs the same number of micro-batches and LM-head chunks: the
  counts are agreed with an all-reduce MAX and the short ranks run zero-weight padding
  micro-batches (ZeRO-3 gathers parameters collectively inside every forward).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import Tensor, nn

from lit_rlhf.models.chunked import PackedForward, pack_rows, packed_response_forward
from lit_rlhf.models.forward import forward_response
from lit_rlhf.training.batching import critic_values
from lit_rlhf.types import Rollout


def row_tokens(rollout: Rollout) -> Tensor:
    """[B] long: real tokens (prompt + response) of each row, what the budget counts."""
    return (rollout.prompt_mask.sum(1) + rollout.response_mask.sum(1)).cpu()


def group_minibatches(group_ids: Tensor, size: int, *, generator: torch.Generator) -> list[Tensor]:
    """Mini-batch index tensors covering every row once: groups in a random order, each group's
    rows contiguous, cut every ``size`` rows (groups stay whole when ``size`` is a multiple of
    the group size)."""
    unique = torch.unique(group_ids)
    order = unique[torch.randperm(len(unique), generator=generator)]
    rows = torch.cat([(group_ids == g).nonzero().squeeze(-1) for g in order.tolist()])
    return list(rows.split(size))


def plan_token_budget(rows: Tensor, tokens: Tensor, groups: Tensor, budget: int) -> list[Tensor]:
    """Split ``rows`` [b] (with their ``tokens`` [b] and prompt ``groups`` [b]) into micro-batches
    of at most ``budget`` tokens, first-fit-decreasing over whole groups (rows of a group larger
    than the budget are placed one by one). Deterministic; every row appears exactly once."""
    units: dict[int, list[int]] = {}
    for i, g in enumerate(groups.tolist()):
        units.setdefault(int(g), []).append(i)
    pieces: list[list[int]] = []
    for members in units.values():
        total = int(tokens[members].sum())
        pieces.extend([members] if total <= budget else [[i] for i in members])
    pieces.sort(key=lambda p: -int(tokens[p].sum()))  # stable: equal sizes keep their order
    bins: list[list[int]] = []
    room: list[int] = []
    for piece in pieces:
        need = int(tokens[piece].sum())
        slot = next((k for k, free in enumerate(room) if free >= need), None)
        if slot is None:
            bins.append([])
            room.append(budget)
            slot = len(bins) - 1
        bins[slot].extend(piece)
        room[slot] -= need
    return [rows[torch.tensor(b, dtype=torch.long)] for b in bins]


def agree_max(count: int, device: torch.device | str = "cpu") -> int:
    """The largest ``count`` over the ranks (``count`` itself outside a process group)."""
    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return count
    if dist.get_backend() == "nccl" and torch.cuda.is_available():
        device = torch.device("cuda", torch.cuda.current_device())
    value = torch.tensor([count], dtype=torch.long, device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return int(value.item())


@torch.no_grad()
def packed_rollout_forward(
    model: nn.Module,
    rollout: Rollout,
    *,
    budget: int,
    temperature: float,
    with_hidden: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """(log-probs [B, R] fp32, last hidden states [B, R, H] or None) of the whole rollout, one
    packed forward per token-budget chunk (the experience's old / reference forwards)."""
    chunks = plan_token_budget(
        torch.arange(len(rollout)), row_tokens(rollout), rollout.group_ids.cpu(), budget
    )
    n = agree_max(len(chunks))
    log_probs = torch.zeros(rollout.response_mask.shape, dtype=torch.float32)
    log_probs = log_probs.to(rollout.response_ids.device)
    hidden: Tensor | None = None
    for i in range(n):
        rows = chunks[i] if i < len(chunks) else chunks[0][:1]  # padding: rerun one row
        fwd = _forward_rows(model, rollout, rows, temperature, with_hidden)
        if i >= len(chunks):
            continue
        log_probs[rows] = fwd.log_probs
        if fwd.hidden is not None:
            if hidden is None:
                hidden = fwd.hidden.new_zeros((*log_probs.shape, fwd.hidden.shape[-1]))
            hidden[rows] = fwd.hidden
    return log_probs, hidden


def _forward_rows(
    model: nn.Module, rollout: Rollout, rows: Tensor, temperature: float, with_hidden: bool
) -> PackedForward:
    packed = pack_rows(
        rollout.prompt_ids[rows],
        rollout.prompt_mask[rows],
        rollout.response_ids[rows],
        rollout.response_mask[rows],
    )
    device = packed.input_ids.device
    return packed_response_forward(
        model,
        packed,
        temperature=temperature,
        with_hidden=with_hidden,
        num_chunks=lambda k: agree_max(k, device),
    )


def packed_critic_values(
    critic: Callable[..., Tensor],
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    response_ids: Tensor,
    response_mask: Tensor,
) -> Tensor:
    """[b, R] values of a separate critic (``CriticModel``) from one packed forward: the value of
    the state before each response token (0 outside the mask)."""
    packed = pack_rows(prompt_ids, prompt_mask, response_ids, response_mask)
    values = critic(packed.input_ids, None, packed.position_ids)[0]
    return packed.scatter(values[packed.source].float())


def rollout_forward(
    model: nn.Module,
    rollout: Rollout,
    budget: int | None,
    *,
    temperature: float,
    with_hidden: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """(log-probs [B, R], last hidden states [B, R, H] or None) of the whole rollout: one padded
    forward (``budget`` None), or packed forwards of at most ``budget`` tokens each."""
    if budget is not None:
        return packed_rollout_forward(
            model, rollout, budget=budget, temperature=temperature, with_hidden=with_hidden
        )
    fwd = forward_response(
        model,
        rollout.input_ids,
        rollout.attention_mask,
        rollout.response_ids,
        temperature=temperature,
        with_hidden=with_hidden,
    )
    return fwd.log_probs, fwd.hidden


@torch.no_grad()
def rollout_critic_values(critic: nn.Module, rollout: Rollout, budget: int | None) -> Tensor:
    """[B, R] values of a separate critic over the whole rollout (padded, or packed by budget)."""
    if budget is None:
        r = rollout.response_ids.shape[1]
        return critic_values(critic, rollout.input_ids, rollout.attention_mask, r)
    chunks = plan_token_budget(
        torch.arange(len(rollout)), row_tokens(rollout), rollout.group_ids.cpu(), budget
    )
    values = torch.zeros(rollout.response_mask.shape, dtype=torch.float32)
    values = values.to(rollout.response_ids.device)
    n = agree_max(len(chunks))
    for i in range(n):
        rows = chunks[i] if i < len(chunks) else chunks[0][:1]
        out = packed_critic_values(
            critic,
            rollout.prompt_ids[rows],
            rollout.prompt_mask[rows],
            rollout.response_ids[rows],
            rollout.response_mask[rows],
        )
        if i < len(chunks):
            values[rows] = out
    return values
