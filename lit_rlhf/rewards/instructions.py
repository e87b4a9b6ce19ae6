"""Instruction following as a verifiable reward (IFEval, Zhou et al. 2023; MGS arXiv 2602.02301
scores its instruction-following domain by the fraction of instructions satisfied).

The checks are IFEval's own, from the maintained ``if-verifiable`` package. Two of them need
NLTK's ``punkt`` data, which cannot be downloaded on an offline machine: when it is missing,
``length_constraints:number_sentences`` counts sentences with the same package's regex splitter
and ``change_case:capital_word_frequency`` counts ``\\w+`` words, and every sample that used a
fallback is flagged in the info (``fallback``). Responses are untrusted text: they are cut to
``max_chars`` before any check runs, and nothing in them is executed.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, Literal

import torch

from lit_rlhf.rewards.base import check_batch_lengths
from lit_rlhf.types import RewardOutput

_NEEDS_PUNKT = {"length_constraints:number_sentences", "change_case:capital_word_frequency"}


def _punkt_available() -> bool:
    import nltk

    try:
        nltk.data.find("tokenizers/punkt")
    except LookupError:
        return False
    return True


@contextmanager
def _without_punkt() -> Iterator[None]:
    """IFEval's sentence and word counts without NLTK's punkt data (restored on exit)."""
    from if_verifiable.ifeval import instructions_util as util

    count, tokenize = util.count_sentences, util.nltk.word_tokenize
    util.count_sentences = lambda text: len(util.split_into_sentences(text))
    util.nltk.word_tokenize = lambda text, *args, **kwargs: re.findall(r"\w+", text)
    try:
        yield
    finally:
        util.count_sentences, util.nltk.word_tokenize = count, tokenize


class InstructionReward:
    """Scores a response by the IFEval instructions of its row.

    Row fields (IFEval's columns, e.g. the hub dataset ``google/IFEval``):
    ``instruction_id_list`` (list[str]) and ``kwargs`` (list[dict], one per instruction; None
    values are dropped); the prompt the checks may need is the row's ``question``.

    Args:
        mode: ``strict`` (the response as is) or ``loose`` (IFEval's loose variants: first or
            last line removed, markdown asterisks dropped).
        all_or_nothing: 1.0 only when every instruction holds (IFEval's prompt-level accuracy)
            instead of the fraction that holds (instruction-level, the MGS reward).
        max_chars: responses are cut to this many characters before checking.

    Info: ``fraction`` (instructions satisfied), ``all`` (every one satisfied), ``fallback``
    (a check ran without NLTK's punkt data).
    """

    def __init__(
        self,
        mode: Literal["strict", "loose"] = "strict",
        all_or_nothing: bool = False,
        max_chars: int = 20_000,
    ) -> None:
        if mode not in ("strict", "loose"):
            raise ValueError(f"mode must be 'strict' or 'loose', got {mode!r}")
        if max_chars < 1:
            raise ValueError(f"max_chars must be >= 1, got {max_chars}")
        try:
            import langdetect
            from if_verifiable.ifeval.instructions_registry import INSTRUCTION_DICT
        except ImportError as err:
            raise ImportError(
                f"InstructionReward needs the if-verifiable package ({err}). Fix: pip install "
                "'lit-rlhf[ifeval]' (Python 3.11+)."
            ) from err

        # the language checks call langdetect, which samples: seeded, a response always gets
        # the same score
        langdetect.DetectorFactory.seed = 0
        self.registry = INSTRUCTION_DICT
        self.mode, self.all_or_nothing, self.max_chars = mode, all_or_nothing, max_chars
        self.punkt = _punkt_available()

    def __call__(
        self,
        prompts: Sequence[str],
        completions: Sequence[str],
        rows: Sequence[Mapping[str, Any]],
    ) -> RewardOutput:
        from if_verifiable.common import evaluate_instructions

        check_batch_lengths(prompts, completions, rows)
        fraction, every, fallback = [], [], []
        for i, (prompt, completion, row) in enumerate(zip(prompts, completions, rows, strict=True)):
            ids, kwargs = self._instructions(row, i)
            needs_fallback = not self.punkt and bool(_NEEDS_PUNKT & set(ids))
            with _without_punkt() if needs_fallback else _nothing():
                _, scores = evaluate_instructions(
                    completion[: self.max_chars], ids, kwargs, str(row.get("question", prompt)),
                    self.registry,
                )  # fmt: skip
            part = scores.partial_strict if self.mode == "strict" else scores.partial_loose
            whole = scores.binary_strict if self.mode == "strict" else scores.binary_loose
            fraction.append(part)
            every.append(whole)
            fallback.append(float(needs_fallback))
        info = {"fraction": torch.tensor(fraction), "all": torch.tensor(every),
                "fallback": torch.tensor(fallback)}  # fmt: skip
        return RewardOutput(scores=(info["all"] if self.all_or_nothing else info["fraction"]),
                            info=info)  # fmt: skip

    def _instructions(self, row: Mapping[str, Any], index: int) -> tuple[list[str], list[dict]]:
        ids, kwargs = row.get("instruction_id_list"), row.get("kwargs")
        where = f"row {index} (query {row.get('query_id', '?')!r})"
        if not isinstance(ids, list) or not ids or not all(isinstance(x, str) for x in ids):
            raise ValueError(
                f"{where}: instruction_id_list must be a non-empty list of IFEval instruction "
                f"ids, got {ids!r:.100}. Fix: use IFEval-format prompts (google/IFEval columns)."
            )
        unknown = [x for x in ids if x not in self.registry]
        if unknown:
            raise ValueError(
                f"{where}: unknown instruction ids {unknown}; the checks know "
                f"{sorted(self.registry)}. Fix: repair the row or drop the instruction."
            )
        if kwargs is None:
            kwargs = [{} for _ in ids]
        if not isinstance(kwargs, list) or len(kwargs) != len(ids):
            raise ValueError(
                f"{where}: kwargs must be a list with one dict per instruction ({len(ids)}), "
                f"got {kwargs!r:.100}"
            )
        return ids, [dict(k or {}) for k in kwargs]


@contextmanager
def _nothing() -> Iterator[None]:
    yield
