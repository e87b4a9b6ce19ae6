"""Conflict diagnostics of MGS measured from per-tensor Gram matrices: hand-computed cosines,
conflict fractions per module vs global, PCGrad's coefficients against the tensor algorithm,
the share of the norm the projections remove, and the shuffled-label null control."""

from __future__ import annotations

import math

import pytest
import torch

from lit_rlhf.algos.gradient_surgery import (
    conflict_summary,
    pcgrad_coefficients,
    permute_task_labels,
    project_conflicting,
    task_gram,
)

# two tasks, two tensors: they conflict on "a" (opposite) and agree strongly on "b"
GRADS = {
    "t1": {"a": torch.tensor([1.0, 0.0]), "b": torch.tensor([0.0, 3.0])},
    "t2": {"a": torch.tensor([-1.0, 0.0]), "b": torch.tensor([0.0, 3.0])},
}


def test_gram_matrices_are_the_inner_products_of_each_tensor() -> None:
    tasks, grams = task_gram(GRADS)
    assert tasks == ["t1", "t2"]
    torch.testing.assert_close(grams["a"], torch.tensor([[1.0, -1.0], [-1.0, 1.0]]).double())
    torch.testing.assert_close(grams["b"], torch.tensor([[9.0, 9.0], [9.0, 9.0]]).double())


def test_a_conflict_visible_per_module_is_hidden_in_the_global_gradient() -> None:
    _, grams = task_gram(GRADS)
    per_module = conflict_summary(grams, {"a": ["a"], "b": ["b"]})
    whole = conflict_summary(grams, {"global": ["a", "b"]})
    # per module: cosines -1 (a) and +1 (b); globally (<g1, g2> = -1 + 9 = 8, |g|^2 = 10): 0.8
    assert (per_module.conflict_fraction, per_module.cosine_mean) == (0.5, 0.0)
    assert whole.conflict_fraction == 0.0 and whole.cosine_mean == pytest.approx(0.8)
    # per module PCGrad on "a": g1' = g1 - (-1/1) g2 = 0 and g2' = 0, so the sum on "a" stays 0
    # while "b" is untouched: nothing changes (plain sum (0, 6)); globally no conflict either
    assert per_module.removed_share == pytest.approx(0.0) and per_module.norm_ratio == 1.0
    assert whole.removed_share == 0.0 and whole.groups == 1 and per_module.groups == 2


def test_a_zero_domain_gradient_has_no_cosine_and_is_counted_apart() -> None:
    # t3 tied all its rewards: zero gradient. Its pairs have no cosine (not "no conflict").
    grads = {**GRADS, "t3": {"a": torch.zeros(2), "b": torch.zeros(2)}}
    _, grams = task_gram(grads)
    per_module = conflict_summary(grams, {"a": ["a"], "b": ["b"]})
    assert per_module.undefined_pairs == 4  # (t1, t3) and (t2, t3) in each of 2 groups
    assert (per_module.conflict_fraction, per_module.cosine_mean) == (0.5, 0.0)  # as before
    none = conflict_summary(task_gram({"x": {"a": torch.zeros(2)}, "y": {"a": torch.ones(2)}})[1],
                            {"a": ["a"]})  # fmt: skip
    assert none.undefined_pairs == 1 and math.isnan(none.conflict_fraction)
    assert math.isnan(none.cosine_mean)
    flat = {"x": torch.zeros(2), "y": torch.tensor([1.0, -1.0]), "z": torch.tensor([-1.0, 1.0])}
    _, stats = project_conflicting(flat, generator=torch.Generator().manual_seed(0))
    assert stats.cosine == {("y", "z"): pytest.approx(-1.0)} and stats.conflicts == 1


def test_removed_share_of_a_hand_computed_projection() -> None:
    # g1 = (1, 0), g2 = (-1, 1): <g1, g2> = -1. g1' = g1 + g2 / 2 = (0.5, 0.5), g2' = g2 + g1
    # = (0, 1); plain sum (0, 1), PCGrad's (0.5, 1.5): |(0.5, 0.5)| / 1 removed, ratio sqrt(2.5)
    grads = {"t1": {"w": torch.tensor([1.0, 0.0])}, "t2": {"w": torch.tensor([-1.0, 1.0])}}
    _, grams = task_gram(grads)
    summary = conflict_summary(grams, {"w": ["w"]})
    assert summary.removed_share == pytest.approx(math.sqrt(0.5))
    assert summary.norm_ratio == pytest.approx(math.sqrt(2.5))
    assert summary.cosine_mean == pytest.approx(-1 / math.sqrt(2))


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_pcgrad_coefficients_reproduce_the_tensor_algorithm(seed: int) -> None:
    g = torch.Generator().manual_seed(100 + seed)
    flat = {t: torch.randn(7, generator=g) for t in ("a", "b", "c", "d")}
    flat["b"] = -flat["a"] + 0.1 * flat["b"]  # make sure some pairs conflict
    expected, _ = project_conflicting(flat, generator=torch.Generator().manual_seed(seed))
    stacked = torch.stack([flat[t] for t in sorted(flat)]).double()
    coef = pcgrad_coefficients(stacked @ stacked.T, generator=torch.Generator().manual_seed(seed))
    torch.testing.assert_close((coef.sum(dim=0) @ stacked).float(), expected, atol=1e-5, rtol=0)


def test_the_null_control_permutes_labels_across_prompt_groups() -> None:
    tasks = ["x", "x", "y", "y", "z", "z", "x", "x"]
    groups = [0, 0, 1, 1, 2, 2, 3, 3]
    labels = permute_task_labels(tasks, groups, generator=torch.Generator().manual_seed(3))
    assert all(labels[i] == labels[i + 1] for i in range(0, 8, 2))  # one label per prompt
    assert sorted(labels) == sorted(tasks)  # each task keeps its number of prompts
    draws = {
        tuple(permute_task_labels(tasks, groups, generator=torch.Generator().manual_seed(s)))
        for s in range(20)
    }
    assert len(draws) > 3  # the permutation does move labels
    with pytest.raises(ValueError, match="3 task labels but 2 group ids"):
        permute_task_labels(["x", "y", "z"], [0, 1])
