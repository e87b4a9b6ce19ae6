"""Plain progress lines where nobody watches a terminal (first step, last, one per 5 s between).

Lightning's progress bar redraws one line in place: with the output redirected to a file (a
batch job, ``nohup``, ``| tee``) the rich bar writes nothing until the run ends and tqdm's
carriage returns pile up. :class:`PlainProgress` (every lit-rlhf module adds it) prints, on rank
0 and only when standard output is not a terminal, a line for the first training batch, the
last, and at most one every ``min_interval`` seconds between (5 s by default: every step of a
run whose steps take longer, so an RL run prints each rollout)::

    lit-rlhf: step 12/64 | reward 0.312 | kl 0.0041 | 3.05 s/step | ETA 2m39s

with the metrics the module shows in the bar (PPO and the judges: reward, kl; DPO, SFT and the
reward model: loss, acc; the compressor: train/loss). A step is one training batch (a rollout
for the RL modules); the total comes from ``max_steps`` or the batches per epoch times
``max_epochs`` (``?`` when neither bounds the run).
"""

from __future__ import annotations

import math
import sys
import time
from typing import Any

from lightning import Callback
from typing_extensions import override


class PlainProgress(Callback):
    """Prints progress lines when stdout is not a terminal (see the module docstring).

    Args:
        stream: where to write (default ``sys.stdout``, checked at fit start).
        min_interval: seconds between two lines, the first and last step aside (0: a line per
            step). A step of a few ms printing its own line would cost Lightning's metric
            gathering and a flush every step, and fill a batch job's log.
    """

    def __init__(self, stream: Any = None, min_interval: float = 5.0) -> None:
        if not min_interval >= 0:
            raise ValueError(
                f"PlainProgress(min_interval={min_interval}): seconds between lines must be "
                ">= 0. Fix: 0 prints every step, 5 (the default) at most one line per 5 s."
            )
        self.stream, self.min_interval = stream, float(min_interval)
        self._active = False
        self._start = self._printed_at = 0.0
        self._done = self._printed = self._step = 0

    @override
    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        stream = self.stream or sys.stdout
        self._active = trainer.is_global_zero and not _is_terminal(stream)
        self._start, self._done, self._printed = time.monotonic(), 0, 0

    @override
    def on_train_batch_end(self, trainer: Any, pl_module: Any, *args: Any) -> None:
        if not self._active:
            return
        self._done += 1
        now = time.monotonic()
        step = self._step = int(trainer.fit_loop.total_batch_idx) + 1
        total = _total_batches(trainer, step)
        due = now - self._printed_at >= self.min_interval
        if self._printed == 0 or step == total or due:
            self._write(trainer, step, total, now)

    @override
    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        """The last step's line, when the run ended before its bound (or had none)."""
        if self._active and self._done > self._printed:
            total = _total_batches(trainer, self._step)
            self._write(trainer, self._step, total, time.monotonic())

    def _write(self, trainer: Any, step: int, total: int | None, now: float) -> None:
        seconds = (now - self._start) / self._done
        parts = [f"step {step}/{total if total else '?'}"]
        for name, value in trainer.progress_bar_metrics.items():
            if name != "v_num":
                parts.append(f"{name} {float(value):.4g}")
        parts.append(f"{seconds:.2f} s/step")
        if total:
            parts.append(f"ETA {_duration(max(total - step, 0) * seconds)}")
        (self.stream or sys.stdout).write("lit-rlhf: " + " | ".join(parts) + "\n")
        (self.stream or sys.stdout).flush()
        self._printed, self._printed_at = self._done, now


def _is_terminal(stream: Any) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(callable(isatty) and isatty())


def _total_batches(trainer: Any, step: int) -> int | None:
    """Training batches of the whole run: ``max_steps`` converted with the optimizer steps per
    batch so far, else batches per epoch x ``max_epochs``; None when unbounded."""
    per_epoch = trainer.num_training_batches
    epochs = trainer.max_epochs
    by_epochs = (
        int(per_epoch * epochs)
        if epochs not in (None, -1)
        and per_epoch not in (None, math.inf)
        and math.isfinite(per_epoch)
        else None
    )
    max_steps = int(trainer.max_steps or -1)
    if max_steps > 0 and trainer.global_step > 0:
        by_steps = math.ceil(max_steps / (trainer.global_step / step))
        return min(by_steps, by_epochs) if by_epochs else by_steps
    return by_epochs


def _duration(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"
