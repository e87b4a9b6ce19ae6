"""The embedded SmolLM2 folder is a plain float32 model: no GGUF quantization claimed in its config
(transformers would otherwise mark it quantized and refuse ``save_pretrained``, which broke
exporting a fine-tuned judge), the same weights as the GGUF dequantised, and it saves."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("gguf")


def test_smollm2_folder_is_plain_float32_and_saves(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    from lit_rlhf.models.builtin import resolve_builtin

    folder = Path(resolve_builtin("builtin:smollm2-135m-instruct"))
    config = json.loads((folder / "config.json").read_text())
    assert "quantization_config" not in config
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16)
    assert not getattr(model, "is_quantized", False)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    model.save_pretrained(tmp_path / "copy")  # refused while the config named GGUF
    assert (tmp_path / "copy" / "model.safetensors").exists()
