"""VerdictReward on ReflectRM's mixed rows: each row's subject picks the verdict sentence."""

from __future__ import annotations

import torch

from lit_rlhf.rewards import VerdictReward


def test_each_rows_subject_decides_which_verdict_sentence_counts() -> None:
    reward = VerdictReward(tags=("Result",))
    response = "<Result>Response 1 is better than Response 2</Result>"
    critique = "<Result>Critique 2 is better than Critique 1</Result>"
    rows = [
        {"label": -1, "subject": "Response"},
        {"label": 1, "subject": "Critique"},
        {"label": 1, "subject": "Critique"},  # a response verdict on a critique row: malformed
        {"label": -1},  # no subject column: the reward's own (Response)
    ]
    out = reward(["p"] * 4, [response, critique, response, response], rows)
    torch.testing.assert_close(out.info["format_ok"], torch.tensor([1.0, 1.0, 0.0, 1.0]))
    torch.testing.assert_close(out.scores, torch.tensor([1.1, 1.1, -3.0, 1.1]))
