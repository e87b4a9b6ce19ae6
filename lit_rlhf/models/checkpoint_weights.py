"""A clear error for a checkpoint of another model, before its weights are loaded.

Loading the weights of one network into another fails inside ``load_state_dict`` with a list
of missing keys and size mismatches that names neither the model the checkpoint came from nor
the one configured. Called from ``on_load_checkpoint`` (the networks are built by then:
``configure_model`` runs first on resume, in validate / test and in ``load_from_checkpoint``).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from torch import Tensor, nn


@dataclass(frozen=True)
class WeightMismatch:
    """How a checkpoint's weights differ from a module's: tensor names only here (``missing``),
    only there (``unexpected``), or of another shape (``reshaped``)."""

    missing: tuple[str, ...] = ()
    unexpected: tuple[str, ...] = ()
    reshaped: tuple[str, ...] = ()
    example: str = ""

    @classmethod
    def between(
        cls,
        own: Mapping[str, Tensor],
        saved: Mapping[str, Tensor],
        allowed_missing: Collection[str] = (),
    ) -> WeightMismatch:
        """Compare state dicts; ``allowed_missing`` (e.g. frozen parameters a checkpoint leaves
        out) are not counted; empty tensors (ZeRO-3 partitions) are not shape-compared."""
        missing = tuple(k for k in own if k not in saved and k not in allowed_missing)
        unexpected = tuple(k for k in saved if k not in own)
        reshaped = tuple(
            k
            for k, v in own.items()
            if k in saved
            and v.numel() > 0
            and saved[k].numel() > 0
            and tuple(v.shape) != tuple(saved[k].shape)
        )
        if reshaped:
            k = reshaped[0]
            example = f"{k} is {tuple(saved[k].shape)} there, {tuple(own[k].shape)} here"
        elif missing or unexpected:
            example = f"{(missing or unexpected)[0]} is only {'here' if missing else 'there'}"
        else:
            example = ""
        return cls(missing, unexpected, reshaped, example)

    def __bool__(self) -> bool:
        return bool(self.missing or self.unexpected or self.reshaped)

    def __str__(self) -> str:
        return (
            f"{len(self.missing)} tensors missing, {len(self.unexpected)} unexpected, "
            f"{len(self.reshaped)} of another shape (e.g. {self.example})"
        )


def mismatch_error(
    mismatch: WeightMismatch,
    *,
    saved_hp: Mapping[str, Any],
    own_hp: Mapping[str, Any],
    settings: Sequence[str] | None = None,
    where: str = "the checkpoint",
) -> ValueError:
    """The error for ``mismatch``, naming the checkpoint's and this module's values of
    ``settings`` (None: every hyperparameter both have and that differs, at most four)."""
    if settings is None:
        differ = [k for k in own_hp if k in saved_hp and saved_hp[k] != own_hp[k]][:4]
        settings = differ or ["model"]
    differ = [k for k in settings if _get(saved_hp, k) != _get(own_hp, k)] or list(settings)
    pairs = ", ".join(
        f"{k}: checkpoint {_get(saved_hp, k)!r}, this module {_get(own_hp, k)!r}" for k in differ
    )
    return ValueError(
        f"the weights in {where} are not this module's networks ({pairs}): {mismatch}. Fix: "
        f"configure the module as the checkpoint was trained ({', '.join(differ)}), or start a "
        "new run without this checkpoint."
    )


def _get(hparams: Mapping[str, Any], key: str) -> Any:
    """``hparams[key]``, where a dotted key (``lora.rank``) reads a settings group's field."""
    value: Any = hparams
    for part in key.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    return value


def check_checkpoint_weights(
    module: nn.Module, checkpoint: Mapping[str, Any], *, settings: Sequence[str]
) -> None:
    """Refuse a checkpoint whose ``state_dict`` does not fit ``module``'s (missing, unexpected
    or differently shaped tensors), naming the checkpoint's and the module's values of the
    ``settings`` that choose the networks (e.g. ``model``). Skipped without a ``state_dict``
    (DeepSpeed keeps the weights in its own files and
    :class:`lit_rlhf.strategies.DeepSpeedStrategy` checks them), with ``strict_loading`` off,
    and for tensors that are partitioned here (ZeRO-3: empty)."""
    saved = checkpoint.get("state_dict")
    if not saved or not getattr(module, "strict_loading", True):
        return
    mismatch = WeightMismatch.between(module.state_dict(), saved)
    if mismatch:
        raise mismatch_error(
            mismatch,
            saved_hp=checkpoint.get("hyper_parameters") or {},
            own_hp=getattr(module, "hparams", {}),
            settings=settings,
        )
