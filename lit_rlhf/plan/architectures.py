"""The architectures of the models the GPU presets name, so that a plan needs no hub access.

Each row is read from the model's ``config.json`` on the hub (the URL is its ``source``); the
numbers a parameter count and an activation estimate need: hidden size, layers, attention and
key/value heads, head size, MLP width, vocabulary, tied embeddings. ``builtin:*`` models are
read from :mod:`lit_rlhf.models.builtin`'s specifications; a local folder from its own
``config.json``. A run directory that a preset writes (e.g. the HH preset's reward model,
``runs/rm_ultrafeedback/hf``, written by ``configs/rm/bt_ultrafeedback_qwen2.5-1.5b.yaml``)
is mapped with ``lit-rlhf plan --arch PATH=HUB_ID`` or by the preset that writes it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from lit_rlhf.models.builtin import PREFIX, builtin_config


@dataclass(frozen=True)
class Architecture:
    """What the plan needs to know of a transformer (the names are ``config.json``'s)."""

    name: str  # hub id or builtin:...
    model_type: str  # "qwen2" | "qwen3" | "llama" (transformers model_type)
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool
    head_dim: int | None = None  # None: hidden_size // num_attention_heads
    source: str = ""  # model card / config.json URL it was read from

    @property
    def head_size(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads


def _hub(model_id: str, note: str = "") -> str:
    url = f"https://huggingface.co/{model_id}/blob/main/config.json"
    return f"{url} ({note})" if note else url


def _qwen25(name: str, h: int, layers: int, heads: int, kv: int, inter: int, vocab: int,
            tie: bool, checked: str) -> Architecture:  # fmt: skip
    source = _hub(name, f"numbers checked against {checked}")
    return Architecture(name, "qwen2", h, layers, heads, kv, inter, vocab, tie, None, source)


def _copy(repo: str) -> str:
    return f"a copy of it, https://huggingface.co/{repo}/blob/main/config.json"


_QWEN3_4B: dict[str, Any] = dict(hidden_size=2560, num_hidden_layers=36, num_attention_heads=32,
                 num_key_value_heads=8, intermediate_size=9728, head_dim=128)  # fmt: skip

TABLE: dict[str, Architecture] = {
    a.name: a
    for a in (
        _qwen25("Qwen/Qwen2.5-0.5B", 896, 24, 14, 2, 4864, 151936, True,
                _copy("osllmai-community/Qwen2.5-0.5B")),
        _qwen25("Qwen/Qwen2.5-0.5B-Instruct", 896, 24, 14, 2, 4864, 151936, True,
                _copy("unsloth/Qwen2.5-0.5B-Instruct")),
        _qwen25("Qwen/Qwen2.5-1.5B", 1536, 28, 12, 2, 8960, 151936, True,
                "the Instruct model's (unconfirmed for the base model itself; Qwen2.5's base "
                "and Instruct models share their architecture)"),
        _qwen25("Qwen/Qwen2.5-1.5B-Instruct", 1536, 28, 12, 2, 8960, 151936, True,
                _copy("onnx-community/Qwen2.5-1.5B-Instruct") + "; the model card's 1.54B"),
        _qwen25("Qwen/Qwen2.5-7B", 3584, 28, 28, 4, 18944, 152064, False,
                "the Instruct model's copy (unconfirmed for the base model itself; the model "
                "card's 7.61B parameters match)"),
        _qwen25("Qwen/Qwen2.5-7B-Instruct", 3584, 28, 28, 4, 18944, 152064, False,
                _copy("osllmai-community/Qwen2.5-7B-Instruct")),
        Architecture(
            "Qwen/Qwen3-8B", "qwen3", 4096, 36, 32, 8, 12288, 151936, False, 128,
            _hub("Qwen/Qwen3-8B", "numbers checked against a commit copying it, https://"
                 "huggingface.co/thejaminator/qwen-hook-layer-9/commit/478fb720"),
        ),
        Architecture(
            name="Qwen/Qwen3-4B", model_type="qwen3", vocab_size=151936,
            tie_word_embeddings=True, **_QWEN3_4B,
            source=_hub("Qwen/Qwen3-4B", "numbers checked against a fine-tune's copy, "
                        "https://huggingface.co/MultiRL/qwen3_4b_instruct_sft/blob/main/"
                        "config.json"),
        ),
        Architecture(
            name="Qwen/Qwen3-Embedding-4B", model_type="qwen3", vocab_size=151665,
            tie_word_embeddings=True, **_QWEN3_4B,
            source=_hub("Qwen/Qwen3-Embedding-4B", "vocab_size 151665 read from a copy of the "
                        "config, not the official page"),
        ),
        Architecture(
            "Skywork/Skywork-Reward-V2-Llama-3.1-8B", "llama", 4096, 32, 32, 8, 14336, 128256,
            False, None,
            _hub("Skywork/Skywork-Reward-V2-Llama-3.1-8B", "unconfirmed: the Llama-3.1-8B "
                 "numbers of https://huggingface.co/meta-llama/Llama-3.1-8B/blob/main/config.json;"
                 " the V1 reward model's config has vocab_size 128257 (one pad row more)"),
        ),
    )
}  # fmt: skip


def from_config_dict(name: str, config: Mapping[str, Any], source: str) -> Architecture:
    """The architecture of a transformers ``config.json`` (as a dict)."""
    text = config.get("text_config") or config
    heads = int(text["num_attention_heads"])
    return Architecture(
        name=name,
        model_type=str(text.get("model_type") or config.get("model_type") or "llama"),
        hidden_size=int(text["hidden_size"]),
        num_hidden_layers=int(text["num_hidden_layers"]),
        num_attention_heads=heads,
        num_key_value_heads=int(text.get("num_key_value_heads") or heads),
        intermediate_size=int(text["intermediate_size"]),
        vocab_size=int(text["vocab_size"]),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", text.get("tie_word_embeddings",
                                                                             False))),
        head_dim=text.get("head_dim"),
        source=source,
    )  # fmt: skip


