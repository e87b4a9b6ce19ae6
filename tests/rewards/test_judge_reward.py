"""JudgeReward: a pairwise generative judge as a PPO reward (reference and group comparisons, both
orders, unreadable judgments), and the real generate -> parse path with a scripted engine."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch

from lit_rlhf.rewards import JudgeReward
from lit_rlhf.types import GenerationOutput


def _longer_wins(triples: Sequence[tuple[str, str, str]]) -> list[int | None]:
    """A fake judge: the longer response is better; equal lengths cannot be read."""
    return [None if len(a) == len(b) else (-1 if len(a) > len(b) else 1) for _, a, b in triples]


def _first_wins(triples: Sequence[tuple[str, str, str]]) -> list[int | None]:
    """A fake judge with total position bias."""
    return [-1 for _ in triples]


def _reward(judge, **kwargs) -> JudgeReward:  # type: ignore[no-untyped-def]
    reward = JudgeReward("builtin:tiny-llama", device="cpu", **kwargs)
    reward.model = object()  # never loaded: the judge is faked
    reward.judge = judge  # type: ignore[method-assign]
    return reward


def test_reference_mode_scores_each_response_against_the_rows_reference() -> None:
    rows = [{"query_id": "q", "question": "Q?", "reference": "medium"}] * 3
    out = _reward(_longer_wins)(["p"] * 3, ["much longer text", "short", "sixsix"], rows)
    torch.testing.assert_close(out.scores, torch.tensor([1.0, -1.0, 0.0]))
    torch.testing.assert_close(out.info["judge_valid"], torch.tensor([1.0, 1.0, 0.0]))


def test_both_orders_cancel_a_position_bias_that_one_order_rewards() -> None:
    rows = [{"question": "Q?", "reference": "ref"}] * 2
    one_order = _reward(_first_wins, both_orders=False)(["p", "p"], ["a", "bbbb"], rows)
    torch.testing.assert_close(one_order.scores, torch.tensor([1.0, 1.0]))  # always shown first
    both = _reward(_first_wins)(["p", "p"], ["a", "bbbb"], rows)
    torch.testing.assert_close(both.scores, torch.tensor([0.0, 0.0]))


def test_group_mode_compares_responses_to_the_same_prompt_only() -> None:
    rows = [{"query_id": "a"}] * 3 + [{"query_id": "b"}]
    out = _reward(_longer_wins, compare="group")(["p"] * 4, ["x", "xx", "xxx", "lonely"], rows)
    torch.testing.assert_close(out.scores, torch.tensor([-1.0, 0.0, 1.0, 0.0]))
    assert out.info["judge_valid"].tolist() == [1.0, 1.0, 1.0, 0.0]  # a group of one: no judgment
    calls: list[tuple[str, str, str]] = []
    reward = _reward(lambda t: calls.extend(t) or _longer_wins(t), compare="group")
    reward(["p"] * 3, ["x", "xx", "xxx"], [{"query_id": "a", "question": "Q"}] * 3)
    assert len(calls) == 6  # 3 pairs x 2 orders
    assert {(a, b) for _, a, b in calls} == {
        (a, b) for a in ("x", "xx", "xxx") for b in ("x", "xx", "xxx") if a != b
    }


def test_bad_settings_and_rows_fail_with_the_fix_before_any_model_loads() -> None:
    with pytest.raises(ValueError, match="compare must be"):
        JudgeReward("builtin:tiny-llama", compare="pairs")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="compares critiques"):
        JudgeReward("builtin:tiny-llama", template="reflectrm-critique-v1")
    with pytest.raises(ValueError, match="batch_size"):
        JudgeReward("builtin:tiny-llama", batch_size=0)
    reward = JudgeReward("builtin:missing-model-name")
    with pytest.raises(ValueError, match="reference_field= to the column"):
        reward(["p"], ["a"], [{"query_id": "q7", "question": "Q"}])
    assert reward.model is None  # the row was rejected before loading the judge


class _ScriptedEngine:
    """Answers every judge prompt with one fixed judgment, recording the prompts it saw."""

    def __init__(self, text: str) -> None:
        self.text, self.prompts = text, []  # type: ignore[var-annotated]

    def generate(self, model, input_ids, attention_mask, tokenizer, *, greedy, log_probs):  # type: ignore[no-untyped-def]
        assert greedy and not log_probs
        self.prompts += tokenizer.batch_decode(input_ids, skip_special_tokens=True)
        ids = tokenizer(self.text, add_special_tokens=False, return_tensors="pt")["input_ids"]
        ids = ids.repeat(len(input_ids), 1)
        return GenerationOutput(ids, torch.ones_like(ids, dtype=torch.bool), None)

    def sync_weights(self, model) -> None:  # type: ignore[no-untyped-def]
        pass


def test_the_judge_path_renders_the_template_generates_and_parses() -> None:
    engine = _ScriptedEngine(
        "<Analysis>Response 1 answers.</Analysis><Result>Response 1 is better than Response 2"
        "</Result>"
    )
    reward = JudgeReward("builtin:tiny-llama", engine=engine, device="cpu", batch_size=1)
    rows = [{"question": "Why is the sky blue?", "reference": "Rayleigh scattering."}]
    out = reward(["<rendered>"], ["Because of scattering."], rows)
    # the policy's response is response 1 in the first order (wins), response 2 in the second
    torch.testing.assert_close(out.scores, torch.tensor([0.0]))
    assert out.info["judge_valid"].tolist() == [1.0]
    assert len(engine.prompts) == 2
    assert "Why is the sky blue?" in engine.prompts[0]
    first, second = (p.index("Because of scattering.") for p in engine.prompts)
    assert first < engine.prompts[0].index("Rayleigh scattering.")
    assert second > engine.prompts[1].index("Rayleigh scattering.")
    assert not out.scores.requires_grad


JUDGMENT = "<Analysis>It answers.</Analysis><Result>Response 1 is better than Response 2</Result>"


@pytest.mark.parametrize(
    ("output", "score", "valid"),
    [
        (f"<think>\nResponse 2 is better? No.\n</think>\n\n{JUDGMENT}", 1.0, 1.0),
        (f"<think>\n\n</think>\n\n{JUDGMENT}", 1.0, 1.0),  # Qwen3's empty trace under /no_think
        (f"<think>\nResponse 1 is better than Response 2, so {JUDGMENT}", 0.0, 0.0),  # unclosed
    ],
)
def test_a_think_trace_is_stripped_before_the_verdict_is_read(output, score, valid) -> None:
    reward = JudgeReward(
        "builtin:tiny-llama", engine=_ScriptedEngine(output), device="cpu", both_orders=False
    )
    out = reward(["p"], ["mine"], [{"question": "Q?", "reference": "theirs"}])
    assert out.scores.tolist() == [score]  # the policy's response is response 1: it wins
    assert out.info["judge_valid"].tolist() == [valid]


def test_the_thinking_switches_reach_the_rendered_judge_prompt() -> None:
    engine = _ScriptedEngine(JUDGMENT)
    reward = JudgeReward(
        "builtin:tiny-llama",
        engine=engine,
        device="cpu",
        both_orders=False,
        chat_template_kwargs={"enable_thinking": False},
        question_suffix=" /no_think",
    )
    reward.load()
    reward.tokenizer.chat_template = (  # a Qwen3-like switch, visible in the rendered text
        "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
        "<|assistant|>{% if enable_thinking is defined and not enable_thinking %}"
        "[thinking off]{% endif %}"
    )
    reward(["p"], ["mine"], [{"question": "Why is the sky blue?", "reference": "theirs"}])
    (prompt,) = engine.prompts  # decoded without the special <|...|> tokens
    assert prompt.endswith("[End of Response 2] /no_think[thinking off]")
    engine.prompts.clear()
    reward.chat_template_kwargs, reward.question_suffix = {}, ""  # the switches unset: neither
    reward(["p"], ["mine"], [{"question": "Why is the sky blue?", "reference": "theirs"}])
    assert engine.prompts[0].endswith("[End of Response 2]")
