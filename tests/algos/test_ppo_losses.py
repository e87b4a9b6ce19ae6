import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lit_rlhf.algos import (
    aggregate_loss,
    clipped_policy_loss,
    clipped_value_loss,
    explained_variance,
)


def _log_probs_with_ratio(ratios: list[float]) -> tuple[torch.Tensor, torch.Tensor]:
    old = torch.full((1, len(ratios)), -1.0, dtype=torch.float64)
    new = (old + torch.tensor([ratios], dtype=torch.float64).log()).requires_grad_()
    return new, old


def test_clipped_policy_loss_hand_case_and_token_gradients():
    ratios = [1.5, 0.5, 0.5, 1.5, 1.1, 0.9]
    advantages = torch.tensor([[1.0, 1.0, -1.0, -1.0, 1.0, -1.0]], dtype=torch.float64)
    new, old = _log_probs_with_ratio(ratios)
    mask = torch.ones(1, 6, dtype=torch.bool)
    loss, stats = clipped_policy_loss(new, old, advantages, mask)
    # eps = 0.2, loss = max(-A r, -A clip(r, 0.8, 1.2)):
    # A=+1 r=1.5: max(-1.5, -1.2) = -1.2 (clipped)   A=+1 r=0.5: max(-0.5, -0.8) = -0.5
    # A=-1 r=0.5: max( 0.5,  0.8) =  0.8 (clipped)   A=-1 r=1.5: max( 1.5,  1.2) =  1.5
    # A=+1 r=1.1: -1.1 (inside)                      A=-1 r=0.9:  0.9 (inside)
    expected = torch.tensor([[-1.2, -0.5, 0.8, 1.5, -1.1, 0.9]], dtype=torch.float64)
    torch.testing.assert_close(loss, expected)
    assert stats.clip_fraction.item() == pytest.approx(2 / 6)

    # d loss_t / d logp_t is -A r on the unclipped branch, 0 on the clipped one; the loss is
    # per token, so the gradient of the sum isolates each token.
    (grad,) = torch.autograd.grad(loss.sum(), new)
    expected_grad = torch.tensor([[0.0, -0.5, 0.0, 1.5, -1.1, 0.9]], dtype=torch.float64)
    torch.testing.assert_close(grad, expected_grad)


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    clip_low=st.floats(0.05, 0.5),
    clip_high=st.floats(0.05, 0.5),
)
def test_policy_gradient_is_zero_exactly_where_clipping_is_active(seed, clip_low, clip_high):
    gen = torch.Generator().manual_seed(seed)
    old = -torch.rand(3, 7, generator=gen, dtype=torch.float64) * 3
    new = (old + torch.randn(3, 7, generator=gen, dtype=torch.float64) * 0.5).requires_grad_()
    advantages = torch.randn(3, 7, generator=gen, dtype=torch.float64)
    mask = torch.rand(3, 7, generator=gen) < 0.8
    loss, stats = clipped_policy_loss(
        new, old, advantages, mask, clip_low=clip_low, clip_high=clip_high
    )
    (grad,) = torch.autograd.grad(loss.sum(), new)

    ratio = (new - old).exp().detach()
    clipped = ((advantages > 0) & (ratio > 1 + clip_high)) | (
        (advantages < 0) & (ratio < 1 - clip_low)
    )
    for b, t in zip(*torch.nonzero(torch.ones_like(mask)).T.tolist(), strict=True):
        if not mask[b, t]:
            assert grad[b, t] == 0 and loss[b, t] == 0
        elif clipped[b, t]:
            assert grad[b, t] == 0, (b, t)
        else:
            assert grad[b, t].item() == pytest.approx(-(advantages[b, t] * ratio[b, t]).item())
            assert grad[b, t] != 0
    expected_fraction = (clipped & mask).sum() / mask.sum().clamp(min=1)
    assert stats.clip_fraction.item() == pytest.approx(expected_fraction.item())


def test_dual_clip_caps_negative_advantage_loss():
    new, old = _log_probs_with_ratio([5.0, 2.0, 5.0])
    advantages = torch.tensor([[-1.0, -1.0, 1.0]], dtype=torch.float64)
    mask = torch.ones(1, 3, dtype=torch.bool)
    loss, stats = clipped_policy_loss(new, old, advantages, mask, dual_clip=3.0)
    # A=-1 r=5: PPO loss max(5, 1.2) = 5, capped at -A*c = 3 -> constant, zero gradient
    # A=-1 r=2: 2 < 3, unchanged (gradient -A r = 2)
    # A=+1 r=5: max(-5, -1.2) = -1.2; dual clip only touches negative advantages
    torch.testing.assert_close(loss, torch.tensor([[3.0, 2.0, -1.2]], dtype=torch.float64))
    (grad,) = torch.autograd.grad(loss.sum(), new)
    torch.testing.assert_close(grad, torch.tensor([[0.0, 2.0, 0.0]], dtype=torch.float64))
    assert stats.dual_clip_fraction.item() == pytest.approx(1 / 3)
    # gradient-zeroed tokens: dual-capped (0) and upper-clipped (2)
    assert stats.clip_fraction.item() == pytest.approx(2 / 3)


@pytest.mark.parametrize("bad", [1.0, 0.5])
def test_dual_clip_must_exceed_one(bad):
    x = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="dual_clip must be > 1"):
        clipped_policy_loss(x, x, x, torch.ones(1, 2, dtype=torch.bool), dual_clip=bad)