def architecture(
    name: str, arch_map: Mapping[str, str] | None = None, *, allow_hub: bool = False
) -> Architecture:
    """The architecture of ``name``: a ``builtin:`` model, a table row (hub id), a local folder
    with a ``config.json``, or a path that ``arch_map`` maps to one of those (``--arch``);
    ``allow_hub`` (a run's setup, whose weights load next): any other id through transformers'
    ``AutoConfig`` (its cache or the hub). Anything else is refused with the fix."""
    arch_map = arch_map or {}
    mapped = arch_map.get(name) or arch_map.get(name.rstrip("/"))
    if mapped is not None:
        return replace(architecture(mapped), name=name, source=f"{name} -> {mapped} (--arch)")
    if name.startswith(PREFIX):
        config, where = builtin_config(name)
        return from_config_dict(name, config, where)
    if name in TABLE:
        return TABLE[name]
    folder = Path(name)
    if (folder / "config.json").is_file():
        config = json.loads((folder / "config.json").read_text())
        return from_config_dict(name, config, str(folder / "config.json"))
    if allow_hub:
        try:
            from transformers import AutoConfig

            config = AutoConfig.from_pretrained(name).to_dict()
            return from_config_dict(name, config, f"transformers AutoConfig of {name}")
        except (OSError, ValueError, KeyError):
            pass
    known = ", ".join(sorted(TABLE))
    raise ValueError(
        f"no architecture known for model {name!r}: not a builtin: model, not in the plan's "
        f"table ({known}) and no local folder with a config.json. Fix: pass "
        f"--arch {name}=HUB_ID naming a model of the same architecture (e.g. the model the run "
        "that writes that folder trains), or point the setting at a folder with a config.json."
    )


def exported_models(config_files: Sequence[str | Path]) -> dict[str, str]:
    """{``model.init_args.export_dir``: ``model.init_args.model``} of every preset in the
    ``configs/`` folders that hold ``config_files``: a folder one preset writes and another
    reads (the HH preset's reward model, ``runs/rm_ultrafeedback/hf``) is planned as the model
    the writing preset trains."""
    import yaml

    roots = {Path(p).resolve().parent.parent for p in config_files}
    found: dict[str, str] = {}
    for root in sorted(r for r in roots if r.name == "configs"):
        for path in sorted(root.rglob("*.yaml")):
            try:
                config = yaml.safe_load(path.read_text()) or {}
            except yaml.YAMLError:
                continue
            model = config.get("model") if isinstance(config, dict) else None
            args = model.get("init_args") if isinstance(model, dict) else None
            if isinstance(args, dict) and args.get("export_dir") and args.get("model"):
                found[str(args["export_dir"])] = str(args["model"])
    return found
