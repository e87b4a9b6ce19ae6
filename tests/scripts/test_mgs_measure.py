"""The MGS measurement study (scripts/repro/mgs_measure.py, scripts/repro/mgs_grams.py): the
domain figures from group Gram matrices equal those of the summed domain gradients, the
permutation null keeps each domain's size, a group's Gram entries are the inner products of its
real per-group gradients, and the script runs end to end at smoke scale, cached."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

from repro import mgs_grams as mg
from repro import mgs_measure as mm

from lit_rlhf.algos.advantages import group_advantages
from lit_rlhf.algos.gradient_surgery import conflict_summary


def _planted(vectors: torch.Tensor) -> torch.Tensor:
    """[M, G, G] Gram matrices of group vectors [G, M, D] (module m's slice of each)."""
    return torch.einsum("gmd,hmd->mgh", vectors, vectors).double()


def test_labelled_figures_equal_the_summed_domain_gradients() -> None:
    torch.manual_seed(0)
    vectors = torch.randn(6, 3, 5, dtype=torch.float64)  # 6 groups, 3 modules of 5 entries
    labels = ["a", "a", "b", "b", "c", "c"]
    grams = _planted(vectors)
    got = mg.labelled_figures(grams, ["m0", "m1", "m2"], labels, seed=0)
    domains = {d: vectors[[i for i, x in enumerate(labels) if x == d]].sum(0) for d in "abc"}
    cosines = []
    for m in range(3):
        for x, y in (("a", "b"), ("a", "c"), ("b", "c")):
            cosines.append(torch.nn.functional.cosine_similarity(
                domains[x][m], domains[y][m], dim=0).item())  # fmt: skip
    assert got["module_conflict"] == pytest.approx(sum(c < 0 for c in cosines) / 9)
    assert got["module_cosine"] == pytest.approx(sum(cosines) / 9)
    flat = {d: v.reshape(-1) for d, v in domains.items()}
    whole = [torch.nn.functional.cosine_similarity(flat[x], flat[y], dim=0).item()
             for x, y in (("a", "b"), ("a", "c"), ("b", "c"))]  # fmt: skip
    assert got["global_cosine"] == pytest.approx(sum(whole) / 3)
    assert got["undefined_pairs"] == 0


def test_planted_module_conflict_shows_per_module_and_not_globally() -> None:
    # domain a and b oppose in module 0 (small) and align in module 1 (large): the per-module
    # fraction sees the conflict, the global cosine is positive
    a = torch.tensor([[1.0, 0.0], [3.0, 0.0]])
    b = torch.tensor([[-1.0, 0.0], [3.0, 0.0]])
    grams = _planted(torch.stack([a, b]))
    got = mg.labelled_figures(grams, ["m0", "m1"], ["a", "b"], seed=0)
    assert got["module_conflict"] == 0.5 and got["global_conflict"] == 0.0
    # a dead group (zero gradient): its pair has no cosine and is counted as undefined
    dead = mg.labelled_figures(_planted(torch.stack([a, torch.zeros(2, 2)])), ["m0", "m1"],
                               ["a", "b"], seed=0)  # fmt: skip
    assert math.isnan(dead["global_conflict"]) and dead["undefined_pairs"] == 1


def test_null_permutes_whole_groups_and_keeps_domain_sizes() -> None:
    torch.manual_seed(1)
    grams = _planted(torch.randn(9, 2, 4, dtype=torch.float64))
    labels = ["a"] * 3 + ["b"] * 3 + ["c"] * 3
    figures = mg.batch_figures(grams, ["m0", "m1"], labels, permutations=50, seed=3)
    assert figures["true"] == mg.labelled_figures(grams, ["m0", "m1"], labels, seed=3)
    assert figures["null_defined"]["module_conflict"] == 50
    assert 0.0 <= figures["null"]["module_conflict"] <= 1.0
    # the null is the mean over permutations that keep each label's count
    gen = torch.Generator().manual_seed(3)
    perms = [mg.permute_task_labels(labels, list(range(9)), generator=gen) for _ in range(50)]
    assert all(sorted(p) == sorted(labels) for p in perms)
    means = [mg.labelled_figures(grams, ["m0", "m1"], p, seed=3)["module_cosine"] for p in perms]
    assert figures["null"]["module_cosine"] == pytest.approx(sum(means) / 50)


def test_group_grams_are_the_inner_products_of_per_group_gradients() -> None:
    from lit_rlhf.algos.ppo_losses import clipped_policy_loss
    from lit_rlhf.models.forward import forward_response
    from lit_rlhf.models.loading import load_causal_lm
    from lit_rlhf.types import Rollout

    torch.manual_seed(0)
    policy = load_causal_lm("builtin:tiny-llama")
    vocab = policy.config.vocab_size
    b, p, r = 6, 4, 5
    mask = torch.ones(b, r, dtype=torch.bool)
    mask[1, 3:] = False
    rollout = Rollout(
        prompt_ids=torch.randint(3, vocab, (b, p)), prompt_mask=torch.ones(b, p, dtype=torch.bool),
        response_ids=torch.randint(3, vocab, (b, r)), response_mask=mask, sample_log_probs=None,
        group_ids=torch.tensor([0, 0, 1, 1, 2, 2]), query_ids=[str(i) for i in range(b)],
        tasks=["x"] * b, rows=[{}] * b, prompts=[""] * b, responses=[""] * b,
        scores=torch.tensor([1.0, 0.0, 0.5, 0.5, 0.2, 0.9]), reward_info={},
    )  # fmt: skip
    modules = mg.module_groups(policy)
    grams, live = mg.group_grams(policy, rollout, modules, temperature=1.0, bf16=False)
    assert live == [0, 2]  # group 1's rewards tie: no gradient, no Gram entry
    assert grams[:, 1].abs().sum() == 0 and grams[:, :, 1].abs().sum() == 0
    adv = group_advantages(rollout.scores, rollout.group_ids)
    flat = {}
    for group in live:  # the same loss, in float32, by hand
        rows = (rollout.group_ids == group).nonzero().squeeze(1)
        policy.zero_grad()
        fwd = forward_response(policy, rollout.input_ids[rows], rollout.attention_mask[rows],
                               rollout.response_ids[rows], temperature=1.0)  # fmt: skip
        loss, _ = clipped_policy_loss(
            fwd.log_probs,
            fwd.log_probs.detach(),
            adv[rows, None].expand(mask[rows].shape),
            mask[rows],
        )
        (loss.sum() / mask.sum()).backward()
        flat[group] = {n: p.grad.reshape(-1).clone() for n, p in policy.named_parameters()}
    for m, names in enumerate(modules.values()):
        dot = sum(float(flat[0][n] @ flat[2][n]) for n in names)
        norm = sum(float(flat[0][n] @ flat[0][n]) for n in names)
        assert grams[m, 0, 2].item() == pytest.approx(dot, rel=2e-2, abs=1e-9)  # bf16 storage
        assert grams[m, 0, 0].item() == pytest.approx(norm, rel=2e-2, abs=1e-9)
    summary = conflict_summary({m: grams[i] for i, m in enumerate(modules)}, {"all": list(modules)})
    assert summary.undefined_pairs == 2  # group 1 pairs with both others: no cosine


def test_smoke_end_to_end_and_cached(tmp_path: Path) -> None:
    args = ["--smoke", "--root", str(tmp_path / "runs"), "--out", str(tmp_path / "m.json")]
    record = mm.main(args)
    s = mm.settings(smoke=True)
    for name in ("base", "trained"):
        policy = record["policies"][name]
        assert policy["gate"]["passes"]
        assert len(policy["batches"]) == s["batches"]
        for f in policy["batches"]:
            assert sum(f["live"].values()) <= 3 * s["per_domain"]
            assert set(f["true"]) == set(mg.FIGURES)
        assert policy["primary"]["batches"] + policy["primary"]["left_out"] == s["batches"]
    assert (tmp_path / "runs" / "smoke" / "trained.pt").exists()
    again = mm.main(args)  # the trained policy, gates and batches cached: the same figures
    assert json.dumps(again["policies"], sort_keys=True) == json.dumps(
        record["policies"], sort_keys=True
    )


def test_primary_and_verdict_rules() -> None:
    def batch(tm: float, tg: float, nm: float, ng: float) -> dict:
        return {
            "true": {"module_conflict": tm, "global_conflict": tg},
            "null": {"module_conflict": nm, "global_conflict": ng},
        }

    batches = [batch(0.6, 0.2, 0.5, 0.4), batch(0.7, 0.3, 0.5, 0.5),
               batch(0.5, math.nan, 0.5, 0.5)] * 5  # fmt: skip
    got = mm.primary(batches)
    assert got["batches"] == 10 and got["left_out"] == 5
    assert got["mean"] == pytest.approx((0.3 + 0.4) / 2)
    assert got["verdict"] == "reproduced"
    flipped = mm.primary([batch(0.2, 0.6, 0.5, 0.5), batch(0.1, 0.5, 0.4, 0.4)] * 5)
    assert flipped["verdict"] == "opposite"
    gate = {"passes": True}
    policies = {
        "base": {"gate": gate, "primary": got},
        "trained": {"gate": gate, "primary": flipped},
    }
    assert mm.overall(policies) == "not shown"
    policies["trained"] = {"gate": gate, "primary": got}
    assert mm.overall(policies) == "reproduced"
    closed = {"passes": False}
    assert mm.overall({"base": {"gate": closed, "primary": got}}).startswith("not testable")
    # one policy closed by its gate: the overall verdict needs both
    assert mm.overall({"base": {"gate": closed, "primary": got},
                       "trained": {"gate": gate, "primary": got}}) == "not shown"  # fmt: skip


def test_probe_writes_the_arithmetic_templates_figures(tmp_path: Path) -> None:
    record = mm.main(["--smoke", "--probe", "--out", str(tmp_path / "m.json")])
    saved = json.loads((tmp_path / "m_probe.json").read_text())
    assert saved["arithmetic"] == record["arithmetic"]
    assert saved["arithmetic"]["prompts"] == 24
    assert 0.0 <= saved["arithmetic"]["live_share"] <= 1.0