def test_policy_stats_are_detached_masked_and_hand_checked():
    # ratios 2 and 1 counted, 100 masked out
    new, old = _log_probs_with_ratio([2.0, 1.0, 100.0])
    mask = torch.tensor([[True, True, False]])
    loss, stats = clipped_policy_loss(new, old, torch.ones(1, 3, dtype=torch.float64), mask)
    assert all(not s.requires_grad for s in stats)
    assert loss[0, 2] == 0
    assert stats.ratio_max.item() == pytest.approx(2.0)
    assert stats.ratio_mean.item() == pytest.approx(1.5)
    # k3 of KL(old || new): (r - 1) - log r = (1 - log 2 = 0.306853) for r=2, 0 for r=1 -> mean
    assert stats.approx_kl.item() == pytest.approx((1 - math.log(2)) / 2)


def test_clipped_value_loss_hand_case():
    values = torch.tensor([[1.0, 2.0, 3.0, 0.0]], requires_grad=True)
    old_values = torch.tensor([[0.5, 1.9, 2.0, 0.0]])
    returns = torch.tensor([[0.0, 3.0, 4.0, 9.0]])
    mask = torch.tensor([[True, True, True, False]])
    loss, stats = clipped_value_loss(values, old_values, returns, mask, clip=0.2)
    # t0: (1-0)^2 = 1 vs (clip to 0.7 - 0)^2 = 0.49 -> 0.5 * 1 = 0.5
    # t1: (2-3)^2 = 1, 2.0 is inside [1.7, 2.1] -> 0.5
    # t2: (3-4)^2 = 1 vs (clip to 2.2 - 4)^2 = 3.24 -> clipped branch, 0.5 * 3.24 = 1.62
    torch.testing.assert_close(loss, torch.tensor([[0.5, 0.5, 1.62, 0.0]]))
    assert stats.clip_fraction.item() == pytest.approx(1 / 3)
    assert stats.value_mean.item() == pytest.approx(2.0)
    (grad,) = torch.autograd.grad(loss.sum(), values)
    # (v - R) on unclipped tokens, 0 on the clipped one and outside the mask
    torch.testing.assert_close(grad, torch.tensor([[1.0, -1.0, 0.0, 0.0]]))

    plain, plain_stats = clipped_value_loss(values, old_values, returns, mask, clip=None)
    torch.testing.assert_close(plain, torch.tensor([[0.5, 0.5, 0.5, 0.0]]))
    assert plain_stats.clip_fraction.item() == 0.0
    assert not any(s.requires_grad for s in (*stats, *plain_stats))


def _batch(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    per_token = torch.randn(6, 5, generator=gen, dtype=torch.float64)
    lengths = torch.tensor([5, 1, 3, 0, 4, 2])
    return per_token, torch.arange(5).unsqueeze(0) < lengths.unsqueeze(1)


def test_aggregate_loss_hand_cases():
    per_token = torch.tensor([[1.0, 3.0, 100.0], [4.0, 100.0, 100.0]])
    mask = torch.tensor([[True, True, False], [True, False, False]])
    # token_mean: (1 + 3 + 4) / 3
    assert aggregate_loss(per_token, mask).item() == pytest.approx(8 / 3)
    # seq_mean_token_mean: ((1 + 3) / 2 + 4 / 1) / 2 = 3
    assert aggregate_loss(per_token, mask, mode="seq_mean_token_mean").item() == 3.0
    # seq_mean_token_sum: ((1 + 3) + 4) / 2 = 4
    assert aggregate_loss(per_token, mask, mode="seq_mean_token_sum").item() == 4.0
    assert aggregate_loss(per_token, torch.zeros_like(mask)).item() == 0.0
    with pytest.raises(ValueError, match="token_mean"):
        aggregate_loss(per_token, mask, mode="sum")  # type: ignore[arg-type]


@pytest.mark.parametrize("mode", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum"])
def test_aggregate_loss_micro_batches_accumulate_to_the_full_batch(mode):
    per_token, mask = _batch(0)
    full = aggregate_loss(per_token, mask, mode=mode)
    num_tokens = mask.sum()  # a tensor, as the caller would pass it
    num_seqs = float(mask.any(dim=1).sum())
    accumulated = sum(
        aggregate_loss(
            per_token[rows], mask[rows], mode=mode, num_tokens=num_tokens, num_seqs=num_seqs
        )
        for rows in (slice(0, 2), slice(2, 6))
    )
    torch.testing.assert_close(accumulated, full)


def test_explained_variance_hand_cases():
    returns = torch.tensor([[1.0, 2.0, 3.0, 50.0]])
    mask = torch.tensor([[True, True, True, False]])
    perfect = returns.clone()
    assert explained_variance(perfect, returns, mask).item() == pytest.approx(1.0)
    # residual -0.5, 0, 0.5: var 0.25; var of returns 1 -> 1 - 0.25 = 0.75
    half = torch.tensor([[1.5, 2.0, 2.5, 0.0]])
    assert explained_variance(half, returns, mask).item() == pytest.approx(0.75)
    # constant returns: Var[R] = 0 -> defined as 0
    flat = torch.ones(1, 4)
    assert explained_variance(half, flat, mask).item() == 0.0
