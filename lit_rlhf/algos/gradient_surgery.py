"""Modular gradient surgery (MGS, arXiv 2602.02301): PCGrad (Yu et al. 2020) applied to each
parameter group separately, so domains whose gradients conflict in one module (say attention of
layer 3) are reconciled there without disturbing the modules where they agree.

Within one group, for each task i (in a random order) the projected gradient starts as g_i and,
for each other task j (in a random order), loses its component along the ORIGINAL g_j when they
conflict (<g_i', g_j> < 0; skipped when |g_j|^2 <= 1e-12). The group's gradient is the SUM of the
projected task gradients; one task present gives its raw gradient. Granularity decides the
groups: ``tensor`` (the authors' code), ``module`` (attention vs MLP per layer, as the paper
describes; other tensors alone), ``layer`` (one decoder block), ``global`` (one group: plain
PCGrad over the flattened gradient).

Decisions the paper leaves open:
- inner products and projections are computed in float32 whatever the gradients' dtype, and the
  result is cast back;
- the task order is drawn from the given ``torch.Generator`` (one permutation of the tasks for the
  outer loop, one per task for its inner loop), so a seeded run is reproducible on every rank;
- a tensor belongs to a decoder block when its name has a numeric component (``model.layers.3``);
  within a block, the submodule's name decides at ``module`` granularity (:data:`MODULE_KINDS`):
  attention (``self_attn``, ``attn``, ``attention``, ``self_attention``), the MLP (``mlp``,
  ``feed_forward``, ``ffn``, ``fc1``/``fc2`` as in OPT, ``fc_in``/``fc_out``, ``experts``,
  ``block_sparse_moe``) or a norm (``*norm*``, ``ln_1``, ``ln_2``: a group of its own); a tensor
  held by the numbered module itself (``net.0.weight``) groups with its siblings. This covers
  Llama / Qwen / Mistral / Gemma / Mixtral, GPT-2, GPT-J, OPT, GPT-NeoX, Phi, Falcon and Bloom;
- outside the blocks, embeddings, heads and final norms (:data:`TOP_LEVEL`) are groups of their
  own; any other name is REFUSED at ``module`` granularity, naming the parameter and the fix
  (``granularity: tensor``, or ``module_map`` saying which kind its submodule is), rather than
  silently made a per-tensor group.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import Tensor

Granularity = Literal["tensor", "module", "layer", "global"]
GRANULARITIES = ("tensor", "module", "layer", "global")
_EPS = 1e-12
_BLOCK = re.compile(r"^(.*?\.\d+)\.")  # the path up to the first numeric component
_ATTENTION = re.compile(r"attn|attention", re.IGNORECASE)
_MLP = re.compile(r"mlp|feed_forward|ffn|^fc\d*$|^fc_(in|out)$|experts|moe", re.IGNORECASE)
_NORM = re.compile(r"norm|^ln(_|$)", re.IGNORECASE)
MODULE_KINDS = ("attention", "mlp", "tensor")
"""What a block's submodule can be mapped to (``module_map``): its attention or MLP group, or a
group per tensor (norms are ``tensor``)."""
TOP_LEVEL = re.compile(
    r"embed|wte|wpe|word_embeddings|head|norm|^ln(_|$)|score|^value|project_(in|out)",
    re.IGNORECASE,
)
"""Names of the modules outside the decoder blocks that ``module`` granularity knows (each
tensor a group of its own): embeddings, LM / value / score heads, final norms."""


@dataclass
class SurgeryStats:
    """One group's diagnostics: cosine similarity of each pair of ORIGINAL task gradients
    (sorted task names; a pair with a zero gradient has none and is absent), how many pairs
    conflict (cosine < 0) and how many projections ran."""

    cosine: dict[tuple[str, str], float] = field(default_factory=dict)
    conflicts: int = 0
    projections: int = 0


def project_conflicting(
    grads_by_task: Mapping[str, Tensor],
    *,
    generator: torch.Generator | None = None,
    eps: float = _EPS,
) -> tuple[Tensor, SurgeryStats]:
    """The PCGrad-combined gradient of one parameter group (the sum of
    :func:`projected_task_gradients`, in float32) and its diagnostics.

    Args:
        grads_by_task: each task's gradient for this group, all of one shape.
        generator: draws the random task orders (CPU generator; None: the global RNG).
        eps: projections onto a gradient with squared norm at most ``eps`` are skipped.
    """
    first, projected, stats = _project(grads_by_task, generator, eps)
    total = torch.stack(list(projected.values())).sum(dim=0)
    return total.reshape(first.shape).to(first.dtype), stats


def projected_task_gradients(
    grads_by_task: Mapping[str, Tensor],
    *,
    generator: torch.Generator | None = None,
    eps: float = _EPS,
) -> tuple[dict[str, Tensor], SurgeryStats]:
    """Each task's gradient after PCGrad's projections (arguments of
    :func:`project_conflicting`), keyed by task, and the group's diagnostics."""
    first, projected, stats = _project(grads_by_task, generator, eps)
    return {n: g.reshape(first.shape).to(first.dtype) for n, g in projected.items()}, stats


