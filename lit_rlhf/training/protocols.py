"""The callback protocols: how a callback reaches a module's loss, rewards and gradients.

No Lightning hook lets a callback change the loss, a reward or a gradient before clipping, so the
module asks its callbacks instead, at three documented points. Any LightningModule adopts each
protocol in one or two lines (``lit_rlhf.training`` modules all do):

Loss terms, between computing the per-token policy loss and aggregating it::

    ctx = PolicyLossContext(logits, log_probs, old_log_probs, advantages, mask, pg_loss)
    extra, stats = policy_loss_terms(self.trainer, self, ctx)
    loss = masked_mean(pg_loss + extra, mask)      # aggregate the sum with your own rule

A callback takes part by defining ``policy_loss_term(trainer, pl_module, ctx)`` returning a
per-token term [b, R] (zero outside ``mask``) and a dict of detached scalar diagnostics, or
``None`` to abstain this step. Terms are summed; diagnostics are returned under
``<callback class name>/<key>`` for the module to log. Under packing (``micro_batch_tokens``)
the context keeps these per-sequence shapes; its ``logits`` are built only when some loss-term
callback may read them (one without a class attribute ``reads_logits = False``), else they are
an empty [b, R, 0] tensor and ``full_vocab_stats`` come precomputed from the chunked head.

Reward terms, after the injected reward scored a rollout and before advantages::

    extra, stats = reward_terms(self.trainer, self, RewardContext(...))
    scores = scores + extra                         # [B]

A callback defines ``reward_term(trainer, pl_module, ctx)`` returning a [B] term and detached
diagnostics, or ``None`` (e.g. the consistency rewards of ConsistRM).

Gradient hooks, between backward and clipping (``OptimizerStep`` calls them)::

    stats = gradient_hooks(self.trainer, self, Gradients(self, self.trainer.strategy))

A callback defines ``on_gradients(trainer, pl_module, grads)`` and reads or rewrites gradients
through ``grads`` (a :class:`lit_rlhf.training.gradients.Gradients`, which goes through
DeepSpeed's full-gradient accessors under ZeRO, where ``param.grad`` is None). It returns
detached diagnostics or ``None``. Every rank calls the hooks at the same point.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor

from lit_rlhf.algos import entropy_and_top1, masked_mean


@dataclass
class PolicyLossContext:
    """What a loss-term callback may read for one micro-batch (shapes [b, R, V] / [b, R])."""

    logits: Tensor  # [b, R, V] tempered logits at the response positions; gradient flows
    log_probs: Tensor  # [b, R] log pi(a_t | s_t) under the current policy; gradient flows
    old_log_probs: Tensor  # [b, R] log-probs of the rollout policy (detached)
    advantages: Tensor  # [b, R]
    mask: Tensor  # [b, R] bool, True = response token that counts
    per_token_loss: Tensor  # [b, R] the policy-gradient loss before any extra term
    _full_vocab: tuple[Tensor, Tensor] | None = field(default=None, init=False, repr=False)

    def full_vocab_stats(self) -> tuple[Tensor, Tensor]:
        """Per-token full-vocabulary entropy and top-1 probability [b, R], detached.

        Computed on first use and shared by every reader of this micro-batch (the module's own
        ``ppo/entropy`` log and each callback's diagnostics), so logging them costs one pass.
        """
        if self._full_vocab is None:
            self._full_vocab = entropy_and_top1(self.logits)
        return self._full_vocab

    def full_vocab_means(self) -> dict[str, Tensor]:
        """Masked means of :meth:`full_vocab_stats`: ``entropy`` and ``top1_mass``."""
        entropy, top1 = self.full_vocab_stats()
        return {
            "entropy": masked_mean(entropy, self.mask),
            "top1_mass": masked_mean(top1, self.mask),
        }


@runtime_checkable
class PolicyLossTerm(Protocol):
    def policy_loss_term(
        self, trainer: Any, pl_module: Any, ctx: PolicyLossContext
    ) -> tuple[Tensor, Mapping[str, Tensor]] | None: ...


def policy_loss_terms(
    trainer: Any, pl_module: Any, ctx: PolicyLossContext
) -> tuple[Tensor, dict[str, Tensor]]:
    """Sum the per-token terms of every callback in ``trainer.callbacks`` that implements
    :class:`PolicyLossTerm`. Returns (term [b, R], diagnostics)."""
    total = torch.zeros_like(ctx.per_token_loss)
    stats: dict[str, Tensor] = {}
    for callback in _callbacks(trainer, PolicyLossTerm):
        result = callback.policy_loss_term(trainer, pl_module, ctx)
        if result is None:
            continue
        term, term_stats = result
        if term.shape != ctx.per_token_loss.shape:
            raise ValueError(
                f"{type(callback).__name__}.policy_loss_term returned shape {tuple(term.shape)}, "
                f"expected the per-token shape {tuple(ctx.per_token_loss.shape)}"
            )
        total = total + term.masked_fill(~ctx.mask, 0.0)
        name = type(callback).__name__
        stats.update({f"{name}/{k}": v.detach() for k, v in term_stats.items()})
    return total, stats


def loss_terms_read_logits(trainer: Any) -> bool:
    """Whether a :class:`PolicyLossTerm` callback of ``trainer`` may read
    ``PolicyLossContext.logits``: every one that does not declare ``reads_logits = False``
    (the packed update then builds the [b, R, V] logits for it)."""
    return any(getattr(c, "reads_logits", True) for c in _callbacks(trainer, PolicyLossTerm))


@dataclass
class RewardContext:
    """What a reward-term callback may read for one rollout (B = prompts x samples)."""

    prompts: Sequence[str]  # [B] rendered prompt text
    responses: Sequence[str]  # [B] decoded responses
    rows: Sequence[Mapping[str, Any]]  # [B] the data rows
    query_ids: Sequence[str]  # [B] stable prompt ids (equal within a group)
    tasks: Sequence[str]  # [B] task / domain labels
    group_ids: Tensor  # [B] long, which prompt of the batch the sample came from
    scores: Tensor  # [B] float32, the injected reward's scores (before any term)
    # the terms of the callbacks called before this one, by callback class name ([B] each), so
    # a term may build on another (ConsistRM's critique bonus on its answer reward)
    terms: dict[str, Tensor] = field(default_factory=dict)


@runtime_checkable
class RewardTerm(Protocol):
    def reward_term(
        self, trainer: Any, pl_module: Any, ctx: RewardContext
    ) -> tuple[Tensor, Mapping[str, Tensor]] | None: ...


def reward_terms(
    trainer: Any, pl_module: Any, ctx: RewardContext
) -> tuple[Tensor, dict[str, Tensor]]:
    """Sum the [B] terms of every callback implementing :class:`RewardTerm`, called in the
    trainer's callback order (each sees the earlier ones in ``ctx.terms``). Returns (term [B],
    diagnostics under ``<callback class name>/<key>``)."""
    total = torch.zeros_like(ctx.scores)
    stats: dict[str, Tensor] = {}
    for callback in _callbacks(trainer, RewardTerm):
        result = callback.reward_term(trainer, pl_module, ctx)
        if result is None:
            continue
        term, term_stats = result
        name = type(callback).__name__
        term = torch.as_tensor(term, dtype=total.dtype, device=total.device)
        if term.shape != total.shape or not torch.isfinite(term).all():
            raise ValueError(
                f"{name}.reward_term returned shape {tuple(term.shape)} (finite: "
                f"{bool(torch.isfinite(term).all())}); expected {len(total)} finite floats, one "
                "per response"
            )
        total = total + term
        ctx.terms[name] = term
        stats.update({f"{name}/{k}": torch.as_tensor(v).detach() for k, v in term_stats.items()})
    return total, stats


@runtime_checkable
class GradientHook(Protocol):
    def on_gradients(
        self, trainer: Any, pl_module: Any, grads: Any
    ) -> Mapping[str, Tensor] | None: ...


def gradient_hooks(trainer: Any, pl_module: Any, grads: Any) -> dict[str, Tensor]:
    """Call ``on_gradients`` of every callback implementing :class:`GradientHook`, in the
    trainer's callback order; returns their diagnostics under ``<callback class name>/<key>``."""
    stats: dict[str, Tensor] = {}
    for callback in _callbacks(trainer, GradientHook):
        result = callback.on_gradients(trainer, pl_module, grads)
        name = type(callback).__name__
        stats.update(
            {f"{name}/{k}": torch.as_tensor(v).detach() for k, v in (result or {}).items()}
        )
    return stats


