"""Settings checks and the optional LoRA wrapping of :class:`CompressorDecoderModule`, kept apart
so the module reads as its forward, losses and evaluation."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from lit_rlhf.settings import LoRASettings, PrecisionSettings


def check_compressor_settings(
    hp: Mapping[str, Any], lora: LoRASettings, precision: PrecisionSettings
) -> None:
    """Refuse, before any model loads, a setting that would fail later or silently do nothing
    (the groups check their own fields' ranges)."""
    k, rate, context = hp["num_memory_tokens"], hp["compression_rate"], hp["context_tokens"]
    if k is not None and rate is not None:
        raise ValueError(
            f"set either num_memory_tokens ({k}) or compression_rate ({rate}), not both. Fix: "
            "drop one (num_memory_tokens: null to use the rate)."
        )
    if k is None and (rate is None or context is None):
        raise ValueError(
            "the number of memory tokens is unset: give num_memory_tokens, or compression_rate "
            "together with context_tokens (the data's context length)."
        )
    if k is not None and k < 1:
        raise ValueError(f"num_memory_tokens must be >= 1, got {k}")
    if rate is not None and not rate > 0:
        raise ValueError(f"compression_rate must be > 0, got {rate}")
    if context is not None and context < 1:
        raise ValueError(f"context_tokens must be >= 1, got {context}")
    if rate is not None and context is not None:
        _check_effective_rate(rate, context)
    layers = hp.get("compressor_layers")
    if layers is not None and (isinstance(layers, bool) or layers < 1):
        raise ValueError(
            f"compressor_layers must be >= 1 or None (the whole model), got {layers!r}"
        )
    _check_weights(hp["ae_weight"], hp["lm_weight"])
    if hp["max_new_tokens"] is not None and hp["max_new_tokens"] < 1:
        raise ValueError(f"max_new_tokens must be >= 1 or None, got {hp['max_new_tokens']}")
    precision.refuse_unread("CompressorDecoderModule", reference=False, checkpointing=False)
    lora.refuse_unread("CompressorDecoderModule")


def memory_tokens(rate: float, context_tokens: int) -> int:
    """``k = ceil(context_tokens / rate)`` memory tokens for a compression rate."""
    return max(1, math.ceil(context_tokens / rate))


def _check_effective_rate(rate: float, context_tokens: int) -> None:
    k = memory_tokens(rate, context_tokens)
    effective = context_tokens / k
    if not math.isclose(effective, rate, rel_tol=1e-6):
        raise ValueError(
            f"compression_rate={rate:g} on context_tokens={context_tokens} gives "
            f"{k} memory token(s), an effective rate of {effective:g}, not {rate:g}. Fix: "
            f"choose context_tokens a multiple of the rate (e.g. {math.ceil(rate) * k}), a rate "
            f"that divides context_tokens, or set num_memory_tokens directly."
        )


def check_data_context(
    context_tokens: int | None, k: int, rate: float | None, sources: dict[str, Any]
) -> None:
    """Refuse a data source whose ``context_tokens`` (``TextChunks``) differs from the
    module's: the compressor's context length has one value (the module's, checked here in
    ``setup`` against every source of the DataModule that has one)."""
    for stage, source in sources.items():
        data_context = getattr(source, "context_tokens", None)
        if not isinstance(data_context, int) or data_context == context_tokens:
            continue
        if context_tokens is None and rate is None:  # num_memory_tokens alone: any length
            continue
        asked = f"compression_rate={rate:g} " if rate is not None else ""
        raise ValueError(
            f"the {stage} data's context_tokens={data_context} differs from the module's "
            f"context_tokens={context_tokens} ({asked}-> {k} memory tokens, an effective rate "
            f"of {data_context / k:g} on this data). Fix: set model.init_args.context_tokens "
            f"to {data_context}, or the data's to {context_tokens}."
        )


def _check_weights(ae: float, lm: float) -> None:
    if not (0 <= ae < math.inf and 0 <= lm < math.inf) or ae + lm == 0:
        raise ValueError(
            f"the loss weights must be >= 0 and not both 0; got ae_weight={ae}, lm_weight={lm}. "
            "Fix: ae_weight: 1.0 (reconstruction) and/or lm_weight > 0 (continuation)."
        )
