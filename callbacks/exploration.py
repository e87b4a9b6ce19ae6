"""Exploration callbacks for policy-gradient training: trust-region entropy (TRE) and the
baselines it is compared with (arXiv 2602.03635).

Each callback takes part in the loss-term protocol (:mod:`lit_rlhf.training.protocols`): it
returns a per-token term that the module adds to its per-token policy loss before aggregation, so
it works in any LightningModule that calls :func:`policy_loss_terms`. Each has a coefficient
schedule (constant, linear or cosine, optional warmup) driven by its own count of optimizer
steps, which is checkpointed and so continues across a resume.

- :class:`EntropyBonus`: ``-alpha * H(pi)`` over the full vocabulary.
- :class:`TrustRegionEntropy`: ``-alpha * H~_TR`` over the top-K / nucleus region (TRE-K, TRE-P).
- :class:`ForkingTokens`: policy loss only on the top ``top_fraction`` highest-entropy tokens
  (arXiv 2506.01939).
- :class:`KLCov`: ``coef * |log ratio|`` on the top ``top_fraction`` tokens by advantage/log-prob
  covariance (arXiv 2505.22617).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import torch
from lightning import Callback, LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor
from typing_extensions import override

from lit_rlhf.algos import (
    CoefficientSchedule,
    entropy_from_logits,
    forking_token_mask,
    kl_cov_penalty,
    kl_cov_selection,
    masked_mean,
    trust_region_entropy,
)
from lit_rlhf.training.protocols import PolicyLossContext

ScheduleKind = Literal["constant", "linear", "cosine"]
Term = tuple[Tensor, Mapping[str, Tensor]]


class ScheduledValue:
    """A coefficient that follows a :class:`CoefficientSchedule` over this object's own count of
    optimizer steps; the count is the state that survives a resume."""

    def __init__(
        self,
        value: float,
        kind: ScheduleKind,
        final_value: float | None,
        warmup_steps: int,
        total_steps: int | None,
    ) -> None:
        self.schedule = CoefficientSchedule(
            value,
            kind=kind,
            final_value=final_value,
            warmup_steps=warmup_steps,
            total_steps=total_steps,
        )
        self.steps = 0

    def __call__(self) -> float:
        return self.schedule(self.steps)

    def state_dict(self) -> dict[str, Any]:
        return {"steps": self.steps}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.steps = int(state["steps"])


def _check_bonus(alpha: float, final_alpha: float | None, name: str) -> None:
    """An entropy *bonus* weight: a negative one would minimise the entropy."""
    for key, value in (("alpha", alpha), ("final_alpha", final_alpha)):
        if value is not None and not value >= 0:
            raise ValueError(
                f"{name}: {key}={value} must be >= 0 (a negative weight turns the entropy bonus "
                "into an entropy penalty). Fix: use a small positive alpha such as 0.001, or "
                "leave the callback out."
            )


class _Scheduled(Callback):
    """Shared schedule plumbing: count optimizer steps, checkpoint the count."""

    coefficient: ScheduledValue

    @override
    def on_before_optimizer_step(
        self, trainer: Trainer, pl_module: LightningModule, optimizer: Any
    ) -> None:
        self.coefficient.steps += 1

    @override
    def state_dict(self) -> dict[str, Any]:
        return self.coefficient.state_dict()

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.coefficient.load_state_dict(state_dict)


class EntropyBonus(_Scheduled):
    """Full-vocabulary entropy bonus: adds ``-alpha * H(pi_t)`` per response token.

    Args:
        alpha: bonus weight (the TRE paper's baseline uses 0.001).
        schedule, final_alpha, warmup_steps, total_steps: the coefficient schedule.
        chunk_size: positions per chunk of the entropy computation.
    """

    def __init__(
        self,
        alpha: float = 0.001,
        schedule: ScheduleKind = "constant",
        final_alpha: float | None = None,
        warmup_steps: int = 0,
        total_steps: int | None = None,
        chunk_size: int = 1024,
    ) -> None:
        _check_bonus(alpha, final_alpha, type(self).__name__)
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1 (positions per chunk), got {chunk_size}")
        self.coefficient = ScheduledValue(alpha, schedule, final_alpha, warmup_steps, total_steps)
        self.chunk_size = chunk_size

    def policy_loss_term(self, trainer: Any, pl_module: Any, ctx: PolicyLossContext) -> Term:
        alpha = self.coefficient()
        entropy = entropy_from_logits(ctx.logits, chunk_size=self.chunk_size)
        stats = {**ctx.full_vocab_means(), "alpha": torch.tensor(alpha)}
        return -alpha * entropy, stats


class TrustRegionEntropy(_Scheduled):
    """TRE: entropy bonus restricted to the trust region A_t (arXiv 2602.03635, METHOD sec. 3).

    Adds ``-alpha * H~_TR(t)`` per response token, where H~_TR is the entropy of the policy
    renormalised inside A_t (``mode="topk"``: the ``k`` largest logits, TRE-K; ``"topp"``: the
    nucleus of mass ``p`` among the top ``max_candidates``, TRE-P), scaled by log|V| / log|A_t|.
    Logs the TRE entropy, the full-vocabulary entropy, mean |A_t| and the top-1 mass.

    Args:
        alpha: bonus weight (paper: 0.001). mode, k, p, max_candidates: the region (k and
            max_candidates >= 2: a one-token region has no entropy; a ``p`` that leaves one
            token at every position of the first micro-batch is warned about).
        schedule, final_alpha, warmup_steps, total_steps: the coefficient schedule.
        log_full_entropy: also log the full-vocabulary entropy and top-1 mass (computed once per
            micro-batch and shared with the module's own ``ppo/entropy`` log).
    """

    def __init__(
        self,
        alpha: float = 0.001,
        mode: Literal["topk", "topp"] = "topk",
        k: int = 2,
        p: float = 0.99,
        max_candidates: int = 256,
        schedule: ScheduleKind = "constant",
        final_alpha: float | None = None,
        warmup_steps: int = 0,
        total_steps: int | None = None,
        log_full_entropy: bool = True,
    ) -> None:
        _check_bonus(alpha, final_alpha, type(self).__name__)
        self.coefficient = ScheduledValue(alpha, schedule, final_alpha, warmup_steps, total_steps)
        self.region = dict(mode=mode, k=k, p=p, max_candidates=max_candidates)
        # fail at config time, not at the first training step
        trust_region_entropy(torch.zeros(1, max(k, 2)), **self.region)  # type: ignore[arg-type]
        _check_region_can_grow(mode, k, max_candidates)
        self.log_full_entropy = log_full_entropy
        self._region_checked = False

    def policy_loss_term(self, trainer: Any, pl_module: Any, ctx: PolicyLossContext) -> Term:
        alpha = self.coefficient()
        tre, size = trust_region_entropy(ctx.logits, **self.region)  # type: ignore[arg-type]
        if not self._region_checked and self.region["mode"] == "topp":
            self._region_checked = True  # once: a p below every top-1 mass leaves one token
            _warn_if_single_token(size, ctx.mask, float(self.region["p"]))
        stats = {
            "tre_entropy": masked_mean(tre.detach(), ctx.mask),
            "region_size": masked_mean(size.float(), ctx.mask),
            "alpha": torch.tensor(alpha),
        }
        if self.log_full_entropy:
            stats.update(ctx.full_vocab_means())
        return -alpha * tre.to(ctx.per_token_loss.dtype), stats


def _check_region_can_grow(mode: str, k: int, max_candidates: int) -> None:
    """A region of one token has entropy 0 at every position: the term would do nothing."""
    if mode == "topk" and k < 2:
        raise ValueError(
            f"TrustRegionEntropy(mode='topk', k={k}): a region of one token has entropy 0, so "
            "the term would be inert. Fix: k >= 2 (the paper uses 2)."
        )
    if mode == "topp" and max_candidates < 2:
        raise ValueError(
            f"TrustRegionEntropy(mode='topp', max_candidates={max_candidates}): a region of one "
            "token has entropy 0, so the term would be inert. Fix: max_candidates >= 2 (the "
            "paper uses 256)."
        )


def _warn_if_single_token(size: Tensor, mask: Tensor, p: float) -> None:
    counted = size[mask.bool()]
    if counted.numel() > 0 and bool((counted <= 1).all()):
        rank_zero_warn(
            f"TrustRegionEntropy(mode='topp', p={p}): every response token of the first "
            "micro-batch has a one-token region (its top-1 probability already reaches p), where "
            "the TRE term is 0. Fix: raise p (the paper uses 0.99)."
        )


class ForkingTokens(_Scheduled):
    """Policy gradient only on "forking" tokens: the top ``top_fraction`` of the micro-batch's
    response tokens by entropy (Wang et al. 2025, arXiv 2506.01939). The term cancels the policy
    loss of every other token; aggregation still divides by all response tokens.

    Args:
        top_fraction: share of tokens kept (paper: 0.2), scheduled like the other coefficients.
    """

    reads_logits = False  # only the entropy, which the packed update computes chunk by chunk

    def __init__(
        self,
        top_fraction: float = 0.2,
        schedule: ScheduleKind = "constant",
        final_top_fraction: float | None = None,
        warmup_steps: int = 0,
        total_steps: int | None = None,
    ) -> None:
        if not 0 < top_fraction <= 1:
            raise ValueError(f"top_fraction must be in (0, 1], got {top_fraction}")
        self.coefficient = ScheduledValue(
            top_fraction, schedule, final_top_fraction, warmup_steps, total_steps
        )

    def policy_loss_term(self, trainer: Any, pl_module: Any, ctx: PolicyLossContext) -> Term:
        # warmup starts the fraction at 0: keep at least the single top token then
        fraction = min(max(self.coefficient(), 1e-9), 1.0)
        entropy, _ = ctx.full_vocab_stats()
        keep = forking_token_mask(entropy, ctx.mask, top_fraction=fraction)
        dropped = ctx.mask & ~keep
        stats = {
            "kept_fraction": masked_mean(keep.float(), ctx.mask),
            "entropy": masked_mean(entropy, ctx.mask),
        }
        return -ctx.per_token_loss * dropped, stats


class KLCov(_Scheduled):
    """KL-Cov (Cui et al. 2025, arXiv 2505.22617): on the top ``top_fraction`` of response tokens
    by centred covariance (A - mean A)(log pi - mean log pi), add ``coef * |log pi - log pi_old|``.

    ``replace_clip=True`` follows the authors' code: the base loss is the unclipped
    ``-A * ratio`` for every token (the term swaps PPO's clipped loss for it); ``False`` keeps the
    module's clipped loss and only adds the penalty.

    Args:
        top_fraction: share of tokens penalised (paper: 0.002). coef: penalty weight (1.0),
            scheduled. replace_clip: see above.
    """

    reads_logits = False  # log-probs and advantages only

    def __init__(
        self,
        top_fraction: float = 0.002,
        coef: float = 1.0,
        replace_clip: bool = True,
        schedule: ScheduleKind = "constant",
        final_coef: float | None = None,
        warmup_steps: int = 0,
        total_steps: int | None = None,
    ) -> None:
        if not 0 < top_fraction <= 1:
            raise ValueError(f"top_fraction must be in (0, 1], got {top_fraction}")
        self.top_fraction = top_fraction
        self.replace_clip = replace_clip
        self.coefficient = ScheduledValue(coef, schedule, final_coef, warmup_steps, total_steps)

    def policy_loss_term(self, trainer: Any, pl_module: Any, ctx: PolicyLossContext) -> Term:
        coef = self.coefficient()
        selected = kl_cov_selection(
            ctx.advantages, ctx.log_probs, ctx.mask, top_fraction=self.top_fraction
        )
        term = kl_cov_penalty(ctx.log_probs, ctx.old_log_probs, selected, coef=coef)
        if self.replace_clip:
            ratio = torch.exp(ctx.log_probs - ctx.old_log_probs.detach())
            term = term + (-ctx.advantages * ratio - ctx.per_token_loss)
        stats = {
            "selected_fraction": masked_mean(selected.float(), ctx.mask),
            "coef": torch.tensor(coef),
        }
        return term, stats
