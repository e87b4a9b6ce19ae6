"""DeepSpeed checkpoint folders without the frozen models, and a clear error for another model's.

Lightning's :class:`~lightning.pytorch.strategies.DeepSpeedStrategy` saves through DeepSpeed's
engine, which stores every parameter of the LightningModule: also the frozen ones (PPO's and the
judge's reference, the compressor's frozen decoder, the frozen base of a LoRA model), which
lit-rlhf rebuilds from their source on every start (:mod:`lit_rlhf.training.frozen`) and already
leaves out of Lightning checkpoints. DeepSpeed can leave them out (``exclude_frozen_parameters``),
but Lightning then loads with ``strict=module.strict_loading`` and fails on the missing keys.

:class:`DeepSpeedStrategy` takes all of Lightning's arguments, excludes frozen parameters by
default, and loads a checkpoint's module weights with its own check: the keys it lacks must be
frozen parameters of this module, and it may hold no key or shape this module does not have
(shapes of ZeRO-3 partitions, which are empty, are not compared). Anything else is refused
before DeepSpeed reads the optimizer states, naming the tensors and the settings
(hyperparameters) in which the checkpoint and this module differ. Frozen parameters present in
a checkpoint (written with ``exclude_frozen_parameters: false`` or by Lightning's class) are
loaded as before.

``grad_accum_dtype`` sets DeepSpeed's ``data_types.grad_accum_dtype``: the dtype in which the
micro-batches' gradients are summed (DeepSpeed's default is the model's dtype, bf16 under
``bf16-mixed``; the fragments set ``fp32``, as verl's FSDP accumulates; ZeRO-2/3 keep the fp32
sums in their gradient partitions).

YAML (``configs/trainer/deepspeed_zero2.yaml``)::

    trainer:
      strategy:
        class_path: lit_rlhf.strategies.DeepSpeedStrategy
        init_args: {stage: 2, grad_accum_dtype: fp32}
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.strategies import DeepSpeedStrategy as LightningDeepSpeedStrategy
from lightning.pytorch.strategies.deepspeed import _validate_checkpoint_directory
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from torch import Tensor, nn
from typing_extensions import override

from lit_rlhf.models.checkpoint_weights import WeightMismatch, mismatch_error

GRAD_ACCUM_DTYPES = ("fp32", "bf16", "fp16")


class DeepSpeedStrategy(LightningDeepSpeedStrategy):
    """Lightning's DeepSpeed strategy whose checkpoint folders hold only trained parameters.

    Args:
        exclude_frozen_parameters: leave parameters with ``requires_grad=False`` out of the
            checkpoint folders (default True; they are rebuilt from their source on load).
        grad_accum_dtype: DeepSpeed's ``data_types.grad_accum_dtype`` (``fp32``, ``bf16``,
            ``fp16``); ``None`` leaves DeepSpeed's default (the model's dtype).
        **kwargs: Lightning's ``DeepSpeedStrategy`` arguments, by name (``stage``, ``config``,
            offload settings, ...).
    """

    def __init__(
        self,
        *,
        exclude_frozen_parameters: bool = True,
        grad_accum_dtype: str | None = None,
        **kwargs: Any,
    ) -> None:
        # a named parameter, not a changed default in **kwargs: LightningCLI fills every
        # parameter it sees, and it would pass Lightning's default (False) explicitly
        super().__init__(exclude_frozen_parameters=exclude_frozen_parameters, **kwargs)
        if grad_accum_dtype is not None and self.config is not None:  # Lightning always sets it
            _set_grad_accum_dtype(self.config, grad_accum_dtype)

    @override
    def save_checkpoint(
        self, checkpoint: dict, filepath: Any, storage_options: Any | None = None
    ) -> None:
        engine = self.deepspeed_engine
        if not self.exclude_frozen_parameters or engine is None:
            return super().save_checkpoint(checkpoint, filepath, storage_options)
        # DeepSpeed drops frozen parameters by their first name only, so a tied alias (a frozen
        # model's lm_head.weight = its embedding) would stay: drop every name of each.
        frozen = _frozen_names(engine.module)
        original = engine.module_state_dict

        def trained_state_dict(*args: Any, **kwargs: Any) -> dict:
            weights = original(*args, **kwargs)
            if kwargs.get("exclude_frozen_parameters"):
                for name in frozen:
                    weights.pop(name, None)
            return weights

        engine.module_state_dict = trained_state_dict
        try:
            super().save_checkpoint(checkpoint, filepath, storage_options)
        finally:
            del engine.module_state_dict  # the class's method again

    @override
    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict:
        if self.load_full_weights and self.zero_stage_3:  # one consolidated file: Lightning's path
            return super().load_checkpoint(checkpoint_path, weights_only)

        _validate_checkpoint_directory(checkpoint_path)
        module = self.lightning_module
        assert module is not None and self.deepspeed_engine is not None
        strict = bool(module.strict_loading)
        try:
            _, client_state = self.deepspeed_engine.load_checkpoint(
                checkpoint_path,
                load_optimizer_states=module.trainer.state.fn == TrainerFn.FITTING,
                load_lr_scheduler_states=False,
                custom_load_fn=lambda src, dst: _load_module_weights(src, dst, strict),
            )
        except _Refused as refused:  # before DeepSpeed reads optimizer states of other shapes
            raise mismatch_error(
                refused.mismatch,
                saved_hp=_saved_hyperparameters(Path(checkpoint_path)),
                own_hp=dict(getattr(module, "hparams", {})),
                where=str(checkpoint_path),
            ) from None
        if client_state is None:
            raise MisconfigurationException(
                f"DeepSpeed could not load the checkpoint {checkpoint_path}. Fix: pass the folder "
                "a DeepSpeed run wrote (it holds 'latest' and a 'checkpoint' folder), or a single "
                "file with DeepSpeedStrategy(load_full_weights=True) under ZeRO-3."
            )
        return client_state


def _set_grad_accum_dtype(config: dict[str, Any], dtype: str) -> None:
    """Write ``data_types.grad_accum_dtype`` into DeepSpeed's ``config``; a bad name, or another
    value already in a user's config, is refused."""
    if dtype not in GRAD_ACCUM_DTYPES:
        raise ValueError(
            f"DeepSpeedStrategy grad_accum_dtype={dtype!r} is not known. Fix: one of "
            f"{', '.join(GRAD_ACCUM_DTYPES)}, or null for DeepSpeed's default."
        )
    data_types = config.setdefault("data_types", {})
    current = data_types.get("grad_accum_dtype")
    if current not in (None, dtype):
        raise ValueError(
            f"the DeepSpeed config sets data_types.grad_accum_dtype={current!r} but the strategy "
            f"asks for grad_accum_dtype={dtype!r}. Fix: set one of them."
        )
    data_types["grad_accum_dtype"] = dtype


