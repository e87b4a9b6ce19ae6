"""The importance weights that correct for the rollout engine's numerics and the logged
mismatch, against values computed by hand: TIS (truncated to [floor, cap]) and masked IS (the
ratio inside [low, high], 0 outside), each per token and per sequence, i.e. TRL 1.16's
``vllm_importance_sampling_mode`` token_truncate, token_mask, sequence_truncate and
sequence_mask."""

import math

import pytest
import torch

from lit_rlhf.algos import (
    importance_log_ratios,
    importance_weights,
    masked_importance_weights,
    mismatch_stats,
    sequence_mean_weights,
    truncated_importance_weights,
)

TRAIN = torch.log(torch.tensor([[0.5, 0.2, 0.9], [0.3, 0.6, 0.1]]))
ENGINE = torch.log(torch.tensor([[0.4, 0.05, 0.9], [0.6, 0.6, 0.5]]))
MASK = torch.tensor([[True, True, True], [True, True, False]])
# token ratios pi_old / mu: [[1.25, 4, 1], [0.5, 1, 0.2 (not counted)]]
# sequence ratios (products over the counted tokens): 1.25 * 4 * 1 = 5 and 0.5 * 1 = 0.5


def _close(actual, expected):
    torch.testing.assert_close(actual, torch.tensor(expected), rtol=1e-5, atol=1e-6)


def test_masked_is_keeps_the_ratio_as_the_weight():
    """The issue's example: pi_old [0.5, 0.2, 0.9], mu [0.4, 0.05, 0.9], band [0, 2]."""
    w = masked_importance_weights(TRAIN[:1], ENGINE[:1], MASK[:1], low=0.0, high=2.0)
    _close(w, [[1.25, 0.0, 1.0]])


def test_token_mask_drops_tokens_outside_the_band():
    w = masked_importance_weights(TRAIN, ENGINE, MASK, low=0.6, high=2.0)
    _close(w, [[1.25, 0.0, 1.0], [0.0, 1.0, 0.0]])  # 4 > 2 and 0.5 < 0.6 out; 0.2 not counted
    train = TRAIN.clone().requires_grad_()
    assert not masked_importance_weights(train, ENGINE, MASK, low=0.6, high=2.0).requires_grad


def test_the_band_is_inclusive():
    """A ratio equal to a bound is kept (TRL zeroes only ratio < min or ratio > max)."""
    train, engine = torch.tensor([[0.0, -0.5]]), torch.tensor([[-0.5, 0.0]])
    high, low = float(torch.exp(torch.tensor(0.5))), float(torch.exp(torch.tensor(-0.5)))
    w = masked_importance_weights(train, engine, torch.ones(1, 2, dtype=torch.bool),
                                  low=low, high=high)  # fmt: skip
    _close(w, [[high, low]])


def test_token_truncate_clamps_the_ratio_to_cap():
    w = truncated_importance_weights(TRAIN, ENGINE, cap=2.0)
    _close(w, [[1.25, 2.0, 1.0], [0.5, 1.0, 0.2]])  # 0.2/0.05 = 4 -> 2; the caller masks
    train = TRAIN.clone().requires_grad_()
    assert not truncated_importance_weights(train, ENGINE, cap=2.0).requires_grad


def test_token_truncate_with_a_floor_raises_small_ratios():
    w = truncated_importance_weights(TRAIN, ENGINE, cap=2.0, floor=0.6)
    _close(w, [[1.25, 2.0, 1.0], [0.6, 1.0, 0.6]])


def test_sequence_ratio_is_the_product_over_counted_tokens():
    log_ratio = importance_log_ratios(TRAIN, ENGINE, MASK, level="sequence")
    _close(log_ratio.exp(), [[5.0] * 3, [0.5] * 3])  # the uncounted 0.2 is left out


