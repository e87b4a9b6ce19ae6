"""Scoring only the response of a think-then-respond completion (the prompt format of the MGS
authors, arXiv 2602.02301, taken from RLMT, arXiv 2509.20357).

The policy is asked to answer ``<think> reasoning </think> <response> answer </response>``, and
its question reaches it wrapped as ``User: <query>question</query>``. Every domain's reward in
the authors' code reads only the response part: math and instruction following take the text
after the last ``<response>`` (with ``</response>`` removed), the reward model the text between
``<response>`` and ``</response>``, and the reward model sees the user's original question.
:class:`ResponseSection` wraps any reward to do the same, so the rewards themselves stay
format-agnostic.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from lit_rlhf.rewards.base import RewardFunction, check_batch_lengths
from lit_rlhf.types import RewardOutput


def response_section(
    completion: str, *, open_tag: str, close_tag: str, strict: bool
) -> tuple[str, bool]:
    """The text after the last ``open_tag``, up to the first ``close_tag`` after it, stripped,
    and whether ``open_tag`` was there. Without it: the whole completion (cut at ``close_tag``
    if present), or ``""`` when ``strict``. Plain string search: no regex runs on model output."""
    start = completion.rfind(open_tag)
    found = start >= 0
    if not found and strict:
        return "", False
    text = completion[start + len(open_tag) :] if found else completion
    end = text.find(close_tag)
    return (text[:end] if end >= 0 else text).strip(), found


def query_section(question: str, *, open_tag: str, close_tag: str) -> str:
    """The user's question inside ``open_tag``/``close_tag`` of a formatted prompt, or the
    whole text when the tags are not there."""
    start = question.find(open_tag)
    end = question.rfind(close_tag)
    if start < 0 or end < start:
        return question
    return question[start + len(open_tag) : end].strip()


class ResponseSection:
    """Scores the response section of each completion with ``reward``.

    Args:
        reward: the reward of the response text (math-verify, IFEval checks, a reward model).
        open_tag, close_tag: the response tags (the authors': ``<response>``, ``</response>``).
        strict: a completion without ``open_tag`` is scored as an empty response (RLMT's
            ``strict``); the authors' MGS runs do not set it (the whole completion is scored).
        query_tags: the tags around the user's question in the rows' ``question`` (the authors'
            ``<query>``, ``</query>``): the wrapped reward sees the question between them, as
            the reward model does in the authors' code. None: the rows as they are.

    Info: the wrapped reward's, plus ``has_response`` (1 where ``open_tag`` was found).
    Stateful rewards (a reward model's running mean) keep their state through the wrapper.
    """

    def __init__(
        self,
        reward: RewardFunction,
        open_tag: str = "<response>",
        close_tag: str = "</response>",
        strict: bool = False,
        query_tags: tuple[str, str] | None = ("<query>", "</query>"),
    ) -> None:
        if not callable(reward):
            raise ValueError(f"reward must be callable, got {type(reward).__name__}")
        if not open_tag or not close_tag:
            raise ValueError("open_tag and close_tag must be non-empty strings")
        if query_tags is not None and (len(query_tags) != 2 or not all(query_tags)):
            raise ValueError(f"query_tags must be two non-empty strings or None, got {query_tags}")
        self.reward, self.open_tag, self.close_tag = reward, open_tag, close_tag
        self.strict = strict
        self.query_tags = tuple(query_tags) if query_tags is not None else None

    def __call__(
        self,
        prompts: Sequence[str],
        completions: Sequence[str],
        rows: Sequence[Mapping[str, Any]],
    ) -> RewardOutput:
        check_batch_lengths(prompts, completions, rows)
        sections = [
            response_section(c, open_tag=self.open_tag, close_tag=self.close_tag,
                             strict=self.strict)
            for c in completions
        ]  # fmt: skip
        if self.query_tags is not None:
            open_q, close_q = self.query_tags
            rows = [
                {**row, "question": query_section(str(row["question"]), open_tag=open_q,
                                                  close_tag=close_q)}
                if "question" in row else row
                for row in rows
            ]  # fmt: skip
        out = self.reward(prompts, [text for text, _ in sections], rows)
        found = torch.tensor([float(f) for _, f in sections])
        return RewardOutput(scores=out.scores, info={**(out.info or {}), "has_response": found})

    def state_dict(self) -> dict[str, Any]:
        """The wrapped reward's state (``{}`` when it has none)."""
        get = getattr(self.reward, "state_dict", None)
        return dict(get()) if callable(get) else {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        load = getattr(self.reward, "load_state_dict", None)
        if callable(load) and state:
            load(state)
