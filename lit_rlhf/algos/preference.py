"""Offline preference losses on sequence log-probabilities: sigmoid DPO (with cDPO's label
smoothing), IPO and the reference-free SimPO.

Each function takes per-pair log-probs ``[B]`` of the chosen (``y_w``) and the rejected
(``y_l``) response and returns ``(losses [B], PreferenceRewards)``: the per-pair loss, gradient
flowing, and each response's implicit reward, detached, for logging (reward accuracy: chosen >
rejected; margin: chosen - rejected). The caller reduces the losses (the mean over pairs) and
decides what a "log-prob" is: summed over the response tokens for DPO, averaged over them for
SimPO (its definition) and, in lit-rlhf, for IPO (see :func:`ipo_loss`).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch.nn.functional as F
from torch import Tensor


class PreferenceRewards(NamedTuple):
    chosen: Tensor  # [B] implicit reward of the chosen response (detached)
    rejected: Tensor  # [B] implicit reward of the rejected response (detached)


def dpo_loss(
    policy_chosen_logps: Tensor,
    policy_rejected_logps: Tensor,
    ref_chosen_logps: Tensor,
    ref_rejected_logps: Tensor,
    *,
    beta: float,
    label_smoothing: float = 0.0,
) -> tuple[Tensor, PreferenceRewards]:
    """Sigmoid DPO (Rafailov et al. 2023, arXiv 2305.18290, eq. 7), per pair:

    ``-log sigmoid(beta * h)`` with ``h = (log pi(y_w) - log ref(y_w)) - (log pi(y_l) -
    log ref(y_l))``. With ``label_smoothing = eps > 0`` it is conservative DPO (cDPO; Mitchell
    2023, "A note on DPO with noisy preferences"): each label is taken as flipped with
    probability eps, ``-(1 - eps) log sigmoid(beta h) - eps log sigmoid(-beta h)``.

    Args:
        policy_chosen_logps, policy_rejected_logps: [B] log pi of each response (summed over its
            tokens), gradient flowing.
        ref_chosen_logps, ref_rejected_logps: [B] the same under the frozen reference.
        beta: the KL strength (> 0, finite; the paper uses 0.1 to 0.5).
        label_smoothing: eps in [0, 0.5) (0: plain DPO; 0.5 would ignore the labels).

    Returns:
        (losses [B], implicit rewards ``beta * (log pi - log ref)`` of each response).
    """
    _check_beta(beta)
    if not 0.0 <= label_smoothing < 0.5:
        raise ValueError(
            f"label_smoothing={label_smoothing!r} must be in [0, 0.5): the probability that a "
            "label is flipped (0.5 makes chosen and rejected interchangeable)"
        )
    _check_shapes(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps)
    chosen = policy_chosen_logps - ref_chosen_logps
    rejected = policy_rejected_logps - ref_rejected_logps
    logits = beta * (chosen - rejected)
    losses = -(1.0 - label_smoothing) * F.logsigmoid(logits)
    if label_smoothing > 0:
        losses = losses - label_smoothing * F.logsigmoid(-logits)
    return losses, _rewards(beta * chosen, beta * rejected)


def ipo_loss(
    policy_chosen_logps: Tensor,
    policy_rejected_logps: Tensor,
    ref_chosen_logps: Tensor,
    ref_rejected_logps: Tensor,
    *,
    beta: float,
) -> tuple[Tensor, PreferenceRewards]:
    """IPO (Azar et al. 2023, arXiv 2310.12036, eq. 17), per pair: ``(h - 1 / (2 beta))^2``
    with ``h`` the log-ratio difference of :func:`dpo_loss` and ``beta`` the paper's tau.

    Unlike DPO's sigmoid, the square stops pushing once ``h`` reaches ``1 / (2 beta)``, so a
    deterministic preference cannot drive the policy arbitrarily far from the reference.
    Which log-probs: the equation is written with whole-sequence log-likelihoods; lit-rlhf's
    DPOModule passes the log-probs averaged over each response's tokens, as TRL and the
    implementations that followed the paper do, because with sums ``h`` grows with the
    responses' length while the target ``1 / (2 beta)`` does not, so one ``beta`` could not fit
    short and long pairs. This function computes the equation on whatever it is given.

    Returns:
        (losses [B], implicit rewards ``beta * (log pi - log ref)`` of each response).
    """
    _check_beta(beta)
    _check_shapes(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps)
    chosen = policy_chosen_logps - ref_chosen_logps
    rejected = policy_rejected_logps - ref_rejected_logps
    losses = (chosen - rejected - 1.0 / (2.0 * beta)).square()
    return losses, _rewards(beta * chosen, beta * rejected)


def simpo_loss(
    chosen_logps_avg: Tensor,
    rejected_logps_avg: Tensor,
    *,
    beta: float,
    gamma: float,
) -> tuple[Tensor, PreferenceRewards]:
    """SimPO (Meng et al. 2024, arXiv 2405.14734, eq. 6), per pair, reference-free:

    ``-log sigmoid(beta / |y_w| log pi(y_w) - beta / |y_l| log pi(y_l) - gamma)``: the implicit
    reward is the length-normalised log-likelihood scaled by ``beta``, and ``gamma`` is a target
    reward margin. Its beta is an order of magnitude above DPO's (about 2 to 10 in the paper's
    hyperparameter appendix), with gamma of order 1.

    Args:
        chosen_logps_avg, rejected_logps_avg: [B] ``log pi(y) / |y|``, the log-probs averaged
            over each response's tokens, gradient flowing.
        beta: the reward scale (> 0, finite).
        gamma: the target margin (>= 0, finite).

    Returns:
        (losses [B], implicit rewards ``beta * log pi(y) / |y|`` of each response).
    """
    _check_beta(beta)
    if not 0.0 <= gamma < math.inf:
        raise ValueError(f"gamma={gamma!r} must be >= 0 and finite: SimPO's target reward margin")
    _check_shapes(chosen_logps_avg, rejected_logps_avg)
    chosen, rejected = beta * chosen_logps_avg, beta * rejected_logps_avg
    return -F.logsigmoid(chosen - rejected - gamma), _rewards(chosen, rejected)


def _rewards(chosen: Tensor, rejected: Tensor) -> PreferenceRewards:
    return PreferenceRewards(chosen.detach(), rejected.detach())


def _check_beta(beta: float) -> None:
    if not 0.0 < beta < math.inf:
        raise ValueError(f"beta={beta!r} must be > 0 and finite")


def _check_shapes(*logps: Tensor) -> None:
    shapes = {tuple(t.shape) for t in logps}
    if len(shapes) != 1 or logps[0].dim() != 1:
        raise ValueError(
            f"the log-probs must be [B] tensors of one shape (one value per pair), got shapes "
            f"{[tuple(t.shape) for t in logps]}"
        )
