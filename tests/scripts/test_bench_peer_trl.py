"""scripts/bench/peer_trl.py's FLOP accounting and the lit-rlhf side of a run (TRL is not
installed in the test venv; the benchmark's own venv runs the real comparison)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from scripts.bench import peer_sides
from scripts.bench import peer_trl as bench

CONFIG = SimpleNamespace(
    hidden_size=8,
    num_hidden_layers=2,
    intermediate_size=16,
    num_attention_heads=2,
    num_key_value_heads=1,
    vocab_size=10,
)


def test_forward_flops_count_every_matmul():
    # per layer: q 8x8, k and v 8x4 each, o 8x8, gate/up/down 3 x 8x16 = 64+64+64+384 = 576
    # weights; 2 FLOPs per weight per token; attention 4*h*context per layer; LM head 2*h*V
    flops = bench.forward_flops(CONFIG, tokens=3, context=5, lm_head_tokens=2)
    assert flops == 3 * 2 * (2 * 576 + 4 * 8 * 5) + 2 * 2 * 8 * 10


def test_step_flops_adds_the_reference_forward_only_with_kl():
    b = peer_sides.PROMPTS_PER_STEP * 4
    without = bench.step_flops(CONFIG, 4, 6, beta=0.0, b=b)
    with_kl = bench.step_flops(CONFIG, 4, 6, beta=0.04, b=b)
    assert with_kl - without == pytest.approx(bench.forward_flops(CONFIG, b * 10, 5, b * 6))


def test_lit_rlhf_side_runs_and_times_every_step():
    work = SimpleNamespace(prompts=16, samples=4, new_tokens=4, micro_batch_tokens=None,
                           max_staleness=0)  # fmt: skip
    result = peer_sides.run_lit_rlhf(work, "builtin:tiny-llama", 0.04, 2, "decode_eager")
    assert len(result["times"]) == len(result["gen"]) == len(result["lengths"]) == 2
    assert all(0 < g < t for g, t in zip(result["gen"], result["times"], strict=True))
