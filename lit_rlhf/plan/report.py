"""The plan of a composed config: the per-GPU items with their phase, the peak of each phase,
the lower bound, the batch figures, the update step's FLOPs and a verdict; as a table or JSON.

The **estimate** of a phase is every item it holds, with only the largest of its transient
steps (the update's micro-batch, a no-grad forward, the HF engine's KV cache). The **lower
bound** is what the settings fix (model states, frozen networks, the snapshot, the engine's
reservation, the surgery's buffers) plus what one micro-batch at the configured maximum lengths
must hold whatever the kernels (one 16-bit layer input per layer and token, its 16-bit logits):
a run whose lower bound exceeds the GPU fails, at the latest when a batch reaches those
lengths; a run whose estimate does is likely to.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from lit_rlhf.plan import inputs as cfg
from lit_rlhf.plan.build import Context, gib
from lit_rlhf.plan.families import family
from lit_rlhf.plan.memory import GiB, Item, phase_bytes

DEFAULT_GPU_MEMORY = 80 * GiB
_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}  # fmt: skip


def parse_memory(text: str | int) -> int:
    """Bytes of ``80GiB``, ``141GB``, ``80 GiB``, ``85899345920`` (GB = 10^9, GiB = 2^30)."""
    if isinstance(text, int):
        return text
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _UNITS:
        raise ValueError(
            f"GPU memory {text!r} is not a size. Fix: write it as 80GiB, 141GB, 80000MB or a "
            "number of bytes (GB = 10^9 bytes, GiB = 2^30)."
        )
    return int(float(match.group(1)) * _UNITS[unit])


@dataclass(frozen=True)
class Plan:
    module: str
    world: int
    world_source: str
    strategy: str
    precision: str
    gpu_memory: int
    items: list[Item]
    batch: cfg.BatchFigures
    seq_len: int
    micro_batch: str
    step_flops: float | None
    floor: int
    notes: list[str] = field(default_factory=list)

    @property
    def peaks(self) -> dict[str, int]:
        return {phase: phase_bytes(self.items, phase) for phase in ("rollout", "update")}

    @property
    def peak(self) -> int:
        return max(self.peaks.values())

    @property
    def lower_bounds(self) -> dict[str, int]:
        fixed = {p: phase_bytes(self.items, p, fixed_only=True) for p in ("rollout", "update")}
        # the micro-batch's floor is a step of the update like the fixed transients (the
        # gradient surgery's combination, after the last backward): the larger one counts
        resident = [i for i in self.items if not i.transient]
        floor = phase_bytes(resident, "update", fixed_only=True) + self.floor
        fixed["update"] = max(fixed["update"], floor)
        return fixed

    @property
    def lower_bound(self) -> int:
        return max(self.lower_bounds.values())

    @property
    def fits(self) -> bool:
        return self.peak <= self.gpu_memory

    @property
    def refused(self) -> bool:
        return self.lower_bound > self.gpu_memory

    @property
    def verdict(self) -> str:
        if self.refused:
            return "does not fit: even the lower bound exceeds the GPU"
        return "fits" if self.fits else "does not fit by the estimate (the lower bound fits)"

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(peaks=self.peaks, peak=self.peak, lower_bounds=self.lower_bounds,
                   lower_bound=self.lower_bound, fits=self.fits, refused=self.refused,
                   verdict=self.verdict, global_sequences=self.batch.global_sequences)  # fmt: skip
        return out


def plan_from_config(
    config: Mapping[str, Any],
    *,
    gpus: int | None = None,
    gpu_memory: int | None = None,
    arch_map: Mapping[str, str] | None = None,
    tasks: int | None = None,
    allow_hub: bool = False,
) -> Plan:
    """The plan of a composed config (keys ``trainer``, ``model``, ``data``) on ``gpus``
    processes (default: the trainer's devices x num_nodes) with ``gpu_memory`` bytes each
    (default 80 GiB); ``arch_map``: {path: hub id} for local folders without a config.json;
    ``tasks``: the domains of a gradient-surgery run where the config cannot say;
    ``allow_hub``: read architectures the table lacks through transformers (a run's setup)."""
    world, source = cfg.world_size(config, gpus)
    ctx = Context(config, world, gpu_memory or DEFAULT_GPU_MEMORY, dict(arch_map or {}),
                  cfg.strategy(config), tasks=tasks, allow_hub=allow_hub)  # fmt: skip
    name = cfg.class_name(config.get("model") or {})
    batch, shapes, flops = family(name)(ctx)
    return Plan(name, world, source, ctx.strategy.label, cfg.precision_name(config),
                ctx.gpu_memory, ctx.items, batch, shapes.seq_len,
                f"{shapes.micro_sequences} sequences ({shapes.note})", flops, ctx.floor,
                ctx.notes)  # fmt: skip


def _count(value: int | None) -> str:
    return "unknown" if value is None else f"{value:,}"


def batch_lines(plan: Plan) -> list[str]:
    b = plan.batch
    unit = b.unit
    lines = [f"global batch: {b.global_batch:,} {unit} ({b.per_rank:,} per process x {b.world})"]
    if b.samples_per_prompt > 1:
        lines.append(f"sequences per rollout: {b.global_sequences:,} ({b.samples_per_prompt} "
                     f"samples per prompt)")  # fmt: skip
    lines += [
        f"mini-batch: {b.mini_batch_per_rank:,} sequences per process "
        f"({b.mini_batch_per_rank * b.world:,} across processes)",
        f"optimizer steps per {'rollout' if b.samples_per_prompt > 1 else 'batch'}: "
        f"{b.steps_per_batch}",
        f"batches per epoch: {_count(b.batches_per_epoch)}; epochs: {_count(b.epochs)}; total "
        f"optimizer steps: {_count(b.total_steps)}" + (f" ({b.note})" if b.note else ""),
        f"micro-batch: {plan.micro_batch}; longest sequence {plan.seq_len:,} tokens",
    ]
    return lines


def format_plan(plan: Plan) -> str:
    """The per-GPU table, the batch figures, the FLOPs and the verdict, as text."""
    width = max(len(i.name) for i in plan.items) + 2
    head = (f"lit-rlhf plan: {plan.module} on {plan.world} GPU(s) ({plan.world_source}) of "
            f"{gib(plan.gpu_memory)}, {plan.strategy}, precision {plan.precision}")  # fmt: skip
    rows = [head, "", f"{'per GPU':<{width}}{'GiB':>8}  phase    note"]
    for item in plan.items:
        mark = " (one step at a time)" if item.transient else ""
        rows.append(f"{item.name:<{width}}{item.bytes / GiB:>8.2f}  {item.phase:<8} "
                    f"{item.note}{mark}")  # fmt: skip
    peaks, bounds = plan.peaks, plan.lower_bounds
    rows += ["", *(f"peak, {p} phase: {gib(peaks[p])} (lower bound {gib(bounds[p])})"
                   for p in ("rollout", "update"))]  # fmt: skip
    rows += ["", *batch_lines(plan)]
    if plan.step_flops is not None:
        rows.append(f"update step FLOPs per process: {plan.step_flops:.3g}")
    rows += [*(f"note: {n}" for n in plan.notes), "",
             f"verdict: {plan.verdict} (estimate {gib(plan.peak)}, lower bound "
             f"{gib(plan.lower_bound)}, GPU {gib(plan.gpu_memory)})"]  # fmt: skip
    return "\n".join(rows)


def plan_json(plan: Plan) -> str:
    return json.dumps(plan.as_dict(), indent=2, default=str)
