"""Judging pairs with a generative reward model at evaluation time: one greedy judgment
(``single``), the majority of N sampled ones (``majority``), or ReflectRM's two-stage reflective
inference (``reflective``, arXiv 2604.07506): N sampled judgments, the most confident is the
anchor (:func:`~lit_rlhf.algos.reflection.confidence`), the judge compares each other readable
judgment's analysis with the anchor's (N - 1 greedy reflection generations, each pair of
analyses in a seeded random order) and the winners vote
(:func:`~lit_rlhf.algos.reflection.reflective_vote`).

Decisions the paper leaves open:
- an unreadable judgment can be neither the anchor nor a winner (it has no verdict to vote);
  when all N are unreadable the pair gets no verdict;
- a judgment's analysis is its text before the result, or the whole judgment for a verdict-only
  judge (:func:`~lit_rlhf.algos.judge.analysis_text`);
- reflection prompts use the same chat rendering as the data, with the judge format's prefix
  and suffix written for critiques (``{subject}``, or a literal "Response", -> "Critique").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import torch
from torch import Tensor, nn

from lit_rlhf.algos.judge import JudgeFormat, analysis_text
from lit_rlhf.algos.reflection import confidence, reflective_vote, select_anchor
from lit_rlhf.data.judge_templates import render_reflection_prompt, seeded_coin
from lit_rlhf.data.prompts import tokenize_prompts
from lit_rlhf.metrics import majority_verdict
from lit_rlhf.rollout.base import GenerationEngine

Inference = Literal["single", "majority", "reflective"]
INFERENCE_MODES = ("single", "majority", "reflective")


@dataclass
class Decision:
    """One pair's judgment: the final verdict (-1 / +1, 0 for a tie or no readable judgment),
    every sampled judgment's verdict, and for reflective inference the anchor and winners."""

    verdict: int
    votes: list[int | None]
    anchor: int | None = None
    winners: list[int] = field(default_factory=list)


