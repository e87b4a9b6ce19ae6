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

import ctypes
import glob
import os
import shutil
import sys
import uuid
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.utilities.cloud_io import _is_local_file_protocol
from lightning.fabric.utilities.types import _PATH
from lightning.pytorch.plugins.io import TorchCheckpointIO
from typing_extensions import override


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
        _sync_folder(target.parent)


def _sync_folder(folder: Path) -> None:
    """Flush a folder's entries (the rename) to disk; POSIX only (Windows cannot open one)."""
    if os.name != "posix":
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def use_atomic_checkpoint_io(strategy: Any) -> None:
    """Give ``strategy`` an :class:`AtomicCheckpointIO` where it writes with Lightning's default
    ``TorchCheckpointIO`` (a checkpoint IO chosen by the user stays)."""
    if type(strategy.checkpoint_io) is TorchCheckpointIO:
        strategy.checkpoint_io = AtomicCheckpointIO()


def replace_path(staging: Path, target: Path) -> None:
    """Put the finished checkpoint folder ``staging`` at ``target`` (a folder or file, or
    nothing yet), then remove what ``target`` held. On Linux both names are swapped by one
    ``renameat2(RENAME_EXCHANGE)``: a kill at any moment leaves either the old or the new
    checkpoint under ``target``. Elsewhere (or on a filesystem without the exchange) the old one
    is first renamed to ``.<name>.old``, which a kill between the two renames leaves behind."""
    if not target.exists() and not target.is_symlink():
        os.rename(staging, target)
    elif _exchange(staging, target):
        remove_path(staging)  # holds the old checkpoint now
    else:
        old = target.with_name(f".{target.name}.old")
        remove_path(old)
        os.rename(target, old)
        os.rename(staging, target)
        remove_path(old)
    _sync_folder(target.parent)


def remove_path(path: Path) -> None:
    """Remove a file, a link or a folder tree; nothing if ``path`` does not exist."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically with Linux's ``renameat2(..., RENAME_EXCHANGE)``; False where
    the call or the flag is not available (another OS, an old libc, some filesystems)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    result = renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange)
    return int(result) == 0
