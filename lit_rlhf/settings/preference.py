"""``loss`` of :class:`~lit_rlhf.modules.DPOModule`: which offline preference loss (sigmoid DPO,
IPO or SimPO; the pure functions of :mod:`lit_rlhf.algos.preference`) and its constants."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from lit_rlhf.settings.base import Rule, SettingsGroup, non_negative, positive

PreferenceLoss = Literal["sigmoid", "ipo", "simpo"]
_SIMPO_GAMMA = 0.5  # the field's default (refused, when changed, with another loss)


@dataclass(frozen=True)
class PreferenceLossSettings(SettingsGroup):
    """DPO's preference loss (``model.init_args.loss``).

    Args:
        kind: ``sigmoid`` (DPO, Rafailov et al. 2023; with ``label_smoothing``: cDPO), ``ipo``
            (Azar et al. 2023), or ``simpo`` (Meng et al. 2024: reference-free,
            length-normalised, with the margin ``simpo_gamma``).
        beta: DPO's KL strength / IPO's tau / SimPO's reward scale (> 0). Papers: DPO 0.1 (0.5
            for TL;DR summarisation; its appendix B), SimPO about 2 to 10.
        label_smoothing: cDPO's label-flip probability, in [0, 0.5), for ``kind: sigmoid`` only.
        simpo_gamma: SimPO's target reward margin (>= 0), for ``kind: simpo`` only.
    """

    GROUP = "loss"
    FLAT_NAMES: ClassVar[dict[str, str]] = {"kind": "loss"}

    kind: PreferenceLoss = "sigmoid"
    beta: float = 0.1
    label_smoothing: float = 0.0
    simpo_gamma: float = _SIMPO_GAMMA

    def rules(self) -> list[Rule]:
        return [
            ("beta", positive(self.beta), "> 0 and finite (DPO: 0.1 to 0.5; SimPO: about 2 to 10)"),
            ("label_smoothing", 0 <= self.label_smoothing < 0.5,
             "in [0, 0.5) (cDPO's label-flip probability; 0.5 would ignore the labels)"),
            ("simpo_gamma", non_negative(self.simpo_gamma),
             ">= 0 and finite (SimPO's target reward margin)"),
        ]  # fmt: skip

    def check(self) -> None:
        if self.label_smoothing > 0 and self.kind != "sigmoid":
            raise ValueError(
                f"loss.label_smoothing={self.label_smoothing} is cDPO's, a setting of loss.kind: "
                f"sigmoid; loss.kind={self.kind!r} would ignore it. Fix: set "
                f"{self.key('label_smoothing')} to 0, or {self.key('kind')} to sigmoid."
            )
        if self.simpo_gamma != _SIMPO_GAMMA and self.kind != "simpo":
            raise ValueError(
                f"loss.simpo_gamma={self.simpo_gamma}: loss.kind={self.kind!r} does not read it "
                "(SimPO's margin), so it would do nothing. Fix: remove "
                f"{self.key('simpo_gamma')}, or set {self.key('kind')} to simpo."
            )

    @property
    def reference_free(self) -> bool:
        """SimPO has no reference model."""
        return self.kind == "simpo"
