"""Read and rewrite a module's gradients between backward and clipping, whatever the strategy.

Under plain training and DDP the (already rank-averaged) gradient is ``param.grad``. Under
DeepSpeed ZeRO-1/2/3 ``param.grad`` is None after backward: the gradients live in DeepSpeed's
partitioned buffers, reached through its documented accessors ``deepspeed.utils.
safe_get_full_grad`` / ``safe_set_full_grad``, which return and accept the full, rank-reduced
gradient. Under ZeRO-3 they gather across ranks, so every rank must make the same calls in the
same order (the gradient-hook protocol calls hooks on every rank at the same point). Under FSDP2
``param.grad`` is a DTensor shard of the averaged gradient: ``get`` gathers it in full
(``full_tensor``, the same lock-step rule) and ``set`` keeps this rank's shard of the new one.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor, nn
from torch.distributed.tensor import DTensor, distribute_tensor

from lit_rlhf.strategies import is_deepspeed


class Gradients:
    """The trainable parameters of ``module`` and their current gradients, by name.

    Args:
        module: the network whose gradients are read (usually the LightningModule).
        strategy: the trainer's strategy (DeepSpeed is detected from it); None = plain.
    """

    def __init__(self, module: nn.Module, strategy: Any = None) -> None:
        self.parameters: dict[str, nn.Parameter] = {
            name: p for name, p in module.named_parameters() if p.requires_grad
        }
        self.deepspeed = is_deepspeed(strategy)

    def names(self) -> list[str]:
        return list(self.parameters)

    def get(self, name: str) -> Tensor | None:
        """The full gradient of parameter ``name`` (None when it received none)."""
        param = self.parameters[name]
        if not self.deepspeed:
            grad = param.grad
            return grad.full_tensor() if isinstance(grad, DTensor) else grad
        from deepspeed.utils import safe_get_full_grad

        return safe_get_full_grad(param)

    def set(self, name: str, grad: Tensor) -> None:
        """Replace the gradient of parameter ``name`` by ``grad`` (same shape)."""
        param = self.parameters[name]
        if grad.shape != param.shape:
            raise ValueError(
                f"gradient for {name} has shape {tuple(grad.shape)}, the parameter "
                f"{tuple(param.shape)}"
            )
        if not self.deepspeed:
            if isinstance(param, DTensor):  # every rank holds the same full gradient
                shard = distribute_tensor(
                    grad.detach().to(param.dtype), param.device_mesh, param.placements,
                    src_data_rank=None,
                )  # fmt: skip
                if param.grad is None:
                    param.grad = shard
                else:
                    param.grad.copy_(shard)
            elif param.grad is None:
                param.grad = grad.detach().to(param.dtype).clone()
            else:
                param.grad.copy_(grad)
            return
        from deepspeed.utils import safe_set_full_grad

        current = self.get(name)
        dtype = current.dtype if current is not None else torch.float32
        safe_set_full_grad(param, grad.detach().to(dtype))

    def items(self) -> Iterator[tuple[str, Tensor]]:
        """(name, gradient) for every parameter that has one."""
        for name in self.parameters:
            grad = self.get(name)
            if grad is not None:
                yield name, grad
