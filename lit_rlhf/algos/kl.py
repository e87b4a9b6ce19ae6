"""Per-token KL estimators and the adaptive KL coefficient of RLHF.

The estimators follow J. Schulman, "Approximating KL Divergence" (blog post, 2020): with
samples drawn from the policy p and ``log r = log q - log p`` for the reference q,
``k1 = -log r`` is unbiased but high-variance and can be negative, ``k2 = 0.5 * (log r)^2`` is
biased with low variance, and ``k3 = (r - 1) - log r`` is unbiased and always >= 0.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

KLEstimator = Literal["k1", "k2", "k3"]

# exp(20) ~ 4.9e8 is far beyond any useful ratio and still finite in fp16/bf16 sums; without the
# clamp one token whose log-ratio hits -inf (probability 0 under the reference) makes k3 inf.
_K3_LOG_RATIO_BOUND = 20.0


def kl_penalty(log_probs: Tensor, ref_log_probs: Tensor, *, estimator: KLEstimator) -> Tensor:
    """Per-token estimate of KL(policy || reference) from log-probs of sampled tokens.

    Schulman (2020), "Approximating KL Divergence", http://joschu.net/blog/kl-approx.html:
    ``k1 = logp - logref``, ``k2 = 0.5 * (logp - logref)^2``,
    ``k3 = exp(logref - logp) - (logref - logp) - 1`` with the log-ratio clamped to [-20, 20].

    Gradients flow through ``log_probs`` (and ``ref_log_probs`` if it requires grad), so the
    result can serve as a KL loss term (GRPO uses k3, arXiv 2402.03300 eq. 4) or, detached, as
    a KL-in-reward penalty.

    Args:
        log_probs: [B, R] log-probs of the sampled tokens under the policy.
        ref_log_probs: [B, R] log-probs of the same tokens under the reference.
        estimator: "k1", "k2" or "k3".

    Returns:
        [B, R] per-token estimate; the caller masks it.
    """
    log_ratio = log_probs - ref_log_probs
    if estimator == "k1":
        return log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio.square()
    if estimator == "k3":
        ref_over_policy = (-log_ratio).clamp(-_K3_LOG_RATIO_BOUND, _K3_LOG_RATIO_BOUND)
        return torch.expm1(ref_over_policy) - ref_over_policy
    raise ValueError(f"estimator must be one of 'k1', 'k2', 'k3', got {estimator!r}")


class AdaptiveKLController:
    """Adaptive KL coefficient (Ziegler et al. 2019, arXiv 1909.08593, sec. 2.2).

    ``e = clip((KL - target) / target, -0.2, 0.2)`` and ``beta <- beta * (1 + e * n / horizon)``
    where n is the number of samples (or steps) the KL was measured over: the coefficient grows
    when the policy drifts past the target KL and shrinks when it stays below.

    The coefficient is training state: checkpoint it through ``state_dict``; ``target`` and
    ``horizon`` are configuration and are not part of the state.
    """

    def __init__(self, init_kl_coef: float, *, target: float, horizon: int) -> None:
        if init_kl_coef < 0:
            raise ValueError(f"init_kl_coef must be >= 0, got {init_kl_coef}")
        if target <= 0:
            raise ValueError(
                f"target must be > 0 (it divides the error), got {target}; "
                "use a fixed coefficient if you do not want to adapt it"
            )
        if horizon <= 0:
            raise ValueError(f"horizon must be > 0, got {horizon}")
        self._value = float(init_kl_coef)
        self.target = float(target)
        self.horizon = int(horizon)

    @property
    def value(self) -> float:
        """The current KL coefficient beta."""
        return self._value

    def update(self, current_kl: float, n_steps: int) -> float:
        """Move the coefficient towards the target KL and return the new value.

        Args:
            current_kl: the KL measured on the latest batch (a python float, e.g. after a
                ``.item()`` in the caller, which owns the device sync).
            n_steps: how many samples/steps that measurement covers.
        """
        error = min(max((current_kl - self.target) / self.target, -0.2), 0.2)
        self._value *= 1.0 + error * n_steps / self.horizon
        return self._value

    def state_dict(self) -> dict[str, float]:
        return {"value": self._value}

    def load_state_dict(self, state_dict: dict[str, float]) -> None:
        self._value = float(state_dict["value"])
