"""``lora``: LoRA adapters (Hu et al. 2021, arXiv 2106.09685) and QLoRA's 4-bit base (arXiv
2305.14314); applied by :func:`lit_rlhf.models.lora.lora_wrap`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from lit_rlhf.settings.base import Rule, SettingsGroup, is_int

Quantize = Literal[None, "4bit"]


@dataclass(frozen=True)
class LoRASettings(SettingsGroup):
    """LoRA / QLoRA (``model.init_args.lora``).

    Args:
        rank: 0 = every weight trains; > 0 = peft LoRA adapters of this rank (the ``[lora]``
            extra); the base is frozen and is the KL's / DPO's reference (adapters switched off,
            no second model loaded); checkpoints hold the adapters only.
        alpha: adapter scale numerator (the update is scaled by ``alpha / rank``).
        target_modules: the layers that get adapters; ``all-linear``: every linear layer but the
            head (peft's name), or a list of module names.
        dropout: dropout on the adapters' input, in [0, 1).
        quantize: ``4bit`` loads the frozen base in NF4 with bf16 compute (QLoRA; bitsandbytes on
            a CUDA GPU; needs rank > 0; refused at setup on a machine without them); null: the
            base in ``precision.dtype``.
    """

    GROUP = "lora"
    FLAT_NAMES: ClassVar[dict[str, str]] = {
        "rank": "lora_rank",
        "alpha": "lora_alpha",
        "target_modules": "lora_target_modules",
        "dropout": "lora_dropout",
    }

    rank: int = 0
    alpha: int = 16
    target_modules: str | list[str] = "all-linear"
    dropout: float = 0.0
    quantize: Quantize = None

    def rules(self) -> list[Rule]:
        return [
            ("rank", is_int(self.rank) and self.rank >= 0, "an integer >= 0 (0: no LoRA)"),
            ("alpha", self.rank == 0 or self.alpha > 0, "> 0 with rank > 0"),
            ("dropout", 0 <= self.dropout < 1, "in [0, 1)"),
        ]

    def check(self) -> None:
        if self.quantize is not None and not self.enabled:
            raise ValueError(
                f"lora.quantize={self.quantize!r} stores the base weights in 4 bits, which cannot "
                "be trained; only LoRA adapters can. Fix: set lora.rank > 0 (QLoRA), or "
                "lora.quantize: null to train every weight."
            )

    def refuse_unread(self, module: str) -> None:
        """Refuse ``quantize`` in a module that loads its trained base in ``precision.dtype``
        (only the policy modules load a 4-bit base)."""
        if self.quantize is not None:
            raise ValueError(
                f"lora.quantize={self.quantize!r}: {module} does not read it (its base loads in "
                "precision.dtype), so it would do nothing. Fix: leave "
                f"{self.key('quantize')} null (QLoRA: PPOModule, GenerativeRewardModule)."
            )

    @property
    def enabled(self) -> bool:
        return self.rank > 0

    def check_reference_dtype(self, reference_dtype: str | None, *, separate: bool) -> None:
        """Refuse ``precision.reference_dtype`` under LoRA, where the reference is the trained
        network with its adapters off (it would change nothing), unless the module loads a
        ``separate`` reference model."""
        if self.enabled and not separate and reference_dtype is not None:
            raise ValueError(
                f"precision.reference_dtype={reference_dtype!r} with lora.rank > 0: the reference "
                "is the trained network with its adapters off, in precision.dtype, so it would "
                "change nothing. Fix: leave precision.reference_dtype null (a separate "
                "reference_model, where the module has one, may take it)."
            )
