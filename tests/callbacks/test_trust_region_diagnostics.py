"""TrustRegionDiagnostics: a zero loss term and the masked means of the tail mass and in-region
entropy, through the loss-term protocol (hand-computed distributions)."""

import math
from types import SimpleNamespace

import pytest
import torch

from lit_rlhf.callbacks import PolicyLossContext, TrustRegionDiagnostics, policy_loss_terms


def _context() -> PolicyLossContext:
    # two response tokens that count, one padding token with a different distribution
    counted = torch.tensor([0.5, 0.3, 0.15, 0.05]).log()
    other = torch.tensor([0.25, 0.25, 0.25, 0.25]).log()
    logits = torch.stack([counted, other, counted])[None].requires_grad_(True)  # [1, 3, 4]
    mask = torch.tensor([[True, True, False]])
    zeros = torch.zeros(1, 3)
    return PolicyLossContext(logits, zeros, zeros, zeros, mask, zeros.clone())


def test_stats_are_masked_means_and_the_term_is_zero() -> None:
    ctx = _context()
    trainer = SimpleNamespace(callbacks=[TrustRegionDiagnostics(k=2, p=0.9)])
    term, stats = policy_loss_terms(trainer, None, ctx)
    assert torch.equal(term, torch.zeros(1, 3))
    name = "TrustRegionDiagnostics"
    # top-2 tail: 0.2 (first token) and 0.5 (uniform), mean 0.35; the padded token is ignored
    assert stats[f"{name}/tail_mass_topk"].item() == pytest.approx(0.35, abs=1e-6)
    # in-region entropy: 0.66156 (q = 0.625, 0.375) and ln 2 (two equal tokens)
    assert stats[f"{name}/entropy_topk"].item() == pytest.approx(
        (0.661563 + math.log(2)) / 2, abs=1e-6
    )
    # 0.9 nucleus: 3 tokens, tail 0.05 (first); uniform: mass before 0, .25, .5, .75 -> all 4,
    # tail 0
    assert stats[f"{name}/tail_mass_topp"].item() == pytest.approx(0.025, abs=1e-6)
    assert stats[f"{name}/region_size_topp"].item() == pytest.approx(3.5)
    h3 = -sum(w / 0.95 * math.log(w / 0.95) for w in (0.5, 0.3, 0.15))
    assert stats[f"{name}/entropy_topp"].item() == pytest.approx((h3 + math.log(4)) / 2, abs=1e-6)
    assert all(not v.requires_grad for v in stats.values())


def test_bad_settings_are_refused_when_built() -> None:
    with pytest.raises(ValueError, match="k=0 must be >= 1"):
        TrustRegionDiagnostics(k=0)
    with pytest.raises(ValueError, match=r"p=0\.0 must be in"):
        TrustRegionDiagnostics(p=0.0)
    with pytest.raises(ValueError, match="exceeds the vocabulary size 4"):
        TrustRegionDiagnostics(k=5).policy_loss_term(None, None, _context())
