"""Adaptive KL coefficient (Ziegler et al. 2019, arXiv 1909.08593, eq. 2) as a callback.

Protocol: the module has a float attribute ``kl_coef`` that its loss/reward reads each step
(``PPOModule`` and ``GenerativeRewardModule`` seed it from their ``kl.coef`` setting; it must be
> 0 when training starts: a module with a zero coefficient has no reference to measure
against), and its ``training_step`` returns a dict with ``"kl"``, the measured per-sequence KL to
the reference, and ``"num_sequences"``, how many sequences it was measured over on this rank.
The controller state is checkpointed and re-applied on ``on_train_start``, so a resumed run uses
the coefficient it had reached, not the initial one.
"""

from __future__ import annotations

from typing import Any

import torch
from lightning import Callback, LightningModule, Trainer
from typing_extensions import override

from lit_rlhf.algos import AdaptiveKLController


class AdaptiveKL(Callback):
    """Args:
    init_kl_coef: starting coefficient (the module's ``kl.coef`` must also be > 0 so that it
        loads a reference model).
    target: target KL per sequence (nats).
    horizon: adaptation horizon, in sequences.
    """

    def __init__(
        self, init_kl_coef: float = 0.1, target: float = 6.0, horizon: int = 10000
    ) -> None:
        if init_kl_coef <= 0 or target <= 0 or horizon <= 0:
            raise ValueError(
                "AdaptiveKL needs init_kl_coef > 0, target > 0 and horizon > 0; got "
                f"{init_kl_coef}, {target}, {horizon}"
            )
        self.controller = AdaptiveKLController(init_kl_coef, target=target, horizon=horizon)

    @override
    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage == "fit":  # before configure_model: no model has loaded yet
            _check_module_kl(pl_module)

    @override
    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        _check_module_kl(pl_module)
        setattr(pl_module, "kl_coef", self.controller.value)  # noqa: B010 (protocol attribute)

    @override
    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if not isinstance(outputs, dict) or not {"kl", "num_sequences"} <= outputs.keys():
            raise ValueError(
                "AdaptiveKL: training_step must return a dict with 'kl' (per-sequence KL to the "
                "reference) and 'num_sequences' (sequences it was measured over)"
            )
        kl = trainer.strategy.reduce(torch.as_tensor(outputs["kl"]).float(), reduce_op="mean")
        n = trainer.strategy.reduce(
            torch.as_tensor(outputs["num_sequences"]).float(), reduce_op="sum"
        )
        coef = self.controller.update(float(kl), int(n))
        setattr(pl_module, "kl_coef", coef)  # noqa: B010 (protocol attribute)
        pl_module.log("ppo/kl_coef_adaptive", coef, on_step=True)

    @override
    def state_dict(self) -> dict[str, Any]:
        return self.controller.state_dict()

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.controller.load_state_dict(state_dict)


def _check_module_kl(pl_module: LightningModule) -> None:
    coef = getattr(pl_module, "kl_coef", None)
    if not isinstance(coef, (int, float)) or coef <= 0:
        raise ValueError(
            f"AdaptiveKL needs a module with a `kl_coef` attribute > 0 (so that it measures a "
            f"KL to a reference); {type(pl_module).__name__} has kl_coef={coef!r}. Fix: set "
            "model.init_args.kl.coef > 0."
        )
