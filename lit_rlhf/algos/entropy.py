"""Full-vocabulary entropy and label log-probs from logits, in fp32, a chunk of rows at a time.

With V ~ 150k, an fp32 copy of a [B, T, V] bf16 logits tensor (and the softmax autograd would
save for backward) is the largest allocation of a policy update. Both differentiable functions
here are autograd Functions that flatten the leading dimensions and walk over chunks of rows:
the forward keeps no intermediates (only a reference to the logits), and the backward recomputes
one chunk's fp32 softmax at a time and writes its gradient straight into a single buffer the size
of the logits. Peak extra memory is therefore the logits' gradient (which any backward creates)
plus one chunk's fp32 intermediates, whatever the sequence length.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable


def _compute_dtype(logits: Tensor) -> torch.dtype:
    # fp32 for bf16/fp16/fp32 logits; fp64 logits stay fp64 (exact gradient checks)
    return torch.promote_types(logits.dtype, torch.float32)


def _spans(n: int, chunk_size: int | None) -> list[tuple[int, int]]:
    if chunk_size is not None and chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1 or None (no chunking), got {chunk_size}")
    size = chunk_size or max(n, 1)
    return [(start, min(start + size, n)) for start in range(0, n, size)]


def _log_softmax_parts(rows: Tensor) -> tuple[Tensor, Tensor]:
    """(log-softmax, softmax) of a chunk of rows in the compute dtype: two chunk-sized buffers
    (the upcast copy becomes the log-softmax in place)."""
    log_probs = rows.to(_compute_dtype(rows), copy=True)
    log_probs -= torch.logsumexp(log_probs, dim=-1, keepdim=True)
    return log_probs, log_probs.exp()


def _row_dot(a: Tensor, b: Tensor) -> Tensor:
    """sum_v a[n, v] * b[n, v] -> [n, 1] without a product-sized temporary."""
    return torch.bmm(a.unsqueeze(1), b.unsqueeze(2)).squeeze(-1)


class _ChunkedEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, rows: Tensor, chunk_size: int | None) -> Tensor:
        out = rows.new_empty(rows.shape[0], dtype=_compute_dtype(rows))
        for start, end in _spans(rows.shape[0], chunk_size):
            log_probs, probs = _log_softmax_parts(rows[start:end])
            out[start:end] = -_row_dot(probs, log_probs).squeeze(-1)
        ctx.save_for_backward(rows)
        ctx.chunk_size = chunk_size
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor, None]:
        (rows,) = ctx.saved_tensors
        grad = torch.empty_like(rows)
        for start, end in _spans(rows.shape[0], ctx.chunk_size):
            log_probs, probs = _log_softmax_parts(rows[start:end])
            entropy = -_row_dot(probs, log_probs)
            # dH/dz_v = -p_v (log p_v + H)
            grad[start:end] = probs.mul_(log_probs.add_(entropy)).mul_(-grad_out[start:end, None])
        return grad, None


class _ChunkedLabelLogProbs(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, rows: Tensor, labels: Tensor, chunk_size: int | None) -> Tensor:
        out = rows.new_empty(rows.shape[0], dtype=_compute_dtype(rows))
        for start, end in _spans(rows.shape[0], chunk_size):
            chunk = rows[start:end]
            z_label = chunk.gather(-1, labels[start:end, None]).to(out.dtype).squeeze(-1)
            out[start:end] = z_label - torch.logsumexp(chunk.to(out.dtype), dim=-1)
        ctx.save_for_backward(rows, labels)
        ctx.chunk_size = chunk_size
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor, None, None]:
        rows, labels = ctx.saved_tensors
        grad = torch.empty_like(rows)
        for start, end in _spans(rows.shape[0], ctx.chunk_size):
            log_probs, probs = _log_softmax_parts(rows[start:end])
            del log_probs
            # d log p_y / dz = onehot(y) - p
            g = grad_out[start:end, None]
            probs.mul_(-g).scatter_add_(-1, labels[start:end, None], g.to(probs.dtype))
            grad[start:end] = probs
        return grad, None, None


class GatherCandidates(torch.autograd.Function):
    """``rows.gather(-1, indices)`` for indices that are distinct within each row, with a backward
    that writes into one zero buffer with ``index_put_``. (On CPU, the backward of ``gather`` for
    bf16 goes through a transient fp32 buffer the size of ``rows``, twice the gradient itself.)"""

    @staticmethod
    def forward(ctx: Any, rows: Tensor, indices: Tensor) -> Tensor:
        ctx.save_for_backward(indices)
        ctx.rows_shape = rows.shape
        ctx.rows_dtype = rows.dtype
        return rows.gather(-1, indices)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor, None]:
        (indices,) = ctx.saved_tensors
        n, v = ctx.rows_shape
        grad = grad_out.new_zeros((n, v), dtype=ctx.rows_dtype)
        offsets = torch.arange(n, device=indices.device).unsqueeze(-1) * v
        flat = (indices + offsets).reshape(-1)
        grad.view(-1).index_put_((flat,), grad_out.reshape(-1).to(grad.dtype), accumulate=True)
        return grad, None


def _flat(logits: Tensor) -> Tensor:
    return logits.reshape(-1, logits.shape[-1])


@torch.no_grad()
def entropy_and_top1(logits: Tensor, *, chunk_size: int | None = 1024) -> tuple[Tensor, Tensor]:
    """Entropy (nats) and top-1 probability at every position, without gradient, in one pass.

    One ``logsumexp`` and one ``exp`` per chunk of rows in fp32: the diagnostics every
    exploration method logs, at the cost of a single read of the logits.

    Returns:
        ([...] float32 entropy, [...] float32 largest probability).
    """
    rows = _flat(logits.detach())
    entropy = rows.new_empty(rows.shape[0], dtype=torch.float32)
    top1 = torch.empty_like(entropy)
    for start, end in _spans(rows.shape[0], chunk_size):
        log_probs, probs = _log_softmax_parts(rows[start:end])
        entropy[start:end] = -_row_dot(probs, log_probs).squeeze(-1)
        top1[start:end] = probs.amax(-1)
    return entropy.reshape(logits.shape[:-1]), top1.reshape(logits.shape[:-1])


def entropy_from_logits(logits: Tensor, *, chunk_size: int | None = 1024) -> Tensor:
    """Entropy in nats of the categorical distribution at every position.

    ``H = logsumexp(z) - sum_v softmax(z)_v * z_v``, computed in fp32 whatever the input dtype.
    Differentiable, so it can serve as an entropy bonus (Mnih et al. 2016, arXiv 1602.01783,
    sec. 4; PPO, arXiv 1707.06347, eq. 9).

    Args:
        logits: [..., V], any floating dtype (bf16 logits are upcast one chunk at a time).
        chunk_size: rows (flattened positions) per chunk; None processes all rows at once.

    Returns:
        [...] float32 entropy per position (float64 for float64 logits).
    """
    return _ChunkedEntropy.apply(_flat(logits), chunk_size).reshape(logits.shape[:-1])


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
        [...] float32 log-probs (float64 for float64 logits).
    """
    if labels.shape != logits.shape[:-1]:
        raise ValueError(
            f"labels shape {tuple(labels.shape)} must equal logits shape without the vocab "
            f"dimension, {tuple(logits.shape[:-1])}"
        )
    log_probs = _ChunkedLabelLogProbs.apply(_flat(logits), labels.reshape(-1), chunk_size)
    return log_probs.reshape(labels.shape)
