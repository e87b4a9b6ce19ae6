"""Modular gradient surgery (PCGrad per parameter group): the projection rule, the sum, one
task, global = PCGrad on the flattened gradient (a NumPy reference), and the groupings."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lit_rlhf.algos.gradient_surgery import (
    group_parameters,
    project_conflicting,
    projected_task_gradients,
    surgery,
)


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_two_conflicting_tasks_lose_their_conflicting_components() -> None:
    g1, g2 = torch.tensor([1.0, 1.0]), torch.tensor([-1.0, 0.5])
    projected, stats = projected_task_gradients({"a": g1, "b": g2}, generator=_gen())
    expected_a = g1 - torch.dot(g1, g2) / torch.dot(g2, g2) * g2
    expected_b = g2 - torch.dot(g2, g1) / torch.dot(g1, g1) * g1
    torch.testing.assert_close(projected["a"], expected_a)
    torch.testing.assert_close(projected["b"], expected_b)
    assert torch.dot(projected["a"], g2) >= -1e-6 and torch.dot(projected["b"], g1) >= -1e-6
    total, _ = project_conflicting({"a": g1, "b": g2}, generator=_gen())
    torch.testing.assert_close(total, expected_a + expected_b)  # the sum, not the mean
    assert stats.conflicts == 1 and stats.projections == 2
    assert stats.cosine[("a", "b")] == pytest.approx(-0.5 / (2**0.5 * 1.25**0.5))


def test_every_projected_gradient_agrees_with_the_others_where_projections_do_not_interact():
    # a and b conflict in the first two coordinates; c lives in the third, orthogonal to both
    grads = {
        "a": torch.tensor([1.0, 2.0, 0.0]),
        "b": torch.tensor([-2.0, 0.5, 0.0]),
        "c": torch.tensor([0.0, 0.0, 3.0]),
    }
    for seed in range(5):
        projected, stats = projected_task_gradients(grads, generator=_gen(seed))
        for i, gi in projected.items():
            for j, gj in grads.items():
                if i != j:
                    assert float(torch.dot(gi, gj)) >= -1e-6, (seed, i, j)
        assert stats.conflicts == 1


def test_no_conflict_gives_the_plain_sum_and_one_task_its_raw_gradient() -> None:
    grads = {"a": torch.randn(4, 3).abs(), "b": torch.randn(4, 3).abs(), "c": torch.rand(4, 3)}
    total, stats = project_conflicting(grads, generator=_gen())
    assert torch.equal(total, grads["a"] + grads["b"] + grads["c"])
    assert stats.projections == 0 and stats.conflicts == 0
    raw = torch.randn(5, dtype=torch.bfloat16)
    alone, stats = project_conflicting({"math": raw})
    assert torch.equal(alone, raw) and alone.dtype == torch.bfloat16 and not stats.cosine


def test_a_vanishing_gradient_is_not_projected_onto() -> None:
    g = torch.tensor([1.0, 0.0])
    tiny = torch.tensor([-1e-7, 0.0])  # squared norm 1e-14 <= 1e-12
    total, stats = project_conflicting({"a": g, "b": tiny}, generator=_gen())
    # a keeps its gradient (b is too small to project onto); b loses its component along a,
    # which is all of it
    assert torch.equal(total, torch.tensor([1.0, 0.0]))
    assert stats.projections == 1


def _reference_pcgrad(grads: list[np.ndarray], seed: int) -> np.ndarray:
    """PCGrad on flat vectors in NumPy, with the orders drawn as the library draws them."""
    gen = _gen(seed)
    total = np.zeros_like(grads[0])
    for i in torch.randperm(len(grads), generator=gen).tolist():
        g = grads[i].copy()
        for j in torch.randperm(len(grads), generator=gen).tolist():
            if j != i and g @ grads[j] < 0 and grads[j] @ grads[j] > 1e-12:
                g = g - (g @ grads[j]) / (grads[j] @ grads[j]) * grads[j]
        total += g
    return total


def test_global_granularity_is_pcgrad_on_the_flattened_gradient() -> None:
    torch.manual_seed(0)
    shapes = {"model.layers.0.self_attn.q_proj.weight": (4, 4), "model.layers.0.mlp.up.weight": (
        6, 4), "lm_head.weight": (3, 4)}  # fmt: skip
    tasks = ("chat", "ifeval", "math")
    grads = {t: {n: torch.randn(s) for n, s in shapes.items()} for t in tasks}
    groups = group_parameters(list(shapes), "global")
    combined, stats = surgery(grads, groups, generator=_gen(3))
    names = groups["global"]
    flat = torch.cat([combined[n].reshape(-1) for n in names]).numpy()
    reference = _reference_pcgrad(
        [torch.cat([grads[t][n].reshape(-1) for n in names]).numpy() for t in sorted(tasks)], 3
    )
    np.testing.assert_allclose(flat, reference, rtol=1e-5, atol=1e-5)
    assert stats["global"].conflicts > 0  # random gradients do conflict somewhere
    # the same seed gives the same result; per-tensor surgery differs from global
    again, _ = surgery(grads, groups, generator=_gen(3))
    assert all(torch.equal(again[n], combined[n]) for n in names)
    per_tensor, _ = surgery(grads, group_parameters(list(shapes), "tensor"), generator=_gen(3))
    assert not all(torch.allclose(per_tensor[n], combined[n]) for n in names)


def test_groupings_of_a_decoder() -> None:
    from lit_rlhf.models import load_causal_lm

    names = [n for n, _ in load_causal_lm("builtin:tiny-llama").named_parameters()]
    assert group_parameters(names, "global") == {"global": names}
    assert len(group_parameters(names, "tensor")) == len(names)
    module = group_parameters(names, "module")
    attention = module["model.layers.0.attention"]
    assert sorted(n.split(".")[-2] for n in attention) == ["k_proj", "o_proj", "q_proj", "v_proj"]
    assert sorted(n.split(".")[-2] for n in module["model.layers.0.mlp"]) == [
        "down_proj", "gate_proj", "up_proj"]  # fmt: skip
    assert module["model.layers.0.input_layernorm.weight"] == [
        "model.layers.0.input_layernorm.weight"
    ]
    assert module["model.embed_tokens.weight"] == ["model.embed_tokens.weight"]
    layer = group_parameters(names, "layer")
    assert all(n.startswith("model.layers.1.") for n in layer["model.layers.1"])
    assert sum(len(v) for v in layer.values()) == len(names)
    with pytest.raises(ValueError, match="granularity must be"):
        group_parameters(names, "block")  # type: ignore[arg-type]


def test_bad_inputs() -> None:
    with pytest.raises(ValueError, match="empty"):
        project_conflicting({})
    with pytest.raises(ValueError, match="share a shape"):
        project_conflicting({"a": torch.zeros(2), "b": torch.zeros(3)})


def _tiny(family: str) -> list[str]:
    """Parameter names of a tiny model of ``family``, built from its config (offline)."""
    import transformers as tf

    common = {"vocab_size": 16}
    build = {
        "gpt2": lambda: tf.GPT2LMHeadModel(tf.GPT2Config(n_layer=2, n_embd=8, n_head=2,
                                                         n_positions=8, **common)),
        "opt": lambda: tf.OPTForCausalLM(tf.OPTConfig(
            num_hidden_layers=2, hidden_size=8, num_attention_heads=2, ffn_dim=16,
            max_position_embeddings=8, word_embed_proj_dim=8, **common)),
        "gpt_neox": lambda: tf.GPTNeoXForCausalLM(tf.GPTNeoXConfig(
            num_hidden_layers=2, hidden_size=8, num_attention_heads=2, intermediate_size=16,
            **common)),
        "phi": lambda: tf.PhiForCausalLM(tf.PhiConfig(
            num_hidden_layers=2, hidden_size=8, num_attention_heads=2, intermediate_size=16,
            **common)),
        "gptj": lambda: tf.GPTJForCausalLM(tf.GPTJConfig(n_layer=2, n_embd=8, n_head=2,
                                                         rotary_dim=2, **common)),
        "falcon": lambda: tf.FalconForCausalLM(tf.FalconConfig(
            num_hidden_layers=2, hidden_size=8, num_attention_heads=2, **common)),
        "qwen2": lambda: tf.Qwen2ForCausalLM(tf.Qwen2Config(
            num_hidden_layers=2, hidden_size=8, num_attention_heads=2, num_key_value_heads=2,
            intermediate_size=16, **common)),
    }  # fmt: skip
    return [n for n, _ in build[family]().named_parameters()]


def test_module_groups_of_an_opt_model_put_fc1_and_fc2_in_the_mlp() -> None:
    names = _tiny("opt")
    groups = group_parameters(names, "module")
    layer = "model.decoder.layers.1"
    assert groups[f"{layer}.mlp"] == [f"{layer}.{m}.{p}" for m in ("fc1", "fc2")
                                      for p in ("weight", "bias")]  # fmt: skip
    assert sorted({n.split(".")[-2] for n in groups[f"{layer}.attention"]}) == [
        "k_proj", "out_proj", "q_proj", "v_proj"]  # fmt: skip
    # the two per-layer norms and the top-level tensors are groups of their own
    for norm in ("self_attn_layer_norm", "final_layer_norm"):
        assert groups[f"{layer}.{norm}.weight"] == [f"{layer}.{norm}.weight"]
    assert groups["model.decoder.embed_tokens.weight"] == ["model.decoder.embed_tokens.weight"]
    # per layer: attention + mlp + 2 norms x (weight, bias); top level: 2 embeddings + final norm
    assert len(groups) == 2 * (2 + 4) + 2 + 2


def test_module_groups_of_a_gpt2_model() -> None:
    groups = group_parameters(_tiny("gpt2"), "module")
    assert groups["transformer.h.0.attention"] == [
        f"transformer.h.0.attn.{m}.{p}" for m in ("c_attn", "c_proj") for p in ("weight", "bias")
    ]
    assert groups["transformer.h.0.mlp"] == [
        f"transformer.h.0.mlp.{m}.{p}" for m in ("c_fc", "c_proj") for p in ("weight", "bias")
    ]
    assert groups["transformer.h.0.ln_2.bias"] == ["transformer.h.0.ln_2.bias"]
    assert groups["transformer.wpe.weight"] == ["transformer.wpe.weight"]


@pytest.mark.parametrize("family", ["gpt_neox", "phi", "gptj", "falcon", "qwen2"])
def test_module_groups_of_other_families_have_one_attention_and_one_mlp_per_layer(
    family: str,
) -> None:
    names = _tiny(family)
    groups = group_parameters(names, "module")
    for kind in ("attention", "mlp"):
        assert len([g for g in groups if g.endswith(f".{kind}")]) == 2, (family, kind)
    assert sum(len(v) for v in groups.values()) == len(names)


def test_an_unknown_parameter_name_is_refused_with_the_fix() -> None:
    names = [*_tiny("qwen2"), "model.layers.0.router.weight"]
    with pytest.raises(
        ValueError,
        match=r"'model\.layers\.0\.router\.weight'.*submodule "
        r"'router'.*Fix: granularity: tensor.*module_map: \{router: attention\}",
    ):
        group_parameters(names, "module")
    with pytest.raises(ValueError, match=r"'adapter\.bias'.*outside the numbered"):
        group_parameters(["adapter.bias"], "module")
    # tensor / layer granularity need no such knowledge; a module_map settles the name
    assert len(group_parameters(names, "tensor")) == len(names)
    mapped = group_parameters(names, "module", module_map={"router": "mlp"})
    assert "model.layers.0.router.weight" in mapped["model.layers.0.mlp"]
    with pytest.raises(ValueError, match="module_map values must be one of"):
        group_parameters(names, "module", module_map={"router": "moe"})
