"""Epoch-seeded shuffling for the training loaders: :class:`EpochShuffleSampler` (a permutation
that depends on the seed and the epoch only) and :func:`epoch_to_train` (the epoch a resumed
run's first iterator must follow). Shared by the prompt and SFT data modules; re-exported by
:mod:`lit_rlhf.data.prompts`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import Sampler


def epoch_to_train(trainer: Any) -> int:
    """The epoch whose order the train loader's first iterator must follow. Lightning makes a
    resumed run's iterator before its loop moves on from the checkpoint's epoch; a checkpoint
    taken after that epoch's last batch (at its end, or a step checkpoint that falls on it)
    resumes with the next epoch (whose first epoch Lightning counts as started only later)."""
    loop = trainer.fit_loop
    if loop.restarting and loop.epoch_loop.batch_progress.is_last_batch:
        return int(loop.epoch_progress.current.started)
    return int(trainer.current_epoch)


class EpochShuffleSampler(Sampler[int]):
    """A random permutation drawn from ``torch.Generator`` seeded by ``seed + epoch``.

    Lightning calls ``set_epoch`` at the start of every epoch (also after a resume), so the
    order depends on (seed, epoch) only, with no generator state to checkpoint. ``epoch`` sets
    the starting epoch (a resumed run's, before Lightning's first ``set_epoch``).
    """

    def __init__(self, num_rows: int, *, seed: int, epoch: int = 0) -> None:
        self.num_rows = num_rows
        self.seed = seed
        self.epoch = epoch

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        return iter(torch.randperm(self.num_rows, generator=generator).tolist())

    def __len__(self) -> int:
        return self.num_rows
