"""A resumed ``fit`` logs into the folder of the run it resumes, not a new ``version_N``.

Lightning's ``CSVLogger`` and ``TensorBoardLogger`` pick the next free ``version_N`` when the
config leaves ``version`` unset, so every resume used to start a new folder with half the
metrics; and a ``CSVLogger`` given an existing folder deletes its ``metrics.csv``. With
``--ckpt_path`` inside ``<save_dir>/<name>/<version>/`` (where ``ModelCheckpoint`` and
:class:`~lit_rlhf.callbacks.PeriodicCheckpoint` put checkpoints by default), lit-rlhf sets that
version on the logger and keeps the folder's ``metrics.csv`` rows logged before the checkpoint
(``step`` below the first step the resumed run logs): rows the killed run logged after its last
checkpoint are logged again by the resumed run, so each step appears once. The rows it drops are
kept in ``metrics.csv.before-resume``. The checkpoint's own batch is logged after the hooks that
save it, so a kill in between lost its row: :class:`~lit_rlhf.callbacks.UnloggedRow` (which
every lit-rlhf module adds) and :class:`~lit_rlhf.callbacks.PeriodicCheckpoint` store that row
in the checkpoint, and it is written back here when the folder lacks it. A
logger whose version the config sets, a checkpoint elsewhere, and W&B / MLflow (their runs are
resumed by their own ``id`` / ``run_id`` settings) are left as they are.
"""

from __future__ import annotations

import csv
import os
import re
import warnings
from pathlib import Path
from typing import Any

from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

from lit_rlhf.training.run_checkpoint import UNLOGGED_ROW

_VERSION = re.compile(r"^version_(\d+)$")
_METRICS = "metrics.csv"
_KEYS = ("step", "epoch")


def logged_batches(checkpoint: dict[str, Any]) -> int | None:
    """The ``step`` of the first row a run resumed from ``checkpoint`` logs (Lightning's loggers
    count training batches), from the fit loop's saved state; None if the checkpoint has none.
    A checkpoint saved at a batch's end counts that batch as done (Lightning's restart adds 1;
    its row, logged after the save, travels in the checkpoint: :func:`unlogged_row`); one saved
    elsewhere does not."""
    loop = checkpoint.get("loops", {}).get("fit_loop", {})
    if not isinstance(loop, dict):
        return None
    state = loop.get("epoch_loop.state_dict", {})
    stepped = state.get("_batches_that_stepped") if isinstance(state, dict) else None
    if not isinstance(stepped, int):
        return None
    total = loop.get("epoch_loop.batch_progress", {}).get("total", {})
    at_batch_end = total.get("completed") == total.get("processed", 0) - 1
    return stepped + int(at_batch_end)


def unlogged_row(checkpoint: dict[str, Any]) -> dict[str, Any] | None:
    """The metrics row of the batch the checkpoint was saved at, which its run may not have
    logged before it stopped (None if the checkpoint carries none)."""
    row = checkpoint.get(UNLOGGED_ROW)
    return dict(row) if isinstance(row, dict) and "step" in row else None


def continue_log_folders(
    trainer: Any, ckpt_path: str, logged: int | None, row: dict[str, Any] | None = None
) -> list[str]:
    """Point each CSV / TensorBoard logger without a set version at the run folder that holds
    ``ckpt_path``; returns the folders continued. ``row`` (:func:`unlogged_row`) is added to
    ``metrics.csv`` when no kept row has its step."""
    continued = []
    for logger in trainer.loggers:
        if not isinstance(logger, CSVLogger | TensorBoardLogger) or logger._version is not None:
            continue
        version = _version_holding(Path(ckpt_path), Path(logger.root_dir))
        if version is None:
            continue
        logger._version = version
        if isinstance(logger, CSVLogger) and trainer.is_global_zero:
            _keep_rows_before(Path(logger.log_dir), logged, row)
            open_continued_csv(logger)
        continued.append(logger.log_dir)
    return continued


def _version_holding(ckpt: Path, root: Path) -> int | str | None:
    try:
        relative = ckpt.resolve().relative_to(root.resolve())
    except ValueError:
        return None  # the checkpoint is not inside this logger's runs
    if len(relative.parts) < 2:
        return None
    folder = relative.parts[0]
    match = _VERSION.match(folder)
    return int(match.group(1)) if match else folder


def _keep_rows_before(folder: Path, logged: int | None, row: dict[str, Any] | None) -> None:
    """Rewrite ``metrics.csv`` with the rows whose ``step`` is below ``logged`` (all rows when
    unknown) plus ``row`` when its step is missing, and let the logger append to it instead of
    deleting it."""
    path = folder / _METRICS
    header: list[str] = []
    rows: list[dict[str, Any]] = []
    if path.is_file():
        with path.open(newline="") as file:
            reader = csv.DictReader(file)
            header, rows = list(reader.fieldnames or []), list(reader)
    kept = [r for r in rows if logged is None or not _after(r.get("step"), logged)]
    if len(kept) < len(rows):
        os.replace(path, folder / f"{_METRICS}.before-resume")
    elif path.is_file():
        path.unlink()
    if (
        row is not None
        and (logged is None or not _after(str(row["step"]), logged))
        and not any(_same_row(r, row) for r in kept)
    ):
        kept.append(row)  # the checkpoint's batch, logged after the save by a killed run
        header = sorted({*header, *row})  # Lightning's writer keeps its columns sorted
    if kept:
        with path.open("w", newline="") as file:
            writer = csv.DictWriter(file, fieldnames=header)
            writer.writeheader()
            writer.writerows(kept)


def _same_row(kept: dict[str, Any], row: dict[str, Any]) -> bool:
    """Whether ``kept`` is ``row`` as logged: its step, and a value for one of its metrics."""
    try:
        same_step = int(float(kept.get("step") or "")) == int(row["step"])
    except ValueError:
        return False
    return same_step and any(kept.get(k) not in (None, "") for k in row if k not in _KEYS)


def _after(step: str | None, logged: int) -> bool:
    try:
        return int(float(step or "")) >= logged
    except ValueError:
        return False


def open_continued_csv(logger: CSVLogger) -> None:
    """Create the logger's writer over the kept ``metrics.csv`` (Lightning's writer deletes an
    existing file and warns when the folder is not empty), then restore the file and the
    writer's column list so new rows append."""
    path = Path(logger.log_dir) / _METRICS
    kept = path.read_bytes() if path.is_file() else None
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*exists and is not empty.*")
        experiment = logger.experiment
    if kept is None:
        return
    path.write_bytes(kept)
    with path.open(newline="") as file:
        experiment.metrics_keys = list(csv.DictReader(file).fieldnames or [])  # the file's order
