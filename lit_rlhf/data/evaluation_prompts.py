"""The held-out check of the instruction training sources: evaluation prompts (e.g. IFEval's)
normalised and indexed, and the test of whether a training prompt contains one
(:class:`EvaluationPrompts`), with the filter that drops such rows from a source's output. Used
by :mod:`lit_rlhf.data.instructions` (``exclude=``), which re-exports it.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Sequence
from typing import Any

from lit_rlhf.data.sources import PromptSource

_SHINGLE = 8  # words per shingle of the containment index


def normalize_prompt(text: str) -> str:
    """The form prompts are compared in: lower case, runs of whitespace as one space."""
    return " ".join(text.lower().split())


class EvaluationPrompts:
    """The normalised prompts of evaluation sources, and the test of whether a training prompt
    contains one (an index of each evaluation prompt's first 8 words makes it linear)."""

    def __init__(self, sources: Iterable[PromptSource]) -> None:
        self.prompts: set[str] = set()
        for source in sources:
            self.prompts.update(normalize_prompt(str(q)) for q in source.load()["question"])
        self._by_head: dict[tuple[str, ...], list[str]] = {}
        self._short: list[str] = []
        for prompt in self.prompts:
            words = prompt.split(" ")
            if len(words) < _SHINGLE:
                self._short.append(prompt)
            else:
                self._by_head.setdefault(tuple(words[:_SHINGLE]), []).append(prompt)

    def __len__(self) -> int:
        return len(self.prompts)

    def contains_one(self, text: str) -> bool:
        """Whether ``text`` equals or contains (normalised) one of the evaluation prompts."""
        norm = normalize_prompt(text)
        if norm in self.prompts or any(p in norm for p in self._short):
            return True
        words = norm.split(" ")
        for i in range(len(words) - _SHINGLE + 1):
            for prompt in self._by_head.get(tuple(words[i : i + _SHINGLE]), ()):
                if prompt in norm:
                    return True
        return False


def _drop_evaluation_prompts(
    rows: list[dict[str, Any]], exclude: Sequence[PromptSource], who: str
) -> list[dict[str, Any]]:
    if not exclude:
        return rows
    held_out = EvaluationPrompts(exclude)
    kept = [row for row in rows if not held_out.contains_one(row["prompt"])]
    if len(kept) < len(rows):
        warnings.warn(
            f"{who}: dropped {len(rows) - len(kept)} of {len(rows)} training prompts that "
            f"contain an evaluation prompt (of {len(held_out)} excluded)",
            stacklevel=3,
        )
    if not kept:
        raise ValueError(f"{who}: every training prompt contains an evaluation prompt")
    return kept
