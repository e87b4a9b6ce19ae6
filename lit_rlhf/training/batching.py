"""Rollout bookkeeping for an update: critic values, padding trimming, mini-batch indices.
(The policy's forward over prompt + response is ``lit_rlhf.models.forward``.)"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor, nn

from lit_rlhf.models.forward import position_ids_from_mask


def critic_values(critic: nn.Module, input_ids: Tensor, attention_mask: Tensor, r: int) -> Tensor:
    """[B, R] value of the state before each response token."""
    values = critic(input_ids, attention_mask.long(), position_ids_from_mask(attention_mask))
    return values[:, -r - 1 : -1].float()


def trim_columns(prompt_mask: Tensor, response_mask: Tensor) -> tuple[slice, slice]:
    """Column slices that drop all-padding prompt columns (left) and response columns (right)."""
    p_used = prompt_mask.any(0).nonzero()
    r_used = response_mask.any(0).nonzero()
    p0 = int(p_used[0]) if len(p_used) else prompt_mask.shape[1]
    r1 = int(r_used[-1]) + 1 if len(r_used) else 1
    return slice(p0, prompt_mask.shape[1]), slice(0, r1)


def minibatches(
    n: int, size: int, *, generator: torch.Generator, shuffle: bool = True
) -> Iterator[Tensor]:
    """Index tensors of mini-batches covering ``range(n)`` once (last one may be smaller)."""
    order = torch.randperm(n, generator=generator) if shuffle else torch.arange(n)
    yield from order.split(size)
