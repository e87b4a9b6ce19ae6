import math
from fractions import Fraction

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lit_rlhf.algos import (
    CoefficientSchedule,
    forking_token_mask,
    kl_cov_penalty,
    kl_cov_selection,
)


def _expected_count(top_fraction: float, n_counted: int) -> int:
    # exact decimal arithmetic: 0.2 * 15 is 3, even though the float product is 3.0000000000000004
    if n_counted == 0:
        return 0
    return max(1, math.ceil(Fraction(str(top_fraction)) * n_counted))


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    batch=st.integers(1, 4),
    length=st.integers(1, 12),
    keep=st.sampled_from([0.0, 0.3, 0.7, 1.0]),
    top_fraction=st.sampled_from([0.002, 0.1, 0.2, 0.25, 0.5, 1.0]),
)
def test_forking_mask_picks_the_top_fraction_of_counted_tokens(
    seed, batch, length, keep, top_fraction
):
    gen = torch.Generator().manual_seed(seed)
    # coarse values so that ties occur: the count must stay exact anyway
    entropy = torch.randint(0, 5, (batch, length), generator=gen).float() / 2
    mask = torch.rand(batch, length, generator=gen) < keep
    selected = forking_token_mask(entropy, mask, top_fraction=top_fraction)

    assert selected.dtype == torch.bool and selected.shape == mask.shape
    assert int(selected.sum()) == _expected_count(top_fraction, int(mask.sum()))
    assert not (selected & ~mask).any()
    unselected = mask & ~selected
    if selected.any() and unselected.any():
        assert entropy[selected].min() >= entropy[unselected].max()


def test_forking_mask_hand_case_ignores_padding():
    entropy = torch.tensor([[0.1, 2.0, 0.3, 9.0], [1.5, 0.2, 0.7, 8.0]])
    mask = torch.tensor([[True, True, True, False], [True, True, True, False]])
    # 6 counted tokens: ceil(0.2 * 6) = ceil(1.2) = 2 -> entropies 2.0 and 1.5 (the padded 9.0
    # and 8.0 are the largest values but never count)
    expected = torch.tensor([[False, True, False, False], [True, False, False, False]])
    assert torch.equal(forking_token_mask(entropy, mask), expected)


def test_forking_mask_exact_count_where_the_float_product_overshoots():
    # 15 counted tokens at 20 %: 0.2 * 15 = 3.0000000000000004 in floats, the answer is 3
    selected = forking_token_mask(
        torch.arange(15.0).reshape(3, 5), torch.ones(3, 5, dtype=torch.bool)
    )
    assert int(selected.sum()) == 3
    assert selected.reshape(-1)[-3:].all()


def test_kl_cov_selection_hand_case():
    # counted tokens (row 0: three, row 1: the first); the padded ones would dominate if counted
    advantages = torch.tensor([[1.0, -1.0, 1.0], [-1.0, 100.0, 100.0]])
    log_probs = torch.tensor([[-0.1, -0.2, -2.0], [-3.0, 5.0, 5.0]])
    mask = torch.tensor([[True, True, True], [True, False, False]])
    # mean A = (1 - 1 + 1 - 1) / 4 = 0; mean logp = (-0.1 - 0.2 - 2.0 - 3.0) / 4 = -1.325
    # cov = A * (logp + 1.325) = [1 * 1.225, -1 * 1.125, 1 * -0.675, -1 * -1.675]
    #     = [1.225, -1.125, -0.675, 1.675]
    # default 0.2 %: ceil(0.002 * 4) = 1 token -> the last counted one (1.675)
    assert torch.equal(
        kl_cov_selection(advantages, log_probs, mask),
        torch.tensor([[False, False, False], [True, False, False]]),
    )
    # 50 %: ceil(0.5 * 4) = 2 tokens -> 1.675 and 1.225
    assert torch.equal(
        kl_cov_selection(advantages, log_probs, mask, top_fraction=0.5),
        torch.tensor([[True, False, False], [True, False, False]]),
    )


