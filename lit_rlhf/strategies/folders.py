"""Putting a finished checkpoint folder in place atomically, and flushing a folder's entries: the
file-system steps of :class:`~lit_rlhf.strategies.FSDP2Strategy`'s atomic distributed-checkpoint
saves and of :class:`~lit_rlhf.training.AtomicCheckpointIO`'s atomic files."""

from __future__ import annotations

import ctypes
import os
import shutil
import sys
from pathlib import Path


def sync_folder(folder: Path) -> None:
    """Flush a folder's entries (the rename) to disk; POSIX only (Windows cannot open one)."""
    if os.name != "posix":
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
    sync_folder(target.parent)


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
