import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lit_rlhf.algos import (
    gae,
    group_advantages,
    masked_mean,
    masked_var,
    rloo_advantages,
    token_level_rewards,
)


def _right_padded_mask(lengths: torch.Tensor, width: int) -> torch.Tensor:
    return torch.arange(width).unsqueeze(0) < lengths.unsqueeze(1)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), batch=st.integers(1, 5), width=st.integers(1, 8))
def test_gae_with_gamma_lambda_one_is_reward_to_go_minus_values(seed, batch, width):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, width + 1, (batch,), generator=gen)
    mask = _right_padded_mask(lengths, width)
    rewards = torch.randn(batch, width, generator=gen, dtype=torch.float64)
    values = torch.randn(batch, width, generator=gen, dtype=torch.float64)
    # Padding holds garbage on purpose: it must not leak into counted positions.
    rewards_in = torch.where(mask, rewards, 1e3)

    advantages, returns = gae(rewards_in, values, mask, gamma=1.0, lam=1.0)

    counted_rewards = torch.where(mask, rewards, 0.0)
    reward_to_go = counted_rewards.flip(1).cumsum(1).flip(1)
    expected = torch.where(mask, reward_to_go - values, 0.0)
    torch.testing.assert_close(advantages, expected)
    torch.testing.assert_close(returns, torch.where(mask, reward_to_go, 0.0))


def test_gae_hand_case_gamma_09_lambda_08():
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 5.0]], dtype=torch.float64)
    values = torch.tensor([[0.5, 0.4, 0.3], [1.0, 0.5, 9.0]], dtype=torch.float64)
    mask = torch.tensor([[True, True, True], [True, True, False]])
    # gamma * lam = 0.72.
    # Row 0: d2 = 1 - 0.3 = 0.7                       -> A2 = 0.7
    #        d1 = 0 + 0.9*0.3 - 0.4 = -0.13           -> A1 = -0.13 + 0.72*0.7   = 0.374
    #        d0 = 0 + 0.9*0.4 - 0.5 = -0.14           -> A0 = -0.14 + 0.72*0.374 = 0.12928
    # Row 1 (last token padded, terminal after t=1):
    #        d1 = 2 + 0.9*0 - 0.5 = 1.5               -> A1 = 1.5
    #        d0 = 0 + 0.9*0.5 - 1.0 = -0.55           -> A0 = -0.55 + 0.72*1.5   = 0.53
    expected = torch.tensor([[0.12928, 0.374, 0.7], [0.53, 1.5, 0.0]], dtype=torch.float64)
    advantages, returns = gae(rewards, values, mask, gamma=0.9, lam=0.8)
    torch.testing.assert_close(advantages, expected)
    # returns = A + V on counted tokens: 0.62928, 0.774, 1.0 / 1.53, 2.0, 0
    torch.testing.assert_close(
        returns, torch.tensor([[0.62928, 0.774, 1.0], [1.53, 2.0, 0.0]], dtype=torch.float64)
    )


def test_gae_skips_interior_holes_like_the_compacted_sequence():
    gen = torch.Generator().manual_seed(0)
    rewards = torch.randn(1, 6, generator=gen)
    values = torch.randn(1, 6, generator=gen)
    mask = torch.tensor([[True, True, False, False, True, True]])
    advantages, _ = gae(rewards, values, mask, gamma=0.95, lam=0.9)
    kept = mask[0]
    compact, _ = gae(
        rewards[:, kept], values[:, kept], torch.ones(1, 4, dtype=torch.bool), gamma=0.95, lam=0.9
    )
    torch.testing.assert_close(advantages[:, kept], compact)
    assert (advantages[~mask] == 0).all()


def test_gae_is_detached():
    values = torch.randn(2, 3, requires_grad=True)
    advantages, returns = gae(
        torch.randn(2, 3), values, torch.ones(2, 3, dtype=torch.bool), gamma=1.0, lam=0.95
    )
    assert not advantages.requires_grad and not returns.requires_grad


@settings(max_examples=50, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    batch=st.integers(1, 24),
    n_labels=st.integers(1, 6),
    scale_by_std=st.booleans(),
)
def test_group_advantages_have_zero_mean_per_group(seed, batch, n_labels, scale_by_std):
    gen = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, n_labels, (batch,), generator=gen) * 37 - 50  # sparse, negative
    scores = torch.randn(batch, generator=gen, dtype=torch.float64) * 5
    adv = group_advantages(scores, labels, scale_by_std=scale_by_std)
    for label in labels.unique():
        in_group = labels == label
        group_adv = adv[in_group]
        assert group_adv.mean().item() == pytest.approx(0.0, abs=1e-9)
        if in_group.sum() == 1:
            assert group_adv.item() == 0.0
        elif scale_by_std:
            assert masked_var(adv, in_group).item() == pytest.approx(1.0, rel=1e-4)