def _project(
    grads_by_task: Mapping[str, Tensor], generator: torch.Generator | None, eps: float
) -> tuple[Tensor, dict[str, Tensor], SurgeryStats]:
    """(the first task's gradient, each task's flat float32 projected gradient, stats)."""
    if not grads_by_task:
        raise ValueError("grads_by_task is empty: at least one task must have a gradient")
    names = sorted(grads_by_task)
    shapes = {tuple(grads_by_task[n].shape) for n in names}
    if len(shapes) != 1:
        raise ValueError(f"task gradients of one group must share a shape, got {shapes}")
    first = grads_by_task[names[0]]
    flat = torch.stack([grads_by_task[n].detach().reshape(-1).float() for n in names])
    if len(names) == 1:
        return first, {names[0]: flat[0]}, SurgeryStats()
    norms_sq = (flat * flat).sum(dim=1)
    stats = _pair_stats(names, flat, norms_sq)
    projected: dict[str, Tensor] = {}
    for i in torch.randperm(len(names), generator=generator).tolist():
        g = flat[i].clone()
        others = [j for j in torch.randperm(len(names), generator=generator).tolist() if j != i]
        for j in others:
            dot = torch.dot(g, flat[j])
            if dot < 0 and norms_sq[j] > eps:
                g -= dot / norms_sq[j] * flat[j]
                stats.projections += 1
        projected[names[i]] = g
    return first, {n: projected[n] for n in names}, stats


def _pair_stats(names: list[str], flat: Tensor, norms_sq: Tensor) -> SurgeryStats:
    stats = SurgeryStats()
    norms = norms_sq.sqrt()
    for a in range(len(names)):
        for b in range(a + 1, len(names)):
            denom = float(norms[a] * norms[b])
            if denom > 0:  # a zero gradient has no direction: no cosine (conflict_summary)
                cos = float(torch.dot(flat[a], flat[b])) / denom
                stats.cosine[(names[a], names[b])] = cos
                stats.conflicts += cos < 0
    return stats


def group_parameters(
    names: Iterable[str],
    granularity: Granularity,
    module_map: Mapping[str, str] | None = None,
) -> dict[str, list[str]]:
    """Parameter names grouped for surgery, in their given order within each group.

    Args:
        names: parameter names (``model.named_parameters()``'s, or just the names).
        granularity: ``tensor`` | ``module`` | ``layer`` | ``global``.
        module_map: at ``module`` granularity, the kind (``attention``, ``mlp`` or ``tensor``)
            of block submodules the built-in names do not cover, by their exact name (e.g.
            ``{"dense": "mlp"}``); it takes precedence over the built-in names.

    Raises:
        ValueError: at ``module`` granularity, for a parameter whose place in the model is not
            known (the message names it and the fix).
    """
    if granularity not in GRANULARITIES:
        raise ValueError(f"granularity must be one of {GRANULARITIES}, got {granularity!r}")
    mapping = dict(module_map or {})
    bad = {k: v for k, v in mapping.items() if v not in MODULE_KINDS}
    if bad:
        raise ValueError(f"module_map values must be one of {MODULE_KINDS}, got {bad}")
    groups: dict[str, list[str]] = {}
    for item in names:
        name = item[0] if isinstance(item, tuple) else item
        groups.setdefault(_group_key(name, granularity, mapping), []).append(name)
    return groups


