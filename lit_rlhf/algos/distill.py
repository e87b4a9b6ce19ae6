"""On-policy distillation's per-token reward and advantage: the student samples, a frozen
teacher scores each sampled token, and the student is rewarded for the tokens the teacher finds
likelier than it does.

References: GKD (Agarwal et al. 2023, "On-Policy Distillation of Language Models: Learning from
Self-Generated Mistakes", arXiv 2306.13649: the reverse KL on the student's own samples, sec. 3)
and Thinking Machines' "On-Policy Distillation" (K. Lu et al., 2025,
https://thinkingmachines.ai/blog/on-policy-distillation/): the negative per-token reverse KL of
the sampled token as the token's advantage, discount 0, in an importance-sampled policy
gradient. Departure: the discount is a parameter (the blog reports no gain from a positive one).
"""

from __future__ import annotations

import torch
from torch import Tensor

from lit_rlhf.algos.advantages import gae
from lit_rlhf.algos.kl import kl_penalty
from lit_rlhf.algos.masking import masked_mean


def distill_advantages(
    student_log_probs: Tensor,
    teacher_log_probs: Tensor,
    mask: Tensor,
    *,
    coef: float,
    discount: float,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Per-token advantages of on-policy distillation.

    ``r_t = -coef * (log pi_s(x_t) - log pi_t(x_t))``: minus the k1 estimate of the reverse KL
    KL(student || teacher) at the sampled token x_t (Schulman's k1; its mean over the student's
    samples is the reverse KL). The advantage is the discounted return
    ``A_t = sum_{s >= t} discount^(s-t) r_s`` over counted tokens (discount 0: ``A_t = r_t``).
    A teacher equal to the student gives exactly 0 everywhere.

    Args:
        student_log_probs: [B, R] log-probs of the sampled tokens under the student (the policy
            that sampled them).
        teacher_log_probs: [B, R] log-probs of the same tokens under the teacher.
        mask: [B, R] bool, True = a token the student sampled and the loss counts.
        coef: the reward's weight (> 0).
        discount: in [0, 1].

    Returns:
        (advantages [B, R], 0 outside the mask; stats: ``distill/reverse_kl``, the mean k1 over
        counted tokens, and ``distill/reward_mean``, the mean per-token reward).
    """
    if not coef > 0:
        raise ValueError(f"coef must be > 0, got {coef}")
    if not 0 <= discount <= 1:
        raise ValueError(f"discount must be in [0, 1], got {discount}")
    student, teacher = student_log_probs.detach().float(), teacher_log_probs.detach().float()
    reverse_kl = kl_penalty(student, teacher, estimator="k1").masked_fill(~mask, 0.0)
    rewards = -coef * reverse_kl
    if discount == 0:
        advantages = rewards
    else:  # GAE with zero values and lambda 1 is the discounted return-to-go
        advantages, _ = gae(rewards, torch.zeros_like(rewards), mask, gamma=discount, lam=1.0)
    stats = {
        "distill/reverse_kl": masked_mean(reverse_kl, mask),
        "distill/reward_mean": masked_mean(rewards, mask),
    }
    return torch.where(mask, advantages, torch.zeros_like(advantages)), stats
