"""FSDP2 (``torch.distributed.fsdp.fully_shard``) through Lightning's ``ModelParallelStrategy``,
with the data-parallel size equal to the world size.

Lightning's strategy sizes its ``auto`` device mesh as data-parallel = number of nodes and
tensor-parallel = processes per node: on one node nothing would be sharded by the data-parallel
dimension and every rank would get the same batches. This subclass fixes the mesh at
(world size, 1): every rank is a data-parallel replica of its own batches, and the trained
networks are sharded over all ranks (``lit_rlhf.training.sharding.shard_networks``, called where
the modules build their networks: under this strategy the LightningModule applies
``fully_shard`` itself, the strategy does not wrap). Lightning picks gloo on CPU and NCCL on
CUDA; checkpoints are torch distributed-checkpoint (DCP) folders, written atomically: every rank
writes into a hidden ``.<name>.partial`` folder beside the target, which replaces the target
only once all ranks are done (:func:`lit_rlhf.strategies.folders.replace_path`), so a run
killed during a save leaves the previous checkpoint whole. DCP folders reshard on load: a
checkpoint written by N ranks resumes on M (weights and optimizer state; the data position as
:mod:`lit_rlhf.training.loader_position` says) and ``lit-rlhf export`` reads it in one process.
The folder must be on a filesystem every rank sees (as DCP requires).

YAML (a trainer fragment, see ``configs/trainer/fsdp2.yaml`` / ``cpu_fsdp2.yaml``)::

    trainer:
      strategy:
        class_path: lit_rlhf.strategies.FSDP2Strategy
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from lightning.fabric.utilities.types import _PATH
from lightning.pytorch.strategies import ModelParallelStrategy
from torch import nn
from typing_extensions import override

from lit_rlhf.strategies.folders import remove_path, replace_path


class FSDP2Strategy(ModelParallelStrategy):
    """Lightning's :class:`~lightning.pytorch.strategies.ModelParallelStrategy` with a
    (world size x 1) mesh: data parallelism (FSDP2 sharding) over every rank, no tensor
    parallelism. Takes the parent's other arguments (``save_distributed_checkpoint``,
    ``process_group_backend``, ``timeout``) by name."""

    strategy_name = "fsdp2"

    def __init__(self, **kwargs: Any) -> None:
        for name in ("data_parallel_size", "tensor_parallel_size"):
            if name in kwargs:
                raise ValueError(
                    f"FSDP2Strategy sets {name} itself (data-parallel size = world size, "
                    "tensor-parallel size 1). Fix: remove it from the strategy's init_args, or "
                    "use lightning.pytorch.strategies.ModelParallelStrategy for a 2-D mesh."
                )
        super().__init__(data_parallel_size="auto", tensor_parallel_size=1, **kwargs)

    @override
    def setup_environment(self) -> None:
        # the world size is known once the cluster environment is set (before the mesh is built)
        self._data_parallel_size = self.num_nodes * self.num_processes
        super().setup_environment()

    @override
    def save_checkpoint(
        self, checkpoint: dict[str, Any], filepath: _PATH, storage_options: Any | None = None
    ) -> None:
        """Lightning's save into a staging folder that replaces ``filepath`` when every rank has
        written its shards (see the module docstring); a full-state file (``save_distributed_
        checkpoint=False``) is Lightning's, through the CheckpointIO."""
        if not self._save_distributed_checkpoint:
            return super().save_checkpoint(checkpoint, filepath, storage_options)
        path = Path(self.broadcast(str(filepath)))
        staging = path.with_name(f".{path.name}.partial")
        if self.global_rank == 0:
            remove_path(staging)  # a save cut short earlier
        self.barrier("lit_rlhf_dcp_staging")
        super().save_checkpoint(checkpoint, staging, storage_options)
        self.barrier("lit_rlhf_dcp_written")
        if self.global_rank == 0:
            replace_path(staging, path)
        self.barrier("lit_rlhf_dcp_replaced")

    @override
    def load_checkpoint(self, checkpoint_path: _PATH, weights_only: bool | None = None) -> Any:
        """Lightning's load, with the module's frozen networks (PPO's reference: every parameter
        frozen, none a DTensor) set aside: the modules leave them out of their checkpoints and
        rebuild them from their source, while Lightning's distributed-checkpoint load asks the
        folder for every key of the module."""
        assert self.lightning_module is not None
        with _frozen_children_set_aside(self.lightning_module):
            return super().load_checkpoint(Path(checkpoint_path), weights_only)


@contextmanager
def _frozen_children_set_aside(module: nn.Module) -> Iterator[None]:
    frozen = {
        name: child
        for name, child in module.named_children()
        if any(True for _ in child.parameters())
        and not any(p.requires_grad for p in child.parameters())
    }
    for name in frozen:
        del module._modules[name]
    try:
        yield
    finally:
        module._modules.update(frozen)


def is_fsdp2(strategy: Any) -> bool:
    """Whether ``strategy`` is Lightning's ``ModelParallelStrategy`` (this subclass included):
    the LightningModule shards its networks with ``fully_shard`` in ``configure_model``."""
    return isinstance(strategy, ModelParallelStrategy)
