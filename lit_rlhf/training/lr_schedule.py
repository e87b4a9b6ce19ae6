"""Learning-rate schedules for the manual-optimisation modules: warmup, then constant, linear or
cosine decay, stepped by the core (:class:`~lit_rlhf.training.OptimizerStep`) and checkpointed.

The shape is :class:`~lit_rlhf.algos.CoefficientSchedule` evaluated as a factor: before every
optimizer step each param group's lr is set to its base lr (the group's lr at the first step,
kept as ``group["initial_lr"]`` and in the checkpoint) times the factor at the count. The count
is, with ``lr_interval: batch``, the training batches completed so far (one rollout batch, however
many mini-batch optimizer steps it takes: verl steps its actor's scheduler once per
``update_actor``), or with ``optimizer_step`` the optimizer steps taken so far (a step skipped as
non-finite counts, as a scheduler stepped after it would). As in verl and transformers, a warmup
starts at lr 0, so the first step of a warmup changes nothing.

No torch scheduler is involved: Lightning never steps one under manual optimisation, and under
DeepSpeed a scheduler handed to the engine is stepped on every ``engine.step()``. Writing the lr
into ``param_groups`` works for a plain optimizer, Lightning's wrapper and DeepSpeed's ZeRO
optimizers alike (their ``param_groups`` are the base optimizer's).

Settings (the ``optim`` group, :class:`~lit_rlhf.settings.OptimSettings`, validated when the
module is built): ``lr_warmup_steps`` or ``lr_warmup_ratio`` (verl's ``lr_warmup_steps_ratio``:
the warmup is ``int(ratio * total)`` steps), ``lr_schedule``, ``min_lr_ratio`` (the final lr as a
fraction of lr), ``lr_interval`` and ``lr_total_steps`` (default: derived from the trainer,
:func:`scheduled_total`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from lightning.pytorch.utilities import rank_zero_warn

from lit_rlhf.algos.schedules import CoefficientSchedule
from lit_rlhf.settings import LRInterval, OptimSettings

LR_KEY = "train/lr"  # the first param group's lr, logged every step


def scheduled_total(
    interval: LRInterval,
    *,
    max_epochs: int | None,
    batches_per_epoch: float,
    max_steps: int | None,
    steps_per_batch: int,
) -> int | None:
    """The number of scheduled steps of a fit, in ``interval`` units (None: the run has no end).

    Training batches: ``max_epochs x batches_per_epoch`` (Lightning's ``num_training_batches``,
    ``limit_train_batches`` applied), or fewer when ``max_steps`` ends the run sooner; max_steps
    counts optimizer steps, so a run of ``steps_per_batch`` optimizer steps per batch (PPO:
    ppo_epochs x mini-batches per rollout) stops after ``ceil(max_steps / steps_per_batch)``
    batches. Optimizer steps: that number of batches x ``steps_per_batch``.
    """
    limits = []
    if max_epochs is not None and max_epochs >= 0 and math.isfinite(batches_per_epoch):
        limits.append(max_epochs * int(batches_per_epoch))
    if max_steps is not None and max_steps >= 0:
        limits.append(math.ceil(max_steps / steps_per_batch))
    if not limits:
        return None
    batches = min(limits)
    return batches if interval == "batch" else batches * steps_per_batch


class LRSchedule:
    """Sets each param group's lr before every optimizer step; the counters and base lrs are
    checkpointed (``state_dict``), the total is derived again from the trainer on every start.

    Args:
        settings: the schedule (default: constant, no warmup: the lr is each group's own).
        idle_batches: training batches of the run that take no optimizer step (one-step-off
            training's first ``max_staleness`` batches only generate); a total derived from the
            trainer leaves them out, so the schedule ends on the run's last update.
    """

    def __init__(self, settings: OptimSettings | None = None, idle_batches: int = 0) -> None:
        if idle_batches < 0:
            raise ValueError(f"idle_batches must be >= 0, got {idle_batches}")
        self.optim = settings or OptimSettings()
        self.interval = self.optim.lr_interval
        self.idle_batches = idle_batches
        self.batches = 0  # training batches completed
        self.steps = 0  # optimizer steps taken
        self.base_lrs: list[float] | None = None
        self.total: int | None = None
        self._factor: CoefficientSchedule | None = None
        self._saved_total: int | None = None

    def apply(self, trainer: Any, optimizer: Any, step_in_batch: tuple[int, int] = (0, 1)) -> float:
        """Set the lr of the optimizer step about to be taken and count it; returns the first
        group's lr. ``step_in_batch``: (this step's index, optimizer steps of the batch)."""
        index, steps_per_batch = step_in_batch
        if self._factor is None:
            self._resolve(trainer, steps_per_batch)
        assert self._factor is not None
        count = self.batches if self.interval == "batch" else self.steps
        factor = self._factor(count)
        groups = optimizer.param_groups
        if self.base_lrs is None:
            self.base_lrs = [float(g.get("initial_lr", g["lr"])) for g in groups]
        if len(self.base_lrs) != len(groups):
            raise ValueError(
                f"the checkpoint's lr schedule has {len(self.base_lrs)} param groups and the "
                f"optimizer {len(groups)}. Fix: resume with the settings that wrote it."
            )
        for group, base in zip(groups, self.base_lrs, strict=True):
            group["initial_lr"] = base
            group["lr"] = base * factor
        self.steps += 1
        if index == steps_per_batch - 1:
            self.batches += 1
        return float(groups[0]["lr"])

    def _resolve(self, trainer: Any, steps_per_batch: int) -> None:
        optim, total = self.optim, self.optim.lr_total_steps
        if total is None and trainer is not None:
            total = scheduled_total(
                self.interval,
                max_epochs=trainer.max_epochs,
                batches_per_epoch=trainer.num_training_batches,
                max_steps=trainer.max_steps,
                steps_per_batch=steps_per_batch,
            )
            if total is not None:
                per_batch = 1 if self.interval == "batch" else steps_per_batch
                total = max(1, total - self.idle_batches * per_batch)
                optim.check_total(total, derived=True)
        if total is None and optim.needs_total:
            raise ValueError(
                "optim.lr_schedule (linear / cosine) and optim.lr_warmup_ratio need the number "
                "of scheduled steps, and the trainer "
                "sets no end (max_epochs and max_steps -1, or a loader without a length). Fix: "
                "set model.init_args.optim.lr_total_steps, or trainer.max_steps."
            )
        moved = self._saved_total is not None and total != self._saved_total
        if moved and optim.needs_total:  # a constant lr (and its warmup) ignores the total
            rank_zero_warn(
                f"the lr schedule's total changed from {self._saved_total} to {total} steps "
                "since the checkpoint (other trainer limits): the lr follows the new total."
            )
        self.total, self._factor = total, optim.schedule(total)

    def state_dict(self) -> dict[str, Any]:
        return {
            "batches": self.batches,
            "steps": self.steps,
            "base_lrs": self.base_lrs,
            "total": self.total,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """The counters and base lrs (a checkpoint without them: a run that had no schedule,
        resumed from count 0 with the optimizer's lrs)."""
        self.batches = int(state.get("batches", 0))
        self.steps = int(state.get("steps", 0))
        base = state.get("base_lrs")
        self.base_lrs = None if base is None else [float(x) for x in base]
        self._saved_total = state.get("total")
        self._factor = None  # derived again from this run's trainer
