"""Frozen copies of a starting model (PPO's reference policy, the compressor's decoder) that a
LightningModule holds but never trains or saves.

A frozen model is rebuilt from its source (hub id, folder, ``builtin:``) on every start, so
storing it would only add one more copy of the weights to every checkpoint. The helper drops its
keys when Lightning saves, and puts the freshly loaded weights back into the checkpoint's state
dict when Lightning loads (``configure_model`` runs before ``on_load_checkpoint`` on resume and in
``load_from_checkpoint``), so strict loading still finds every key::

    self.frozen = FrozenModules("ref_policy")                  # in __init__
    self.ref_policy = freeze(load_causal_lm(...))               # in configure_model
    def on_save_checkpoint(self, checkpoint): self.frozen.drop(checkpoint)
    def on_load_checkpoint(self, checkpoint): self.frozen.restore(self, checkpoint)

DeepSpeed's checkpoint folders are written by DeepSpeed from its engine:
:class:`lit_rlhf.strategies.DeepSpeedStrategy` leaves frozen parameters out of them too (and
allows exactly those keys to be missing on load); Lightning's own DeepSpeed strategy keeps them.
"""

from __future__ import annotations

from typing import Any, TypeVar

from torch import nn

ModuleT = TypeVar("ModuleT", bound=nn.Module)


def freeze(model: ModuleT) -> ModuleT:
    """Eval mode (no dropout) and no gradients; returns ``model``."""
    model.eval()
    model.requires_grad_(False)
    return model


class FrozenModules:
    """Which attributes of a LightningModule hold frozen models left out of checkpoints.

    Args:
        *attributes: attribute names (submodules), e.g. ``"ref_policy"``. An attribute that is
            None (e.g. no reference when the KL coefficient is 0), or holds no network, is
            skipped.
    """

    def __init__(self, *attributes: str) -> None:
        if not attributes:
            raise ValueError("FrozenModules needs at least one attribute name")
        self.attributes = attributes

    def drop(self, checkpoint: dict[str, Any]) -> None:
        """Remove the frozen models' keys from a checkpoint's state dict (on save)."""
        weights = checkpoint.get("state_dict")
        if weights is None:
            return
        prefixes = tuple(f"{name}." for name in self.attributes)
        for key in [k for k in weights if k.startswith(prefixes)]:
            del weights[key]

    def restore(self, module: nn.Module, checkpoint: dict[str, Any]) -> None:
        """Put the built frozen models' weights back into the checkpoint's state dict
        (``on_load_checkpoint``), so that strict loading finds every key."""
        weights = checkpoint.get("state_dict")
        if weights is None:
            return
        for name in self.attributes:
            frozen = getattr(module, name, None)
            if isinstance(frozen, nn.Module):  # not None, nor a teacher served elsewhere
                weights.update({f"{name}.{k}": v for k, v in frozen.state_dict().items()})


def frozen_weight_names(network: nn.Module) -> list[str]:
    """The state-dict keys of ``network`` that are not trainable parameters: the frozen base of
    a LoRA-wrapped model (its weights, 4-bit quantization states, persistent buffers)."""
    trainable = {name for name, p in network.named_parameters() if p.requires_grad}
    return [name for name in network.state_dict() if name not in trainable]


def drop_frozen_weights(checkpoint: dict[str, Any], attribute: str, network: nn.Module) -> None:
    """Remove the frozen weights of the partly trained ``network`` (held as ``attribute``) from a
    checkpoint's state dict on save: under LoRA the checkpoint keeps the adapters only, the base
    being rebuilt from its source on every start, as for :class:`FrozenModules`."""
    weights = checkpoint.get("state_dict")
    if weights is None:
        return
    for name in frozen_weight_names(network):
        weights.pop(f"{attribute}.{name}", None)


def restore_frozen_weights(checkpoint: dict[str, Any], attribute: str, network: nn.Module) -> None:
    """The reverse of :func:`drop_frozen_weights` on load: the built network's frozen weights go
    back into the state dict (where the checkpoint lacks them), so strict loading finds every
    key."""
    weights = checkpoint.get("state_dict")
    if weights is None:
        return
    state = network.state_dict()
    for name in frozen_weight_names(network):
        weights.setdefault(f"{attribute}.{name}", state[name])