def _group_key(name: str, granularity: str, mapping: Mapping[str, str]) -> str:
    if granularity == "global":
        return "global"
    block = _BLOCK.match(name)
    if granularity == "tensor":
        return name
    if block is None:
        if granularity == "module" and not _top_level_known(name):
            raise _unknown(name, None, None)
        return name
    if granularity == "layer":
        return block.group(1)
    rest = name[block.end() :].split(".")
    if len(rest) == 1:  # a tensor of the numbered module itself (nn.Sequential's net.0.weight)
        return block.group(1)
    kind = _kind(rest[0], mapping)
    if kind is None:
        raise _unknown(name, block.group(1), rest[0])
    return name if kind == "tensor" else f"{block.group(1)}.{kind}"


def _kind(child: str, mapping: Mapping[str, str]) -> str | None:
    """The group kind of a block's submodule: attention, mlp, tensor (norms), None (unknown)."""
    if child in mapping:
        return mapping[child]
    if _NORM.search(child):
        return "tensor"
    if _ATTENTION.search(child):
        return "attention"
    if _MLP.search(child):
        return "mlp"
    return None


def _top_level_known(name: str) -> bool:
    parts = name.split(".")
    return len(parts) == 1 or any(TOP_LEVEL.search(part) for part in parts[:-1])


def _unknown(name: str, block: str | None, child: str | None) -> ValueError:
    where = (
        f"its submodule {child!r} of block {block!r} is neither attention (attn, attention), an "
        "MLP (mlp, feed_forward, ffn, fc1/fc2, fc_in/fc_out, experts) nor a norm"
        if block is not None
        else "it is outside the numbered decoder blocks and is no embedding, head or final norm"
    )
    fix = (
        f"module_map: {{{child}: attention}} (or mlp, or tensor for a group per tensor)"
        if child is not None
        else "granularity: layer"
    )
    return ValueError(
        f"granularity 'module' does not know the parameter {name!r}: {where}. Fix: "
        f"granularity: tensor (a group per tensor, the MGS authors' code), or {fix}."
    )


def surgery(
    grads_by_task: Mapping[str, Mapping[str, Tensor]],
    groups: Mapping[str, list[str]],
    *,
    generator: torch.Generator | None = None,
) -> tuple[dict[str, Tensor], dict[str, SurgeryStats]]:
    """PCGrad per group over whole models' gradients.

    Args:
        grads_by_task: per task, its gradient per parameter name (a task without a gradient for
            a parameter, e.g. one absent from this step, is left out of that parameter's group).
        groups: from :func:`group_parameters`.
        generator: the random task orders, drawn group by group in ``groups``' order.

    Returns:
        The combined gradient per parameter name, and each group's :class:`SurgeryStats`.
    """
    combined: dict[str, Tensor] = {}
    stats: dict[str, SurgeryStats] = {}
    for group, names in groups.items():
        tasks = [t for t, grads in grads_by_task.items() if all(n in grads for n in names)]
        if not tasks:
            continue
        flat = {t: torch.cat([grads_by_task[t][n].reshape(-1) for n in names]) for t in tasks}
        merged, stats[group] = project_conflicting(flat, generator=generator)
        offset = 0
        for n in names:
            like = grads_by_task[tasks[0]][n]
            combined[n] = merged[offset : offset + like.numel()].view_as(like)
            offset += like.numel()
    return combined, stats


# ------------------------------------------------- diagnostics from per-tensor Gram matrices


def task_gram(
    grads_by_task: Mapping[str, Mapping[str, Tensor]],
) -> tuple[list[str], dict[str, Tensor]]:
    """The sorted task names and, per parameter name, the [T, T] float64 Gram matrix of the
    tasks' gradients (``G[a, b] = <g_a, g_b>``). Summing the Gram matrices of a group's tensors
    gives the group's, so conflicts and PCGrad can be measured at every granularity from one
    pass over the gradients, without flattening them. Only parameters every task has count."""
    tasks = sorted(grads_by_task)
    if not tasks:
        raise ValueError("grads_by_task is empty: at least one task must have a gradient")
    names = [n for n in grads_by_task[tasks[0]] if all(n in grads_by_task[t] for t in tasks)]
    grams: dict[str, Tensor] = {}
    for name in names:
        flat = torch.stack([grads_by_task[t][name].detach().reshape(-1).float() for t in tasks])
        grams[name] = (flat @ flat.T).double().cpu()
    return tasks, grams


