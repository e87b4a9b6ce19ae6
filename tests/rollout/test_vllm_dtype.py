"""The vLLM engine's ``dtype`` (issue 36, N1): which dtype vLLM is built in, the cast of the
weight push to it, and the refusal of a bad value. Needs no vLLM: a stub stands in for ``vllm.LLM``
(runs in the default venv)."""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest
import torch
from torch import nn

from lit_rlhf.rollout import VLLMGenerationEngine
from lit_rlhf.rollout.vllm import resolve_engine_dtype


@pytest.fixture(autouse=True)
def _vllm_counts_as_installed(monkeypatch):
    monkeypatch.setattr("lit_rlhf.rollout.vllm.vllm_installed", lambda: True)


class FakeLLM:
    """Records the ``vllm.LLM`` arguments and the dtype of every tensor pushed into it."""

    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs
        self.pushed: dict[str, torch.dtype] = {}
        self.calls: list[list[str]] = []  # the names sent by each reload call

    def collective_rpc(self, method: str, kwargs: dict[str, Any]) -> None:
        assert method == "reload_weights"
        self.calls.append([])
        for name, tensor in kwargs["weights_iterator"]:
            self.pushed[name] = tensor.dtype
            self.calls[-1].append(name)

    def apply_model(self, fn: Any) -> list[int]:
        return [0]

    def reset_prefix_cache(self) -> bool:
        return True


@pytest.fixture
def fake_vllm(monkeypatch):
    module = types.ModuleType("vllm")
    module.LLM = FakeLLM  # type: ignore[attr-defined]
    platforms = types.ModuleType("vllm.platforms")
    platforms.current_platform = types.SimpleNamespace(is_cpu=lambda: True)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm", module)
    monkeypatch.setitem(sys.modules, "vllm.platforms", platforms)


def _policy(dtype: torch.dtype) -> nn.Module:
    net = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2)).to(dtype)
    net.config = types.SimpleNamespace(_name_or_path="some/model")  # type: ignore[assignment]
    return net


@pytest.mark.parametrize(
    ("setting", "device", "policy_dtype", "expected"),
    [
        ("auto", "cuda", torch.float32, torch.bfloat16),  # GPU default: bf16 (N1)
        ("auto", "cpu", torch.float32, torch.float32),  # CPU: the policy's own
        ("auto", "cpu", torch.bfloat16, torch.bfloat16),
        ("float32", "cuda", torch.float32, torch.float32),
        ("float16", "cpu", torch.float32, torch.float16),
        ("bfloat16", "cpu", torch.float32, torch.bfloat16),
    ],
)
def test_the_engine_dtype_resolves(setting, device, policy_dtype, expected):
    parameter = types.SimpleNamespace(device=torch.device(device), dtype=policy_dtype)
    assert resolve_engine_dtype(setting, parameter) == expected  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"dtype": "fp32"}, r"dtype='fp32' is not known\. Fix: dtype: auto, float32, bfloat16"),
        ({"dtype": "float64"}, r"dtype='float64' is not known"),
        ({"llm_kwargs": {"dtype": "bfloat16"}}, r"llm_kwargs sets dtype\. Fix: .*`dtype:`"),
    ],
)
def test_a_bad_dtype_is_refused_when_the_engine_is_built(kwargs, message):
    with pytest.raises(ValueError, match=message):
        VLLMGenerationEngine(**kwargs)


@pytest.mark.parametrize(
    ("setting", "policy_dtype", "served"),
    [
        ("bfloat16", torch.float32, torch.bfloat16),
        ("float16", torch.float32, torch.float16),
        ("auto", torch.float32, torch.float32),  # CPU: as the policy
    ],
)
def test_vllm_is_built_in_the_engine_dtype_and_the_push_casts_to_it(
    fake_vllm, setting, policy_dtype, served
):
    engine = VLLMGenerationEngine(dtype=setting)
    policy = _policy(policy_dtype)
    policy[0].weight.requires_grad_(False)  # a frozen part: the push tests what changed
    llm = engine._awake_llm(policy)  # creates the (fake) engine and pushes every weight
    assert llm.kwargs["dtype"] == str(served).removeprefix("torch.")
    names = [n for n, _ in policy.named_parameters()]
    assert llm.pushed == dict.fromkeys(names, served)
    # the change detection keeps the policy's own dtype (exact comparison, no rounding)
    assert {t.dtype for t in engine.snapshot.tensors.values()} == {policy_dtype}
    llm.pushed.clear()
    with torch.no_grad():
        policy[1].bias.add_(1.0)
    engine.sync_weights(policy)  # only the changed block, cast again
    assert llm.pushed == {"1.weight": served, "1.bias": served}


@pytest.mark.parametrize("bucket_bytes", [0, 48, 512 << 20])
def test_a_full_update_pushes_every_weight_in_buckets_without_a_copy(fake_vllm, bucket_bytes):
    """Every weight trained: each push sends all of them (no change test, no copy), one reload
    call per bucket of whole blocks; ``push_bucket_bytes=0`` is the former change-tested push."""
    engine = VLLMGenerationEngine(dtype="bfloat16", push_bucket_bytes=bucket_bytes)
    policy = _policy(torch.float32)  # blocks "0" (40 bytes in bf16) and "1" (20 bytes)
    llm = engine._awake_llm(policy)
    with torch.no_grad():
        policy[1].bias.add_(1.0)
    llm.calls.clear()
    engine.sync_weights(policy)
    if bucket_bytes == 0:
        assert llm.calls == [["1.weight", "1.bias"]]  # the changed block only
        assert set(engine.snapshot.tensors) == {"0.weight", "0.bias", "1.weight", "1.bias"}
    else:
        every = ["0.weight", "0.bias", "1.weight", "1.bias"]
        assert llm.calls == ([every[:2], every[2:]] if bucket_bytes == 48 else [every])
        assert engine.snapshot.tensors == {}
    sent = sum(len(c) for c in llm.calls)
    assert (engine.last_sync_tensors, engine.last_sync_buckets) == (sent, len(llm.calls))
    sizes = {"0.weight": 16, "0.bias": 4, "1.weight": 8, "1.bias": 2}
    assert engine.last_sync_bytes == 2 * sum(sizes[n] for c in llm.calls for n in c)


@pytest.mark.parametrize(
    ("value", "error"), [(-1, ValueError), (1.5, TypeError), (True, TypeError)]
)
def test_a_bad_push_bucket_bytes_is_refused(value, error):
    with pytest.raises(error, match=r"push_bucket_bytes .* Fix: "):
        VLLMGenerationEngine(push_bucket_bytes=value)
