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

Under DeepSpeed ZeRO-1/2 the engine's backward cannot be run per task: ZeRO reduces each
backward into its partitioned buffers at the accumulation boundary, averaging whatever tasks the
ranks held (the authors' order again). So each task's gradient is taken with
``torch.autograd.grad`` (no engine hook fires) and all-reduced here like under DDP; the combined
gradient then enters DeepSpeed through ONE ordinary engine backward of the surrogate loss
``sum_p <p, g_p>`` (its gradient is ``g_p``, identical on every rank, so DeepSpeed's average keeps
it), and DeepSpeed's bucketing, clipping and step run unchanged; ``safe_get_full_grad`` then
reads ``g`` back. ZeRO-3 is refused (it partitions the parameters themselves, so
``autograd.grad`` has no full tensors to differentiate; the message says what a ZeRO-3 version
needs), and so is fp16 (the per-task backward runs outside DeepSpeed's loss scaler; bf16 and
fp32 need none). Under FSDP2 every forward and backward is a collective, so each task's backward
runs on every rank the same number of times (zero-weighted micro-batches where a rank holds
fewer, contributing zeros as a missing task does under DDP); FSDP2's reduce-scatter averages the
task's gradient over the ranks, each rank keeps its float32 shard, and PCGrad runs on the shards
(``ModularGradientSurgery`` sums the inner products over the ranks). Memory: every rank holds
each task's gradient WHOLE in float32 under DDP and ZeRO-1/2 (1/world of it under FSDP2), see
``ModularGradientSurgery``'s fit-start check.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from lightning import LightningModule
from torch import Tensor
from torch.distributed.tensor import DTensor

from lit_rlhf.strategies import is_deepspeed, start_micro_batch
from lit_rlhf.strategies.fsdp2 import is_fsdp2

MicroBatch = TypeVar("MicroBatch")


def check_task_backward_supported(strategy: Any, who: str) -> None:
    """A clear error, at setup, for a strategy the per-task backward does not support."""
    if not is_deepspeed(strategy):
        return
    if strategy.zero_stage_3:
        raise NotImplementedError(
            f"{who} needs one gradient per task, and under DeepSpeed ZeRO-3 there is none to "
            "take: the parameters are partitioned across ranks (outside the forward a rank "
            "holds 1/world of each tensor and param.data is an empty placeholder), so "
            "torch.autograd.grad has no full tensors to differentiate and the surrogate backward "
            "cannot be formed without gathering the whole model on every rank; DeepSpeed's "
            "safe_get_local_grad / safe_set_local_grad reach only partitions that an engine "
            "backward has already averaged over ranks, whatever task each rank held. Per-task "
            "engine backwards into the partitions with PCGrad on partitions (all-reduced inner "
            "products) would do it and are not implemented (docs/multidomain.md). Fix: use ZeRO "
            "stage 1 or 2 (configs/trainer/deepspeed_zero2.yaml) or strategy ddp."
        )
    if (strategy.config or {}).get("fp16", {}).get("enabled"):
        raise NotImplementedError(
            f"{who} takes the per-task gradients outside DeepSpeed's fp16 loss scaler, where "
            "small gradients underflow. Fix: train in bf16 (trainer precision bf16-mixed or "
            "bf16-true) or fp32."
        )


def task_backward(
    module: LightningModule,
    optimizer: Any,
    micro_batches: Sequence[MicroBatch],
    loss_fn: Callable[[MicroBatch], Tensor],
    task_of: Callable[[MicroBatch], str],
    hook: Any,
) -> dict[str, Tensor]:
    """Per-task backward, the hook's combination made the step's gradient (``param.grad``, or
    DeepSpeed's buffers); returns the hook's diagnostics under ``<hook class name>/<key>``."""
    trainer = module.trainer
    strategy = trainer.strategy
    check_task_backward_supported(strategy, type(hook).__name__)
    params = _trainable(module)
    by_task: dict[str, list[MicroBatch]] = {}
    for micro in micro_batches:
        by_task.setdefault(str(task_of(micro)), []).append(micro)
    grads_by_task: dict[str, dict[str, Tensor]] = {}
    if is_fsdp2(strategy):  # each rank's shards; FSDP2's reduce-scatter averaged them
        for task, most in _most_across_ranks({t: len(m) for t, m in by_task.items()}).items():
            grads_by_task[task] = _sharded_task_gradient(
                module, optimizer, by_task.get(task, []), most, micro_batches[0], loss_fn
            )
    else:  # each rank's whole gradient, averaged over the ranks here
        for task in _union_across_ranks(sorted(by_task)):
            if is_deepspeed(strategy):
                flat = _autograd_task_gradient(by_task.get(task, []), loss_fn, params)
            else:
                flat = _backward_task_gradient(module, optimizer, by_task.get(task, []), loss_fn)
            grads_by_task[task] = _views(_mean_across_ranks(flat), params)
    combined, stats = hook.combine_task_gradients(trainer, module, grads_by_task)
    if is_deepspeed(strategy):
        _deepspeed_backward_of(module, combined, params)
    elif is_fsdp2(strategy):  # the sharded parameters (a forward leaves the root unsharded)
        for name, param in _trainable(module).items():
            sharded: Any = param  # a DTensor parameter
            param.grad = DTensor.from_local(
                combined[name].detach().to(param.dtype), sharded.device_mesh,
                sharded.placements, shape=param.shape, stride=param.stride(),
            )  # fmt: skip
    else:
        for name, param in params.items():
            param.grad = combined[name].detach().to(param.dtype).reshape(param.shape).clone()
    name = type(hook).__name__
    return {f"{name}/{k}": torch.as_tensor(v).detach() for k, v in stats.items()}


def _backward_task_gradient(
    module: LightningModule,
    optimizer: Any,
    micro_batches: Sequence[MicroBatch],
    loss_fn: Callable[[MicroBatch], Tensor],
) -> Tensor:
    """One task's local gradient, flat float32, by the strategy's backward (DDP: unsynced)."""
    optimizer.zero_grad()
    block_sync = getattr(module.trainer.strategy, "block_backward_sync", None)
    with block_sync() if callable(block_sync) else nullcontext():
        for micro in micro_batches:
            module.manual_backward(loss_fn(micro))
    params = [p for p in module.parameters() if p.requires_grad]
    return torch.cat([_grad(p).reshape(-1).float() for p in params])


def _sharded_task_gradient(
    module: LightningModule,
    optimizer: Any,
    micro_batches: Sequence[MicroBatch],
    count: int,
    stand_in: MicroBatch,
    loss_fn: Callable[[MicroBatch], Tensor],
) -> dict[str, Tensor]:
    """One task's gradient under FSDP2: this rank's float32 shard of it, averaged over the
    ranks by FSDP2's reduce-scatter. Every forward and backward is a collective, so every rank
    runs ``count`` of them (the most any rank holds for the task): a rank with fewer adds
    zero-weighted backwards of ``stand_in``, which contribute zeros (as a missing task does
    under DDP)."""
    optimizer.zero_grad()
    for index in range(count):
        if index < len(micro_batches):
            module.manual_backward(loss_fn(micro_batches[index]))
        else:
            module.manual_backward(loss_fn(stand_in) * 0.0)
    shards: dict[str, Tensor] = {}
    for name, param in _trainable(module).items():  # resharded after the backward
        held: Any = param.grad if param.grad is not None else param
        local = held.to_local() if isinstance(held, DTensor) else held
        shards[name] = (local if param.grad is not None else torch.zeros_like(local)).float()
    return {name: shard.detach().clone() for name, shard in shards.items()}


def _trainable(module: LightningModule) -> dict[str, Tensor]:
    return {name: p for name, p in module.named_parameters() if p.requires_grad}


def _autograd_task_gradient(
    micro_batches: Sequence[MicroBatch],
    loss_fn: Callable[[MicroBatch], Tensor],
    params: Mapping[str, Tensor],
) -> Tensor:
    """One task's local gradient, flat float32, by ``torch.autograd.grad`` (DeepSpeed's gradient
    hooks and buffers are not touched)."""
    total = torch.zeros(sum(p.numel() for p in params.values()), dtype=torch.float32)
    total = total.to(next(iter(params.values())).device)
    inputs = list(params.values())
    for micro in micro_batches:
        grads = torch.autograd.grad(loss_fn(micro), inputs, allow_unused=True)
        total += torch.cat(
            [(g if g is not None else torch.zeros_like(p)).reshape(-1).float()
             for g, p in zip(grads, inputs, strict=True)]
        )  # fmt: skip
    return total


def _deepspeed_backward_of(
    module: LightningModule, combined: Mapping[str, Tensor], params: Mapping[str, Tensor]
) -> None:
    """One engine backward whose gradient is exactly ``combined`` (the same on every rank)."""
    start_micro_batch(module.trainer.strategy, last=True)
    surrogate = sum(
        (param * combined[name].detach().to(param.dtype).reshape(param.shape)).sum()
        for name, param in params.items()
    )
    module.manual_backward(torch.as_tensor(surrogate))


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


def _most_across_ranks(counts: dict[str, int]) -> dict[str, int]:
    """Per task (sorted; the union over ranks), the most micro-batches any rank holds."""
    if not _distributed():
        return dict(sorted(counts.items()))
    gathered: list[dict[str, int] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, counts)
    tasks = sorted({t for ranks in gathered for t in ranks or {}})
    return {t: max((ranks or {}).get(t, 0) for ranks in gathered) for t in tasks}


def _mean_across_ranks(flat: Tensor) -> Tensor:
    if _distributed():
        dist.all_reduce(flat)
        flat /= dist.get_world_size()
    return flat
