"""A generative reward model (an LLM judge that writes an analysis and a verdict on a pair of
responses) as the reward of a PPO run: the judge compares each policy response with the row's
reference response, or with the other responses of its group, and every verdict counts +1 (the
policy's response is better), -1 (worse) or 0 (the judgment cannot be read).

The judge is loaded on the first call, so a config is validated before any model loads; it runs
on its own device and dtype, generates greedily under ``torch.no_grad`` and never holds the
policy's graph. Its output is untrusted text, read by the bounded parsers of
:mod:`lit_rlhf.algos.judge`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import torch

from lit_rlhf.algos.judge import JudgeFormat
from lit_rlhf.data.judge_templates import judge_template, render_judge_prompt
from lit_rlhf.data.prompts import render_chat_prompt, tokenize_prompts
from lit_rlhf.models.loading import Dtype, load_causal_lm, load_tokenizer
from lit_rlhf.rewards.base import check_batch_lengths
from lit_rlhf.rollout.base import GenerationEngine, GenerationEngineLike
from lit_rlhf.rollout.hf import HFGenerationEngine
from lit_rlhf.types import RewardOutput

# one judgment: (query, response 1, response 2, owner of response 1, owner of response 2); an
# owner is the index of the policy response shown there, None for the reference response
Match = tuple[str, str, str, int | None, int | None]


class JudgeReward:
    """Scores policy responses with a pairwise generative judge (e.g. one trained by
    ``GenerativeRewardModule``, or any instruction model with a judge template).

    A response's score is the mean outcome of its comparisons, in [-1, 1]: +1 when the judge
    prefers it, -1 when it prefers the other response, 0 for an unreadable judgment.

    Args:
        model: the judge, a causal LM: local folder, hub id or ``builtin:<name>``.
        tokenizer: its tokenizer (default: ``model``).
        compare: ``reference``: each response against the row's ``reference_field`` text;
            ``group``: each response against every other response to the same prompt (rows
            with the same ``query_id``; a group of one scores 0).
        reference_field: the row column holding the reference response (``compare:
            reference``).
        both_orders: judge every pair in both orders (twice the judge calls; cancels the
            judge's position bias).
        template: the judge template (a response-preference one, see
            :data:`~lit_rlhf.data.judge_templates.JUDGE_TEMPLATES`).
        tags, response_prefix, response_suffix: how the judge's output is read, as in
            ``GenerativeRewardModule``.
        use_chat_template: render judge prompts with the judge tokenizer's chat template.
        chat_template_kwargs: passed to the chat template, e.g. ``{"enable_thinking": false}``
            (Qwen3's hard switch, arXiv 2505.09388), as ``PromptDataModule``'s.
        question_suffix: appended to every judge prompt's user message, e.g. ``" /no_think"``
            (Qwen3's soft switch; ReflectRM's no-think control, arXiv 2604.07506). Think traces
            in the judge's output are stripped before its verdict is read either way
            (:func:`~lit_rlhf.algos.judge.strip_think`).
        engine: generates the judgments (greedy); default ``HFGenerationEngine(max_new_tokens=
            256)``.
        batch_size: judge prompts per generate call.
        device: where the judge runs (default: CUDA when available, else CPU).
        dtype: its weights.

    Info: ``judge_valid`` (the fraction of a response's judgments that could be read).
    """

    def __init__(
        self,
        model: str,
        tokenizer: str | None = None,
        compare: Literal["reference", "group"] = "reference",
        reference_field: str = "reference",
        both_orders: bool = True,
        template: str = "reflectrm-v1",
        tags: Sequence[str] = ("Analysis", "Result"),
        response_prefix: str = "",
        response_suffix: str = "",
        use_chat_template: bool = True,
        chat_template_kwargs: dict[str, Any] | None = None,
        question_suffix: str = "",
        engine: GenerationEngineLike | None = None,
        batch_size: int = 16,
        device: str | None = None,
        dtype: Dtype = "float32",
    ) -> None:
        if compare not in ("reference", "group"):
            raise ValueError(f"compare must be 'reference' or 'group', got {compare!r}")
        if judge_template(template).subject != "Response":
            raise ValueError(
                f"template {template!r} compares critiques; a policy reward compares responses. "
                "Fix: use a response template such as reflectrm-v1 or consistrm-v1."
            )
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"dtype must be float32, bfloat16 or float16, got {dtype!r}")
        self.name, self.tokenizer_name = model, tokenizer or model
        self.compare, self.reference_field, self.both_orders = compare, reference_field, both_orders
        self.template, self.use_chat_template = template, use_chat_template
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.question_suffix = question_suffix
        self.format = JudgeFormat(tuple(tags), "Response", response_prefix, response_suffix)
        self.engine: GenerationEngine = engine or HFGenerationEngine(max_new_tokens=256)
        self.batch_size, self.dtype = batch_size, dtype
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.model: Any = None  # loaded by the first call
        self.tokenizer: Any = None

    def load(self) -> None:
        """Load the judge and its tokenizer (done by the first call)."""
        self.tokenizer = load_tokenizer(self.tokenizer_name)
        model = load_causal_lm(self.name, dtype=self.dtype)
        self.model = model.eval().requires_grad_(False).to(self.device)

    def __call__(
        self,
        prompts: Sequence[str],
        completions: Sequence[str],
        rows: Sequence[Mapping[str, Any]],
    ) -> RewardOutput:
        check_batch_lengths(prompts, completions, rows)
        queries = [str(row.get("question", p)) for p, row in zip(prompts, rows, strict=True)]
        matches = self._matches(queries, list(completions), rows)
        if self.model is None:
            self.load()
        verdicts = self.judge([(q, a, b) for q, a, b, _, _ in matches])
        n = len(completions)
        total, count, valid = torch.zeros(n), torch.zeros(n), torch.zeros(n)
        for (_, _, _, first, second), verdict in zip(matches, verdicts, strict=True):
            # verdict -1: response 1 is better, so its owner gains -verdict, the other +verdict
            for owner, sign in ((first, -1), (second, 1)):
                if owner is not None:
                    count[owner] += 1
                    if verdict is not None:
                        total[owner] += sign * verdict
                        valid[owner] += 1
        scores = total / count.clamp(min=1)
        return RewardOutput(scores=scores, info={"judge_valid": valid / count.clamp(min=1)})

    def _matches(
        self, queries: list[str], responses: list[str], rows: Sequence[Mapping[str, Any]]
    ) -> list[Match]:
        pairs: list[tuple[str, int | None, str, int | None, str]] = []
        if self.compare == "reference":
            for i, row in enumerate(rows):
                pairs.append((queries[i], i, responses[i], None, self._reference(row, i)))
        else:
            groups: dict[str, list[int]] = {}
            for i, row in enumerate(rows):
                groups.setdefault(str(row.get("query_id", queries[i])), []).append(i)
            for members in groups.values():
                for a, i in enumerate(members):
                    for j in members[a + 1 :]:
                        pairs.append((queries[i], i, responses[i], j, responses[j]))
        matches: list[Match] = []
        for query, owner_1, text_1, owner_2, text_2 in pairs:
            matches.append((query, text_1, text_2, owner_1, owner_2))
            if self.both_orders:
                matches.append((query, text_2, text_1, owner_2, owner_1))
        return matches

    def _reference(self, row: Mapping[str, Any], index: int) -> str:
        reference = row.get(self.reference_field)
        if not isinstance(reference, str) or not reference.strip():
            raise ValueError(
                f"row {index} (query {row.get('query_id', '?')!r}) has no reference response in "
                f"{self.reference_field!r} (got {reference!r}); JudgeReward(compare='reference') "
                "compares every response with it. Fix: add the column to the prompts, set "
                "reference_field= to the column that holds it, or use compare='group'."
            )
        return reference

    @torch.no_grad()
    def judge(self, triples: Sequence[tuple[str, str, str]]) -> list[int | None]:
        """The judge's verdict on each (query, response 1, response 2): -1 (response 1 better),
        +1 (response 2 better) or None (unreadable)."""
        if self.model is None:
            self.load()
        prompts = [
            render_chat_prompt(
                self.tokenizer,
                render_judge_prompt(self.template, prompt=q, response_1=a, response_2=b),
                use_chat_template=self.use_chat_template,
                response_prefix=self.format.prefix,
                chat_template_kwargs=self.chat_template_kwargs,
                question_suffix=self.question_suffix,
            )
            for q, a, b in triples
        ]
        chat = self.use_chat_template and bool(getattr(self.tokenizer, "chat_template", None))
        verdicts: list[int | None] = []
        for start in range(0, len(prompts), self.batch_size):
            ids, mask = tokenize_prompts(
                self.tokenizer, prompts[start : start + self.batch_size], chat_rendered=chat,
                device=self.device,
            )  # fmt: skip
            out = self.engine.generate(
                self.model, ids, mask, self.tokenizer, greedy=True, log_probs=False
            )
            texts = self.tokenizer.batch_decode(out.response_ids, skip_special_tokens=True)
            verdicts.extend(self.format.verdict(text) for text in texts)
        return verdicts
