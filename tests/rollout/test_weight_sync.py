"""Weight-sync bookkeeping that needs no vLLM: change detection, send groups, the deadline, and the
engine's behaviour after a timed-out sync (runs in the default venv)."""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
import textwrap
import time

import pytest
import torch
from torch import nn

from lit_rlhf.rollout import VLLMGenerationEngine
from lit_rlhf.rollout.weight_sync import WeightSnapshot, block_key, run_with_deadline


@pytest.fixture(autouse=True)
def _vllm_counts_as_installed(monkeypatch):
    """The engine refuses to be built without vLLM; its bookkeeping here needs no vLLM."""
    monkeypatch.setattr("lit_rlhf.rollout.vllm.vllm_installed", lambda: True)


class TwoBlocks(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(8, 4)
        self.layers = nn.ModuleList(nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4)) for _ in "ab")
        self.norm = nn.LayerNorm(4)


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("model.layers.3.self_attn.q_proj.weight", "model.layers.3"),
        ("model.layers.3.input_layernorm.weight", "model.layers.3"),
        ("model.embed_tokens.weight", "model.embed_tokens"),
        ("lm_head.weight", "lm_head"),
        ("layers.0.1.bias", "layers.0"),
    ],
)
def test_block_key(name, key):
    assert block_key(name) == key


def test_snapshot_reports_exactly_the_changed_tensors():
    model = TwoBlocks()
    snap = WeightSnapshot()
    names = [n for n, _ in model.named_parameters()]
    assert snap.update(model.named_parameters()) == names  # first call: everything
    assert snap.update(model.named_parameters()) == []
    with torch.no_grad():
        model.layers[1][0].weight.add_(1e-3)
    assert snap.update(model.named_parameters()) == ["layers.1.0.weight"]
    # a write through .data does not move param._version (DeepSpeed updates weights this way)
    version = model.norm.bias._version
    model.norm.bias.data.copy_(torch.full((4,), 0.5))
    assert model.norm.bias._version == version
    assert snap.update(model.named_parameters()) == ["norm.bias"]
    # the copy follows the model, and is a copy
    assert torch.equal(snap.tensors["norm.bias"], model.norm.bias)
    assert snap.tensors["norm.bias"].data_ptr() != model.norm.bias.data_ptr()


def test_snapshot_sends_whole_blocks_in_parameter_order():
    model = TwoBlocks()
    snap = WeightSnapshot(device="cpu")
    snap.update(model.named_parameters())
    sent = [name for name, _ in snap.blocks_to_send(["layers.0.1.bias", "embed.weight"])]
    assert sent == [
        "embed.weight",
        "layers.0.0.weight",
        "layers.0.0.bias",
        "layers.0.1.weight",
        "layers.0.1.bias",
    ]


def test_deadline_returns_raises_and_times_out():
    assert run_with_deadline(lambda: 3, 5.0, lambda: "x") == 3
    with pytest.raises(ZeroDivisionError):
        run_with_deadline(lambda: 1 / 0, 5.0, lambda: "x")
    start = time.perf_counter()
    with pytest.raises(TimeoutError, match="stuck while loading tensor 7"):
        run_with_deadline(lambda: time.sleep(5), 0.2, lambda: "loading tensor 7")
    assert time.perf_counter() - start < 2


def test_engine_after_a_timed_out_sync_names_the_cause_and_refuses_use(monkeypatch):
    engine = VLLMGenerationEngine(sync_timeout_s=0.2)
    engine.llm = object()  # pretend vLLM is up; the load below hangs

    def hang(model: nn.Module) -> int:
        engine._phase = "loading 20 tensors into vLLM"
        time.sleep(3)
        return 0

    monkeypatch.setattr(engine, "_diff_and_load", hang)
    with pytest.raises(TimeoutError, match="stuck while loading 20 tensors into vLLM"):
        engine.sync_weights(TwoBlocks())
    with pytest.raises(RuntimeError, match="unusable: a weight sync timed out"):
        engine.sync_weights(TwoBlocks())


def test_engine_sync_before_first_generate_is_a_no_op():
    engine = VLLMGenerationEngine()
    engine.sync_weights(TwoBlocks())  # no vLLM yet: the first generate pushes the weights
    assert engine.llm is None and engine.snapshot.tensors == {}


@pytest.mark.parametrize(
    "kwargs",
    [
        {"temperature": 0.0},
        {"max_new_tokens": 0},
        {"top_p": 0.0},
        {"gpu_memory_utilization": 1.5},
        {"sync_timeout_s": 0},
    ],
)
def test_engine_rejects_bad_settings(kwargs):
    with pytest.raises(ValueError):
        VLLMGenerationEngine(**kwargs)


_ZERO3_SCRIPT = """
import importlib, os
os.environ.update(MASTER_ADDR="127.0.0.1", RANK="0", LOCAL_RANK="0", WORLD_SIZE="1")
import deepspeed, torch
importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None  # no g++ build
from lit_rlhf.rollout.weight_sync import WeightSnapshot
deepspeed.init_distributed(dist_backend="gloo")
with deepspeed.zero.Init(config_dict_or_path={"zero_optimization": {"stage": 3},
                                              "train_batch_size": 1}):
    net = torch.nn.Linear(6, 5)
assert hasattr(net.weight, "ds_id") and net.weight.numel() == 0  # partitioned away
snap = WeightSnapshot()
assert snap.update(net.named_parameters()) == ["weight", "bias"]
assert snap.tensors["weight"].shape == (5, 6) and snap.tensors["weight"].abs().sum() > 0
with deepspeed.zero.GatheredParameters([net.bias], modifier_rank=0):
    net.bias.data.fill_(0.25)
assert snap.update(net.named_parameters()) == ["bias"]
assert torch.equal(snap.tensors["bias"], torch.full((5,), 0.25))
# the bucketed walk: one gather per bucket of whole blocks, full-size copies that outlive it
from lit_rlhf.rollout.weight_sync import weight_buckets
with deepspeed.zero.Init(config_dict_or_path={"zero_optimization": {"stage": 3},
                                              "train_batch_size": 1}):
    seq = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Linear(5, 3))
buckets = list(weight_buckets(seq, budget_bytes=0, dtype=torch.bfloat16))
assert [[n for n, _ in b] for b in buckets] == [["0.weight", "0.bias"], ["1.weight", "1.bias"]]
assert seq[0].weight.numel() == 0  # released again
with deepspeed.zero.GatheredParameters(list(seq.parameters())):
    for name, value in (p for b in buckets for p in b):
        assert torch.equal(value, seq.get_parameter(name).to(torch.bfloat16)), name
print("ok")
"""


@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="needs deepspeed")
def test_snapshot_and_buckets_gather_zero3_partitions(tmp_path):
    script = tmp_path / "zero3_snapshot.py"
    script.write_text(textwrap.dedent(_ZERO3_SCRIPT))
    with socket.socket() as sock:  # a free port for the one-process gloo group
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "MASTER_PORT": str(port)}
    run = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300, env=env
    )
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stderr[-3000:]
