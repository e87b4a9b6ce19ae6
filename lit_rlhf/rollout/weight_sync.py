"""Weight sync from the training policy to a separate inference engine (vLLM): what is sent, in
which groups and buckets, what changed since the last push, and a deadline for the push.

:func:`weight_buckets` walks the weights an engine serves (:func:`served_parameters`: the
policy's names, a LoRA policy's adapters merged) in buckets of whole decoder blocks of about
``budget_bytes`` each. Per bucket it gathers once (under ZeRO-3 one ``gathered(*params)`` for all
of the bucket's parameters; under FSDP2 each sharded parameter's ``full_tensor()``: collectives
every rank enters in the same order), copies the tensors
out (cast to the engine's dtype), releases the gather and only then yields the bucket, so a rank
that sends never waits inside a gather its peers have already left.

What is sent: under full fine-tuning (:func:`is_full_update`: every parameter trained, no
adapter) every optimizer step moves every weight, so every block is sent and no copy is kept.
With LoRA or frozen parts only some blocks move; a :class:`WeightSnapshot` keeps an exact copy of
the weights last pushed and compares each tensor with ``torch.equal`` (cheaper signals miss real
updates: ``param._version`` does not move when DeepSpeed writes the updated partitions through
``.data`` (ZeRO-1/2 copy the fp32 master weights into the bf16 flat buffer that way, ZeRO-3
updates ``ds_tensor``) nor after ``load_state_dict`` on a resume; a checksum can round a one-ulp
update away). The copy costs one extra set of weights (on its ``device``) and one read per push.

Granularity: vLLM 0.32's in-place reload buffers a layer's tensors and, when a layer receives
only part of them (say ``q_proj`` but not ``k_proj``/``v_proj``, all fused into ``qkv_proj``), it
rebuilds the layer from uninitialised memory and copies all of it back, so the parts not sent
become garbage. Fused layers never span decoder blocks, so tensors are sent by block
(:func:`block_key`): a block is never split across buckets; tensors outside the blocks
(embeddings, final norm, head) are sent per module.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

import torch
from torch import Tensor, nn
from torch.distributed.tensor import DTensor

from lit_rlhf.models.lora import is_lora, served_parameters
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
                if self.refresh(name, param):
                    changed.append(name)
        return changed

    @torch.no_grad()
    def refresh(self, name: str, value: Tensor) -> bool:
        """Whether ``value`` (full-size: gathered by the caller) differs from the copy of
        ``name`` (True when there is none); the copy is brought up to date."""
        value = value.detach()
        if isinstance(value, DTensor):  # FSDP2: gathered in full (a collective)
            value = value.full_tensor()
        old = self.tensors.get(name)
        if old is None or old.shape != value.shape or old.dtype != value.dtype:
            self.tensors[name] = value.to(self.device or value.device, copy=True)
            return True
        if torch.equal(old, value.to(old.device)):
            return False
        old.copy_(value)
        return True

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


def is_full_update(model: nn.Module) -> bool:
    """Whether every served weight is trained: all parameters require grad and there is no
    (peft) adapter. Then an optimizer step moves every weight and a push sends all of them
    without a change test; LoRA and frozen parts give False (only some blocks move)."""
    return not is_lora(model) and all(p.requires_grad for p in model.parameters())


Block = list[tuple[str, Tensor]]


def weight_buckets(
    model: nn.Module,
    *,
    budget_bytes: int,
    dtype: torch.dtype | None = None,
    snapshot: WeightSnapshot | None = None,
    device: str | torch.device | None = "cpu",
    on_phase: Callable[[str], None] | None = None,
) -> Iterator[list[tuple[str, Tensor]]]:
    """The weights an engine serves (:func:`served_parameters`), as buckets of (name, tensor).

    Whole blocks (:func:`block_key`) are added to a bucket until the next would take it past
    ``budget_bytes`` (counted in ``dtype``); a block larger than the budget is a bucket of its
    own (``budget_bytes=0``: one block per bucket). Per bucket: one gather (ZeRO-3: a collective,
    so every rank must iterate to the end, in step), each tensor copied out (cast to ``dtype``,
    moved to ``device``; ``None``: stays on its parameter's device), the gather released, then
    the yield. A tensor may share memory with its parameter when no cast, move or gather was
    needed: consume a bucket before the next optimizer step.

    With ``snapshot``, only the blocks holding a tensor that differs from it are yielded (the
    snapshot refreshed; an empty one yields everything), packed into buckets across gathers;
    without it every block is yielded and nothing is compared or kept. ``on_phase`` is told what
    is being done (for timeout messages).
    """
    if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, int) or budget_bytes < 0:
        raise ValueError(
            f"budget_bytes must be an int >= 0, got {budget_bytes!r}. Fix: a bucket size in "
            "bytes (0: one block per bucket)."
        )
    phase = on_phase or (lambda _: None)
    target = None if device is None else torch.device(device)
    pending: list[Block] = []  # changed blocks copied out, not yet yielded (with a snapshot)
    count = 0
    for group in _groups(_blocks(served_parameters(model)), budget_bytes, dtype):
        tensors = [t for block in group for _, t in block]
        phase(f"gathering {len(tensors)} tensors from {group[0][0][0]!r} to {group[-1][-1][0]!r}")
        with torch.no_grad(), gathered(*tensors):
            full = [_full(block) for block in group]  # FSDP2: a collective, in the same order
            out = [_copy(b, dtype, target) for b in full if _changed(b, snapshot)]
        # the gather is released: only now may a bucket be sent
        if snapshot is None:
            count += 1
            yield _announce(out, count, phase)
            continue
        for block in out:
            if pending and _size([*pending, block], dtype) > budget_bytes:
                count += 1
                yield _announce(pending, count, phase)
                pending = []
            pending.append(block)
    if pending:
        yield _announce(pending, count + 1, phase)
    phase("idle")


def _announce(blocks: list[Block], index: int, phase: Callable[[str], None]) -> Block:
    bucket = [pair for block in blocks for pair in block]
    phase(f"sending bucket {index} ({len(bucket)} tensors, {_size(blocks, None) / 2**20:.1f} MiB)")
    return bucket


def _blocks(named: Iterable[tuple[str, Tensor]]) -> Iterator[Block]:
    """Consecutive tensors with one :func:`block_key`; refuses a block whose tensors are not
    consecutive (it would be split across buckets)."""
    seen: set[str] = set()
    block: Block = []
    for name, tensor in named:
        key = block_key(name)
        if block and key != block_key(block[0][0]):
            yield block
            block = []
        if not block:
            if key in seen:
                raise ValueError(
                    f"the tensors of {key!r} are not consecutive in the model's parameters, so "
                    "a bucketed push would split that block. Fix: register the block's "
                    "parameters together, or push unbucketed (VLLMGenerationEngine "
                    "push_bucket_bytes: 0)."
                )
            seen.add(key)
        block.append((name, tensor))
    if block:
        yield block


def _groups(
    blocks: Iterable[Block], budget: int, dtype: torch.dtype | None
) -> Iterator[list[Block]]:
    """Consecutive blocks of at most ``budget`` bytes together (a larger block alone)."""
    group: list[Block] = []
    size = 0
    for block in blocks:
        nbytes = _size([block], dtype)
        if group and size + nbytes > budget:
            yield group
            group, size = [], 0
        group.append(block)
        size += nbytes
    if group:
        yield group


def _size(blocks: list[Block], dtype: torch.dtype | None) -> int:
    """Full-size bytes of the blocks' tensors in ``dtype`` (their own when None); a ZeRO-3
    partition counts as its whole parameter (``ds_numel``)."""
    return sum(
        int(getattr(t, "ds_numel", t.numel())) * (dtype or t.dtype).itemsize
        for block in blocks
        for _, t in block
    )


def _changed(block: Block, snapshot: WeightSnapshot | None) -> bool:
    """Whether a tensor of ``block`` differs from ``snapshot`` (every one is compared, so the
    snapshot is refreshed); True without a snapshot."""
    if snapshot is None:
        return True
    return any([snapshot.refresh(name, tensor) for name, tensor in block])


def _full(block: Block) -> Block:
    """The block with FSDP2's sharded parameters (DTensors) gathered in full on every rank."""
    return [(n, t.full_tensor() if isinstance(t, DTensor) else t) for n, t in block]


def _copy(block: Block, dtype: torch.dtype | None, device: torch.device | None) -> Block:
    """The block's tensors cast to ``dtype`` on ``device``: a copy when the tensor is a gathered
    ZeRO-3 partition (released after this), else only if the cast or the move needs one."""
    return [
        (name, t.detach().to(device or t.device, dtype or t.dtype, copy=hasattr(t, "ds_id")))
        for name, t in block
    ]
