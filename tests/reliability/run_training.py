"""What the kill-and-resume tests run in their training processes: ``lit-rlhf fit`` in a process
forked from a server that has already imported the library (a fresh interpreter per run would
spend most of a tiny run importing), a callback that slows training steps down so that a kill
lands between two checkpoints, and one that kills the process halfway through writing one.

``python -m tests.reliability.run_training ARGS`` (from the repository root) runs ``lit-rlhf``
with ``ARGS`` the same way in a plain interpreter.
"""

from __future__ import annotations

import io
import os
import signal
import sys
import time
from typing import Any

import torch
from lightning import Callback

from lit_rlhf.cli import main


class PauseBeforeStep(Callback):
    """Sleeps ``seconds`` before every training batch, so that a watcher sees each checkpoint
    while the run is still going."""

    def __init__(self, seconds: float = 0.25) -> None:
        self.seconds = seconds

    def on_train_batch_start(self, trainer: Any, pl_module: Any, *args: Any) -> None:
        time.sleep(self.seconds)


class KillWhileWritingCheckpoint(Callback):
    """At optimizer step ``at_step`` (before that step's checkpoints: Lightning runs checkpoint
    callbacks after every other one), arms ``torch.save`` so that its ``write``-th call from
    then on puts the first half of the serialised checkpoint into its file, flushes it to disk
    and SIGKILLs the process (with ``save_last``: write 1 is the step's own file, 2 last.ckpt).
    """

    def __init__(self, at_step: int, write: int = 1) -> None:
        self.at_step, self.write = at_step, write

    def on_train_batch_end(self, trainer: Any, pl_module: Any, *args: Any) -> None:
        if trainer.global_step == self.at_step:
            torch.save = _KilledMidWrite(torch.save, self.write)  # type: ignore[assignment]


class _KilledMidWrite:
    def __init__(self, save: Any, write: int) -> None:
        self.save, self.calls_left = save, write

    def __call__(self, obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
        self.calls_left -= 1
        if self.calls_left > 0:
            return self.save(obj, f, *args, **kwargs)
        buffer = io.BytesIO()
        self.save(obj, buffer, *args, **kwargs)
        data = buffer.getvalue()
        f.write(data[: len(data) // 2])
        f.flush()
        os.fsync(f.fileno())
        os.kill(os.getpid(), signal.SIGKILL)


def fit(argv: list[str], cwd: str, log: str) -> None:
    """``lit-rlhf fit ARGV`` in ``cwd``, stdout and stderr into the file ``log`` (the process
    target of the forked runs). One intra-op thread: the runs of a test share two cores, and
    every run computes with the same thread count."""
    os.chdir(cwd)
    with open(log, "w") as out:
        os.dup2(out.fileno(), 1)
        os.dup2(out.fileno(), 2)
    torch.set_num_threads(1)
    sys.argv = ["lit-rlhf", "fit", *argv]
    main()


if __name__ == "__main__":
    sys.argv[0] = "lit-rlhf"
    main()
