"""LoRA adapters (Hu et al. 2021, arXiv 2106.09685) on a causal LM with peft: the wrap, and the
merged copy that is exported, the merged weights an inference engine serves
(:func:`served_parameters`), and QLoRA's 4-bit base (``quantize``). Within
``with model.disable_adapter():`` (peft) the wrapped model computes as its base, e.g. the
reference of DPO and of the RL modules, without a second copy of the weights.

peft is an optional dependency (the ``[lora]`` extra); it is imported only when LoRA is asked for.
"""

from __future__ import annotations

import copy
import importlib.util
from collections.abc import Iterator
from contextlib import AbstractContextManager, nullcontext
from typing import Any, cast

import torch
from torch import Tensor, nn

from lit_rlhf.models.partitioned import gathered
from lit_rlhf.settings import LoRASettings, Quantize


def lora_wrap(model: Any, lora: LoRASettings) -> Any:
    """``model`` with peft LoRA adapters of ``lora.rank`` on ``lora.target_modules`` (the base
    weights frozen), or ``model`` itself for rank 0."""
    if not lora.enabled:
        return model
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as err:
        raise ImportError(
            "lora.rank > 0 needs peft. Fix: pip install 'lit-rlhf[lora]' (or peft), or set "
            "lora.rank: 0 to train every weight."
        ) from err
    config = LoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,
        target_modules=lora.target_modules,
        lora_dropout=lora.dropout,
    )
    return get_peft_model(model, config)


def merged_copy(model: Any) -> Any:
    """A plain transformers model with the adapters merged into a copy of the base weights
    (``model`` keeps its adapters); ``model`` itself when it is not a peft model."""
    if not callable(getattr(model, "merge_and_unload", None)):
        return model
    return copy.deepcopy(model).merge_and_unload()


_INSTALL_BNB = (
    "Fix: on a CUDA machine `pip install bitsandbytes`, or set lora.quantize: null (LoRA on the "
    "unquantized base)."
)


def check_quantize_supported(quantize: Quantize) -> None:
    """Refuse ``quantize: 4bit`` where bitsandbytes' 4-bit kernels cannot run (no CUDA device,
    or bitsandbytes not installed), before any model loads; a no-op for None."""
    if quantize is None:
        return
    if not torch.cuda.is_available():
        raise RuntimeError(
            "quantize='4bit' (QLoRA) needs a CUDA GPU: bitsandbytes' 4-bit weights run on CUDA "
            "only, and this machine has none. Fix: run on a CUDA machine, or set lora.quantize: "
            "null (LoRA on the unquantized base, which runs on CPU)."
        )
    if importlib.util.find_spec("bitsandbytes") is None:
        raise RuntimeError(f"quantize='4bit' (QLoRA) needs bitsandbytes. {_INSTALL_BNB}")


def quantization_config(quantize: Quantize) -> Any:
    """transformers' ``BitsAndBytesConfig`` for ``quantize`` (QLoRA, Dettmers et al. 2023,
    arXiv 2305.14314: NF4 weights, bf16 compute), None for None."""
    if quantize is None:
        return None
    check_quantize_supported(quantize)
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.bfloat16
    )


def is_lora(model: Any) -> bool:
    """Whether ``model`` is a peft model (it has adapters that can be switched off)."""
    return getattr(model, "peft_config", None) is not None and callable(
        getattr(model, "disable_adapter", None)
    )


def base_model_mode(model: Any) -> AbstractContextManager[Any]:
    """Inside this context ``model`` computes as its base (the adapters off) when it is a peft
    model; a no-op otherwise."""
    return model.disable_adapter() if is_lora(model) else nullcontext()


@torch.no_grad()
def served_parameters(model: nn.Module) -> Iterator[tuple[str, Tensor]]:
    """The (name, tensor) pairs an inference engine serves: ``model.named_parameters()``, or for
    a peft model the base model's names with each adapted weight merged,
    ``W + scaling * B @ A``, computed one layer at a time (no copy of the model); 4-bit base
    weights are dequantized. Under ZeRO-3 each adapted layer's weight and adapters are gathered
    for the merge (every rank must iterate, in the same order)."""
    if not is_lora(model):
        yield from model.named_parameters()
        return
    base = cast(Any, model).get_base_model()
    for name, param in base.named_parameters():
        if ".lora_" in name:
            continue
        if ".base_layer." not in name:
            yield name, _dense(param)
            continue
        owner, _, leaf = name.rpartition(".base_layer.")
        layer = base.get_submodule(owner)
        adapters = [p for n, p in layer.named_parameters() if ".lora_" in f".{n}"]
        with gathered(param, *adapters):  # ZeRO-3: the layer's full weight and adapters
            value = _dense(param).detach().clone()
            if leaf == "weight" and not getattr(layer, "merged", False):
                for adapter in layer.active_adapters:
                    if adapter in layer.lora_A:
                        value = value + layer.get_delta_weight(adapter).to(value.dtype)
        yield f"{owner}.{leaf}", value


def _dense(param: Tensor) -> Tensor:
    """A bitsandbytes 4-bit weight dequantized; any other tensor as it is."""
    quant_state = getattr(param, "quant_state", None)
    if quant_state is None:
        return param
    import bitsandbytes.functional as bnb_functional

    return bnb_functional.dequantize_4bit(param.data, quant_state)
