"""Tensor-parallel colocated vLLM: ``k`` training ranks act as one vLLM engine, through vLLM's
external launcher, without extra processes.

The ranks of a run (Lightning's, under torchrun, Slurm or its own launcher) are cut into groups
of ``k`` consecutive ranks (``0..k-1``, ``k..2k-1``, ...). Every rank builds
``vllm.LLM(tensor_parallel_size=k, distributed_executor_backend="external_launcher",
data_parallel_size=world // k)``: vLLM joins the torch.distributed world the trainer set up
(``RANK``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``), each rank holds ``1/k`` of the
weights, and the ``k`` engines of a group run the same requests in lock-step (vLLM's scheduling
is deterministic), so they produce the same outputs. For each ``generate`` a group gathers the
requests of its ranks (:meth:`TensorParallelGroup.gather`, token ids with each request's own
seed and token budget), every rank of the group generates the union, and each rank keeps the
slice of its own requests. One engine seed per group (``seed + group index``): groups sample
differently where requests carry no seed of their own.

The weight push needs nothing new: every rank pushes the full weights into its own vLLM worker
(``reload_weights`` takes full tensors and each worker keeps its shard), bucket by bucket as
with ``k = 1``.

The calls are collectives of the group: every rank of a group must call ``generate`` the same
number of times (Lightning's samplers give every rank the same number of batches).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist


@dataclass(frozen=True)
class Request:
    """One generation request as a group gathers it: prompt token ids, the request's seed
    (``None``: the engine's generator) and its token budget."""

    prompt_token_ids: list[int]
    seed: int | None
    max_tokens: int


class TensorParallelGroup:
    """This rank's group of ``size`` consecutive ranks (see the module docstring). Building it
    is a collective over every rank (``new_subgroups_by_enumeration``)."""

    def __init__(self, size: int) -> None:
        if not (dist.is_available() and dist.is_initialized()):
            raise ValueError(
                f"tensor_parallel_size={size} shares one vLLM engine among {size} training "
                "ranks, and this process runs alone (no torch.distributed process group). Fix: "
                f"launch at least {size} processes (trainer.devices / torchrun), or set "
                "tensor_parallel_size: 1."
            )
        world, rank = dist.get_world_size(), dist.get_rank()
        if world % size:
            raise ValueError(
                f"tensor_parallel_size={size} does not divide the {world} training ranks. Fix: "
                f"a divisor of {world}, so that every rank belongs to one group."
            )
        self.size, self.world = size, world
        self.index, self.position = divmod(rank, size)
        layout = [list(range(g * size, (g + 1) * size)) for g in range(world // size)]
        self.group, _ = dist.new_subgroups_by_enumeration(layout)

    def gather(
        self, requests: list[Request], flags: tuple[Any, ...]
    ) -> tuple[list[Request], slice]:
        """The requests of every rank of the group, in rank order, and the slice of the union
        that holds this rank's. ``flags`` (greedy, log-probs) must be the same on every rank of
        the group: their engines run one batch."""
        gathered: list[Any] = [None] * self.size
        dist.all_gather_object(gathered, (flags, requests), group=self.group)
        if any(other != flags for other, _ in gathered):
            raise ValueError(
                f"the ranks of a tensor-parallel vLLM group asked for different kinds of "
                f"generation at once ((greedy, log_probs): {[f for f, _ in gathered]}). Fix: every "
                "rank of a group must make the same generate calls in the same order."
            )
        start = sum(len(reqs) for _, reqs in gathered[: self.position])
        union = [request for _, reqs in gathered for request in reqs]
        return union, slice(start, start + len(requests))

    def llm_arguments(self, seed: int) -> dict[str, Any]:
        """``vllm.LLM`` arguments for this group's engine; sets the environment variables vLLM's
        external launcher reads where the trainer's launcher did not (Lightning's own launcher
        sets no ``RANK``)."""
        os.environ.setdefault("RANK", str(dist.get_rank()))
        os.environ.setdefault("LOCAL_RANK", "0")  # Lightning sets it for every rank it starts
        os.environ.setdefault("WORLD_SIZE", str(self.world))
        return {
            "tensor_parallel_size": self.size,
            "distributed_executor_backend": "external_launcher",
            "data_parallel_size": self.world // self.size,
            "seed": seed + self.index,
        }
