"""A callback for the global-batch tests: what each process trained on. Importable by runs in
other processes (``--trainer.callbacks+=tests.distributed.batch_probe.BatchSizes
--trainer.callbacks.path=OUT``); every rank writes ``OUT.rank<r>.json`` at the end of ``fit``:
its world size, the prompts of each training batch, the per-process mini-batch (sequences) the
module stepped on, the optimizer steps taken and the data module's per-process batch size."""

from __future__ import annotations

import json
from typing import Any

from lightning import Callback


class BatchSizes(Callback):
    def __init__(self, path: str) -> None:
        self.path = path
        self.batches: list[int] = []

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, *args: Any) -> None:
        self.batches.append(len(batch["prompt"]))

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        update = pl_module.settings.update
        seen = {
            "world_size": trainer.world_size,
            "batches": self.batches,
            "mini_batch_size": update.mini_batch_size,
            "global_mini_batch_size": update.global_mini_batch_size,
            "global_step": trainer.global_step,
            "data_batch_size": trainer.datamodule.batch_size,
        }
        with open(f"{self.path}.rank{trainer.global_rank}.json", "w") as f:
            json.dump(seen, f)
