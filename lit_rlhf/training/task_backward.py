"""Backward task by task: the strategy hook of multi-task gradient methods (MGS, arXiv
2602.02301), used by :class:`~lit_rlhf.training.OptimizerStep` when a callback implements
:class:`~lit_rlhf.training.protocols.TaskGradientHook`.

For every task (domain) of the optimizer step, in sorted order: zero the gradients, run the
backward of that task's micro-batches, keep a flat float32 copy of the gradient (one copy per
task: the extra memory is ``tasks x parameters x 4`` bytes). Under DDP the backward runs inside
``no_sync`` (DDP would otherwise average each backward across ranks, mixing rank 0's math with
rank 1's chat, which is what the authors' code does) and each task's copy is then all-reduced on
its own and divided by the world size: every rank holds the same per-task gradients, each the
average over ranks that DDP would have computed for that task alone. A task missing on one rank
contributes zeros there (ranks agree on the union of tasks first). The callback combines the
per-task gradients; the result becomes ``param.grad`` for the gradient hooks, clipping and step.

DeepSpeed is refused for now: its ZeRO optimizers reduce gradients inside their own buffers at
each accumulation boundary, which needs per-task boundaries on every rank in lock-step.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from lightning import LightningModule
from torch import Tensor

from lit_rlhf.strategies import is_deepspeed

MicroBatch = TypeVar("MicroBatch")


def check_task_backward_supported(strategy: Any, who: str) -> None:
    """A clear error, at setup, for a strategy the per-task backward does not support."""
    if is_deepspeed(strategy):
        raise NotImplementedError(
            f"{who} needs one gradient per task, and the per-task backward does not support "
            "DeepSpeed yet (ZeRO reduces gradients inside its own buffers). Fix: train with "
            "strategy ddp (configs/trainer/ddp.yaml) or on one device."
        )


def task_backward(
    module: LightningModule,
    optimizer: Any,
    micro_batches: Sequence[MicroBatch],
    loss_fn: Callable[[MicroBatch], Tensor],
    task_of: Callable[[MicroBatch], str],
    hook: Any,
) -> dict[str, Tensor]:
    """Per-task backward, the hook's combination written to ``param.grad``; returns the hook's
    diagnostics under ``<hook class name>/<key>``."""
    trainer = module.trainer
    check_task_backward_supported(trainer.strategy, type(hook).__name__)
    params = {name: p for name, p in module.named_parameters() if p.requires_grad}
    by_task: dict[str, list[MicroBatch]] = {}
    for micro in micro_batches:
        by_task.setdefault(str(task_of(micro)), []).append(micro)
    block_sync = getattr(trainer.strategy, "block_backward_sync", None)
    grads_by_task: dict[str, dict[str, Tensor]] = {}
    for task in _union_across_ranks(sorted(by_task)):
        optimizer.zero_grad()
        with block_sync() if callable(block_sync) else nullcontext():
            for micro in by_task.get(task, []):
                module.manual_backward(loss_fn(micro))
        flat = torch.cat([_grad(p).reshape(-1).float() for p in params.values()])
        grads_by_task[task] = _views(_mean_across_ranks(flat), params)
    combined, stats = hook.combine_task_gradients(trainer, module, grads_by_task)
    for name, param in params.items():
        param.grad = combined[name].detach().to(param.dtype).reshape(param.shape).clone()
    name = type(hook).__name__
    return {f"{name}/{k}": torch.as_tensor(v).detach() for k, v in stats.items()}


def _grad(param: Tensor) -> Tensor:
    return param.grad if param.grad is not None else torch.zeros_like(param)


def _views(flat: Tensor, params: Mapping[str, Tensor]) -> dict[str, Tensor]:
    views, offset = {}, 0
    for name, param in params.items():
        views[name] = flat[offset : offset + param.numel()].view(param.shape)
        offset += param.numel()
    return views


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _union_across_ranks(tasks: list[str]) -> list[str]:
    if not _distributed():
        return tasks
    gathered: list[list[str] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, tasks)
    return sorted({t for ranks in gathered for t in ranks or []})


def _mean_across_ranks(flat: Tensor) -> Tensor:
    if _distributed():
        dist.all_reduce(flat)
        flat /= dist.get_world_size()
    return flat
