"""Rewards for a generative reward model's own outputs (a judge that writes a critique and a
verdict on a pair of responses): the format term, and the verdict against a gold label.

Used by ``GenerativeRewardModule``: ``gold`` is RFT (verdict correctness + format, the baseline
of ConsistRM arXiv 2604.07484 and ReflectRM arXiv 2604.07506); ``format`` scores the format only
and leaves the answer to ConsistRM's label-free consistency callbacks (reward terms). Judge
output is untrusted text: it is parsed with bounded regexes, never evaluated.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import torch

from lit_rlhf.algos.judge import JUDGE_TAGS, JudgeFormat
from lit_rlhf.data.judge_templates import require_label
from lit_rlhf.rewards.base import check_batch_lengths
from lit_rlhf.types import RewardOutput


class VerdictReward:
    """Per judge output: ``invalid`` if the format is broken or the verdict unparsable (it
    replaces every other term, as in the authors' code); else ``format_bonus``, plus in ``gold``
    mode ``correct`` / ``wrong`` by the verdict against the row's ``label`` (-1: response 1
    better, +1: response 2 better).

    Args:
        mode: ``gold`` (needs every row's ``label``) or ``format`` (label-free).
        correct, wrong: verdict terms (gold mode).
        format_bonus: added to every well-formed output.
        invalid: the score of a malformed or unparsable output: at most the worst well-formed
            score (``format_bonus + min(0, wrong)``); equal to it, a malformed output counts as a
            wrong verdict, so learning the format does not favour the judge's majority verdict.
        tags: the tags a well-formed output has, in order (ReflectRM: Analysis, Result).
        subject: the compared things, ``Response`` (or ``Critique`` for analysis preference);
            a row's ``subject`` column overrides it (ReflectRM's mixed data, see
            :mod:`lit_rlhf.data.pairs`).
        prefix: text put before every output before parsing: the assistant pre-fill of the data
            (``PromptDataModule(response_prefix=...)``), e.g. ``"<Result>Response"``.
        suffix: text put after every output before parsing, for a judge that generates only
            the verdict word (``max_new_tokens: 1``), e.g. ``" than Response 2</Result>"``.

    Info: ``format_ok``, ``verdict`` (-1 / +1, 0 when unparsable) and, where labels exist,
    ``correct``.
    """

    def __init__(
        self,
        mode: Literal["gold", "format"] = "gold",
        correct: float = 1.0,
        wrong: float = -1.0,
        format_bonus: float = 0.1,
        invalid: float = -3.0,
        tags: Sequence[str] = JUDGE_TAGS,
        subject: str = "Response",
        prefix: str = "",
        suffix: str = "",
    ) -> None:
        if mode not in ("gold", "format"):
            raise ValueError(f"mode must be 'gold' or 'format', got {mode!r}")
        if correct <= wrong:
            raise ValueError(f"correct ({correct}) must be above wrong ({wrong})")
        if invalid > format_bonus + min(0.0, wrong):
            raise ValueError(
                f"invalid ({invalid}) must be at most the worst well-formed score "
                f"({format_bonus + min(0.0, wrong)}), else a malformed output pays"
            )
        self.format = JudgeFormat(tuple(tags), subject, prefix, suffix)
        self.mode, self.correct, self.wrong = mode, float(correct), float(wrong)
        self.format_bonus, self.invalid = float(format_bonus), float(invalid)

    def __call__(
        self,
        prompts: Sequence[str],
        completions: Sequence[str],
        rows: Sequence[Mapping[str, Any]],
    ) -> RewardOutput:
        check_batch_lengths(prompts, completions, rows)
        verdicts = [
            self.format.verdict(c, row.get("subject"))
            for c, row in zip(completions, rows, strict=True)
        ]
        ok = torch.tensor([v is not None for v in verdicts], dtype=torch.float32)
        scores = torch.where(ok.bool(), self.format_bonus, self.invalid)
        info = {"format_ok": ok, "verdict": torch.tensor([float(v or 0) for v in verdicts])}
        labels = [gold_label(row, i) if self.mode == "gold" else row.get("label") for i, row in
                  enumerate(rows)]  # fmt: skip
        if all(label is not None for label in labels):
            right = torch.tensor([float(v == y) for v, y in zip(verdicts, labels, strict=True)])
            info["correct"] = right
            if self.mode == "gold":
                verdict_term = torch.where(right.bool(), self.correct, self.wrong)
                scores = torch.where(ok.bool(), scores + verdict_term, scores)
        return RewardOutput(scores=scores, info=info)


def gold_label(row: Mapping[str, Any], index: int) -> int:
    """The row's gold label, -1 or +1; a clear error for a missing or malformed one."""
    return require_label(
        row,
        index,
        user="VerdictReward in gold mode (RFT)",
        fix="use labelled pairs, or mode='format' with the ConsistRM consistency callbacks.",
    )
