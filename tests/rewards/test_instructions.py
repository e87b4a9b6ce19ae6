"""InstructionReward: IFEval's checks through if-verifiable, the fraction satisfied, the loose
variants, the offline fallback for the checks that need NLTK data, and bad rows."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("if_verifiable")

from lit_rlhf.data import FilePrompts
from lit_rlhf.rewards import InstructionReward

SAMPLES = Path(__file__).parents[2] / "lit_rlhf" / "data" / "samples" / "ifeval_prompts.jsonl"


def _row(ids, kwargs=None):  # type: ignore[no-untyped-def]
    return {"question": "q", "instruction_id_list": ids, "kwargs": kwargs or [{} for _ in ids]}


def test_the_reward_is_the_fraction_of_instructions_satisfied() -> None:
    reward = InstructionReward()
    rows = [_row(["change_case:english_lowercase", "punctuation:no_comma"])] * 3
    out = reward(["p"] * 3, ["all lower no commas", "all lower, one comma", "Upper, comma"], rows)
    torch.testing.assert_close(out.scores, torch.tensor([1.0, 0.5, 0.0]))
    torch.testing.assert_close(out.info["all"], torch.tensor([1.0, 0.0, 0.0]))
    strict_all = InstructionReward(all_or_nothing=True)(
        ["p"] * 3, ["all lower no commas", "a, b", "A, B"], rows
    )
    torch.testing.assert_close(strict_all.scores, torch.tensor([1.0, 0.0, 0.0]))


def test_kwargs_and_loose_mode() -> None:
    words = [_row(["length_constraints:number_words"], [{"num_words": 5, "relation": "at least",
                                                          "unused": None}])]  # fmt: skip
    reward = InstructionReward()
    assert float(reward(["p"], ["one two three four five"], words).scores[0]) == 1.0
    assert float(reward(["p"], ["one two"], words).scores[0]) == 0.0
    title = [_row(["change_case:english_lowercase"])]
    response = "Sure! Here it is:\nall lowercase text"  # the first line breaks strict mode
    assert float(InstructionReward()(["p"], [response], title).scores[0]) == 0.0
    assert float(InstructionReward(mode="loose")(["p"], [response], title).scores[0]) == 1.0


def test_sentence_counts_work_offline_and_are_flagged() -> None:
    reward = InstructionReward()
    rows = [_row(["length_constraints:number_sentences"],
                 [{"num_sentences": 3, "relation": "less than"}])] * 2  # fmt: skip
    out = reward(["p"] * 2, ["One. Two.", "One. Two. Three. Four."], rows)
    torch.testing.assert_close(out.scores, torch.tensor([1.0, 0.0]))
    if not reward.punkt:
        assert out.info["fallback"].tolist() == [1.0, 1.0]


def test_bad_rows_name_the_row_and_the_fix() -> None:
    reward = InstructionReward()
    with pytest.raises(ValueError, match=r"row 0 .*unknown instruction ids \['made:up'\]"):
        reward(["p"], ["x"], [_row(["made:up"])])
    with pytest.raises(ValueError, match="non-empty list"):
        reward(["p"], ["x"], [{"instruction_id_list": "punctuation:no_comma"}])
    with pytest.raises(ValueError, match="one dict per instruction"):
        reward(["p"], ["x"], [_row(["punctuation:no_comma"], [{}, {}])])
    with pytest.raises(ValueError, match="mode must be"):
        InstructionReward(mode="lenient")  # type: ignore[arg-type]


def test_the_shipped_sample_prompts_load_and_score() -> None:
    rows = list(FilePrompts(str(SAMPLES), question_field="prompt", answer_field=None,
                            id_field="key", task="ifeval").load())  # fmt: skip
    assert len(rows) == 24 and rows[0]["task"] == "ifeval"
    out = InstructionReward()(["p"] * len(rows), ["a reply"] * len(rows), rows)
    assert out.scores.shape == (24,) and ((out.scores >= 0) & (out.scores <= 1)).all()