def _frozen_names(module: nn.Module) -> set[str]:
    """Every name of every frozen parameter, tied aliases included."""
    return {n for n, p in module.named_parameters(remove_duplicate=False) if not p.requires_grad}


class _Refused(Exception):
    def __init__(self, mismatch: WeightMismatch) -> None:
        super().__init__(str(mismatch))
        self.mismatch = mismatch


def _load_module_weights(src: Mapping[str, Tensor], dst: nn.Module, strict: bool) -> None:
    """DeepSpeed's ``custom_load_fn``: the checkpoint's module weights into ``dst``, where the
    keys it lacks may only be ``dst``'s frozen parameters (refused otherwise when ``strict``;
    without it, what fits is loaded)."""
    own = dst.state_dict()
    mismatch = WeightMismatch.between(own, src, allowed_missing=_frozen_names(dst))
    if mismatch and strict:
        raise _Refused(mismatch)
    fits = {k: v for k, v in src.items() if k in own and k not in mismatch.reshaped}
    dst.load_state_dict(fits, strict=False)


def _saved_hyperparameters(folder: Path) -> Mapping[str, Any]:
    """The ``hyper_parameters`` Lightning stored in a DeepSpeed folder's model-states file (for
    the error message only; {} where the file cannot be read with ``weights_only=True``)."""
    for path in sorted(folder.glob("checkpoint/*model_states.pt")):
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception:  # DeepSpeed's own objects: no settings to name
            return {}
        return state.get("hyper_parameters") or {}
    return {}
