import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lit_rlhf.algos import masked_mean, masked_sum, masked_var, masked_whiten


def test_masked_sum_and_mean_ignore_nan_in_padding():
    x = torch.tensor([[1.0, 2.0, float("nan")], [4.0, float("inf"), 6.0]])
    mask = torch.tensor([[True, True, False], [True, False, True]])
    # counted: 1 + 2 + 4 + 6 = 13 over 4 tokens
    assert masked_sum(x, mask).item() == 13.0
    assert masked_mean(x, mask).item() == pytest.approx(13 / 4)
    # per row: (1 + 2) / 2 = 1.5, (4 + 6) / 2 = 5
    torch.testing.assert_close(masked_mean(x, mask, dim=1), torch.tensor([1.5, 5.0]))


def test_masked_mean_of_nothing_is_zero_not_nan():
    x = torch.randn(2, 3)
    mask = torch.tensor([[False] * 3, [True, False, False]])
    assert masked_mean(x, torch.zeros_like(mask)).item() == 0.0
    row_means = masked_mean(x, mask, dim=1)
    assert row_means[0].item() == 0.0
    assert row_means[1].item() == pytest.approx(x[1, 0].item())


def test_masked_mean_broadcasts_mask():
    x = torch.arange(6.0).reshape(2, 3)
    row_mask = torch.tensor([[True], [False]])
    # only row 0 counts: (0 + 1 + 2) / 3 = 1
    assert masked_mean(x, row_mask).item() == 1.0


def test_masked_var_hand_case():
    x = torch.tensor([1.0, 2.0, 3.0, 4.0, 100.0])
    mask = torch.tensor([True, True, True, True, False])
    # mean 2.5, squared deviations 2.25 + 0.25 + 0.25 + 2.25 = 5
    assert masked_var(x, mask).item() == pytest.approx(5 / 3)
    assert masked_var(x, mask, unbiased=False).item() == pytest.approx(5 / 4)


def test_masked_var_degenerate_counts_are_zero():
    x = torch.tensor([3.0, 7.0])
    one = torch.tensor([True, False])
    assert masked_var(x, one).item() == 0.0
    assert masked_var(x, one, unbiased=False).item() == 0.0
    assert masked_var(x, torch.zeros(2, dtype=torch.bool)).item() == 0.0


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    batch=st.integers(1, 4),
    length=st.integers(2, 9),
    scale=st.floats(0.01, 100.0),
)
def test_masked_whiten_gives_zero_mean_unit_variance(seed, batch, length, scale):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, length, generator=gen, dtype=torch.float64) * scale + 3.0
    mask = torch.rand(batch, length, generator=gen) < 0.7
    mask[0, :2] = True  # at least two counted elements, so the variance is defined
    # eps=0: with eps the variance is 1 only up to eps / var, which is large for tight samples
    white = masked_whiten(x, mask, eps=0.0)
    assert masked_mean(white, mask).item() == pytest.approx(0.0, abs=1e-9)
    assert masked_var(white, mask).item() == pytest.approx(1.0, rel=1e-6)
    assert (white[~mask] == 0).all()

    kept_mean = masked_whiten(x, mask, shift_mean=False, eps=0.0)
    assert masked_mean(kept_mean, mask).item() == pytest.approx(masked_mean(x, mask).item())
    assert masked_var(kept_mean, mask).item() == pytest.approx(1.0, rel=1e-6)
