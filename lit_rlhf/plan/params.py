"""Parameter counts from an :class:`~lit_rlhf.plan.architectures.Architecture`: the transformers
model built from its config on the meta device (no memory, no weights), its parameters counted
(tied embeddings once)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Literal

import torch

from lit_rlhf.plan.architectures import Architecture

Head = Literal["causal_lm", "trunk", "critic", "sequence_classification"]
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class Counts:
    total: int  # parameters (a tied embedding once)
    largest_layer: int  # the largest module's own parameters (DeepSpeed's ZeRO-3 estimator)


def hf_config(arch: Architecture) -> object:
    """The transformers config class of ``arch.model_type`` with the table's numbers."""
    from transformers import AutoConfig

    extra = {} if arch.head_dim is None else {"head_dim": arch.head_dim}
    return AutoConfig.for_model(
        arch.model_type,
        hidden_size=arch.hidden_size,
        num_hidden_layers=arch.num_hidden_layers,
        num_attention_heads=arch.num_attention_heads,
        num_key_value_heads=arch.num_key_value_heads,
        intermediate_size=arch.intermediate_size,
        vocab_size=arch.vocab_size,
        tie_word_embeddings=arch.tie_word_embeddings,
        num_labels=1,
        **extra,
    )


@functools.lru_cache(maxsize=64)
def counts(arch: Architecture, head: Head = "causal_lm") -> Counts:
    """Parameters of ``arch`` with ``head``: ``causal_lm`` (the LM head; tied: no extra),
    ``trunk`` (no head: an embedder), ``critic`` (the trunk and a scalar value head, as
    :class:`~lit_rlhf.models.CriticModel`), ``sequence_classification`` (a scalar reward
    model: the trunk and a bias-free ``score`` row)."""
    import transformers

    config = hf_config(arch)
    builder = {
        "causal_lm": transformers.AutoModelForCausalLM,
        "trunk": transformers.AutoModel,
        "critic": transformers.AutoModel,
        "sequence_classification": transformers.AutoModelForSequenceClassification,
    }[head]
    with torch.device("meta"):
        model = builder.from_config(config)
    unique = {id(p): p.numel() for p in model.parameters()}
    largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
    value_head = arch.hidden_size + 1 if head == "critic" else 0
    return Counts(sum(unique.values()) + value_head, largest)


def parameter_count(arch: Architecture, head: Head = "causal_lm") -> int:
    """Parameters of ``arch`` built on the meta device (see :func:`counts`)."""
    return counts(arch, head).total


def lora_parameter_count(
    arch: Architecture, rank: int, target_modules: str | list[str] | tuple[str, ...]
) -> int:
    """Trainable parameters of LoRA adapters of ``rank`` on ``target_modules`` (``all-linear``:
    every projection of the decoder blocks): ``rank x (in + out)`` per adapted matrix."""
    h, hd = arch.hidden_size, arch.head_size
    q, kv, inter = (
        arch.num_attention_heads * hd,
        arch.num_key_value_heads * hd,
        arch.intermediate_size,
    )
    shapes = {
        "q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
        "gate_proj": (h, inter), "up_proj": (h, inter), "down_proj": (inter, h),
    }  # fmt: skip
    names = LORA_TARGETS if target_modules == "all-linear" else tuple(target_modules)
    per_layer = sum(rank * sum(shapes[n]) for n in names if n in shapes)
    return per_layer * arch.num_hidden_layers