def test_sequence_truncate_weights_the_whole_row():
    w = truncated_importance_weights(TRAIN, ENGINE, cap=2.0, level="sequence", mask=MASK)
    _close(w, [[2.0] * 3, [0.5] * 3])
    w = truncated_importance_weights(TRAIN, ENGINE, cap=2.0, floor=0.6, level="sequence", mask=MASK)
    _close(w, [[2.0] * 3, [0.6] * 3])


def test_sequence_mask_drops_whole_rows():
    # TRL's defaults: clip_max 3, clip_min None (lit-rlhf: low 0)
    w = masked_importance_weights(TRAIN, ENGINE, MASK, low=0.0, high=3.0, level="sequence")
    _close(w, [[0.0, 0.0, 0.0], [0.5, 0.5, 0.0]])  # 5 > 3: row 0 out; row 1 keeps 0.5
    w = masked_importance_weights(TRAIN, ENGINE, MASK, low=0.6, high=6.0, level="sequence")
    _close(w, [[5.0, 5.0, 5.0], [0.0, 0.0, 0.0]])


def test_an_empty_row_has_sequence_ratio_one():
    mask = torch.tensor([[False, False, False], [True, False, False]])
    w = truncated_importance_weights(TRAIN, ENGINE, cap=2.0, level="sequence", mask=mask)
    _close(w, [[1.0] * 3, [0.5] * 3])


@pytest.mark.parametrize(
    "correction,level,kwargs,weights,stats",
    [
        ("tis", "token", dict(cap=2.0, floor=0.6), [[1.25, 2.0, 1.0], [0.6, 1.0, 0.6]],
         {"capped_fraction": 1 / 5, "floored_fraction": 1 / 5, "weight_mean": 5.85 / 5}),
        ("tis", "sequence", dict(cap=2.0), [[2.0] * 3, [0.5] * 3],
         {"capped_fraction": 3 / 5, "weight_mean": (3 * 2.0 + 2 * 0.5) / 5}),
        ("mask", "token", dict(low=0.6, high=2.0), [[1.25, 0.0, 1.0], [0.0, 1.0, 0.0]],
         {"masked_fraction": 2 / 5, "weight_mean": 3.25 / 5}),
        ("mask", "sequence", dict(low=0.0, high=3.0), [[0.0] * 3, [0.5, 0.5, 0.0]],
         {"masked_fraction": 3 / 5, "weight_mean": 1.0 / 5}),
    ],
    ids=["token_truncate", "sequence_truncate", "token_mask", "sequence_mask"],
)  # fmt: skip
def test_each_mode_with_its_diagnostics(correction, level, kwargs, weights, stats):
    w, got = importance_weights(TRAIN, ENGINE, MASK, correction=correction, level=level, **kwargs)
    _close(w, weights)
    assert set(got) == set(stats)
    for key, value in stats.items():
        assert float(got[key]) == pytest.approx(value, rel=1e-5), key


def test_sequence_mean_weights_average_each_row_over_its_counted_tokens():
    w = truncated_importance_weights(TRAIN, ENGINE, cap=2.0)  # [[1.25, 2, 1], [0.5, 1, 0.2]]
    _close(sequence_mean_weights(w, MASK), [[4.25 / 3] * 3, [0.75] * 3])


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


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(cap=0.0), "cap must be > 0"),
        (dict(cap=2.0, floor=2.0), "0 <= floor < cap"),
        (dict(cap=2.0, floor=-0.1), "0 <= floor < cap"),
        (dict(cap=2.0, level="sequence"), "pass mask"),
        (dict(cap=2.0, level="row", mask=MASK), "'token' or 'sequence'"),
    ],
)
def test_bad_truncation_arguments_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        truncated_importance_weights(TRAIN, ENGINE, **kwargs)


def test_an_unknown_correction_is_refused():
    with pytest.raises(ValueError, match="'tis' or 'mask'"):
        importance_weights(TRAIN, ENGINE, MASK, correction="none")
