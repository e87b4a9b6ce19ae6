"""What one GPU holds, item by item, and in which phase: ``rollout`` (generation, with the
engine awake), ``update`` (log-probs, scores and optimizer steps) or ``both``.

Model states (trained weights, gradients, float32 masters and Adam moments) follow the
strategy: without DeepSpeed every process holds all of them; under DeepSpeed ZeRO the totals are
DeepSpeed's own estimators (``estimate_zero2_model_states_mem_needs``,
``estimate_zero3_model_states_mem_needs``) where deepspeed imports, else the same formulas
(:func:`zero_gpu_bytes`; a test holds the two equal). Frozen networks, the weight-sync snapshot,
the engine's reservation and the gradient-surgery buffers are sized from their settings; the
activations of one micro-batch are an estimate (:mod:`lit_rlhf.plan.activations`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

Phase = Literal["rollout", "update", "both"]
Kind = Literal["state", "frozen", "snapshot", "engine", "buffer", "activations"]
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
ADAM_BYTES = 8  # two float32 moments per trainable parameter
GiB = 1024**3


@dataclass(frozen=True)
class Item:
    """One resident allocation of a GPU (``transient``: the peak of a step that runs alone
    in its phase: of the transients of a phase only the largest counts)."""

    name: str
    bytes: int
    phase: Phase
    kind: Kind
    note: str = ""
    transient: bool = False

    @property
    def fixed(self) -> bool:
        """Set by the settings alone (everything but the activation estimates)."""
        return self.kind != "activations"


@dataclass(frozen=True)
class Strategy:
    """How the trained networks are spread over the ``world`` processes."""

    kind: Literal["single", "ddp", "deepspeed", "fsdp"] = "single"
    stage: int = 0  # DeepSpeed ZeRO stage (0: none)
    offload_optimizer: bool = False
    offload_parameters: bool = False
    half: bool = True  # DeepSpeed's bf16 / fp16 optimizer (16-bit weights, float32 masters)
    # DeepSpeed's gradient buckets (elements; Lightning's default), preallocated with
    # contiguous_gradients; ZeRO-1/2 double them with overlap_comm (0: none)
    reduce_bucket: int = 200_000_000
    overlap_comm: bool = True
    # ZeRO-3: a gathered parameter is kept when its next use lies within this many parameters
    # of the step's trace (stage3_max_reuse_distance)
    max_reuse: int = 1_000_000_000

    def gathered(self, params: int, largest_layer: int) -> int:
        """ZeRO-3's gathered parameters per GPU at the end of forward, from the second step on
        (the first records the trace): a parameter reused in backward within ``max_reuse``
        parameters stays gathered. The backward walks the layers in reverse, so those are the
        last ``max_reuse / 2`` of forward: a model under that stays gathered whole. At least the
        largest layer."""
        return max(largest_layer, min(params, self.max_reuse // 2))

    @property
    def label(self) -> str:
        if self.kind != "deepspeed":
            return self.kind
        offload = " + optimizer offload" if self.offload_optimizer else ""
        offload += " + parameter offload" if self.offload_parameters else ""
        return f"DeepSpeed ZeRO-{self.stage}{offload}"


def zero_gpu_bytes(
    params: int, largest_layer: int, world: int, stage: int, *, offload_optimizer: bool,
    offload_parameters: bool,
) -> int:  # fmt: skip
    """Model states per GPU under ZeRO with 16-bit weights (DeepSpeed's estimators' formulas:
    2 bytes of 16-bit weights, then 18 per parameter, split over the GPUs: 16-bit and float32
    gradients, float32 master weights, Adam's two moments; ZeRO-3 adds four bytes per parameter
    of the largest layer, gathered whole). Stage 1 keeps the 16-bit gradients whole."""
    if stage == 3:
        largest = 4 * largest_layer
        if offload_optimizer:
            return largest if offload_parameters else largest + int(2 * params / world)
        return largest + int(18 * params / world)
    if offload_optimizer:
        return 2 * params
    if stage == 1:
        return 4 * params + int(16 * params / world)
    return 2 * params + int(18 * params / world)


def deepspeed_gpu_bytes(params: int, largest_layer: int, world: int, strategy: Strategy) -> int:
    """DeepSpeed's own estimate of the model states per GPU (stages 2 and 3, one node), or
    :func:`zero_gpu_bytes` where deepspeed does not import (or for stage 1, which DeepSpeed's
    estimators do not cover)."""
    formula = zero_gpu_bytes(
        params, largest_layer, world, strategy.stage,
        offload_optimizer=strategy.offload_optimizer,
        offload_parameters=strategy.offload_parameters,
    )  # fmt: skip
    if strategy.stage not in (2, 3):
        return formula
    try:
        if strategy.stage == 2:
            from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

            _, gpu = estimate_zero2_model_states_mem_needs(
                params, num_gpus_per_node=world, cpu_offload=strategy.offload_optimizer
            )
            return int(gpu)
        from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs

        _, gpu, _ = estimate_zero3_model_states_mem_needs(
            params, largest_layer, num_gpus_per_node=world,
            cpu_offload=strategy.offload_optimizer,
            cpu_offload_params=strategy.offload_parameters,
        )  # fmt: skip
        return int(gpu)
    except ImportError:
        return formula


def model_state_items(
    role: str, params: int, largest_layer: int, *, dtype: str, strategy: Strategy, world: int
) -> list[Item]:
    """Weights, gradients and optimizer states of one trained network of ``params`` trainable
    parameters held in ``dtype`` (its ``precision.dtype``), per GPU."""
    p = params
    if strategy.kind == "deepspeed" and strategy.half:
        total = deepspeed_gpu_bytes(p, largest_layer, world, strategy)
        where = strategy.label
        sharded_w = strategy.stage == 3 or strategy.offload_parameters
        weights = min(total, int(2 * p / world) if sharded_w else 2 * p)
        live = 0
        if strategy.stage == 3:
            weights = min(total, 4 * largest_layer + weights)
            # DeepSpeed's estimate gathers the largest layer; those kept for reuse beside it
            live = 2 * (strategy.gathered(p, largest_layer) - largest_layer)
        rest = total - weights
        state_note = "float32 masters and Adam moments" + (
            " on the CPU" if strategy.offload_optimizer else f" ({where} partition)"
        )
        return [
            Item(f"{role}: weights (bf16)", weights + live, "both", "state",
                 "16-bit weights" + (" partition + those gathered (largest layer, reuse)"
                                     if strategy.stage == 3 else "")),
            Item(f"{role}: gradients, float32 masters, Adam", rest, "both", "state",
                 state_note + "; 16-bit and float32 gradients"),
        ]  # fmt: skip
    if strategy.kind == "deepspeed" and not strategy.offload_optimizer:
        return deepspeed_fp32_items(role, p, largest_layer, strategy, world)
    size = DTYPE_BYTES[dtype]
    share = world if strategy.kind == "fsdp" else 1  # FSDP / FSDP2: states / data-parallel size
    gathered = size * largest_layer if share > 1 else 0  # one unit all-gathered at a time
    return [
        Item(f"{role}: weights ({dtype})", size * p // share + gathered, "both", "state",
             "FSDP shard + the largest layer gathered" if share > 1
             else "every process holds them"),
        Item(f"{role}: gradients ({dtype})", size * p // share, "both", "state"),
        Item(f"{role}: Adam moments (float32)", ADAM_BYTES * p // share, "both", "state"),
    ]  # fmt: skip


def deepspeed_fp32_items(
    role: str, p: int, largest_layer: int, strategy: Strategy, world: int
) -> list[Item]:
    """DeepSpeed training in float32 (DeepSpeed's estimators assume 16-bit weights): the
    weights whole (ZeRO-3: their partition and :meth:`Strategy.gathered`), and over the
    ranks a float32 copy of the partition (DeepSpeed clones it even from float32 weights), Adam's
    moments and the gradient partition (ZeRO-1: the gradients whole)."""
    gathered = 4 * strategy.gathered(p, largest_layer)
    weights = 4 * p // world + gathered if strategy.stage == 3 else 4 * p
    grads = 4 * p if strategy.stage == 1 else 4 * p // world
    return [
        Item(f"{role}: weights (float32)", weights, "both", "state", strategy.label),
        Item(f"{role}: float32 copy, Adam, gradients", (4 + ADAM_BYTES) * p // world + grads,
             "both", "state", f"{strategy.label} partition"),
    ]  # fmt: skip


def deepspeed_bucket_items(strategy: Strategy, dtype_bytes: int, params: int) -> list[Item]:
    """The gradient buckets DeepSpeed allocates whole whatever the model's size (outside its
    estimators): ZeRO-1/2 one of ``reduce_bucket_size`` elements in the weights' dtype, two
    with ``overlap_comm`` (``stage_1_and_2.setup_buckets``); ZeRO-3 one (``stage3``'s ipg
    buffer), and in backward the reduce-scatter's staging of a full bucket (a buffer and its
    rearranged copy, ``stage3``'s contiguous reduce-scatter)."""
    if strategy.kind != "deepspeed" or strategy.reduce_bucket <= 0:
        return []
    count = 2 if strategy.overlap_comm and strategy.stage < 3 else 1
    name = f"DeepSpeed reduce buckets ({count} x {strategy.reduce_bucket:.0e} elements)"
    note = "zero_optimization.reduce_bucket_size; overlap_comm doubles it (ZeRO-1/2)"
    size = count * strategy.reduce_bucket * dtype_bytes
    items = [Item(name, size, "both", "state", note)]
    if strategy.stage == 3:
        staging = 2 * min(params, strategy.reduce_bucket) * dtype_bytes
        items.append(Item("DeepSpeed ZeRO-3 reduce-scatter staging", staging, "update", "state",
                          "two copies of a full bucket's gradients in backward"))  # fmt: skip
    return items


def phase_bytes(items: Iterable[Item], phase: Phase, *, fixed_only: bool = False) -> int:
    """What a phase holds: every item of the phase (or of both), with only the largest of its
    transients; ``fixed_only``: the items the settings fix, no activation estimate."""
    chosen = [i for i in items if i.phase in (phase, "both") and (i.fixed or not fixed_only)]
    resident = sum(i.bytes for i in chosen if not i.transient)
    transients = [i.bytes for i in chosen if i.transient]
    return resident + max(transients, default=0)


def peaks(items: list[Item]) -> dict[str, int]:
    """{phase: bytes} for ``rollout`` and ``update``."""
    return {phase: phase_bytes(items, phase) for phase in ("rollout", "update")}
