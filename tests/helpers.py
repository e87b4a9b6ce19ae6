"""Small shared pieces for tests: a prompt loader without the DataModule, a toy reward, a quiet
trainer, and loading a script as a module."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader

from lit_rlhf.types import RewardOutput


def prompt_loader(
    tokenizer: Any, prompts: list[str], batch_size: int, row: Any = None
) -> DataLoader:
    """Prompt batches as ``PromptDataModule`` makes them; ``row(prompt)`` gives each prompt's
    data row (default ``{}``)."""

    def collate(items: list[str]) -> dict[str, Any]:
        enc = tokenizer(items, return_tensors="pt", padding=True)
        return {
            "input_ids": enc.input_ids,
            "attention_mask": enc.attention_mask.bool(),
            "prompt": items,
            "query_id": items,
            "task": ["toy"] * len(items),
            "row": [row(item) if row else {} for item in items],
        }

    return DataLoader(prompts, batch_size=batch_size, collate_fn=collate)


class ConstantReward:
    """Scores every completion with ``value`` (inf to exercise error paths; NaN is "no
    score")."""

    def __init__(self, value: float) -> None:
        self.value = value

    def __call__(self, prompts: Any, completions: Any, rows: Any) -> RewardOutput:
        return RewardOutput(torch.full((len(completions),), self.value))


def load_script(name: str) -> ModuleType:
    """Import ``scripts/<name>.py`` (e.g. ``data/calculator_demos``) by path."""
    path = Path(__file__).resolve().parents[1] / "scripts" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def quiet_trainer(root: Any, **kwargs: Any) -> L.Trainer:
    """A CPU ``L.Trainer`` for tests: one epoch, no logger, checkpointing, progress bar or
    summary; ``kwargs`` override."""
    defaults: dict[str, Any] = dict(
        accelerator="cpu",
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=root,
    )
    defaults.update(kwargs)
    return L.Trainer(**defaults)


def merge_groups(defaults: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """Module keyword arguments: ``overrides`` on ``defaults``, where a settings group given as a
    dict in both is merged field by field (``optim={"lr": 1e-3}`` keeps the default
    ``micro_batch_size``)."""
    out = dict(defaults)
    for key, value in overrides.items():
        both = isinstance(value, dict) and isinstance(out.get(key), dict)
        out[key] = {**out[key], **value} if both else value
    return out


def replace_groups(settings: Any, **groups: dict[str, Any]) -> Any:
    """A copy of a record of settings groups (e.g. :class:`lit_rlhf.training.PPOSettings`) with
    fields of its groups changed: ``replace_groups(s, update={"ppo_epochs": 2})``."""
    import dataclasses

    changed = {
        name: dataclasses.replace(getattr(settings, name), **fields)
        for name, fields in groups.items()
    }
    return dataclasses.replace(settings, **changed)