def test_kl_cov_penalty_values_and_gradient():
    log_probs = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -4.0, -1.0]], requires_grad=True)
    old_log_probs = torch.tensor([[-1.5, -1.0, -0.5], [-0.3, -3.0, -2.0]], requires_grad=True)
    selected = torch.tensor([[True, True, False], [False, True, True]])
    penalty = kl_cov_penalty(log_probs, old_log_probs, selected, coef=2.0)
    # 2 * |logp - old| = [[2 * 0.5, 2 * 1.0, -], [-, 2 * 1.0, 2 * 1.0]]
    torch.testing.assert_close(penalty, torch.tensor([[1.0, 2.0, 0.0], [0.0, 2.0, 2.0]]))
    log_probs_grad, old_grad = torch.autograd.grad(
        penalty.sum(), [log_probs, old_log_probs], allow_unused=True
    )
    # d/dlogp 2 |logp - old| = 2 sign(logp - old) on the selected tokens, 0 elsewhere
    torch.testing.assert_close(log_probs_grad, torch.tensor([[2.0, -2.0, 0.0], [0.0, -2.0, 2.0]]))
    assert old_grad is None  # the rollout policy's log-probs are a constant


_ZEROS = torch.zeros(2, 3)
_ALL = torch.ones(2, 3, dtype=torch.bool)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: forking_token_mask(_ZEROS, _ALL, top_fraction=0.0), "top_fraction"),
        (lambda: forking_token_mask(_ZEROS, _ALL, top_fraction=1.5), "top_fraction"),
        (lambda: forking_token_mask(_ZEROS, _ALL.float()), "bool"),
        (lambda: forking_token_mask(_ZEROS, _ALL[:, :2]), "shape"),
        (lambda: kl_cov_selection(_ZEROS, _ZEROS.T, _ALL), "same shape"),
        (lambda: kl_cov_penalty(_ZEROS, _ZEROS, _ALL, coef=-1.0), "coef"),
    ],
)
def test_selection_and_penalty_reject_invalid_arguments(call, match):
    with pytest.raises(ValueError, match=match):
        call()


@pytest.mark.parametrize(
    ("schedule", "expected"),
    [
        # warmup 10 steps to 0.001, then constant: 0.001 * 5 / 10 = 0.0005 at step 5
        (CoefficientSchedule(0.001, warmup_steps=10), {0: 0.0, 5: 0.0005, 10: 0.001, 999: 0.001}),
        # linear 1 -> 0 over 10 steps, held after
        (
            CoefficientSchedule(1.0, kind="linear", final_value=0.0, total_steps=10),
            {0: 1.0, 5: 0.5, 10: 0.0, 20: 0.0},
        ),
        # warmup 2 then linear 1 -> 0 over steps 2..12: step 7 is halfway
        (
            CoefficientSchedule(
                1.0, kind="linear", final_value=0.0, warmup_steps=2, total_steps=12
            ),
            {1: 0.5, 2: 1.0, 7: 0.5, 12: 0.0},
        ),
        # cosine 1 -> 0 over 10: step 2 = 0.5 * (1 + cos(0.2 pi)) = 0.5 * 1.809017 = 0.904508
        (
            CoefficientSchedule(1.0, kind="cosine", final_value=0.0, total_steps=10),
            {0: 1.0, 2: 0.904508, 5: 0.5, 10: 0.0, 15: 0.0},
        ),
        # cosine upwards 0.1 -> 0.3: halfway is the midpoint 0.2
        (
            CoefficientSchedule(0.1, kind="cosine", final_value=0.3, total_steps=4),
            {0: 0.1, 2: 0.2, 4: 0.3},
        ),
    ],
)
def test_coefficient_schedule_values(schedule, expected):
    for step, value in expected.items():
        assert schedule(step) == pytest.approx(value, abs=1e-6), step


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"kind": "exponential"}, "kind"),
        ({"warmup_steps": -1}, "warmup_steps"),
        ({"final_value": 0.0}, "final_value"),
        ({"kind": "linear", "total_steps": 10}, "final_value and total_steps"),
        ({"kind": "cosine", "final_value": 0.0}, "final_value and total_steps"),
        ({"kind": "linear", "final_value": 0.0, "total_steps": 5, "warmup_steps": 5}, "exceed"),
    ],
)
def test_coefficient_schedule_rejects_invalid_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        CoefficientSchedule(1.0, **kwargs)
    with pytest.raises(ValueError, match="step"):
        CoefficientSchedule(1.0)(-1)
