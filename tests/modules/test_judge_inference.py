"""Evaluation-time judging: single / majority / ReflectRM's reflective inference, with a scripted
engine whose judgments, confidences and reflection answers are known."""

from __future__ import annotations

import pytest
import torch

from lit_rlhf.algos.judge import JudgeFormat
from lit_rlhf.data.prompts import render_chat_prompt
from lit_rlhf.models import load_tokenizer
from lit_rlhf.modules import GenerativeRewardModule
from lit_rlhf.modules.judge_inference import JudgeInference
from lit_rlhf.types import GenerationOutput

R1, R2 = "Response 1 is better than Response 2", "Response 2 is better than Response 1"


class _Scripted:
    """Stage 1: hands out ``judgments`` (text, per-token log-prob) in order. Reflection prompts
    (they name "Critique 1"): prefers the critique that contains GOOD, else writes nothing
    readable."""

    def __init__(self, judgments: list[tuple[str, float]]) -> None:
        self.judgments, self.reflections = list(judgments), []  # type: ignore[var-annotated]

    def generate(self, model, input_ids, attention_mask, tokenizer, *, greedy, log_probs):  # type: ignore[no-untyped-def]
        prompts = tokenizer.batch_decode(input_ids, skip_special_tokens=True)
        if "[Critique 1]" in prompts[0]:
            assert greedy
            self.reflections += prompts
            texts = [self._reflect(p) for p in prompts]
            values = [0.0] * len(texts)
        else:
            picked = [self.judgments.pop(0) for _ in prompts]
            texts, values = [t for t, _ in picked], [v for _, v in picked]
        enc = tokenizer(texts, add_special_tokens=False, padding=True, return_tensors="pt")
        ids, mask = enc["input_ids"], enc["attention_mask"].bool()
        lp = torch.tensor(values).unsqueeze(1).expand_as(ids).clone() if log_probs else None
        return GenerationOutput(ids, mask, lp)

    @staticmethod
    def _reflect(prompt: str) -> str:
        first = prompt.split("[Critique 1]")[-1].split("[End of Critique 1]")[0]
        second = prompt.split("[Critique 2]")[-1].split("[End of Critique 2]")[0]
        if "GOOD" in first:
            return "<Analysis>.</Analysis><Result>Critique 1 is better than Critique 2</Result>"
        if "GOOD" in second:
            return "<Analysis>.</Analysis><Result>Critique 2 is better than Critique 1</Result>"
        return "no idea"


def _judgment(analysis: str, result: str) -> str:
    return f"<Analysis>{analysis}</Analysis><Result>{result}</Result>"


@pytest.fixture(scope="module")
def tokenizer():  # type: ignore[no-untyped-def]
    return load_tokenizer("builtin:tiny-llama")


def _batch(tokenizer, n_pairs: int = 1):  # type: ignore[no-untyped-def]
    rows = [{"query_id": f"p{i}", "query": f"Repeat the word w{i}.", "response_1": f"w{i}",
             "response_2": "other", "label": -1} for i in range(n_pairs)]  # fmt: skip
    ids = tokenizer(["judge this"] * n_pairs, return_tensors="pt")
    return {"input_ids": ids["input_ids"], "attention_mask": ids["attention_mask"].bool(),
            "query_id": [r["query_id"] for r in rows], "row": rows}  # fmt: skip


def _render(tokenizer):  # type: ignore[no-untyped-def]
    return lambda question, prefix: render_chat_prompt(tokenizer, question, response_prefix=prefix)


def _run(tokenizer, mode: str, judgments, n: int):  # type: ignore[no-untyped-def]
    engine = _Scripted(judgments)
    inference = JudgeInference(engine, JudgeFormat(("Analysis", "Result")), mode=mode, samples=n)
    decisions = inference.decide(
        None, tokenizer, _batch(tokenizer), _render(tokenizer), chat_rendered=False
    )
    return decisions, engine


# four judgments of a pair whose gold verdict is -1: a 2 : 2 tie; the most confident is wrong
TIED = [
    (_judgment("bad A", R2), -0.1),
    (_judgment("GOOD 1", R1), -1.0),
    (_judgment("GOOD 2", R1), -1.5),
    (_judgment("bad B", R2), -2.0),
]


