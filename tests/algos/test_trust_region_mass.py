"""trust_region_mass: the tail mass outside TRE's trust region and the entropy inside it, on
hand-computed distributions."""

import math

import pytest
import torch

from lit_rlhf.algos import trust_region_mass

PROBS = [0.5, 0.3, 0.15, 0.05]


def _logits(probs: list[float]) -> torch.Tensor:
    return torch.tensor(probs, dtype=torch.float64).log()


def _entropy(weights: list[float]) -> float:
    total = sum(weights)
    return -sum(w / total * math.log(w / total) for w in weights)


def test_top2_tail_mass_and_entropy_inside() -> None:
    tail, entropy, size = trust_region_mass(_logits(PROBS)[None], mode="topk", k=2)
    # outside {0.5, 0.3}: 0.15 + 0.05 = 0.2; inside q = (0.625, 0.375):
    # H = -(0.625 ln 0.625 + 0.375 ln 0.375) = 0.29375 + 0.36781 = 0.66156
    assert tail.item() == pytest.approx(0.2)
    assert entropy.item() == pytest.approx(0.661563, abs=1e-6)
    assert size.item() == 2 and tail.dtype == torch.float64


def test_nucleus_keeps_the_token_that_crosses_p() -> None:
    # mass ranked before each token: 0, 0.5, 0.8, 0.95; p = 0.9 keeps the first three
    tail, entropy, size = trust_region_mass(_logits(PROBS)[None], mode="topp", p=0.9)
    assert size.item() == 3
    assert tail.item() == pytest.approx(0.05)
    assert entropy.item() == pytest.approx(_entropy([0.5, 0.3, 0.15]))
    # p = 0.5: the mass before the second token is 0.5, not < 0.5: a region of one token,
    # half the mass outside it, no entropy inside
    tail, entropy, size = trust_region_mass(_logits(PROBS)[None], mode="topp", p=0.5)
    assert (size.item(), entropy.item()) == (1, 0.0)
    assert tail.item() == pytest.approx(0.5)


def test_candidate_cap_leaves_the_rest_in_the_tail() -> None:
    # uniform over 8 tokens, p = 0.99 would take all 8, but max_candidates = 4 caps the region
    logits = torch.zeros(1, 8)
    tail, entropy, size = trust_region_mass(logits, mode="topp", p=0.99, max_candidates=4)
    assert size.item() == 4
    assert tail.item() == pytest.approx(0.5)
    assert entropy.item() == pytest.approx(math.log(4), abs=1e-6)


def test_shapes_chunks_no_gradient_and_masked_entries() -> None:
    torch.manual_seed(0)
    logits = torch.randn(2, 3, 11, requires_grad=True)
    whole = trust_region_mass(logits, mode="topp", p=0.9, chunk_size=None)
    chunked = trust_region_mass(logits, mode="topp", p=0.9, chunk_size=2)
    for a, b in zip(whole, chunked, strict=True):
        assert a.shape == (2, 3) and torch.equal(a, b)
    assert not whole[0].requires_grad and not whole[1].requires_grad
    # a -inf entry (probability 0) is never in the region and adds nothing to the tail
    masked = torch.tensor([[0.0, 0.0, float("-inf"), float("-inf")]])
    tail, entropy, size = trust_region_mass(masked, mode="topk", k=3)
    assert size.item() == 2 and tail.item() == pytest.approx(0.0)
    assert entropy.item() == pytest.approx(math.log(2))


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="p \\(the TRE-P mass threshold\\)"):
        trust_region_mass(torch.zeros(1, 4), mode="topp", p=1.5)
    with pytest.raises(ValueError, match="exceeds the vocabulary size"):
        trust_region_mass(torch.zeros(1, 4), mode="topk", k=5)
