"""Trust Region Entropy (TRE, arXiv 2602.03635): entropy of the plausible tokens only.

A full-vocabulary entropy bonus spreads mass into the long tail of ~1.5e5 nonsense tokens at
every position. TRE computes the entropy of the policy renormalised to its trust region A_t (the
K largest logits, or the top tokens up to probability mass p), scaled so that a uniform region
scores log|V| like a uniform vocabulary.

Memory: the region is picked by one ``torch.topk`` per position (never a full sort), without
gradient, one chunk of rows at a time; the entropy needs only the candidate logits, gathered once
over all rows, so what autograd keeps for backward is [N, candidates], not [N, V], and the
backward writes the logits' gradient with a single scatter. Only TRE-P's normaliser (a
full-vocabulary logsumexp) touches every logit, in fp32 and without gradient, chunk by chunk.

Beyond the paper: a candidate whose logit is -inf (probability exactly 0, e.g. a masked vocab
entry) is never in the region, so it cannot turn the entropy into NaN.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from lit_rlhf.algos.entropy import GatherCandidates, _compute_dtype, _spans

TrustRegionMode = Literal["topk", "topp"]


def _candidates_and_region(
    rows: Tensor, *, mode: TrustRegionMode, k: int, p: float, max_candidates: int
) -> tuple[Tensor, Tensor]:
    """Candidate indices [N, m] by descending logit, and which of them are in A_t [N, m] bool."""
    detached = rows.detach()
    if mode == "topk":
        values, indices = torch.topk(detached, k, dim=-1)
        in_region = torch.ones_like(indices, dtype=torch.bool)
    else:
        values, indices = torch.topk(detached, min(max_candidates, rows.shape[-1]), dim=-1)
        log_normaliser = torch.logsumexp(detached.to(_compute_dtype(rows)), dim=-1, keepdim=True)
        probs = torch.exp(values.to(log_normaliser.dtype) - log_normaliser)
        # Exclusive cumulative sum: the mass ranked strictly before each candidate, so the token
        # that crosses p is still in and the top-1 token (mass before = 0) always is.
        mass_before = F.pad(torch.cumsum(probs, dim=-1)[:, :-1], (1, 0))
        in_region = mass_before < p
    in_region &= values > float("-inf")
    in_region[:, 0] = True
    return indices, in_region


def _trust_region_entropy_rows(
    rows: Tensor,
    *,
    mode: TrustRegionMode,
    k: int,
    p: float,
    max_candidates: int,
    scale: bool,
    chunk_size: int | None,
) -> tuple[Tensor, Tensor]:
    """(scaled) entropy [N] (fp32, or fp64) and region size [N] long of logits rows [N, V]."""
    with torch.no_grad():
        parts = [
            _candidates_and_region(
                rows[start:end], mode=mode, k=k, p=p, max_candidates=max_candidates
            )
            for start, end in _spans(rows.shape[0], chunk_size)
        ]
    if parts:
        indices, in_region = (torch.cat(t) for t in zip(*parts, strict=True))
    else:
        indices = rows.new_zeros((0, 1), dtype=torch.long)
        in_region = torch.zeros_like(indices, dtype=torch.bool)
    region_size = in_region.sum(dim=-1)
    # The gradient reaches the logits only through this one gather over all rows, so positions
    # outside A_t get an exact zero and the backward is a single scatter into one buffer the size
    # of the logits. Subtracting the (detached) top logit keeps the fp32 sums small; H is
    # invariant to the shift, so the gradient is unchanged.
    z = GatherCandidates.apply(rows, indices).to(_compute_dtype(rows))
    z = z - z[:, :1].detach()
    z_region = torch.where(in_region, z, float("-inf"))
    q = torch.softmax(z_region, dim=-1)
    # H = logsumexp(z) - sum q z over A_t. Outside A_t q = 0; multiplying it by 0 rather than by
    # -inf keeps both the value and the gradient free of NaN.
    entropy = torch.logsumexp(z_region, dim=-1) - (q * torch.where(in_region, z, 0.0)).sum(-1)
    if scale:
        log_size = region_size.clamp(min=2).to(z.dtype).log()
        entropy = entropy * (math.log(rows.shape[-1]) / log_size)
    # |A_t| = 1 has H = 0 and log|A_t| = 0: return an exact 0 (and a zero gradient), not 0/0.
    entropy = torch.where(region_size > 1, entropy, 0.0)
    return entropy, region_size


def _validate(
    logits: Tensor,
    mode: str,
    k: int,
    p: float,
    max_candidates: int,
    chunk_size: int | None,
) -> None:
    if mode not in ("topk", "topp"):
        raise ValueError(f"mode must be 'topk' (TRE-K) or 'topp' (TRE-P), got {mode!r}")
    if k < 1:
        raise ValueError(f"k (the TRE-K region size) must be >= 1, got {k}")
    if mode == "topk" and k > logits.shape[-1]:
        raise ValueError(f"k = {k} exceeds the vocabulary size {logits.shape[-1]}")
    if not 0 < p <= 1:
        raise ValueError(f"p (the TRE-P mass threshold) must be in (0, 1], got {p}")
    if max_candidates < 1:
        raise ValueError(f"max_candidates (TRE-P's |A_t| cap) must be >= 1, got {max_candidates}")
    if chunk_size is not None and chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1 or None (no chunking), got {chunk_size}")
    if not logits.is_floating_point() or logits.shape[-1] < 1:
        raise ValueError(
            f"logits must be floating with a vocab dimension >= 1, got {logits.dtype} "
            f"{tuple(logits.shape)}"
        )


def trust_region_entropy(
    logits: Tensor,
    *,
    mode: TrustRegionMode = "topk",
    k: int = 2,
    p: float = 0.99,
    max_candidates: int = 256,
    scale: bool = True,
    chunk_size: int | None = 1024,
) -> tuple[Tensor, Tensor]:
    """Trust Region Entropy per position (arXiv 2602.03635).

    The trust region A_t is either the ``k`` largest logits (TRE-K) or, among the
    ``max_candidates`` largest, every token whose preceding probability mass (under the
    full-vocabulary softmax, ranked descending) is < ``p`` (TRE-P). With
    ``q = softmax(z[A_t])``, ``H_TR = -sum_{a in A_t} q_a log q_a`` in fp32 (fp64 for fp64
    logits), and with ``scale`` ``H~ = H_TR * log|V| / log|A_t|`` (a uniform region maps to
    log|V|); |A_t| = 1 gives exactly 0.

    The region is selected without gradient; the gradient w.r.t. the logits is exactly zero
    outside A_t and sums to zero over A_t at each position. Use ``loss - alpha * mean(H~)``
    over response tokens (paper default alpha = 0.001).

    Args:
        logits: [..., V] any floating dtype, already divided by the sampling temperature.
        mode: "topk" (TRE-K) or "topp" (TRE-P).
        k: TRE-K region size (paper default 2).
        p: TRE-P mass threshold in (0, 1] (paper default 0.99).
        max_candidates: TRE-P's cap on |A_t| (paper: 256).
        scale: multiply by log|V| / log|A_t| (|V| = ``logits.shape[-1]``).
        chunk_size: rows (flattened positions) per chunk; None processes all rows at once.

    Returns:
        (H~ [...] float32 (float64 for float64 logits), region size |A_t| [...] long).
    """
    _validate(logits, mode, k, p, max_candidates, chunk_size)
    entropy, region_size = _trust_region_entropy_rows(
        logits.reshape(-1, logits.shape[-1]),
        mode=mode,
        k=k,
        p=p,
        max_candidates=max_candidates,
        scale=scale,
        chunk_size=chunk_size,
    )
    lead_shape = logits.shape[:-1]
    return entropy.reshape(lead_shape), region_size.reshape(lead_shape)


@torch.no_grad()
def trust_region_mass(
    logits: Tensor,
    *,
    mode: TrustRegionMode = "topk",
    k: int = 2,
    p: float = 0.99,
    max_candidates: int = 256,
    chunk_size: int | None = 1024,
) -> tuple[Tensor, Tensor, Tensor]:
    """Where the policy's probability mass lies relative to its trust region (no gradient).

    The diagnostic of TRE's claim (arXiv 2602.03635, sec. 3: "cumulative tail risk"): a global
    entropy bonus moves mass out of the plausible tokens into the vocabulary's tail, the
    trust-region bonus does not. The region A_t is TRE's own (:func:`trust_region_entropy`: the
    ``k`` largest logits, or the nucleus of mass ``p`` among the ``max_candidates`` largest).

    Returns, per position [...], in fp32 (fp64 for fp64 logits):
        tail mass ``1 - sum_{a in A_t} pi(a)`` (full-vocabulary softmax),
        the unscaled entropy inside A_t in nats (``-sum q log q``, ``q`` = pi renormalised to
        A_t; 0 for |A_t| = 1), and |A_t| (long).
    """
    _validate(logits, mode, k, p, max_candidates, chunk_size)
    rows = logits.reshape(-1, logits.shape[-1]).detach()
    inside = []
    for start, end in _spans(rows.shape[0], chunk_size):
        chunk = rows[start:end]
        indices, in_region = _candidates_and_region(
            chunk, mode=mode, k=k, p=p, max_candidates=max_candidates
        )
        dtype = _compute_dtype(chunk)
        log_normaliser = torch.logsumexp(chunk.to(dtype), dim=-1, keepdim=True)
        probs = torch.exp(chunk.gather(-1, indices).to(dtype) - log_normaliser)
        inside.append((probs * in_region).sum(-1))
    mass = torch.cat(inside) if inside else rows.new_zeros(0, dtype=_compute_dtype(rows))
    entropy, size = _trust_region_entropy_rows(
        rows, mode=mode, k=k, p=p, max_candidates=max_candidates, scale=False,
        chunk_size=chunk_size,
    )  # fmt: skip
    lead = logits.shape[:-1]
    tail = (1.0 - mass).clamp(min=0.0)
    return tail.reshape(lead), entropy.reshape(lead), size.reshape(lead)
