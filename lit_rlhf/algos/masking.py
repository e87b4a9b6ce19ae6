"""Reductions over the tokens that count.

Every function takes a ``bool`` mask where ``True`` = the element counts (the one mask convention
of lit-rlhf). Masked-out elements are excluded with ``torch.where`` rather than multiplied by the
mask, so a NaN or inf sitting in a padded position cannot leak into the result (``nan * 0`` is
still NaN).
"""

from __future__ import annotations

from typing import TypeAlias

import torch
from torch import Tensor

Dim: TypeAlias = int | tuple[int, ...] | None


def _count(x: Tensor, mask: Tensor, dim: Dim) -> Tensor:
    # Counting the broadcast mask lets callers pass e.g. a [B, 1] mask for a [B, R] tensor.
    full = torch.broadcast_to(mask, x.shape)
    counted = full.sum() if dim is None else full.sum(dim=dim)
    return counted.to(x.dtype)


def masked_sum(x: Tensor, mask: Tensor, dim: Dim = None) -> Tensor:
    """Sum of ``x`` over the positions where ``mask`` is True.

    Args:
        x: any shape, floating.
        mask: bool, broadcastable to ``x``.
        dim: dimension(s) to reduce; ``None`` reduces everything to a scalar.

    Returns:
        ``x`` reduced over ``dim`` (a scalar when ``dim`` is None).
    """
    kept = torch.where(mask, x, torch.zeros((), dtype=x.dtype, device=x.device))
    return kept.sum() if dim is None else kept.sum(dim=dim)


def masked_mean(x: Tensor, mask: Tensor, dim: Dim = None) -> Tensor:
    """Mean of ``x`` over the positions where ``mask`` is True.

    Where no element counts the result is 0, not NaN: an empty response (or an all-padding
    micro-batch) must not poison a logged mean or a loss.

    Args:
        x: any shape, floating.
        mask: bool, broadcastable to ``x``.
        dim: dimension(s) to reduce; ``None`` reduces everything to a scalar.

    Returns:
        ``x`` reduced over ``dim`` (a scalar when ``dim`` is None).
    """
    return masked_sum(x, mask, dim) / _count(x, mask, dim).clamp(min=1)


def masked_var(x: Tensor, mask: Tensor, *, unbiased: bool = True) -> Tensor:
    """Variance of all counted elements of ``x`` (a scalar).

    With ``unbiased=True`` the sum of squares is divided by ``n - 1`` (Bessel's correction).
    Fewer than two counted elements (one when ``unbiased=False``) give 0 rather than NaN.

    Args:
        x: any shape, floating.
        mask: bool, broadcastable to ``x``.

    Returns:
        scalar tensor.
    """
    n = _count(x, mask, None)
    centered = x - masked_mean(x, mask)
    sum_sq = masked_sum(centered.square(), mask)
    denom = n - 1 if unbiased else n
    return torch.where(denom > 0, sum_sq / denom.clamp(min=1), torch.zeros_like(sum_sq))


def masked_whiten(x: Tensor, mask: Tensor, *, shift_mean: bool = True, eps: float = 1e-8) -> Tensor:
    """Normalise the counted elements of ``x`` to mean 0 and (unbiased) variance 1.

    This is the per-batch advantage normalisation of PPO implementations (Huang et al. 2022,
    "The 37 Implementation Details of PPO", ICLR blog track, detail 7). With ``shift_mean=False``
    the output keeps the input's mean and only its spread is normalised to 1 (as TRL's
    ``whiten``), which preserves e.g. an overall positive reward level.

    Args:
        x: any shape, floating.
        mask: bool, broadcastable to ``x``.
        shift_mean: centre on 0 (True) or keep the input's mean (False).
        eps: added to the variance before the square root.

    Returns:
        tensor shaped like ``x``; positions outside the mask are 0.
    """
    mean = masked_mean(x, mask)
    var = masked_var(x, mask, unbiased=True)
    whitened = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        whitened = whitened + mean
    return torch.where(mask, whitened, torch.zeros((), dtype=whitened.dtype, device=x.device))
