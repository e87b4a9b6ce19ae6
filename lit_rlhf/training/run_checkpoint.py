"""The checkpoints a run can be resumed from: ``last.ckpt`` and one every N optimizer steps.

:class:`PeriodicCheckpoint` is Lightning's ``ModelCheckpoint`` with the three things a
resumable RL run needs and Lightning's defaults do not give under manual optimisation (every
lit-rlhf module optimises manually):

- **The interval is crossed, not hit.** Lightning saves when ``global_step % N == 0`` at a
  batch's end; a PPO batch takes several optimizer steps (``ppo_epochs`` x mini-batches), so the
  step count can jump over every multiple of N and never save. Here a batch that carries
  ``global_step`` past a multiple of N saves.
- **``last.ckpt`` holds the final state.** Lightning writes ``last.ckpt`` with each periodic save
  and at the end only if it never wrote one, so a run whose length is not a multiple of N ends
  with a stale ``last.ckpt``. Here the end of ``fit`` refreshes it (a batch boundary: the resumed
  run continues with the next batch).
- **The batch's metrics row travels with it.** Lightning logs a batch's metrics after its
  ``on_train_batch_end`` hooks, where checkpoints are saved, so a kill in between left a
  checkpoint past a row that never reached ``metrics.csv``. Each checkpoint saved at a batch's
  end carries that row (``checkpoint["unlogged_metrics_row"]``), and lit-rlhf's CLI writes it back
  when it resumes into the run's folder (:mod:`lit_rlhf.cli.log_folder`). Every lit-rlhf module
  also returns :class:`UnloggedRow`, so a checkpoint that Lightning's own ``ModelCheckpoint``
  saves at a batch's end carries the row too.
- **No warning about pre-optimisation state.** Lightning warns under manual optimisation that the
  checkpoint holds the weights after the optimizer step; lit-rlhf wants exactly that (the saved
  loop position is the next batch), so the warning is not raised.

A kill at any moment leaves the previous ``last.ckpt`` whole: lit-rlhf's CLI writes checkpoint
files atomically (:class:`~lit_rlhf.training.AtomicCheckpointIO`).
"""

from __future__ import annotations

from typing import Any

from lightning import Callback, LightningModule, Trainer
from lightning.fabric.utilities.apply_func import convert_tensors_to_scalars
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities import rank_zero_info
from typing_extensions import override


