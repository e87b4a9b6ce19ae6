"""A mean per group (per task, per subset) as torchmetrics that reduce across processes, safe
when a group appears on some ranks only."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torchmetrics import MeanMetric


class GroupedMean(nn.Module):
    """``update(values, groups)`` per batch; ``compute()`` -> ``{group: mean}`` over every
    process. Groups are created as they appear; under torch.distributed every rank first adds
    the groups any rank saw (empty there), so all ranks sync the same metrics in the same order
    (a group seen by one rank only would otherwise leave the others waiting in its all-gather).
    A group empty on every rank is left out."""

    def __init__(self) -> None:
        super().__init__()
        self.groups = nn.ModuleDict()

    @staticmethod
    def _key(group: str) -> str:
        return group.replace(".", "_")  # ModuleDict keys cannot hold dots

    def update(self, values: Tensor, groups: Sequence[str]) -> None:
        if len(groups) != len(values):
            raise ValueError(f"{len(values)} values but {len(groups)} group names")
        for name in sorted(set(groups)):
            key = self._key(name)
            if key not in self.groups:
                self.groups[key] = MeanMetric().to(values.device)
            picked = torch.tensor([g == name for g in groups], device=values.device)
            metric: Any = self.groups[key]
            metric.update(values[picked].float())

    def compute(self) -> dict[str, Tensor]:
        self._align()
        out = {}
        for key in sorted(self.groups):  # the same order on every rank: each compute syncs
            metric: Any = self.groups[key]
            value = metric.compute()
            if not torch.isnan(value):
                out[key] = value
        return out

    def _align(self) -> None:
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            return
        seen: list[list[str] | None] = [None] * dist.get_world_size()
        dist.all_gather_object(seen, sorted(self.groups))
        device = self._device()
        for key in sorted({k for keys in seen for k in keys or []} - set(self.groups)):
            self.groups[key] = MeanMetric().to(device)

    def _device(self) -> torch.device:
        for metric in self.groups.values():
            return torch.device(getattr(metric, "device", "cpu"))
        if dist.get_backend() == "nccl":  # a rank that saw no group: NCCL needs a CUDA tensor
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def reset(self) -> None:
        self.groups = nn.ModuleDict()
