"""A callback for the lr-schedule tests: the lr each optimizer step really runs with, read from the
innermost optimizer (under DeepSpeed the base torch optimizer inside the ZeRO wrapper), and
whether the step changed the trainable weights. Importable by runs in other processes
(``--trainer.callbacks+=tests.training.record_lr.RecordLR``), which write what they saw to
``path`` (JSON) at the end of ``fit``."""

from __future__ import annotations

import json
from typing import Any

from lightning import Callback


def innermost(optimizer: Any) -> Any:
    """The optimizer that steps: Lightning's and DeepSpeed's wrappers unwrapped."""
    while getattr(optimizer, "optimizer", None) is not None:
        optimizer = optimizer.optimizer
    return optimizer


def weights_sum(module: Any) -> float:
    """A checksum of the trainable weights (float64, on CPU)."""
    return sum(float(p.detach().double().sum()) for p in module.parameters() if p.requires_grad)


class RecordLR(Callback):
    """``lrs``: per optimizer step, every param group's lr; ``changed``: per training batch,
    whether the trainable weights changed."""

    def __init__(self, path: str | None = None) -> None:
        self.path = path
        self.lrs: list[list[float]] = []
        self.changed: list[bool] = []
        self._before = 0.0

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        self.lrs.append([float(g["lr"]) for g in innermost(optimizer).param_groups])

    def on_train_batch_start(self, trainer: Any, pl_module: Any, *args: Any) -> None:
        self._before = weights_sum(pl_module)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, *args: Any) -> None:
        self.changed.append(weights_sum(pl_module) != self._before)

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        if self.path is not None and trainer.is_global_zero:
            with open(self.path, "w") as f:
                json.dump({"lrs": self.lrs, "changed": self.changed}, f)


__all__ = ["RecordLR", "innermost"]
