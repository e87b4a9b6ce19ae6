"""A clear error for a checkpoint of another model, before its weights are loaded.

Loading the weights of one network into another fails inside ``load_state_dict`` with a list
of missing keys and size mismatches that names neither the model the checkpoint came from nor
the one configured. Called from ``on_load_checkpoint`` (the networks are built by then:
``configure_model`` runs first on resume, in validate / test and in ``load_from_checkpoint``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from torch import nn


def check_checkpoint_weights(
    module: nn.Module, checkpoint: Mapping[str, Any], *, settings: Sequence[str]
) -> None:
    """Refuse a checkpoint whose ``state_dict`` does not fit ``module``'s (missing, unexpected
    or differently shaped tensors), naming the checkpoint's and the module's values of the
    ``settings`` that choose the networks (e.g. ``model``). Skipped without a ``state_dict``
    (DeepSpeed keeps the weights in its own files), with ``strict_loading`` off, and for
    tensors that are partitioned here (ZeRO-3: empty)."""
    saved = checkpoint.get("state_dict")
    if not saved or not getattr(module, "strict_loading", True):
        return
    own = module.state_dict()
    missing = [k for k in own if k not in saved]
    unexpected = [k for k in saved if k not in own]
    reshaped = [
        k
        for k, v in own.items()
        if k in saved and v.numel() > 0 and tuple(v.shape) != tuple(saved[k].shape)
    ]
    if not (missing or unexpected or reshaped):
        return
    if reshaped:
        k = reshaped[0]
        example = f"{k} is {tuple(saved[k].shape)} there, {tuple(own[k].shape)} here"
    else:
        example = f"{(missing or unexpected)[0]} is only {'here' if missing else 'there'}"
    saved_hp = checkpoint.get("hyper_parameters") or {}
    own_hp = getattr(module, "hparams", {})
    differ = [k for k in settings if saved_hp.get(k) != own_hp.get(k)] or list(settings)
    pairs = ", ".join(
        f"{k}: checkpoint {saved_hp.get(k)!r}, this module {own_hp.get(k)!r}" for k in differ
    )
    raise ValueError(
        f"the checkpoint's weights are not this module's networks ({pairs}): "
        f"{len(missing)} tensors missing, {len(unexpected)} unexpected, {len(reshaped)} of "
        f"another shape (e.g. {example}). Fix: configure the module as the checkpoint was "
        f"trained ({', '.join(differ)}), or start a new run without this checkpoint."
    )
