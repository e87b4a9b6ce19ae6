"""Modular gradient surgery (MGS, arXiv 2602.02301) as a callback: one gradient per domain for
every optimizer step, PCGrad applied to each parameter group, the projected gradients summed.

Any LightningModule built on :class:`~lit_rlhf.training.OptimizerStep` that names each
micro-batch's task (``task_of``; ``PPOModule`` uses the rows' ``task``) gets it by adding the
callback: the core then runs the backward task by task (:mod:`lit_rlhf.training.task_backward`,
per-domain reduction under DDP and DeepSpeed ZeRO-1/2, per-domain reduce-scatter under FSDP2;
ZeRO-3 is refused at setup) and hands the per-domain gradients here (under FSDP2 each rank's
shards: PCGrad's inner products are summed over the ranks, :mod:`lit_rlhf.algos.sharded_surgery`).
``granularity: global`` is plain PCGrad, the paper's baseline; mixed RL is training without the
callback.

Extra memory: one float32 copy of the trainable parameters' gradient per domain present in the
step (3 domains: 12 bytes per parameter on top of the usual gradient; under FSDP2 divided by the
world size).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from lightning import Callback
from torch import Tensor

from lit_rlhf.algos.gradient_surgery import (
    GRANULARITIES,
    Granularity,
    conflict_summary,
    group_parameters,
    permute_task_labels,
    surgery,
    task_gram,
)
from lit_rlhf.algos.sharded_surgery import sharded_surgery
from lit_rlhf.strategies.fsdp2 import is_fsdp2
from lit_rlhf.training.task_backward import check_task_backward_supported


class ModularGradientSurgery(Callback):
    """PCGrad per parameter group over the domains of each optimizer step.

    Args:
        granularity: the parameter groups: ``tensor`` (the authors' code), ``module`` (attention
            and MLP of each layer, the paper's description), ``layer`` or ``global`` (PCGrad).
        seed: seeds the random task orders; the generator of a step is seeded by (seed, global
            step), so every rank draws the same orders and a resumed run the same as before.
        module_map: at ``module`` granularity, the kind (``attention``, ``mlp``, ``tensor``)
            of decoder-block submodules the built-in names do not know, by exact name (e.g.
            ``{dense: mlp}``). A parameter that is still unknown is refused when fit starts
            (before the first rollout), naming it and this fix.
        apply: False measures only: the step's gradient is the plain sum of the domain
            gradients (mixed RL) and the logged conflicts are those PCGrad would act on.
        diagnostics: more granularities measured on the SAME per-domain gradients every step
            (e.g. ``[module, global]``: conflicts per module and over the whole gradient, and
            the share of the gradient's norm PCGrad would remove at each), whatever ``apply``.
        shuffle_tasks: the null control of the diagnostics: every step, the domain labels are
            permuted across the step's prompts before the per-domain split (a prompt's samples
            keep one label, each domain its number of prompts; rewards are untouched, they were
            given by the true labels), so "domains" are random prompt sets of the same sizes.

    Logged per step (under ``ModularGradientSurgery/``): ``cosine_mean`` and ``cosine_min`` of
    the original domain gradients over all groups and domain pairs, ``conflict_fraction`` (the
    share of (group, pair) with negative cosine), ``projections`` (per group, mean),
    ``removed_share`` (``|g - g'| / |g|``, g the plain sum, g' the surgery's; 0 without
    ``apply``), ``norm_ratio`` (``|g'| / |g|``), ``domains`` (domains in the step); per
    diagnostic granularity ``<granularity>/conflict_fraction``, ``/cosine_mean``,
    ``/removed_share``, ``/norm_ratio`` and ``/undefined_pairs``
    (:func:`~lit_rlhf.algos.gradient_surgery.conflict_summary`). Cosines and conflicts count
    only pairs where both domain gradients are non-zero (a domain whose rewards all tied this
    step has a zero gradient and no direction); a step with no such pair logs no cosine.
    """

    def __init__(
        self,
        granularity: Granularity = "module",
        seed: int = 0,
        module_map: dict[str, str] | None = None,
        apply: bool = True,
        diagnostics: Sequence[Granularity] = (),
        shuffle_tasks: bool = False,
    ) -> None:
        bad = [g for g in (granularity, *diagnostics) if g not in GRANULARITIES]
        if bad:
            raise ValueError(
                f"granularity must be one of {GRANULARITIES} (each of diagnostics too), got {bad}"
            )
        group_parameters([], granularity, module_map)  # validates module_map now
        self.granularity, self.seed, self.module_map = granularity, seed, dict(module_map or {})
        self.apply, self.diagnostics = apply, list(dict.fromkeys(diagnostics))
        self.shuffle_tasks = shuffle_tasks
        self._groups: dict[str, list[str]] | None = None
        self._diagnostic_groups: dict[str, dict[str, list[str]]] = {}

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        check_task_backward_supported(trainer.strategy, type(self).__name__)
        if stage == "fit" and getattr(pl_module, "automatic_optimization", True):
            raise ValueError(
                f"{type(self).__name__} on {type(pl_module).__name__}, a module with automatic "
                "optimisation: Lightning's own backward never hands it per-domain gradients, so "
                "it would do nothing. Fix: use manual optimisation with "
                "lit_rlhf.training.OptimizerStep(task_of=...) as the step (clipping by its "
                "max_grad_norm, after the surgery; README: 'Your own LightningModule'), or leave "
                "the callback out."
            )

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        """Group the trainable parameters now, so an unknown parameter name fails before the
        first rollout rather than at the first optimizer step. (Whether the per-domain
        gradients fit the GPU, next to everything else it holds, is the memory plan's check in
        the module's ``setup``: :mod:`lit_rlhf.plan.check`.)"""
        trainable = [n for n, p in pl_module.named_parameters() if p.requires_grad]
        self._groups = group_parameters(trainable, self.granularity, self.module_map)

    def combine_task_gradients(
        self, trainer: Any, pl_module: Any, grads_by_task: Mapping[str, Mapping[str, Tensor]]
    ) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        """The surgery's gradient per parameter name and the step's diagnostics."""
        names = list(next(iter(grads_by_task.values())))
        if self._groups is None or sum(len(v) for v in self._groups.values()) != len(names):
            self._groups = group_parameters(names, self.granularity, self.module_map)
            self._diagnostic_groups = {}
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + trainer.global_step)
        if is_fsdp2(trainer.strategy):  # shards of every task's gradient: Gram matrices summed
            return self._combine_shards(trainer, grads_by_task, names, generator)
        if self.apply:
            combined, stats = surgery(grads_by_task, self._groups, generator=generator)
        else:
            combined, stats = _plain_sum(grads_by_task, names), {}
        out = _summary(grads_by_task, stats, _norm_change(grads_by_task, combined))
        if self.diagnostics and len(grads_by_task) > 1:  # the Gram matrices only then
            out.update(self._diagnose(trainer, task_gram(grads_by_task)[1], names))
        return combined, out

    def _combine_shards(
        self,
        trainer: Any,
        grads_by_task: Mapping[str, Mapping[str, Tensor]],
        names: list[str],
        generator: torch.Generator,
    ) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        """Under FSDP2: this rank's shards combined with PCGrad's weights from the Gram
        matrices summed over the ranks (:mod:`lit_rlhf.algos.sharded_surgery`)."""
        assert self._groups is not None
        device = next(iter(next(iter(grads_by_task.values())).values())).device
        result = sharded_surgery(
            grads_by_task, self._groups, reduce=lambda t: _sum_over_ranks(t, device),
            generator=generator, apply=self.apply,
        )  # fmt: skip
        shares = {"removed_share": result.removed_share, "norm_ratio": result.norm_ratio}
        norms = {k: torch.tensor(v) for k, v in shares.items()}
        out = _summary(grads_by_task, result.stats if self.apply else {}, norms)
        out.update(self._diagnose(trainer, result.grams, names))
        return result.combined, out

    def task_labels(
        self, trainer: Any, tasks: Sequence[str], group_ids: Sequence[int]
    ) -> list[str]:
        """The domain label of each sample for the per-domain split: the true ones, or with
        ``shuffle_tasks`` a seeded permutation across the step's prompt groups (the null)."""
        if not self.shuffle_tasks:
            return list(tasks)
        step = int(getattr(trainer, "global_step", 0))
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + step + 7_919)
        return permute_task_labels(tasks, group_ids, generator=generator)

    def _diagnose(
        self, trainer: Any, grams: Mapping[str, Tensor], names: list[str]
    ) -> dict[str, Tensor]:
        """The diagnostic granularities' conflict summaries from the tensors' Gram matrices
        (whole gradients': summed over ranks under FSDP2)."""
        if not self.diagnostics or not grams or next(iter(grams.values())).shape[0] < 2:
            return {}
        out: dict[str, Tensor] = {}
        for granularity in self.diagnostics:
            if granularity not in self._diagnostic_groups:
                self._diagnostic_groups[granularity] = group_parameters(
                    names, granularity, self.module_map
                )
            seed = self.seed * 1_000_003 + int(trainer.global_step)
            summary = conflict_summary(grams, self._diagnostic_groups[granularity],
                                       generator=torch.Generator().manual_seed(seed))  # fmt: skip
            for key in ("conflict_fraction", "cosine_mean", "removed_share", "norm_ratio"):
                value = float(getattr(summary, key))
                if not math.isnan(value):  # no pair with a cosine this step: nothing to log
                    out[f"{granularity}/{key}"] = torch.tensor(value)
            out[f"{granularity}/undefined_pairs"] = torch.tensor(float(summary.undefined_pairs))
        return out


def _summary(
    grads_by_task: Mapping[str, Any], stats: Mapping[str, Any], norms: dict[str, Tensor]
) -> dict[str, Tensor]:
    """The step's logged figures: domains, projections per group, the norm change, and the
    pairwise cosines' mean, minimum and conflict fraction (when any pair has one)."""
    cosines = [c for s in stats.values() for c in s.cosine.values()]
    out = {
        "domains": torch.tensor(float(len(grads_by_task))),
        "projections": torch.tensor(
            sum(s.projections for s in stats.values()) / max(len(stats), 1)
        ),
        **norms,
    }
    if cosines:
        values = torch.tensor(cosines)
        out.update(
            cosine_mean=values.mean(),
            cosine_min=values.min(),
            conflict_fraction=(values < 0).float().mean(),
        )
    return out


def _sum_over_ranks(tensor: Tensor, device: torch.device) -> Tensor:
    """``tensor`` summed over the ranks (on ``device``: NCCL reduces CUDA tensors only)."""
    import torch.distributed as dist

    reduced = tensor.to(device)
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(reduced)
    return reduced.cpu()


def _plain_sum(
    grads_by_task: Mapping[str, Mapping[str, Tensor]], names: list[str]
) -> dict[str, Tensor]:
    """The sum over tasks of each parameter's gradient (mixed RL's gradient)."""
    tasks = list(grads_by_task.values())
    return {n: torch.stack([grads[n] for grads in tasks if n in grads]).sum(dim=0) for n in names}


def _norm_change(
    grads_by_task: Mapping[str, Mapping[str, Tensor]], combined: Mapping[str, Tensor]
) -> dict[str, Tensor]:
    """``removed_share`` = |g - g'| / |g| and ``norm_ratio`` = |g'| / |g| (g: the plain sum of
    the task gradients, g': the combined one), over all parameters."""
    before = after = removed = 0.0
    for name, new in combined.items():
        parts = [grads[name].float() for grads in grads_by_task.values() if name in grads]
        plain = torch.stack(parts).sum(dim=0)
        before += float(plain.pow(2).sum())
        after += float(new.float().pow(2).sum())
        removed += float((plain - new.float()).pow(2).sum())
    scale = before**0.5
    return {
        "removed_share": torch.tensor(removed**0.5 / scale if scale > 0 else 0.0),
        "norm_ratio": torch.tensor(after**0.5 / scale if scale > 0 else 0.0),
    }
