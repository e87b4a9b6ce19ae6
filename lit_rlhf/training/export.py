"""The end-of-fit export of a trained model as a Hugging Face folder that ``transformers`` (and
every module's ``model:`` setting) loads back: ``save_pretrained`` of the model and its tokenizer.

Under DeepSpeed ZeRO-3 each rank holds a partition of every parameter, so the full weights are
gathered one parameter at a time (every rank in the same order, as the collective needs) and
rank 0 writes them; under any other strategy ``save_pretrained`` reads the model itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import Tensor, nn

from lit_rlhf.rollout.weight_sync import gathered
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
        model.save_pretrained(str(export_dir), state_dict=state)
        tokenizer.save_pretrained(str(export_dir))
    trainer.strategy.barrier()
    return True


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
