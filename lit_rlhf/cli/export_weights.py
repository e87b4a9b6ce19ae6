"""The weights ``lit-rlhf export`` reads from ``--ckpt_path``: a Lightning checkpoint file
(``weights_only=True``, memory-mapped), a DeepSpeed checkpoint folder, ZeRO-2 or ZeRO-3
(DeepSpeed's ``zero_to_fp32`` joins the partitions into float32 weights on CPU), or an FSDP2
distributed-checkpoint folder (torch DCP joins the shards of any number of ranks in this one
process, in the dtype they were saved in), and the check
that they are the weights of the network this config builds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from lightning import LightningModule
from torch import Tensor, nn

import lit_rlhf.cli.checkpoints as ckpt
from lit_rlhf.models.checkpoint_weights import WeightMismatch

# Lightning wraps the LightningModule in the DeepSpeed engine under this attribute
_DEEPSPEED_PREFIX = "_forward_module."


def read_checkpoint(path: str) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """``(state_dict, hyper_parameters)`` of a checkpoint file or DeepSpeed folder; an unreadable
    one is refused naming the path and the cause (:mod:`lit_rlhf.cli.checkpoints`)."""
    target = Path(path)
    if target.is_dir():
        hparams = ckpt.read_hparams(path)  # checks the folder's layout (latest, tag, states)
        if ckpt.is_dcp(target):
            return dcp_state_dict(target), hparams
        return deepspeed_state_dict(target), hparams
    try:
        checkpoint = torch.load(target, weights_only=True, map_location="cpu", mmap=True)
    except Exception:
        ckpt.read_hparams(path)  # raises the named error for an unreadable file
        raise
    state = checkpoint.get("state_dict") if isinstance(checkpoint, dict) else None
    if not state:
        raise ckpt.CheckpointError(
            f"--ckpt_path {path}: holds no 'state_dict' (not a Lightning checkpoint of a module). "
            "Fix: pass a .ckpt file a lit-rlhf run wrote, or its DeepSpeed checkpoint folder."
        )
    return dict(state), dict(checkpoint.get("hyper_parameters") or {})


def deepspeed_state_dict(folder: Path) -> dict[str, Tensor]:
    """The module's full float32 weights from a DeepSpeed ZeRO-2/3 checkpoint folder (the tag
    its ``latest`` file names), keys as in the LightningModule's ``state_dict``."""
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    state = get_fp32_state_dict_from_zero_checkpoint(str(folder))
    return {key.removeprefix(_DEEPSPEED_PREFIX): value for key, value in state.items()}


def dcp_state_dict(folder: Path) -> dict[str, Tensor]:
    """The module's full weights from a DCP folder (Lightning saves them under ``state_dict``),
    read without a process group (DCP then loads every shard into this process)."""
    import warnings

    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys

    with warnings.catch_warnings():  # "assuming the intent is to load in a single process"
        warnings.filterwarnings("ignore", message=".*single process.*", category=UserWarning)
        loaded = _load_state_dict_from_keys({"state_dict"}, checkpoint_id=str(folder))
    return dict(loaded["state_dict"])


def network_name(module: nn.Module, network: nn.Module) -> str:
    """The attribute path of ``network`` inside ``module`` (e.g. ``policy``)."""
    for name, child in module.named_modules():
        if child is network and name:
            return name
    raise ValueError(
        f"{type(module).__name__}.export_network() returned a network that is not one of its "
        "submodules: its weights cannot be found in the checkpoint."
    )


def load_network_weights(
    module: LightningModule, network: nn.Module, state: dict[str, Tensor], path: str
) -> str:
    """Load the checkpoint's weights of ``network`` (a submodule of ``module``) into it and
    return its attribute name. Every trainable tensor must be there with its shape; frozen
    parameters a checkpoint leaves out (a LoRA base) keep the values they were built with.
    Weights of other networks (a critic, a reference) are not read."""
    name = network_name(module, network)
    prefix = f"{name}."
    own = {k: v for k, v in module.state_dict().items() if k.startswith(prefix)}
    saved = {k: v for k, v in state.items() if k.startswith(prefix)}
    frozen = {n for n, p in module.named_parameters(remove_duplicate=False) if not p.requires_grad}
    mismatch = WeightMismatch.between(own, saved, allowed_missing=frozen)
    if mismatch:
        raise ckpt.CheckpointError(
            f"--ckpt_path {path}: its weights are not those of the {type(module).__name__}.{name} "
            f"the config builds ({mismatch}). Fix: export with the --config files (and "
            "--model.* overrides, e.g. model, lora_rank) of the run that wrote the checkpoint."
        )
    module.load_state_dict(saved, strict=False)
    return name
