"""The bucketed weight push's walk (``weight_buckets``) on CPU, without vLLM: bucket sizes, whole
blocks, the names an engine serves (LoRA merged), full versus change-tested pushes, where the
gather ends, and ``is_full_update``."""

from __future__ import annotations

from contextlib import contextmanager

import pytest
import torch

from lit_rlhf.models.lora import served_parameters
from lit_rlhf.models.tiny import TinyModelSpec, build_tiny_model
from lit_rlhf.rollout.weight_sync import WeightSnapshot, block_key, is_full_update, weight_buckets


@pytest.fixture
def llama():
    """A random Llama of 3 decoder blocks (9 tensors, 36992 weights each) between its embedding
    (81920 weights: larger than two blocks) and its norm; the head is tied."""
    return build_tiny_model(TinyModelSpec(num_layers=3), 1280)


def _bytes(tensors, dtype=None) -> int:
    return sum(t.numel() * (dtype or t.dtype).itemsize for _, t in tensors)


def _blocks(bucket) -> list[str]:
    return list(dict.fromkeys(block_key(name) for name, _ in bucket))


def test_buckets_hold_whole_blocks_within_the_budget_in_the_served_order(llama):
    served = list(served_parameters(llama))
    block = _bytes([(n, t) for n, t in served if n.startswith("model.layers.0.")])
    buckets = list(weight_buckets(llama, budget_bytes=2 * block))
    names = [n for bucket in buckets for n, _ in bucket]
    assert names == [n for n, _ in served]  # every weight once, in the served order
    keys = [_blocks(b) for b in buckets]
    flat = [k for ks in keys for k in ks]
    assert len(flat) == len(set(flat))  # no block in two buckets
    for bucket in buckets:
        assert _bytes(bucket) <= 2 * block or len(_blocks(bucket)) == 1
    # the embedding (larger than the budget) alone; then two blocks; then one block + the norm
    assert keys == [
        ["model.embed_tokens"],
        ["model.layers.0", "model.layers.1"],
        ["model.layers.2", "model.norm"],
    ]
    for (name, got), (_, want) in zip((p for b in buckets for p in b), served, strict=True):
        assert torch.equal(got, want), name
        assert got.device.type == "cpu" and got.dtype == torch.float32


def test_budget_zero_is_one_block_per_bucket_and_the_budget_counts_the_output_dtype(llama):
    per_block = list(weight_buckets(llama, budget_bytes=0))
    assert [len(_blocks(b)) for b in per_block] == [1] * 5
    block = _bytes([(n, t) for n, t in llama.named_parameters() if ".layers.0." in n])
    fp32 = list(weight_buckets(llama, budget_bytes=block))  # one block fits in float32 ...
    bf16 = list(weight_buckets(llama, budget_bytes=block, dtype=torch.bfloat16))  # ... two here
    assert len(fp32) == 5 and len(bf16) == 3
    assert {t.dtype for b in bf16 for _, t in b} == {torch.bfloat16}
    with pytest.raises(ValueError, match="budget_bytes must be an int >= 0"):
        next(weight_buckets(llama, budget_bytes=-1))


def test_without_a_snapshot_every_block_is_sent_each_time_and_nothing_is_kept(llama):
    snapshot_free = [list(weight_buckets(llama, budget_bytes=1 << 30)) for _ in range(2)]
    assert [len(b[0]) for b in snapshot_free] == [len(list(llama.parameters()))] * 2


def test_with_a_snapshot_only_the_changed_blocks_are_sent(llama):
    snap = WeightSnapshot("cpu")
    n = len(list(llama.parameters()))
    assert sum(len(b) for b in weight_buckets(llama, budget_bytes=1 << 30, snapshot=snap)) == n
    assert list(weight_buckets(llama, budget_bytes=1 << 30, snapshot=snap)) == []  # unchanged
    with torch.no_grad():
        llama.model.layers[1].mlp.up_proj.weight[0, 0] += 1e-3
        llama.model.norm.weight.mul_(2)
    # the two changed blocks come in one bucket even though the gather took them separately
    buckets = list(weight_buckets(llama, budget_bytes=1 << 30, snapshot=snap))
    assert [_blocks(b) for b in buckets] == [["model.layers.1", "model.norm"]]
    assert len(buckets[0]) == 9 + 1  # the whole block 1, not its one changed tensor
    assert torch.equal(snap.tensors["model.norm.weight"], llama.model.norm.weight)
    # with a budget of one block they are split at the block boundary
    with torch.no_grad():
        llama.model.layers[0].mlp.up_proj.weight[0, 0] += 1e-3
        llama.model.layers[2].mlp.up_proj.weight[0, 0] += 1e-3
    split = list(weight_buckets(llama, budget_bytes=0, snapshot=snap))
    assert [_blocks(b) for b in split] == [["model.layers.0"], ["model.layers.2"]]


def test_a_lora_policy_is_walked_under_the_base_names_with_the_adapters_merged(llama):
    pytest.importorskip("peft")
    from lit_rlhf.models.lora import lora_wrap
    from lit_rlhf.settings import LoRASettings

    base = {n: t.clone() for n, t in llama.named_parameters()}
    policy = lora_wrap(llama, LoRASettings(rank=4, alpha=8, target_modules=["q_proj"]))
    with torch.no_grad():
        for name, param in policy.named_parameters():
            if "lora_B" in name:
                param.normal_()
    assert not is_full_update(policy)
    got = dict(p for b in weight_buckets(policy, budget_bytes=0) for p in b)
    assert got.keys() == base.keys()  # vLLM's names: no base_layer / lora_ tensors
    q = policy.base_model.model.model.layers[0].self_attn.q_proj
    merged = base["model.layers.0.self_attn.q_proj.weight"] + 2.0 * q.lora_B.default.weight @ (
        q.lora_A.default.weight
    )
    torch.testing.assert_close(got["model.layers.0.self_attn.q_proj.weight"], merged)
    assert torch.equal(got["model.layers.0.self_attn.k_proj.weight"], base[
        "model.layers.0.self_attn.k_proj.weight"])  # fmt: skip


def test_is_full_update_only_when_every_weight_is_trained(llama):
    assert is_full_update(llama)
    llama.model.embed_tokens.weight.requires_grad_(False)
    assert not is_full_update(llama)


def test_each_bucket_is_yielded_after_its_one_gather_is_released(llama, monkeypatch):
    """Gather once per bucket with all of its tensors, and never yield inside the gather (a rank
    that sends there would wait on peers still gathering)."""
    gathers: list[int] = []
    inside = [False]

    @contextmanager
    def fake_gathered(*params):
        gathers.append(len(params))
        inside[0] = True
        yield
        inside[0] = False

    monkeypatch.setattr("lit_rlhf.rollout.weight_sync.gathered", fake_gathered)
    phases: list[str] = []
    sizes = []
    for bucket in weight_buckets(llama, budget_bytes=0, on_phase=phases.append):
        assert not inside[0]
        sizes.append(len(bucket))
    assert gathers == sizes == [1, 9, 9, 9, 1]
    assert phases[0].startswith("gathering 1 tensors from 'model.embed_tokens.weight'")
    assert phases[1].startswith("sending bucket 1 (1 tensors,")
    assert phases[-1] == "idle"


def test_a_block_whose_tensors_are_not_consecutive_is_refused():
    from lit_rlhf.rollout.weight_sync import _blocks

    t = torch.zeros(2)
    params = [("layers.0.weight", t), ("head.weight", t), ("layers.0.bias", t)]
    with pytest.raises(ValueError, match=r"'layers\.0' are not consecutive"):
        list(_blocks(params))
