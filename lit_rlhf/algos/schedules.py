"""A value as a function of a step count: linear warmup, then constant, linear or cosine decay.

One shape for every schedule in lit-rlhf: loss coefficients (TRE's alpha, the exploration
callbacks) and the optimizer's learning rate (``lit_rlhf.training.lr_schedule`` evaluates it as a
factor of each param group's lr). The warmup and cosine match the ones verl's actors use
(``get_constant_schedule_with_warmup`` / ``get_cosine_schedule_with_warmup`` with
``min_lr_ratio``): at step 0 of a warmup the value is 0.
"""

from __future__ import annotations

import math
from typing import Literal

ScheduleKind = Literal["constant", "linear", "cosine"]


class CoefficientSchedule:
    """A loss coefficient (or an lr factor) as a function of the step.

    Linear warmup from 0 to ``value`` over ``warmup_steps``, then ``constant`` (``value``),
    ``linear`` or ``cosine`` from ``value`` to ``final_value`` by ``total_steps`` (counted from
    step 0, warmup included), held at ``final_value`` afterwards. Stateless: the value is a
    function of the step, so resuming from the trainer's global step needs no checkpointed state.
    """

    def __init__(
        self,
        value: float,
        *,
        kind: ScheduleKind = "constant",
        final_value: float | None = None,
        warmup_steps: int = 0,
        total_steps: int | None = None,
    ) -> None:
        if kind not in ("constant", "linear", "cosine"):
            raise ValueError(f"kind must be 'constant', 'linear' or 'cosine', got {kind!r}")
        if warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
        if kind == "constant" and final_value is not None:
            raise ValueError("final_value is only used by kind='linear' or 'cosine'")
        if kind != "constant" and (final_value is None or total_steps is None):
            raise ValueError(f"kind={kind!r} needs both final_value and total_steps")
        if kind != "constant" and total_steps is not None and total_steps <= warmup_steps:
            raise ValueError(
                f"total_steps ({total_steps}) must exceed warmup_steps ({warmup_steps})"
            )
        self.value = float(value)
        self.kind: ScheduleKind = kind
        self.final_value = self.value if final_value is None else float(final_value)
        self.warmup_steps = int(warmup_steps)
        self.total_steps = total_steps

    def __call__(self, step: int) -> float:
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        if step < self.warmup_steps:
            return self.value * step / self.warmup_steps
        if self.kind == "constant" or self.total_steps is None:
            return self.value
        progress = min((step - self.warmup_steps) / (self.total_steps - self.warmup_steps), 1.0)
        if self.kind == "linear":
            return self.value + (self.final_value - self.value) * progress
        cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
        return self.final_value + (self.value - self.final_value) * cosine
