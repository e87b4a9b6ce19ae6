"""Per-row records of a judge's validation and test: what each held-out row got, kept beside the
logged accuracy, so that an analysis can read the errors or resample the rows (a pair-clustered
interval needs each row's outcome, which an accuracy alone does not keep)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lightning import Callback


class JudgmentRecords(Callback):
    """Writes ``<dirpath>/<stage>_epoch<N>.jsonl`` at the end of every validation (``val``) and
    test (``test``) epoch: one JSON line per row the module's step returned under
    ``"judgments"`` (:class:`~lit_rlhf.modules.GenerativeRewardModule`: ``query_id``,
    ``family``, gold ``label``, ``verdict``, ``votes``, ``right``). Under data parallelism each
    process writes the rows it judged, its rank in the name (``val_epoch0.rank1.jsonl``).
    Sanity-check epochs are not written. A module whose steps return no ``judgments`` is refused
    at its first batch.

    Args:
        dirpath: the folder the files go to (created when first written).
    """

    def __init__(self, dirpath: str) -> None:
        if not str(dirpath):
            raise ValueError("dirpath must name a folder for the judgment records")
        self.dirpath = Path(dirpath)
        self._rows: list[dict[str, Any]] = []

    def _collect(self, pl_module: Any, outputs: Any) -> None:
        if not isinstance(outputs, dict) or "judgments" not in outputs:
            raise TypeError(
                f"JudgmentRecords: {type(pl_module).__name__}'s validation/test step returned "
                f"{type(outputs).__name__}, not a dict with 'judgments' (a list of per-row "
                "records). Fix: use it with GenerativeRewardModule, or return "
                "{'judgments': [...]} from your module's step."
            )
        self._rows.extend(dict(row) for row in outputs["judgments"])

    def _write(self, trainer: Any, stage: str) -> None:
        if trainer.sanity_checking:
            self._rows = []
            return
        rank = f".rank{trainer.global_rank}" if trainer.world_size > 1 else ""
        self.dirpath.mkdir(parents=True, exist_ok=True)
        path = self.dirpath / f"{stage}_epoch{trainer.current_epoch}{rank}.jsonl"
        path.write_text("".join(json.dumps(row, default=str) + "\n" for row in self._rows))
        self._rows = []

    def on_validation_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self._rows = []

    def on_validation_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                                batch_idx: int, dataloader_idx: int = 0) -> None:  # fmt: skip
        self._collect(pl_module, outputs)

    def on_validation_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        self._write(trainer, "val")

    def on_test_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self._rows = []

    def on_test_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                          batch_idx: int, dataloader_idx: int = 0) -> None:  # fmt: skip
        self._collect(pl_module, outputs)

    def on_test_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        self._write(trainer, "test")
