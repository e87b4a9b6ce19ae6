"""The end-of-fit export of a trained model as a Hugging Face folder that ``transformers`` (and
every module's ``model:`` setting) loads back: ``save_pretrained`` of the model and its tokenizer.

Under DeepSpeed ZeRO-3 each rank holds a partition of every parameter, so the full weights are
gathered one parameter at a time (every rank in the same order, as the collective needs) and
rank 0 writes them; under any other strategy ``save_pretrained`` reads the model itself.

The same writer serves ``lit-rlhf export`` (:mod:`lit_rlhf.cli_export`): a module names the
network it exports with :class:`ExportableModule`, and :func:`save_network` writes it with LoRA
adapters merged into the weights or kept as a peft adapter folder.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

import torch
from torch import Tensor, nn

from lit_rlhf.models.lora import is_lora, merged_copy
from lit_rlhf.models.partitioned import gathered
from lit_rlhf.strategies import is_deepspeed


def export_pretrained(
    trainer: Any, model: Any, tokenizer: Any, export_dir: str | Path | None
) -> bool:
    """Save ``model`` and ``tokenizer`` to ``export_dir`` with ``save_pretrained``, from
    ``on_fit_end`` (every rank calls it: ZeRO-3 gathers). Nothing is written when
    ``export_dir`` is None or the run is a ``fast_dev_run`` (a smoke run). Returns whether the
    folder was written (on any rank)."""
    if export_dir is None or getattr(trainer, "fast_dev_run", False):
        return False
    state = full_state_dict(trainer, model)
    if trainer.is_global_zero:
        write_pretrained(model, tokenizer, export_dir, state_dict=state)
    trainer.strategy.barrier()
    return True


def write_pretrained(
    model: Any, tokenizer: Any, out: str | Path, *, state_dict: dict[str, Tensor] | None = None
) -> None:
    """``save_pretrained`` of ``model`` (with ``state_dict`` when given: gathered weights) and of
    ``tokenizer`` (its chat template included) into ``out``; a peft model writes its adapters."""
    model.save_pretrained(str(out), state_dict=state_dict)
    tokenizer.save_pretrained(str(out))


LoraExport = Literal["merged", "adapter"]
ExportDtype = Literal["float32", "bfloat16", "float16"]


@runtime_checkable
class ExportableModule(Protocol):
    """A LightningModule that ``lit-rlhf export`` can write: it names its exported network."""

    def export_network(self) -> tuple[nn.Module, Any]:
        """The network written as a transformers folder (a peft model when it has LoRA
        adapters) and its tokenizer; critics, value heads and references are not exported."""
        ...


def save_network(
    network: nn.Module,
    tokenizer: Any,
    out: str | Path,
    *,
    lora: LoraExport = "merged",
    dtype: ExportDtype | None = None,
    base_model: str | None = None,
) -> None:
    """Write ``network`` and ``tokenizer`` to ``out`` (one process, full weights in memory).

    ``lora="merged"``: the adapters merged into a copy of the base weights (a plain
    transformers folder); ``"adapter"``: peft's adapter folder (``adapter_config.json`` and the
    adapter weights; the base is the one the run started from). ``dtype`` casts a copy of the
    written weights (None: as trained). ``base_model``: the base model's name as the run gave it
    (a hub id, ``builtin:<name>``, a folder), written into an adapter folder's
    ``adapter_config.json`` in place of the path it was loaded from (a hub cache path, which
    makes the folder usable on this machine only). ``network`` itself is left unchanged."""
    if lora == "adapter" and not is_lora(network):
        raise ValueError(
            "lora='adapter' for a network without LoRA adapters. Fix: lora='merged' (the default)."
        )
    written = merged_copy(network) if lora == "merged" else network
    if dtype is not None:
        written = copy.deepcopy(written) if written is network else written
        written = written.to(getattr(torch, dtype))
    write_pretrained(written, tokenizer, out)
    config = Path(out) / "adapter_config.json"
    if lora == "adapter" and base_model is not None and config.is_file():
        settings = json.loads(config.read_text())
        settings["base_model_name_or_path"] = base_model
        config.write_text(json.dumps(settings, indent=2, sort_keys=True) + "\n")


def full_state_dict(trainer: Any, model: nn.Module) -> dict[str, Tensor] | None:
    """The whole model's weights on CPU for rank 0 under DeepSpeed (None elsewhere, and None
    without DeepSpeed: ``save_pretrained`` then reads the model itself). A ZeRO-3 partition is
    gathered one parameter at a time, every rank in the same order."""
    if not is_deepspeed(trainer.strategy):
        return None
    state: dict[str, Tensor] = {}
    for name, param in model.named_parameters():
        with gathered(param):
            if trainer.is_global_zero:
                state[name] = param.detach().to("cpu", copy=True)
    for name, buffer in model.named_buffers():
        state[name] = buffer.detach().to("cpu", copy=True)
    return state if trainer.is_global_zero else None
