"""``judge``: how ``GenerativeRewardModule``'s judge writes its outputs and is evaluated."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from lit_rlhf.algos.judge import JUDGE_TAGS
from lit_rlhf.settings.base import Rule, SettingsGroup, is_int

Inference = Literal["single", "majority", "reflective"]


@dataclass(frozen=True)
class JudgeSettings(SettingsGroup):
    """The judge's output format and its evaluation-time inference (``model.init_args.judge``).

    Args:
        eval_samples: judge outputs per pair at validation / test / predict.
        inference: ``single`` (one greedy judgment; needs ``eval_samples: 1``), ``majority`` (of
            ``eval_samples`` sampled ones) or ``reflective`` (ReflectRM's two-stage inference;
            ``eval_samples`` >= 2); null: ``single`` for one sample, else ``majority``.
        critique_template: the analysis-preference template of reflective inference.
        tags: the judge output's tags (the reward and the evaluation parse them).
        subject: the word the verdict sentence names (``Response``).
        response_prefix: the assistant pre-fill the data module adds (its ``response_prefix``);
            it is put back before each output when parsing.
        response_suffix: a fixed ending put after each output when parsing, for a judge that
            generates only the verdict word (with ``max_new_tokens: 1`` on the engine; see
            ``configs/grm/rft_smollm2.yaml``).
    """

    GROUP = "judge"

    eval_samples: int = 1
    inference: Inference | None = None
    critique_template: str = "reflectrm-critique-v1"
    tags: tuple[str, ...] = JUDGE_TAGS
    subject: str = "Response"
    response_prefix: str = ""
    response_suffix: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "tags", tuple(self.tags))  # a YAML list
        super().__post_init__()

    def rules(self) -> list[Rule]:
        return [
            ("eval_samples", is_int(self.eval_samples) and self.eval_samples >= 1, ">= 1"),
            ("inference", self.inference in (None, "single", "majority", "reflective"),
             "single, majority, reflective or null"),
            ("tags", len(self.tags) >= 1, "at least one tag"),
        ]  # fmt: skip

    def check(self) -> None:
        mode = self.mode
        if mode == "single" and self.eval_samples != 1:
            raise ValueError(
                f"judge.inference='single' judges each pair once (greedy), but "
                f"judge.eval_samples={self.eval_samples}. Fix: set judge.eval_samples: 1, or "
                "judge.inference: majority / reflective."
            )
        if mode != "single" and self.eval_samples < 2:
            raise ValueError(
                f"judge.inference={mode!r} needs judge.eval_samples >= 2 judgments per pair, "
                f"got {self.eval_samples}. Fix: raise judge.eval_samples."
            )

    @property
    def mode(self) -> Inference:
        """``inference``, or its default for ``eval_samples``."""
        if self.inference is not None:
            return self.inference
        return "single" if self.eval_samples == 1 else "majority"
