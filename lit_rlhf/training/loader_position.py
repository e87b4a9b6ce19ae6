"""A resume from a checkpoint taken at the last training batch of an epoch starts the next epoch
with a fresh train loader, as the uninterrupted run does.

Lightning (2.6) puts a stateful loader's saved position back whenever it restarts. For a
checkpoint taken at an epoch's last batch (a step checkpoint that falls there, or one taken at
the epoch's end) that position is the spent epoch's: at the end of its order (a full epoch) the
next epoch yields no batch at all and the run loses it; a few batches in (an epoch cut short by
``limit_train_batches``) the next epoch goes on with the old epoch's order instead of its own.
The checkpoint says which case it is (the batch progress's ``is_last_batch``); this drops the
position then, before Lightning restores its loops.
"""

from __future__ import annotations

from typing import Any

from lightning import Callback
from typing_extensions import override


class EpochEndLoaderReset(Callback):
    """Drops the train loader's position from a checkpoint taken at the last batch of an epoch
    (see the module docstring); a mid-epoch checkpoint keeps it."""

    @override
    def on_load_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        fit_loop = checkpoint.get("loops", {}).get("fit_loop", {})
        if fit_loop.get("epoch_loop.batch_progress", {}).get("is_last_batch"):
            fit_loop.get("state_dict", {}).pop("combined_loader", None)
