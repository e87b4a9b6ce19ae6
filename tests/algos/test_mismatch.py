"""The importance weights that correct for the rollout engine's numerics (TIS and the masked
variant) and the logged mismatch, against values computed by hand."""

import math

import pytest
import torch

from lit_rlhf.algos import masked_importance_weights, mismatch_stats, truncated_importance_weights

TRAIN = torch.log(torch.tensor([[0.5, 0.2, 0.9], [0.3, 0.6, 0.1]]))
ENGINE = torch.log(torch.tensor([[0.4, 0.05, 0.9], [0.6, 0.6, 0.5]]))
MASK = torch.tensor([[True, True, True], [True, True, False]])


def test_tis_weights_are_the_ratio_capped():
    w = truncated_importance_weights(TRAIN, ENGINE, cap=2.0)
    expected = torch.tensor([[1.25, 2.0, 1.0], [0.5, 1.0, 0.2]])  # 0.2/0.05 = 4 -> capped at 2
    torch.testing.assert_close(w, expected)
    assert not w.requires_grad


def test_masked_weights_drop_tokens_outside_the_band():
    w = masked_importance_weights(TRAIN, ENGINE, MASK, low=0.6, high=2.0)
    assert w.tolist() == [[1.0, 0.0, 1.0], [0.0, 1.0, 0.0]]


def test_mismatch_stats_by_hand():
    stats = mismatch_stats(TRAIN, ENGINE, MASK)
    ratios = [1.25, 4.0, 1.0, 0.5, 1.0]
    assert float(stats["abs_log_ratio"]) == pytest.approx(
        sum(abs(math.log(r)) for r in ratios) / 5, rel=1e-5
    )
    # k3 of KL(engine || train): (q/p - 1) - log(q/p), q/p = train / engine
    assert float(stats["kl"]) == pytest.approx(
        sum(r - 1 - math.log(r) for r in ratios) / 5, rel=1e-5
    )
    assert float(stats["ratio_max"]) == pytest.approx(4.0)
    assert float(stats["ratio_min"]) == pytest.approx(0.5)


@pytest.mark.parametrize("kwargs", [dict(low=1.0, high=2.0), dict(low=0.5, high=1.0)])
def test_a_band_that_excludes_ratio_one_is_refused(kwargs):
    with pytest.raises(ValueError, match="0 <= low < 1 < high"):
        masked_importance_weights(TRAIN, ENGINE, MASK, **kwargs)
