"""``precision``: how the networks are held: the trained weights' dtype, the frozen reference's,
and activation checkpointing."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from lit_rlhf.settings.base import SettingsGroup

Dtype = Literal["float32", "bfloat16", "float16"]
MemoryCheck = Literal["refuse", "warn", "off"]


@dataclass(frozen=True)
class PrecisionSettings(SettingsGroup):
    """Weights' dtypes and memory (``model.init_args.precision``).

    Args:
        dtype: the trained networks' weights. A 16-bit dtype trains only under DeepSpeed's bf16
            optimizer (float32 master weights); otherwise keep float32 with ``trainer.precision:
            bf16-mixed`` (refused at setup, before any load).
        reference_dtype: the frozen reference's dtype (null: ``dtype``); it may be 16-bit. Only
            modules with a frozen reference read it; under LoRA the reference is the trained
            network with its adapters off, so it must stay null there.
        gradient_checkpointing: recompute activations in the backward pass (less memory, about
            a third more compute).
        memory_check: the memory plan at ``setup`` on CUDA, before any weights load
            (``lit-rlhf plan`` prints the same): ``refuse`` a run whose lower bound per GPU
            exceeds the GPU (and warn when only the estimate does), ``warn`` only, or ``off``.
    """

    GROUP = "precision"

    dtype: Dtype = "float32"
    reference_dtype: Dtype | None = None
    gradient_checkpointing: bool = False
    memory_check: MemoryCheck = "refuse"

    def check(self) -> None:
        if self.reference_dtype is not None and self.reference_dtype not in (
            "float32",
            "bfloat16",
            "float16",
        ):
            raise ValueError(
                f"precision.reference_dtype={self.reference_dtype!r} is not one of "
                "['float32', 'bfloat16', 'float16', None]. Fix: set "
                f"{self.key('reference_dtype')} to one of them."
            )

    def refuse_unread(self, module: str, *, reference: bool, checkpointing: bool) -> None:
        """Refuse a field the module would silently ignore (it has no frozen reference, or no
        activation checkpointing)."""
        if not reference and self.reference_dtype is not None:
            raise ValueError(
                f"precision.reference_dtype={self.reference_dtype!r}: {module} has no frozen "
                "reference, so it would do nothing. Fix: leave precision.reference_dtype null."
            )
        if not checkpointing and self.gradient_checkpointing:
            raise ValueError(
                f"precision.gradient_checkpointing: {module} does not checkpoint activations, "
                "so it would do nothing. Fix: leave it false."
            )
