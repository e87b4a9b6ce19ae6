"""FSDP2 sharding of the trained networks, shared by every module that builds its networks in
``configure_model`` (under Lightning's ``ModelParallelStrategy`` the module applies
``fully_shard`` itself; the strategy does not wrap).

Each decoder block (the classes a transformers model names in ``_no_split_modules``) becomes
its own FSDP2 unit, then (for a LoRA policy) the transformers model inside peft's wrapper, then
the network's root (embeddings, final norm, LM / value head). A LoRA policy's frozen base and
its adapters are sharded alike (FSDP2 allows frozen and trained parameters in one unit). Parameters
become DTensors sharded along dimension 0 over the data-parallel mesh; every forward all-gathers
one unit at a time, backward reduce-scatters (averages) the gradients. Frozen networks (PPO's
reference policy) are not passed here: they stay whole on every rank, as under DDP.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from lit_rlhf.strategies.fsdp2 import is_fsdp2


def decoder_blocks(network: nn.Module) -> list[nn.Module]:
    """The submodules of ``network`` whose class a transformers model lists in
    ``_no_split_modules`` (its decoder layers), outermost first; empty for other networks."""
    names: set[str] = set()
    for module in network.modules():
        names.update(getattr(module, "_no_split_modules", None) or ())
    return [m for m in network.modules() if type(m).__name__ in names and m is not network]


def shard_networks(strategy: Any, *networks: nn.Module | None) -> None:
    """``fully_shard`` each decoder block, then the root, of every trained network (None is
    skipped) on the strategy's data-parallel mesh; nothing unless ``strategy`` is a
    ``ModelParallelStrategy``."""
    if not is_fsdp2(strategy):
        return
    from torch.distributed.fsdp import fully_shard

    mesh = strategy.device_mesh["data_parallel"]
    for network in networks:
        if network is None:
            continue
        for block in decoder_blocks(network):
            fully_shard(block, mesh=mesh)
        inner = generating_models(network)
        for model in inner:
            fully_shard(model, mesh=mesh)
        fully_shard(network, mesh=mesh)
        if inner:  # the wrapper is the root, whichever forward or generate comes first
            root: Any = network
            root._get_fsdp_state()._lazy_init()


def generating_models(network: nn.Module) -> list[nn.Module]:
    """The transformers models inside peft wrappers of ``network``: peft's ``generate`` calls
    the wrapped model's ``generate``, bypassing the wrapper's forward, so the wrapped model is
    an FSDP2 unit of its own (its hooks gather the embeddings and head before each call)."""
    wrappers: list[Any] = [m for m in network.modules() if hasattr(m, "peft_config")]
    return [m.get_base_model() for m in wrappers if hasattr(m, "get_base_model")]
