"""ResponseSection: only the response part of a think/response completion is scored, with the
user's own question, as in the MGS authors' reward code."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest
import torch

from lit_rlhf.rewards import RewardByTask
from lit_rlhf.rewards.sections import ResponseSection, query_section, response_section
from lit_rlhf.types import RewardOutput


class Recorder:
    """Scores a completion by its length and remembers what it was given."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []
        self.count = 0

    def __call__(
        self, prompts: Sequence[str], completions: Sequence[str], rows: Sequence[Mapping[str, Any]]
    ) -> RewardOutput:
        self.seen += [(str(r["question"]), c) for r, c in zip(rows, completions, strict=True)]
        self.count += len(completions)
        return RewardOutput(scores=torch.tensor([float(len(c)) for c in completions]))

    def state_dict(self) -> dict[str, Any]:
        return {"count": self.count}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.count = int(state["count"])


def test_the_response_section_is_what_follows_the_last_open_tag() -> None:
    kwargs = {"open_tag": "<response>", "close_tag": "</response>", "strict": False}
    text = " <think> plan <response> draft </think> <response> 42 </response> trailing"
    assert response_section(text, **kwargs) == ("42", True)
    assert response_section("no tags at all ", **kwargs) == ("no tags at all", False)
    assert response_section("cut here </response> rest", **kwargs) == ("cut here", False)
    assert response_section("no tags", **{**kwargs, "strict": True}) == ("", False)
    assert response_section("<response> open only", **kwargs) == ("open only", True)


def test_the_query_section_is_the_users_question() -> None:
    formatted = "User: <query>What is 2+2?\nPlease reason.</query>\n"
    assert query_section(formatted, open_tag="<query>", close_tag="</query>") == (
        "What is 2+2?\nPlease reason."
    )
    assert query_section("plain", open_tag="<query>", close_tag="</query>") == "plain"


def test_the_wrapped_reward_sees_the_response_and_the_raw_question_and_keeps_its_state() -> None:
    inner = Recorder()
    reward = ResponseSection(inner)
    rows = [{"question": "User: <query>Hi?</query>\n", "task": "chat"}, {"question": "Q"}]
    out = reward(["p", "p"], ["<think>long thoughts</think> <response>Hello</response>", "abc"],
                 rows)  # fmt: skip
    assert inner.seen == [("Hi?", "Hello"), ("Q", "abc")]
    assert out.scores.tolist() == [5.0, 3.0]
    assert out.info["has_response"].tolist() == [1.0, 0.0]
    assert rows[0]["question"] == "User: <query>Hi?</query>\n"  # the caller's rows are untouched
    # inside RewardByTask the wrapped reward's state goes into and out of checkpoints
    routed = RewardByTask({"chat": reward})
    assert routed.state_dict() == {"chat": {"count": 2}}
    routed.load_state_dict({"chat": {"count": 7}})
    assert inner.count == 7


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="reward must be callable"):
        ResponseSection(3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="non-empty"):
        ResponseSection(Recorder(), open_tag="")
    with pytest.raises(ValueError, match="query_tags"):
        ResponseSection(Recorder(), query_tags=("<q>", ""))
