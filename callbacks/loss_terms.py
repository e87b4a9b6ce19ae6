"""The loss-term protocol: how a callback adds a per-token term to a policy loss.

No Lightning hook lets a callback change the loss, so the module asks its callbacks instead. Any
LightningModule adopts the protocol in one line, between computing its per-token policy loss and
aggregating it::

    ctx = PolicyLossContext(logits, log_probs, old_log_probs, advantages, mask, pg_loss)
    extra, stats = policy_loss_terms(self.trainer, self, ctx)
    loss = masked_mean(pg_loss + extra, mask)      # aggregate the sum with your own rule

A callback takes part by defining ``policy_loss_term(trainer, pl_module, ctx)`` returning a
per-token term [b, R] (zero outside ``mask``) and a dict of detached scalar diagnostics, or
``None`` to abstain this step. Terms are summed; diagnostics are returned under
``<callback class name>/<key>`` for the module to log.
"""

from __future__ import annotations

from collections.abc import Mapping
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
    for callback in getattr(trainer, "callbacks", None) or []:
        if not isinstance(callback, PolicyLossTerm):
            continue
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
