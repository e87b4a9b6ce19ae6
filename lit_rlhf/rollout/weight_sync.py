"""Weight sync from the training policy to a separate inference engine (vLLM): what changed since
the last push, in which groups it must be sent, and a deadline for the push.

Change detection keeps an exact copy of the weights last pushed and compares each tensor with
``torch.equal``. Cheaper signals were rejected because they miss real updates:
``param._version`` does not move when DeepSpeed writes the updated partitions through ``.data``
(ZeRO-1/2 copy the fp32 master weights into the bf16 flat buffer that way, ZeRO-3 updates
``ds_tensor``) nor after ``load_state_dict`` on a resume; a checksum can round a one-ulp update
away. The copy costs one extra set of weights (on ``device``, default: each parameter's own) and
one read per step; under ZeRO-3 each parameter is gathered, compared and released one at a time.

Granularity: vLLM 0.32's in-place reload buffers a layer's tensors and, when a layer receives
only part of them (say ``q_proj`` but not ``k_proj``/``v_proj``, all fused into ``qkv_proj``), it
rebuilds the layer from uninitialised memory and copies all of it back, so the parts not sent
become garbage. Fused layers never span decoder blocks, so tensors are sent by block: when any
tensor of ``model.layers.3`` changed, the whole block is sent; tensors outside the blocks
(embeddings, final norm, head) are sent per module.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

import torch
from torch import Tensor

from lit_rlhf.models.partitioned import gathered

T = TypeVar("T")


def block_key(name: str) -> str:
    """The unit a tensor is sent with: its decoder block (the path up to the first numeric
    component, e.g. ``model.layers.3``), else its module (``model.embed_tokens``)."""
    parts = name.split(".")
    for i, part in enumerate(parts[:-1]):
        if part.isdigit():
            return ".".join(parts[: i + 1])
    return ".".join(parts[:-1])


class WeightSnapshot:
    """The weights last pushed to an engine, by parameter name.

    Args:
        device: where the copy lives; ``None`` keeps each tensor on its parameter's device.
    """

    def __init__(self, device: str | torch.device | None = None) -> None:
        self.device = None if device is None else torch.device(device)
        self.tensors: dict[str, Tensor] = {}

    @torch.no_grad()
    def update(self, named_parameters: Iterable[tuple[str, Tensor]]) -> list[str]:
        """Compare each parameter with the copy, refresh the copy, and return the names that
        changed (all of them on the first call)."""
        changed = []
        for name, param in named_parameters:
            with gathered(param):
                value = param.detach()
                old = self.tensors.get(name)
                if old is None or old.shape != value.shape or old.dtype != value.dtype:
                    self.tensors[name] = value.to(self.device or value.device, copy=True)
                    changed.append(name)
                elif not torch.equal(old, value.to(old.device)):
                    old.copy_(value)
                    changed.append(name)
        return changed

    def blocks_to_send(self, changed: Iterable[str]) -> Iterator[tuple[str, Tensor]]:
        """(name, tensor) for every tensor in a block that holds a changed tensor, in the
        parameters' order (vLLM finishes a layer as soon as its last tensor arrives)."""
        dirty = {block_key(name) for name in changed}
        return ((n, t) for n, t in self.tensors.items() if block_key(n) in dirty)


def run_with_deadline(fn: Callable[[], T], timeout_s: float, where: Callable[[], str]) -> T:
    """Run ``fn`` in a daemon thread and wait at most ``timeout_s`` seconds.

    On timeout raises ``TimeoutError`` naming ``where()`` (what the thread was doing); the thread
    is abandoned, so the caller must treat the engine as unusable afterwards.
    """
    result: dict[str, Any] = {}

    def target() -> None:
        try:
            result["value"] = fn()
        except BaseException as err:  # re-raised in the caller's thread
            result["error"] = err

    thread = threading.Thread(target=target, name="weight-sync", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise TimeoutError(f"did not finish within {timeout_s:g} s; stuck while {where()}")
    if "error" in result:
        raise result["error"]
    return result["value"]
