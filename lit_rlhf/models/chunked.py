"""Padding-free (packed) forward passes over prompt + response, with chunked log-probs.

The rows of a micro-batch are laid back to back in ONE row of real tokens (no padding), with
position ids that restart at 0 for every sequence. transformers' masking utilities (5.x,
``masking_utils.find_packed_sequence_indices``) read a restart in the position ids as a sequence
boundary and build a block-diagonal causal mask, for sdpa, eager and flash attention alike, when
the forward gets no attention mask and no KV cache (``use_cache=False``). A token therefore sees
exactly what it sees in the padded forward (``lit_rlhf.models.forward``: positions counted over
real tokens), and the log-probs agree with the padded path to float rounding.

Log-probs and entropies come from the last hidden states chunk by chunk: each chunk of response
positions goes through the LM head, the temperature and a log-softmax inside
``torch.utils.checkpoint``, so backward recomputes that chunk's logits instead of keeping a
[tokens x vocabulary] tensor for the whole micro-batch. Only when a caller asks for the full
logits (a loss-term callback that reads ``PolicyLossContext.logits``) are they built, for the
response positions only.

The chunked head is the model's output embedding (``get_output_embeddings()``); models that
post-process their logits (final soft-capping, a logit scale) are refused.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from lit_rlhf.algos import entropy_and_top1, token_log_probs

CHUNK_TOKENS = 1024  # response positions per LM-head chunk


@dataclass
class PackedRows:
    """Rows of a micro-batch laid back to back (N real tokens, M of them response tokens)."""

    input_ids: Tensor  # [1, N] long, each row's prompt then response tokens, no padding
    position_ids: Tensor  # [1, N] long, restarting at 0 for every row
    targets: Tensor  # [M] long, the response tokens
    source: Tensor  # [M] long, index in the packed stream of the position predicting each one
    rows: Tensor  # [M] long, the target's row in [b, R]
    cols: Tensor  # [M] long, the target's column in [b, R]
    shape: tuple[int, int]  # (b, R)

    def scatter(self, values: Tensor, fill: float = 0.0) -> Tensor:
        """[M, ...] -> [b, R, ...]: per-target values back at their padded places."""
        out = values.new_full((*self.shape, *values.shape[1:]), fill)
        return out.index_put((self.rows, self.cols), values)


def pack_rows(
    prompt_ids: Tensor, prompt_mask: Tensor, response_ids: Tensor, response_mask: Tensor
) -> PackedRows:
    """Pack left-padded prompts [b, P] and right-padded responses [b, R] (bool masks, True = real
    token). Every row needs at least one prompt token (it predicts the first response token)."""
    if bool((prompt_mask.sum(1) == 0).any()):
        raise ValueError("packing needs at least one prompt token per row")
    ids = torch.cat([prompt_ids, response_ids], dim=1)
    mask = torch.cat([prompt_mask, response_mask], dim=1).bool()
    positions = (mask.long().cumsum(1) - 1)[mask]
    is_response = torch.cat([torch.zeros_like(prompt_mask), response_mask], dim=1).bool()[mask]
    target_index = is_response.nonzero().squeeze(-1)
    rows, cols = response_mask.bool().nonzero(as_tuple=True)
    return PackedRows(
        input_ids=ids[mask][None],
        position_ids=positions[None],
        targets=ids[mask][target_index],
        source=target_index - 1,
        rows=rows,
        cols=cols,
        shape=(int(response_ids.shape[0]), int(response_ids.shape[1])),
    )


@dataclass
class PackedForward:
    """What the packed forward gives back, in the padded [b, R] layout (0 outside the mask)."""

    log_probs: Tensor  # [b, R] fp32; gradient flows
    entropy: Tensor  # [b, R] fp32, detached
    top1: Tensor  # [b, R] fp32, detached
    logits: Tensor | None  # [b, R, V] tempered logits (only when asked for)
    hidden: Tensor | None  # [b, R, H] last hidden state predicting each token (value head)


def packed_hidden(model: nn.Module, packed: PackedRows) -> Tensor:
    """[N, H] last hidden states of the packed stream (the LM head runs on one position only)."""
    _check_plain_head(model)
    out = model(
        input_ids=packed.input_ids,
        position_ids=packed.position_ids,
        attention_mask=None,  # with no mask and no cache, restarts in position_ids separate rows
        use_cache=False,
        output_hidden_states=True,
        logits_to_keep=1,
    )
    return out.hidden_states[-1][0]


def packed_response_forward(
    model: nn.Module,
    packed: PackedRows,
    *,
    temperature: float,
    with_hidden: bool = False,
    full_logits: bool = False,
    num_chunks: Callable[[int], int] = lambda n: n,
    chunk_tokens: int = CHUNK_TOKENS,
) -> PackedForward:
    """One packed forward; log-probs, entropies and top-1 probabilities of the response tokens.

    ``full_logits``: also return the tempered [b, R, V] logits (then the log-probs come from
    them). ``num_chunks`` maps this micro-batch's chunk count to the count to run (extra chunks
    are empty): under ZeRO-3 every LM-head call gathers its weight collectively, so ranks agree
    on the count (:func:`lit_rlhf.training.packing.agree_max`).
    """
    hidden = packed_hidden(model, packed)[packed.source]  # [M, H]
    head = cast(Any, model).get_output_embeddings()
    if not isinstance(head, nn.Module):
        raise NotImplementedError(
            f"packing needs the model's LM head (get_output_embeddings()), and "
            f"{type(model).__name__} has none. Fix: set micro_batch_tokens: null."
        )
    if full_logits:
        logits = head(hidden) / temperature
        log_probs = token_log_probs(logits, packed.targets)
        entropy, top1 = entropy_and_top1(logits)
        scattered: Tensor | None = packed.scatter(logits)
    else:
        log_probs, entropy, top1 = _chunked_stats(
            head, hidden, packed.targets, temperature, num_chunks, chunk_tokens
        )
        scattered = None
    return PackedForward(
        log_probs=packed.scatter(log_probs),
        entropy=packed.scatter(entropy),
        top1=packed.scatter(top1),
        logits=scattered,
        hidden=packed.scatter(hidden) if with_hidden else None,
    )


def _chunked_stats(
    head: nn.Module,
    hidden: Tensor,
    targets: Tensor,
    temperature: float,
    num_chunks: Callable[[int], int],
    chunk_tokens: int,
) -> tuple[Tensor, Tensor, Tensor]:
    """([M] log-probs, [M] entropy, [M] top-1) from [M, H] hidden states, chunk by chunk."""

    def chunk(h: Tensor, y: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        logits = head(h) / temperature
        entropy, top1 = entropy_and_top1(logits, chunk_size=None)
        return token_log_probs(logits, y, chunk_size=None), entropy, top1

    m = hidden.shape[0]
    n = num_chunks(-(-m // chunk_tokens))
    size = max(1, -(-m // max(n, 1)))
    parts = []
    for i in range(n):
        h, y = hidden[i * size : (i + 1) * size], targets[i * size : (i + 1) * size]
        if torch.is_grad_enabled() and h.requires_grad:
            parts.append(checkpoint(chunk, h, y, use_reentrant=False))
        else:
            parts.append(chunk(h, y))
    if not parts:
        empty = hidden.new_zeros(0, dtype=torch.float32)
        return empty, empty, empty
    log_probs, entropy, top1 = (torch.cat(p) for p in zip(*parts, strict=True))
    return log_probs, entropy, top1


def _check_plain_head(model: nn.Module) -> None:
    config = getattr(model, "config", None)
    for name in ("final_logit_softcapping", "logit_scale"):
        if getattr(config, name, None) not in (None, 1.0):
            raise NotImplementedError(
                f"packing applies the LM head to hidden states chunk by chunk, and this model "
                f"post-processes its logits ({name}={getattr(config, name)}). Fix: set "
                "micro_batch_tokens: null (the padded path)."
            )
