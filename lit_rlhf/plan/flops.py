"""Step FLOPs of a decoder-only transformer and the model FLOPs utilisation (MFU) of an update.

Counting convention (PaLM, arXiv 2204.02311, appendix B): *model* FLOPs, the matrix products the
network needs for the tokens it is given, whatever the implementation does on top. So an update
under activation checkpointing is credited with the same FLOPs as one without (the recompute
forward is not counted), and padding tokens are not counted either: both lower the MFU, as they
should. Per token, the forward pass costs

    2 * (matmul weights) + 4 * layers * heads * head_dim * seq_len

where the matmul weights are each layer's attention and MLP projections plus the LM head (an
embedding lookup is not a product; a tied LM head is still one), and the second term is the
attention scores and their weighted sum over ``seq_len`` keys (counted over the whole sequence,
as PaLM does, not half of it for causal masking). The backward pass costs twice the forward.

``arch`` is anything with a decoder's shape attributes: an
``lit_rlhf.plan.architectures.Architecture`` or a transformers ``PretrainedConfig``
(``hidden_size``, ``num_hidden_layers``, ``num_attention_heads``, ``num_key_value_heads``,
``intermediate_size``, ``vocab_size``, optionally ``head_dim``).
"""

from __future__ import annotations

import re
import time
from typing import Any

import torch

# bf16 dense (no structured sparsity) tensor-core peaks, FLOP/s, from the vendors' spec sheets
# (the sheets print the sparse figure, twice these, with an asterisk). Keyed by the model name
# as it appears in ``torch.cuda.get_device_name()``; matched as a whole word, longest name first.
DEVICE_PEAK_FLOPS: dict[str, float] = {
    # https://www.nvidia.com/en-us/data-center/h200/ (H200 SXM: 1,979 TFLOPS sparse; NVL 1,671)
    "H200 NVL": 835e12,
    "H200": 989e12,
    # https://www.nvidia.com/en-us/data-center/h100/ (SXM 1,979 sparse; PCIe 1,513; NVL 1,671)
    "H100 NVL": 835e12,
    "H100 PCIe": 756e12,
    "H100": 989e12,  # "NVIDIA H100 80GB HBM3": the SXM part
    # https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/
    # nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf (312 dense, SXM and PCIe alike)
    "A100": 312e12,
    # https://www.nvidia.com/en-us/data-center/l40s/ (733 sparse)
    "L40S": 362e12,
    # https://www.nvidia.com/en-us/data-center/l4/ (242 sparse)
    "L4": 121e12,
    # https://www.nvidia.com/en-us/data-center/products/a10-gpu/ (250 sparse)
    "A10": 125e12,
}


def _get(arch: Any, name: str) -> int:
    value = getattr(arch, name, None)
    if not isinstance(value, int) or value < 1:
        raise ValueError(
            f"{type(arch).__name__} has no positive integer {name!r} ({value!r}), so its FLOPs "
            "cannot be counted. Fix: pass an Architecture or a decoder's transformers config."
        )
    return value


def _head_dim(arch: Any) -> int:
    head_dim = getattr(arch, "head_dim", None)
    if isinstance(head_dim, int) and head_dim > 0:
        return head_dim
    return _get(arch, "hidden_size") // _get(arch, "num_attention_heads")


def matmul_weights(arch: Any, *, lm_head: bool = True) -> int:
    """Weights that take part in a matrix product per token: each layer's q, k, v, o and gated
    MLP projections, plus the LM head (``lm_head=False``: a critic's trunk, whose scalar value
    head is left out)."""
    hidden, heads = _get(arch, "hidden_size"), _get(arch, "num_attention_heads")
    kv_heads, head_dim = _get(arch, "num_key_value_heads"), _head_dim(arch)
    attention = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim
    mlp = 3 * hidden * _get(arch, "intermediate_size")
    head = hidden * _get(arch, "vocab_size") if lm_head else 0
    return _get(arch, "num_hidden_layers") * (attention + mlp) + head


