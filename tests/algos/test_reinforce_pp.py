"""REINFORCE++ advantages (arXiv 2501.03262) against the paper's definition, written here with
plain Python loops: token rewards (score at the end, minus beta * KL per token), returns to go,
normalised over every counted token of the batch as the authors' OpenRLHF does
(``compute_advantages_and_returns`` in openrlhf/trainer/ppo_utils/experience_maker.py, commit
3c3be6234e0cb353e76bb8019947db9dfe99fca7: the population variance, floored at 1e-8)."""

import statistics

import pytest
import torch

from lit_rlhf.algos import reinforce_pp_advantages

SCORES = torch.tensor([1.0, 0.0, 0.5, 2.0])
GROUPS = torch.tensor([0, 0, 1, 1])
MASK = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]], dtype=torch.bool)
KL = torch.tensor(
    [[0.1, -0.2, 0.3, 9.0], [0.05, 0.0, 9.0, 9.0], [0.2, 0.1, -0.1, 0.4], [0.3, 9.0, 9.0, 9.0]]
)


def _reference(scores, beta, gamma, baseline):
    scores = list(map(float, scores))
    if baseline:
        means = {}
        for g in set(GROUPS.tolist()):
            means[g] = statistics.fmean(
                s for s, gg in zip(scores, GROUPS.tolist(), strict=True) if gg == g
            )
        scores = [s - means[g] for s, g in zip(scores, GROUPS.tolist(), strict=True)]
    returns = []
    for i, score in enumerate(scores):
        n = int(MASK[i].sum())
        rewards = [-beta * float(KL[i, t]) for t in range(n)]
        rewards[-1] += score
        row, running = [], 0.0
        for r in reversed(rewards):
            running = r + gamma * running
            row.append(running)
        returns.append(row[::-1])
    flat = [g for row in returns for g in row]
    mean, std = statistics.fmean(flat), max(statistics.pvariance(flat), 1e-8) ** 0.5
    out = torch.zeros(MASK.shape)
    for i, row in enumerate(returns):
        for t, g in enumerate(row):
            out[i, t] = (g - mean) / std
    return out


@pytest.mark.parametrize(
    "beta,gamma,baseline", [(0.0, 1.0, False), (0.1, 1.0, False), (0.1, 0.9, True)]
)
def test_reinforce_pp_matches_the_paper(beta, gamma, baseline):
    ours = reinforce_pp_advantages(
        SCORES, MASK, kl=KL, kl_coef=beta, gamma=gamma, group_ids=GROUPS if baseline else None
    )
    torch.testing.assert_close(
        ours, _reference(SCORES, beta, gamma, baseline), atol=1e-5, rtol=1e-5
    )
    assert torch.all(ours[~MASK] == 0)
    assert abs(float(ours[MASK].mean())) < 1e-6  # normalised over the batch, not per prompt


def test_reinforce_pp_refuses_a_negative_kl_coef():
    with pytest.raises(ValueError, match="kl_coef must be >= 0"):
        reinforce_pp_advantages(SCORES, MASK, kl=KL, kl_coef=-0.1)


def test_the_whitening_divides_by_n_as_openrlhf():
    """Two one-token responses with returns 3 and 1: mean 2, population variance 1, so the
    advantages are +-1 (the n - 1 variance, 2, would give +-0.707)."""
    mask = torch.tensor([[True, False], [True, False]])
    ours = reinforce_pp_advantages(torch.tensor([3.0, 1.0]), mask)
    torch.testing.assert_close(ours, torch.tensor([[1.0, 0.0], [-1.0, 0.0]]))


def test_equal_returns_whiten_to_zero():
    """Variance 0 is floored at 1e-8 (OpenRLHF's clamp): every advantage is 0, none is NaN."""
    mask = torch.tensor([[True, True], [True, False]])
    ours = reinforce_pp_advantages(torch.tensor([2.0, 2.0]), mask)
    assert ours.tolist() == [[0.0, 0.0], [0.0, 0.0]]
