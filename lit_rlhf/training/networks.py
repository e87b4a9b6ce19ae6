"""The networks of a policy-optimisation module: the policy, an optional critic (GAE) and an
optional frozen reference (KL), built in ``configure_model`` so that configs instantiate
cheaply and ZeRO-3 can build them sharded. Under LoRA the policy carries peft adapters over a
frozen (optionally 4-bit) base, and the reference is that base: no second model is loaded."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import nn

from lit_rlhf.models import CriticModel, ValueHead, load_causal_lm, load_tokenizer
from lit_rlhf.models.lora import lora_wrap, quantization_config
from lit_rlhf.settings import Dtype, LoRASettings, PrecisionSettings
from lit_rlhf.strategies import transformers_zero3_context
from lit_rlhf.training.frozen import freeze
from lit_rlhf.training.sharding import shard_networks


@dataclass
class PolicyNetworks:
    policy: nn.Module
    critic: nn.Module | None  # GAE only
    ref_policy: nn.Module | None  # only with a KL coefficient > 0 and no LoRA, frozen
    teacher: nn.Module | None = None  # on-policy distillation's teacher, frozen


def build_policy_networks(
    model: str,
    *,
    strategy: Any = None,
    precision: PrecisionSettings | None = None,
    critic: str | None = None,
    critic_model: str | None = None,
    reference: bool = False,
    lora: LoRASettings | None = None,
    teacher: str | None = None,
) -> PolicyNetworks:
    """Load the policy from ``model`` (hub id, folder, ``builtin:``); ``critic``: ``separate``
    (a value network from ``critic_model`` or ``model``), ``value_head`` (a head on the policy's
    hidden states) or None; ``reference``: a frozen copy of the starting policy, in
    ``precision.reference_dtype`` (None: ``precision.dtype``; frozen, it may be 16-bit while the
    trained policy is float32). Under ZeRO-3 (``strategy``) the pretrained weights load straight
    into the partitions; under FSDP2 the policy and critic are sharded (``shard_networks``).
    ``lora`` (rank > 0): the policy gets adapters (its base frozen, loaded in 4 bits with
    ``quantize``), and no separate reference is loaded (the base is the reference).
    ``teacher``: on-policy distillation's teacher (hub id, folder, ``builtin:``), frozen, in the
    reference's dtype."""
    lora = lora or LoRASettings()
    precision = precision or PrecisionSettings()
    dtype = precision.dtype
    with transformers_zero3_context(strategy):
        policy = _load_policy(model, dtype, lora, precision.gradient_checkpointing)
        value: nn.Module | None = None
        if critic == "value_head":
            value = ValueHead(policy.config.hidden_size)
        elif critic == "separate":
            value = CriticModel.from_pretrained(critic_model or model, dtype=dtype)
        elif critic is not None:
            raise ValueError(f"critic must be 'separate', 'value_head' or None, got {critic!r}")
        ref_dtype = precision.reference_dtype or dtype
        separate = reference and not lora.enabled
        ref = freeze(load_causal_lm(model, dtype=ref_dtype)) if separate else None
        taught = None if teacher is None else freeze(load_causal_lm(teacher, dtype=ref_dtype))
    shard_networks(strategy, policy, value)  # FSDP2: the trained networks; the frozen ones whole
    return PolicyNetworks(policy, value, ref, taught)


def _load_policy(model: str, dtype: Dtype, lora: LoRASettings, gradient_checkpointing: bool) -> Any:
    quantized = quantization_config(lora.quantize)
    extra = {} if quantized is None else {"quantization_config": quantized}
    policy = load_causal_lm(model, dtype=dtype, **extra)
    if gradient_checkpointing:
        policy.gradient_checkpointing_enable()
        if lora.enabled:  # frozen embeddings: checkpointed blocks need inputs that want grads
            policy.enable_input_require_grads()
    return lora_wrap(policy, lora)


def begin_configure_model(module: Any, built: bool, tokenizer_source: str) -> tuple[Any, bool]:
    """The opening every one-optimizer module's ``configure_model`` shares: the strategy (None
    outside a Trainer) is handed to ``module.step_optimizer``; then, unless the networks are
    ``built`` already (a second call), the tokenizer is loaded from ``tokenizer_source`` when
    none was given. Returns (strategy, whether the networks are still to be built)."""
    strategy = module._trainer.strategy if module._trainer is not None else None
    module.step_optimizer.configure(strategy)
    if built:
        return strategy, False
    if module.tokenizer is None:
        module.tokenizer = load_tokenizer(tokenizer_source)
    return strategy, True