class JudgeInference:
    """Runs a judge's evaluation-time inference on prompt batches of pair rows.

    Args:
        engine: the generation engine.
        judge_format: how the judge's outputs are read (tags, subject, prefix, suffix); a row's
            ``subject`` column overrides the subject.
        mode: ``single`` | ``majority`` | ``reflective``.
        samples: judgments per pair (1 for ``single``, >= 2 otherwise).
        critique_template: the analysis-preference template of the reflection prompts.
        seed: seeds the order of the two analyses in each reflection prompt.
    """

    def __init__(
        self,
        engine: GenerationEngine,
        judge_format: JudgeFormat,
        *,
        mode: Inference,
        samples: int,
        critique_template: str = "reflectrm-critique-v1",
        seed: int = 0,
    ) -> None:
        check_inference(mode, samples)
        self.engine, self.format, self.mode, self.samples = engine, judge_format, mode, samples
        self.critique_template, self.seed = critique_template, seed
        subject = judge_format.subject  # a literal subject word in the prefix becomes Critique
        self.reflection_format = replace(
            judge_format,
            subject="Critique",
            prefix=judge_format.prefix.replace(subject, "Critique"),
            suffix=judge_format.suffix.replace(subject, "Critique"),
        )

    def generate(
        self, policy: nn.Module, tokenizer: Any, ids: Tensor, mask: Tensor, *, n: int,
        greedy: bool, log_probs: bool,
    ) -> tuple[list[str], Tensor | None, Tensor]:  # fmt: skip
        """``n`` outputs per prompt (texts, their log-probs when asked, their masks)."""
        out = self.engine.generate(
            policy, ids.repeat_interleave(n, dim=0), mask.repeat_interleave(n, dim=0), tokenizer,
            greedy=greedy, log_probs=log_probs,
        )  # fmt: skip
        texts = tokenizer.batch_decode(out.response_ids, skip_special_tokens=True)
        return texts, out.log_probs, out.response_mask

    @torch.no_grad()
    def decide(
        self, policy: nn.Module, tokenizer: Any, batch: dict[str, Any],
        render: Callable[[str, str], str], *, chat_rendered: bool,
    ) -> list[Decision]:  # fmt: skip
        """One :class:`Decision` per pair of ``batch``. ``render(question, prefix)`` makes a
        reflection question a prompt (chat template and pre-fill) as the data module does;
        ``chat_rendered``: whether that applies a chat template (tokenization adds no special
        tokens then)."""
        n, rows = self.samples, batch["row"]
        texts, log_probs, mask = self.generate(
            policy, tokenizer, batch["input_ids"], batch["attention_mask"], n=n,
            greedy=self.mode == "single", log_probs=self.mode == "reflective",
        )  # fmt: skip
        votes = [
            [self.format.verdict(t, rows[b].get("subject")) for t in texts[b * n : (b + 1) * n]]
            for b in range(len(rows))
        ]
        if self.mode != "reflective":
            return [Decision(majority_verdict(v), v) for v in votes]
        assert log_probs is not None
        conf = confidence(log_probs, mask).view(len(rows), n)
        prompt = Renderer(render, chat_rendered)
        return self._reflect(policy, tokenizer, batch, texts, votes, conf, prompt)

    def _reflect(
        self, policy: nn.Module, tokenizer: Any, batch: dict[str, Any], texts: list[str],
        votes: list[list[int | None]], conf: Tensor, render: Renderer,
    ) -> list[Decision]:  # fmt: skip
        n, decisions = self.samples, []
        jobs: list[tuple[int, int, bool]] = []  # (pair, candidate, candidate shown first)
        questions: list[tuple[Mapping[str, Any], tuple[str, str]]] = []
        for b, row in enumerate(batch["row"]):
            ok = torch.tensor([v is not None for v in votes[b]])
            if not ok.any():
                decisions.append(Decision(0, votes[b]))
                continue
            anchor = select_anchor(conf[b].cpu().masked_fill(~ok, float("-inf")))
            decisions.append(Decision(0, votes[b], anchor=anchor))
            analyses = [
                analysis_text(self.format.text(t, row.get("subject")))
                for t in texts[b * n : (b + 1) * n]
            ]
            for k in range(n):
                if k == anchor or votes[b][k] is None:
                    continue
                first = seeded_coin(self.seed, f"{batch['query_id'][b]}/{k}", "reflect")
                pair = (analyses[k], analyses[anchor]) if first else (analyses[anchor], analyses[k])
                questions.append((row, pair))
                jobs.append((b, k, first))
        device = batch["input_ids"].device
        replies = self.compare(policy, tokenizer, questions, render, device=device)
        for (b, k, first), (verdict, _) in zip(jobs, replies, strict=True):
            # verdict -1: critique 1 is better; the candidate wins if it was the better one
            if verdict == (-1 if first else 1):
                decisions[b].winners.append(k)
        for decision in decisions:
            if decision.anchor is not None:
                readable = [k for k, v in enumerate(decision.votes) if v is not None]
                compact = [int(decision.votes[k] or 0) for k in readable]
                decision.verdict = reflective_vote(
                    compact,
                    [readable.index(k) for k in decision.winners],
                    readable.index(decision.anchor),
                )
        return decisions

    def compare(
        self, policy: nn.Module, tokenizer: Any,
        questions: Sequence[tuple[Mapping[str, Any], tuple[str, str]]], render: Renderer, *,
        device: torch.device | str = "cpu",
    ) -> list[tuple[int | None, str]]:  # fmt: skip
        """Stage 2 alone: for each ``(row, (analysis 1, analysis 2))`` the judge's greedy
        analysis-preference reply and its verdict (-1: analysis 1 is better, +1: analysis 2,
        None: unreadable)."""
        if not questions:
            return []
        opening = self.reflection_format.opening()
        prompts = [render.fn(self._question(row, pair), opening) for row, pair in questions]
        ids, mask = tokenize_prompts(tokenizer, prompts, chat_rendered=render.chat, device=device)
        texts, _, _ = self.generate(policy, tokenizer, ids, mask, n=1, greedy=True, log_probs=False)
        return [(self.reflection_format.verdict(t), t) for t in texts]

    def _question(self, row: Mapping[str, Any], critiques: tuple[str, str]) -> str:
        missing = [c for c in ("query", "response_1", "response_2") if not row.get(c)]
        if missing:
            raise ValueError(
                f"reflective inference needs each row's query and responses; row "
                f"{row.get('query_id', '?')!r} has no {missing}. Fix: evaluate on a pair source "
                "(PreferencePairs, SyntheticPairs), or use inference='majority'."
            )
        return render_reflection_prompt(
            self.critique_template,
            prompt=row["query"],
            response_1=row["response_1"],
            response_2=row["response_2"],
            critique_1=critiques[0],
            critique_2=critiques[1],
        )


@dataclass(frozen=True)
class Renderer:
    """``fn(question, prefix)`` makes a question a prompt (chat template and pre-fill);
    ``chat``: whether it applies a chat template."""

    fn: Callable[[str, str], str]
    chat: bool


def check_inference(mode: str, samples: int) -> None:
    """Validates an inference mode and its number of judgments per pair."""
    if mode not in INFERENCE_MODES:
        raise ValueError(f"inference must be one of {INFERENCE_MODES}, got {mode!r}")
    if mode == "single" and samples != 1:
        raise ValueError(
            f"inference='single' judges each pair once (greedy), but eval_samples={samples}. "
            "Fix: set eval_samples=1, or inference='majority' / 'reflective'."
        )
    if mode != "single" and samples < 2:
        raise ValueError(
            f"inference={mode!r} needs eval_samples >= 2 judgments per pair, got {samples}"
        )
