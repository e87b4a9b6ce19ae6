"""PCGrad on gradient shards (MGS under FSDP2) equals PCGrad on whole gradients: two simulated
ranks each hold half of every task's gradient, their Gram matrices are summed as an all-reduce
would, and the two combined halves joined are the whole-gradient surgery's result."""

from __future__ import annotations

import pytest
import torch

from lit_rlhf.algos.gradient_surgery import group_parameters, surgery, task_gram
from lit_rlhf.algos.sharded_surgery import sharded_surgery

NAMES = ["model.layers.0.self_attn.q_proj.weight", "model.layers.0.mlp.up_proj.weight",
         "model.layers.0.input_layernorm.weight", "lm_head.weight"]  # fmt: skip


def _grads(seed: int) -> dict[str, dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    shapes = {NAMES[0]: (6, 4), NAMES[1]: (8, 4), NAMES[2]: (4,), NAMES[3]: (10, 4)}
    base = {n: torch.randn(s, generator=gen) for n, s in shapes.items()}
    # three tasks; "chat" opposes "math" in the attention tensor (a planted conflict)
    tasks = {t: {n: torch.randn(s, generator=gen) for n, s in shapes.items()} for t in
             ("chat", "ifeval", "math")}  # fmt: skip
    tasks["math"][NAMES[0]] = base[NAMES[0]]
    tasks["chat"][NAMES[0]] = -0.7 * base[NAMES[0]] + 0.1 * tasks["chat"][NAMES[0]]
    return tasks


@pytest.mark.parametrize("granularity", ["tensor", "module", "global"])
def test_two_ranks_halves_combine_to_the_whole_gradients_surgery(granularity):
    grads = _grads(0)
    groups = group_parameters(NAMES, granularity)
    whole, whole_stats = surgery(grads, groups, generator=torch.Generator().manual_seed(3))
    halves = [
        {t: {n: g.reshape(-1).chunk(2)[r] for n, g in per.items()} for t, per in grads.items()}
        for r in (0, 1)
    ]  # what each rank holds (FSDP2 shards dim 0; any split sums to the same Gram matrices)
    grams = [task_gram(h)[1] for h in halves]
    summed = torch.stack([grams[0][n] + grams[1][n] for n in NAMES])  # the all-reduce
    results = [
        sharded_surgery(h, groups, reduce=lambda local: summed,
                        generator=torch.Generator().manual_seed(3))
        for h in halves
    ]  # fmt: skip
    for name in NAMES:
        joined = torch.cat([results[0].combined[name], results[1].combined[name]])
        torch.testing.assert_close(joined, whole[name].reshape(-1), atol=1e-5, rtol=1e-5)
    for group, stats in whole_stats.items():
        assert results[0].stats[group].projections == stats.projections
        assert results[0].stats[group].cosine == pytest.approx(stats.cosine, abs=1e-6)
    assert any(s.projections for s in whole_stats.values())  # the conflict was projected


def test_without_apply_the_shards_sum_and_nothing_is_removed():
    grads = _grads(1)
    groups = group_parameters(NAMES, "module")
    out = sharded_surgery(grads, groups, reduce=lambda local: local, apply=False)
    for name in NAMES:
        torch.testing.assert_close(out.combined[name], sum(g[name] for g in grads.values()))
    assert out.removed_share == pytest.approx(0.0) and out.norm_ratio == pytest.approx(1.0)
