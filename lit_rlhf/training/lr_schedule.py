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

Settings (flat module arguments, validated into :class:`LRScheduleSettings` when the module is
built): ``lr_warmup_steps`` or ``lr_warmup_ratio`` (verl's ``lr_warmup_steps_ratio``: the warmup
is ``int(ratio * total)`` steps), ``lr_schedule``, ``min_lr_ratio`` (the final lr as a fraction of
lr), ``lr_interval`` and ``lr_total_steps`` (default: derived from the trainer,
:func:`scheduled_total`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args

from lightning.pytorch.utilities import rank_zero_warn

from lit_rlhf.algos.schedules import CoefficientSchedule, ScheduleKind
from lit_rlhf.training.settings import refuse_out_of_range

LRInterval = Literal["batch", "optimizer_step"]
LR_KEY = "train/lr"  # the first param group's lr, logged every step


@dataclass(frozen=True)
class LRScheduleSettings:
    """The lr schedule's settings (the modules' flat arguments of the same names)."""

    lr_warmup_steps: int = 0
    lr_warmup_ratio: float = 0.0
    lr_schedule: ScheduleKind = "constant"
    min_lr_ratio: float = 0.0
    lr_interval: LRInterval = "batch"
    lr_total_steps: int | None = None

    def __post_init__(self) -> None:
        self._check_values()
        self._check_effect()
        if self.lr_total_steps is not None:
            self.check_total(self.lr_total_steps, derived=False)

    @classmethod
    def from_hparams(cls, hparams: Mapping[str, Any]) -> LRScheduleSettings:
        """The settings named in ``hparams`` (a module's hyperparameters); the rest default."""
        return cls(
            **{f.name: hparams[f.name] for f in dataclasses.fields(cls) if f.name in hparams}
        )

    @property
    def decays(self) -> bool:
        return self.lr_schedule != "constant"

    @property
    def needs_total(self) -> bool:
        """Whether the schedule cannot be built without the number of scheduled steps."""
        return self.decays or self.lr_warmup_ratio > 0

    def _check_values(self) -> None:
        for name, allowed in (("lr_schedule", ScheduleKind), ("lr_interval", LRInterval)):
            if getattr(self, name) not in get_args(allowed):
                raise ValueError(
                    f"{name}={getattr(self, name)!r} is not one of {list(get_args(allowed))}. "
                    f"Fix: set model.init_args.{name} to one of them."
                )
        total = self.lr_total_steps
        rules = [
            ("lr_warmup_steps", _is_int(self.lr_warmup_steps) and self.lr_warmup_steps >= 0,
             "an integer >= 0"),
            ("lr_warmup_ratio", 0 <= self.lr_warmup_ratio < 1,
             "in [0, 1) (a fraction of all scheduled steps)"),
            ("min_lr_ratio", 0 <= self.min_lr_ratio <= 1,
             "in [0, 1] (the final lr as a fraction of lr)"),
            ("lr_total_steps", total is None or (_is_int(total) and total >= 1),
             "an integer >= 1, or null to derive it from the trainer"),
        ]  # fmt: skip
        refuse_out_of_range(rules, dataclasses.asdict(self))
        if self.lr_warmup_steps > 0 and self.lr_warmup_ratio > 0:
            raise ValueError(
                f"lr_warmup_steps={self.lr_warmup_steps} and lr_warmup_ratio="
                f"{self.lr_warmup_ratio} both set the warmup. Fix: set only one of them (the "
                "other to 0)."
            )

    def _check_effect(self) -> None:
        """Refuse a setting that would silently change nothing."""
        if not self.decays and self.min_lr_ratio != 0:
            raise ValueError(
                f"min_lr_ratio={self.min_lr_ratio} is where a linear or cosine decay ends, and "
                "lr_schedule is 'constant': it would do nothing. Fix: set model.init_args."
                "lr_schedule to linear or cosine, or leave min_lr_ratio at 0."
            )
        if self.decays and self.min_lr_ratio == 1:
            raise ValueError(
                f"min_lr_ratio=1 ends the {self.lr_schedule} decay where it starts: the lr would "
                "stay constant. Fix: lower min_lr_ratio, or set lr_schedule: constant."
            )
        warmup = self.lr_warmup_steps > 0 or self.lr_warmup_ratio > 0
        if not (warmup or self.decays) and self.lr_interval != "batch":
            raise ValueError(
                f"lr_interval={self.lr_interval!r} says when the lr schedule steps, and there is "
                "no schedule (lr_schedule: constant, no warmup): it would do nothing. Fix: set a "
                "warmup or lr_schedule, or leave lr_interval at 'batch'."
            )
        if self.lr_total_steps is not None and not self.needs_total:
            raise ValueError(
                f"lr_total_steps={self.lr_total_steps} is read only by a linear or cosine "
                "lr_schedule or by lr_warmup_ratio, and neither is set: it would do nothing. "
                "Fix: remove lr_total_steps, or set lr_schedule / lr_warmup_ratio."
            )

    def warmup_steps(self, total: int | None) -> int:
        """Warmup length in ``lr_interval`` units: ``lr_warmup_steps``, or
        ``int(lr_warmup_ratio * total)`` (rounded down, as verl does)."""
        if self.lr_warmup_ratio > 0 and total is not None:
            return int(self.lr_warmup_ratio * total)
        return self.lr_warmup_steps

    def check_total(self, total: int, *, derived: bool) -> None:
        """Refuse a warmup that fills the ``total`` scheduled steps; a warmup ratio that rounds
        to no step is refused for an explicit ``lr_total_steps`` and warned about for a derived
        one (a short test run of a preset)."""
        unit = "training batches" if self.lr_interval == "batch" else "optimizer steps"
        where = (
            f"{total} {unit} derived from the trainer (max_epochs x batches per epoch, or "
            "max_steps)"
            if derived
            else f"lr_total_steps={total} {unit}"
        )
        warmup = self.warmup_steps(total)
        if warmup >= total:
            raise ValueError(
                f"the lr warmup takes {warmup} steps of the {where}: the lr would never reach "
                "lr. Fix: lower model.init_args.lr_warmup_steps (or use lr_warmup_ratio), or "
                + ("train longer." if derived else "raise lr_total_steps.")
            )
        if self.lr_warmup_ratio > 0 and warmup == 0:
            message = (
                f"lr_warmup_ratio={self.lr_warmup_ratio} of the {where} rounds down to no warmup "
                "step"
            )
            if not derived:
                raise ValueError(f"{message}. Fix: raise lr_warmup_ratio or lr_total_steps.")
            rank_zero_warn(f"{message}: this run has no warmup.")

    def schedule(self, total: int | None) -> CoefficientSchedule:
        """The lr factor (1.0 = the group's lr) as a function of the count."""
        warmup = self.warmup_steps(total)
        if not self.decays:
            return CoefficientSchedule(1.0, warmup_steps=warmup)
        return CoefficientSchedule(
            1.0,
            kind=self.lr_schedule,
            final_value=self.min_lr_ratio,
            warmup_steps=warmup,
            total_steps=total,
        )


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

    def __init__(self, settings: LRScheduleSettings | None = None, idle_batches: int = 0) -> None:
        if idle_batches < 0:
            raise ValueError(f"idle_batches must be >= 0, got {idle_batches}")
        self.settings = settings or LRScheduleSettings()
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
        count = self.batches if self.settings.lr_interval == "batch" else self.steps
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
        settings, total = self.settings, self.settings.lr_total_steps
        if total is None and trainer is not None:
            total = scheduled_total(
                settings.lr_interval,
                max_epochs=trainer.max_epochs,
                batches_per_epoch=trainer.num_training_batches,
                max_steps=trainer.max_steps,
                steps_per_batch=steps_per_batch,
            )
            if total is not None:
                per_batch = 1 if settings.lr_interval == "batch" else steps_per_batch
                total = max(1, total - self.idle_batches * per_batch)
                settings.check_total(total, derived=True)
        if total is None and settings.needs_total:
            raise ValueError(
                f"lr_schedule={settings.lr_schedule!r} / lr_warmup_ratio="
                f"{settings.lr_warmup_ratio} need the number of scheduled steps, and the trainer "
                "sets no end (max_epochs and max_steps -1, or a loader without a length). Fix: "
                "set model.init_args.lr_total_steps, or trainer.max_steps."
            )
        moved = self._saved_total is not None and total != self._saved_total
        if moved and settings.needs_total:  # a constant lr (and its warmup) ignores the total
            rank_zero_warn(
                f"the lr schedule's total changed from {self._saved_total} to {total} steps "
                "since the checkpoint (other trainer limits): the lr follows the new total."
            )
        self.total, self._factor = total, settings.schedule(total)

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


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
