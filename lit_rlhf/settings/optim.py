"""``optim``: the optimisation step every module shares: AdamW, gradient clipping, micro-batch
accumulation, the skip of non-finite steps, and the lr schedule (warmup, then constant, linear or
cosine), all read by the core's :class:`~lit_rlhf.training.OptimizerStep`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from lightning.pytorch.utilities import rank_zero_warn

from lit_rlhf.algos.schedules import CoefficientSchedule, ScheduleKind
from lit_rlhf.settings.base import Rule, SettingsGroup, is_int, non_negative, positive

LRInterval = Literal["batch", "optimizer_step"]


@dataclass(frozen=True)
class OptimSettings(SettingsGroup):
    """Optimisation and lr schedule (``model.init_args.optim``).

    Args:
        lr: AdamW's learning rate (of the trained network; PPO's critic has ``critic.lr``).
        weight_decay: AdamW's decoupled weight decay.
        max_grad_norm: clip the gradient norm to this value before each step (null: no clipping);
            under DeepSpeed it becomes the config's ``gradient_clipping``.
        clip_per_network: clip the policy's and the critic's gradient norms apart, each to
            ``max_grad_norm``, as verl does with its two optimizers (PPO with a separate critic
            only; refused under DeepSpeed, FSDP and float16 loss scaling); default: the joint norm.
        micro_batch_size: rows per forward/backward; micro-batches accumulate exactly to one
            optimizer step (null, where a module allows it: the whole batch at once).
        max_consecutive_skips: an optimizer step whose loss or gradient is not finite is skipped
            (on every rank; ``fault/skipped_steps``); this many in a row stop the run with a
            FloatingPointError (1: stop at the first).
        lr_warmup_steps: linear warmup from lr 0 over this many steps (``lr_interval`` units).
        lr_warmup_ratio: the warmup as a fraction of all scheduled steps, rounded down as verl
            (not with ``lr_warmup_steps``).
        lr_schedule: after the warmup: ``constant``, ``linear`` or ``cosine`` decay.
        min_lr_ratio: where a decay ends, as a fraction of each param group's lr.
        lr_interval: the schedule steps once per training batch (``batch``: one rollout batch in
            the RL modules, as verl) or once per ``optimizer_step``.
        lr_total_steps: the scheduled steps; null: derived from the trainer (epochs x batches,
            or ``max_steps``).
    """

    GROUP = "optim"

    lr: float = 1e-5
    weight_decay: float = 0.0
    max_grad_norm: float | None = 1.0
    clip_per_network: bool = False
    micro_batch_size: int | None = 8
    max_consecutive_skips: int = 5
    lr_warmup_steps: int = 0
    lr_warmup_ratio: float = 0.0
    lr_schedule: ScheduleKind = "constant"
    min_lr_ratio: float = 0.0
    lr_interval: LRInterval = "batch"
    lr_total_steps: int | None = None

    def rules(self) -> list[Rule]:
        total, micro = self.lr_total_steps, self.micro_batch_size
        return [
            ("lr", positive(self.lr), "> 0 and finite (a negative lr would ascend the loss)"),
            ("weight_decay", non_negative(self.weight_decay), ">= 0 and finite"),
            ("max_grad_norm", self.max_grad_norm is None or positive(self.max_grad_norm),
             "> 0, or null (no clipping)"),
            ("micro_batch_size", micro is None or (is_int(micro) and micro >= 1),
             "an integer >= 1, or null for the whole batch"),
            ("max_consecutive_skips", self.max_consecutive_skips >= 1, ">= 1"),
            ("lr_warmup_steps", is_int(self.lr_warmup_steps) and self.lr_warmup_steps >= 0,
             "an integer >= 0"),
            ("lr_warmup_ratio", 0 <= self.lr_warmup_ratio < 1,
             "in [0, 1) (a fraction of all scheduled steps)"),
            ("min_lr_ratio", 0 <= self.min_lr_ratio <= 1,
             "in [0, 1] (the final lr as a fraction of lr)"),
            ("lr_total_steps", total is None or (is_int(total) and total >= 1),
             "an integer >= 1, or null to derive it from the trainer"),
        ]  # fmt: skip

    def check(self) -> None:
        if self.lr_warmup_steps > 0 and self.lr_warmup_ratio > 0:
            raise ValueError(
                f"optim.lr_warmup_steps={self.lr_warmup_steps} and optim.lr_warmup_ratio="
                f"{self.lr_warmup_ratio} both set the warmup. Fix: set only one of them (the "
                "other to 0)."
            )
        self._check_effect()
        if self.lr_total_steps is not None:
            self.check_total(self.lr_total_steps, derived=False)

    def _check_effect(self) -> None:
        """Refuse a setting that would silently change nothing."""
        if not self.decays and self.min_lr_ratio != 0:
            raise ValueError(
                f"optim.min_lr_ratio={self.min_lr_ratio} is where a linear or cosine decay ends, "
                "and optim.lr_schedule is 'constant': it would do nothing. Fix: set "
                "model.init_args.optim.lr_schedule to linear or cosine, or leave min_lr_ratio at 0."
            )
        if self.decays and self.min_lr_ratio == 1:
            raise ValueError(
                f"optim.min_lr_ratio=1 ends the {self.lr_schedule} decay where it starts: the lr "
                "would stay constant. Fix: lower min_lr_ratio, or set lr_schedule: constant."
            )
        warmup = self.lr_warmup_steps > 0 or self.lr_warmup_ratio > 0
        if not (warmup or self.decays) and self.lr_interval != "batch":
            raise ValueError(
                f"optim.lr_interval={self.lr_interval!r} says when the lr schedule steps, and "
                "there is no schedule (lr_schedule: constant, no warmup): it would do nothing. "
                "Fix: set a warmup or lr_schedule, or leave lr_interval at 'batch'."
            )
        if self.lr_total_steps is not None and not self.needs_total:
            raise ValueError(
                f"optim.lr_total_steps={self.lr_total_steps} is read only by a linear or cosine "
                "lr_schedule or by lr_warmup_ratio, and neither is set: it would do nothing. "
                "Fix: remove lr_total_steps, or set lr_schedule / lr_warmup_ratio."
            )

    @property
    def decays(self) -> bool:
        return self.lr_schedule != "constant"

    @property
    def needs_total(self) -> bool:
        """Whether the schedule cannot be built without the number of scheduled steps."""
        return self.decays or self.lr_warmup_ratio > 0

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
            else f"optim.lr_total_steps={total} {unit}"
        )
        warmup = self.warmup_steps(total)
        if warmup >= total:
            raise ValueError(
                f"the lr warmup takes {warmup} steps of the {where}: the lr would never reach "
                "lr. Fix: lower model.init_args.optim.lr_warmup_steps (or use lr_warmup_ratio), "
                "or " + ("train longer." if derived else "raise lr_total_steps.")
            )
        if self.lr_warmup_ratio > 0 and warmup == 0:
            message = (
                f"optim.lr_warmup_ratio={self.lr_warmup_ratio} of the {where} rounds down to no "
                "warmup step"
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
