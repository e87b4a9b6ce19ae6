"""Trust-region diagnostics for any policy-gradient run, with or without an exploration term.

TRE (arXiv 2602.03635, sec. 3) argues that a full-vocabulary entropy bonus moves probability mass
out of the model's plausible tokens into the vocabulary's long tail, while the trust-region bonus
only reshapes mass among the plausible ones. :class:`TrustRegionDiagnostics` measures exactly
that on the policy's own response tokens, whatever else the run does: it takes part in the
loss-term protocol (:mod:`lit_rlhf.training.protocols`) only to read the logits, adds a zero term,
and returns per-token means that the module logs under ``TrustRegionDiagnostics/<key>``:

- ``tail_mass_topk`` / ``tail_mass_topp``: the mass outside the top-``k`` set / the nucleus of
  mass ``p`` (TRE-K's and TRE-P's regions);
- ``entropy_topk`` / ``entropy_topp``: the entropy inside each region, renormalised to it, in
  nats (unscaled, unlike ``TrustRegionEntropy/tre_entropy``);
- ``region_size_topp``: mean |A_t| of the nucleus.

It is measured in the update's forward passes, so a rollout step's value is the mean over its
micro-batches (the first of them sees the rollout policy itself).
"""

from __future__ import annotations

from typing import Any

import torch
from lightning import Callback
from torch import Tensor

from lit_rlhf.algos import masked_mean, trust_region_mass
from lit_rlhf.training.protocols import PolicyLossContext


class TrustRegionDiagnostics(Callback):
    """Tail mass and in-region entropy of the policy's top-``k`` set and ``p`` nucleus; adds no
    loss (arXiv 2602.03635's mechanism, logged for every arm of a comparison).

    Args:
        k: size of the top-K region (TRE-K's K; paper: 2).
        p: mass of the nucleus (TRE-P's p; paper: 0.99).
        max_candidates: cap on the nucleus size (TRE-P's; paper: 256).
        chunk_size: positions per chunk of the computation.
    """

    def __init__(
        self, k: int = 2, p: float = 0.99, max_candidates: int = 256, chunk_size: int = 1024
    ) -> None:
        if k < 1:
            raise ValueError(f"TrustRegionDiagnostics: k={k} must be >= 1 (TRE-K's K, e.g. 2)")
        if not 0 < p <= 1:
            raise ValueError(f"TrustRegionDiagnostics: p={p} must be in (0, 1] (e.g. 0.99)")
        if max_candidates < 1 or chunk_size < 1:
            raise ValueError(
                f"TrustRegionDiagnostics: max_candidates={max_candidates} and "
                f"chunk_size={chunk_size} must be >= 1 (e.g. 256 and 1024)"
            )
        self.k, self.p = k, p
        self.max_candidates, self.chunk_size = max_candidates, chunk_size

    def policy_loss_term(
        self, trainer: Any, pl_module: Any, ctx: PolicyLossContext
    ) -> tuple[Tensor, dict[str, Tensor]]:
        if self.k > ctx.logits.shape[-1]:
            raise ValueError(
                f"TrustRegionDiagnostics: k={self.k} exceeds the vocabulary size "
                f"{ctx.logits.shape[-1]}. Fix: a smaller k."
            )
        common = dict(max_candidates=self.max_candidates, chunk_size=self.chunk_size)
        tail_k, entropy_k, _ = trust_region_mass(ctx.logits, mode="topk", k=self.k, **common)
        tail_p, entropy_p, size_p = trust_region_mass(ctx.logits, mode="topp", p=self.p, **common)
        mask = ctx.mask
        stats = {
            "tail_mass_topk": masked_mean(tail_k, mask),
            "entropy_topk": masked_mean(entropy_k, mask),
            "tail_mass_topp": masked_mean(tail_p, mask),
            "entropy_topp": masked_mean(entropy_p, mask),
            "region_size_topp": masked_mean(size_p.float(), mask),
        }
        return torch.zeros_like(ctx.per_token_loss), stats