class PeriodicCheckpoint(ModelCheckpoint):
    """``last.ckpt`` plus a checkpoint every ``every_n_train_steps`` optimizer steps.

    Args:
        every_n_train_steps: save when a training batch carries ``trainer.global_step`` (optimizer
            steps) past a multiple of this (>= 1).
        save_last: ``True``: ``last.ckpt`` is written with every save and at the end of fit;
            ``"link"``: it is a link to the newest checkpoint (no second write: large ZeRO
            folders); ``False`` is refused (use Lightning's ``ModelCheckpoint``).
        save_top_k: how many periodic checkpoints to keep, the newest (-1: all); with more
            than one and no ``monitor``, the monitor is the step.
        filename: the periodic checkpoints' name pattern.
        **kwargs: any other argument of Lightning's ``ModelCheckpoint`` (``dirpath``, ...).
    """

    def __init__(
        self,
        every_n_train_steps: int = 50,
        save_last: bool | str = True,
        save_top_k: int = -1,
        filename: str = "{step}",
        **kwargs: Any,
    ) -> None:
        if isinstance(every_n_train_steps, bool) or not isinstance(every_n_train_steps, int):
            raise ValueError(
                f"PeriodicCheckpoint every_n_train_steps must be an integer >= 1, got "
                f"{every_n_train_steps!r}. Fix: set the interval in optimizer steps."
            )
        if every_n_train_steps < 1:
            raise ValueError(
                f"PeriodicCheckpoint every_n_train_steps must be >= 1, got {every_n_train_steps}. "
                "Fix: set the interval in optimizer steps; for epoch-end checkpoints only, use "
                "Lightning's ModelCheckpoint."
            )
        if save_last not in (True, "link"):
            raise ValueError(
                f"PeriodicCheckpoint save_last must be true or 'link', got {save_last!r}: a run "
                "without last.ckpt cannot be resumed by name. Fix: use Lightning's "
                "ModelCheckpoint for periodic checkpoints alone."
            )
        if save_top_k > 1 and kwargs.get("monitor") is None:
            kwargs.update(monitor="step", mode="max")  # the k newest (Lightning needs a monitor)
        super().__init__(
            every_n_train_steps=every_n_train_steps,
            save_last=save_last,  # type: ignore[arg-type]  # Lightning's Literal["link"]
            save_top_k=save_top_k,
            filename=filename,
            **kwargs,
        )

    @override
    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, *args: Any, **kwargs: Any
    ) -> None:
        if pl_module.automatic_optimization:
            super().on_train_batch_end(trainer, pl_module, *args, **kwargs)
            return
        every = self._every_n_train_steps
        if trainer.global_step // every <= self._last_global_step_saved // every:
            return  # no multiple of the interval crossed since the last save
        if self._should_skip_saving_checkpoint(trainer):
            return
        self._save_both(trainer)

    @override
    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not self._should_skip_saving_checkpoint(trainer):  # skips a step saved already
            self._save_both(trainer)  # "link" needs a checkpoint of this step to point at

    @override
    def on_save_checkpoint(
        self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        store_unlogged_row(trainer, checkpoint)  # also for a module that lacks UnloggedRow

    def _save_both(self, trainer: Trainer) -> None:
        candidates = self._monitor_candidates(trainer)
        self._save_topk_checkpoint(trainer, candidates)
        self._save_last_checkpoint(trainer, candidates)


UNLOGGED_ROW = "unlogged_metrics_row"


def store_unlogged_row(trainer: Trainer, checkpoint: dict[str, Any]) -> None:
    """Puts the batch's pending row (:func:`batch_end_row`) into ``checkpoint`` when there is
    one: the CLI writes it back to ``metrics.csv`` on resume (``lit_rlhf.cli.log_folder``)."""
    row = batch_end_row(trainer)
    if row is not None:
        checkpoint[UNLOGGED_ROW] = row


class UnloggedRow(Callback):
    """Carries the pending metrics row in every checkpoint, whichever callback saves it
    (Lightning's ``ModelCheckpoint`` as well as :class:`PeriodicCheckpoint`). lit-rlhf's
    modules return it from ``configure_callbacks``; add it to any other Trainer."""

    @override
    def on_save_checkpoint(
        self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        store_unlogged_row(trainer, checkpoint)


def batch_end_row(trainer: Trainer) -> dict[str, Any] | None:
    """The ``metrics.csv`` row Lightning will log for the batch whose ``on_train_batch_end`` is
    running (None outside that window, or when this batch is not logged): the loggers receive
    it only after the hooks, so a checkpoint saved in them is written before its row."""
    loop = trainer.fit_loop.epoch_loop
    total = loop.batch_progress.total  # a _BatchProgress: counts processed batches too
    if not trainer.training or total.completed != getattr(total, "processed", 0) - 1:
        return None  # not inside a training batch's end hooks
    connector = trainer._logger_connector
    if trainer._results is None or not (
        connector.should_update_logs or getattr(trainer, "fast_dev_run", False)
    ):
        return None
    row: dict[str, Any] = convert_tensors_to_scalars(dict(connector.metrics["log"]))
    if not row:
        return None
    if "step" not in row:  # as Lightning's logger connector fills the row
        row.setdefault("epoch", trainer.current_epoch)
        row["step"] = loop._batches_that_stepped
    return row


def without_periodic(callbacks: Any) -> Any:
    """``callbacks`` (a Trainer's argument: None, one callback or a list) without
    :class:`PeriodicCheckpoint`: ``enable_checkpointing: false`` given on the command line over
    a shipped config turns its periodic checkpoints off instead of being refused by Lightning."""
    if callbacks is None:
        return None
    items = callbacks if isinstance(callbacks, list) else [callbacks]
    kept = [c for c in items if not isinstance(c, PeriodicCheckpoint)]
    if len(kept) < len(items):
        rank_zero_info("enable_checkpointing: false: the config's PeriodicCheckpoint is left out")
    return kept
