"""Checkpoint files written atomically: a process killed while it writes one leaves every
checkpoint already on disk whole, ``last.ckpt`` included, and no truncated file under a
checkpoint's name.

Lightning's ``TorchCheckpointIO`` (2.6) serialises the checkpoint into memory, has fsspec write
it to a temporary file in the *system* temp folder and then ``shutil.move`` it into place. That
is a rename where the temp folder and the checkpoint folder share a filesystem; where they do
not (a container's ``/tmp`` and a mounted volume, a tmpfs ``/tmp``) it is a copy, and a kill
during the copy leaves a truncated ``last.ckpt``. Here the temporary file sits next to its
target, is flushed to disk, and replaces the target by one ``os.replace`` (atomic on POSIX within
a folder); the folder is then synced so the new name survives a crash too.

A write cut short leaves a hidden ``.<name>.<id>.tmp`` that nothing loads (Lightning looks for
``*.ckpt``); the next write of the same name removes it. ``lit-rlhf`` uses this for every run
whose strategy writes plain files (not DeepSpeed's checkpoint folders); in your own script:
``Trainer(plugins=[AtomicCheckpointIO()])``.
"""

from __future__ import annotations

import glob
import os
import uuid
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.utilities.cloud_io import _is_local_file_protocol
from lightning.fabric.utilities.types import _PATH
from lightning.pytorch.plugins.io import TorchCheckpointIO
from typing_extensions import override

from lit_rlhf.strategies.folders import sync_folder


class AtomicCheckpointIO(TorchCheckpointIO):
    """``TorchCheckpointIO`` whose local writes are write-to-temporary, fsync, rename (remote
    paths are written by Lightning as before)."""

    @override
    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: _PATH, storage_options: Any | None = None
    ) -> None:
        if storage_options is not None or not _is_local_file_protocol(path):
            return super().save_checkpoint(checkpoint, path, storage_options)
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        for stale in target.parent.glob(
            f".{glob.escape(target.name)}.*.tmp"
        ):  # an earlier write, cut short
            stale.unlink(missing_ok=True)
        temporary = target.with_name(f".{target.name}.{uuid.uuid4().hex[:8]}.tmp")
        try:
            with temporary.open("xb") as f:
                torch.save(checkpoint, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(temporary, target)
        except BaseException:
            temporary.unlink(missing_ok=True)
            raise
        sync_folder(target.parent)


def use_atomic_checkpoint_io(strategy: Any) -> None:
    """Give ``strategy`` an :class:`AtomicCheckpointIO` where it writes with Lightning's default
    ``TorchCheckpointIO`` (a checkpoint IO chosen by the user stays)."""
    if type(strategy.checkpoint_io) is TorchCheckpointIO:
        strategy.checkpoint_io = AtomicCheckpointIO()
