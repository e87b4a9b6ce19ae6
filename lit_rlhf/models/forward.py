"""Causal-LM forward passes over prompt + response: the logits and log-probs at the positions
that predict the response tokens. Shared by the update, the reference forward and the engines.

Left-padded prompts need explicit position ids (count of real tokens so far) so that the training
forward sees the same positions as ``generate`` did.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from transformers import DynamicCache

from lit_rlhf.algos import token_log_probs


def model_cache_kwarg(model: nn.Module) -> str:
    """transformers renamed the forward's ``past_key_values`` to ``cache`` (5.2x)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def position_ids_from_mask(attention_mask: Tensor) -> Tensor:
    """[B, T] bool -> [B, T] long: index of each token among its row's real tokens."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


@dataclass
class ResponseForward:
    logits: Tensor  # [B, R, V] tempered logits predicting each response token
    log_probs: Tensor  # [B, R] fp32
    hidden: Tensor | None  # [B, R, H] last hidden state at the same positions (value head)


def forward_response(
    model: nn.Module,
    input_ids: Tensor,  # [B, T] prompt + response
    attention_mask: Tensor,  # [B, T] bool
    response_ids: Tensor,  # [B, R]
    *,
    temperature: float,
    with_hidden: bool = False,
    share_prompts: bool = True,
) -> ResponseForward:
    """Run the policy and keep only the R positions that predict response tokens.

    With ``share_prompts`` (and no hidden states requested), rows whose prompts are identical
    (the G samples of one prompt) run the prompt once; see :func:`_shared_prompt_forward`.
    """
    r = response_ids.shape[1]
    if share_prompts and not with_hidden and not _cache_disabled(model):
        shared = _shared_prompt_forward(model, input_ids, attention_mask.bool(), r)
        if shared is not None:
            logits = shared / temperature
            return ResponseForward(logits, token_log_probs(logits, response_ids), None)
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask.long(),
        position_ids=position_ids_from_mask(attention_mask),
        logits_to_keep=r + 1,  # positions P-1 .. T-1; the last one predicts past the end
        output_hidden_states=with_hidden,
        use_cache=False,
    )
    logits = out.logits[:, :-1] / temperature
    hidden = out.hidden_states[-1][:, -r - 1 : -1] if with_hidden else None
    return ResponseForward(logits, token_log_probs(logits, response_ids), hidden)


def _cache_disabled(model: nn.Module) -> bool:
    """Whether the model will ignore ``use_cache=True``: transformers turns the KV cache off in
    a training-mode forward with gradient checkpointing, so the shared prefix would reach the
    responses as an empty cache and their log-probs would be computed without the prompt."""
    name = "is_activation_checkpointing"  # transformers 5's name; the older one warns there
    if not hasattr(type(model), name):
        name = "is_gradient_checkpointing"
    checkpointing = bool(getattr(model, name, False))
    return checkpointing and model.training and torch.is_grad_enabled()


def _shared_prompt_forward(
    model: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    r: int,
) -> Tensor | None:
    """Logits [B, R, V] (untempered) predicting the response tokens, computing each distinct
    prompt once: the prompt prefix runs on the unique prompts, its KV cache is gathered to every
    row (autograd sums the rows' gradients into the shared prefix), and the responses continue
    from it. ``None`` when no prompt repeats (then a plain forward is cheaper)."""
    p = input_ids.shape[1] - r
    prompt, prompt_mask = input_ids[:, :p], attention_mask[:, :p]
    key = torch.cat([prompt.masked_fill(~prompt_mask, -1), prompt_mask.long()], dim=1)
    unique, inverse = torch.unique(key, dim=0, return_inverse=True)
    if p == 0 or unique.shape[0] == input_ids.shape[0]:
        return None
    first = torch.empty(unique.shape[0], dtype=torch.long, device=input_ids.device)
    first.scatter_(0, inverse, torch.arange(input_ids.shape[0], device=input_ids.device))
    cache = DynamicCache(config=getattr(model, "config", None))
    cache_kwarg = model_cache_kwarg(model)
    prefix = model(
        input_ids=prompt[first],
        attention_mask=prompt_mask[first].long(),
        position_ids=position_ids_from_mask(prompt_mask[first]),
        use_cache=True,
        logits_to_keep=1,
        **{cache_kwarg: cache},
    )
    if cache.get_seq_length() != p:  # the model ignored the cache: a plain forward is exact
        return None
    cache.batch_select_indices(inverse)
    positions = position_ids_from_mask(attention_mask)[:, p:]
    rest = model(
        input_ids=input_ids[:, p:],
        attention_mask=attention_mask.long(),
        position_ids=positions,
        cache_position=torch.arange(p, p + r, device=input_ids.device),
        use_cache=True,
        logits_to_keep=r,
        **{cache_kwarg: cache},
    )
    # the prompt's last position predicts the first response token; the last response position
    # predicts past the end and is not needed
    return torch.cat([prefix.logits[inverse], rest.logits[:, :-1]], dim=1)
