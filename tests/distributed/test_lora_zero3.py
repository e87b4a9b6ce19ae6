"""LoRA under ZeRO-3 (``pytest -m distributed``): PPO trains its adapters on 2 CPU processes,
and the merged weights an inference engine (vLLM) is sent are gathered, full-size and equal to
``W + (alpha / rank) * B @ A`` of the gathered parameters."""

from __future__ import annotations

import pytest
import torch

from tests.distributed.launch import run_python

pytestmark = pytest.mark.distributed


def test_lora_under_zero3_serves_the_merged_full_weights(tmp_path):
    out = tmp_path / "lora_zero3"
    run_python("-m", "tests.distributed.run_lora_zero3", str(out))
    saved = torch.load(out.with_suffix(".pt"))
    served, params = saved["served"], saved["params"]
    merged_layers = [k for k in params if k.endswith("base_layer.weight")]
    assert merged_layers, sorted(params)[:5]
    moved = 0
    for key in merged_layers:
        prefix = key.removesuffix(".base_layer.weight")
        a, b = params[f"{prefix}.lora_A.default.weight"], params[f"{prefix}.lora_B.default.weight"]
        name = key.removeprefix("base_model.model.").replace(".base_layer.", ".")
        expected = params[key] + (8 / 4) * b @ a
        assert served[name].shape == params[key].shape and served[name].numel() > 0
        torch.testing.assert_close(served[name], expected, rtol=1e-6, atol=1e-6)
        moved += int(b.abs().sum() > 0)
    assert moved == len(merged_layers), "every adapter trained (B moved off zero)"
