"""Compressor-decoder diagnostics: effective rank against a NumPy SVD reference and its known
values, teacher-forced token entropy by hand, token-level fidelity by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lit_rlhf.algos.compression import (
    effective_rank,
    exact_match,
    normalize_text,
    pooled_effective_rank,
    token_entropy,
    token_f1,
)


def _numpy_erank(z: np.ndarray) -> float:
    sigma = np.linalg.svd(z, compute_uv=False)
    p = sigma / sigma.sum()
    p = p[p > 0]
    return float(np.exp(-(p * np.log(p)).sum()))


@pytest.mark.parametrize("shape", [(4, 16), (16, 4), (8, 8), (1, 5)])
def test_effective_rank_matches_numpy_svd(shape):
    z = torch.randn(
        *shape, generator=torch.Generator().manual_seed(sum(shape)), dtype=torch.float64
    )
    assert effective_rank(z).item() == pytest.approx(_numpy_erank(z.numpy()), rel=1e-9)


def test_effective_rank_is_batched_over_leading_dims():
    z = torch.randn(2, 3, 6, 10, generator=torch.Generator().manual_seed(0))
    out = effective_rank(z)
    assert out.shape == (2, 3)
    expected = [[_numpy_erank(z[i, j].double().numpy()) for j in range(3)] for i in range(2)]
    torch.testing.assert_close(out.double(), torch.tensor(expected, dtype=torch.float64))


def test_rank_one_matrix_has_effective_rank_one():
    # u v^T: a single non-zero singular value -> p = (1, 0, ...) -> entropy 0 -> erank e^0 = 1
    u, v = torch.randn(6, 1, dtype=torch.float64), torch.randn(1, 9, dtype=torch.float64)
    assert effective_rank(u @ v).item() == pytest.approx(1.0, abs=1e-6)


@pytest.mark.parametrize("k", [1, 3, 8])
def test_equal_norm_orthogonal_rows_have_effective_rank_k(k):
    # k orthonormal rows scaled by 2.5: k equal singular values -> p_i = 1/k -> erank = k
    q, _ = torch.linalg.qr(torch.randn(12, 12, generator=torch.Generator().manual_seed(k)))
    assert effective_rank(2.5 * q[:k]).item() == pytest.approx(k, rel=1e-5)


def test_effective_rank_is_scale_invariant_and_zero_for_the_zero_matrix():
    z = torch.randn(2, 5, 7, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(effective_rank(1e3 * z), effective_rank(z))
    zeros = torch.zeros(3, 4, 7)
    assert effective_rank(zeros).tolist() == [0.0, 0.0, 0.0]  # documented: no direction -> 0


def test_effective_rank_accepts_bf16_and_detaches():
    z = torch.randn(4, 8, generator=torch.Generator().manual_seed(2)).requires_grad_()
    out = effective_rank(z.bfloat16())
    assert out.dtype == torch.float32 and not out.requires_grad
    assert out.item() == pytest.approx(_numpy_erank(z.detach().numpy()), rel=1e-2)


def test_pooled_effective_rank_stacks_every_memory_vector():
    z = torch.randn(3, 4, 10, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    assert pooled_effective_rank(z).item() == pytest.approx(
        _numpy_erank(z.reshape(12, 10).numpy()), rel=1e-9
    )
    # two contexts with the same rank-one memory pool to rank one
    row = torch.randn(1, 1, 10, dtype=torch.float64)
    assert pooled_effective_rank(row.expand(2, 4, 10) * 3).item() == pytest.approx(1.0, abs=1e-6)


def test_effective_rank_rejects_a_vector():
    with pytest.raises(ValueError, match=r"\[\.\.\., k, d\]"):
        effective_rank(torch.ones(5))


def test_token_entropy_by_hand():
    logits = torch.zeros(2, 3, 4)
    # sequence 0: uniform over 4 tokens at every position -> ln 4 = 1.3863 each
    # sequence 1, position 0: logits (0, 0, -inf, -inf) -> uniform over 2 -> ln 2 = 0.6931;
    # position 1: a near one-hot (100, 0, 0, 0) -> ~3 * 101 * e^-100 ~ 0; position 2 masked out
    logits[1, 0, 2:] = float("-inf")
    logits[1, 1, 0] = 100.0
    logits[1, 2] = torch.tensor([5.0, -3.0, 1.0, 2.0])
    mask = torch.tensor([[True, True, True], [True, True, False]])
    mean, per_sequence = token_entropy(logits, mask)
    torch.testing.assert_close(
        per_sequence, torch.tensor([math.log(4), math.log(2) / 2]), atol=1e-6, rtol=0
    )
    # token-weighted: (3 ln 4 + ln 2 + 0) / 5 counted tokens
    assert mean.item() == pytest.approx((3 * math.log(4) + math.log(2)) / 5, abs=1e-6)


def test_token_entropy_all_masked_row_is_nan_and_left_out_of_the_mean():
    logits = torch.randn(2, 3, 5, generator=torch.Generator().manual_seed(4))
    mask = torch.tensor([[False, False, False], [True, False, True]])
    mean, per_sequence = token_entropy(logits, mask)
    assert torch.isnan(per_sequence[0]) and not torch.isnan(per_sequence[1])
    assert mean.item() == pytest.approx(per_sequence[1].item(), rel=1e-6)
    none, _ = token_entropy(logits, torch.zeros(2, 3, dtype=torch.bool))
    assert torch.isnan(none)


def test_token_entropy_ignores_masked_positions_and_runs_in_fp32():
    logits = torch.randn(1, 4, 6, generator=torch.Generator().manual_seed(5))
    mask = torch.tensor([[True, False, True, False]])
    mean, _ = token_entropy(logits, mask)
    poisoned = logits.clone()
    poisoned[0, 1] = float("nan")  # a masked NaN must not leak
    poisoned_mean, _ = token_entropy(poisoned.bfloat16(), mask)
    assert poisoned_mean.dtype == torch.float32
    assert poisoned_mean.item() == pytest.approx(mean.item(), abs=2e-2)  # bf16 rounding only
    for chunk_size in (1, 3):  # chunking bounds memory only
        torch.testing.assert_close(token_entropy(logits, mask, chunk_size=chunk_size)[0], mean)
    with pytest.raises(ValueError, match="bool"):
        token_entropy(logits, mask.long())
    with pytest.raises(ValueError, match=r"\[B, T, V\]"):
        token_entropy(logits[0], mask)


def test_token_f1_by_hand():
    # normalised: "the cat sat on the mat" vs "the cat is on the mat"; multiset overlap
    # {the: 2, cat, on, mat} = 5 tokens, P = 5/6, R = 5/6 -> F1 = 5/6
    assert token_f1("The cat sat on the mat.", "the cat is on the mat") == pytest.approx(5 / 6)
    # prediction "a a b" vs reference "a b c d": overlap {a: 1, b: 1} = 2, P = 2/3, R = 2/4
    # F1 = 2 * (2/3) * (1/2) / (2/3 + 1/2) = (2/3) / (7/6) = 4/7
    assert token_f1("a a b", "a b c d") == pytest.approx(4 / 7)
    assert token_f1([1, 2, 2], [2, 2, 3, 4]) == pytest.approx(4 / 7)  # same shape with ids
    assert token_f1("x y", "a b") == 0.0
    assert token_f1("", "") == 1.0 and token_f1("", "a") == 0.0 and token_f1([], [7]) == 0.0


def test_exact_match_normalises_text_but_not_ids():
    assert normalize_text("  The  Cat,\nsat! ") == "the cat sat"
    assert exact_match("The cat sat.", "the  cat sat") == 1.0
    assert exact_match("the cat sat", "the cat sat down") == 0.0
    assert exact_match([3, 1, 2], [3, 1, 2]) == 1.0 and exact_match([3, 1], [1, 3]) == 0.0
