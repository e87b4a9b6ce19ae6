"""LoRA adapters (Hu et al. 2021, arXiv 2106.09685) on a causal LM with peft: the wrap, and the
merged copy that is exported. Within ``with model.disable_adapter():`` (peft) the wrapped model
computes as its base, e.g. DPO's reference, without a second copy of the weights.

peft is an optional dependency (the ``[lora]`` extra); it is imported only when LoRA is asked for.
"""

from __future__ import annotations

import copy
from typing import Any


def lora_wrap(
    model: Any, rank: int, alpha: int, target_modules: str | list[str], *, dropout: float = 0.0
) -> Any:
    """``model`` with peft LoRA adapters of ``rank`` on ``target_modules`` (the base weights
    frozen), or ``model`` itself for rank 0."""
    if rank == 0:
        return model
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as err:
        raise ImportError(
            "lora_rank > 0 needs peft. Fix: pip install 'lit-rlhf[lora]' (or peft), or set "
            "lora_rank: 0 to train every weight."
        ) from err
    config = LoraConfig(
        r=rank, lora_alpha=alpha, target_modules=target_modules, lora_dropout=dropout
    )
    return get_peft_model(model, config)


def merged_copy(model: Any) -> Any:
    """A plain transformers model with the adapters merged into a copy of the base weights
    (``model`` keeps its adapters); ``model`` itself when it is not a peft model."""
    if not callable(getattr(model, "merge_and_unload", None)):
        return model
    return copy.deepcopy(model).merge_and_unload()
