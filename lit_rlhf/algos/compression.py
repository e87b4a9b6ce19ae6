"""Diagnostics of a compressor-decoder (the size-fidelity paradox, arXiv 2602.09789, sec. 5 of
METHODS.md): effective rank of the memory embeddings, the decoder's teacher-forced token
entropy, and token-level fidelity of a reconstruction (exact match, bag-of-tokens F1).

The paper reports that a higher effective rank of the memory goes with prior intrusion
(knowledge overwriting) and a higher decoder entropy with rewriting (semantic drift). These are
measurements, not losses: every tensor returned here is detached.
Mask convention: bool, True = the token counts.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence

import torch
from torch import Tensor

_PUNCTUATION = re.compile(r"[^\w\s]")
Tokens = str | Sequence[int | str]  # a text, or token ids / words


def effective_rank(z: Tensor, *, eps: float = 1e-12) -> Tensor:
    """Effective rank of each memory matrix (Roy & Vetterli 2007, "The effective rank: a measure
    of effective dimensionality", EUSIPCO).

    ``erank(Z) = exp(-sum_i p_i log p_i)`` with ``p_i = sigma_i / sum_j sigma_j`` over the
    singular values of ``Z``. It lies in ``[1, min(k, d)]``: 1 for a rank-one matrix, ``k`` for
    ``k`` orthogonal rows of equal norm. A matrix whose singular values sum to at most ``eps``
    (the zero matrix) has no direction at all and is given erank 0, below every non-zero matrix.

    Args:
        z: [..., k, d] memory vectors (k rows of width d), one matrix per leading index; any
            floating dtype (the SVD runs in fp32, or fp64 for fp64 input).
        eps: nuclear-norm threshold under which a matrix counts as zero.

    Returns:
        [...] erank per matrix (a 0-dim tensor for a single [k, d]), detached.
    """
    if z.dim() < 2:
        raise ValueError(f"z must be [..., k, d] with at least 2 dims, got shape {tuple(z.shape)}")
    dtype = torch.promote_types(z.dtype, torch.float32)
    sigma = torch.linalg.svdvals(z.detach().to(dtype))
    total = sigma.sum(dim=-1, keepdim=True)
    nonzero = total.squeeze(-1) > eps
    p = sigma / torch.where(total > eps, total, torch.ones_like(total))
    spectral_entropy = -torch.special.xlogy(p, p).sum(dim=-1)  # xlogy: 0 log 0 = 0
    return torch.where(nonzero, spectral_entropy.exp(), torch.zeros_like(spectral_entropy))


def pooled_effective_rank(z: Tensor, *, eps: float = 1e-12) -> Tensor:
    """Effective rank of all memory vectors of a batch stacked into one matrix: how many
    directions the memory space uses across contexts, not within one (see ``effective_rank``).

    Args:
        z: [..., k, d], e.g. [B, k, d]; flattened to [B * k, d].
        eps: as in ``effective_rank``.

    Returns:
        0-dim erank of the stacked [N, d] matrix, detached.
    """
    if z.dim() < 2:
        raise ValueError(f"z must be [..., k, d] with at least 2 dims, got shape {tuple(z.shape)}")
    return effective_rank(z.reshape(-1, z.shape[-1]), eps=eps)


def _entropy(logits: Tensor, chunk_size: int) -> Tensor:
    """[..., V] -> [...] entropy in fp32 (fp64 for fp64 logits), ``chunk_size`` rows at a time
    so that only one chunk is ever upcast. A -inf logit (a banned token) adds 0 (0 log 0 = 0);
    a NaN logit still gives NaN."""
    rows = logits.detach().reshape(-1, logits.shape[-1])
    dtype = torch.promote_types(logits.dtype, torch.float32)
    out = torch.empty(rows.shape[0], dtype=dtype, device=logits.device)
    for start in range(0, rows.shape[0], chunk_size):
        log_p = torch.log_softmax(rows[start : start + chunk_size].to(dtype), dim=-1)
        terms = torch.where(torch.isneginf(log_p), 0.0, log_p.exp() * log_p)
        out[start : start + chunk_size] = -terms.sum(dim=-1)
    return out.reshape(logits.shape[:-1])


def token_entropy(logits: Tensor, mask: Tensor, *, chunk_size: int = 1024) -> tuple[Tensor, Tensor]:
    """Teacher-forced entropy (nats) of the decoder's next-token distributions.

    ``H_t = -sum_v softmax(z_t)_v log softmax(z_t)_v``, in fp32 whatever the logits' dtype.
    The caller aligns the positions: ``logits[:, t]`` must be the prediction of a reconstruction
    token, and ``mask[:, t]`` says whether it counts (prompt, memory slots and padding do not).

    Args:
        logits: [B, T, V].
        mask: [B, T] bool, True = the position counts.
        chunk_size: positions upcast to fp32 at a time (bounds the extra memory).

    Returns:
        (mean, per_sequence): the token-weighted mean over every counted position of the batch
        (0-dim; NaN when none counts) and the mean per sequence ([B]; NaN for a sequence with no
        counted position, which therefore adds nothing to ``mean``). Both detached.
    """
    if logits.dim() != 3 or mask.shape != logits.shape[:2]:
        raise ValueError(
            f"expected logits [B, T, V] and mask [B, T], got {tuple(logits.shape)} and "
            f"{tuple(mask.shape)}"
        )
    if mask.dtype != torch.bool:
        raise ValueError(f"mask must be bool (True = counts), got {mask.dtype}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1 (positions per fp32 chunk), got {chunk_size}")
    entropy = _entropy(logits, chunk_size)
    counted = torch.where(mask, entropy, torch.zeros_like(entropy))
    tokens = mask.sum(dim=-1).to(entropy.dtype)
    per_sequence = counted.sum(dim=-1) / tokens  # 0 / 0 = NaN for an all-masked row
    mean = counted.sum() / tokens.sum()
    return mean, per_sequence


def normalize_text(text: str) -> str:
    """Lower case, punctuation removed, whitespace collapsed: the text compared by
    ``token_f1`` and ``exact_match``. Unlike SQuAD's normalisation articles are kept, since a
    reconstruction should reproduce every word."""
    return " ".join(_PUNCTUATION.sub("", text.lower()).split())


def _tokens(x: Tokens) -> list[int | str]:
    if isinstance(x, str):
        return list(normalize_text(x).split())
    return list(x)


def token_f1(prediction: Tokens, reference: Tokens) -> float:
    """Bag-of-tokens F1 between a reconstruction and its source (SQuAD-style, Rajpurkar et al.
    2016, arXiv 1606.05250).

    ``P = |pred ∩ ref| / |pred|``, ``R = |pred ∩ ref| / |ref|``, ``F1 = 2PR / (P + R)`` with the
    intersection counted as a multiset. Strings are normalised (``normalize_text``) and split on
    whitespace; sequences (token ids, or already split words) are compared as they are.
    Both empty -> 1.0; exactly one empty -> 0.0.
    """
    pred, ref = _tokens(prediction), _tokens(reference)
    if not pred or not ref:
        return float(pred == ref)
    common = sum((Counter(pred) & Counter(ref)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(ref)
    return 2 * precision * recall / (precision + recall)


def exact_match(prediction: Tokens, reference: Tokens) -> float:
    """1.0 when the reconstruction equals the source token for token (strings normalised as in
    ``token_f1``), else 0.0."""
    return float(_tokens(prediction) == _tokens(reference))