def pcgrad_coefficients(
    gram: Tensor, *, generator: torch.Generator | None = None, eps: float = _EPS
) -> Tensor:
    """[T, T] coefficients C of PCGrad in the span of the ORIGINAL task gradients: the projected
    gradient of task i is ``sum_k C[i, k] g_k``. The same algorithm as
    :func:`project_conflicting` (random orders from ``generator``, projections onto the original
    g_j when <g_i', g_j> < 0, skipped when |g_j|^2 <= eps), run on the Gram matrix alone."""
    n = gram.shape[0]
    coef = torch.eye(n, dtype=torch.float64)
    for i in torch.randperm(n, generator=generator).tolist():
        for j in torch.randperm(n, generator=generator).tolist():
            if j == i:
                continue
            dot = coef[i] @ gram[:, j]
            if dot < 0 and gram[j, j] > eps:
                coef[i, j] -= dot / gram[j, j]
    return coef


@dataclass
class ConflictSummary:
    """Conflicts of the task gradients at one granularity, and what PCGrad there would do.

    ``conflict_fraction``: share of (group, task pair) with negative cosine; ``cosine_mean``:
    the mean of those cosines; ``removed_share``: ``|g - g'| / |g|`` with g the plain sum of the
    task gradients and g' PCGrad's sum (all groups together); ``norm_ratio``: ``|g'| / |g|``.
    A pair where either gradient is zero in a group (a task whose rewards all tied this step,
    or a tensor it does not reach) has no cosine: it is left out of both means and counted in
    ``undefined_pairs`` (as a cosine of 0 it would read as "no conflict" and dilute the
    fraction); with no defined pair at all both means are NaN."""

    conflict_fraction: float
    cosine_mean: float
    removed_share: float
    norm_ratio: float
    groups: int
    undefined_pairs: int = 0


def conflict_summary(
    grams: Mapping[str, Tensor],
    groups: Mapping[str, list[str]],
    *,
    generator: torch.Generator | None = None,
) -> ConflictSummary:
    """:class:`ConflictSummary` of per-tensor Gram matrices (:func:`task_gram`) grouped by
    ``groups`` (:func:`group_parameters`); tensors missing from ``grams`` are left out."""
    cosines: list[float] = []
    before_sq = after_sq = removed_sq = 0.0
    used = undefined = 0
    for names in groups.values():
        parts = [grams[n] for n in names if n in grams]
        if not parts:
            continue
        used += 1
        gram = torch.stack(parts).sum(dim=0)
        norms = gram.diagonal().clamp(min=0).sqrt()
        for a in range(gram.shape[0]):
            for b in range(a + 1, gram.shape[0]):
                denom = float(norms[a] * norms[b])
                if denom > 0:
                    cosines.append(float(gram[a, b]) / denom)
                else:
                    undefined += 1
        weights = pcgrad_coefficients(gram, generator=generator).sum(dim=0)  # g' = w . g
        ones = torch.ones_like(weights)
        before_sq += float(ones @ gram @ ones)
        after_sq += float(weights @ gram @ weights)
        removed_sq += float((ones - weights) @ gram @ (ones - weights))
    before = max(before_sq, 0.0) ** 0.5
    return ConflictSummary(
        conflict_fraction=sum(c < 0 for c in cosines) / len(cosines) if cosines else math.nan,
        cosine_mean=sum(cosines) / len(cosines) if cosines else math.nan,
        removed_share=max(removed_sq, 0.0) ** 0.5 / before if before > 0 else 0.0,
        norm_ratio=max(after_sq, 0.0) ** 0.5 / before if before > 0 else 0.0,
        groups=used,
        undefined_pairs=undefined,
    )


def permute_task_labels(
    tasks: Sequence[str], group_ids: Sequence[int], *, generator: torch.Generator | None = None
) -> list[str]:
    """A null control for per-task gradients: the task labels permuted across the prompt groups
    (samples of one prompt keep one label, each task keeps its number of groups), so a
    "domain" becomes a random set of prompts of the same size. ``group_ids[k]`` is the prompt
    group of sample k; a group's label is its first sample's."""
    if len(tasks) != len(group_ids):
        raise ValueError(f"{len(tasks)} task labels but {len(group_ids)} group ids")
    label: dict[int, str] = {}
    for task, group in zip(tasks, group_ids, strict=True):
        label.setdefault(int(group), str(task))
    order = list(label)
    shuffled = [label[order[k]] for k in torch.randperm(len(order), generator=generator).tolist()]
    new = dict(zip(order, shuffled, strict=True))
    return [new[int(g)] for g in group_ids]
