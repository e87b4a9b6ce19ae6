"""PCGrad per group on gradient shards: MGS under FSDP2, where each rank holds a slice of every
task's gradient and no rank holds a whole one.

PCGrad in a group depends on the task gradients only through their inner products: the
projected sum is ``g' = sum_k w_k g_k`` with ``w`` from :func:`pcgrad_coefficients` on the
group's Gram matrix ``G[a, b] = <g_a, g_b>`` (the same random orders, the same projections as
:func:`~lit_rlhf.algos.gradient_surgery.project_conflicting`). A Gram matrix is a sum over
elements, so each rank computes it on its shards, one all-reduce (``reduce``: a sum over ranks)
of every tensor's ``T x T`` matrix gives the whole gradients' matrices, and each rank then
combines its own shards with the shared weights. The per-task gradients are never gathered:
memory stays ``tasks x parameters x 4 / world`` bytes per rank.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
from torch import Tensor

from lit_rlhf.algos.gradient_surgery import SurgeryStats, pcgrad_coefficients, task_gram


@dataclass
class ShardedSurgery:
    """What :func:`sharded_surgery` returns: this rank's shard of the combined gradient per
    parameter name, each group's :class:`SurgeryStats`, every tensor's whole-gradient Gram
    matrix (float64, CPU; for the diagnostics), and ``removed_share`` = |g - g'| / |g|,
    ``norm_ratio`` = |g'| / |g| over all groups (g: the plain sum of the tasks)."""

    combined: dict[str, Tensor]
    stats: dict[str, SurgeryStats]
    grams: dict[str, Tensor]
    removed_share: float
    norm_ratio: float


def sharded_surgery(
    grads_by_task: Mapping[str, Mapping[str, Tensor]],
    groups: Mapping[str, list[str]],
    *,
    reduce: Callable[[Tensor], Tensor],
    generator: torch.Generator | None = None,
    apply: bool = True,
) -> ShardedSurgery:
    """PCGrad per group on this rank's shards (``apply=False``: the plain sum of the tasks).

    Args:
        grads_by_task: per task, this rank's shard of its gradient per parameter name (every
            task has every parameter: a task a rank lacks has zeros there).
        groups: parameter groups (:func:`~lit_rlhf.algos.gradient_surgery.group_parameters`).
        reduce: sums a tensor over the ranks (and returns it).
        generator: the random task orders, drawn group by group in ``groups``' order.
    """
    tasks, local = task_gram(grads_by_task)
    names = list(local)
    summed = reduce(torch.stack([local[n] for n in names]))
    grams = dict(zip(names, summed.double().cpu(), strict=True))
    out = ShardedSurgery({}, {}, grams, 0.0, 0.0)
    before = after = removed = 0.0
    for group, members in groups.items():
        present = [n for n in members if n in grams]
        if not present:
            continue
        gram = torch.stack([grams[n] for n in present]).sum(dim=0)
        coef = _coefficients(gram, generator) if apply else torch.eye(len(tasks)).double()
        weights = coef.sum(dim=0)
        for name in present:
            stacked = torch.stack([grads_by_task[t][name].float() for t in tasks])
            mixed = torch.tensordot(weights.to(stacked), stacked, dims=1)
            out.combined[name] = mixed.to(grads_by_task[tasks[0]][name].dtype)
        out.stats[group] = _stats(tasks, gram, coef)
        ones = torch.ones_like(weights)
        before += float(ones @ gram @ ones)
        after += float(weights @ gram @ weights)
        removed += float((ones - weights) @ gram @ (ones - weights))
    scale = max(before, 0.0) ** 0.5
    if scale > 0:
        out.removed_share = max(removed, 0.0) ** 0.5 / scale
        out.norm_ratio = max(after, 0.0) ** 0.5 / scale
    return out


def _coefficients(gram: Tensor, generator: torch.Generator | None) -> Tensor:
    """PCGrad's coefficients; one task draws no order (as ``project_conflicting``)."""
    if gram.shape[0] == 1:
        return torch.ones(1, 1, dtype=torch.float64)
    return pcgrad_coefficients(gram, generator=generator)


def _stats(tasks: list[str], gram: Tensor, coef: Tensor) -> SurgeryStats:
    """Cosines of each pair of original task gradients (none where one is zero), conflicts,
    and projections (each (i, j) is visited once: a nonzero off-diagonal coefficient)."""
    stats = SurgeryStats()
    norms = gram.diagonal().clamp(min=0).sqrt()
    for a in range(len(tasks)):
        for b in range(a + 1, len(tasks)):
            denom = float(norms[a] * norms[b])
            if denom > 0:
                cosine = float(gram[a, b]) / denom
                stats.cosine[(tasks[a], tasks[b])] = cosine
                stats.conflicts += cosine < 0
    off_diagonal = coef - torch.diag(coef.diagonal())
    stats.projections = int((off_diagonal != 0).sum())
    return stats
