"""The train loader's saved position, put back as the uninterrupted run would have it: at an
epoch's end, and at another number of processes.

Lightning (2.6) puts a stateful loader's saved position back whenever it restarts. For a
checkpoint taken at the last training batch of an epoch (a step checkpoint that falls there, or
one taken at the epoch's end) that position is the spent epoch's: at the end of its order (a
full epoch) the next epoch yields no batch at all and the run loses it; a few batches in (an
epoch cut short by ``limit_train_batches``) the next epoch goes on with the old epoch's order
instead of its own. The checkpoint says which case it is (the batch progress's
``is_last_batch``); the position is dropped then, before Lightning restores its loops, and the
next epoch starts with a fresh loader (its order depends on the seed and the epoch only).

A resume on another number of processes (``world_size``, which every checkpoint records): the
saved position (rank 0's, given to every rank) counts the samples one rank took. Lightning's
distributed sampler deals an epoch's order to the ranks in turn, so ``W`` ranks that took ``n``
samples each took the first ``W * n`` rows of the order; the count is rescaled to
``W * n / W'`` per rank and the run continues mid-epoch with the next unseen rows. (With
lit-rlhf's global batch sizes the steps then hold the same rows as before; a per-process batch
size changes with the world size, as it does without a resume.) A loader with worker processes
(``num_workers > 0``) saves per-worker snapshots that do not rescale: such a mid-epoch
checkpoint is refused at another world size, naming the fix (an epoch-end checkpoint, the same
world size, or ``num_workers: 0``).
"""

from __future__ import annotations

from typing import Any

from lightning import Callback
from typing_extensions import override

WORLD_SIZE_KEY = "world_size"


class EpochEndLoaderReset(Callback):
    """Drops the train loader's position from a checkpoint taken at the last batch of an epoch,
    and rescales a mid-epoch position to another world size (see the module docstring)."""

    @override
    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        checkpoint[WORLD_SIZE_KEY] = int(trainer.world_size)

    @override
    def on_load_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        fit_loop = checkpoint.get("loops", {}).get("fit_loop", {})
        loop_state = fit_loop.get("state_dict", {})
        if fit_loop.get("epoch_loop.batch_progress", {}).get("is_last_batch"):
            loop_state.pop("combined_loader", None)
            return
        saved, now = checkpoint.get(WORLD_SIZE_KEY), int(trainer.world_size)
        if saved is None or int(saved) == now or not loop_state.get("combined_loader"):
            return
        loop_state["combined_loader"] = [
            rescaled_position(state, int(saved), now) for state in loop_state["combined_loader"]
        ]


def rescaled_position(state: Any, saved: int, now: int) -> Any:
    """A ``StatefulDataLoader`` state of one rank at world size ``saved`` as the state of one
    rank at ``now``: the per-rank sample count scaled by ``saved / now`` (the count of batches
    stays). Refuses a state that cannot be rescaled (worker snapshots, an uneven split)."""
    sampler_state = state.get("_sampler_iter_state") if isinstance(state, dict) else None
    yielded = sampler_state.get("samples_yielded") if isinstance(sampler_state, dict) else None
    fix = (
        "Fix: resume from a checkpoint taken at an epoch's end, on the same number of processes "
        f"({saved}), or with the data module's num_workers: 0"
    )
    if not isinstance(yielded, int) or set(sampler_state or ()) != {"samples_yielded"}:
        raise ValueError(
            f"the checkpoint was written by {saved} processes in the middle of an epoch, and its "
            f"train loader position (a loader with worker processes, or a sampler of its own) "
            f"cannot be mapped to {now} processes. {fix}."
        )
    if (yielded * saved) % now:
        raise ValueError(
            f"the checkpoint's train loader position ({yielded} samples per process at {saved} "
            f"processes) does not split evenly over {now} processes. {fix}."
        )
    return {**state, "_sampler_iter_state": {"samples_yielded": yielded * saved // now}}