@runtime_checkable
class TaskGradientHook(Protocol):
    """A callback that takes one gradient per task (domain) for every optimizer step and returns
    the gradient to step with (MGS's ``ModularGradientSurgery``). The core then runs the backward
    task by task (:mod:`lit_rlhf.training.task_backward`)."""

    def combine_task_gradients(
        self, trainer: Any, pl_module: Any, grads_by_task: Mapping[str, Mapping[str, Tensor]]
    ) -> tuple[Mapping[str, Tensor], Mapping[str, Tensor]]: ...


def gradient_task_labels(
    hook: Any, trainer: Any, tasks: Sequence[str], group_ids: Sequence[int]
) -> list[str]:
    """Each sample's task for the per-task backward: the rollout's own (``tasks``), unless the
    :class:`TaskGradientHook` also defines ``task_labels(trainer, tasks, group_ids) -> list[str]``
    (optional; e.g. MGS's null control permutes the labels across prompt groups); ``group_ids``
    are the samples' prompt groups. Rewards never see these labels."""
    relabel = getattr(hook, "task_labels", None)
    if not callable(relabel):
        return list(tasks)
    labels = [str(t) for t in relabel(trainer, tasks, group_ids)]
    if len(labels) != len(tasks):
        raise ValueError(
            f"{type(hook).__name__}.task_labels returned {len(labels)} labels for "
            f"{len(tasks)} samples"
        )
    return labels


def task_gradient_hook(trainer: Any) -> Any:
    """The trainer's :class:`TaskGradientHook` callback (None without one); two are an error."""
    hooks = _callbacks(trainer, TaskGradientHook)
    if len(hooks) > 1:
        names = [type(h).__name__ for h in hooks]
        raise ValueError(
            f"the trainer has {len(hooks)} callbacks that combine per-task gradients ({names}); "
            "only one can decide the gradient. Fix: keep one of them."
        )
    return hooks[0] if hooks else None


def _callbacks(trainer: Any, protocol: type) -> list[Any]:
    return [c for c in getattr(trainer, "callbacks", None) or [] if isinstance(c, protocol)]
