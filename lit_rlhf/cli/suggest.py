"""Suggestions for a module setting that does not exist: the lit-rlhf setting a TRL name maps to
(:mod:`lit_rlhf.settings.trl_names`), or the nearest setting names (difflib) among the module
class's own arguments and its settings groups' fields."""

from __future__ import annotations

import difflib
import importlib
import inspect

from lit_rlhf.settings import group_params
from lit_rlhf.settings.trl_names import trl_pointer

_MODULES = ("PPOModule", "GenerativeRewardModule", "DPOModule", "SFTModule", "RewardModelModule",
            "CompressorModule")  # fmt: skip


def suggest(class_path: str | None, dotted: str) -> str | None:
    """For the unknown setting ``dotted`` (below ``init_args``: ``num_generations``,
    ``rollot.samples_per_prompt``): the TRL pointer, else "did you mean ..." with the nearest
    names; ``class_path`` None: the names of every lit-rlhf module."""
    if pointer := trl_pointer(dotted.rsplit(".", 1)[-1]):
        return pointer
    names = _setting_names(class_path)
    close = difflib.get_close_matches(dotted, names, n=3, cutoff=0.75)
    if not close:  # the field alone, whatever group it was put in
        last = dotted.rsplit(".", 1)[-1]
        fields = {n.rsplit(".", 1)[-1]: n for n in names}
        close = [fields[f] for f in difflib.get_close_matches(last, list(fields), n=3)]
    return f"did you mean {' or '.join(close)}?" if close else None


def _setting_names(class_path: str | None) -> list[str]:
    """The class's arguments and ``group.field`` of each of its settings groups."""
    classes = [_load(class_path)] if class_path else []
    if not any(classes):
        classes = [_load(f"lit_rlhf.modules.{name}") for name in _MODULES]
    names: set[str] = set()
    for cls in (c for c in classes if c is not None):
        try:
            names.update(p for p in inspect.signature(cls).parameters if p not in ("self",))
            for group, settings in group_params(cls).items():
                names.update(f"{group}.{field}" for field in settings.__dataclass_fields__)
        except (TypeError, ValueError):
            continue
    return sorted(names)


def _load(class_path: str) -> type | None:
    module, _, name = class_path.rpartition(".")
    try:
        found = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        return None
    return found if isinstance(found, type) else None