def step_flops(
    arch: Any,
    *,
    tokens: int,
    seq_len: int,
    trainable: bool,
    logit_tokens: int | None = None,
    lm_head: bool = True,
) -> float:
    """Model FLOPs of one pass over ``tokens`` tokens in sequences of ``seq_len``: the forward,
    plus the backward (twice the forward) when ``trainable``. ``logit_tokens``: the tokens whose
    logits are computed (an RL update computes them for the response only; None: all);
    ``lm_head=False``: a critic trunk."""
    if tokens < 0 or seq_len < 0:
        raise ValueError(f"tokens={tokens} and seq_len={seq_len} must be >= 0. Fix: count them.")
    body = matmul_weights(arch, lm_head=False)
    head = matmul_weights(arch) - body if lm_head else 0
    logits = tokens if logit_tokens is None else logit_tokens
    attention = 4 * _get(arch, "num_hidden_layers") * _get(arch, "num_attention_heads")
    forward = 2 * body * tokens + 2 * head * logits + attention * _head_dim(arch) * seq_len * tokens
    return float(forward * (3 if trainable else 1))


def device_peak_flops(name: str | None, override: float | None = None) -> float | None:
    """The bf16 dense peak of the device called ``name`` (``torch.cuda.get_device_name()``),
    ``override`` when given; None for a device not in :data:`DEVICE_PEAK_FLOPS` (and a CPU)."""
    if override is not None:
        return float(override)
    if not name:
        return None
    for key in sorted(DEVICE_PEAK_FLOPS, key=len, reverse=True):
        if re.search(rf"(?<![A-Za-z0-9]){re.escape(key)}(?![A-Za-z0-9])", name):
            return DEVICE_PEAK_FLOPS[key]
    return None


def device_name(device: torch.device | str) -> str | None:
    """The CUDA device's name, None on any other device."""
    device = torch.device(device)
    return torch.cuda.get_device_name(device) if device.type == "cuda" else None


def start_timer(device: torch.device | str) -> float:
    """A start time after the device's queued work (CUDA runs asynchronously)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def elapsed(device: torch.device | str, start: float) -> float:
    """Seconds since ``start`` once the device's queued work is done."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def _config(network: Any) -> Any:
    """The transformers config of a policy (a PEFT model forwards it) or a critic's trunk."""
    config = getattr(network, "config", None)
    if config is None:  # lit_rlhf.models.critic.CriticModel
        config = getattr(getattr(network, "trunk", None), "config", None)
    return config


def update_perf(
    module: Any, rollout: Any, passes: int, start: float, peak_override: float | None
) -> dict[str, torch.Tensor]:
    """``perf/tokens_per_s`` and ``perf/mfu`` of an RL update that started at ``start``:
    ``passes`` forward + backward passes of the policy (and of a separate critic) over the
    rollout's real prompt + response tokens, logits on the response tokens. MFU is left out
    where no peak is known (a CPU or an unlisted GPU without ``update.device_peak_flops``)."""
    seconds = max(elapsed(module.device, start), 1e-9)
    rows = max(len(rollout), 1)
    tokens = int(rollout.attention_mask.sum())
    responses = int(rollout.response_mask.sum())
    seq_len = tokens // rows
    stats = {"perf/tokens_per_s": torch.tensor(passes * tokens / seconds)}
    peak = device_peak_flops(device_name(module.device), peak_override)
    policy = _config(module.policy)
    if peak is None or policy is None:
        return stats
    flops = step_flops(
        policy, tokens=tokens, seq_len=seq_len, trainable=True, logit_tokens=responses
    )
    critic = _config(getattr(module, "critic", None))
    if critic is not None:
        flops += step_flops(critic, tokens=tokens, seq_len=seq_len, trainable=True, lm_head=False)
    stats["perf/mfu"] = torch.tensor(passes * flops / seconds / peak)
    return stats


__all__ = [
    "DEVICE_PEAK_FLOPS",
    "device_name",
    "device_peak_flops",
    "elapsed",
    "matmul_weights",
    "start_timer",
    "step_flops",
    "update_perf",
]
