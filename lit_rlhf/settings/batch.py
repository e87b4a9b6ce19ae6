"""Batch sizes across processes. A per-process size (``data.init_args.batch_size``,
``model.init_args.update.mini_batch_size``) is what one process takes; a global size
(``data.init_args.global_batch_size``, ``model.init_args.update.global_mini_batch_size``) is what
all processes take together, the count a paper's recipe gives. A global size is divided by the
world size (``trainer.devices`` x ``num_nodes``) when the trainer is known, in ``setup``, so the
run's batch does not change with the number of GPUs it lands on; a world size that does not
divide it is refused. Setting both the per-process and the global size of one thing is refused
when the config is built.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from lit_rlhf.settings.base import Rule, SettingsGroup, is_int

DEFAULT_BATCH_SIZE = 8  # a data module's batch per process when neither size is set


def optional_at_least_one(value: int | None) -> bool:
    return value is None or (is_int(value) and value >= 1)


def split_over_processes(total: int, world_size: int, key: str, unit: str) -> int:
    """``total`` (a global count of ``unit``, set as ``key``) per process; refused with the fix
    when ``world_size`` processes cannot take equal whole shares."""
    if world_size < 1 or total % world_size:
        fits = [n for n in range(1, total + 1) if total % n == 0]
        raise ValueError(
            f"{key}={total} {unit} across all processes cannot be split evenly over "
            f"{world_size} processes (trainer.devices x trainer.num_nodes). Fix: run on a "
            f"process count that divides {total} ({', '.join(map(str, fits[-6:]))}; "
            f"--trainer.devices=N), or set {key} to a multiple of {world_size}."
        )
    return total // world_size


@dataclass(frozen=True)
class DataBatchSettings(SettingsGroup):
    """A data module's training batch (``data.init_args``): rows per training batch, prompts for
    the RL modules (PPO, GRM: one prompt per pair), pairs for the reward model and DPO, rows for
    SFT.

    Args:
        batch_size: rows per training batch on each process (null: 8, unless
            ``global_batch_size`` is set).
        global_batch_size: rows per training batch across all processes, divided by the world
            size at ``setup`` (refused when it does not divide).
    """

    GROUP: ClassVar[str] = "data"

    batch_size: int | None = None
    global_batch_size: int | None = None

    def key(self, name: str) -> str:
        return f"data.init_args.{name}"

    def rules(self) -> list[Rule]:
        return [
            ("batch_size", optional_at_least_one(self.batch_size), ">= 1, or null"),
            ("global_batch_size", optional_at_least_one(self.global_batch_size), ">= 1, or null"),
        ]

    def check(self) -> None:
        if self.batch_size is not None and self.global_batch_size is not None:
            raise ValueError(
                f"data.init_args.batch_size={self.batch_size} (per process) and "
                f"data.init_args.global_batch_size={self.global_batch_size} (across all "
                "processes) both set the training batch. Fix: keep one of them (set the other "
                "to null)."
            )

    def per_process(self, world_size: int) -> int:
        """The training batch of one process among ``world_size``."""
        if self.global_batch_size is None:
            return self.batch_size or DEFAULT_BATCH_SIZE
        return split_over_processes(
            self.global_batch_size, world_size, self.key("global_batch_size"), "rows"
        )

    def describe(self, world_size: int) -> str | None:
        """One line for the log when the batch is global (None otherwise)."""
        if self.global_batch_size is None:
            return None
        per = self.per_process(world_size)
        return (
            f"data.init_args.global_batch_size={self.global_batch_size}: {per} per process x "
            f"{world_size} process{'es' if world_size > 1 else ''}"
        )
