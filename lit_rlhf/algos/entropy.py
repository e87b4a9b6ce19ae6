"""Full-vocabulary entropy and label log-probs from logits, in fp32, a chunk of rows at a time.

With V ~ 150k, an fp32 copy of a [B, T, V] bf16 logits tensor (and the softmax saved for
backward) is the largest allocation of a policy update. Both functions flatten the leading
dimensions, upcast one chunk of rows at a time, and wrap each chunk in activation
checkpointing when a gradient is needed, so the fp32 intermediates of only one chunk are alive
in the forward pass and again in the backward pass (where the chunk is recomputed).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint


def _chunked_rows(
    fn: Callable[[Tensor, Tensor], Tensor],
    logits: Tensor,
    labels: Tensor,
    chunk_size: int | None,
) -> Tensor:
    """Apply ``fn(logits_rows [N, V], labels_rows [N]) -> [N]`` chunk by chunk over rows."""
    if chunk_size is not None and chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1 or None (no chunking), got {chunk_size}")
    lead_shape = logits.shape[:-1]
    rows = logits.reshape(-1, logits.shape[-1])
    row_labels = labels.reshape(-1)
    size = chunk_size or max(rows.shape[0], 1)
    # Without checkpointing, autograd would keep every chunk's fp32 softmax alive until the
    # backward pass, which is the full-size copy that chunking is meant to avoid.
    recompute = torch.is_grad_enabled() and logits.requires_grad
    outputs = [
        checkpoint(fn, chunk, chunk_labels, use_reentrant=False, preserve_rng_state=False)
        if recompute
        else fn(chunk, chunk_labels)
        for chunk, chunk_labels in zip(rows.split(size), row_labels.split(size), strict=True)
    ]
    return torch.cat(outputs).reshape(lead_shape)


def _entropy_rows(logits: Tensor, _unused: Tensor) -> Tensor:
    z = logits.float()
    # H = logsumexp(z) - sum softmax(z) * z: stable for any logit scale, no log(0).
    return torch.logsumexp(z, dim=-1) - (torch.softmax(z, dim=-1) * z).sum(dim=-1)


def _label_log_prob_rows(logits: Tensor, labels: Tensor) -> Tensor:
    log_probs = F.log_softmax(logits.float(), dim=-1)
    return log_probs.gather(-1, labels.unsqueeze(-1)).squeeze(-1)


def entropy_from_logits(logits: Tensor, *, chunk_size: int | None = 1024) -> Tensor:
    """Entropy in nats of the categorical distribution at every position.

    ``H = logsumexp(z) - sum_v softmax(z)_v * z_v``, computed in fp32 whatever the input dtype.
    Differentiable, so it can serve as an entropy bonus (Mnih et al. 2016, arXiv 1602.01783,
    sec. 4; PPO, arXiv 1707.06347, eq. 9).

    Args:
        logits: [..., V], any floating dtype (bf16 logits are upcast one chunk at a time).
        chunk_size: rows (flattened positions) per chunk; None processes all rows at once.

    Returns:
        [...] float32 entropy per position.
    """
    dummy_labels = torch.zeros(logits.shape[:-1], dtype=torch.long, device=logits.device)
    return _chunked_rows(_entropy_rows, logits, dummy_labels, chunk_size)


def token_log_probs(logits: Tensor, labels: Tensor, *, chunk_size: int | None = 1024) -> Tensor:
    """Log-probability of each label under the logits at its position, in fp32.

    ``log p(label) = log_softmax(z)[label]``, computed chunk by chunk as in
    ``entropy_from_logits``; differentiable, so it feeds the policy-gradient ratio
    (``exp(logp - logp_old)`` of PPO, arXiv 1707.06347, eq. 6).

    Args:
        logits: [..., V], any floating dtype; position t must already predict ``labels[..., t]``
            (shift the logits by one before calling for a causal LM).
        labels: [...] long, valid indices in [0, V) (replace padding with any valid id and mask
            the result).
        chunk_size: rows (flattened positions) per chunk; None processes all rows at once.

    Returns:
        [...] float32 log-probs.
    """
    if labels.shape != logits.shape[:-1]:
        raise ValueError(
            f"labels shape {tuple(labels.shape)} must equal logits shape without the vocab "
            f"dimension, {tuple(logits.shape[:-1])}"
        )
    return _chunked_rows(_label_log_prob_rows, logits, labels, chunk_size)
