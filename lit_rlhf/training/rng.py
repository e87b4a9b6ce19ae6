"""The global random number generators (torch CPU and the current CUDA device, Python's
``random``, NumPy's) as training state: in checkpoints, and carried from one training batch to
the next, so that a resumed run samples what the uninterrupted run would have sampled.
Generation engines draw from torch's global generator (``generate``'s sampling, the decode
loop's ``torch.rand``), and Lightning's checkpoints do not hold it: without this a resumed run
trains on other samples from its first rollout on.

:class:`GlobalRNGState` (a callback; the modules add it themselves through
``configure_callbacks``) makes each training batch start from the states the previous one ended
with. What runs between two batches and draws from the generators (a validation that samples,
the loaders' iterators at a new epoch or validation, the sanity check of a resumed run) then
does not move the training stream: a checkpoint taken at the end of a batch, before such a
validation or at the end of an epoch, holds exactly the states the next batch starts from.

Each rank of a multi-process run keeps its own states: Lightning collects callback state on
every rank, the states are gathered there, and each rank takes back its own on resume (a resume
on another number of ranks takes rank 0's on every rank).
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch
from lightning import Callback
from typing_extensions import override


def rng_states() -> dict[str, Any]:
    """This process's global generator states: torch (CPU and, when initialised, the current
    CUDA device), Python's ``random`` and NumPy's."""
    states: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": _numpy_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["torch.cuda"] = torch.cuda.get_rng_state()
    return states


def _numpy_state() -> dict[str, Any]:
    """NumPy's state with its key as a tensor: checkpoints stay loadable with
    ``torch.load(weights_only=True)``, which refuses NumPy arrays."""
    state: dict[str, Any] = np.random.get_state(legacy=False)
    key = torch.from_numpy(state["state"]["key"].astype(np.int64))
    return {**state, "state": {"key": key, "pos": int(state["state"]["pos"])}}


def set_rng_states(states: dict[str, Any]) -> None:
    """The reverse of :func:`rng_states` (a CUDA state only where CUDA is initialised)."""
    torch.set_rng_state(states["torch"])
    random.setstate(states["python"])
    numpy_state = states["numpy"]
    key = numpy_state["state"]["key"].numpy().astype(np.uint32)
    np.random.set_state({**numpy_state, "state": {**numpy_state["state"], "key": key}})
    if "torch.cuda" in states and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.set_rng_state(states["torch.cuda"])


def _gather(states: dict[str, Any]) -> list[dict[str, Any]]:
    """Every rank's states, in rank order (one process: ``[states]``)."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return [states]
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, states)
    return gathered


def _rank() -> int:
    dist = torch.distributed
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


class GlobalRNGState(Callback):
    """Carries the global generator states across the gaps between training batches and
    through checkpoints (see the module docstring). Add it to any Trainer; lit-rlhf's modules
    return it from ``configure_callbacks``."""

    def __init__(self) -> None:
        self.between_batches: dict[str, Any] | None = None  # None: inside a batch, or no batch yet

    @override
    def on_train_batch_start(
        self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int
    ) -> None:
        if self.between_batches is not None:
            set_rng_states(self.between_batches)
            self.between_batches = None

    @override
    def on_train_batch_end(self, trainer: Any, pl_module: Any, *args: Any) -> None:
        self.between_batches = rng_states()

    @override
    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self.between_batches = None  # another fit of the same module starts from its own seed

    @override
    def state_dict(self) -> dict[str, Any]:
        """Every rank's states where the next batch starts (called on every rank)."""
        states = self.between_batches if self.between_batches is not None else rng_states()
        return {"ranks": _gather(states)}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """This rank's states, set when the first training batch starts."""
        ranks = state_dict.get("ranks")
        if ranks:
            rank = _rank()
            self.between_batches = ranks[rank] if rank < len(ranks) else ranks[0]
