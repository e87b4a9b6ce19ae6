"""GSPO's sequence-level clipped loss against the paper's sequence objective (arXiv 2507.18071,
eq. 5 with the sequence ratio of eq. 7), written here without the token form."""

import math

import pytest
import torch

from lit_rlhf.algos import aggregate_loss, gspo_policy_loss

MASK = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]], dtype=torch.bool)
ADV = torch.tensor([1.5, -0.7, 0.4])


def _inputs(scale: float):
    gen = torch.Generator().manual_seed(0)
    old = -torch.rand(3, 4, generator=gen) - 0.5
    new = (old + scale * torch.randn(3, 4, generator=gen)).requires_grad_(True)
    return new, old


def _paper_objective(new, old, eps_low, eps_high):
    """-1/G sum_i min(s_i A_i, clip(s_i, 1 - eps_low, 1 + eps_high) A_i), with
    s_i = (pi(y_i) / pi_old(y_i)) ** (1 / |y_i|), from per-token log-probs."""
    total = 0.0
    for i in range(len(ADV)):
        keep = MASK[i]
        s = torch.exp((new[i][keep] - old[i][keep]).sum() / keep.sum())
        clipped = s.clamp(1 - eps_low, 1 + eps_high)
        total = total + torch.minimum(s * ADV[i], clipped * ADV[i])
    return -total / len(ADV)


@pytest.mark.parametrize("scale", [1e-4, 0.05, 0.5], ids=["inside", "some-clipped", "far"])
def test_gspo_loss_and_gradient_equal_the_sequence_objective(scale):
    eps_low, eps_high = 3e-4, 4e-4 if scale < 1e-3 else 0.2
    new, old = _inputs(scale)
    per_token, _ = gspo_policy_loss(
        new, old, ADV[:, None].expand(3, 4), MASK, clip_low=eps_low, clip_high=eps_high
    )
    ours = aggregate_loss(per_token, MASK, mode="seq_mean_token_mean")
    (grad,) = torch.autograd.grad(ours, new)
    new_ref = new.detach().clone().requires_grad_(True)
    ref = _paper_objective(new_ref, old, eps_low, eps_high)
    (grad_ref,) = torch.autograd.grad(ref, new_ref)
    torch.testing.assert_close(ours, ref, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(grad, grad_ref, atol=1e-7, rtol=1e-5)


def test_a_clipped_sequence_has_no_gradient_and_each_token_carries_the_sequence_ratio():
    new, old = _inputs(0.0)
    new = new.detach().clone()
    new[0, :3] += 0.3  # sequence 0: ratio exp(0.3) far above 1 + 0.2 with A > 0 -> clipped
    new.requires_grad_(True)
    per_token, stats = gspo_policy_loss(new, old, ADV[:, None].expand(3, 4), MASK)
    # every counted token of sequence 0 carries -A * clip(s_0) = -1.5 * 1.0004
    torch.testing.assert_close(per_token[0, :3], torch.full((3,), -1.5 * (1 + 4e-4)))
    loss = aggregate_loss(per_token, MASK, mode="seq_mean_token_mean")
    (grad,) = torch.autograd.grad(loss, new)
    assert torch.all(grad[0] == 0)
    assert torch.all(grad[1][MASK[1]] != 0)
    assert float(stats.clip_fraction) == pytest.approx(3 / MASK.sum().item())
    assert float(stats.ratio_max) == pytest.approx(math.exp(0.3), rel=1e-5)


def test_gspo_equals_ppo_at_the_rollout_policy():
    """At ratio 1 (one update per rollout) both losses are -A per token with the same
    gradient direction up to GSPO's length normalisation."""
    new, old = _inputs(0.0)
    new = old.clone().requires_grad_(True)
    per_token, _ = gspo_policy_loss(new, old, ADV[:, None].expand(3, 4), MASK)
    expected = torch.where(MASK, -ADV[:, None].expand(3, 4), torch.zeros(()))
    torch.testing.assert_close(per_token.detach(), expected)
