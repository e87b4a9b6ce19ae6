"""Faults that must not end a run, and the two that must end it cleanly.

- :class:`NonFiniteSkips`: :class:`~lit_rlhf.training.OptimizerStep` skips an optimizer step whose
  loss or gradient is not finite (on every rank together), counts it (``fault/skipped_steps``,
  cumulative) and stops the run with a :class:`FloatingPointError` after ``max_consecutive``
  skips in a row: one bad batch is survived, a diverged run is not trained on.
- :func:`poison_non_finite_loss`: a non-finite loss makes every gradient it reaches NaN, so the
  gradient check alone decides, under every strategy (DeepSpeed ZeRO only exposes gradients
  through its own step, see :mod:`lit_rlhf.training.optimization`).
- :class:`CheckpointOnInterrupt`: SIGTERM (a scheduler's preemption) or Ctrl-C during ``fit``
  stops the run at the end of the current training batch with a resumable checkpoint
  (``<checkpoint dir>/interrupted.ckpt``) and exit code 128 + the signal number (143, 130).
  ``lit-rlhf fit`` adds it by default.

The skip counters are checkpointed with the module (``OptimizerStep.state_dict``), so a resumed
run counts consecutive skips and ``fault/skipped_steps`` as the uninterrupted one would.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from lightning import Callback, LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch import Tensor
from typing_extensions import override

SKIPPED_STEPS_KEY = "fault/skipped_steps"
_WARNED_SKIPS = 3  # skipped steps that get a warning; later ones are only counted


class NonFiniteSkips:
    """Counts skipped optimizer steps and ends the run after too many in a row.

    Args:
        max_consecutive: the run stops with a FloatingPointError at this many consecutive
            skipped steps (1: at the first non-finite step).
    """

    def __init__(self, max_consecutive: int = 5) -> None:
        if (
            isinstance(max_consecutive, bool)
            or not isinstance(max_consecutive, int)
            or (max_consecutive < 1)
        ):
            raise ValueError(
                f"max_consecutive_skips must be an integer >= 1 (1 = stop at the first "
                f"non-finite step), got {max_consecutive!r}"
            )
        self.max_consecutive = int(max_consecutive)
        self.total = 0
        self.consecutive = 0

    def record(self, skipped: bool, *, step: int, what: str) -> None:
        """Count one optimizer step; ``what`` names the non-finite quantity of a skipped one."""
        if not skipped:
            self.consecutive = 0
            return
        self.total += 1
        self.consecutive += 1
        if self.consecutive >= self.max_consecutive:
            raise FloatingPointError(
                f"optimizer step {step}: non-finite {what} in {self.consecutive} consecutive "
                f"steps (max_consecutive_skips={self.max_consecutive}); each was skipped, and "
                "the run stops because it is not recovering. Fix: lower the learning rate, "
                "enable gradient clipping (max_grad_norm), check the data and the reward for "
                "inf/NaN, or train in float32 / bf16-mixed instead of float16."
            )
        if self.total <= _WARNED_SKIPS:
            later = " (later skips are only counted in fault/skipped_steps)"
            rank_zero_warn(
                f"optimizer step {step} skipped: non-finite {what}; {self.consecutive} in a row, "
                f"the run stops at {self.max_consecutive}"
                + (later if self.total == _WARNED_SKIPS else "")
            )

    def stats(self) -> dict[str, Tensor]:
        return {SKIPPED_STEPS_KEY: torch.tensor(float(self.total))}

    def state_dict(self) -> dict[str, int]:
        return {"skipped_steps": self.total, "consecutive_skips": self.consecutive}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.total = int(state.get("skipped_steps", 0))
        self.consecutive = int(state.get("consecutive_skips", 0))


class LossWatch:
    """Wraps a micro-batch loss function: remembers whether every loss was finite and poisons
    the backward of a non-finite one (:func:`poison_non_finite_loss`)."""

    def __init__(self, loss_fn: Callable[[Any], Tensor]) -> None:
        self.loss_fn = loss_fn
        self.finite: Tensor | None = None  # bool, all losses so far finite (no host sync)

    def __call__(self, micro: Any) -> Tensor:
        loss = self.loss_fn(micro)
        finite = torch.isfinite(loss.detach()).all()
        self.finite = finite if self.finite is None else self.finite & finite
        return poison_non_finite_loss(loss, finite)

    def what(self) -> str:
        """What was non-finite, for messages (syncs the device; call only on a skip)."""
        return "gradient" if self.finite is None or bool(self.finite) else "loss (and gradient)"


def poison_non_finite_loss(loss: Tensor, finite: Tensor) -> Tensor:
    """``loss`` x 1 (exact) when ``finite``, else x NaN: every gradient the loss reaches is then
    NaN, even where the non-finite part (a detached term) would leave it finite."""
    factor = torch.where(finite, loss.new_ones(()), loss.new_full((), float("nan")))
    return loss * factor


def deepspeed_step_skipped(strategy: Any, norm: Tensor | None) -> bool | None:
    """Whether DeepSpeed discarded its latest step for a non-finite gradient (ZeRO-1/2/3 check
    the global norm of the rank-reduced gradient inside ``step``, skip on every rank together and
    clear the gradients; ``engine.was_step_applied()`` reports it). None under fp16, where such
    skips are the loss scaler's calibration, not faults. A step DeepSpeed applied with a
    non-finite norm (a configuration without its overflow check) is an error: the weights are
    already corrupt."""
    engine = strategy.deepspeed_engine
    if engine.fp16_enabled():
        return None
    if not engine.was_step_applied():
        return True
    if norm is not None and not bool(torch.isfinite(norm)):
        raise FloatingPointError(
            "DeepSpeed applied an optimizer step with a non-finite gradient norm, so the weights "
            "are no longer finite. Fix: keep DeepSpeed's overflow check on (ZeRO stage 1-3; "
            "bf16: check_grad_overflow true), then resume from the last checkpoint."
        )
    return False


class TrainingInterrupted(SystemExit):
    """Raised by :class:`CheckpointOnInterrupt` after saving; exits with 128 + the signal."""


class CheckpointOnInterrupt(Callback):
    """On SIGTERM or the first Ctrl-C during ``fit``: finish the current training batch, save a
    resumable checkpoint, exit with code 128 + the signal number (SIGTERM 143, SIGINT 130).

    Args:
        dirpath: where ``filename`` goes; None: the ModelCheckpoint callback's folder if there is
            one, else ``<default_root_dir>/checkpoints``.
        filename: the checkpoint's name.

    The signals are taken over from the start to the end of training (main thread only):
    Lightning's own SIGTERM handling (a flag its loops check, a checkpoint only with SLURM
    requeue, exit code 0) is replaced for that time, and restored after. Ranks agree at the end
    of every batch (a max-reduce of the signal), so a signal that reached one rank stops all of
    them at the same batch. A second Ctrl-C stops at once, without a checkpoint (Lightning's
    KeyboardInterrupt path, exit code 1). The checkpoint is taken where ModelCheckpoint takes a
    step checkpoint: resuming with ``--ckpt_path`` continues with the next batch.
    """

    def __init__(
        self, dirpath: str | Path | None = None, filename: str = "interrupted.ckpt"
    ) -> None:
        if not filename:
            raise ValueError("filename must be a non-empty file name, e.g. interrupted.ckpt")
        self.dirpath, self.filename = dirpath, filename
        self.signum = 0  # the first signal received, 0: none
        self._previous: dict[int, Any] = {}

    @override
    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.signum = 0
        if threading.current_thread() is not threading.main_thread():
            return  # signal handlers can only be set from the main thread
        for signum in (signal.SIGTERM, signal.SIGINT):
            self._previous[signum] = signal.signal(signum, self._receive)

    def _receive(self, signum: int, frame: Any) -> None:
        if not self.signum:
            self.signum = signum
            again = " (Ctrl-C again: stop now, without one)" if signum == signal.SIGINT else ""
            name = signal.Signals(signum).name
            # os.write: print() from a handler can hit a reentrant call on sys.stdout's buffer
            os.write(2, f"\n{name}: stopping after this training batch with a checkpoint"
                     f"{again}\n".encode())  # fmt: skip
        if signum == signal.SIGINT:  # the next Ctrl-C gets Python's KeyboardInterrupt
            signal.signal(signal.SIGINT, signal.default_int_handler)

    @override
    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        signum = self._agreed_signal(trainer, pl_module)
        if not signum:
            return
        path = self.checkpoint_path(trainer)
        trainer.save_checkpoint(path)
        name = signal.Signals(signum).name
        rank_zero_info(
            f"{name}: saved a resumable checkpoint at step {trainer.global_step} to {path}. "
            f"Resume with: lit-rlhf fit --config <the same config> --ckpt_path {path}"
        )
        self._restore()
        raise TrainingInterrupted(128 + signum)

    def _agreed_signal(self, trainer: Trainer, pl_module: LightningModule) -> int:
        if trainer.world_size <= 1:
            return self.signum
        mine = torch.tensor(float(self.signum), device=pl_module.device)
        return int(trainer.strategy.reduce(mine, reduce_op="max"))

    def checkpoint_path(self, trainer: Trainer) -> Path:
        """Where the interrupted run's checkpoint goes (the same on every rank)."""
        dirpath = self.dirpath
        checkpoint = trainer.checkpoint_callback
        if dirpath is None and checkpoint is not None:
            dirpath = getattr(checkpoint, "dirpath", None)
        if dirpath is None:
            dirpath = Path(trainer.default_root_dir) / "checkpoints"
        return Path(dirpath) / self.filename

    @override
    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._restore()

    @override
    def on_exception(
        self, trainer: Trainer, pl_module: LightningModule, exception: BaseException
    ) -> None:
        self._restore()

    def _restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}