def test_majority_ties_where_reflection_recovers_the_right_verdict(tokenizer) -> None:  # type: ignore[no-untyped-def]
    (majority,), _ = _run(tokenizer, "majority", TIED, 4)
    assert majority.verdict == 0 and majority.votes == [1, -1, -1, 1]
    (reflective,), engine = _run(tokenizer, "reflective", TIED, 4)
    assert reflective.anchor == 0  # the most confident judgment
    assert sorted(reflective.winners) == [1, 2]  # the GOOD analyses beat the anchor's
    assert reflective.verdict == -1
    assert len(engine.reflections) == 3  # N - 1 reflection generations
    assert all("bad A" in p and "w0" in p for p in engine.reflections)  # anchor and the pair


def test_reflection_order_is_seeded_random_and_the_anchor_decides_without_winners(
    tokenizer,  # type: ignore[no-untyped-def]
) -> None:
    orders = set()
    for seed in range(6):
        engine = _Scripted(TIED)
        JudgeInference(engine, JudgeFormat(("Analysis", "Result")), mode="reflective",
                       samples=4, seed=seed).decide(
            None, tokenizer, _batch(tokenizer), _render(tokenizer), chat_rendered=False
        )  # fmt: skip
        orders.add(tuple(p.index("bad A") < p.index("GOOD") for p in engine.reflections[:2]))
    assert len(orders) > 1  # the anchor is shown first in some runs, second in others
    lonely = [(_judgment("bad", R2), -0.1), (_judgment("bad too", R1), -3.0)]
    (decision,), _ = _run(tokenizer, "reflective", lonely, 2)
    assert decision.winners == [] and decision.verdict == 1  # no winner: the anchor's verdict


def test_unreadable_judgments_never_anchor_or_vote(tokenizer) -> None:  # type: ignore[no-untyped-def]
    judgments = [("garbage", -0.01), (_judgment("GOOD", R1), -1.0), (_judgment("x", R2), -2.0)]
    (decision,), engine = _run(tokenizer, "reflective", judgments, 3)
    assert decision.anchor == 1 and decision.votes == [None, -1, 1]
    assert len(engine.reflections) == 1  # only the readable non-anchor judgment
    assert decision.verdict == -1
    (none,), _ = _run(tokenizer, "reflective", [("a", -1.0), ("b", -1.0)], 2)
    assert none.verdict == 0 and none.anchor is None


def test_settings_are_checked_when_the_module_is_built() -> None:
    with pytest.raises(ValueError, match=r"judge\.eval_samples: 1"):
        GenerativeRewardModule(judge={"eval_samples": 4, "inference": "single"})
    with pytest.raises(ValueError, match="eval_samples >= 2"):
        GenerativeRewardModule(judge={"eval_samples": 1, "inference": "reflective"})
    with pytest.raises(ValueError, match="critique template"):
        GenerativeRewardModule(judge={"critique_template": "reflectrm-v1"})
    with pytest.raises(ValueError, match="mode must be"):
        GenerativeRewardModule(mode="reflect")  # type: ignore[arg-type]
    assert GenerativeRewardModule(judge={"eval_samples": 3}).inference.mode == "majority"


def test_stage_two_alone_asks_what_reflective_inference_asks_and_reads_each_order(
    tokenizer,  # type: ignore[no-untyped-def]
) -> None:
    # reflective inference on a 2-sample pair: one reflection prompt, recorded by the engine
    lonely = [(_judgment("bad", R2), -0.1), (_judgment("GOOD", R1), -3.0)]
    _, reflective = _run(tokenizer, "reflective", lonely, 2)
    (asked,) = reflective.reflections
    # the module's stage 2 alone, on the same row and analyses, in both orders and unreadable
    engine = _Scripted([])
    module = GenerativeRewardModule(
        engine=engine, judge={"eval_samples": 2, "inference": "reflective",
                              "tags": ("Analysis", "Result")},
    )  # fmt: skip
    module.configure_model()
    row = _batch(tokenizer)["row"][0]
    good, bad = "<Analysis>GOOD</Analysis>", "<Analysis>bad</Analysis>"
    replies = module.compare_analyses([(row, (bad, good)), (row, (good, bad)), (row, ("x", "y"))])
    assert [v for v, _ in replies] == [1, -1, None]
    assert replies[2][1] == "no idea"  # the reply text comes back with the verdict
    first = engine.reflections[0] if asked.index("bad") < asked.index("GOOD") else (
        engine.reflections[1])  # fmt: skip
    assert first == asked  # the same prompt, rendering included
