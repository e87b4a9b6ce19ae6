"""One plain progress line per training step where nobody watches a terminal.

Lightning's progress bar redraws one line in place: with the output redirected to a file (a
batch job, ``nohup``, ``| tee``) the rich bar writes nothing until the run ends and tqdm's
carriage returns pile up. :class:`PlainProgress` (every lit-rlhf module adds it) prints, on rank
0 and only when standard output is not a terminal, one line per training batch::

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
    """Prints one progress line per training batch when stdout is not a terminal (see the
    module docstring); ``stream``: where to write (default ``sys.stdout``, checked at fit
    start)."""

    def __init__(self, stream: Any = None) -> None:
        self.stream = stream
        self._active = False
        self._start = 0.0
        self._done = 0

    @override
    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        stream = self.stream or sys.stdout
        self._active = trainer.is_global_zero and not _is_terminal(stream)
        self._start, self._done = time.monotonic(), 0

    @override
    def on_train_batch_end(self, trainer: Any, pl_module: Any, *args: Any) -> None:
        if not self._active:
            return
        self._done += 1
        seconds = (time.monotonic() - self._start) / self._done
        step = int(trainer.fit_loop.total_batch_idx) + 1
        total = _total_batches(trainer, step)
        parts = [f"step {step}/{total if total else '?'}"]
        for name, value in trainer.progress_bar_metrics.items():
            if name != "v_num":
                parts.append(f"{name} {float(value):.4g}")
        parts.append(f"{seconds:.2f} s/step")
        if total:
            parts.append(f"ETA {_duration(max(total - step, 0) * seconds)}")
        (self.stream or sys.stdout).write("lit-rlhf: " + " | ".join(parts) + "\n")
        (self.stream or sys.stdout).flush()


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