def test_group_advantages_hand_case():
    # group 7: scores 1, 2, 3 -> mean 2, unbiased std sqrt((1 + 0 + 1) / 2) = 1
    # group -2: a single sample -> 0; group 3: equal scores 4, 4 -> std 0 -> 0
    scores = torch.tensor([1.0, 5.0, 2.0, 4.0, 3.0, 4.0])
    labels = torch.tensor([7, -2, 7, 3, 7, 3])
    expected = torch.tensor([-1.0, 0.0, 0.0, 0.0, 1.0, 0.0])
    torch.testing.assert_close(group_advantages(scores, labels, eps=0.0), expected)
    # eps=1e-6 divides by 1 + 1e-6
    torch.testing.assert_close(group_advantages(scores, labels), expected / (1 + 1e-6))
    # Dr. GRPO: mean-centred only, group 7 scaled up by 10 keeps its spread
    torch.testing.assert_close(
        group_advantages(scores * 10, labels, scale_by_std=False), expected * 10
    )


def test_group_advantages_accepts_integer_scores():
    adv = group_advantages(torch.tensor([0, 1, 1, 1]), torch.tensor([0, 0, 1, 1]))
    assert adv.dtype == torch.float32
    # group 0: mean 0.5, std sqrt(0.5) -> -/+ 0.5 / 0.7071 = -/+ 0.7071
    torch.testing.assert_close(adv, torch.tensor([-0.70711, 0.70711, 0.0, 0.0]), atol=1e-4, rtol=0)


def test_rloo_hand_case():
    # group 0 = scores 1, 2, 6: 1 - (2+6)/2 = -3, 2 - (1+6)/2 = -1.5, 6 - (1+2)/2 = 4.5
    # group 9 = a single sample -> 0
    scores = torch.tensor([1.0, 8.0, 2.0, 6.0])
    labels = torch.tensor([0, 9, 0, 0])
    torch.testing.assert_close(
        rloo_advantages(scores, labels), torch.tensor([-3.0, 0.0, -1.5, 4.5])
    )


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), batch=st.integers(2, 16))
def test_rloo_is_rescaled_mean_centring(seed, batch):
    gen = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 3, (batch,), generator=gen)
    scores = torch.randn(batch, generator=gen, dtype=torch.float64)
    counts = (labels.unsqueeze(0) == labels.unsqueeze(1)).sum(1).to(scores.dtype)
    centred = group_advantages(scores, labels, scale_by_std=False)
    expected = torch.where(counts > 1, counts / (counts - 1).clamp(min=1) * centred, 0.0)
    torch.testing.assert_close(rloo_advantages(scores, labels), expected)


def test_token_level_rewards_puts_score_on_last_counted_token():
    scores = torch.tensor([1.0, 2.0, 3.0, 4.0])
    mask = torch.tensor(
        [
            [True, True, False, False],
            [False, False, False, False],
            [True, True, True, True],
            [True, False, True, False],
        ]
    )
    expected = torch.tensor(
        [
            [0.0, 1.0, 0.0, 0.0],
            [0.0, 0.0, 0.0, 0.0],
            [0.0, 0.0, 0.0, 3.0],
            [0.0, 0.0, 4.0, 0.0],
        ]
    )
    torch.testing.assert_close(token_level_rewards(scores, mask), expected)
    assert masked_mean(token_level_rewards(scores, mask), mask, dim=1).shape == (4,)


@pytest.mark.parametrize("size", [4, 8, 16])
def test_tied_float_groups_get_exactly_zero_advantage(size):
    # the float32 mean of equal scores is not always exactly their value: before the fix, about
    # 40 % of tied groups of 8 (67 % of 16) had a std near 1e-8 and a constant advantage of
    # 0.01-0.2 after dividing by std + eps
    torch.manual_seed(0)
    groups = torch.arange(500).repeat_interleave(size)
    scores = torch.rand(500).repeat_interleave(size)
    for advantages in (
        group_advantages(scores, groups),
        group_advantages(scores, groups, scale_by_std=False),
        rloo_advantages(scores, groups),
    ):
        assert torch.count_nonzero(advantages) == 0
    varied = scores.clone()
    varied[::size] += 0.5  # one sample of each group differs: every group has signal
    assert torch.count_nonzero(group_advantages(varied, groups)) == varied.numel()
